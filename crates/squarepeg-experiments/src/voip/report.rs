//! The experiment's outputs: the JSON summary, per-message records and the table.
//!
//! # JSON summary, schema `squarepeg.voip/1`
//!
//! `summary.json` is one object; fields are only ever added within a schema version
//! (a test pins every field below):
//!
//! ```text
//! {
//!   "schema": "squarepeg.voip/1",
//!   "config": { "message_bytes": 160, "interval_ms": 20.0, "count": 3000,
//!               "lead_in_ms": 1000.0, "drain_ms": 5000.0 },
//!   "runs": [ {
//!     "engine": "sim" | "lab",
//!     "scenario": { "name", "description", "bottleneck": { "down", "up" } (link specs),
//!                   "playout_delay_ms", "one_way_delay_ms", "playout_offset_ms",
//!                   "bulk_flows" (0 without contention) },
//!     "transport", "transport_description", "seed",
//!     "messages_sent", "refused_by_sender", "lost_by_network",
//!     "dropped_by_sender", "replaced_by_sender",
//!     "delivered_on_time", "delivered_late", "never_delivered",
//!     "late_loss_count", "late_loss_rate",
//!     "missed_not_lost_by_network", "lost_by_network_recovered",
//!     "duplicate_arrivals", "unknown_arrivals",
//!     "latency_ms": { "p50", "p90", "p99", "p99_9", "max" }   (null if none delivered),
//!     "burst_lengths": { "<length>": <runs>, … }, "longest_burst",
//!     "records_file": "records/<engine>-<scenario>-<transport>.jsonl",
//!     "plots": [ "plots/….svg", "plots/….png", … ],
//!     "engine_stats": { … engine-specific counters … },
//!     "warnings": [ "…" ]
//!   }, … ]
//! }
//! ```
//!
//! Definitions: `late_loss_count = delivered_late + never_delivered` (every message that
//! missed its playout); `late_loss_rate = late_loss_count / messages_sent`;
//! `missed_not_lost_by_network` counts messages that missed their playout although the
//! network delivered their first transmission (head-of-line blocking, sender delay);
//! `lost_by_network` counts messages whose first transmission the network dropped, also
//! those whose retransmission the sender then replaced in an inconsistent retransmission
//! (Hollywood §4.2), which `replaced_by_sender` counts — over TLS (`engine_stats`
//! `network_losses_visible: false`) the wire does not show which message a packet carried,
//! so it and `missed_not_lost_by_network` are not measured (0, and `-` in the table), and
//! `engine_stats.receiver_tls` has the receiver's record counters;
//! `dropped_by_sender` counts messages accepted but dropped unsent when their deadline
//! passed; latency is the transport delay of delivered messages, nearest-rank percentiles; a burst
//! is a maximal run of consecutive message numbers that missed their playout (Minion §8.2).
//!
//! # Records
//!
//! `records/<engine>-<scenario>-<transport>.jsonl`: one JSON object per message, by number:
//! `{"number", "send_ms", "arrival_ms", "transport_delay_ms", "buffered_ms", "playout_ms",
//! "state": "on_time" | "late" | "lost", "lost_by_network", "dropped_by_sender",
//! "replaced_by_sender"}`; times in milliseconds from the
//! run's start (`null` when there is none: never sent, never arrived).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::analysis::{MessageRecord, ms};
use super::config::VoipConfig;
use super::{RunResult, VoipError};

/// The schema name and version of `summary.json`.
pub const SCHEMA: &str = "squarepeg.voip/1";

/// Serialises a duration as milliseconds.
pub fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(ms(*d))
}

/// A run's file stem: `<engine>-<scenario>-<transport>`.
pub fn stem(run: &RunResult) -> String {
    format!(
        "{}-{}-{}",
        run.engine.name(),
        run.scenario.name,
        run.transport
    )
}

/// The summary of one run as JSON, with the paths of its records and plots.
pub fn run_json(run: &RunResult, records_file: Option<&str>, plots: &[String]) -> Value {
    let s = &run.scenario;
    let mut v = json!({
        "engine": run.engine,
        "scenario": {
            "name": s.name,
            "description": s.description,
            "bottleneck": {
                "down": s.bottleneck.right_to_left.to_string(),
                "up": s.bottleneck.left_to_right.to_string(),
            },
            "playout_delay_ms": ms(s.playout_delay),
            "one_way_delay_ms": ms(s.one_way_delay()),
            "playout_offset_ms": ms(s.playout_offset()),
            "bulk_flows": s.bulk.map_or(0, |b| b.flows),
        },
        "transport": run.transport,
        "transport_description": run.transport_description,
        "seed": run.seed,
    });
    if let (Value::Object(map), Ok(Value::Object(summary))) =
        (&mut v, serde_json::to_value(&run.analysis.summary))
    {
        map.extend(summary);
        map.insert("records_file".into(), json!(records_file));
        map.insert("plots".into(), json!(plots));
        map.insert("engine_stats".into(), run.engine_stats.clone());
        map.insert("warnings".into(), json!(run.warnings));
    }
    v
}

/// The whole summary document.
pub fn summary_json(config: &VoipConfig, runs: &[Value]) -> Value {
    json!({
        "schema": SCHEMA,
        "config": config,
        "runs": runs,
    })
}

/// One record as JSON.
pub fn record_json(r: &MessageRecord) -> Value {
    json!({
        "number": r.number,
        "send_ms": r.send.map(ms),
        "arrival_ms": r.arrival.map(ms),
        "transport_delay_ms": r.transport_delay().map(ms),
        "buffered_ms": r.buffered_ns().map(|ns| ns as f64 / 1e6),
        "playout_ms": ms(r.playout),
        "state": r.state,
        "lost_by_network": r.lost_by_network,
        "dropped_by_sender": r.dropped_by_sender,
        "replaced_by_sender": r.replaced_by_sender,
    })
}

/// Writes a run's records as JSON lines.
pub fn write_records(path: &Path, run: &RunResult) -> Result<(), VoipError> {
    let file = std::fs::File::create(path)
        .map_err(VoipError::io(format!("creating {}", path.display())))?;
    let mut out = std::io::BufWriter::new(file);
    for r in &run.analysis.records {
        writeln!(out, "{}", record_json(r))
            .map_err(VoipError::io(format!("writing {}", path.display())))?;
    }
    out.flush()
        .map_err(VoipError::io(format!("writing {}", path.display())))
}

/// What [`write_outputs`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The summary document (also in `dir/summary.json`).
    pub summary: Value,
    /// Every file written.
    pub files: Vec<PathBuf>,
}

/// Writes `summary.json`, the records and the plots of `runs` into `dir`.
pub fn write_outputs(
    dir: &Path,
    config: &VoipConfig,
    runs: &[RunResult],
    plots: bool,
) -> Result<Written, VoipError> {
    let records_dir = dir.join("records");
    let plots_dir = dir.join("plots");
    for d in [&records_dir, &plots_dir] {
        std::fs::create_dir_all(d).map_err(VoipError::io(format!("creating {}", d.display())))?;
    }
    let mut files = Vec::new();
    let mut run_values = Vec::new();
    let mut run_plots: Vec<Vec<String>> = vec![Vec::new(); runs.len()];
    if plots {
        for (i, run) in runs.iter().enumerate() {
            for f in super::plot::per_message(&plots_dir, run)? {
                run_plots[i].push(relative(dir, &f));
                files.push(f);
            }
        }
        for f in super::plot::cdfs(&plots_dir, runs)? {
            files.push(f);
        }
        files.extend(super::plot::tails(&plots_dir, runs)?);
    }
    for (i, run) in runs.iter().enumerate() {
        let records = records_dir.join(format!("{}.jsonl", stem(run)));
        write_records(&records, run)?;
        let rel = relative(dir, &records);
        files.push(records);
        run_values.push(run_json(run, Some(&rel), &run_plots[i]));
    }
    let summary = summary_json(config, &run_values);
    let path = dir.join("summary.json");
    let text = serde_json::to_string_pretty(&summary)
        .map_err(|e| VoipError::Wire(format!("serialising the summary: {e}")))?;
    std::fs::write(&path, text + "\n")
        .map_err(VoipError::io(format!("writing {}", path.display())))?;
    files.push(path);
    Ok(Written { summary, files })
}

fn relative(dir: &Path, path: &Path) -> String {
    path.strip_prefix(dir)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

/// The table printed after a run: one line per scenario and transport.
pub fn table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<4} {:<18} {:<10} {:>6} {:>9} {:>6} {:>6} {:>8} {:>10} {:>11} {:>9} {:>7}",
        "eng",
        "scenario",
        "transport",
        "sent",
        "net lost",
        "late",
        "never",
        "on time",
        "late-loss",
        "beyond net",
        "p99 ms",
        "burst"
    );
    for r in runs {
        let s = &r.analysis.summary;
        let p99 = s
            .latency_ms
            .p99
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        // Over TLS the wire does not show the messages: the network's share is unknown.
        let (net_lost, beyond_net) = if r.network_losses_visible() {
            (
                s.lost_by_network.to_string(),
                s.missed_not_lost_by_network.to_string(),
            )
        } else {
            ("-".to_owned(), "-".to_owned())
        };
        let _ = writeln!(
            out,
            "{:<4} {:<18} {:<10} {:>6} {:>9} {:>6} {:>6} {:>8} {:>9.2}% {:>11} {:>9} {:>7}",
            r.engine.name(),
            r.scenario.name,
            r.transport,
            s.messages_sent,
            net_lost,
            s.delivered_late,
            s.never_delivered,
            s.delivered_on_time,
            s.late_loss_rate * 100.0,
            beyond_net,
            p99,
            s.longest_burst,
        );
    }
    out
}
