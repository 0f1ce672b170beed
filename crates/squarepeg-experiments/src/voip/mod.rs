//! The VoIP experiment: how many messages of a voice call miss their playout time over each
//! transport, and why (Hollywood §5.1-5.2, Minion §8.2).
//!
//! squarepeg's claim for real-time traffic over TCP is that only the messages the network
//! itself lost should miss their playout time: no head-of-line tail, no retransmission that
//! arrives too late to be played. This experiment measures exactly that, per message.
//!
//! # The model
//!
//! A sender hands a [`VoipConfig::message_bytes`]-byte message to the transport every
//! [`VoipConfig::interval`] ([`VoipConfig::count`] of them; by default Hollywood §5.1.2's
//! 160 bytes every 20 ms for 60 s, 3000 messages). Each message carries its number and send
//! time (the lab's 24-byte datagram header, `squarepeg_lab::sim::encode_payload`, zero-padded
//! to the message size). The receiving application records when it gets each message. For
//! message `i`:
//!
//! - transport delay = `arrival_i - send_i`;
//! - playout time `playout_i = send_i + T_rtt/2 + T_playout` (Hollywood eq. 5.1 with
//!   T_sender = 0 because `send_i` is taken after capture and encoding; T_rtt/2 is the
//!   scenario's nominal one-way propagation delay, [`Scenario::one_way_delay`]; T_playout
//!   the scenario's playout delay);
//! - buffered time = `playout_i - arrival_i` (negative: late);
//! - state: on time, late (arrived after its playout), or lost (never arrived);
//! - lost by the network: the network dropped the first transmission of some of its bytes
//!   ([`wire`]).
//!
//! # Engines
//!
//! - [`sim`]: the deterministic simulator; squarepeg's userspace TCP in standard mode
//!   (`tcp`), squarepeg session messages over it (`squarepeg`), uCOBS messages over its
//!   uTCP interface with unordered delivery (`utcp`) and also inconsistent retransmissions
//!   (`utcp-ir`), and the lab's UDP host (`udp`). Same seed, same JSON. [`demo`] runs the
//!   Hollywood scenarios over four of them (`peg demo`).
//! - [`lab`]: the real network of namespaces and the userspace link emulator; the kernel's
//!   TCP with length-prefixed records and `TCP_NODELAY` (`tcp`), the `squarepeg` crate's
//!   messages over kernel TCP (`squarepeg`), kernel UDP (`udp`), and uCOBS messages over
//!   squarepeg's userspace TCP on a TUN device at each end (`utcp`, `utcp-ir`). Sender and receiver run
//!   in one process and share CLOCK_MONOTONIC, so one-way delay is measured directly.
//!
//! Adding a transport is one implementation of [`sim::SimTransport`] or
//! [`lab::LabTransport`] listed in that engine's `transports()`.
//!
//! # Output
//!
//! [`report`]: the JSON summary (schema [`report::SCHEMA`], documented there), per-message
//! records as JSON lines, and the table; [`plot`]: Hollywood-style per-message plots and
//! latency CDFs, as SVG and PNG.

pub mod analysis;
pub mod config;
pub mod demo;
pub mod lab;
pub mod plot;
pub mod report;
pub mod sim;
pub mod wire;

use serde::Serialize;
use thiserror::Error;

pub use analysis::{Analysis, MessageRecord, MessageState, Observations, Summary, analyse};
pub use config::{SCENARIOS, Scenario, VoipConfig, scenario};

/// Why an experiment could not run.
#[derive(Debug, Error)]
pub enum VoipError {
    /// A configuration value is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// No scenario of that name.
    #[error("unknown scenario `{name}` (known: {known})")]
    UnknownScenario {
        /// The name given.
        name: String,
        /// The names known.
        known: String,
    },
    /// No transport of that name in that engine.
    #[error("unknown transport `{name}` (known: {known})")]
    UnknownTransport {
        /// The name given.
        name: String,
        /// The names known.
        known: String,
    },
    /// The simulator failed.
    #[error("simulator: {0}")]
    Sim(#[from] squarepeg_lab::sim::SimError),
    /// The network lab failed.
    #[error("network lab: {0}")]
    Net(#[from] squarepeg_lab::net::NetError),
    /// The packets seen on the wire cannot be mapped to messages.
    #[error("wire log: {0}")]
    Wire(String),
    /// A transport failed during the run.
    #[error("transport: {0}")]
    Transport(String),
    /// Reading or writing a file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Drawing a plot failed.
    #[error("plot: {0}")]
    Plot(String),
}

impl VoipError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}

/// Which engine ran an experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// The deterministic simulator (virtual time).
    Sim,
    /// The real network lab (namespaces, kernel stacks, real time).
    Lab,
}

impl Engine {
    /// `sim` or `lab`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sim => "sim",
            Engine::Lab => "lab",
        }
    }
}

/// One transport over one scenario on one engine.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The engine.
    pub engine: Engine,
    /// The scenario.
    pub scenario: Scenario,
    /// The transport's name.
    pub transport: String,
    /// What the transport is, for people.
    pub transport_description: String,
    /// The seed of the link model's random decisions.
    pub seed: u64,
    /// Records and summary.
    pub analysis: Analysis,
    /// The engine's own counters (link drops by reason, voice packets, emulator timing).
    pub engine_stats: serde_json::Value,
    /// Errors the transport reported during the run that did not stop it.
    pub warnings: Vec<String>,
}

/// Adds what the wire and the record layer say about TLS to a run's engine statistics:
/// whether the network's losses could be counted per message (not through encryption), and
/// the receiving end's record counters (records opened, of which out of order).
pub(crate) fn note_tls(
    stats: &mut serde_json::Value,
    framing: wire::Framing,
    receiver_tls: Option<&squarepeg_connection::TlsStats>,
) {
    let Some(map) = stats.as_object_mut() else {
        return;
    };
    map.insert(
        "network_losses_visible".into(),
        framing.shows_messages().into(),
    );
    if let Some(t) = receiver_tls {
        map.insert(
            "receiver_tls".into(),
            serde_json::json!({
                "records_opened": t.records_opened,
                "records_out_of_order": t.records_out_of_order,
                "bytes_out_of_order": t.bytes_out_of_order,
                "receiving_numbered": t.receiving_numbered,
            }),
        );
    }
}

impl RunResult {
    /// Whether `lost_by_network` was measured: false over TLS, whose wire does not show which
    /// message a dropped packet carried (the count is then 0, meaning unknown).
    pub fn network_losses_visible(&self) -> bool {
        self.engine_stats
            .get("network_losses_visible")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true)
    }

    /// Over TLS: records the receiver opened out of order (before the bytes ahead of them).
    pub fn records_out_of_order(&self) -> Option<u64> {
        self.engine_stats
            .get("receiver_tls")?
            .get("records_out_of_order")?
            .as_u64()
    }
}
