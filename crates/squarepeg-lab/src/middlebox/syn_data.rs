//! Dropping SYNs that carry data.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{DirectionFilter, Emit, Middlebox, pass};
use crate::Direction;
use crate::packet::TcpView;
use crate::packet::tcp_flags::SYN;

/// Configuration of a [`SynDataDropper`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DropSynDataConfig {
    /// Directions acted on.
    pub directions: DirectionFilter,
}

/// Counters of a [`SynDataDropper`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SynDataDropperStats {
    /// SYN or SYN-ACK segments with payload dropped.
    pub dropped: u64,
}

/// Drops every SYN (and SYN-ACK) that carries data, passing everything else: what firewalls
/// that consider data on a SYN an attack do to TCP Fast Open (RFC 7413 §7.1, "middleboxes
/// may drop SYN packets with data"), and what a client's TFO blackhole detection must notice.
pub struct SynDataDropper {
    config: DropSynDataConfig,
    stats: SynDataDropperStats,
}

impl SynDataDropper {
    /// A dropper.
    pub fn new(config: DropSynDataConfig) -> Self {
        Self {
            config,
            stats: SynDataDropperStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> SynDataDropperStats {
        self.stats
    }
}

impl Middlebox for SynDataDropper {
    fn name(&self) -> &'static str {
        "drop-syn-data"
    }

    fn process(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>) {
        if self.config.directions.applies(dir)
            && let Some(view) = TcpView::parse(&packet)
            && view.has(&packet, SYN)
            && view.payload_len() > 0
        {
            self.stats.dropped += 1;
            return;
        }
        pass(now, dir, packet, out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("syn_data_dropped", self.stats.dropped)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::TcpView;

    /// An IPv4/TCP packet with the given flags and payload (checksums left zero: the box does
    /// not check them).
    fn packet(flags: u8, payload: &[u8]) -> Vec<u8> {
        let total = 40 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&1000u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = flags;
        p[40..].copy_from_slice(payload);
        p
    }

    #[test]
    fn drops_only_syns_with_data_in_chosen_directions() {
        let now = Instant::now();
        let mut up_only = SynDataDropper::new(DropSynDataConfig {
            directions: DirectionFilter::LeftToRight,
        });
        let mut out = Vec::new();
        let syn_data = packet(SYN, b"hello");
        assert!(TcpView::parse(&syn_data).is_some());
        up_only.process(now, Direction::LeftToRight, syn_data.clone(), &mut out);
        assert!(out.is_empty());
        // A bare SYN, a data segment without SYN, and SYN data the other way pass.
        up_only.process(now, Direction::LeftToRight, packet(SYN, b""), &mut out);
        up_only.process(now, Direction::LeftToRight, packet(0x18, b"data"), &mut out);
        up_only.process(now, Direction::RightToLeft, syn_data.clone(), &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(up_only.stats().dropped, 1);
        assert_eq!(up_only.counters(), vec![("syn_data_dropped", 1)]);
        // Non-TCP bytes pass untouched.
        up_only.process(now, Direction::LeftToRight, vec![1, 2, 3], &mut out);
        assert_eq!(out.len(), 4);
    }
}
