//! The impairment shim: packets between the TUN device and the endpoint, held until the arrival
//! time a [`PathModel`] gives them, one model per direction.
//!
//! The model decides each packet's fate (dropped, or delivered at some instants, more than one
//! for duplicates); the shim only holds the packet until then, within a bound. This keeps the
//! driver free of any particular link model: the lab's (`squarepeg_lab::stack::impairment`)
//! plugs in here, so interoperability tests put a bad path between the kernel and squarepeg
//! with the same model code the lab's engines run.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::Instant;

/// Default bound of the packets one direction holds at once.
pub const DEFAULT_MAX_HELD_PACKETS: usize = 65_536;

/// A model of one direction of a path: offered each packet and the time it reaches the path, it
/// says when the packet arrives at the far end, if ever.
pub trait PathModel: Send {
    /// Offers `packet` at `now` and pushes to `arrivals` (empty on entry) the instants at which
    /// it arrives: none drops it, more than one delivers copies (duplicates). The driver offers
    /// packets in time order and delivers each copy once its instant has passed.
    fn offer(&mut self, now: Instant, packet: &[u8], arrivals: &mut Vec<Instant>);
}

impl fmt::Debug for dyn PathModel + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PathModel")
    }
}

/// Impairments between the TUN device and the endpoint, one path model per direction.
#[derive(Debug)]
#[non_exhaustive]
pub struct Impairment {
    /// Packets read from the device, on their way to the endpoint (kernel to squarepeg).
    pub inbound: Box<dyn PathModel>,
    /// Packets the endpoint sends, on their way to the device (squarepeg to kernel).
    pub outbound: Box<dyn PathModel>,
    /// Most packets held per direction (a bound on memory: packets beyond it are dropped and
    /// counted in [`ShimStats::overflow_drops`]).
    pub max_held_packets: usize,
}

impl Impairment {
    /// One model each way, holding at most [`DEFAULT_MAX_HELD_PACKETS`] per direction.
    pub fn new(inbound: impl PathModel + 'static, outbound: impl PathModel + 'static) -> Self {
        Impairment {
            inbound: Box::new(inbound),
            outbound: Box::new(outbound),
            max_held_packets: DEFAULT_MAX_HELD_PACKETS,
        }
    }
}

/// Counters of one shim direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShimStats {
    /// Packets offered to the model.
    pub offered: u64,
    /// Packets the model delivered (copies beyond the first not counted).
    pub delivered: u64,
    /// Packets the model dropped.
    pub dropped: u64,
    /// Extra copies the model delivered.
    pub duplicated: u64,
    /// Copies that left the shim after a copy of a packet offered later (overtaken).
    pub reordered: u64,
    /// Copies dropped because `max_held_packets` were already held.
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
    /// The index of the offer it is a copy of (copies of one packet share it).
    offer: u64,
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

/// One direction: a path model and the packets it has scheduled.
#[derive(Debug)]
pub(crate) struct ShimDirection {
    model: Box<dyn PathModel>,
    /// The model's answer for the packet being offered (kept to reuse its allocation).
    arrivals: Vec<Instant>,
    held: BinaryHeap<Reverse<Held>>,
    next_order: u64,
    max_held: usize,
    /// The latest offer a released copy came from.
    latest_released: Option<u64>,
    stats: ShimStats,
    /// Buffers of delivered packets, reused for later ones.
    spare: Vec<Vec<u8>>,
}

impl ShimDirection {
    pub(crate) fn new(model: Box<dyn PathModel>, max_held: usize) -> Self {
        ShimDirection {
            model,
            arrivals: Vec::new(),
            held: BinaryHeap::new(),
            next_order: 0,
            max_held: max_held.max(1),
            latest_released: None,
            stats: ShimStats::default(),
            spare: Vec::new(),
        }
    }

    /// Offers a packet at `now`; the model decides whether and when it arrives (more than once
    /// for a duplicate).
    pub(crate) fn offer(&mut self, now: Instant, packet: &[u8]) {
        let offer = self.stats.offered;
        self.stats.offered += 1;
        self.arrivals.clear();
        self.model.offer(now, packet, &mut self.arrivals);
        match self.arrivals.len() {
            0 => self.stats.dropped += 1,
            n => {
                self.stats.delivered += 1;
                self.stats.duplicated += n as u64 - 1;
            }
        }
        for &at in &self.arrivals {
            if self.held.len() >= self.max_held {
                self.stats.overflow_drops += 1;
                continue;
            }
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(packet);
            self.held.push(Reverse(Held {
                at,
                order: self.next_order,
                offer,
                packet: buf,
            }));
            self.next_order += 1;
        }
    }

    /// The next packet whose arrival time is at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.held.peek()?.0.at > now {
            return None;
        }
        let Reverse(held) = self.held.pop()?;
        match self.latest_released {
            Some(latest) if held.offer < latest => self.stats.reordered += 1,
            _ => self.latest_released = Some(held.offer),
        }
        Some(held.packet)
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
            held: self.held.len(),
            ..self.stats.clone()
        }
    }
}

/// Both directions.
#[derive(Debug)]
pub(crate) struct Shim {
    pub(crate) inbound: ShimDirection,
    pub(crate) outbound: ShimDirection,
}

impl Shim {
    pub(crate) fn new(config: Impairment) -> Self {
        Shim {
            inbound: ShimDirection::new(config.inbound, config.max_held_packets),
            outbound: ShimDirection::new(config.outbound, config.max_held_packets),
        }
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

    /// Every packet arrives after a fixed delay.
    struct Delay(Duration);

    impl PathModel for Delay {
        fn offer(&mut self, now: Instant, _: &[u8], arrivals: &mut Vec<Instant>) {
            arrivals.push(now + self.0);
        }
    }

    /// A scripted path, by offer index: every 10th packet is lost, every 7th held back 3 ms
    /// beyond the 1 ms delay, every 13th duplicated 2 ms later.
    #[derive(Default)]
    struct Script(u64);

    impl PathModel for Script {
        fn offer(&mut self, now: Instant, _: &[u8], arrivals: &mut Vec<Instant>) {
            let i = self.0;
            self.0 += 1;
            if i % 10 == 9 {
                return;
            }
            let held_back = if i % 7 == 6 { 3 } else { 0 };
            let at = now + Duration::from_millis(1 + held_back);
            arrivals.push(at);
            if i % 13 == 12 {
                arrivals.push(at + Duration::from_millis(2));
            }
        }
    }

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
        let mut d = ShimDirection::new(Box::new(Delay(Duration::from_millis(5))), 100);
        d.offer(t0, &packet(1));
        d.offer(t0 + Duration::from_millis(1), &packet(2));
        assert_eq!(d.next_arrival(), Some(t0 + Duration::from_millis(5)));
        assert!(drain(&mut d, t0 + Duration::from_micros(4999)).is_empty());
        assert_eq!(drain(&mut d, t0 + Duration::from_millis(5)), vec![1]);
        assert_eq!(drain(&mut d, t0 + Duration::from_millis(6)), vec![2]);
        assert_eq!(d.stats().held, 0);
    }

    #[test]
    fn packets_leave_in_arrival_order_and_the_counters_add_up() {
        let t0 = Instant::now();
        let mut d = ShimDirection::new(Box::<Script>::default(), 10_000);
        for i in 0..1000u32 {
            d.offer(t0 + Duration::from_micros(u64::from(i) * 10), &packet(i));
        }
        let got = drain(&mut d, t0 + Duration::from_secs(1));
        let stats = d.stats();
        assert_eq!(stats.offered, 1000);
        assert_eq!(stats.dropped, 100);
        assert_eq!(stats.delivered, 900);
        assert_eq!(got.len() as u64, stats.delivered + stats.duplicated);
        assert!(got.iter().all(|i| i % 10 != 9), "lost packets never leave");
        let kept = |every: u32, at: u32| (0..1000).filter(move |i| i % every == at && i % 10 != 9);
        assert_eq!(stats.duplicated, kept(13, 12).count() as u64);
        // Every packet held back is overtaken, and so is every duplicate (2 ms behind).
        assert_eq!(
            stats.reordered,
            kept(7, 6).count() as u64 + stats.duplicated
        );
        let inversions = got.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(inversions > 50, "{inversions} inversions");
        assert_eq!(stats.held, 0);
    }

    #[test]
    fn equal_arrivals_leave_in_the_order_offered() {
        let t0 = Instant::now();
        let mut d = ShimDirection::new(Box::new(Delay(Duration::ZERO)), 100);
        for i in 0..10 {
            d.offer(t0, &packet(i));
        }
        assert_eq!(drain(&mut d, t0), (0..10).collect::<Vec<_>>());
        assert_eq!(d.stats().reordered, 0);
    }

    #[test]
    fn held_packets_are_bounded() {
        let t0 = Instant::now();
        let mut d = ShimDirection::new(Box::new(Delay(Duration::from_millis(10))), 3);
        for i in 0..5 {
            d.offer(t0, &packet(i));
        }
        assert_eq!(d.stats().overflow_drops, 2);
        assert_eq!(drain(&mut d, t0 + Duration::from_millis(10)), vec![0, 1, 2]);
    }
}
