//! Helpers shared by the VoIP tests.
#![allow(dead_code)]

use serde_json::Value;

/// Every field of schema `squarepeg.voip/1` (report.rs documents them). A test fails if one
/// disappears: readers of summary.json depend on them.
pub const SUMMARY_FIELDS: &[&str] = &["schema", "config", "runs"];
pub const CONFIG_FIELDS: &[&str] = &[
    "message_bytes",
    "interval_ms",
    "count",
    "lead_in_ms",
    "drain_ms",
];
pub const RUN_FIELDS: &[&str] = &[
    "engine",
    "scenario",
    "transport",
    "transport_description",
    "seed",
    "messages_sent",
    "refused_by_sender",
    "lost_by_network",
    "dropped_by_sender",
    "replaced_by_sender",
    "delivered_on_time",
    "delivered_late",
    "never_delivered",
    "late_loss_count",
    "late_loss_rate",
    "missed_not_lost_by_network",
    "lost_by_network_recovered",
    "duplicate_arrivals",
    "unknown_arrivals",
    "latency_ms",
    "burst_lengths",
    "longest_burst",
    "records_file",
    "plots",
    "engine_stats",
    "warnings",
];
pub const SCENARIO_FIELDS: &[&str] = &[
    "name",
    "description",
    "bottleneck",
    "playout_delay_ms",
    "one_way_delay_ms",
    "playout_offset_ms",
    "bulk_flows",
];
pub const LATENCY_FIELDS: &[&str] = &["p50", "p90", "p99", "p99_9", "max"];
pub const RECORD_FIELDS: &[&str] = &[
    "number",
    "send_ms",
    "arrival_ms",
    "transport_delay_ms",
    "buffered_ms",
    "playout_ms",
    "state",
    "lost_by_network",
    "dropped_by_sender",
    "replaced_by_sender",
];

fn has_all(value: &Value, fields: &[&str], what: &str) {
    for f in fields {
        assert!(value.get(f).is_some(), "{what} lacks field `{f}`: {value}");
    }
}

/// Checks the shape of a summary document: every field, the right types where it matters.
pub fn check_summary_shape(summary: &Value) {
    has_all(summary, SUMMARY_FIELDS, "summary");
    assert_eq!(summary["schema"], "squarepeg.voip/1");
    has_all(&summary["config"], CONFIG_FIELDS, "config");
    let runs = summary["runs"].as_array().expect("runs is an array");
    assert!(!runs.is_empty());
    for run in runs {
        has_all(run, RUN_FIELDS, "run");
        has_all(&run["scenario"], SCENARIO_FIELDS, "scenario");
        has_all(
            &run["scenario"]["bottleneck"],
            &["down", "up"],
            "bottleneck",
        );
        has_all(&run["latency_ms"], LATENCY_FIELDS, "latency_ms");
        assert!(run["burst_lengths"].is_object());
        assert!(run["plots"].is_array());
        for counter in [
            "messages_sent",
            "lost_by_network",
            "delivered_on_time",
            "delivered_late",
            "never_delivered",
            "late_loss_count",
        ] {
            assert!(
                run[counter].is_u64(),
                "{counter} is a count: {}",
                run[counter]
            );
        }
        let n = |k: &str| run[k].as_u64().expect("count");
        assert_eq!(
            n("delivered_on_time") + n("delivered_late") + n("never_delivered"),
            n("messages_sent")
        );
        assert_eq!(
            n("late_loss_count"),
            n("delivered_late") + n("never_delivered")
        );
    }
}

/// Checks one JSON-lines record.
pub fn check_record_shape(line: &str) {
    let v: Value = serde_json::from_str(line).expect("a record is JSON");
    has_all(&v, RECORD_FIELDS, "record");
    assert!(matches!(
        v["state"].as_str(),
        Some("on_time" | "late" | "lost")
    ));
}
