//! The VoIP experiment on the simulator, end to end, for every transport on a shortened
//! call: the properties the model must have (Hollywood §5.1-5.2), determinism,
//! and the stability of the JSON schema.

mod common;

use std::time::Duration;

use squarepeg_experiments::voip::analysis::ms;
use squarepeg_experiments::voip::config::{hollywood_15ms, hollywood_70ms, minion_contention};
use squarepeg_experiments::voip::{MessageState, RunResult, Scenario, VoipConfig, report, sim};

/// A seed whose first 10 s lose two voice packets on the downlink of both Hollywood
/// scenarios (the simulator is deterministic, so this is a fixed fact of the seed).
const SEED: u64 = 12;

fn config(seconds: u64) -> VoipConfig {
    VoipConfig {
        drain: Duration::from_secs(3),
        ..VoipConfig::for_duration(Duration::from_secs(seconds)).expect("config")
    }
}

fn run(scenario: &Scenario, transport: &str, seed: u64, seconds: u64) -> RunResult {
    let t = sim::transport(transport).expect("transport");
    sim::run(scenario, t.as_ref(), &config(seconds), seed).expect("run")
}

/// UDP never retransmits: exactly the network's losses miss their playout, and nothing
/// arrives later than the path's delay (propagation plus one packet's transmission).
fn check_udp(r: &RunResult) {
    let s = &r.analysis.summary;
    assert!(
        s.lost_by_network >= 1,
        "{}: the seed loses packets",
        r.scenario.name
    );
    assert_eq!(s.delivered_late, 0);
    assert_eq!(s.never_delivered, s.lost_by_network);
    assert_eq!(s.late_loss_count, s.lost_by_network);
    assert_eq!(s.missed_not_lost_by_network, 0);
    for rec in &r.analysis.records {
        assert_eq!(rec.state == MessageState::Lost, rec.lost_by_network);
    }
    let max = s.latency_ms.max.expect("delivered");
    let bound = ms(r.scenario.playout_offset());
    assert!(
        max < bound,
        "{max} ms is beyond the playout offset {bound} ms"
    );
    assert!(max >= ms(r.scenario.one_way_delay()));
}

/// TCP is reliable: every message arrives, none twice.
fn check_reliable(r: &RunResult) {
    let s = &r.analysis.summary;
    assert_eq!(
        s.never_delivered, 0,
        "{} over {}",
        r.transport, r.scenario.name
    );
    assert_eq!(s.delivered_on_time + s.delivered_late, s.messages_sent);
    assert_eq!(s.duplicate_arrivals + s.unknown_arrivals, 0);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn hollywood_scenarios_every_transport() {
    for scenario in [hollywood_15ms(), hollywood_70ms()] {
        let udp = run(&scenario, "udp", SEED, 10);
        check_udp(&udp);
        for transport in ["tcp", "squarepeg"] {
            let r = run(&scenario, transport, SEED, 10);
            check_reliable(&r);
            let s = &r.analysis.summary;
            assert_eq!(s.messages_sent, 500);
            // The same link seed drops the same voice packets whatever the transport.
            assert_eq!(s.lost_by_network, udp.analysis.summary.lost_by_network);
            if scenario.name == "hollywood-70ms" {
                // Hollywood §5.1.3 / eq. 5.6-5.7: T_playout (30 ms) < T_rtt + 3·T_framing
                // (130 ms), so every retransmission is late and drags a head-of-line tail
                // of messages that arrived in time but were held.
                assert!(s.late_loss_count >= s.lost_by_network);
                assert_eq!(s.lost_by_network_recovered, 0);
                assert!(s.missed_not_lost_by_network >= 1, "a head-of-line tail");
                assert!(s.longest_burst >= 2);
            } else {
                // Eq. 5.4: 15 + 80 ms <= 110 ms: retransmissions arrive in time.
                assert_eq!(s.late_loss_count, 0, "{transport}");
                assert_eq!(s.lost_by_network_recovered, s.lost_by_network);
            }
        }
    }
}

#[test]
fn contention_every_transport() {
    let scenario = minion_contention();
    let udp = run(&scenario, "udp", 1, 10);
    check_udp(&udp);
    for transport in ["tcp", "squarepeg"] {
        let r = run(&scenario, transport, 1, 10);
        check_reliable(&r);
        let s = &r.analysis.summary;
        assert!(s.lost_by_network >= 1, "bulk flows overflow the queue");
        assert!(s.late_loss_count >= s.lost_by_network);
        let engine = &r.engine_stats["down"];
        assert_eq!(
            engine["dropped_random_loss"], 0,
            "losses come from contention only"
        );
        assert!(engine["dropped_queue_full"].as_u64().expect("count") > 0);
    }
}

#[test]
fn same_seed_same_json() {
    let scenario = hollywood_70ms();
    for transport in ["udp", "tcp", "squarepeg"] {
        let a = run(&scenario, transport, SEED, 5);
        let b = run(&scenario, transport, SEED, 5);
        assert_eq!(
            report::run_json(&a, None, &[]),
            report::run_json(&b, None, &[]),
            "{transport}"
        );
        let records = |r: &RunResult| -> Vec<String> {
            r.analysis
                .records
                .iter()
                .map(|x| report::record_json(x).to_string())
                .collect()
        };
        assert_eq!(records(&a), records(&b));
    }
    // And a different seed is a different run.
    let c = run(&scenario, "udp", SEED + 1, 5);
    let d = run(&scenario, "udp", SEED, 5);
    assert_ne!(
        report::run_json(&c, None, &[])["engine_stats"],
        report::run_json(&d, None, &[])["engine_stats"]
    );
}

#[test]
fn outputs_keep_their_schema() {
    let dir = std::env::temp_dir().join(format!("sqpg-voip-schema-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = config(2);
    let runs: Vec<RunResult> = ["udp", "tcp"]
        .iter()
        .map(|t| run(&hollywood_70ms(), t, SEED, 2))
        .collect();
    let written = report::write_outputs(&dir, &cfg, &runs, true).expect("write");
    let text = std::fs::read_to_string(dir.join("summary.json")).expect("summary.json");
    let summary: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(summary, written.summary);
    common::check_summary_shape(&summary);
    for run in summary["runs"].as_array().expect("runs") {
        let records = dir.join(run["records_file"].as_str().expect("path"));
        let lines = std::fs::read_to_string(&records).expect("records");
        assert_eq!(lines.lines().count(), 100);
        lines.lines().for_each(common::check_record_shape);
        let plots = run["plots"].as_array().expect("plots");
        assert_eq!(plots.len(), 4, "delay and zoom, SVG and PNG");
        for p in plots {
            let path = dir.join(p.as_str().expect("path"));
            let bytes = std::fs::read(&path).expect("plot exists");
            if path.extension().is_some_and(|e| e == "png") {
                assert_eq!(&bytes[1..4], b"PNG");
            } else {
                assert!(bytes.starts_with(b"<svg") || bytes.starts_with(b"<?xml"));
            }
        }
    }
    assert!(dir.join("plots/sim-hollywood-70ms-cdf.png").exists());
    assert!(dir.join("plots/sim-hollywood-70ms-cdf.svg").exists());
    let table = report::table(&runs);
    assert_eq!(table.lines().count(), 3);
    assert!(table.contains("hollywood-70ms"));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// The TLS transports on a scenario with losses: every message arrives once (reliable; with
/// inconsistent retransmissions, replaced ones may not), the records of `utls`/`utls-ir` are
/// opened out of order and they miss what `utcp`/`utcp-ir` miss, and the in-order `tls`
/// opens none out of order.
#[test]
fn tls_transports_are_reliable_and_utls_opens_records_out_of_order() {
    let scenario = hollywood_70ms();
    let utcp = run(&scenario, "utcp", SEED, 10);
    let utcp_ir = run(&scenario, "utcp-ir", SEED, 10);
    for transport in ["tls", "utls", "utls-ir"] {
        let r = run(&scenario, transport, SEED, 10);
        if transport != "utls-ir" {
            // With inconsistent retransmissions a replaced message may never arrive.
            check_reliable(&r);
        }
        assert!(!r.network_losses_visible(), "{transport}");
        let out_of_order = r.records_out_of_order().expect("receiver TLS stats");
        if transport == "tls" {
            assert_eq!(out_of_order, 0, "a byte stream opens records in order");
        } else {
            assert!(out_of_order > 0, "{transport}: {}", r.engine_stats);
            // As in cleartext: `utls` like `utcp`, `utls-ir` like `utcp-ir`.
            let cleartext = if transport == "utls-ir" {
                &utcp_ir
            } else {
                &utcp
            };
            assert_eq!(
                r.analysis.summary.late_loss_count, cleartext.analysis.summary.late_loss_count,
                "{transport}"
            );
        }
    }
}

/// A path that reorders and duplicates packets (explicit reordering, 1 % held back 8 ms; 1 %
/// duplicated): the wire analysis matches the packets by content, so every transport gets a
/// result, and the network's losses are still counted exactly (UDP misses what it lost).
#[test]
fn a_path_that_reorders_and_duplicates_is_measured() {
    let mut scenario = hollywood_70ms();
    scenario.name = "hollywood-70ms-reordering".into();
    for link in [
        &mut scenario.bottleneck.left_to_right,
        &mut scenario.bottleneck.right_to_left,
    ] {
        *link = link
            .clone()
            .with_reorder(0.01, Duration::from_millis(8))
            .with_duplicate(0.01);
    }
    let udp = run(&scenario, "udp", SEED, 10);
    let s = &udp.analysis.summary;
    assert_eq!(s.never_delivered, s.lost_by_network);
    assert!(s.duplicate_arrivals > 0, "the path duplicated: {s:?}");
    for transport in ["tcp", "utcp", "utcp-ir"] {
        let t = sim::transport(transport).expect("transport");
        let r = sim::run(&scenario, t.as_ref(), &config(10), SEED)
            .unwrap_or_else(|e| panic!("{transport} over a reordering path: {e}"));
        let s = &r.analysis.summary;
        assert!(s.lost_by_network >= 1, "{transport}: {s:?}");
        if transport != "utcp-ir" {
            assert_eq!(s.never_delivered, 0, "{transport}");
        }
    }
}

/// Issue 14, item 2: with delay jitter that keeps order (RTT 40 ms ± 10 ms each way, 0.2 %
/// loss, 60 ms playout, 60 s calls), inconsistent retransmissions must not discard messages
/// that would have arrived in time: on every seed `utcp-ir` misses no more playouts than
/// `utcp` (with the old arrival estimate, seeds 22, 28 and 30 missed one more).
#[test]
fn inconsistent_retransmissions_under_jitter_never_miss_more_than_utcp() {
    use squarepeg_lab::model::{Jitter, JitterDistribution};
    let mut scenario = hollywood_70ms();
    scenario.name = "jitter-40ms".into();
    scenario.playout_delay = Duration::from_millis(60);
    scenario.bottleneck = squarepeg_lab::model::presets::hollywood_adsl(Duration::from_millis(40));
    for link in [
        &mut scenario.bottleneck.left_to_right,
        &mut scenario.bottleneck.right_to_left,
    ] {
        *link = link.clone().with_loss(0.002).with_jitter_config(Jitter {
            amount: Duration::from_millis(10),
            distribution: JitterDistribution::Uniform,
            preserve_order: true,
        });
    }
    let mut worse = Vec::new();
    for seed in 1..=40 {
        let utcp = run(&scenario, "utcp", seed, 60);
        let ir = run(&scenario, "utcp-ir", seed, 60);
        let (a, b) = (
            utcp.analysis.summary.late_loss_count,
            ir.analysis.summary.late_loss_count,
        );
        eprintln!("seed {seed}: utcp {a}, utcp-ir {b}");
        if b > a {
            worse.push((seed, a, b));
        }
    }
    assert!(worse.is_empty(), "utcp-ir missed more than utcp: {worse:?}");
}

/// Issue 14, item 1: RTT 70 ms, 30 ms playout, Gilbert-Elliott burst loss in both
/// directions (mean burst 3 packets, 1 % of packets lost overall), no other loss.
fn bursty_70ms() -> Scenario {
    use squarepeg_lab::model::GilbertElliott;
    let mut scenario = hollywood_70ms();
    scenario.name = "bursty-70ms".into();
    // Mean burst 1/r = 3 packets; p/(p + r) = 1 % of packets in Bad, all of them lost.
    let r = 1.0 / 3.0;
    let ge = GilbertElliott::new(0.01 * r / 0.99, r);
    for link in [
        &mut scenario.bottleneck.left_to_right,
        &mut scenario.bottleneck.right_to_left,
    ] {
        *link = link.clone().with_loss(0.0).with_gilbert_elliott(ge);
    }
    scenario
}

/// Issue 14, item 1: bursty loss on the ACK path must not stall the sender. Over 30 seeds of
/// 60 s calls, `utcp-ir` misses at most 2 % more playouts than UDP (the network's losses),
/// and on every seed `utcp-ir` misses no more than `utcp`, and `utcp` no more than `tcp`.
#[test]
fn bursty_loss_both_ways_does_not_stall_the_sender() {
    let scenario = bursty_70ms();
    let mut totals = [0u64; 4];
    let mut violations = Vec::new();
    let transports = ["udp", "tcp", "utcp", "utcp-ir"];
    for seed in 1..=30 {
        let missed: Vec<u64> = transports
            .iter()
            .map(|t| run(&scenario, t, seed, 60).analysis.summary.late_loss_count)
            .collect();
        eprintln!("seed {seed}: udp/tcp/utcp/utcp-ir missed {missed:?}");
        for (total, m) in totals.iter_mut().zip(&missed) {
            *total += m;
        }
        if missed[3] > missed[2] {
            violations.push(format!(
                "seed {seed}: utcp-ir {} > utcp {}",
                missed[3], missed[2]
            ));
        }
        if missed[2] > missed[1] {
            violations.push(format!(
                "seed {seed}: utcp {} > tcp {}",
                missed[2], missed[1]
            ));
        }
    }
    eprintln!("totals udp/tcp/utcp/utcp-ir: {totals:?}");
    let [udp, _, utcp, ir] = totals;
    assert!(udp > 0, "the path loses packets");
    let excess = |t: u64| (t as f64 / udp as f64 - 1.0) * 100.0;
    eprintln!(
        "utcp misses {:.1} % more than udp, utcp-ir {:.1} %",
        excess(utcp),
        excess(ir)
    );
    assert!(
        ir as f64 <= udp as f64 * 1.02,
        "utcp-ir missed {ir}, {:.1} % more than udp's {udp}",
        excess(ir)
    );
    assert!(violations.is_empty(), "{violations:?}");
}

/// Issue 14, item 2 (second half): on the bursty path every retransmission is doomed (it
/// arrives at least RTT + RTT/2 = 105 ms after its message was sent, past the 65 ms
/// playout), so with inconsistent retransmissions no message the network lost may arrive
/// late: each retransmitted range must carry live messages (or padding), never its doomed
/// original. Counted per run: messages whose first transmission was lost and that then
/// arrived late, i.e. were resent unchanged.
#[test]
fn every_doomed_range_in_a_burst_is_replaced() {
    let scenario = bursty_70ms();
    let mut unchanged = Vec::new();
    for seed in 1..=30 {
        let r = run(&scenario, "utcp-ir", seed, 60);
        let late = r
            .analysis
            .records
            .iter()
            .filter(|m| m.lost_by_network && m.state == MessageState::Late)
            .count();
        let s = &r.analysis.summary;
        eprintln!(
            "seed {seed}: lost by network {}, replaced {}, resent unchanged and late {late}, missed {}, voice packets {}",
            s.lost_by_network,
            s.replaced_by_sender,
            s.late_loss_count,
            r.engine_stats["voice_packets_sent"]
        );
        if late > 0 {
            unchanged.push((seed, late));
        }
    }
    let total: usize = unchanged.iter().map(|&(_, n)| n).sum();
    assert!(
        unchanged.is_empty(),
        "{total} doomed messages resent unchanged: {unchanged:?}"
    );
}

/// Issue 14: the bursty path of `bursty_70ms` at RTT 15 ms with 110 ms playout, where most
/// retransmissions arrive in time. Lost ACKs make retransmission timeouts fire although the
/// receiver has everything; a pending message moved into such a timeout's (spurious)
/// retransmission was dropped by the receiver as a duplicate and never delivered, so
/// `utcp-ir` missed more than `utcp` (seeds 4, 7, 9 and 23: 17/15, 3/1, 4/3, 5/4). On every
/// seed `utcp-ir` must miss no more than `utcp`, and `utcp` no more than `tcp`.
#[test]
fn bursty_loss_at_15ms_inconsistent_retransmissions_lose_nothing_utcp_delivers() {
    let mut scenario = bursty_70ms();
    scenario.name = "bursty-15ms".into();
    scenario.playout_delay = Duration::from_millis(110);
    let ge = scenario.bottleneck.right_to_left.gilbert_elliott;
    scenario.bottleneck = squarepeg_lab::model::presets::hollywood_adsl(Duration::from_millis(15));
    for link in [
        &mut scenario.bottleneck.left_to_right,
        &mut scenario.bottleneck.right_to_left,
    ] {
        link.loss = 0.0;
        link.gilbert_elliott = ge;
    }
    let mut violations = Vec::new();
    for seed in 1..=30 {
        let missed: Vec<u64> = ["tcp", "utcp", "utcp-ir"]
            .iter()
            .map(|t| run(&scenario, t, seed, 60).analysis.summary.late_loss_count)
            .collect();
        eprintln!("seed {seed}: tcp/utcp/utcp-ir missed {missed:?}");
        if missed[2] > missed[1] || missed[1] > missed[0] {
            violations.push((seed, missed));
        }
    }
    assert!(violations.is_empty(), "{violations:?}");
}

/// Issue 14's aims on the shipped hostile-path scenarios (`peg lab voip --sim --scenario …`,
/// 60 s calls, seeds 1–10): on every seed `utcp-ir` misses no more playouts than `utcp`, and
/// `utcp` no more than `tcp`; over the seeds `utcp-ir` misses at most 2 % of the messages
/// more than UDP. The scenarios draw fates per instant (`Fates::PerInstant`: the same voice
/// packet meets the same loss and delay under every transport), without which a
/// retransmission landing a few milliseconds either side of the deadline decided some seeds
/// by chance. (`bursty-loss` is checked by `bursty_loss_both_ways_does_not_stall_the_sender`.)
#[test]
fn shipped_hostile_scenarios_meet_the_per_seed_aims() {
    use squarepeg_experiments::voip::config::{heavy_loss, jitter, jitter_reorder, long_rtt};
    let transports = ["udp", "tcp", "utcp", "utcp-ir"];
    let mut violations = Vec::new();
    for scenario in [jitter(), jitter_reorder(), heavy_loss(), long_rtt()] {
        let mut totals = [0u64; 4];
        for seed in 1..=10 {
            let missed: Vec<u64> = transports
                .iter()
                .map(|t| run(&scenario, t, seed, 60).analysis.summary.late_loss_count)
                .collect();
            for (total, m) in totals.iter_mut().zip(&missed) {
                *total += m;
            }
            if missed[3] > missed[2] || missed[2] > missed[1] {
                violations.push(format!(
                    "{} seed {seed}: tcp/utcp/utcp-ir {:?}",
                    scenario.name,
                    &missed[1..]
                ));
            }
        }
        eprintln!("{}: udp/tcp/utcp/utcp-ir {totals:?}", scenario.name);
        // 10 calls of 3000 messages.
        assert!(
            totals[3] <= totals[0] + 600,
            "{}: utcp-ir {} against udp {}",
            scenario.name,
            totals[3],
            totals[0]
        );
    }
    assert!(violations.is_empty(), "{violations:#?}");
}
