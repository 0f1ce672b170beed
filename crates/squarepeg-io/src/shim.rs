//! The impairment shim: loss, reordering, delay (everything the lab's link model does) applied
//! to packets between the TUN device and the endpoint, one [`LinkDirection`] per direction.
//!
//! This is a stand-in for the lab's namespace emulator (a userspace bridge between network
//! namespaces, built separately): it lets interoperability tests put a bad path between the
//! kernel and squarepeg with the same model code, and no second implementation of it. The model
//! decides each packet's fate and arrival time; the shim only holds the packet until then.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use squarepeg_lab::model::{LinkConfig, LinkDirection, LinkStats, Verdict};
use squarepeg_lab::rng::derive_seed;

use crate::error::Error;

/// Default bound of the packets one direction holds at once.
pub const DEFAULT_MAX_HELD_PACKETS: usize = 65_536;

/// Impairments between the TUN device and the endpoint, one link model per direction.
#[derive(Debug, Clone, PartialEq)]
pub struct Impairment {
    /// Packets read from the device, on their way to the endpoint (kernel to squarepeg).
    pub inbound: LinkConfig,
    /// Packets the endpoint sends, on their way to the device (squarepeg to kernel).
    pub outbound: LinkConfig,
    /// Master seed; each direction draws from its own seed derived from it, so a run's
    /// impairment pattern (per packet index) replays exactly.
    pub seed: u64,
    /// Most packets held per direction (a bound on memory: packets beyond it are dropped and
    /// counted in [`ShimStats::overflow_drops`]).
    pub max_held_packets: usize,
}

impl Impairment {
    /// The same link model in both directions.
    pub fn symmetric(link: LinkConfig, seed: u64) -> Self {
        Impairment {
            inbound: link.clone(),
            outbound: link,
            seed,
            max_held_packets: DEFAULT_MAX_HELD_PACKETS,
        }
    }
}

/// Counters of one shim direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShimStats {
    /// The link model's counters (offered, delivered, drops by reason, reordered, ...).
    pub link: LinkStats,
    /// Packets dropped because `max_held_packets` were already held.
    pub overflow_drops: u64,
    /// Packets held right now.
    pub held: usize,
}

/// A packet waiting for its arrival time. Ordered by arrival, then by the order of offers, so
/// packets with equal arrival times leave in the order they came.
#[derive(Debug)]
struct Held {
    at: Instant,
    order: u64,
    packet: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// One direction: a link model and the packets it has scheduled.
#[derive(Debug)]
pub(crate) struct ShimDirection {
    link: LinkDirection,
    held: BinaryHeap<Reverse<Held>>,
    next_order: u64,
    max_held: usize,
    overflow_drops: u64,
    /// Buffers of delivered packets, reused for later ones.
    spare: Vec<Vec<u8>>,
}

impl ShimDirection {
    pub(crate) fn new(config: LinkConfig, seed: u64, max_held: usize) -> Result<Self, Error> {
        Ok(ShimDirection {
            link: LinkDirection::new(config, seed)?,
            held: BinaryHeap::new(),
            next_order: 0,
            max_held: max_held.max(1),
            overflow_drops: 0,
            spare: Vec::new(),
        })
    }

    /// Offers a packet at `now`; the model decides whether and when it arrives (twice for a
    /// duplicate).
    pub(crate) fn offer(&mut self, now: Instant, packet: &[u8]) {
        let verdict = self.link.offer(now, packet.len());
        if let Verdict::Deliver { .. } = verdict {
            for at in verdict.arrivals() {
                if self.held.len() >= self.max_held {
                    self.overflow_drops += 1;
                    continue;
                }
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(packet);
                self.held.push(Reverse(Held {
                    at,
                    order: self.next_order,
                    packet: buf,
                }));
                self.next_order += 1;
            }
        }
    }

    /// The next packet whose arrival time is at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.held.peek()?.0.at > now {
            return None;
        }
        self.held.pop().map(|Reverse(h)| h.packet)
    }

    /// Gives a delivered packet's buffer back for reuse.
    pub(crate) fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < 256 {
            self.spare.push(buf);
        }
    }

    /// When the next held packet arrives.
    pub(crate) fn next_arrival(&self) -> Option<Instant> {
        self.held.peek().map(|h| h.0.at)
    }

    pub(crate) fn stats(&self) -> ShimStats {
        ShimStats {
            link: self.link.stats().clone(),
            overflow_drops: self.overflow_drops,
            held: self.held.len(),
        }
    }
}

/// Both directions.
#[derive(Debug)]
pub(crate) struct Shim {
    pub(crate) inbound: ShimDirection,
    pub(crate) outbound: ShimDirection,
}

/// Labels of the per-direction seeds derived from [`Impairment::seed`].
const SEED_INBOUND: u64 = 1;
const SEED_OUTBOUND: u64 = 2;

impl Shim {
    pub(crate) fn new(config: &Impairment) -> Result<Self, Error> {
        Ok(Shim {
            inbound: ShimDirection::new(
                config.inbound.clone(),
                derive_seed(config.seed, SEED_INBOUND),
                config.max_held_packets,
            )?,
            outbound: ShimDirection::new(
                config.outbound.clone(),
                derive_seed(config.seed, SEED_OUTBOUND),
                config.max_held_packets,
            )?,
        })
    }

    pub(crate) fn next_arrival(&self) -> Option<Instant> {
        match (self.inbound.next_arrival(), self.outbound.next_arrival()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn packet(i: u32) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    fn drain(d: &mut ShimDirection, now: Instant) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(p) = d.pop_due(now) {
            out.push(u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
            d.recycle(p);
        }
        out
    }

    #[test]
    fn holds_packets_until_their_delay_has_passed() {
        let t0 = Instant::now();
        let link = LinkConfig::new().with_delay(Duration::from_millis(5));
        let mut d = ShimDirection::new(link, 1, 100).unwrap();
        d.offer(t0, &packet(1));
        d.offer(t0 + Duration::from_millis(1), &packet(2));
        assert_eq!(d.next_arrival(), Some(t0 + Duration::from_millis(5)));
        assert!(drain(&mut d, t0 + Duration::from_micros(4999)).is_empty());
        assert_eq!(drain(&mut d, t0 + Duration::from_millis(5)), vec![1]);
        assert_eq!(drain(&mut d, t0 + Duration::from_millis(6)), vec![2]);
        assert_eq!(d.stats().held, 0);
    }

    #[test]
    fn reordering_lets_later_packets_overtake_and_loss_drops() {
        let t0 = Instant::now();
        let link = LinkConfig::new()
            .with_delay(Duration::from_millis(1))
            .with_reorder(0.2, Duration::from_millis(3))
            .with_loss(0.1);
        let mut d = ShimDirection::new(link, 7, 10_000).unwrap();
        for i in 0..1000u32 {
            d.offer(t0 + Duration::from_micros(u64::from(i) * 10), &packet(i));
        }
        let got = drain(&mut d, t0 + Duration::from_secs(1));
        let stats = d.stats();
        assert_eq!(got.len() as u64, stats.link.delivered);
        assert_eq!(stats.link.dropped_random_loss, 1000 - got.len() as u64);
        assert!(stats.link.dropped_random_loss > 50 && stats.link.dropped_random_loss < 150);
        let inversions = got.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(inversions > 50, "{inversions} inversions");
        // Same seed, same pattern.
        let mut again = ShimDirection::new(d.link.config().clone(), 7, 10_000).unwrap();
        for i in 0..1000u32 {
            again.offer(t0 + Duration::from_micros(u64::from(i) * 10), &packet(i));
        }
        assert_eq!(drain(&mut again, t0 + Duration::from_secs(1)), got);
    }

    #[test]
    fn held_packets_are_bounded() {
        let t0 = Instant::now();
        let link = LinkConfig::new().with_delay(Duration::from_millis(10));
        let mut d = ShimDirection::new(link, 1, 3).unwrap();
        for i in 0..5 {
            d.offer(t0, &packet(i));
        }
        assert_eq!(d.stats().overflow_drops, 2);
        assert_eq!(drain(&mut d, t0 + Duration::from_millis(10)), vec![0, 1, 2]);
    }
}
