//! Link configuration: plain serde structs, validated before use.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::units::serde_duration;

/// The longest delay (propagation, jitter or reordering hold) a link accepts: one day. Longer
/// values are almost certainly a unit mistake.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// The default drop-tail limit of a rate-limited link, in packets: the Linux `txqueuelen` and
/// netem default, which is also what Mininet's `TCLink` (Hollywood §5.1.2) leaves in place.
pub const DEFAULT_QUEUE_PACKETS: u64 = 1000;

/// One direction of a link: everything that happens to a packet between the sender's interface
/// and the receiver's. See the crate documentation for the order in which the impairments
/// apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkConfig {
    /// One-way propagation delay.
    #[serde(with = "serde_duration")]
    pub delay: Duration,
    /// Random variation added to the propagation delay.
    pub jitter: Jitter,
    /// Bottleneck rate in bits per second (IP bytes plus `overhead_bytes` per packet); `None`
    /// for an unlimited rate (no serialisation delay, no queue).
    pub rate_bps: Option<u64>,
    /// Bytes added to every packet when computing its serialisation time (link-layer framing,
    /// e.g. 14 for Ethernet II or the ATM cell tax of ADSL); not carried in the packet.
    pub overhead_bytes: u32,
    /// Drop-tail limit of the queue in front of a rate-limited transmitter.
    pub queue: QueueLimit,
    /// Probability that a packet is lost on the wire, independently of all others.
    pub loss: f64,
    /// Gilbert-Elliott burst loss, in addition to `loss`.
    pub gilbert_elliott: Option<GilbertElliott>,
    /// Explicit reordering: packets held back so later ones overtake them.
    pub reorder: Option<Reorder>,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Largest IP packet the link carries; bigger packets are dropped (`None`: no limit).
    pub mtu: Option<u32>,
    /// How each packet's random fate is drawn.
    pub fates: Fates,
}

/// How a link draws each packet's fate: random loss, jitter, reordering, duplication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fates {
    /// From one random stream per impairment, packet after packet, as netem does: a packet's
    /// fate depends on how many packets crossed before it, so two transports that send
    /// different packets meet different losses and delays from their first difference on.
    #[default]
    PerPacket,
    /// From the instant the packet is offered (time since the link's epoch, and its rank among
    /// packets offered at that same instant): two runs that offer a packet at the same moment
    /// give it the same fate, whatever else they sent — common random numbers, so that
    /// transports can be compared seed by seed on the same voice packets. Each impairment keeps
    /// its probability per packet. Jitter varies smoothly with time instead of per packet
    /// (values drawn at knots 10 ms apart, linear in between), so that a retransmission one
    /// transport sends a few milliseconds before the other meets nearly the same delay, as on
    /// a path whose queueing varies over time; a deviation of ±A still needs packets less than
    /// 2A apart to reorder. Gilbert-Elliott's chain still steps packet by packet.
    PerInstant,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            jitter: Jitter::default(),
            rate_bps: None,
            overhead_bytes: 0,
            queue: QueueLimit::default(),
            loss: 0.0,
            gilbert_elliott: None,
            reorder: None,
            duplicate: 0.0,
            mtu: None,
            fates: Fates::PerPacket,
        }
    }
}

/// How the jitter deviation of each packet is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JitterDistribution {
    /// Uniform on `[-amount, +amount]` (integer nanoseconds).
    #[default]
    Uniform,
    /// Normal with σ = amount / 2, truncated to `[-amount, +amount]` (±2σ) by redrawing. The
    /// normal variate is the Irwin-Hall sum of 12 uniforms minus 6 (exact mean and variance,
    /// pure arithmetic, so identical on every machine).
    Normal,
}

/// Delay variation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Jitter {
    /// Largest deviation from the propagation delay, either way; zero disables jitter.
    #[serde(with = "serde_duration")]
    pub amount: Duration,
    /// The distribution of the deviation.
    pub distribution: JitterDistribution,
    /// True: a packet never arrives before its predecessor (a FIFO link whose delay varies);
    /// false: jitter reorders packets whose deviations cross, as netem does.
    pub preserve_order: bool,
}

impl Default for Jitter {
    fn default() -> Self {
        Self {
            amount: Duration::ZERO,
            distribution: JitterDistribution::Uniform,
            preserve_order: true,
        }
    }
}

/// Drop-tail limits of the transmit queue. A packet is dropped on arrival if the transmitter
/// is busy and admitting it would take the waiting packets above either limit; the packet
/// being transmitted does not count (as in Linux qdiscs). With neither limit set the queue
/// would grow without bound, which [`LinkConfig::validate`] rejects for a rate-limited link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueLimit {
    /// Most bytes waiting.
    pub bytes: Option<u64>,
    /// Most packets waiting.
    pub packets: Option<u64>,
}

impl Default for QueueLimit {
    fn default() -> Self {
        Self {
            bytes: None,
            packets: Some(DEFAULT_QUEUE_PACKETS),
        }
    }
}

/// Gilbert-Elliott two-state burst loss, with the parameters of netem's `gemodel`: a Markov
/// chain over Good and Bad, stepped once per packet that reaches the wire.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GilbertElliott {
    /// P(Good → Bad) per packet.
    pub p: f64,
    /// P(Bad → Good) per packet.
    pub r: f64,
    /// Loss probability in Bad (netem's 1-h); 1 by default.
    #[serde(default = "one")]
    pub loss_in_bad: f64,
    /// Loss probability in Good (netem's 1-k); 0 by default.
    #[serde(default)]
    pub loss_in_good: f64,
}

fn one() -> f64 {
    1.0
}

impl GilbertElliott {
    /// Burst loss with the given transition probabilities, every Bad packet lost and no Good one.
    pub fn new(p: f64, r: f64) -> Self {
        Self {
            p,
            r,
            loss_in_bad: 1.0,
            loss_in_good: 0.0,
        }
    }

    /// Long-run fraction of packets in Bad: p / (p + r).
    pub fn stationary_bad(&self) -> f64 {
        if self.p + self.r == 0.0 {
            0.0
        } else {
            self.p / (self.p + self.r)
        }
    }

    /// Long-run loss rate.
    pub fn stationary_loss(&self) -> f64 {
        let bad = self.stationary_bad();
        bad * self.loss_in_bad + (1.0 - bad) * self.loss_in_good
    }

    /// Mean number of consecutive packets in Bad: 1 / r (the mean loss burst when Bad loses
    /// every packet and Good none).
    pub fn mean_bad_run(&self) -> f64 {
        1.0 / self.r
    }
}

/// Explicit reordering. Each packet that reaches the wire is, with `probability`, *held back*:
/// delivered `extra_delay` later than it otherwise would be, so packets sent within
/// `extra_delay` after it overtake it. Held packets do not hold back their successors, even in
/// order-preserving jitter mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reorder {
    /// Probability that a packet is held back.
    pub probability: f64,
    /// How much later a held packet arrives.
    #[serde(with = "serde_duration")]
    pub extra_delay: Duration,
}

/// Why a link config cannot be used.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// A probability outside `[0, 1]` (or NaN).
    #[error("{field} = {value} is not a probability between 0 and 1")]
    Probability {
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// A rate of zero.
    #[error("rate must be at least 1 bit/s")]
    ZeroRate,
    /// A rate without any queue limit.
    #[error("a rate-limited link needs a queue limit in bytes or packets")]
    UnboundedQueue,
    /// A delay above [`MAX_DELAY`].
    #[error("{field} = {value:?} is above the limit of 24 h")]
    DelayTooLarge {
        /// The field.
        field: &'static str,
        /// Its value.
        value: Duration,
    },
    /// An MTU of zero.
    #[error("mtu must be at least 1 byte")]
    ZeroMtu,
    /// Reordering with no hold time cannot reorder anything.
    #[error("reorder extra_delay must be above zero")]
    ZeroReorderDelay,
}

impl LinkConfig {
    /// An ideal link: no delay, no loss, unlimited rate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets how packets' fates are drawn.
    pub fn with_fates(mut self, fates: Fates) -> Self {
        self.fates = fates;
        self
    }

    /// Sets the propagation delay.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets uniform, order-preserving jitter of ±`amount`.
    pub fn with_jitter(mut self, amount: Duration) -> Self {
        self.jitter.amount = amount;
        self
    }

    /// Sets the whole jitter description.
    pub fn with_jitter_config(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the rate in bits per second.
    pub fn with_rate(mut self, bits_per_second: u64) -> Self {
        self.rate_bps = Some(bits_per_second);
        self
    }

    /// Sets the per-packet framing overhead counted by the rate limiter.
    pub fn with_overhead(mut self, bytes: u32) -> Self {
        self.overhead_bytes = bytes;
        self
    }

    /// Sets the queue limits (replacing the default of 1000 packets).
    pub fn with_queue(mut self, bytes: Option<u64>, packets: Option<u64>) -> Self {
        self.queue = QueueLimit { bytes, packets };
        self
    }

    /// Sets the random loss probability.
    pub fn with_loss(mut self, probability: f64) -> Self {
        self.loss = probability;
        self
    }

    /// Sets Gilbert-Elliott burst loss.
    pub fn with_gilbert_elliott(mut self, model: GilbertElliott) -> Self {
        self.gilbert_elliott = Some(model);
        self
    }

    /// Holds back packets with `probability` by `extra_delay`.
    pub fn with_reorder(mut self, probability: f64, extra_delay: Duration) -> Self {
        self.reorder = Some(Reorder {
            probability,
            extra_delay,
        });
        self
    }

    /// Sets the duplication probability.
    pub fn with_duplicate(mut self, probability: f64) -> Self {
        self.duplicate = probability;
        self
    }

    /// Sets the MTU.
    pub fn with_mtu(mut self, bytes: u32) -> Self {
        self.mtu = Some(bytes);
        self
    }

    /// Checks that every field is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let probability = |field: &'static str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::Probability { field, value })
            }
        };
        let delay = |field: &'static str, value: Duration| {
            if value <= MAX_DELAY {
                Ok(())
            } else {
                Err(ConfigError::DelayTooLarge { field, value })
            }
        };
        delay("delay", self.delay)?;
        delay("jitter", self.jitter.amount)?;
        probability("loss", self.loss)?;
        probability("duplicate", self.duplicate)?;
        if let Some(ge) = &self.gilbert_elliott {
            probability("gilbert_elliott.p", ge.p)?;
            probability("gilbert_elliott.r", ge.r)?;
            probability("gilbert_elliott.loss_in_bad", ge.loss_in_bad)?;
            probability("gilbert_elliott.loss_in_good", ge.loss_in_good)?;
        }
        if let Some(reorder) = &self.reorder {
            probability("reorder.probability", reorder.probability)?;
            delay("reorder.extra_delay", reorder.extra_delay)?;
            if reorder.extra_delay.is_zero() {
                return Err(ConfigError::ZeroReorderDelay);
            }
        }
        if let Some(rate) = self.rate_bps {
            if rate == 0 {
                return Err(ConfigError::ZeroRate);
            }
            if self.queue.bytes.is_none() && self.queue.packets.is_none() {
                return Err(ConfigError::UnboundedQueue);
            }
        }
        if self.mtu == Some(0) {
            return Err(ConfigError::ZeroMtu);
        }
        Ok(())
    }
}
