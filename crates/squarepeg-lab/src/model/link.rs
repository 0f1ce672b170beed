//! One direction of a link as a sans-IO state machine: offered a packet length and the current
//! time, it answers when the packet arrives (twice for a duplicate) or why it is dropped.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::config::{ConfigError, Fates, JitterDistribution, LinkConfig};
use crate::rng::{Chance, Stream};
use crate::units::serde_duration;

/// What happens to an offered packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The packet arrives at `at`; a duplicate, if any, at `duplicate_at` (not earlier than
    /// `at` when order is preserved).
    Deliver {
        /// Arrival of the packet.
        at: Instant,
        /// Arrival of its duplicate.
        duplicate_at: Option<Instant>,
    },
    /// The packet never arrives.
    Drop(DropReason),
}

impl Verdict {
    /// The arrival times (none, one or two).
    pub fn arrivals(&self) -> impl Iterator<Item = Instant> {
        let (first, second) = match *self {
            Verdict::Deliver { at, duplicate_at } => (Some(at), duplicate_at),
            Verdict::Drop(_) => (None, None),
        };
        first.into_iter().chain(second)
    }
}

/// Why a link dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The drop-tail queue was full.
    QueueFull,
    /// Independent random loss.
    RandomLoss,
    /// Gilbert-Elliott burst loss.
    BurstLoss,
    /// The link was set down.
    LinkDown,
    /// The packet exceeded the MTU.
    TooBig,
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropReason::QueueFull => "queue full",
            DropReason::RandomLoss => "random loss",
            DropReason::BurstLoss => "burst loss",
            DropReason::LinkDown => "link down",
            DropReason::TooBig => "too big",
        })
    }
}

/// Counters of one link direction. Bytes are IP bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Packets offered.
    pub offered: u64,
    /// Bytes offered.
    pub offered_bytes: u64,
    /// Packets scheduled for delivery (duplicates not counted).
    pub delivered: u64,
    /// Bytes scheduled for delivery (duplicates not counted).
    pub delivered_bytes: u64,
    /// Drops because the queue was full.
    pub dropped_queue_full: u64,
    /// Drops by random loss.
    pub dropped_random_loss: u64,
    /// Drops by Gilbert-Elliott loss.
    pub dropped_burst_loss: u64,
    /// Drops while the link was down.
    pub dropped_link_down: u64,
    /// Drops above the MTU.
    pub dropped_too_big: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Packets held back by the reordering rule.
    pub reordered: u64,
    /// Packets that arrive before a packet offered earlier (by jitter or held-back
    /// predecessors).
    pub overtaking: u64,
    /// Most bytes waiting in the queue at once.
    pub max_queue_bytes: u64,
    /// Most packets waiting in the queue at once.
    pub max_queue_packets: u64,
    /// Longest wait in the queue.
    #[serde(with = "serde_duration")]
    pub max_queue_delay: Duration,
}

impl LinkStats {
    /// All drops.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full
            + self.dropped_random_loss
            + self.dropped_burst_loss
            + self.dropped_link_down
            + self.dropped_too_big
    }

    /// Drops for one reason.
    pub fn dropped_by(&self, reason: DropReason) -> u64 {
        match reason {
            DropReason::QueueFull => self.dropped_queue_full,
            DropReason::RandomLoss => self.dropped_random_loss,
            DropReason::BurstLoss => self.dropped_burst_loss,
            DropReason::LinkDown => self.dropped_link_down,
            DropReason::TooBig => self.dropped_too_big,
        }
    }

    fn count_drop(&mut self, reason: DropReason) {
        *match reason {
            DropReason::QueueFull => &mut self.dropped_queue_full,
            DropReason::RandomLoss => &mut self.dropped_random_loss,
            DropReason::BurstLoss => &mut self.dropped_burst_loss,
            DropReason::LinkDown => &mut self.dropped_link_down,
            DropReason::TooBig => &mut self.dropped_too_big,
        } += 1;
    }
}

/// Stream numbers: one per impairment, so that turning one on does not change another's draws.
const STREAM_LOSS: u64 = 1;
const STREAM_BURST: u64 = 2;
const STREAM_JITTER: u64 = 3;
const STREAM_REORDER: u64 = 4;
const STREAM_DUPLICATE: u64 = 5;

/// Spacing of the knots of [`Fates::PerInstant`] jitter.
const JITTER_KNOT: Duration = Duration::from_millis(10);

/// A 64-bit key from a seed and two numbers (SplitMix64's finaliser).
fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut key = seed ^ a.rotate_left(17) ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    key = (key ^ (key >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    key = (key ^ (key >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    key ^ (key >> 31)
}

/// The probabilities of a config, compiled.
#[derive(Debug, Clone, Copy)]
struct Chances {
    loss: Chance,
    ge_p: Chance,
    ge_r: Chance,
    ge_bad_loss: Chance,
    ge_good_loss: Chance,
    reorder: Chance,
    duplicate: Chance,
}

impl Chances {
    fn new(config: &LinkConfig) -> Self {
        let ge = config.gilbert_elliott;
        Self {
            loss: Chance::new(config.loss),
            ge_p: Chance::new(ge.map_or(0.0, |g| g.p)),
            ge_r: Chance::new(ge.map_or(0.0, |g| g.r)),
            ge_bad_loss: Chance::new(ge.map_or(0.0, |g| g.loss_in_bad)),
            ge_good_loss: Chance::new(ge.map_or(0.0, |g| g.loss_in_good)),
            reorder: Chance::new(config.reorder.map_or(0.0, |r| r.probability)),
            duplicate: Chance::new(config.duplicate),
        }
    }
}

/// One direction of a link (see the crate documentation for the exact semantics).
///
/// Pure and deterministic: the only inputs are the offered packet lengths and times, and the
/// seed. Time must not go backwards; an earlier `now` than the last one is treated as the last.
#[derive(Debug, Clone)]
pub struct LinkDirection {
    config: LinkConfig,
    chances: Chances,
    loss_rng: Stream,
    burst_rng: Stream,
    jitter_rng: Stream,
    reorder_rng: Stream,
    duplicate_rng: Stream,
    /// The seed, for [`Fates::PerInstant`] draws.
    seed: u64,
    /// Time zero of [`Fates::PerInstant`] (set by the owner, else the first offer).
    epoch: Option<Instant>,
    /// The last offer's instant and its rank among the offers at that instant.
    last_offer: Option<(Instant, u64)>,
    /// [`Fates::PerInstant`]: the current offer's time since the epoch, in nanoseconds.
    offer_since: u64,
    in_bad_state: bool,
    up: bool,
    last_now: Option<Instant>,
    /// When the transmitter finishes the last admitted packet.
    transmitter_free_at: Option<Instant>,
    /// Sub-nanosecond remainder of serialisation times (bit·ns / rate), so the long-run rate is
    /// exact.
    serialization_carry: u128,
    /// Admitted packets that have not started transmission: (start time, bytes).
    waiting: VecDeque<(Instant, u64)>,
    waiting_bytes: u64,
    /// Latest arrival of a packet that was not held back (order-preserving mode).
    last_in_order_arrival: Option<Instant>,
    /// Latest arrival scheduled so far.
    latest_arrival: Option<Instant>,
    stats: LinkStats,
}

impl LinkDirection {
    /// A link direction with its own random streams derived from `seed`.
    pub fn new(config: LinkConfig, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            chances: Chances::new(&config),
            config,
            loss_rng: Stream::new(seed, STREAM_LOSS),
            burst_rng: Stream::new(seed, STREAM_BURST),
            jitter_rng: Stream::new(seed, STREAM_JITTER),
            reorder_rng: Stream::new(seed, STREAM_REORDER),
            duplicate_rng: Stream::new(seed, STREAM_DUPLICATE),
            seed,
            epoch: None,
            last_offer: None,
            offer_since: 0,
            in_bad_state: false,
            up: true,
            last_now: None,
            transmitter_free_at: None,
            serialization_carry: 0,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            last_in_order_arrival: None,
            latest_arrival: None,
            stats: LinkStats::default(),
        })
    }

    /// Time zero of [`Fates::PerInstant`] draws: the simulator's start, so that runs of one
    /// seed key their packets' fates alike. Without it, the first offer's instant.
    pub fn set_epoch(&mut self, epoch: Instant) {
        self.epoch = Some(epoch);
    }

    /// [`Fates::PerInstant`]: the random streams of the packet offered at `now`, keyed by the
    /// time since the epoch and the packet's rank among those offered at that instant.
    fn key_streams(&mut self, now: Instant) {
        let epoch = *self.epoch.get_or_insert(now);
        let rank = match self.last_offer {
            Some((at, rank)) if at == now => rank + 1,
            _ => 0,
        };
        self.last_offer = Some((now, rank));
        let since = now.saturating_duration_since(epoch).as_nanos() as u64;
        self.offer_since = since;
        let key = mix(self.seed, since, rank);
        self.loss_rng = Stream::new(key, STREAM_LOSS);
        self.jitter_rng = Stream::new(key, STREAM_JITTER);
        self.reorder_rng = Stream::new(key, STREAM_REORDER);
        self.duplicate_rng = Stream::new(key, STREAM_DUPLICATE);
    }

    /// The configuration in force.
    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// Replaces the configuration from now on, keeping the queue, the burst-loss state and the
    /// random streams (e.g. to change the rate mid-run).
    pub fn reconfigure(&mut self, config: LinkConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.chances = Chances::new(&config);
        self.config = config;
        Ok(())
    }

    /// Takes the link down (every packet dropped) or brings it back up; packets already in
    /// flight still arrive.
    pub fn set_up(&mut self, up: bool) {
        self.up = up;
    }

    /// True unless set down.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// True while the Gilbert-Elliott chain is in its Bad state.
    pub fn in_bad_state(&self) -> bool {
        self.in_bad_state
    }

    /// The counters so far.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// Packets and bytes waiting in the queue at `now` (not counting the one being sent).
    pub fn queue_at(&mut self, now: Instant) -> (usize, u64) {
        self.release_started(now);
        (self.waiting.len(), self.waiting_bytes)
    }

    fn release_started(&mut self, now: Instant) {
        while let Some(&(start, bytes)) = self.waiting.front() {
            if start > now {
                break;
            }
            self.waiting.pop_front();
            self.waiting_bytes -= bytes;
        }
    }

    /// Serialisation time of `bytes` at the configured rate, carrying the remainder.
    fn serialization_time(&mut self, rate: u64, bytes: u64) -> Duration {
        let bits = u128::from(bytes + u64::from(self.config.overhead_bytes)) * 8;
        let scaled = bits * 1_000_000_000 + self.serialization_carry;
        let rate = u128::from(rate);
        self.serialization_carry = scaled % rate;
        let nanos = scaled / rate;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// One jitter deviation in nanoseconds, within ±amount.
    fn jitter_sample(rng: &mut Stream, amount: Duration, distribution: JitterDistribution) -> i128 {
        let span = amount.as_nanos() as i128;
        if span == 0 {
            return 0;
        }
        match distribution {
            JitterDistribution::Uniform => rng.below(2 * span as u64 + 1) as i128 - span,
            JitterDistribution::Normal => {
                let sigma = span as f64 / 2.0;
                // Redraw outside ±2σ; the bound on tries only matters for a broken generator.
                for _ in 0..64 {
                    let z: f64 = (0..12).map(|_| rng.unit_f64()).sum::<f64>() - 6.0;
                    let deviation = (z * sigma) as i128;
                    if deviation.abs() <= span {
                        return deviation;
                    }
                }
                0
            }
        }
    }

    fn propagate(&mut self, departure: Instant, rng_is_duplicate: bool) -> Instant {
        let jitter = self.config.jitter;
        let deviation = if self.config.fates == Fates::PerInstant && !rng_is_duplicate {
            self.smooth_jitter()
        } else {
            let rng = if rng_is_duplicate {
                &mut self.duplicate_rng
            } else {
                &mut self.jitter_rng
            };
            Self::jitter_sample(rng, jitter.amount, jitter.distribution)
        };
        let delay = self.config.delay.as_nanos() as i128 + deviation;
        // Jitter larger than the delay cannot make a packet arrive before it left.
        departure + Duration::from_nanos(delay.max(0) as u64)
    }

    /// [`Fates::PerInstant`] jitter: a deviation that varies smoothly with the offer time,
    /// drawn at knots [`JITTER_KNOT`] apart and interpolated linearly in between, so that two
    /// runs whose packets leave a few milliseconds apart (a retransmission sent a little
    /// earlier by one transport than by the other) see nearly the same delay, as on a real
    /// path whose queueing varies over time.
    fn smooth_jitter(&self) -> i128 {
        let jitter = self.config.jitter;
        let knot_ns = JITTER_KNOT.as_nanos() as u64;
        let k = self.offer_since / knot_ns;
        let frac = (self.offer_since % knot_ns) as i128;
        let at = |k: u64| {
            let mut rng = Stream::new(mix(self.seed, k, u64::MAX), STREAM_JITTER);
            Self::jitter_sample(&mut rng, jitter.amount, jitter.distribution)
        };
        let (a, b) = (at(k), at(k + 1));
        a + (b - a) * frac / knot_ns as i128
    }

    /// Offers a packet of `packet_len` IP bytes at `now`.
    pub fn offer(&mut self, now: Instant, packet_len: usize) -> Verdict {
        let now = self.last_now.map_or(now, |last| now.max(last));
        self.last_now = Some(now);
        if self.config.fates == Fates::PerInstant {
            self.key_streams(now);
        }
        let bytes = packet_len as u64;
        self.stats.offered += 1;
        self.stats.offered_bytes += bytes;

        if !self.up {
            return self.drop(DropReason::LinkDown);
        }
        if self.config.mtu.is_some_and(|mtu| bytes > u64::from(mtu)) {
            return self.drop(DropReason::TooBig);
        }

        // 1. Queue and transmitter (drop-tail FIFO in front of a rate limiter).
        let departure = match self.config.rate_bps {
            None => now,
            Some(rate) => {
                self.release_started(now);
                let busy = self.transmitter_free_at.is_some_and(|free| free > now);
                if busy {
                    let limit = self.config.queue;
                    let over_packets = limit
                        .packets
                        .is_some_and(|max| self.waiting.len() as u64 + 1 > max);
                    let over_bytes = limit
                        .bytes
                        .is_some_and(|max| self.waiting_bytes + bytes > max);
                    if over_packets || over_bytes {
                        return self.drop(DropReason::QueueFull);
                    }
                }
                let start = self.transmitter_free_at.map_or(now, |free| free.max(now));
                let finish = start + self.serialization_time(rate, bytes);
                self.transmitter_free_at = Some(finish);
                if start > now {
                    self.waiting.push_back((start, bytes));
                    self.waiting_bytes += bytes;
                    self.stats.max_queue_packets =
                        self.stats.max_queue_packets.max(self.waiting.len() as u64);
                    self.stats.max_queue_bytes = self.stats.max_queue_bytes.max(self.waiting_bytes);
                    self.stats.max_queue_delay = self.stats.max_queue_delay.max(start - now);
                }
                finish
            }
        };

        // 2. Loss on the wire: the packet used the bottleneck, then vanished. Every stream
        // draws for every packet so the patterns do not depend on each other.
        let random_loss = self.loss_rng.chance(self.chances.loss);
        let burst_loss = if self.config.gilbert_elliott.is_some() {
            let loss_chance = if self.in_bad_state {
                self.chances.ge_bad_loss
            } else {
                self.chances.ge_good_loss
            };
            let lost = self.burst_rng.chance(loss_chance);
            // Then step the chain for the next packet (netem gemodel).
            let leave = if self.in_bad_state {
                self.chances.ge_r
            } else {
                self.chances.ge_p
            };
            if self.burst_rng.chance(leave) {
                self.in_bad_state = !self.in_bad_state;
            }
            lost
        } else {
            false
        };
        if random_loss {
            return self.drop(DropReason::RandomLoss);
        }
        if burst_loss {
            return self.drop(DropReason::BurstLoss);
        }

        // 3. Propagation delay and jitter.
        let mut arrival = self.propagate(departure, false);
        if self.config.jitter.preserve_order
            && let Some(last) = self.last_in_order_arrival
        {
            arrival = arrival.max(last);
        }

        // 4. Reordering: hold back, successors overtake.
        let held = self.reorder_rng.chance(self.chances.reorder) && self.config.reorder.is_some();
        if let Some(reorder) = self.config.reorder.filter(|_| held) {
            arrival += reorder.extra_delay;
            self.stats.reordered += 1;
        } else {
            self.last_in_order_arrival = Some(arrival);
        }
        if self.latest_arrival.is_some_and(|latest| arrival < latest) {
            self.stats.overtaking += 1;
        }
        self.latest_arrival = Some(self.latest_arrival.map_or(arrival, |l| l.max(arrival)));

        // 5. Duplication: a second copy with its own jitter, never ahead of the original's
        // in-order position when order is preserved.
        let duplicate_at = if self.duplicate_rng.chance(self.chances.duplicate) {
            let mut copy = self.propagate(departure, true);
            if self.config.jitter.preserve_order
                && let Some(last) = self.last_in_order_arrival
            {
                copy = copy.max(last);
                self.last_in_order_arrival = Some(copy);
            }
            self.latest_arrival = self.latest_arrival.map(|l| l.max(copy));
            self.stats.duplicated += 1;
            Some(copy)
        } else {
            None
        };

        self.stats.delivered += 1;
        self.stats.delivered_bytes += bytes;
        Verdict::Deliver {
            at: arrival,
            duplicate_at,
        }
    }

    fn drop(&mut self, reason: DropReason) -> Verdict {
        self.stats.count_drop(reason);
        Verdict::Drop(reason)
    }
}
