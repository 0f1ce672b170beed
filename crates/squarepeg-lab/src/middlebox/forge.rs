//! An on-path attacker against TLS records in segments: injects, corrupts and splices.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::flows::FlowTable;
use super::{DirectionFilter, Emit, Middlebox, pass};
use crate::Direction;
use crate::packet::{SeqUnwrapper, TcpView, tcp_flags};
use crate::rng::{Chance, Stream};

/// Configuration of a [`Forger`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForgeConfig {
    /// Seed of every decision and of the forged bytes.
    pub seed: u64,
    /// Data directions attacked.
    pub directions: DirectionFilter,
    /// Chance per data segment of sending, just before it, a segment that starts with a fake
    /// TLS application-data record header (`17 03 03 len`) followed by random bytes, at a
    /// random offset within `span` bytes around the segment.
    pub inject: f64,
    /// Chance per retransmitted data segment (a range seen before) that one bit of its
    /// payload is flipped (the checksum fixed, so TCP takes it).
    pub flip: f64,
    /// Chance per data segment that it is replaced by one carrying, at its sequence number,
    /// an earlier record of the flow (from its header on): a genuine, valid-looking record
    /// at the wrong place.
    pub splice: f64,
    /// How far from a segment (before its start or after its end) injected segments land.
    pub span: u32,
    /// Payload bytes remembered per flow to splice from.
    pub remember: usize,
    /// Most flows remembered.
    pub max_flows: usize,
}

impl Default for ForgeConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            directions: DirectionFilter::Both,
            inject: 0.02,
            flip: 0.5,
            splice: 0.02,
            span: 32 * 1024,
            remember: 64 * 1024,
            max_flows: 1024,
        }
    }
}

/// Counters of a [`Forger`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ForgeStats {
    /// Segments with a fake record header injected.
    pub injected: u64,
    /// Retransmitted segments with a bit flipped.
    pub flipped: u64,
    /// Segments replaced by an earlier record.
    pub spliced: u64,
    /// Segments passed unchanged because their checksum was wrong.
    pub bad_checksum: u64,
}

/// What the forger knows of one direction of a flow.
#[derive(Debug, Default)]
struct ForgeFlow {
    seq: SeqUnwrapper,
    /// End of the highest data seen (unwrapped): a segment starting below it re-sends.
    sent_end: Option<u64>,
    /// Recent payloads, oldest first, at most `remember` bytes.
    recent: VecDeque<Vec<u8>>,
    bytes: usize,
}

/// TLS application-data record header start (RFC 8446 §5.1).
const RECORD_HEADER: [u8; 3] = [0x17, 0x03, 0x03];

/// An attacker on the path of TLS-over-TCP flows (what uTLS's out-of-order receiver must
/// survive, Minion §6): it injects segments that begin with fake record headers, flips bits
/// in retransmissions, and replaces segments with genuine records from elsewhere in the flow.
/// The forged packets are valid TCP (checksums fixed), so only TLS can tell; nothing it
/// touches may reach an application. Acts on data segments only (no SYN, FIN or RST).
pub struct Forger {
    config: ForgeConfig,
    flows: FlowTable<ForgeFlow>,
    rng: Stream,
    inject: Chance,
    flip: Chance,
    splice: Chance,
    stats: ForgeStats,
}

impl Forger {
    /// A forger with the given chances.
    pub fn new(config: ForgeConfig) -> Self {
        Self {
            flows: FlowTable::new(config.max_flows, Duration::from_secs(300)),
            rng: Stream::new(config.seed, 0x666f_7267),
            inject: Chance::new(config.inject),
            flip: Chance::new(config.flip),
            splice: Chance::new(config.splice),
            config,
            stats: ForgeStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> ForgeStats {
        self.stats
    }

    /// A fake record: a plausible header, then random bytes.
    fn fake_record(&mut self) -> Vec<u8> {
        let len = 22 + self.rng.below(1200) as usize;
        let mut bytes = RECORD_HEADER.to_vec();
        bytes.extend((len as u16).to_be_bytes());
        let body = 8 + self.rng.below(len as u64) as usize;
        bytes.extend((0..body).map(|_| self.rng.next_u64() as u8));
        bytes
    }
}

impl ForgeFlow {
    fn remember(&mut self, payload: &[u8], limit: usize) {
        self.recent.push_back(payload.to_vec());
        self.bytes += payload.len();
        while self.bytes > limit {
            let Some(old) = self.recent.pop_front() else {
                break;
            };
            self.bytes -= old.len();
        }
    }

    /// Up to `len` bytes of a remembered payload from a record header on, picked by `pick`.
    fn earlier_record(&self, pick: u64, len: usize) -> Option<Vec<u8>> {
        let starts: Vec<(usize, usize)> = self
            .recent
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.windows(RECORD_HEADER.len())
                    .enumerate()
                    .filter(|(_, w)| *w == RECORD_HEADER)
                    .map(move |(at, _)| (i, at))
            })
            .collect();
        if starts.is_empty() {
            return None;
        }
        let (i, at) = starts[(pick % starts.len() as u64) as usize];
        let p = &self.recent[i];
        Some(p[at..p.len().min(at + len)].to_vec())
    }
}

impl Middlebox for Forger {
    fn name(&self) -> &'static str {
        "forge"
    }

    fn process(&mut self, now: Instant, dir: Direction, mut packet: Vec<u8>, out: &mut Vec<Emit>) {
        let Some(view) = TcpView::parse(&packet) else {
            return pass(now, dir, packet, out);
        };
        let flags = view.flags(&packet);
        if !self.config.directions.applies(dir)
            || view.payload_len() == 0
            || flags & (tcp_flags::SYN | tcp_flags::FIN | tcp_flags::RST) != 0
        {
            return pass(now, dir, packet, out);
        }
        if !view.checksum_valid(&packet) {
            self.stats.bad_checksum += 1;
            return pass(now, dir, packet, out);
        }
        let key = view.key(&packet);
        if !self.flows.contains(&key) && !self.flows.insert(key, now, ForgeFlow::default()) {
            return pass(now, dir, packet, out);
        }
        let seq = view.seq(&packet);
        let len = view.payload_len();
        let retransmission = {
            let Some(flow) = self.flows.get_mut(&key, now) else {
                return pass(now, dir, packet, out);
            };
            let start = flow.seq.unwrap(seq);
            let retransmission = flow.sent_end.is_some_and(|end| start < end);
            let end = start + len as u64;
            flow.sent_end = Some(flow.sent_end.map_or(end, |e| e.max(end)));
            flow.seq.raise(end);
            retransmission
        };
        let options = view.options(&packet).to_vec();
        if self.rng.chance(self.inject) {
            // Somewhere from `span` before the segment to `span` after its end.
            let span = u64::from(self.config.span);
            let shift = self.rng.below(2 * span + len as u64 + 1) as i64 - span as i64;
            let at = seq.wrapping_add(shift as u32);
            let fake = self.fake_record();
            let forged = view.rebuild(&packet, at, flags, &options, &fake, None);
            self.stats.injected += 1;
            pass(now, dir, forged, out);
        }
        let flip = retransmission && self.rng.chance(self.flip);
        let splice = self.rng.chance(self.splice);
        let pick = self.rng.next_u64();
        let flow = self.flows.get_mut(&key, now).expect("inserted above");
        // What it learns is the genuine payload, before any change.
        let earlier = splice.then(|| flow.earlier_record(pick, len)).flatten();
        flow.remember(view.payload(&packet), self.config.remember);
        if let Some(record) = earlier {
            let forged = view.rebuild(&packet, seq, flags, &options, &record, None);
            self.stats.spliced += 1;
            return pass(now, dir, forged, out);
        }
        if flip {
            let bit = self.rng.below(len as u64 * 8) as usize;
            let at = view.payload_range().start - view.tcp + bit / 8;
            let byte = packet[view.tcp + at] ^ (1 << (bit % 8));
            view.write_bytes(&mut packet, at, &[byte]);
            self.stats.flipped += 1;
        }
        pass(now, dir, packet, out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("forge_injected", self.stats.injected),
            ("forge_flipped", self.stats.flipped),
            ("forge_spliced", self.stats.spliced),
            ("forge_bad_checksum", self.stats.bad_checksum),
        ]
    }
}
