//! Minion §8.3: send-side prioritization under a network-limited sender.
//!
//! A synthetic application always has more to send than the path carries: it sends
//! [`PriorityConfig::message_bytes`]-byte messages on a squarepeg connection whenever the
//! connection takes one, and one message in [`PriorityConfig::high_every`] is high priority.
//! For every message we measure the delay from the send call (when the connection took the
//! message) to its delivery to the receiving application, per class, for two senders:
//!
//! - `priority`: high-priority messages are sent at [`Priority::HIGHEST`], the others at
//!   [`Priority::DEFAULT`]; over the userspace TCP the connection hands each message to the
//!   TCP's tagged send queue with its priority, which inserts it ahead of every
//!   lower-priority message not yet transmitted (Minion §4.2);
//! - `fifo`: every message at the same priority: standard TCP order.
//!
//! Both ends run the library, as an application would:
//!
//! - on the deterministic simulator ([`run`]), the connection core
//!   (`squarepeg_connection::Connection`, driven by its `EndpointLink`) on a userspace TCP
//!   endpoint at each end: the voice experiment's hosts
//!   ([`TcpVoiceHost`] with [`StreamCodec::unordered`] and [`Pacing::NetworkLimited`]);
//! - on the real lab ([`run_lab`]), the `squarepeg` crate: [`Transport::Utcp`] opens the
//!   connection with `Connection::connect_utcp` / `Endpoint::listen_utcp` on a userspace
//!   stack on TUN at each end, [`Transport::KernelTcp`] over the kernel's TCP, where
//!   priorities act in the session's scheduler on what the kernel has not taken yet (the
//!   late binding of the `squarepeg` crate, ARCHITECTURE.md).
//!
//! Over the userspace TCP the session holds one message at a time
//! ([`UTCP_SESSION_QUEUE`]): the connection moves a message into the TCP's queue as soon as
//! the TCP's send buffer ([`PriorityConfig::send_buffer`]) has room for it, so that buffer is
//! the sender's buffer and nearly always full. Over kernel TCP the session's queue is
//! [`PriorityConfig::send_buffer`] and the kernel below holds what `TCP_NOTSENT_LOWAT` lets
//! it.
//!
//! Minion's Figure 10 predicts that high-priority messages see roughly the path's delay
//! (they wait only behind data already transmitted), while FIFO messages of both classes
//! wait for the whole send buffer to drain.
//!
//! # The path
//!
//! [`priority_bottleneck`]: 8 Mbit/s down, 1 Mbit/s up, 20 ms each way, no random loss, a
//! 64-packet drop-tail downlink queue; the receiver advertises a 64 KiB window. The window
//! (above the 40 kB bandwidth-delay product) keeps the path full while never filling the
//! queue, so nothing is lost and delivery order is transmission order: the ordering checks
//! below hold exactly. The sender's buffer is [`PriorityConfig::send_buffer`] (256 KiB, a
//! quarter of a second at 8 Mbit/s).
//!
//! # Output, schema `squarepeg.priority/1`
//!
//! ```text
//! { "schema": "squarepeg.priority/1", "seed", "duration_s", "message_bytes", "high_every",
//!   "send_buffer", "notsent_lowat", "runs": [ { "engine": "sim" | "lab", "transport": "utcp" | "kernel-tcp",
//!     "variant": "priority" | "fifo",
//!     "messages_written",
//!     "messages_delivered", "throughput_mbps",
//!     "high": { "count", "delivered", "p50_ms", "p95_ms", "p99_ms", "max_ms" },
//!     "low":  { … the same … },
//!     "overtaking": { "pairs", "delivered_first" } (null on the real lab),
//!     "warnings": [ … ] }, … ] }
//! ```
//!
//! `overtaking.pairs` counts (high message H, low message L) pairs where L was sent before
//! H but not yet transmitted when H entered the TCP's send queue (where priority insertion
//! happens); `delivered_first` counts those where H reached the receiving application before
//! L (with priorities: all of them).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use squarepeg::{ConnectionConfig, Priority, SessionConfig};
use squarepeg_lab::Side;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_lab::net::Role;
use squarepeg_lab::sim::{KIND_DATA, SimConfig, Simulator, decode_payload, encode_payload};
use squarepeg_lab::stack::stack_addresses;

use crate::voip::analysis::{ms, percentile};
use crate::voip::config::VoipConfig;
use crate::voip::lab::VoiceReceiver as _;
use crate::voip::lab::transports::{Library, LibraryCall, LibraryEnds, open_library};
use crate::voip::lab::utcp::attach;
use crate::voip::plot::{CdfChart, ensure_font, write_svg_and_png};
use crate::voip::sim::tcp_host::{Pacing, SenderStep, StreamCodec, TcpVoiceHost};
use crate::voip::sim::{RECEIVER, SENDER};
use crate::voip::{Engine, VoipError};

/// The schema name and version of the JSON output.
pub const PRIORITY_SCHEMA: &str = "squarepeg.priority/1";

/// The receiver's advertised window (see the module docs).
pub const RECEIVE_WINDOW: usize = 64 * 1024;
/// Packets the downlink queue holds.
pub const QUEUE_PACKETS: u64 = 64;
/// Time after the sender stops writing for the queue to drain.
const DRAIN: Duration = Duration::from_secs(3);
/// The session's message queue over the userspace TCP: one message at a time (an empty queue
/// takes any one), so that the TCP's send buffer ([`PriorityConfig::send_buffer`]) is the
/// sender's buffer.
pub const UTCP_SESSION_QUEUE: usize = 0;

/// The experiment's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityConfig {
    /// How long the sender writes.
    pub duration: Duration,
    /// Bytes of each message (the lab's datagram header, zero-padded).
    pub message_bytes: usize,
    /// One message in this many is high priority (Minion §8.3: 100).
    pub high_every: u64,
    /// The sender's TCP send buffer (over kernel TCP: the session's message queue).
    pub send_buffer: usize,
    /// A fixed `TCP_NOTSENT_LOWAT` for the kernel-TCP sender (`None`: the `squarepeg`
    /// crate's default, which follows the delivery rate up to 64 KiB).
    pub notsent_lowat: Option<u32>,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(20),
            message_bytes: 1000,
            high_every: 100,
            send_buffer: 256 * 1024,
            notsent_lowat: None,
        }
    }
}

impl PriorityConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), VoipError> {
        let min = squarepeg_lab::sim::MIN_PAYLOAD;
        if !(min..=1400).contains(&self.message_bytes) {
            return Err(VoipError::Config(format!(
                "message size {} is outside {min}..=1400 bytes (one segment)",
                self.message_bytes
            )));
        }
        if self.high_every < 2 {
            return Err(VoipError::Config(
                "high_every must be at least 2 (one message in N is high priority)".into(),
            ));
        }
        if self.send_buffer < 4 * self.message_bytes {
            return Err(VoipError::Config(format!(
                "a send buffer of {} bytes holds fewer than four messages",
                self.send_buffer
            )));
        }
        if self.notsent_lowat == Some(0) {
            return Err(VoipError::Config(
                "TCP_NOTSENT_LOWAT must be at least 1 byte".into(),
            ));
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(600) {
            return Err(VoipError::Config(
                "the duration must be above zero and at most 600 s".into(),
            ));
        }
        Ok(())
    }

    /// Whether message `number` is high priority (the last of each group of `high_every`, as
    /// [`Pacing::NetworkLimited`] picks them).
    pub fn is_high(&self, number: u64) -> bool {
        number % self.high_every == self.high_every - 1
    }

    /// The sender's userspace TCP: a send buffer of [`PriorityConfig::send_buffer`].
    fn sender_tcp(&self) -> squarepeg_tcp::ConnectionConfig {
        let mut config = squarepeg_tcp::ConnectionConfig::default();
        config.send_buffer = self.send_buffer;
        config
    }

    /// The sender's session: over the userspace TCP one message at a time
    /// ([`UTCP_SESSION_QUEUE`]), over kernel TCP [`PriorityConfig::send_buffer`] bytes.
    fn sender_session(&self, transport: Transport) -> SessionConfig {
        let mut session = SessionConfig::default();
        session.message_send_queue = match transport {
            Transport::Utcp => UTCP_SESSION_QUEUE,
            Transport::KernelTcp => self.send_buffer,
        };
        session
    }
}

/// The receiver's userspace TCP: it advertises [`RECEIVE_WINDOW`].
fn receiver_tcp() -> squarepeg_tcp::ConnectionConfig {
    let mut config = squarepeg_tcp::ConnectionConfig::default();
    config.recv_buffer = RECEIVE_WINDOW;
    config
}

/// The path (module docs).
pub fn priority_bottleneck() -> Bottleneck {
    let one_way = Duration::from_millis(20);
    Bottleneck {
        left_to_right: LinkConfig::new().with_delay(one_way).with_rate(1_000_000),
        right_to_left: LinkConfig::new()
            .with_delay(one_way)
            .with_rate(8_000_000)
            .with_queue(None, Some(QUEUE_PACKETS)),
    }
}

/// How the sender tags its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// High-priority messages tagged above the others (Minion §4.2 insertion).
    Priority,
    /// Every message with the same tag: standard FIFO order.
    Fifo,
}

impl Variant {
    /// Both, in report order.
    pub const ALL: [Variant; 2] = [Variant::Priority, Variant::Fifo];

    /// `priority` or `fifo`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Priority => "priority",
            Variant::Fifo => "fifo",
        }
    }

    /// The priority the sender gives message `number`.
    fn priority(self, config: &PriorityConfig, number: u64) -> Priority {
        if self == Variant::Priority && config.is_high(number) {
            Priority::HIGHEST
        } else {
            Priority::DEFAULT
        }
    }
}

/// What carries the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// squarepeg's userspace TCP, the uTCP interface: priority tags act inside the TCP send
    /// queue (Minion §4.2). Simulator and real lab.
    Utcp,
    /// The `squarepeg` crate over kernel TCP with late binding (real lab only): priorities
    /// act in the session's scheduler, on what the kernel has not taken yet; the kernel's
    /// unsent queue is kept short with `TCP_NOTSENT_LOWAT` (by default following the
    /// delivery rate: a few milliseconds of data, at most 64 KiB).
    KernelTcp,
}

impl Transport {
    /// `utcp` or `kernel-tcp`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Utcp => "utcp",
            Transport::KernelTcp => "kernel-tcp",
        }
    }
}

/// One message's fate. Times are from the run's start; the `*_order` fields are positions
/// in one sequence of the messages' entries into the TCP's send queue and first
/// transmissions (simulator), and in the receiver's deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageOutcome {
    /// Its number (send order).
    pub number: u64,
    /// High priority.
    pub high: bool,
    /// The send call: when the connection took the message.
    pub written: Duration,
    /// Position of its entry into the TCP's send queue among those entries and the first
    /// transmissions (on the real lab, which does not see them: its number).
    pub write_order: u64,
    /// Position of its first transmission in the same sequence.
    pub transmit_order: Option<u64>,
    /// When the receiving application first got it.
    pub arrival: Option<Duration>,
    /// Position among the receiver's deliveries.
    pub arrival_order: Option<u64>,
    /// How many times the receiving application got it (once, for a reliable transport
    /// that suppresses duplicates).
    pub deliveries: u32,
}

impl MessageOutcome {
    /// Send call to delivery.
    pub fn delay(&self) -> Option<Duration> {
        Some(self.arrival?.saturating_sub(self.written))
    }
}

/// Delay statistics of one class of messages, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassStats {
    /// Messages written.
    pub count: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Median delay.
    pub p50_ms: Option<f64>,
    /// 95th percentile.
    pub p95_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// Largest.
    pub max_ms: Option<f64>,
}

/// Pairs of (high H, low L sent before H and not yet transmitted when H entered the TCP's
/// send queue).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overtaking {
    /// Such pairs.
    pub pairs: u64,
    /// Of those, pairs where H was delivered before L.
    pub delivered_first: u64,
    /// Of those, pairs where H was first transmitted before L.
    pub transmitted_first: u64,
}

/// One variant's run.
#[derive(Debug, Clone)]
pub struct PriorityRun {
    /// Simulator or real lab.
    pub engine: Engine,
    /// What carried the messages.
    pub transport: Transport,
    /// The variant.
    pub variant: Variant,
    /// The seed.
    pub seed: u64,
    /// The parameters.
    pub config: PriorityConfig,
    /// Every message written, by number.
    pub messages: Vec<MessageOutcome>,
    /// Errors the ends reported.
    pub warnings: Vec<String>,
}

impl PriorityRun {
    /// Delay statistics of the high- (`true`) or low-priority class.
    pub fn class(&self, high: bool) -> ClassStats {
        let class: Vec<&MessageOutcome> = self.messages.iter().filter(|m| m.high == high).collect();
        let mut delays: Vec<Duration> = class.iter().filter_map(|m| m.delay()).collect();
        delays.sort_unstable();
        ClassStats {
            count: class.len() as u64,
            delivered: delays.len() as u64,
            p50_ms: percentile(&delays, 0.50),
            p95_ms: percentile(&delays, 0.95),
            p99_ms: percentile(&delays, 0.99),
            max_ms: delays.last().map(|d| ms(*d)),
        }
    }

    /// The overtaking pairs (module docs); `None` on the real lab, where the sender does not
    /// learn when each message was first transmitted.
    pub fn overtaking(&self) -> Option<Overtaking> {
        if self.engine != Engine::Sim {
            return None;
        }
        let mut o = Overtaking::default();
        // Low messages by number with their transmit and arrival orders.
        let lows: Vec<&MessageOutcome> = self.messages.iter().filter(|m| !m.high).collect();
        for h in self.messages.iter().filter(|m| m.high) {
            let before = lows.partition_point(|l| l.number < h.number);
            for l in &lows[..before] {
                if l.transmit_order.is_some_and(|t| t < h.write_order) {
                    continue;
                }
                o.pairs += 1;
                if let Some(ha) = h.arrival_order
                    && l.arrival_order.is_none_or(|la| ha < la)
                {
                    o.delivered_first += 1;
                }
                if let Some(ht) = h.transmit_order
                    && l.transmit_order.is_none_or(|lt| ht < lt)
                {
                    o.transmitted_first += 1;
                }
            }
        }
        Some(o)
    }

    /// Notes the receiver's `arrivals`, in delivery order; a number never sent, or delivered
    /// again, is a warning.
    fn add_arrivals(&mut self, arrivals: &[(u64, Duration)]) {
        for (order, &(number, at)) in arrivals.iter().enumerate() {
            let Some(m) = usize::try_from(number)
                .ok()
                .and_then(|i| self.messages.get_mut(i))
            else {
                self.warnings
                    .push(format!("message {number} arrived but was never sent"));
                continue;
            };
            m.deliveries += 1;
            if m.deliveries > 1 {
                self.warnings
                    .push(format!("message {number} delivered {} times", m.deliveries));
                continue;
            }
            m.arrival = Some(at);
            m.arrival_order = Some(order as u64);
        }
    }

    /// Bits per second of message payload delivered over the writing period.
    pub fn throughput_mbps(&self) -> f64 {
        let delivered = self.messages.iter().filter(|m| m.arrival.is_some()).count();
        (delivered * self.config.message_bytes * 8) as f64
            / self.config.duration.as_secs_f64()
            / 1e6
    }
}

/// Runs one variant on the simulator: the library's connection core over the uTCP
/// interface at both ends ([`TcpVoiceHost`], [`StreamCodec::unordered`]), the sender
/// network-limited ([`Pacing::NetworkLimited`]) with its TCP send buffer of
/// [`PriorityConfig::send_buffer`], the receiver advertising [`RECEIVE_WINDOW`].
pub fn run(config: &PriorityConfig, variant: Variant, seed: u64) -> Result<PriorityRun, VoipError> {
    config.validate()?;
    let mut sim = Simulator::new(SimConfig::new(seed, priority_bottleneck()))?;
    let start = sim.start();
    // The hosts take the message size from it; the pacing replaces its schedule.
    let application = VoipConfig {
        message_bytes: config.message_bytes,
        ..VoipConfig::default()
    };
    let pacing = Pacing::NetworkLimited {
        stop: start + config.duration,
        high_priority_every: (variant == Variant::Priority).then_some(config.high_every),
    };
    let sender_codec = StreamCodec::unordered(None, false)
        .with_tcp(config.sender_tcp())
        .with_session(config.sender_session(Transport::Utcp));
    let receiver_codec = StreamCodec::unordered(None, false).with_tcp(receiver_tcp());
    let sender =
        TcpVoiceHost::sender(SENDER, start, application, sender_codec, seed).with_pacing(pacing);
    let receiver =
        TcpVoiceHost::receiver(RECEIVER, SENDER, start, application, receiver_codec, seed);
    let sender = sim.add_host(Side::Right, sender)?;
    let receiver = sim.add_host(Side::Left, receiver)?;
    sim.run_until(start + config.duration + DRAIN)?;
    let host = |id| {
        sim.host::<TcpVoiceHost>(id)
            .ok_or_else(|| VoipError::Transport("an end is not a TcpVoiceHost".into()))
    };
    let (s, r) = (host(sender)?, host(receiver)?);
    let mut messages: Vec<MessageOutcome> = s
        .sent()
        .iter()
        .enumerate()
        .map(|(i, &at)| MessageOutcome {
            number: i as u64,
            high: config.is_high(i as u64),
            // Network-limited pacing records only the messages the connection took.
            written: at.unwrap_or_default(),
            // Until the timeline says when it entered the TCP's queue.
            write_order: u64::MAX,
            transmit_order: None,
            arrival: None,
            arrival_order: None,
            deliveries: 0,
        })
        .collect();
    for (position, step) in s.timeline().iter().enumerate() {
        let (SenderStep::Queued(number) | SenderStep::Sent(number)) = *step;
        let Some(m) = usize::try_from(number)
            .ok()
            .and_then(|i| messages.get_mut(i))
        else {
            continue;
        };
        match step {
            SenderStep::Queued(_) => m.write_order = position as u64,
            SenderStep::Sent(_) => {
                m.transmit_order.get_or_insert(position as u64);
            }
        }
    }
    let mut warnings = [s.errors(), r.errors()].concat();
    if let StreamCodec::Squarepeg(c) = s.codec()
        && !(c.dropped().is_empty() && c.replaced().is_empty())
    {
        warnings.push(format!(
            "the sender dropped {} and replaced {} messages",
            c.dropped().len(),
            c.replaced().len()
        ));
    }
    let mut run = PriorityRun {
        engine: Engine::Sim,
        transport: Transport::Utcp,
        variant,
        seed,
        config: *config,
        messages,
        warnings,
    };
    run.add_arrivals(r.arrivals());
    Ok(run)
}

/// Runs both variants.
pub fn run_all(config: &PriorityConfig, seed: u64) -> Result<Vec<PriorityRun>, VoipError> {
    Variant::ALL.iter().map(|&v| run(config, v, seed)).collect()
}

fn class_json(c: &ClassStats) -> Value {
    json!({
        "count": c.count,
        "delivered": c.delivered,
        "p50_ms": c.p50_ms,
        "p95_ms": c.p95_ms,
        "p99_ms": c.p99_ms,
        "max_ms": c.max_ms,
    })
}

/// The runs as JSON (schema [`PRIORITY_SCHEMA`]).
pub fn priority_json(config: &PriorityConfig, seed: u64, runs: &[PriorityRun]) -> Value {
    let runs: Vec<Value> = runs
        .iter()
        .map(|r| {
            let overtaking = r
                .overtaking()
                .map(|o| json!({ "pairs": o.pairs, "delivered_first": o.delivered_first }));
            json!({
                "engine": r.engine,
                "transport": r.transport.name(),
                "variant": r.variant.name(),
                "messages_written": r.messages.len(),
                "messages_delivered": r.messages.iter().filter(|m| m.arrival.is_some()).count(),
                "throughput_mbps": r.throughput_mbps(),
                "high": class_json(&r.class(true)),
                "low": class_json(&r.class(false)),
                "overtaking": overtaking,
                "warnings": r.warnings,
            })
        })
        .collect();
    json!({
        "schema": PRIORITY_SCHEMA,
        "seed": seed,
        "duration_s": config.duration.as_secs_f64(),
        "message_bytes": config.message_bytes,
        "high_every": config.high_every,
        "send_buffer": config.send_buffer,
        "notsent_lowat": config.notsent_lowat,
        "runs": runs,
    })
}

/// The table for people: per variant and class, median/p95/p99 delay.
pub fn priority_table(runs: &[PriorityRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<4} {:<10} {:<9} {:<5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "eng",
        "transport",
        "variant",
        "class",
        "messages",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "Mbit/s"
    );
    let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    for r in runs {
        for (name, high) in [("high", true), ("low", false)] {
            let c = r.class(high);
            let _ = writeln!(
                out,
                "{:<4} {:<10} {:<9} {:<5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10.2}",
                r.engine.name(),
                r.transport.name(),
                r.variant.name(),
                name,
                c.count,
                f(c.p50_ms),
                f(c.p95_ms),
                f(c.p99_ms),
                f(c.max_ms),
                r.throughput_mbps(),
            );
        }
    }
    out
}

/// Writes `priority-<engine>-cdf.{svg,png}` (engine of the first run) into `dir`: the delay CDF of each variant and class
/// (Minion Figure 10 as a distribution); returns the files.
pub fn plot_cdf(dir: &Path, runs: &[PriorityRun]) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(VoipError::io(format!("creating {}", dir.display())))?;
    let engine = runs.first().map_or("sim", |r| r.engine.name());
    let mut curves = Vec::new();
    for r in runs {
        for (name, high) in [("high", true), ("low", false)] {
            let delays: Vec<f64> = r
                .messages
                .iter()
                .filter(|m| m.high == high)
                .filter_map(|m| m.delay().map(ms))
                .collect();
            let total = delays.len();
            curves.push((
                format!(
                    "{} {} {} {name}",
                    r.engine.name(),
                    r.transport.name(),
                    r.variant.name()
                ),
                delays,
                total,
            ));
        }
    }
    let chart = CdfChart::new(
        (
            "send-call-to-delivery delay, network-limited sender, 1 in 100 messages high priority (Minion §8.3)"
                .to_owned(),
            18,
        ),
        "delay (ms)",
        "fraction of the class delivered",
        curves,
        None,
    );
    Ok(write_svg_and_png(&dir.join(format!("priority-{engine}-cdf")), &chart)?.to_vec())
}

/// What a lab run observed: per message its send call, the arrivals in order, and what the
/// ends reported.
type LabOutcome = (Vec<Duration>, Vec<(u64, Duration)>, Vec<String>);

/// Lab runs get distinct names within a process.
static LABS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Checks `config` and starts a lab of its own with [`priority_bottleneck`].
fn start_lab(config: &PriorityConfig, seed: u64) -> Result<squarepeg_lab::net::Lab, VoipError> {
    use squarepeg_lab::net::{Lab, LabConfig};
    config.validate()?;
    let index = LABS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Lab::start(
        LabConfig::new(&format!("prio{index}"))
            .with_bottleneck(priority_bottleneck())
            .with_seed(seed),
    )?)
}

/// The receiver's largest receive buffer on the kernel-TCP runs: Linux advertises about half
/// of it (`tcp_adv_win_scale` 1), so the window stays near [`RECEIVE_WINDOW`], as on the
/// userspace-TCP runs.
const KERNEL_RECEIVE_BUFFER: usize = 2 * RECEIVE_WINDOW;

/// Runs one variant on the real lab (needs root) with the `squarepeg` crate, on a lab of its
/// own with [`priority_bottleneck`], through the voice experiment's library call
/// (`open_library`): the sender in the server namespace sends every message with
/// `send_message` (high ones at [`Priority::HIGHEST`] in the `priority` variant), waiting
/// while the connection takes no more; the receiver in the client namespace connects and
/// records each message's arrival. Times are real; the sender does not learn
/// first-transmission times, so there is no overtaking count.
///
/// - [`Transport::Utcp`]: over the userspace TCP on TUN at both ends (`LabStack`s whose
///   connections have the sender's send buffer and the receiver's window of the simulator
///   run); the session holds one message at a time ([`UTCP_SESSION_QUEUE`]).
/// - [`Transport::KernelTcp`]: over kernel TCP; the sender's session queue is
///   [`PriorityConfig::send_buffer`], the kernel below holds about twice the
///   `TCP_NOTSENT_LOWAT` unsent plus what is in flight; the receiver's receive buffer is
///   capped (namespace sysctl `tcp_rmem`) so that the window stays near [`RECEIVE_WINDOW`].
pub fn run_lab(
    config: &PriorityConfig,
    variant: Variant,
    seed: u64,
    transport: Transport,
) -> Result<PriorityRun, VoipError> {
    let lab = start_lab(config, seed)?;
    let outcome = (|| -> Result<LabOutcome, VoipError> {
        let mut sender_config = ConnectionConfig::default();
        sender_config.session = config.sender_session(transport);
        let (library, address) = match transport {
            Transport::Utcp => {
                let (server_v4, _) = stack_addresses(&lab, Role::Server).ok_or_else(|| {
                    VoipError::Transport("no stack address on the server end".into())
                })?;
                let library = Library::Utcp {
                    sender: Box::new(attach(&lab, Role::Server, config.sender_tcp())?),
                    receiver: Box::new(attach(&lab, Role::Client, receiver_tcp())?),
                    // No message has a lifetime: nothing to replace.
                    inconsistent_retransmissions: false,
                };
                (
                    library,
                    SocketAddr::new(IpAddr::V4(server_v4), SENDER.port()),
                )
            }
            Transport::KernelTcp => {
                let rmem = format!("4096 {KERNEL_RECEIVE_BUFFER} {KERNEL_RECEIVE_BUFFER}");
                lab.client()
                    .run(|| std::fs::write("/proc/sys/net/ipv4/tcp_rmem", &rmem))?
                    .map_err(VoipError::io("capping the receiver's tcp_rmem"))?;
                if config.notsent_lowat.is_some() {
                    sender_config.notsent_lowat = config.notsent_lowat;
                    sender_config.unsent_drain = None;
                }
                let address = SocketAddr::new(lab.addresses().server(false), SENDER.port());
                (Library::Kernel, address)
            }
        };
        let call = LibraryCall {
            sender: address,
            sender_config,
            receiver_config: ConnectionConfig::default(),
            lifetime: None,
            close_limit: DRAIN * 4,
        };
        let LibraryEnds {
            sender,
            mut receiver,
        } = open_library(&lab, call, library)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(VoipError::io("building a runtime"))?;
        let epoch = Instant::now();
        let stop = epoch + config.duration;
        let written = runtime.block_on(async {
            let mut written = Vec::new();
            while Instant::now() < stop {
                let number = written.len() as u64;
                let at = Instant::now().saturating_duration_since(epoch);
                let payload = encode_payload(KIND_DATA, number, at, config.message_bytes);
                // Network-limited: this waits while the connection takes no more. The send
                // call "happens" when the session takes the message.
                sender
                    .send_waiting(payload, variant.priority(config, number))
                    .await?;
                written.push(Instant::now().saturating_duration_since(epoch));
            }
            Ok::<_, VoipError>(written)
        })?;
        let drops = sender.finish()?;
        let mut warnings = Vec::new();
        if !(drops.dropped.is_empty() && drops.replaced.is_empty()) {
            warnings.push(format!(
                "the sender dropped {} and replaced {} messages",
                drops.dropped.len(),
                drops.replaced.len()
            ));
        }
        // The sender has closed: everything delivered is waiting for us.
        let mut arrivals = Vec::new();
        let deadline = Instant::now() + DRAIN;
        while let Some((payload, at)) = receiver.receive(deadline)? {
            if let Some((KIND_DATA, number, _)) = decode_payload(&payload) {
                arrivals.push((number, at.saturating_duration_since(epoch)));
            }
        }
        Ok((written, arrivals, warnings))
    })();
    let stats = lab.teardown();
    let (written, arrivals, warnings) = outcome?;
    stats?;
    let messages = written
        .iter()
        .enumerate()
        .map(|(i, &w)| MessageOutcome {
            number: i as u64,
            high: config.is_high(i as u64),
            written: w,
            write_order: i as u64,
            transmit_order: None,
            arrival: None,
            arrival_order: None,
            deliveries: 0,
        })
        .collect();
    let mut run = PriorityRun {
        engine: Engine::Lab,
        transport,
        variant,
        seed,
        config: *config,
        messages,
        warnings,
    };
    run.add_arrivals(&arrivals);
    Ok(run)
}
