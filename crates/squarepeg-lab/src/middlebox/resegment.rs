//! Re-segmentation: splitting segments and coalescing adjacent ones.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{DirectionFilter, Emit, Middlebox, pass};
use crate::Direction;
use crate::packet::{FlowKey, TcpView, tcp_flags};
use crate::rng::{Chance, Stream};
use crate::units::serde_duration;

/// Configuration of a [`Resegmenter`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResegmentConfig {
    /// Seed of the split decisions and points.
    pub seed: u64,
    /// Directions acted on.
    pub directions: DirectionFilter,
    /// Probability that a data segment is split (after any coalescing).
    pub split_probability: f64,
    /// Most pieces a split makes (at least 2).
    pub max_pieces: u32,
    /// Coalesce adjacent in-order data segments of a flow.
    pub coalesce: bool,
    /// Longest a data segment waits for a contiguous successor.
    #[serde(with = "serde_duration")]
    pub coalesce_hold: Duration,
    /// Largest IP packet coalescing may produce.
    pub coalesce_max_packet: u32,
    /// Most flows holding a segment at once; beyond it, segments pass without waiting.
    pub max_flows: usize,
}

impl Default for ResegmentConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            directions: DirectionFilter::Both,
            split_probability: 0.5,
            max_pieces: 3,
            coalesce: true,
            coalesce_hold: Duration::from_millis(1),
            coalesce_max_packet: 1500,
            max_flows: 4096,
        }
    }
}

/// Counters of a [`Resegmenter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ResegmentStats {
    /// Segments split.
    pub segments_split: u64,
    /// Pieces those splits produced.
    pub pieces: u64,
    /// Segments merged into a held predecessor.
    pub segments_coalesced: u64,
    /// Held segments released because their hold expired.
    pub released_by_timeout: u64,
    /// TCP packets passed unchanged because their checksum was wrong.
    pub bad_checksum: u64,
}

struct Held {
    dir: Direction,
    deadline: Instant,
    packet: Vec<u8>,
}

/// Splits TCP segments at seeded points and coalesces adjacent in-order segments, as the
/// resegmenting middleboxes of Honda et al. do (Hollywood §3.2 and figure 4.3, Minion §4.3).
/// The byte stream and every sequence number stay exactly as sent; only the boundaries move.
///
/// - **Coalescing**: a data segment (no SYN/RST/URG/FIN) waits up to `coalesce_hold` for the
///   contiguous next segment of its flow; they merge while the packet stays within
///   `coalesce_max_packet`. The merged segment takes the later segment's header (acknowledgment,
///   window, options, IP id) with the earlier sequence number, and PSH if either had it. Any
///   other packet of the flow in the same direction releases the held segment first, so
///   nothing is reordered.
/// - **Splitting**: each data segment leaving the box (no SYN/RST/URG, two bytes or more) is
///   split with `split_probability` into 2..=`max_pieces` pieces at distinct uniformly drawn
///   points. Every piece carries the original options and flags, except that FIN and PSH stay
///   on the last piece; IPv4 pieces after the first get the next identification values.
pub struct Resegmenter {
    config: ResegmentConfig,
    split_chance: Chance,
    rng: Stream,
    held: BTreeMap<FlowKey, Held>,
    stats: ResegmentStats,
}

impl Resegmenter {
    /// A resegmenter; `max_pieces` below 2 is raised to 2, probabilities clamped to `[0, 1]`.
    pub fn new(config: ResegmentConfig) -> Self {
        Self {
            split_chance: Chance::new(config.split_probability),
            rng: Stream::new(config.seed, 0),
            held: BTreeMap::new(),
            stats: ResegmentStats::default(),
            config,
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> ResegmentStats {
        self.stats
    }

    fn holdable(view: &TcpView, p: &[u8]) -> bool {
        view.payload_len() > 0
            && view.flags(p) & (tcp_flags::SYN | tcp_flags::RST | tcp_flags::URG | tcp_flags::FIN)
                == 0
    }

    /// Merges `next` into `held` if it continues it and fits.
    fn try_merge(&self, held: &[u8], next: &[u8], next_view: &TcpView) -> Option<Vec<u8>> {
        let held_view = TcpView::parse(held)?;
        let flags = next_view.flags(next);
        if flags & (tcp_flags::SYN | tcp_flags::RST | tcp_flags::URG) != 0
            || next_view.payload_len() == 0
        {
            return None;
        }
        let held_end = held_view
            .seq(held)
            .wrapping_add(held_view.payload_len() as u32);
        if held_end != next_view.seq(next) {
            return None;
        }
        let merged_len = next_view.ip.total_len + held_view.payload_len();
        if merged_len > self.config.coalesce_max_packet as usize
            || merged_len > usize::from(u16::MAX)
        {
            return None;
        }
        let mut payload = Vec::with_capacity(held_view.payload_len() + next_view.payload_len());
        payload.extend_from_slice(held_view.payload(held));
        payload.extend_from_slice(next_view.payload(next));
        let flags = flags | (held_view.flags(held) & tcp_flags::PSH);
        Some(next_view.rebuild(
            next,
            held_view.seq(held),
            flags,
            next_view.options(next),
            &payload,
            None,
        ))
    }

    /// Emits a segment, splitting it with the configured chance.
    fn emit(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>) {
        // Draw for every segment so later decisions do not depend on which were eligible.
        let split = self.rng.chance(self.split_chance);
        let Some(view) = TcpView::parse(&packet) else {
            return pass(now, dir, packet, out);
        };
        let len = view.payload_len();
        let flags = view.flags(&packet);
        if !split || len < 2 || flags & (tcp_flags::SYN | tcp_flags::RST | tcp_flags::URG) != 0 {
            return pass(now, dir, packet, out);
        }
        let most = (self.config.max_pieces.max(2) as usize).min(len);
        let pieces = 2 + self.rng.below((most - 1) as u64) as usize;
        let mut cuts = BTreeSet::new();
        // Distinct points in 1..len; a few redraws settle collisions, and a rare shortfall only
        // means fewer pieces.
        for _ in 0..4 * pieces {
            if cuts.len() == pieces - 1 {
                break;
            }
            cuts.insert(1 + self.rng.below(len as u64 - 1) as usize);
        }
        let bounds: Vec<usize> = std::iter::once(0)
            .chain(cuts)
            .chain(std::iter::once(len))
            .collect();
        let payload = view.payload(&packet);
        let seq = view.seq(&packet);
        let options = view.options(&packet);
        let ip_id = view.ipv4_id(&packet);
        let last = bounds.len() - 2;
        for (i, piece) in bounds.windows(2).enumerate() {
            let piece_flags = if i == last {
                flags
            } else {
                flags & !(tcp_flags::FIN | tcp_flags::PSH)
            };
            let id = ip_id.map(|id| id.wrapping_add(i as u16));
            out.push(Emit {
                at: now,
                dir,
                packet: view.rebuild(
                    &packet,
                    seq.wrapping_add(piece[0] as u32),
                    piece_flags,
                    options,
                    &payload[piece[0]..piece[1]],
                    id,
                ),
            });
        }
        self.stats.segments_split += 1;
        self.stats.pieces += (bounds.len() - 1) as u64;
    }
}

impl Middlebox for Resegmenter {
    fn name(&self) -> &'static str {
        "resegment"
    }

    fn process(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>) {
        if !self.config.directions.applies(dir) {
            return pass(now, dir, packet, out);
        }
        let Some(view) = TcpView::parse(&packet) else {
            return pass(now, dir, packet, out);
        };
        if !view.checksum_valid(&packet) {
            // Rebuilding would launder a corrupt segment; leave it as it is.
            self.stats.bad_checksum += 1;
            return pass(now, dir, packet, out);
        }
        if !self.config.coalesce {
            return self.emit(now, dir, packet, out);
        }
        let key = view.key(&packet);
        if let Some(held) = self.held.remove(&key) {
            if let Some(merged) = self.try_merge(&held.packet, &packet, &view) {
                self.stats.segments_coalesced += 1;
                // Keep waiting only if another segment could still join.
                let room = TcpView::parse(&merged).is_some_and(|v| {
                    Self::holdable(&v, &merged)
                        && v.ip.total_len < self.config.coalesce_max_packet as usize
                });
                if room {
                    self.held.insert(
                        key,
                        Held {
                            packet: merged,
                            ..held
                        },
                    );
                } else {
                    // Full, or it took a FIN: nothing can follow it.
                    self.emit(now, dir, merged, out);
                }
                return;
            }
            self.emit(now, held.dir, held.packet, out);
        }
        if Self::holdable(&view, &packet)
            && view.ip.total_len < self.config.coalesce_max_packet as usize
            && self.held.len() < self.config.max_flows
        {
            self.held.insert(
                key,
                Held {
                    dir,
                    deadline: now + self.config.coalesce_hold,
                    packet,
                },
            );
            return;
        }
        self.emit(now, dir, packet, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.held.values().map(|h| h.deadline).min()
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Vec<Emit>) {
        let mut due: Vec<(Instant, FlowKey)> = self
            .held
            .iter()
            .filter(|(_, h)| h.deadline <= now)
            .map(|(k, h)| (h.deadline, *k))
            .collect();
        due.sort();
        for (_, key) in due {
            if let Some(held) = self.held.remove(&key) {
                self.stats.released_by_timeout += 1;
                self.emit(now, held.dir, held.packet, out);
            }
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("resegment_segments_split", self.stats.segments_split),
            ("resegment_pieces", self.stats.pieces),
            (
                "resegment_segments_coalesced",
                self.stats.segments_coalesced,
            ),
            (
                "resegment_released_by_timeout",
                self.stats.released_by_timeout,
            ),
            ("resegment_bad_checksum", self.stats.bad_checksum),
        ]
    }
}
