//! `peg demo`: the VoIP experiment in its two Hollywood scenarios (§5.1: RTT 70 ms with
//! 30 ms of playout delay, and RTT 15 ms with 110 ms; 8/1 Mbit/s, 0.1 % loss) on the
//! deterministic simulator, over standard TCP, unordered delivery (uTCP), unordered
//! delivery with inconsistent retransmissions, and UDP, and over TLS 1.3: in order (`tls`)
//! and out of order (`utls`, `utls-ir`).
//!
//! # JSON, schema `squarepeg.demo/1`
//!
//! ```text
//! {
//!   "schema": "squarepeg.demo/1",
//!   "seed": 1, "duration_s": 60.0, "message_bytes": 160, "interval_ms": 20.0,
//!   "rows": [ {
//!     "scenario": "hollywood-70ms",
//!     "transport": "tcp" | "utcp" | "utcp-ir" | "udp" | "tls" | "utls" | "utls-ir",
//!     "messages_sent", "lost_by_network", "delivered_late", "delivered_on_time",
//!     "never_delivered", "dropped_by_sender", "replaced_by_sender",
//!     "late_loss_count", "late_loss_rate"
//!   }, … ]
//! }
//! ```
//!
//! Counts as in [`super::report`]: every message sent is on time, late or never delivered;
//! `late_loss_count = delivered_late + never_delivered`; `lost_by_network` counts messages
//! whose first transmission the network dropped (also those whose late retransmission the
//! sender replaced, which `replaced_by_sender` counts). Over TLS the wire does not show
//! which message a packet carried: `lost_by_network` is then `null` (the table prints `-`).

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::analysis::ms;
use super::config::{Scenario, VoipConfig, hollywood_15ms, hollywood_70ms};
use super::{RunResult, VoipError, sim};

/// The schema name and version of the demo's JSON.
pub const DEMO_SCHEMA: &str = "squarepeg.demo/1";

/// The transports compared, in table order: standard TCP, unordered delivery, unordered
/// delivery with inconsistent retransmissions, UDP; then the same over TLS 1.3: squarepeg
/// messages in records read in order (`tls`), numbered records opened out of order
/// (`utls`), and those with inconsistent retransmissions asked for (`utls-ir`: the same as
/// `utls` until the TCP has a padder that writes TLS records).
pub const DEMO_TRANSPORTS: &[&str] = &["tcp", "utcp", "utcp-ir", "udp", "tls", "utls", "utls-ir"];

/// Hollywood's two scenarios, the one where TCP's retransmissions are late first.
pub fn demo_scenarios() -> Vec<Scenario> {
    vec![hollywood_70ms(), hollywood_15ms()]
}

/// Runs every scenario × transport of the demo ([`demo_scenarios`], or a user's path);
/// `progress(done, total, label)` is called before each run and once at the end.
pub fn run_demo(
    config: &VoipConfig,
    seed: u64,
    scenarios: &[Scenario],
    progress: &dyn Fn(usize, usize, &str),
) -> Result<Vec<RunResult>, VoipError> {
    let total = scenarios.len() * DEMO_TRANSPORTS.len();
    let mut runs = Vec::with_capacity(total);
    for scenario in scenarios {
        for &name in DEMO_TRANSPORTS {
            progress(runs.len(), total, &format!("{name} over {}", scenario.name));
            let transport = sim::transport(name)?;
            runs.push(sim::run(scenario, transport.as_ref(), config, seed)?);
        }
    }
    progress(total, total, "done");
    Ok(runs)
}

/// The demo's table as JSON (schema [`DEMO_SCHEMA`]).
pub fn demo_json(config: &VoipConfig, seed: u64, runs: &[RunResult]) -> Value {
    let rows: Vec<Value> = runs
        .iter()
        .map(|r| {
            let s = &r.analysis.summary;
            json!({
                "scenario": r.scenario.name,
                "transport": r.transport,
                "messages_sent": s.messages_sent,
                "lost_by_network": r.network_losses_visible().then_some(s.lost_by_network),
                "delivered_late": s.delivered_late,
                "delivered_on_time": s.delivered_on_time,
                "never_delivered": s.never_delivered,
                "dropped_by_sender": s.dropped_by_sender,
                "replaced_by_sender": s.replaced_by_sender,
                "late_loss_count": s.late_loss_count,
                "late_loss_rate": s.late_loss_rate,
            })
        })
        .collect();
    json!({
        "schema": DEMO_SCHEMA,
        "seed": seed,
        "duration_s": config.duration().as_secs_f64(),
        "message_bytes": config.message_bytes,
        "interval_ms": ms(config.interval),
        "rows": rows,
    })
}

/// The late-loss table for people.
pub fn demo_table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    // As wide as the longest scenario name (a user's path is `custom-…`).
    let w = runs
        .iter()
        .map(|r| r.scenario.name.len())
        .max()
        .unwrap_or(0)
        .max(16);
    let _ = writeln!(
        out,
        "{:<w$} {:<8} {:>6} {:>9} {:>6} {:>6} {:>8} {:>9} {:>10} {:>8}",
        "scenario",
        "transport",
        "sent",
        "net lost",
        "late",
        "never",
        "on time",
        "sender dr",
        "late-loss",
        "p99 ms",
    );
    for r in runs {
        let s = &r.analysis.summary;
        let p99 = s
            .latency_ms
            .p99
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        let net_lost = if r.network_losses_visible() {
            s.lost_by_network.to_string()
        } else {
            "-".to_owned()
        };
        let _ = writeln!(
            out,
            "{:<w$} {:<8} {:>6} {:>9} {:>6} {:>6} {:>8} {:>9} {:>9.2}% {:>8}",
            r.scenario.name,
            r.transport,
            s.messages_sent,
            net_lost,
            s.delivered_late,
            s.never_delivered,
            s.delivered_on_time,
            s.dropped_by_sender + s.replaced_by_sender,
            s.late_loss_rate * 100.0,
            p99,
        );
    }
    out
}
