//! Sequence-number rewriting (ISN randomisation).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::flows::FlowTable;
use super::{DirectionFilter, Emit, Middlebox, pass};
use crate::Direction;
use crate::packet::{TcpOption, TcpView, tcp_flags, tcp_options};
use crate::rng::Stream;
use crate::units::serde_duration;

/// Configuration of a [`SeqRewriter`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SeqRewriteConfig {
    /// Seed of the per-flow offsets.
    pub seed: u64,
    /// Directions whose sequence numbers are shifted (the other direction's acknowledgments
    /// are shifted back).
    pub directions: DirectionFilter,
    /// Shift SACK blocks back too. Some boxes Honda et al. measured did not, which corrupts
    /// SACK; `false` reproduces them.
    pub rewrite_sack: bool,
    /// Most connections tracked.
    pub max_flows: usize,
    /// A full table evicts flows idle this long.
    #[serde(with = "serde_duration")]
    pub idle_timeout: Duration,
}

impl Default for SeqRewriteConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            directions: DirectionFilter::Both,
            rewrite_sack: true,
            max_flows: 65_536,
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// Counters of a [`SeqRewriter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SeqRewriteStats {
    /// Flow directions given an offset (one per SYN or SYN-ACK seen first).
    pub flows_shifted: u64,
    /// Segments whose sequence or acknowledgment number changed.
    pub segments_rewritten: u64,
    /// SACK blocks shifted back.
    pub sack_blocks_rewritten: u64,
    /// Flows not shifted because the table was full.
    pub flows_untracked: u64,
}

/// Adds a random per-flow offset to the ISN and every sequence number of a direction, and
/// subtracts it from the acknowledgment numbers and SACK blocks (RFC 2018) of the other
/// direction, as a firewall with ISN randomisation does. The offset is drawn when the box sees
/// the flow's SYN (or SYN-ACK); flows whose handshake it did not see pass unchanged, so a
/// connection is always consistent. Timestamps are left alone.
pub struct SeqRewriter {
    config: SeqRewriteConfig,
    rng: Stream,
    /// Offset per shifted flow direction.
    offsets: FlowTable<u32>,
    stats: SeqRewriteStats,
}

impl SeqRewriter {
    /// A rewriter.
    pub fn new(config: SeqRewriteConfig) -> Self {
        Self {
            rng: Stream::new(config.seed, 0),
            offsets: FlowTable::new(config.max_flows, config.idle_timeout),
            config,
            stats: SeqRewriteStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> SeqRewriteStats {
        self.stats
    }
}

impl Middlebox for SeqRewriter {
    fn name(&self) -> &'static str {
        "seq-rewrite"
    }

    fn process(&mut self, now: Instant, dir: Direction, mut packet: Vec<u8>, out: &mut Vec<Emit>) {
        let Some(view) = TcpView::parse(&packet) else {
            return pass(now, dir, packet, out);
        };
        let key = view.key(&packet);
        if self.config.directions.applies(dir)
            && view.has(&packet, tcp_flags::SYN)
            && !self.offsets.contains(&key)
        {
            // Zero would be no rewriting at all.
            let offset = (self.rng.next_u64() as u32).max(1);
            if self.offsets.insert(key, now, offset) {
                self.stats.flows_shifted += 1;
            } else {
                self.stats.flows_untracked += 1;
            }
        }
        let own = self.offsets.get_mut(&key, now).copied();
        let peer = self.offsets.get_mut(&key.reversed(), now).copied();
        let mut changed = false;
        if let Some(offset) = own {
            let seq = view.seq(&packet).wrapping_add(offset);
            view.set_seq(&mut packet, seq);
            changed = true;
        }
        if let Some(offset) = peer {
            if view.has(&packet, tcp_flags::ACK) {
                let ack = view.ack(&packet).wrapping_sub(offset);
                view.set_ack(&mut packet, ack);
                changed = true;
            }
            if self.config.rewrite_sack {
                let options = view.options(&packet).to_vec();
                for option in tcp_options(&options) {
                    // SACK: kind 5, length 2 + 8n, n blocks of left and right edges.
                    if let TcpOption::Option { kind: 5, at, len } = option {
                        for block in 0..(len - 2) / 8 {
                            for edge in 0..2 {
                                let field = 20 + at + 2 + block * 8 + edge * 4;
                                let b = &packet[view.tcp + field..view.tcp + field + 4];
                                let value = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                                view.write_bytes(
                                    &mut packet,
                                    field,
                                    &value.wrapping_sub(offset).to_be_bytes(),
                                );
                            }
                            self.stats.sack_blocks_rewritten += 1;
                            changed = true;
                        }
                    }
                }
            }
        }
        self.stats.segments_rewritten += u64::from(changed);
        pass(now, dir, packet, out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("seq_flows_shifted", self.stats.flows_shifted),
            ("seq_segments_rewritten", self.stats.segments_rewritten),
            (
                "seq_sack_blocks_rewritten",
                self.stats.sack_blocks_rewritten,
            ),
            ("seq_flows_untracked", self.stats.flows_untracked),
        ]
    }
}
