//! The retransmission cache of split-TCP proxies.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::flows::FlowTable;
use super::{DirectionFilter, Emit, Middlebox, pass};
use crate::Direction;
use crate::checksum;
use crate::packet::{PROTO_TCP, SeqUnwrapper, TcpView, tcp_flags};
use crate::units::serde_duration;

/// Configuration of a [`RetransmitCache`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetransmitCacheConfig {
    /// Data directions whose payload is cached (and restored).
    pub directions: DirectionFilter,
    /// Most payload bytes remembered per flow; the lowest sequence ranges go first.
    pub max_bytes_per_flow: usize,
    /// Most flows remembered.
    pub max_flows: usize,
    /// A full table evicts flows idle this long.
    #[serde(with = "serde_duration")]
    pub idle_timeout: Duration,
}

impl Default for RetransmitCacheConfig {
    fn default() -> Self {
        Self {
            directions: DirectionFilter::Both,
            max_bytes_per_flow: 4 * 1024 * 1024,
            max_flows: 1024,
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// Counters of a [`RetransmitCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RetransmitCacheStats {
    /// Data segments that re-sent bytes the cache had seen.
    pub segments_rewritten: u64,
    /// Bytes whose re-sent value differed from the first one and were restored.
    pub bytes_restored: u64,
    /// Bytes forgotten because the receiver acknowledged them.
    pub bytes_evicted_acked: u64,
    /// Bytes forgotten to stay within `max_bytes_per_flow`.
    pub bytes_evicted_overflow: u64,
    /// Flows not cached because the table was full.
    pub flows_untracked: u64,
    /// Segments passed unchanged because their checksum was wrong.
    pub bad_checksum: u64,
}

/// Largest cached range: contiguous data is appended to a range up to this size, so trimming
/// the front of a range (on an acknowledgment or at the byte limit) copies little.
const MAX_RANGE: usize = 16 * 1024;

#[derive(Debug, Default)]
struct CachedFlow {
    seq: SeqUnwrapper,
    /// Disjoint ranges of the stream, keyed by unwrapped start sequence number.
    ranges: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
}

impl CachedFlow {
    /// Overwrites the parts of `payload` (starting at `start`) the cache has seen with the
    /// cached bytes; returns how many bytes changed.
    fn restore(&self, start: u64, payload: &mut [u8]) -> usize {
        let end = start + payload.len() as u64;
        let mut changed = 0;
        for (&range_start, bytes) in self.ranges.range(..end).rev() {
            let range_end = range_start + bytes.len() as u64;
            if range_end <= start {
                break;
            }
            let from = range_start.max(start);
            let to = range_end.min(end);
            let cached = &bytes[(from - range_start) as usize..(to - range_start) as usize];
            let target = &mut payload[(from - start) as usize..(to - start) as usize];
            changed += cached
                .iter()
                .zip(target.iter())
                .filter(|(a, b)| a != b)
                .count();
            target.copy_from_slice(cached);
        }
        changed
    }

    /// Remembers the parts of `[start, start + payload.len())` not yet cached.
    fn remember(&mut self, start: u64, payload: &[u8]) {
        let end = start + payload.len() as u64;
        let mut gaps = Vec::new();
        let mut cursor = start;
        let first_overlap = self
            .ranges
            .range(..start)
            .next_back()
            .filter(|(s, b)| **s + b.len() as u64 > start)
            .map(|(s, _)| *s);
        let overlapping: Vec<(u64, u64)> = first_overlap
            .into_iter()
            .chain(self.ranges.range(start..end).map(|(s, _)| *s))
            .map(|s| (s, s + self.ranges[&s].len() as u64))
            .collect();
        for (s, e) in overlapping {
            if s > cursor {
                gaps.push((cursor, s));
            }
            cursor = cursor.max(e);
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        for (s, e) in gaps {
            let bytes = &payload[(s - start) as usize..(e - start) as usize];
            self.bytes += bytes.len();
            // Extend a range that ends exactly here, so an in-order stream stays a few entries.
            let previous = self.ranges.range_mut(..s).next_back().filter(|(ps, pb)| {
                **ps + pb.len() as u64 == s && pb.len() + bytes.len() <= MAX_RANGE
            });
            match previous {
                Some((_, pb)) => pb.extend_from_slice(bytes),
                None => {
                    self.ranges.insert(s, bytes.to_vec());
                }
            }
        }
    }

    /// Forgets everything below `point`; returns the bytes forgotten.
    fn forget_below(&mut self, point: u64) -> usize {
        let mut forgotten = 0;
        while let Some(mut entry) = self.ranges.first_entry() {
            let start = *entry.key();
            if start >= point {
                break;
            }
            let len = entry.get().len() as u64;
            if start + len <= point {
                forgotten += entry.remove().len();
            } else {
                let cut = (point - start) as usize;
                let rest = entry.get_mut().split_off(cut);
                forgotten += cut;
                entry.remove();
                self.ranges.insert(point, rest);
                break;
            }
        }
        self.bytes -= forgotten;
        forgotten
    }

    /// Forgets the lowest ranges until at most `max` bytes remain.
    fn shrink_to(&mut self, max: usize) -> usize {
        let mut forgotten = 0;
        while self.bytes > max {
            let Some(mut entry) = self.ranges.first_entry() else {
                break;
            };
            let excess = self.bytes - max;
            let start = *entry.key();
            if entry.get().len() <= excess {
                let len = entry.remove().len();
                self.bytes -= len;
                forgotten += len;
            } else {
                let rest = entry.get_mut().split_off(excess);
                entry.remove();
                self.ranges.insert(start + excess as u64, rest);
                self.bytes -= excess;
                forgotten += excess;
            }
        }
        forgotten
    }
}

/// Remembers the payload seen for each sequence range of a flow and, when a later segment
/// re-sends any part of a range, replaces those bytes with the ones first seen — what the
/// split-TCP proxies of three UK mobile operators did to Hollywood's inconsistent
/// retransmissions (Hollywood §5.3, table 5.2).
///
/// Memory is bounded: ranges below the acknowledgment number the other direction carries are
/// forgotten (that data will not be re-sent), at most `max_bytes_per_flow` payload bytes are
/// kept per flow (the lowest ranges go first), and at most `max_flows` flows. A RST forgets
/// both directions of its connection.
pub struct RetransmitCache {
    config: RetransmitCacheConfig,
    flows: FlowTable<CachedFlow>,
    stats: RetransmitCacheStats,
}

impl RetransmitCache {
    /// A cache with the given bounds.
    pub fn new(config: RetransmitCacheConfig) -> Self {
        Self {
            flows: FlowTable::new(config.max_flows, config.idle_timeout),
            config,
            stats: RetransmitCacheStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> RetransmitCacheStats {
        self.stats
    }
}

impl Middlebox for RetransmitCache {
    fn name(&self) -> &'static str {
        "retransmit-cache"
    }

    fn process(&mut self, now: Instant, dir: Direction, mut packet: Vec<u8>, out: &mut Vec<Emit>) {
        let Some(view) = TcpView::parse(&packet) else {
            return pass(now, dir, packet, out);
        };
        let key = view.key(&packet);
        if view.has(&packet, tcp_flags::RST) {
            self.flows.remove(&key);
            self.flows.remove(&key.reversed());
            return pass(now, dir, packet, out);
        }
        // This packet's acknowledgment covers the reverse flow's data.
        if view.has(&packet, tcp_flags::ACK)
            && let Some(flow) = self.flows.get_mut(&key.reversed(), now)
        {
            let ack = flow.seq.peek(view.ack(&packet));
            self.stats.bytes_evicted_acked += flow.forget_below(ack) as u64;
        }
        if !self.config.directions.applies(dir) || view.payload_len() == 0 {
            return pass(now, dir, packet, out);
        }
        if !view.checksum_valid(&packet) {
            self.stats.bad_checksum += 1;
            return pass(now, dir, packet, out);
        }
        if !self.flows.contains(&key) && !self.flows.insert(key, now, CachedFlow::default()) {
            self.stats.flows_untracked += 1;
            return pass(now, dir, packet, out);
        }
        let Some(flow) = self.flows.get_mut(&key, now) else {
            return pass(now, dir, packet, out);
        };
        // Data starts after the SYN's sequence number (RFC 9293 §3.4).
        let syn = u32::from(view.has(&packet, tcp_flags::SYN));
        let start = flow.seq.unwrap(view.seq(&packet).wrapping_add(syn));
        let range = view.payload_range();
        let changed = flow.restore(start, &mut packet[range.clone()]);
        flow.remember(start, &packet[range.clone()]);
        flow.seq.raise(start + range.len() as u64);
        self.stats.bytes_evicted_overflow += flow.shrink_to(self.config.max_bytes_per_flow) as u64;
        if changed > 0 {
            self.stats.segments_rewritten += 1;
            self.stats.bytes_restored += changed as u64;
            let sum_at = view.tcp + 16;
            packet[sum_at..sum_at + 2].fill(0);
            let sum = checksum::transport_checksum(
                view.ip.src,
                view.ip.dst,
                PROTO_TCP,
                view.segment(&packet),
            );
            packet[sum_at..sum_at + 2].copy_from_slice(&sum.to_be_bytes());
        }
        pass(now, dir, packet, out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("cache_segments_rewritten", self.stats.segments_rewritten),
            ("cache_bytes_restored", self.stats.bytes_restored),
            ("cache_bytes_evicted_acked", self.stats.bytes_evicted_acked),
            (
                "cache_bytes_evicted_overflow",
                self.stats.bytes_evicted_overflow,
            ),
            ("cache_flows_untracked", self.stats.flows_untracked),
            ("cache_bad_checksum", self.stats.bad_checksum),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_restore_remember_and_forget() {
        let mut flow = CachedFlow::default();
        flow.remember(100, b"abcdef");
        flow.remember(106, b"ghij");
        assert_eq!(flow.ranges.len(), 1, "contiguous ranges merge");
        flow.remember(120, b"uvw");
        assert_eq!(flow.bytes, 13);
        // A segment over [104, 122): cached 104..110 and 120..122, a gap at 110..120.
        let mut payload = *b"XXXXXXXXXXXXXXXXXX";
        assert_eq!(flow.restore(104, &mut payload), 8);
        assert_eq!(&payload, b"efghijXXXXXXXXXXuv");
        flow.remember(104, &payload);
        assert_eq!(flow.bytes, 23);
        let mut again = [0u8; 23];
        flow.restore(100, &mut again);
        assert_eq!(&again, b"abcdefghijXXXXXXXXXXuvw");
        assert_eq!(flow.forget_below(103), 3);
        assert_eq!(flow.bytes, 20);
        assert_eq!(flow.shrink_to(5), 15);
        let mut tail = [0u8; 5];
        flow.restore(118, &mut tail);
        assert_eq!(&tail, b"XXuvw");
        assert_eq!(flow.bytes, 5);
    }

    #[test]
    fn long_streams_are_kept_in_bounded_ranges() {
        let mut flow = CachedFlow::default();
        let data: Vec<u8> = (0..40 * 1024).map(|i| (i % 251) as u8).collect();
        for (i, chunk) in data.chunks(1024).enumerate() {
            flow.remember(1000 + 1024 * i as u64, chunk);
        }
        assert_eq!(flow.ranges.len(), 3, "16 KiB ranges");
        assert!(flow.ranges.values().all(|r| r.len() <= MAX_RANGE));
        // A re-sent range across a boundary between ranges.
        let mut payload = vec![0u8; 3000];
        let start = 1000 + MAX_RANGE as u64 - 1500;
        assert!(flow.restore(start, &mut payload) > 0);
        let offset = MAX_RANGE - 1500;
        assert_eq!(payload, data[offset..offset + 3000]);
        assert_eq!(flow.forget_below(start), offset);
        assert_eq!(flow.bytes, data.len() - offset);
    }
}
