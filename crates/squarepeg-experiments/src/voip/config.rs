//! What a VoIP run is: the application ([`VoipConfig`]) and the network and playout budget
//! ([`Scenario`]).

use std::time::Duration;

use serde::Serialize;
use squarepeg_lab::model::{Bottleneck, Fates, GilbertElliott, Jitter, LinkConfig, presets};

use super::VoipError;

/// The voice application: `count` messages of `message_bytes` every `interval` (Hollywood
/// §5.1.2: 160-byte G.711 frames every 20 ms for one minute, 3000 messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VoipConfig {
    /// Payload bytes of one message (at least [`MIN_MESSAGE_BYTES`], which carry its number
    /// and send time).
    pub message_bytes: usize,
    /// Time between messages.
    #[serde(rename = "interval_ms", serialize_with = "super::report::ser_ms")]
    pub interval: Duration,
    /// Messages sent.
    pub count: u64,
    /// Time between the start of the run and the first message: the connection is set up
    /// and, in the contention scenario, the first bulk flow is running.
    #[serde(rename = "lead_in_ms", serialize_with = "super::report::ser_ms")]
    pub lead_in: Duration,
    /// Time after the last message during which late arrivals are still recorded; a message
    /// that has not arrived by then is "never delivered".
    #[serde(rename = "drain_ms", serialize_with = "super::report::ser_ms")]
    pub drain: Duration,
}

/// The smallest message: the lab's datagram header (magic, kind, number, send time;
/// `squarepeg_lab::sim::MIN_PAYLOAD`).
pub const MIN_MESSAGE_BYTES: usize = squarepeg_lab::sim::MIN_PAYLOAD;

/// The largest message: one that fits one IPv4 UDP datagram on a 1500-byte link, so that
/// every transport sends one message per packet in the absence of loss.
pub const MAX_MESSAGE_BYTES: usize = 1400;

impl Default for VoipConfig {
    fn default() -> Self {
        Self {
            message_bytes: 160,
            interval: Duration::from_millis(20),
            count: 3000,
            lead_in: Duration::from_secs(1),
            drain: Duration::from_secs(5),
        }
    }
}

impl VoipConfig {
    /// The default application, run for `duration` (count = duration / interval).
    pub fn for_duration(duration: Duration) -> Result<Self, VoipError> {
        Self::default().with_duration(duration)
    }

    /// Sets the count so that the messages span `duration`.
    pub fn with_duration(mut self, duration: Duration) -> Result<Self, VoipError> {
        if self.interval.is_zero() {
            return Err(VoipError::Config("interval must be above zero".into()));
        }
        self.count = u64::try_from(duration.as_nanos() / self.interval.as_nanos())
            .map_err(|_| VoipError::Config("duration too long".into()))?;
        self.validate()?;
        Ok(self)
    }

    /// How long the messages span.
    pub fn duration(&self) -> Duration {
        self.interval
            .saturating_mul(u32::try_from(self.count).unwrap_or(u32::MAX))
    }

    /// The offset from the run's start at which message `number` is due.
    pub fn due(&self, number: u64) -> Duration {
        self.lead_in
            + self
                .interval
                .saturating_mul(u32::try_from(number).unwrap_or(u32::MAX))
    }

    /// The offset from the run's start at which the run ends.
    pub fn end(&self) -> Duration {
        self.lead_in + self.duration() + self.drain
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), VoipError> {
        if !(MIN_MESSAGE_BYTES..=MAX_MESSAGE_BYTES).contains(&self.message_bytes) {
            return Err(VoipError::Config(format!(
                "message size {} is outside {MIN_MESSAGE_BYTES}..={MAX_MESSAGE_BYTES} bytes",
                self.message_bytes
            )));
        }
        if self.interval.is_zero() {
            return Err(VoipError::Config("interval must be above zero".into()));
        }
        if self.count == 0 {
            return Err(VoipError::Config(
                "the run sends no message (duration below one interval)".into(),
            ));
        }
        // Keeps every offset within u32 multiples of the interval and the run bounded.
        if self.count > 10_000_000 {
            return Err(VoipError::Config(format!(
                "{} messages is above the limit of 10 000 000",
                self.count
            )));
        }
        Ok(())
    }
}

/// Competing bulk transfers (Minion §8.2): `flows` TCP downloads through the same bottleneck
/// as the call, flow `k` starting at `k · duration / flows` after the first message, so the
/// contention grows from one flow to `flows` during the call (Minion adds 1 to 4 competing
/// streams progressively).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BulkFlows {
    /// Number of bulk flows.
    pub flows: u32,
}

/// One network scenario with its playout budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    /// Short name used on the command line and in file names.
    pub name: String,
    /// One line for people.
    pub description: String,
    /// The dumbbell: left is the client (home) side, right the server side. The call's voice
    /// goes right to left, on the downlink.
    #[serde(serialize_with = "ser_bottleneck")]
    pub bottleneck: Bottleneck,
    /// De-jitter playout delay (Hollywood's T_playout).
    #[serde(rename = "playout_delay_ms", serialize_with = "super::report::ser_ms")]
    pub playout_delay: Duration,
    /// Competing bulk transfers, if any.
    pub bulk: Option<BulkFlows>,
}

fn ser_bottleneck<S: serde::Serializer>(b: &Bottleneck, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("Bottleneck", 2)?;
    st.serialize_field("down", &b.right_to_left.to_string())?;
    st.serialize_field("up", &b.left_to_right.to_string())?;
    st.end()
}

impl Scenario {
    /// The nominal one-way delay of the voice direction: the downlink's propagation delay,
    /// Hollywood eq. 5.1's T_rtt/2 (the presets split the RTT evenly).
    pub fn one_way_delay(&self) -> Duration {
        self.bottleneck.right_to_left.delay
    }

    /// When message `i`, sent at `send_i`, is played out (Hollywood eq. 5.1):
    /// `playout_i = send_i + T_rtt/2 + T_playout`. T_sender is not added: `send_i` is taken
    /// when the message is handed to the transport, after capture and encoding, so the
    /// sender's delay has already passed. The transmission time of the message at the
    /// bottleneck rate (0.2 ms for 188 bytes at 8 Mbit/s) and host stack costs come out of
    /// the playout delay, as they would in a real receiver whose playout clock is set from
    /// the path's nominal delay.
    pub fn playout_offset(&self) -> Duration {
        self.one_way_delay() + self.playout_delay
    }
}

/// The scenario names [`scenario`] knows, in report order: Hollywood's two, Minion's
/// contention case, then hostile paths (issue 14): bursty loss both ways, jitter that keeps
/// and that breaks order, heavy loss, a long RTT.
pub const SCENARIOS: &[&str] = &[
    "hollywood-15ms",
    "hollywood-70ms",
    "minion-contention",
    "bursty-loss",
    "jitter",
    "jitter-reorder",
    "heavy-loss",
    "long-rtt",
];

impl Scenario {
    /// This scenario with a path of the user's: `up` (client → server) and `down` replace
    /// the directions given, `playout` the playout delay; named `custom` (after this one's
    /// name) and described by its links.
    pub fn customized(
        &self,
        up: Option<LinkConfig>,
        down: Option<LinkConfig>,
        playout: Option<Duration>,
    ) -> Result<Scenario, VoipError> {
        let mut s = self.clone();
        if let Some(up) = up {
            s.bottleneck.left_to_right = up;
        }
        if let Some(down) = down {
            s.bottleneck.right_to_left = down;
        }
        if let Some(p) = playout {
            s.playout_delay = p;
        }
        s.bottleneck
            .validate()
            .map_err(|e| VoipError::Config(format!("the path: {e}")))?;
        s.name = format!("custom-{}", self.name);
        s.description = format!(
            "down {}; up {}; {} ms playout (from {})",
            s.bottleneck.right_to_left,
            s.bottleneck.left_to_right,
            s.playout_delay.as_millis(),
            self.name
        );
        Ok(s)
    }
}

/// The ADSL path of Hollywood §5.1.2 at `rtt`, with `each_way` applied to both directions.
fn adsl(rtt: Duration, each_way: impl Fn(LinkConfig) -> LinkConfig) -> Bottleneck {
    let b = presets::hollywood_adsl(rtt);
    Bottleneck {
        left_to_right: each_way(b.left_to_right),
        right_to_left: each_way(b.right_to_left),
    }
}

/// Bursty loss both ways: the 70 ms ADSL path with Gilbert-Elliott loss instead of random
/// loss, mean burst 3 packets (r = 1/3), about 1 % overall (p = 0.01 r / 0.99), 30 ms
/// playout — where a run of lost ACKs used to stall the sender (issue 14).
pub fn bursty_loss() -> Scenario {
    let r = 1.0 / 3.0;
    let ge = GilbertElliott::new(0.01 * r / 0.99, r);
    Scenario {
        name: "bursty-loss".into(),
        description: "ADSL 8/1 Mbit/s, RTT 70 ms, Gilbert-Elliott loss both ways (mean burst 3, about 1 %), 30 ms playout".into(),
        bottleneck: adsl(Duration::from_millis(70), |l| {
            l.with_loss(0.0)
                .with_gilbert_elliott(ge)
                .with_fates(Fates::PerInstant)
        }),
        playout_delay: Duration::from_millis(30),
        bulk: None,
    }
}

/// RTT 40 ms with ±10 ms of uniform jitter each way, 0.2 % random loss, 60 ms playout;
/// `preserve_order`: a FIFO link whose delay varies, or one that reorders as netem does.
fn jittery(name: &str, preserve_order: bool) -> Scenario {
    let jitter = Jitter {
        amount: Duration::from_millis(10),
        preserve_order,
        ..Jitter::default()
    };
    Scenario {
        name: name.into(),
        description: format!(
            "ADSL 8/1 Mbit/s, RTT 40 ms ± 10 ms jitter each way ({}), 0.2 % loss, 60 ms playout",
            if preserve_order {
                "order kept"
            } else {
                "reordering"
            }
        ),
        bottleneck: adsl(Duration::from_millis(40), |l| {
            l.with_loss(0.002)
                .with_jitter_config(jitter)
                .with_fates(Fates::PerInstant)
        }),
        playout_delay: Duration::from_millis(60),
        bulk: None,
    }
}

/// Jitter that keeps packet order.
pub fn jitter() -> Scenario {
    jittery("jitter", true)
}

/// Jitter that reorders packets.
pub fn jitter_reorder() -> Scenario {
    jittery("jitter-reorder", false)
}

/// Heavy loss: the 70 ms ADSL path with 2 % random loss each way, 30 ms playout.
pub fn heavy_loss() -> Scenario {
    Scenario {
        name: "heavy-loss".into(),
        description: "ADSL 8/1 Mbit/s, RTT 70 ms, 2 % random loss each way, 30 ms playout".into(),
        bottleneck: adsl(Duration::from_millis(70), |l| {
            l.with_loss(0.02).with_fates(Fates::PerInstant)
        }),
        playout_delay: Duration::from_millis(30),
        bulk: None,
    }
}

/// A long path: ADSL with RTT 200 ms, 0.1 % random loss each way, 100 ms playout.
pub fn long_rtt() -> Scenario {
    Scenario {
        name: "long-rtt".into(),
        description: "ADSL 8/1 Mbit/s, RTT 200 ms, 0.1 % random loss, 100 ms playout".into(),
        bottleneck: adsl(Duration::from_millis(200), |l| {
            l.with_fates(Fates::PerInstant)
        }),
        playout_delay: Duration::from_millis(100),
        bulk: None,
    }
}

/// Hollywood §5.1.2's intracontinental scenario: ADSL 8/1 Mbit/s, RTT 15 ms, 0.1 % random
/// loss each way, 110 ms playout delay (the lab preset).
pub fn hollywood_15ms() -> Scenario {
    Scenario {
        name: "hollywood-15ms".into(),
        description:
            "ADSL 8/1 Mbit/s, RTT 15 ms, 0.1 % random loss, 110 ms playout (Hollywood §5.1.2)"
                .into(),
        bottleneck: presets::hollywood_adsl_15ms(),
        playout_delay: Duration::from_millis(110),
        bulk: None,
    }
}

/// Hollywood §5.1.2's intercontinental scenario: ADSL 8/1 Mbit/s, RTT 70 ms, 0.1 % random
/// loss each way, 30 ms playout delay (the lab preset).
pub fn hollywood_70ms() -> Scenario {
    Scenario {
        name: "hollywood-70ms".into(),
        description:
            "ADSL 8/1 Mbit/s, RTT 70 ms, 0.1 % random loss, 30 ms playout (Hollywood §5.1.2)".into(),
        bottleneck: presets::hollywood_adsl_70ms(),
        playout_delay: Duration::from_millis(30),
        bulk: None,
    }
}

/// Packets the contention scenario's downlink queue holds: 100 ms at 3 Mbit/s of 1500-byte
/// packets, about 1.7 times the path's bandwidth-delay product (22.5 kB).
pub const CONTENTION_QUEUE_PACKETS: u64 = 25;

/// Minion §8.2's contention case: a home broadband path of 3 Mbit/s down and 1 Mbit/s up
/// with RTT 60 ms (Minion's figures), no random loss, and a drop-tail downlink queue of
/// [`CONTENTION_QUEUE_PACKETS`] (100 ms); four bulk TCP downloads join one by one during
/// the call, so every loss is a queue overflow caused by contention. The playout delay is
/// 110 ms — the queue's full delay (at most 100.5 ms for a voice packet: the packet on the
/// wire, 24 waiting, its own 0.5 ms) plus a margin — so that a message that is not lost
/// never misses its playout on a FIFO path: only losses and their consequences count.
pub fn minion_contention() -> Scenario {
    let one_way = Duration::from_millis(30);
    Scenario {
        name: "minion-contention".into(),
        description: "3/1 Mbit/s, RTT 60 ms, no random loss, 25-packet drop-tail queue, 1 to 4 bulk TCP downloads joining during the call, 110 ms playout (Minion §8.2)".into(),
        bottleneck: Bottleneck {
            left_to_right: LinkConfig::new().with_delay(one_way).with_rate(1_000_000),
            right_to_left: LinkConfig::new()
                .with_delay(one_way)
                .with_rate(3_000_000)
                .with_queue(None, Some(CONTENTION_QUEUE_PACKETS)),
        },
        playout_delay: Duration::from_millis(110),
        bulk: Some(BulkFlows { flows: 4 }),
    }
}

/// A scenario by name (see [`SCENARIOS`]).
pub fn scenario(name: &str) -> Result<Scenario, VoipError> {
    match name {
        "hollywood-15ms" => Ok(hollywood_15ms()),
        "hollywood-70ms" => Ok(hollywood_70ms()),
        "minion-contention" => Ok(minion_contention()),
        "bursty-loss" => Ok(bursty_loss()),
        "jitter" => Ok(jitter()),
        "jitter-reorder" => Ok(jitter_reorder()),
        "heavy-loss" => Ok(heavy_loss()),
        "long-rtt" => Ok(long_rtt()),
        other => Err(VoipError::UnknownScenario {
            name: other.to_owned(),
            known: SCENARIOS.join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_follow_the_seeds() {
        let s = hollywood_70ms();
        assert_eq!(s.one_way_delay(), Duration::from_millis(35));
        assert_eq!(s.playout_offset(), Duration::from_millis(65));
        assert_eq!(s.bottleneck.right_to_left.rate_bps, Some(8_000_000));
        assert_eq!(
            hollywood_15ms().playout_offset(),
            Duration::from_micros(117_500)
        );
        for name in SCENARIOS {
            let s = scenario(name).expect("known");
            assert_eq!(&s.name, name);
            assert!(s.bottleneck.validate().is_ok());
        }
        assert!(matches!(
            scenario("adsl"),
            Err(VoipError::UnknownScenario { .. })
        ));
        let b = bursty_loss().bottleneck.right_to_left;
        let ge = b.gilbert_elliott.unwrap();
        assert!((ge.stationary_loss() - 0.01).abs() < 1e-9);
        assert!((ge.mean_bad_run() - 3.0).abs() < 1e-9);
        assert_eq!(b.loss, 0.0);
        assert!(
            !jitter_reorder()
                .bottleneck
                .left_to_right
                .jitter
                .preserve_order
        );
        assert!(jitter().bottleneck.left_to_right.jitter.preserve_order);
    }

    #[test]
    fn a_users_path_replaces_what_it_gives() {
        let base = hollywood_70ms();
        let down = squarepeg_lab::model::parse_spec("rate=2mbit delay=50ms loss=1%").unwrap();
        let c = base
            .customized(None, Some(down.clone()), Some(Duration::from_millis(80)))
            .unwrap();
        assert_eq!(c.bottleneck.right_to_left, down);
        assert_eq!(c.bottleneck.left_to_right, base.bottleneck.left_to_right);
        assert_eq!(c.playout_delay, Duration::from_millis(80));
        assert_eq!(c.name, "custom-hollywood-70ms");
        assert!(
            c.description.contains("50ms") || c.description.contains("50 ms"),
            "{}",
            c.description
        );
    }

    #[test]
    fn config_bounds() {
        let c = VoipConfig::for_duration(Duration::from_secs(10)).expect("valid");
        assert_eq!(c.count, 500);
        assert_eq!(c.due(2), Duration::from_millis(1040));
        assert!(VoipConfig::for_duration(Duration::from_millis(5)).is_err());
        let tiny = VoipConfig {
            message_bytes: 10,
            ..VoipConfig::default()
        };
        assert!(tiny.validate().is_err());
    }
}
