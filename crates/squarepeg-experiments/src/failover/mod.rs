//! Sessions over several paths (issue 12): failover and multipath on the two-path lab.
//!
//! - **Failover** ([`run_failover`], `peg lab failover`): a bulk download and a voice call
//!   (160-byte messages every 20 ms, server → client, each its own connection) run while
//!   path 0 dies mid-run (blackholed, its flows reset, or cut). Per rival: goodput over
//!   time in 50 ms bins, the longest stall after the death, how long until goodput is back
//!   to half its pre-death mean, and the call's messages late (after their playout time) or
//!   never delivered ([`crate::voip::analyse`], the VoIP experiment's analysis).
//! - **Multipath** ([`run_multipath`], `peg lab multipath`): two paths of different RTT and
//!   rate; each rival's goodput against the sum of the two paths' rates, the better path's
//!   rate and the best single-path rival measured.
//!
//! Every rival runs on a lab of its own with the same paths and seeds, one after the other.
//! The rivals ([`Rival`]) are kernel TCP bound to one path and kernel MPTCP over both;
//! squarepeg's own multipath rows are one more variant and one opener ([`rivals`] says
//! how). Senders run in the server's namespace and receivers in the client's, as threads of
//! this process on one clock, which also applies the death.
//!
//! Output: [`FailoverReport`] and [`MultipathReport`] (serde; schemas [`FAILOVER_SCHEMA`],
//! [`MULTIPATH_SCHEMA`]), their tables, and plots ([`plot`]).

pub mod plot;
pub mod rivals;
pub mod squarepeg;

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_lab::net::{EmulatorStats, Lab, LabConfig, PathConfig};
use squarepeg_lab::sim::{KIND_DATA, decode_payload, encode_payload};

pub use rivals::{
    BulkEnds, BulkReceiver, BulkSender, OpenFn, OpenRequest, Received, Rival, RivalEnds,
};

use crate::voip::lab::{LabCall, LabEnds, VOICE_PORT};
use crate::voip::{MessageState, Observations, Scenario, Summary, VoipConfig, VoipError, analyse};

/// Schema of [`FailoverReport`].
pub const FAILOVER_SCHEMA: &str = "squarepeg.failover/1";
/// Schema of [`MultipathReport`].
pub const MULTIPATH_SCHEMA: &str = "squarepeg.multipath/1";
/// Width of a goodput bin.
pub const BIN: Duration = Duration::from_millis(50);
/// The window over which goodput must be back to [`RECOVERY_SHARE`] of its pre-death mean.
pub const RECOVERY_WINDOW: Duration = Duration::from_millis(250);
/// See [`RECOVERY_WINDOW`].
pub const RECOVERY_SHARE: f64 = 0.5;
/// The pre-death mean is taken over this long before the death (or from the start).
pub const PRE_DEATH_WINDOW: Duration = Duration::from_secs(1);

/// How path 0 dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Death {
    /// Every packet dropped silently both ways, interfaces up (`PathHandle::blackhole`).
    Blackhole,
    /// Every TCP flow the path carried gets a RST at both ends; the path keeps working
    /// (`PathHandle::reset`).
    Reset,
    /// Blackholed and the client's interface down (`PathHandle::cut`).
    Cut,
}

impl Death {
    /// Every kind.
    pub const ALL: [Death; 3] = [Death::Blackhole, Death::Reset, Death::Cut];

    /// The name on the command line and in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Death::Blackhole => "blackhole",
            Death::Reset => "reset",
            Death::Cut => "cut",
        }
    }

    /// By name.
    pub fn by_name(name: &str) -> Result<Death, VoipError> {
        Death::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| VoipError::Config(format!("death `{name}`: blackhole, reset or cut")))
    }
}

mod serde_spec {
    use serde::{Deserialize, Deserializer, Serializer};
    use squarepeg_lab::model::LinkConfig;

    pub fn serialize<S: Serializer>(link: &LinkConfig, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&link.to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LinkConfig, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

mod serde_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Duration::try_from_secs_f64(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

fn link(spec: &str) -> LinkConfig {
    spec.parse().unwrap_or_default()
}

/// What a failover run is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverConfig {
    /// Path 0 (the one that dies), both directions.
    #[serde(with = "serde_spec")]
    pub path0: LinkConfig,
    /// Path 1, both directions.
    #[serde(with = "serde_spec")]
    pub path1: LinkConfig,
    /// How path 0 dies.
    pub death: Death,
    /// When path 0 dies, from the start of the traffic.
    #[serde(rename = "at_s", with = "serde_secs")]
    pub at: Duration,
    /// How long the bulk sender sends and the call lasts.
    #[serde(rename = "duration_s", with = "serde_secs")]
    pub duration: Duration,
    /// How long after that the receivers still wait for what is under way.
    #[serde(rename = "drain_s", with = "serde_secs")]
    pub drain: Duration,
    /// Seed of path 0's link model (path 1: seed + 1).
    pub seed: u64,
    /// The call's playout delay beyond path 0's one-way delay: message `i` sent at `s_i` is
    /// late if it arrives after `s_i + delay(path 0) + playout` (Hollywood eq. 5.1).
    #[serde(rename = "playout_s", with = "serde_secs")]
    pub playout: Duration,
    /// Bytes of one voice message.
    pub voice_bytes: usize,
    /// Time between voice messages.
    #[serde(rename = "voice_interval_s", with = "serde_secs")]
    pub voice_interval: Duration,
}

impl Default for FailoverConfig {
    /// Two paths of 10 ms one-way and 50 Mbit/s with a queue of about one BDP, path 0
    /// blackholed at 2 s of 6.
    fn default() -> Self {
        FailoverConfig {
            path0: link("delay=10ms rate=50mbit queue=128kb"),
            path1: link("delay=10ms rate=50mbit queue=128kb"),
            death: Death::Blackhole,
            at: Duration::from_secs(2),
            duration: Duration::from_secs(6),
            drain: Duration::from_secs(3),
            seed: 1,
            playout: Duration::from_millis(150),
            voice_bytes: 160,
            voice_interval: Duration::from_millis(20),
        }
    }
}

impl FailoverConfig {
    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), VoipError> {
        for link in [&self.path0, &self.path1] {
            Bottleneck::symmetric(link.clone())
                .validate()
                .map_err(|e| VoipError::Config(format!("path `{link}`: {e}")))?;
        }
        if self.duration < Duration::from_millis(500) || self.duration > Duration::from_secs(600) {
            return Err(VoipError::Config("duration: 0.5 s to 600 s".into()));
        }
        if self.at.is_zero() || self.at >= self.duration {
            return Err(VoipError::Config(format!(
                "the death at {:?} is not within the run's {:?}",
                self.at, self.duration
            )));
        }
        if self.drain > Duration::from_secs(60) {
            return Err(VoipError::Config("drain: at most 60 s".into()));
        }
        self.voip().validate()
    }

    /// The call as the VoIP experiment describes it: messages from the start to the run's
    /// duration, waited for until its end.
    pub fn voip(&self) -> VoipConfig {
        VoipConfig {
            message_bytes: self.voice_bytes,
            interval: self.voice_interval,
            count: (self.duration.as_nanos() / self.voice_interval.as_nanos().max(1)) as u64,
            lead_in: Duration::ZERO,
            drain: self.drain,
        }
    }

    /// The call's scenario: path 0's links and the playout delay.
    pub fn scenario(&self) -> Scenario {
        Scenario {
            name: "failover".into(),
            description: format!(
                "voice over path 0 ({}) and path 1 ({}), path 0 {} at {:?}",
                self.path0,
                self.path1,
                self.death.name(),
                self.at
            ),
            bottleneck: Bottleneck::symmetric(self.path0.clone()),
            playout_delay: self.playout,
            bulk: None,
        }
    }
}

/// What a multipath run is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultipathConfig {
    /// Path 0, both directions.
    #[serde(with = "serde_spec")]
    pub path0: LinkConfig,
    /// Path 1, both directions.
    #[serde(with = "serde_spec")]
    pub path1: LinkConfig,
    /// How long the bulk sender sends.
    #[serde(rename = "duration_s", with = "serde_secs")]
    pub duration: Duration,
    /// The start left out of the steady goodput (slow start, MPTCP's second subflow).
    #[serde(rename = "warm_up_s", with = "serde_secs")]
    pub warm_up: Duration,
    /// How long after that the receiver still waits.
    #[serde(rename = "drain_s", with = "serde_secs")]
    pub drain: Duration,
    /// Seed of path 0's link model (path 1: seed + 1).
    pub seed: u64,
}

impl Default for MultipathConfig {
    /// 10 ms and 40 Mbit/s against 30 ms and 20 Mbit/s (queues of about one BDP), 10 s.
    fn default() -> Self {
        MultipathConfig {
            path0: link("delay=10ms rate=40mbit queue=100kb"),
            path1: link("delay=30ms rate=20mbit queue=150kb"),
            duration: Duration::from_secs(10),
            warm_up: Duration::from_secs(2),
            drain: Duration::from_secs(3),
            seed: 1,
        }
    }
}

impl MultipathConfig {
    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), VoipError> {
        for link in [&self.path0, &self.path1] {
            Bottleneck::symmetric(link.clone())
                .validate()
                .map_err(|e| VoipError::Config(format!("path `{link}`: {e}")))?;
        }
        if self.duration < Duration::from_millis(500) || self.duration > Duration::from_secs(600) {
            return Err(VoipError::Config("duration: 0.5 s to 600 s".into()));
        }
        if self.warm_up >= self.duration {
            return Err(VoipError::Config("the warm-up is the whole run".into()));
        }
        if self.drain > Duration::from_secs(60) {
            return Err(VoipError::Config("drain: at most 60 s".into()));
        }
        Ok(())
    }

    /// The sum of the two paths' downlink rates (bit/s), if both are limited.
    pub fn sum_of_rates(&self) -> Option<u64> {
        Some(self.path0.rate_bps? + self.path1.rate_bps?)
    }

    /// The better path's downlink rate (bit/s), if both are limited.
    pub fn better_path_rate(&self) -> Option<u64> {
        Some(self.path0.rate_bps?.max(self.path1.rate_bps?))
    }
}

/// A flow's failure: when, and what the socket said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowFailure {
    /// Seconds from the start of the traffic.
    pub at_s: f64,
    /// Which end.
    pub end: String,
    /// The error.
    pub error: String,
}

/// The bulk download of one row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BulkOutcome {
    /// Bytes the sender's transport took.
    pub bytes_sent: u64,
    /// Bytes the receiver got, in order.
    pub bytes_received: u64,
    /// Every byte received was the byte sent at that offset.
    pub intact: bool,
    /// The receiver saw the end of the stream after every byte sent.
    pub complete: bool,
    /// Width of a bin, seconds.
    pub bin_s: f64,
    /// Bytes received per bin, from the start of the traffic to the end of the drain.
    pub bins: Vec<u64>,
    /// Goodput over the sending time (bytes received by then / duration), Mbit/s.
    pub goodput_mbps: f64,
    /// Failures of the sender or the receiver.
    pub failures: Vec<FlowFailure>,
}

/// What the death did to the bulk download.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverMetrics {
    /// Mean goodput over [`PRE_DEATH_WINDOW`] before the death, Mbit/s.
    pub pre_death_mbps: f64,
    /// Mean goodput from the death to the end of sending, Mbit/s.
    pub after_death_mbps: f64,
    /// The longest time without a new byte between the death and the end of sending.
    pub stall_s: f64,
    /// When that stall began (seconds from the start; at or after the death).
    pub stall_from_s: f64,
    /// The stall lasted to the end of sending: the flow never came back.
    pub stalled_to_end: bool,
    /// From the death to the end of the first [`RECOVERY_WINDOW`] after the start of the
    /// stall the death caused ([`death_stall_start`]) with goodput at [`RECOVERY_SHARE`] of
    /// the pre-death mean or more (`None`: never).
    pub recovered_after_s: Option<f64>,
    /// From the rival's detection of the death ([`DeathRecord::detected_s`]) to the end
    /// of the stall the death caused (the download flowing again: the bytes the dead path
    /// swallowed were re-sent and arrived). Negative: it flowed again before the detection
    /// (squarepeg's reinjection). `None`: no detection known, or nothing arrived after.
    #[serde(default)]
    pub resumed_after_detection_s: Option<f64>,
    /// The same from the rival's suspicion ([`DeathRecord::suspected_s`]), when it copied
    /// what the dead path held to another.
    #[serde(default)]
    pub resumed_after_suspicion_s: Option<f64>,
}

/// One voice message, for plots.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VoiceMessage {
    /// When it was due (seconds from the start).
    pub send_s: f64,
    /// Arrival minus due time, ms (`None`: never arrived).
    pub delay_ms: Option<f64>,
    /// On time, late or lost.
    pub state: MessageState,
}

/// The call of one row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VoiceOutcome {
    /// The VoIP experiment's summary (late = after the playout time, lost = never
    /// delivered; messages the sender could not hand over count as refused and lost).
    pub summary: Summary,
    /// Messages whose playout time was at or after the death that arrived late.
    pub late_after_death: u64,
    /// … that never arrived.
    pub lost_after_death: u64,
    /// The playout offset (one-way delay of path 0 + playout delay), ms.
    pub playout_offset_ms: f64,
    /// Every message.
    pub messages: Vec<VoiceMessage>,
    /// Failures of the sender or the receiver.
    pub failures: Vec<FlowFailure>,
}

/// The death as it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeathRecord {
    /// How.
    pub kind: Death,
    /// Which path.
    pub path: usize,
    /// When it was due, seconds from the start.
    pub planned_s: f64,
    /// When the lab had applied it.
    pub applied_s: f64,
    /// For [`Death::Reset`]: the flows reset.
    pub flows_reset: Option<usize>,
    /// When the rival's own endpoints declared a connection dead (seconds from the start;
    /// `None`: the rival does not say, as the kernel's rows).
    #[serde(default)]
    pub detected_s: Option<f64>,
    /// The smoothed RTT (ms) of the connection the dead one's data moved to, as the rival
    /// measured it at detection (under the run's load).
    #[serde(default)]
    pub survivor_rtt_ms: Option<f64>,
    /// When the rival found that connection suspect and copied its data to another before
    /// declaring it dead (seconds from the start; squarepeg's reinjection).
    #[serde(default)]
    pub suspected_s: Option<f64>,
}

/// What the emulator of one path carried (IP bytes in, per direction).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PathCarried {
    /// Server to client.
    pub down_bytes: u64,
    /// Client to server.
    pub up_bytes: u64,
    /// Server to client, from the death on (failover only).
    pub down_bytes_after_death: Option<u64>,
}

/// One rival's failover run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverRow {
    /// The rival.
    pub rival: Rival,
    /// What it is.
    pub description: String,
    /// The congestion control of the senders' sockets (the namespace's default, which
    /// Linux takes from the host's; MPTCP's subflows use it too).
    pub congestion_control: String,
    /// The download.
    pub bulk: BulkOutcome,
    /// What the death did to it.
    pub metrics: FailoverMetrics,
    /// The call.
    pub voice: VoiceOutcome,
    /// The death.
    pub death: DeathRecord,
    /// Each path's traffic, path 0 first.
    pub paths: Vec<PathCarried>,
    /// What went wrong without failing the run.
    pub warnings: Vec<String>,
}

/// Every row of a failover run (schema [`FAILOVER_SCHEMA`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverReport {
    /// [`FAILOVER_SCHEMA`].
    pub schema: String,
    /// The run.
    pub config: FailoverConfig,
    /// One per rival, in the order run.
    pub rows: Vec<FailoverRow>,
}

/// One rival's multipath run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultipathRow {
    /// The rival.
    pub rival: Rival,
    /// What it is.
    pub description: String,
    /// The congestion control of the sender's sockets.
    pub congestion_control: String,
    /// The download.
    pub bulk: BulkOutcome,
    /// Mean goodput from the end of the warm-up to the end of sending, Mbit/s.
    pub steady_mbps: f64,
    /// `steady_mbps` over the sum of the paths' rates.
    pub ratio_to_sum_of_rates: Option<f64>,
    /// `steady_mbps` over the better path's rate.
    pub ratio_to_better_path_rate: Option<f64>,
    /// `steady_mbps` over the best single-path row's (filled by [`MultipathReport::new`]).
    pub ratio_to_best_single_path: Option<f64>,
    /// Each path's traffic, path 0 first.
    pub paths: Vec<PathCarried>,
    /// What went wrong without failing the run.
    pub warnings: Vec<String>,
}

/// Every row of a multipath run (schema [`MULTIPATH_SCHEMA`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultipathReport {
    /// [`MULTIPATH_SCHEMA`].
    pub schema: String,
    /// The run.
    pub config: MultipathConfig,
    /// Sum of the two paths' rates, Mbit/s.
    pub sum_of_rates_mbps: Option<f64>,
    /// The better path's rate, Mbit/s.
    pub better_path_rate_mbps: Option<f64>,
    /// The best steady goodput of a single-path row, Mbit/s.
    pub best_single_path_mbps: Option<f64>,
    /// One per rival, in the order run.
    pub rows: Vec<MultipathRow>,
}

impl FailoverReport {
    /// The report of `rows`.
    pub fn new(config: FailoverConfig, rows: Vec<FailoverRow>) -> Self {
        FailoverReport {
            schema: FAILOVER_SCHEMA.to_owned(),
            config,
            rows,
        }
    }
}

impl MultipathReport {
    /// The report of `rows`, with each row's ratio to the best single-path row.
    pub fn new(config: MultipathConfig, mut rows: Vec<MultipathRow>) -> Self {
        let best_single = rows
            .iter()
            .filter(|r| r.rival.single_path().is_some())
            .map(|r| r.steady_mbps)
            .fold(None, |best: Option<f64>, x| {
                Some(best.map_or(x, |b| b.max(x)))
            });
        for row in &mut rows {
            row.ratio_to_best_single_path = best_single
                .filter(|b| *b > 0.0)
                .map(|b| row.steady_mbps / b);
        }
        MultipathReport {
            schema: MULTIPATH_SCHEMA.to_owned(),
            sum_of_rates_mbps: config.sum_of_rates().map(mbps_of_bps),
            better_path_rate_mbps: config.better_path_rate().map(mbps_of_bps),
            best_single_path_mbps: best_single,
            config,
            rows,
        }
    }
}

fn mbps_of_bps(bps: u64) -> f64 {
    bps as f64 / 1e6
}

// ------------------------------------------------------------------------------------------
// Measuring.

/// The bytes of the bulk stream: a pattern that differs per offset, so that the receiver
/// checks every byte it gets (MPTCP's reinjections included).
pub fn pattern(offset: u64, buf: &mut [u8]) {
    for (i, byte) in buf.iter_mut().enumerate() {
        let at = offset + i as u64;
        *byte = (at.wrapping_mul(31) ^ (at >> 9) ^ (at >> 17).wrapping_mul(0x9d)) as u8;
    }
}

/// What the bulk flow's ends saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BulkTrace {
    /// Bytes the sender's transport took.
    pub sent: u64,
    /// Each read: when (from the start) and how many bytes.
    pub arrivals: Vec<(Duration, u64)>,
    /// Every byte matched the pattern.
    pub intact: bool,
    /// The receiver saw the end of the stream.
    pub closed: bool,
    /// Failures of either end.
    pub failures: Vec<FlowFailure>,
}

/// What the call's ends saw.
#[derive(Debug, Clone, Default, PartialEq)]
struct VoiceTrace {
    sent: Vec<Option<Duration>>,
    arrivals: Vec<(u64, Duration)>,
    failures: Vec<FlowFailure>,
}

/// The plan of one run.
struct Drive {
    duration: Duration,
    drain: Duration,
    voice: Option<VoipConfig>,
    death: Option<(Death, usize, Duration)>,
}

struct Driven {
    /// Every path's counters just before the death.
    stats_at_death: Option<Vec<EmulatorStats>>,
    bulk: Option<BulkTrace>,
    voice: Option<VoiceTrace>,
    death: Option<DeathRecord>,
}

fn failure(epoch: Instant, end: &str, error: &VoipError) -> FlowFailure {
    FlowFailure {
        at_s: epoch.elapsed().as_secs_f64(),
        end: end.to_owned(),
        error: error.to_string(),
    }
}

fn drive_bulk_sender(
    mut sender: Box<dyn BulkSender>,
    epoch: Instant,
    stop: Instant,
    sent: &AtomicU64,
) -> Vec<FlowFailure> {
    let mut failures = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // `buf` holds the stream from offset `base`; `cursor` bytes of it are taken.
    let mut base = 0u64;
    let mut cursor = 0;
    pattern(base, &mut buf);
    while Instant::now() < stop {
        match sender.send(&buf[cursor..], stop) {
            Ok(n) => {
                cursor += n;
                sent.fetch_add(n as u64, Ordering::Relaxed);
                if cursor == buf.len() {
                    base += buf.len() as u64;
                    pattern(base, &mut buf);
                    cursor = 0;
                }
            }
            Err(e) => {
                failures.push(failure(epoch, "sender", &e));
                return failures;
            }
        }
    }
    if let Err(e) = sender.finish() {
        failures.push(failure(epoch, "sender", &e));
    }
    failures
}

fn drive_bulk_receiver(
    mut receiver: Box<dyn BulkReceiver>,
    epoch: Instant,
    end: Instant,
    received: &AtomicU64,
) -> BulkTrace {
    let mut trace = BulkTrace {
        intact: true,
        ..BulkTrace::default()
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut expected = vec![0u8; 64 * 1024];
    let mut offset = 0u64;
    loop {
        match receiver.receive(&mut buf, end) {
            Ok(Received::Data(n)) => {
                let at = epoch.elapsed();
                pattern(offset, &mut expected[..n]);
                if buf[..n] != expected[..n] {
                    trace.intact = false;
                    trace.failures.push(FlowFailure {
                        at_s: at.as_secs_f64(),
                        end: "receiver".into(),
                        error: format!("bytes differ from what was sent at offset {offset}"),
                    });
                    return trace;
                }
                offset += n as u64;
                received.store(offset, Ordering::Relaxed);
                trace.arrivals.push((at, n as u64));
            }
            Ok(Received::Nothing) => return trace,
            Ok(Received::Closed) => {
                trace.closed = true;
                return trace;
            }
            Err(e) => {
                trace.failures.push(failure(epoch, "receiver", &e));
                return trace;
            }
        }
    }
}

fn drive_voice(
    ends: LabEnds,
    config: &VoipConfig,
    epoch: Instant,
    end: Instant,
    voice_sent: &AtomicU64,
) -> VoiceTrace {
    let LabEnds {
        mut sender,
        mut receiver,
    } = ends;
    let arrivals: Mutex<Vec<(u64, Duration)>> = Mutex::new(Vec::new());
    let mut failures = Vec::new();
    let receiver_failure = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| -> Option<FlowFailure> {
            loop {
                match receiver.receive(end) {
                    Ok(Some((message, at))) => {
                        if let Some((KIND_DATA, number, _)) = decode_payload(&message)
                            && let Ok(mut a) = arrivals.lock()
                        {
                            a.push((number, at.saturating_duration_since(epoch)));
                        }
                    }
                    Ok(None) => return None,
                    Err(e) => return Some(failure(epoch, "receiver", &e)),
                }
            }
        });
        let mut sent = vec![None; config.count as usize];
        for (number, slot) in sent.iter_mut().enumerate() {
            let due = config.due(number as u64);
            let now = epoch.elapsed();
            if due > now {
                std::thread::sleep(due - now);
            }
            // Stamped with when it was due: a sender blocked by a full send buffer makes
            // the messages behind it late, as it would a real application's.
            let message = encode_payload(KIND_DATA, number as u64, due, config.message_bytes);
            match sender.send(&message) {
                Ok(accepted) => *slot = accepted.then_some(due),
                Err(e) => {
                    failures.push(failure(epoch, "sender", &e));
                    break;
                }
            }
            voice_sent.store(number as u64 + 1, Ordering::Relaxed);
        }
        if let Err(e) = sender.close() {
            failures.push(failure(epoch, "sender", &e));
        }
        let received = receiving.join().unwrap_or_else(|_| {
            Some(FlowFailure {
                at_s: epoch.elapsed().as_secs_f64(),
                end: "receiver".into(),
                error: "the receiver thread panicked".into(),
            })
        });
        (sent, received)
    });
    let (sent, received) = receiver_failure;
    failures.extend(received);
    VoiceTrace {
        sent,
        arrivals: arrivals.into_inner().unwrap_or_default(),
        failures,
    }
}

fn apply_death(lab: &Lab, death: Death, path: usize) -> Result<Option<usize>, VoipError> {
    let handle = lab.path(path)?;
    Ok(match death {
        Death::Blackhole => {
            handle.blackhole()?;
            None
        }
        Death::Cut => {
            handle.cut()?;
            None
        }
        Death::Reset => Some(handle.reset()?),
    })
}

/// Runs what `ends` carry on one clock: the bulk sender until `duration`, the call, the
/// death; the receivers until `duration + drain` (or their stream's end).
fn drive(
    lab: &Lab,
    ends: RivalEnds,
    plan: &Drive,
    progress: &dyn Fn(&str),
) -> Result<Driven, VoipError> {
    let RivalEnds {
        bulk,
        voice,
        keep,
        detection,
    } = ends;
    let bulk_sent = AtomicU64::new(0);
    let bulk_received = AtomicU64::new(0);
    let voice_sent = AtomicU64::new(0);
    let epoch = Instant::now();
    let stop = epoch + plan.duration;
    let end = stop + plan.drain;
    let voice_config = plan.voice;
    let (bulk, voice, death, stats_at_death) = std::thread::scope(|scope| {
        let bulk_threads = bulk.map(|BulkEnds { sender, receiver }| {
            let sending = scope.spawn(|| drive_bulk_sender(sender, epoch, stop, &bulk_sent));
            let receiving =
                scope.spawn(|| drive_bulk_receiver(receiver, epoch, end, &bulk_received));
            (sending, receiving)
        });
        let voice_thread = voice.zip(voice_config.as_ref()).map(|(ends, config)| {
            scope.spawn(|| drive_voice(ends, config, epoch, end, &voice_sent))
        });
        let report = |at: Duration| {
            let mut line = format!(
                "t = {:.0} s: bulk {:.1} MB received",
                at.as_secs_f64(),
                bulk_received.load(Ordering::Relaxed) as f64 / 1e6
            );
            if let Some(c) = voice_config {
                let _ = write!(
                    line,
                    ", voice {}/{} sent",
                    voice_sent.load(Ordering::Relaxed),
                    c.count
                );
            }
            progress(&line);
        };
        // The main thread: the death when due, progress every second.
        let mut death_record = None;
        let mut death_error = None;
        let mut stats_at_death = None;
        let mut next_report = Duration::from_secs(1);
        let mut pending = plan.death;
        loop {
            let now = epoch.elapsed();
            if now >= plan.duration + plan.drain {
                break;
            }
            if let Some((kind, path, at)) = pending
                && now >= at
            {
                pending = None;
                stats_at_death = lab.path_stats().ok();
                match apply_death(lab, kind, path) {
                    Ok(flows_reset) => {
                        let applied = epoch.elapsed();
                        progress(&format!(
                            "path {path}: {} at {:.3} s",
                            kind.name(),
                            applied.as_secs_f64()
                        ));
                        death_record = Some(DeathRecord {
                            kind,
                            path,
                            planned_s: at.as_secs_f64(),
                            applied_s: applied.as_secs_f64(),
                            flows_reset,
                            detected_s: None,
                            survivor_rtt_ms: None,
                            suspected_s: None,
                        });
                    }
                    Err(e) => death_error = Some(e),
                }
                continue;
            }
            if now >= next_report {
                report(now);
                next_report += Duration::from_secs(1);
            }
            let bulk_finished = bulk_threads
                .as_ref()
                .is_none_or(|(s, r)| s.is_finished() && r.is_finished());
            let voice_finished = voice_thread.as_ref().is_none_or(|v| v.is_finished());
            if bulk_finished && voice_finished && pending.is_none() {
                break;
            }
            let mut wake = next_report;
            if let Some((_, _, at)) = pending {
                wake = wake.min(at);
            }
            std::thread::sleep(
                wake.saturating_sub(epoch.elapsed())
                    .min(Duration::from_millis(20)),
            );
        }
        let bulk = bulk_threads.map(|(sending, receiving)| {
            let sender_failures = sending.join().unwrap_or_else(|_| {
                vec![FlowFailure {
                    at_s: epoch.elapsed().as_secs_f64(),
                    end: "sender".into(),
                    error: "the sender thread panicked".into(),
                }]
            });
            let mut trace = receiving.join().unwrap_or_else(|_| BulkTrace {
                failures: vec![FlowFailure {
                    at_s: epoch.elapsed().as_secs_f64(),
                    end: "receiver".into(),
                    error: "the receiver thread panicked".into(),
                }],
                ..BulkTrace::default()
            });
            trace.sent = bulk_sent.load(Ordering::Relaxed);
            trace.failures.splice(0..0, sender_failures);
            trace
        });
        let voice = voice_thread.map(|v| v.join().unwrap_or_default());
        report(epoch.elapsed());
        (
            bulk,
            voice,
            death_error.map_or(Ok(death_record), Err),
            stats_at_death,
        )
    });
    let mut death = death?;
    if let (Some(d), Some(detection)) = (death.as_mut(), detection) {
        let due = epoch + Duration::from_secs_f64(d.planned_s);
        if let Some(found) = detection(due) {
            d.detected_s = Some(found.at.saturating_duration_since(epoch).as_secs_f64());
            d.survivor_rtt_ms = found.survivor_rtt.map(|r| r.as_secs_f64() * 1e3);
            d.suspected_s = found
                .suspected
                .map(|at| at.saturating_duration_since(epoch).as_secs_f64());
        }
    }
    drop(keep);
    Ok(Driven {
        stats_at_death,
        bulk,
        voice,
        death,
    })
}

// ------------------------------------------------------------------------------------------
// Analysis (pure: unit-tested without a lab).

/// Bytes per `bin` from 0 to `end` (the last bin may be partial).
pub fn bins(arrivals: &[(Duration, u64)], bin: Duration, end: Duration) -> Vec<u64> {
    let count = end.as_nanos().div_ceil(bin.as_nanos().max(1)) as usize;
    let mut out = vec![0u64; count.max(1)];
    for &(at, n) in arrivals {
        let i = (at.as_nanos() / bin.as_nanos().max(1)) as usize;
        let last = out.len() - 1;
        out[i.min(last)] += n;
    }
    out
}

/// Bytes that arrived in `[from, to)`.
pub fn bytes_between(arrivals: &[(Duration, u64)], from: Duration, to: Duration) -> u64 {
    arrivals
        .iter()
        .filter(|&&(at, _)| at >= from && at < to)
        .map(|&(_, n)| n)
        .sum()
}

fn mbps(bytes: u64, over: Duration) -> f64 {
    if over.is_zero() {
        0.0
    } else {
        bytes as f64 * 8.0 / over.as_secs_f64() / 1e6
    }
}

/// The times without an arrival within `[from, to]`, in order: (start, length), each from
/// one arrival (or `from`) to the next (or `to`). Arrivals before `from` count as progress up
/// to `from`.
fn gaps(
    arrivals: &[(Duration, u64)],
    from: Duration,
    to: Duration,
) -> impl Iterator<Item = (Duration, Duration)> + '_ {
    let mut last = from;
    arrivals
        .iter()
        .map(|&(at, _)| at)
        .filter(move |&at| at > from && at <= to)
        .chain([to])
        .map(move |at| {
            let gap = (last, at - last);
            last = at;
            gap
        })
}

/// The longest of `gaps`, the earliest among equals; `(from, 0)` if none is longer.
fn longest(
    gaps: impl Iterator<Item = (Duration, Duration)>,
    from: Duration,
) -> (Duration, Duration) {
    gaps.fold((from, Duration::ZERO), |best, gap| {
        if gap.1 > best.1 { gap } else { best }
    })
}

/// The longest time without an arrival within `[from, to]`: (start, length). Arrivals
/// before `from` count as progress up to `from`.
pub fn longest_stall(
    arrivals: &[(Duration, u64)],
    from: Duration,
    to: Duration,
) -> (Duration, Duration) {
    longest(gaps(arrivals, from, to), from)
}

/// Where the stall the death at `at` caused begins: the start of the longest time without
/// an arrival among those that begin within [`RECOVERY_WINDOW`] of the death (what was in
/// flight on the dead path drains within a round trip; a gap that begins later is the
/// flow's own, not the death's). Gaps are cut at `to`; `at` when nothing arrives after it.
pub fn death_stall_start(arrivals: &[(Duration, u64)], at: Duration, to: Duration) -> Duration {
    let onset_end = at + RECOVERY_WINDOW;
    let early = gaps(arrivals, at, to).take_while(|&(start, _)| start <= onset_end);
    longest(early, at).0
}

/// The bulk download's metrics around a death at `at`, sending until `duration`.
pub fn failover_metrics(
    arrivals: &[(Duration, u64)],
    at: Duration,
    duration: Duration,
) -> FailoverMetrics {
    let pre_from = at.saturating_sub(PRE_DEATH_WINDOW);
    let pre_rate = mbps(bytes_between(arrivals, pre_from, at), at - pre_from);
    let after = mbps(
        bytes_between(arrivals, at, duration),
        duration.saturating_sub(at),
    );
    let (stall_from, stall) = longest_stall(arrivals, at, duration);
    let stalled_to_end = stall_from + stall >= duration && !stall.is_zero();
    let mut recovered = None;
    if pre_rate > 0.0 {
        let need = pre_rate * RECOVERY_SHARE;
        // Windows on bin boundaries from the start of the death's stall (not of the longest
        // one: a later, unrelated gap would put the recovery seconds after the death).
        let from = death_stall_start(arrivals, at, duration);
        let mut start =
            Duration::from_nanos((from.as_nanos() / BIN.as_nanos() * BIN.as_nanos()) as u64);
        while start + RECOVERY_WINDOW <= duration {
            if mbps(
                bytes_between(arrivals, start, start + RECOVERY_WINDOW),
                RECOVERY_WINDOW,
            ) >= need
            {
                recovered = Some((start + RECOVERY_WINDOW - at).as_secs_f64());
                break;
            }
            start += BIN;
        }
    }
    FailoverMetrics {
        pre_death_mbps: pre_rate,
        after_death_mbps: after,
        stall_s: stall.as_secs_f64(),
        stall_from_s: stall_from.as_secs_f64(),
        stalled_to_end,
        recovered_after_s: recovered,
        resumed_after_detection_s: None,
        resumed_after_suspicion_s: None,
    }
}

fn bulk_outcome(trace: &BulkTrace, duration: Duration, end: Duration) -> BulkOutcome {
    let received: u64 = trace.arrivals.iter().map(|&(_, n)| n).sum();
    BulkOutcome {
        bytes_sent: trace.sent,
        bytes_received: received,
        intact: trace.intact,
        complete: trace.closed && received == trace.sent,
        bin_s: BIN.as_secs_f64(),
        bins: bins(&trace.arrivals, BIN, end),
        goodput_mbps: mbps(
            bytes_between(&trace.arrivals, Duration::ZERO, duration),
            duration,
        ),
        failures: trace.failures.clone(),
    }
}

fn voice_outcome(config: &FailoverConfig, trace: VoiceTrace) -> VoiceOutcome {
    let voip = config.voip();
    let scenario = config.scenario();
    let observations = Observations {
        sent: trace.sent,
        arrivals: trace.arrivals,
        ..Observations::default()
    };
    let analysis = analyse(&voip, &scenario, &observations);
    let after = |state: MessageState| {
        analysis
            .records
            .iter()
            .filter(|r| r.playout >= config.at && r.state == state)
            .count() as u64
    };
    VoiceOutcome {
        late_after_death: after(MessageState::Late),
        lost_after_death: after(MessageState::Lost),
        playout_offset_ms: scenario.playout_offset().as_secs_f64() * 1000.0,
        messages: analysis
            .records
            .iter()
            .map(|r| {
                let due = voip.due(r.number);
                VoiceMessage {
                    send_s: due.as_secs_f64(),
                    delay_ms: r
                        .arrival
                        .map(|a| a.saturating_sub(due).as_secs_f64() * 1000.0),
                    state: r.state,
                }
            })
            .collect(),
        summary: analysis.summary,
        failures: trace.failures,
    }
}

// ------------------------------------------------------------------------------------------
// Runs.

static LABS: AtomicU32 = AtomicU32::new(0);

fn two_path_lab(
    prefix: &str,
    path0: &LinkConfig,
    path1: &LinkConfig,
    seed: u64,
) -> Result<Lab, VoipError> {
    let index = LABS.fetch_add(1, Ordering::Relaxed);
    Ok(Lab::start(
        LabConfig::new(&format!("{prefix}{index}"))
            .with_up(path0.clone())
            .with_down(path0.clone())
            .with_seed(seed)
            .with_path(
                PathConfig::default()
                    .with_up(path1.clone())
                    .with_down(path1.clone())
                    .with_seed(seed.wrapping_add(1)),
            ),
    )?)
}

/// The congestion control new sockets get in the server's namespace (the senders').
fn congestion_control(lab: &Lab) -> String {
    lab.server()
        .run(|| std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control"))
        .ok()
        .and_then(Result::ok)
        .map_or_else(|| "unknown".to_owned(), |s| s.trim().to_owned())
}

fn carried(stats: &[EmulatorStats], at_death: Option<&[EmulatorStats]>) -> Vec<PathCarried> {
    stats
        .iter()
        .enumerate()
        .map(|(i, s)| PathCarried {
            down_bytes: s.down.ip_bytes_in,
            up_bytes: s.up.ip_bytes_in,
            down_bytes_after_death: at_death
                .and_then(|d| d.get(i))
                .map(|d| s.down.ip_bytes_in.saturating_sub(d.down.ip_bytes_in)),
        })
        .collect()
}

/// How long after `reaction_s` (the rival's detection or suspicion, seconds from the start)
/// the download flowed again after the death at `death_s`: the end of the longest gap between
/// arrivals that ended after the death and began no later than [`REACTION_SLACK`] after the
/// reaction (the stall the death caused, which may begin just before it — the last bytes
/// before the death were in flight —; a later, unrelated one does not count). Negative: it
/// flowed again before the reaction. `None`: nothing arrived after such a gap.
fn resumed_after(arrivals: &[(Duration, u64)], death_s: f64, reaction_s: f64) -> Option<f64> {
    arrivals
        .windows(2)
        .map(|w| (w[0].0.as_secs_f64(), w[1].0.as_secs_f64()))
        .filter(|&(from, to)| to > death_s && from <= reaction_s + REACTION_SLACK)
        .max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)))
        .map(|(_, end)| end - reaction_s)
}

/// See [`resumed_after`]: a stall caused by the death starts before the rival reacts, or
/// at most this long after it (the hole reaching the head of the stream).
const REACTION_SLACK: f64 = 0.1;

/// Runs one rival's failover on a lab of its own (needs root): the download and the call,
/// path 0 dying at `config.at`. `progress` hears about once a second how it goes.
pub fn run_failover(
    config: &FailoverConfig,
    rival: Rival,
    progress: &dyn Fn(&str),
) -> Result<FailoverRow, VoipError> {
    config.validate()?;
    let lab = two_path_lab("fo", &config.path0, &config.path1, config.seed)?;
    let outcome = failover_on(&lab, config, rival, progress);
    let stats = lab.teardown_paths();
    let (driven, at_death, mut warnings, congestion_control) = outcome?;
    let stats = stats?;
    let death = driven
        .death
        .ok_or_else(|| VoipError::Transport("the death was never applied".into()))?;
    let bulk = driven
        .bulk
        .ok_or_else(|| VoipError::Transport("no bulk flow".into()))?;
    let voice = driven
        .voice
        .ok_or_else(|| VoipError::Transport("no call".into()))?;
    let end = config.duration + config.drain;
    let mut metrics = failover_metrics(&bulk.arrivals, config.at, config.duration);
    metrics.resumed_after_detection_s = death
        .detected_s
        .and_then(|at| resumed_after(&bulk.arrivals, death.applied_s, at));
    metrics.resumed_after_suspicion_s = death
        .suspected_s
        .and_then(|at| resumed_after(&bulk.arrivals, death.applied_s, at));
    if !bulk.intact {
        warnings.push("the download's bytes differ from what was sent".into());
    }
    Ok(FailoverRow {
        rival,
        description: rival.description(),
        congestion_control,
        bulk: bulk_outcome(&bulk, config.duration, end),
        metrics,
        voice: voice_outcome(config, voice),
        death,
        paths: carried(&stats, at_death.as_deref()),
        warnings,
    })
}

type FailoverOutcome = (Driven, Option<Vec<EmulatorStats>>, Vec<String>, String);

fn failover_on(
    lab: &Lab,
    config: &FailoverConfig,
    rival: Rival,
    progress: &dyn Fn(&str),
) -> Result<FailoverOutcome, VoipError> {
    let warnings = Vec::new();
    let addresses = lab.path_addresses(0)?;
    let call = LabCall {
        sender: std::net::SocketAddr::new(addresses.server_v4.into(), VOICE_PORT),
        receiver: std::net::SocketAddr::new(addresses.client_v4.into(), VOICE_PORT),
        config: config.voip(),
        scenario: config.scenario(),
    };
    progress(&format!("opening {}", rival.name()));
    let ends = rival.open(
        lab,
        &OpenRequest {
            bulk: true,
            voice: Some(call),
            run_length: config.duration + config.drain,
        },
    )?;
    let plan = Drive {
        duration: config.duration,
        drain: config.drain,
        voice: Some(config.voip()),
        death: Some((config.death, 0, config.at)),
    };
    let driven = drive(lab, ends, &plan, progress)?;
    let at_death = driven.stats_at_death.clone();
    Ok((driven, at_death, warnings, congestion_control(lab)))
}

/// Runs one rival's bulk download on a two-path lab of its own (needs root).
pub fn run_multipath(
    config: &MultipathConfig,
    rival: Rival,
    progress: &dyn Fn(&str),
) -> Result<MultipathRow, VoipError> {
    config.validate()?;
    let lab = two_path_lab("mp", &config.path0, &config.path1, config.seed)?;
    let outcome = (|| -> Result<(Driven, Vec<String>, String), VoipError> {
        let warnings = vec![];
        progress(&format!("opening {}", rival.name()));
        let ends = rival.open(
            &lab,
            &OpenRequest {
                bulk: true,
                voice: None,
                run_length: config.duration + config.drain,
            },
        )?;
        let plan = Drive {
            duration: config.duration,
            drain: config.drain,
            voice: None,
            death: None,
        };
        let driven = drive(&lab, ends, &plan, progress)?;
        Ok((driven, warnings, congestion_control(&lab)))
    })();
    let stats = lab.teardown_paths();
    let (driven, mut warnings, congestion_control) = outcome?;
    let stats = stats?;
    let bulk = driven
        .bulk
        .ok_or_else(|| VoipError::Transport("no bulk flow".into()))?;
    if !bulk.intact {
        warnings.push("the download's bytes differ from what was sent".into());
    }
    let steady = mbps(
        bytes_between(&bulk.arrivals, config.warm_up, config.duration),
        config.duration - config.warm_up,
    );
    Ok(MultipathRow {
        rival,
        description: rival.description(),
        congestion_control,
        bulk: bulk_outcome(&bulk, config.duration, config.duration + config.drain),
        steady_mbps: steady,
        ratio_to_sum_of_rates: config.sum_of_rates().map(|r| steady / mbps_of_bps(r)),
        ratio_to_better_path_rate: config.better_path_rate().map(|r| steady / mbps_of_bps(r)),
        ratio_to_best_single_path: None,
        paths: carried(&stats, None),
        warnings,
    })
}

// ------------------------------------------------------------------------------------------
// Tables.

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
}

/// The failover table: per rival, the download around the death and the call.
pub fn failover_table(report: &FailoverReport) -> String {
    let mut out = String::new();
    let c = &report.config;
    let _ = writeln!(
        out,
        "path 0: {}; path 1: {}; path 0 {} at {:.1} s of {:.1} s; playout {} ms after path 0's one-way delay; congestion control {}",
        c.path0,
        c.path1,
        c.death.name(),
        c.at.as_secs_f64(),
        c.duration.as_secs_f64(),
        c.playout.as_millis(),
        report
            .rows
            .first()
            .map_or("-", |r| r.congestion_control.as_str())
    );
    let _ = writeln!(
        out,
        "{:<19} {:>9} {:>9} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>6} {:>6} {:>9}  failures",
        "rival",
        "pre Mb/s",
        "post Mb/s",
        "stall s",
        "recover s",
        "suspect s",
        "resume ms",
        "detect s",
        "resume ms",
        "srtt ms",
        "complete",
        "voice",
        "late",
        "lost",
        "p99 ms",
        "p1 MB aft"
    );
    for r in &report.rows {
        let s = &r.voice.summary;
        // The first failure of each flow (the JSON has them all).
        let failures: Vec<String> = [("bulk", &r.bulk.failures), ("voice", &r.voice.failures)]
            .into_iter()
            .filter_map(|(flow, all)| {
                let f = all.first()?;
                Some(format!("{flow} {} {:.2} s: {}", f.end, f.at_s, f.error))
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<19} {:>9.1} {:>9.1} {:>7.2}{} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>6} {:>6} {:>9}  {}",
            r.rival.name(),
            r.metrics.pre_death_mbps,
            r.metrics.after_death_mbps,
            r.metrics.stall_s,
            if r.metrics.stalled_to_end { "+" } else { " " },
            opt(r.metrics.recovered_after_s, 2),
            opt(r.death.suspected_s.map(|d| d - r.death.planned_s), 3),
            opt(r.metrics.resumed_after_suspicion_s.map(|s| s * 1e3), 0),
            opt(r.death.detected_s.map(|d| d - r.death.planned_s), 3),
            opt(r.metrics.resumed_after_detection_s.map(|s| s * 1e3), 0),
            opt(r.death.survivor_rtt_ms, 0),
            if r.bulk.complete && r.bulk.intact {
                "yes"
            } else {
                "no"
            },
            format!("{}/{}", s.delivered_on_time, s.messages_sent),
            s.delivered_late,
            s.never_delivered,
            opt(s.latency_ms.p99, 0),
            opt(
                r.paths
                    .get(1)
                    .and_then(|p| p.down_bytes_after_death)
                    .map(|b| b as f64 / 1e6),
                1
            ),
            if failures.is_empty() {
                "-".to_owned()
            } else {
                failures.join("; ")
            }
        );
    }
    let _ = writeln!(
        out,
        "stall: longest time without a new byte from the death to the end of sending (+: to the end); \
         recover: death to the end of the first 250 ms at ≥ 50 % of the pre-death goodput; \
         suspect: death to the rival's suspicion, when it copied the path's unacknowledged data \
         to the other (squarepeg's reinjection), and resume: from then to the end of the stall \
         (the download flowing again); detect: death to the rival's own declaration (squarepeg's \
         path timeout or the reset), and resume: from then to the end of the stall (negative: \
         before it); srtt: the surviving path's smoothed \
         RTT at detection, as the rival measured it; voice: on time / sent"
    );
    out
}

/// The multipath table: per rival, goodput and its ratios.
pub fn multipath_table(report: &MultipathReport) -> String {
    let mut out = String::new();
    let c = &report.config;
    let _ = writeln!(
        out,
        "path 0: {}; path 1: {}; {:.0} s, steady from {:.0} s; sum of rates {} Mbit/s, better path {} Mbit/s; congestion control {}",
        c.path0,
        c.path1,
        c.duration.as_secs_f64(),
        c.warm_up.as_secs_f64(),
        opt(report.sum_of_rates_mbps, 0),
        opt(report.better_path_rate_mbps, 0),
        report
            .rows
            .first()
            .map_or("-", |r| r.congestion_control.as_str())
    );
    let _ = writeln!(
        out,
        "{:<10} {:>11} {:>11} {:>8} {:>12} {:>13} {:>10} {:>10}",
        "rival",
        "steady Mb/s",
        "whole Mb/s",
        "/ sum",
        "/ better",
        "/ best single",
        "p0 MB",
        "p1 MB"
    );
    for r in &report.rows {
        let _ = writeln!(
            out,
            "{:<10} {:>11.1} {:>11.1} {:>8} {:>12} {:>13} {:>10.1} {:>10.1}",
            r.rival.name(),
            r.steady_mbps,
            r.bulk.goodput_mbps,
            opt(r.ratio_to_sum_of_rates, 2),
            opt(r.ratio_to_better_path_rate, 2),
            opt(r.ratio_to_best_single_path, 2),
            r.paths.first().map_or(0.0, |p| p.down_bytes as f64 / 1e6),
            r.paths.get(1).map_or(0.0, |p| p.down_bytes as f64 / 1e6),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn bins_and_stalls() {
        // 1 kB every 10 ms to 2 s, nothing until 3.5 s, then 1 kB every 10 ms to 5 s.
        let mut arrivals: Vec<(Duration, u64)> = (1..=200).map(|i| (i * 10 * MS, 1000)).collect();
        arrivals.extend((350..=500).map(|i| (i * 10 * MS, 1000)));
        let b = bins(&arrivals, BIN, 5000 * MS);
        assert_eq!(b.len(), 100);
        assert_eq!(b.iter().sum::<u64>(), 351_000);
        assert_eq!(b[10], 5000);
        assert_eq!(b[50], 0);
        let (from, len) = longest_stall(&arrivals, 2000 * MS, 5000 * MS);
        assert_eq!((from, len), (2000 * MS, 1500 * MS));
        let m = failover_metrics(&arrivals, 2000 * MS, 5000 * MS);
        assert!((m.pre_death_mbps - 0.8).abs() < 1e-9, "{m:?}");
        assert!(!m.stalled_to_end);
        // Back at 3.5 s: the first 250 ms window at ≥ 50 % (half of it at the old rate)
        // ends at 3.65 s.
        let r = m.recovered_after_s.expect("recovered");
        assert!((1.6..=1.75).contains(&r), "{r}");
        // A flow that dies for good.
        let dead: Vec<(Duration, u64)> = arrivals
            .iter()
            .copied()
            .filter(|a| a.0 <= 2010 * MS)
            .collect();
        let m = failover_metrics(&dead, 2000 * MS, 5000 * MS);
        assert!(m.stalled_to_end);
        assert_eq!(m.recovered_after_s, None);
        assert!((m.stall_s - 3.0).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn recovery_is_measured_from_the_deaths_stall_not_a_later_one() {
        // 1 kB every 10 ms to 2.02 s, nothing to 2.06 s (the death's stall), every 10 ms to
        // 3 s, then a longer, unrelated gap to 3.2 s and every 10 ms to 5 s.
        let mut arrivals: Vec<(Duration, u64)> = (1..=202).map(|i| (i * 10 * MS, 1000)).collect();
        arrivals.extend((206..=300).map(|i| (i * 10 * MS, 1000)));
        arrivals.extend((320..=500).map(|i| (i * 10 * MS, 1000)));
        assert_eq!(
            death_stall_start(&arrivals, 2000 * MS, 5000 * MS),
            2020 * MS
        );
        let m = failover_metrics(&arrivals, 2000 * MS, 5000 * MS);
        // The longest stall is the later one, as documented ...
        assert!((m.stall_s - 0.2).abs() < 1e-9, "{m:?}");
        // ... but the recovery follows the death's: the window from 2.0 s (bin of 2.02 s)
        // to 2.25 s holds 21 of 25 arrivals.
        let r = m.recovered_after_s.expect("recovered");
        assert!((r - 0.25).abs() < 1e-9, "{r}");
    }

    #[test]
    fn the_stall_the_death_caused_is_measured_from_the_reaction() {
        // Every 10 ms to 2.02 s, nothing to 2.06 s (the death's stall), then every 10 ms,
        // and a longer, unrelated gap from 3 s to 3.1 s.
        let mut arrivals: Vec<(Duration, u64)> = (1..=202).map(|i| (i * 10 * MS, 1000)).collect();
        arrivals.extend((206..=300).map(|i| (i * 10 * MS, 1000)));
        arrivals.extend((310..=400).map(|i| (i * 10 * MS, 1000)));
        let after = |reaction: f64| resumed_after(&arrivals, 2.0, reaction).unwrap();
        // Detected at once (a reset): flowing again 60 ms later, not at 3.1 s.
        assert!((after(2.0) - 0.06).abs() < 1e-9, "{}", after(2.0));
        // Detected late: negative, it flowed before.
        assert!((after(2.2) + 0.14).abs() < 1e-9, "{}", after(2.2));
        // The stall began just before the death (its last bytes were in flight): it counts.
        let late_death = |reaction: f64| resumed_after(&arrivals, 2.03, reaction).unwrap();
        assert!(
            (late_death(2.03) - 0.03).abs() < 1e-9,
            "{}",
            late_death(2.03)
        );
        assert_eq!(resumed_after(&arrivals[..150], 2.0, 2.0), None);
    }

    #[test]
    fn pattern_differs_per_offset_and_is_positional() {
        let mut whole = vec![0u8; 1000];
        pattern(5000, &mut whole);
        let mut tail = vec![0u8; 500];
        pattern(5500, &mut tail);
        assert_eq!(&whole[500..], &tail[..]);
        assert!(whole.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn rival_names_round_trip() {
        for r in Rival::ALL {
            assert_eq!(Rival::by_name(&r.name()).expect("known"), r);
            let json = serde_json::to_string(&r).expect("json");
            assert_eq!(serde_json::from_str::<Rival>(&json).expect("back"), r);
        }
        assert!(Rival::by_name("quic").is_err());
    }

    #[test]
    fn configs_validate_and_serialize() {
        let f = FailoverConfig::default();
        f.validate().expect("default is valid");
        assert_eq!(f.voip().count, 300);
        let back: FailoverConfig =
            serde_json::from_str(&serde_json::to_string(&f).expect("json")).expect("parse");
        assert_eq!(back, f);
        let bad = FailoverConfig {
            at: Duration::from_secs(7),
            ..FailoverConfig::default()
        };
        assert!(bad.validate().is_err());
        let m = MultipathConfig::default();
        m.validate().expect("valid");
        assert_eq!(m.sum_of_rates(), Some(60_000_000));
        assert_eq!(m.better_path_rate(), Some(40_000_000));
    }
}
