//! `peg demo` on the simulator: the JSON table's shape, determinism for a seed, and the
//! outcome Hollywood §5 and Minion §8.2 predict (virtual time; a 20 s call keeps CI short).

use std::time::Duration;

use serde_json::Value;
use squarepeg_experiments::voip::demo::{
    DEMO_SCHEMA, DEMO_TRANSPORTS, demo_json, demo_scenarios, run_demo,
};
use squarepeg_experiments::voip::{RunResult, VoipConfig};

/// A seed whose first 10 s lose voice packets on the downlink of both Hollywood scenarios.
const SEED: u64 = 12;

fn config(seconds: u64) -> VoipConfig {
    VoipConfig {
        drain: Duration::from_secs(3),
        ..VoipConfig::for_duration(Duration::from_secs(seconds)).expect("config")
    }
}

fn demo(seconds: u64, seed: u64) -> (VoipConfig, Vec<RunResult>) {
    let c = config(seconds);
    let runs = run_demo(&c, seed, &demo_scenarios(), &|_, _, _| {}).expect("demo runs");
    (c, runs)
}

const ROW_FIELDS: &[&str] = &[
    "scenario",
    "transport",
    "messages_sent",
    "lost_by_network",
    "delivered_late",
    "delivered_on_time",
    "never_delivered",
    "dropped_by_sender",
    "replaced_by_sender",
    "late_loss_count",
    "late_loss_rate",
];

#[test]
fn json_shape_is_stable() {
    let (c, runs) = demo(4, SEED);
    let text = serde_json::to_string(&demo_json(&c, SEED, &runs)).expect("serialise");
    let v: Value = serde_json::from_str(&text).expect("parse");
    assert_eq!(v["schema"], DEMO_SCHEMA);
    assert_eq!(v["seed"], SEED);
    assert_eq!(v["duration_s"], 4.0);
    assert_eq!(v["message_bytes"], 160);
    assert_eq!(v["interval_ms"], 20.0);
    let rows = v["rows"].as_array().expect("rows");
    let keys: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["scenario"].as_str().expect("scenario").to_owned(),
                r["transport"].as_str().expect("transport").to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = ["hollywood-70ms", "hollywood-15ms"]
        .iter()
        .flat_map(|s| {
            DEMO_TRANSPORTS
                .iter()
                .map(|t| (s.to_string(), t.to_string()))
        })
        .collect();
    assert_eq!(keys, expected);
    for row in rows {
        let obj = row.as_object().expect("row object");
        assert_eq!(obj.len(), ROW_FIELDS.len(), "{row}");
        for f in ROW_FIELDS {
            assert!(obj.contains_key(*f), "row lacks `{f}`: {row}");
        }
        let n = |f: &str| row[f].as_u64().unwrap_or_else(|| panic!("{f} is a count"));
        assert_eq!(n("messages_sent"), 200);
        assert_eq!(
            n("delivered_on_time") + n("delivered_late") + n("never_delivered"),
            n("messages_sent")
        );
        assert_eq!(
            n("late_loss_count"),
            n("delivered_late") + n("never_delivered")
        );
        assert!(row["late_loss_rate"].is_f64());
    }
}

#[test]
fn same_seed_same_table() {
    let (c, a) = demo(5, SEED);
    let (_, b) = demo(5, SEED);
    assert_eq!(demo_json(&c, SEED, &a), demo_json(&c, SEED, &b));
    let arrivals = |runs: &[RunResult]| -> Vec<Vec<Option<Duration>>> {
        runs.iter()
            .map(|r| r.analysis.records.iter().map(|m| m.arrival).collect())
            .collect()
    };
    assert_eq!(arrivals(&a), arrivals(&b));
}

#[test]
fn unordered_delivery_removes_the_head_of_line_tail() {
    let (_, runs) = demo(20, SEED);
    let get = |scenario: &str, transport: &str| {
        &runs
            .iter()
            .find(|r| r.scenario.name == scenario && r.transport == transport)
            .unwrap_or_else(|| panic!("{transport} over {scenario}"))
            .analysis
            .summary
    };
    // Hollywood §5.1.3: with 30 ms of playout delay on a 70 ms RTT no retransmission is in
    // time. Standard TCP misses the lost messages and the messages held behind them; with
    // unordered delivery only the messages whose first transmission the network dropped
    // (or that the sender dropped or replaced instead) miss their playout.
    let udp = get("hollywood-70ms", "udp");
    let tcp = get("hollywood-70ms", "tcp");
    assert!(udp.lost_by_network >= 2, "the seed loses voice packets");
    assert_eq!(udp.late_loss_count, udp.lost_by_network);
    assert!(tcp.missed_not_lost_by_network >= 1, "a head-of-line tail");
    for transport in ["utcp", "utcp-ir"] {
        let s = get("hollywood-70ms", transport);
        let network_losses = s.lost_by_network;
        assert_eq!(
            network_losses, udp.lost_by_network,
            "{transport}: same link seed"
        );
        assert_eq!(s.missed_not_lost_by_network, 0, "{transport}: no tail");
        assert!(
            s.late_loss_count <= network_losses + s.dropped_by_sender,
            "{transport}: {} late losses for {network_losses} network losses",
            s.late_loss_count
        );
        assert!(s.late_loss_count < tcp.late_loss_count, "{transport}");
        assert_eq!(s.duplicate_arrivals + s.unknown_arrivals, 0);
    }
    // No useless retransmissions (Hollywood §4.2): with inconsistent retransmissions every
    // retransmission of a lost message, which would arrive after its playout time, carries a
    // live message instead; without them, none does.
    let ir = get("hollywood-70ms", "utcp-ir");
    assert_eq!(ir.replaced_by_sender, ir.lost_by_network);
    assert_eq!(get("hollywood-70ms", "utcp").replaced_by_sender, 0);
    // Eq. 5.4: with 110 ms of playout delay on a 15 ms RTT retransmissions are in time, and
    // nothing may be worse than standard TCP.
    let tcp = get("hollywood-15ms", "tcp");
    assert_eq!(tcp.late_loss_count, 0);
    for transport in ["utcp", "utcp-ir"] {
        let s = get("hollywood-15ms", transport);
        assert!(s.late_loss_count <= tcp.late_loss_count, "{transport}");
        assert_eq!(s.never_delivered, 0, "{transport}: reliable");
        assert_eq!(
            s.replaced_by_sender, 0,
            "{transport}: retransmissions are useful"
        );
    }
}

#[test]
fn tls_transports_deliver_like_their_cleartext_counterparts() {
    let (_, runs) = demo(20, SEED);
    eprintln!("{}", squarepeg_experiments::voip::demo::demo_table(&runs));
    let get = |scenario: &str, transport: &str| {
        runs.iter()
            .find(|r| r.scenario.name == scenario && r.transport == transport)
            .unwrap_or_else(|| panic!("{transport} over {scenario}"))
    };
    for scenario in ["hollywood-70ms", "hollywood-15ms"] {
        for transport in ["tls", "utls", "utls-ir"] {
            let r = get(scenario, transport);
            let s = &r.analysis.summary;
            // Encrypted: the wire does not say which message a dropped packet carried.
            assert!(!r.network_losses_visible(), "{transport}");
            assert!(r.warnings.is_empty(), "{transport}: {:?}", r.warnings);
            assert_eq!(s.duplicate_arrivals + s.unknown_arrivals, 0, "{transport}");
            assert!(
                s.delivered_on_time > s.messages_sent * 9 / 10,
                "{transport} over {scenario}: {s:?}"
            );
        }
        // Out of order over uTCP as in cleartext: the same late losses as `utcp`.
        let utcp = &get(scenario, "utcp").analysis.summary;
        let utls = &get(scenario, "utls").analysis.summary;
        assert_eq!(utls.late_loss_count, utcp.late_loss_count, "{scenario}");
        // Inconsistent retransmissions inside TLS (padding records, docs/wire.md §5.1): the
        // same late losses as in cleartext.
        let utcp_ir = &get(scenario, "utcp-ir").analysis.summary;
        let ir = &get(scenario, "utls-ir").analysis.summary;
        assert_eq!(ir.late_loss_count, utcp_ir.late_loss_count, "{scenario}");
    }
    // Hollywood-70ms: the network drops voice packets; the records behind them are opened
    // out of order, so `utls` has no head-of-line tail and misses fewer than in-order `tls`.
    let utls = get("hollywood-70ms", "utls");
    let tls = get("hollywood-70ms", "tls");
    assert!(
        utls.records_out_of_order().is_some_and(|n| n > 0),
        "records delivered out of order: {}",
        utls.engine_stats
    );
    assert_eq!(
        tls.records_out_of_order(),
        Some(0),
        "in order over a byte stream"
    );
    assert!(
        utls.analysis.summary.late_loss_count < tls.analysis.summary.late_loss_count,
        "utls {} vs tls {}",
        utls.analysis.summary.late_loss_count,
        tls.analysis.summary.late_loss_count
    );
    // Hollywood-15ms: retransmissions are in time over every reliable transport.
    for transport in ["tls", "utls", "utls-ir"] {
        let s = &get("hollywood-15ms", transport).analysis.summary;
        assert_eq!(s.late_loss_count, 0, "{transport}");
    }
}
