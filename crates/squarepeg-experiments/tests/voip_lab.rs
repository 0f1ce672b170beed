//! The VoIP experiment on the real network lab: a short call (5 s) per transport (of the
//! userspace-TCP variants only `utcp-ir` and `utls`, which exercise the stacks on TUN) over
//! Hollywood's intercontinental scenario, checking the JSON's shape and that the figures
//! make sense, and that every lab the runs built is gone afterwards. Needs root, `ip` and
//! `ethtool` (CI has them); skipped otherwise.

mod common;

use std::process::Command;
use std::time::Duration;

use squarepeg_experiments::voip::config::hollywood_70ms;
use squarepeg_experiments::voip::{RunResult, VoipConfig, lab, report};
use squarepeg_lab::net::lab_namespaces;

fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["ip", "ethtool"].iter().all(|tool| {
        Command::new(tool)
            .arg(if *tool == "ip" { "-V" } else { "--version" })
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !(root && tools) {
        eprintln!("SKIPPED: the network lab needs root, ip and ethtool; CI has them");
    }
    root && tools
}

fn our_namespaces() -> usize {
    let pid = std::process::id();
    lab_namespaces()
        .iter()
        .filter(|(_, owner, _)| *owner == pid)
        .count()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn short_call_on_the_real_lab() {
    if !can_run() {
        return;
    }
    let scenario = hollywood_70ms();
    let config = VoipConfig {
        drain: Duration::from_secs(1),
        ..VoipConfig::for_duration(Duration::from_secs(5)).expect("config")
    };
    let mut runs: Vec<RunResult> = Vec::new();
    // Fewer userspace-TCP variants keep CI short: `utcp-ir` is `utcp` plus the padder, and
    // `utls-ir` is `utls` plus its padder of TLS records (tested on the simulator).
    let skipped = ["utcp", "utls-ir"];
    for transport in lab::transports()
        .into_iter()
        .filter(|t| !skipped.contains(&t.name()))
    {
        let result = lab::run(&scenario, transport.as_ref(), &config, 3, &|_| {});
        assert_eq!(
            our_namespaces(),
            0,
            "the lab of {} is gone",
            transport.name()
        );
        let r = result.unwrap_or_else(|e| panic!("{}: {e}", transport.name()));
        let s = &r.analysis.summary;
        assert_eq!(s.messages_sent, 250);
        assert_eq!(s.refused_by_sender, 0, "{}", transport.name());
        assert_eq!(s.duplicate_arrivals + s.unknown_arrivals, 0);
        // One-way delay is measured on one clock: never below the 35 ms of propagation,
        // and the median within a few ms of it (0.2 ms to send, host stacks, emulator).
        let p50 = s.latency_ms.p50.expect("delivered");
        assert!(
            (35.0..45.0).contains(&p50),
            "{}: median {p50} ms",
            transport.name()
        );
        for rec in &r.analysis.records {
            if let Some(d) = rec.transport_delay() {
                assert!(
                    d >= Duration::from_millis(35),
                    "{}: {d:?}",
                    transport.name()
                );
            }
        }
        if transport.name().contains("tls") {
            // Encrypted: the network's losses are not read off the wire.
            assert!(!r.network_losses_visible(), "{}", transport.name());
            assert!(
                r.engine_stats["receiver_tls"]["records_opened"]
                    .as_u64()
                    .is_some_and(|n| n >= 250),
                "{}: the receiver opened the records: {}",
                transport.name(),
                r.engine_stats
            );
        }
        match transport.name() {
            // No retransmission: what never arrived is what the network dropped.
            "udp" => assert_eq!(s.never_delivered, s.lost_by_network),
            // Reliable: everything arrives.
            _ => assert_eq!(s.never_delivered, 0, "{}", transport.name()),
        }
        let voice = r.engine_stats["voice_packets_sent"]
            .as_u64()
            .expect("count");
        // One packet per message, except that kernel TCP may coalesce two records held by
        // a retransmission or a busy machine into one segment (seen once under load).
        let least = match transport.name() {
            "tcp" | "squarepeg" | "tls" => 225,
            _ => 250,
        };
        assert!(
            voice >= least,
            "{}: the capture saw the voice packets: {voice}",
            transport.name()
        );
        runs.push(r);
    }
    let dir = std::env::temp_dir().join(format!("sqpg-voip-lab-{}", std::process::id()));
    let written = report::write_outputs(&dir, &config, &runs, false).expect("write");
    common::check_summary_shape(&written.summary);
    assert_eq!(written.summary["runs"].as_array().map(Vec::len), Some(6));
    assert!(
        written.summary["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .all(|r| r["engine"] == "lab")
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}
