//! A full capture of an interoperability run (the driver's pcap tap on the TUN device: what the
//! kernel sends and receives), dissected by tshark with IP and TCP checksum validation on:
//! no malformed packets, no bad checksums, no resets, and the SYN and SYN-ACK of every
//! connection, in both directions of opening and both address families, carry MSS, window
//! scale, SACK-permitted and timestamps. Needs root and tshark (`.ci/run` installs it).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const BYTES: u64 = 1 << 20;

/// Runs tshark on the capture with checksum validation; returns the field lines of the packets
/// matching `filter`.
fn tshark(capture: &Path, filter: &str, fields: &[&str]) -> Vec<String> {
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(capture)
        .args([
            "-o",
            "tcp.check_checksum:TRUE",
            "-o",
            "ip.check_checksum:TRUE",
        ])
        .args(["-Y", filter, "-T", "fields", "-E", "separator=|"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = c.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark -Y {filter:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn tshark_finds_no_malformed_packets_no_bad_checksums_and_all_options() {
    if !can_run() {
        return;
    }
    assert!(
        Command::new("tshark").arg("-v").output().is_ok(),
        "tshark is missing: install it (`.ci/run` does: apt-get install tshark)"
    );
    let scratch = ScratchDir::new("tshark");
    let capture = scratch.0.join("full.pcap");
    let lab = Lab::start(
        "ts",
        LabOptions {
            capture: Some((capture.clone(), 65535)),
            tx_queue_len: Some(4096),
            ..Default::default()
        },
    );
    let rt = runtime();
    let mut port = 6000;
    for v6 in [false, true] {
        // Kernel client → squarepeg server.
        port += 1;
        let listener = lab.stack.listen_port(port).unwrap();
        let to = SocketAddr::new(lab.stack_addr(v6), port);
        std::thread::scope(|s| {
            let kernel = s.spawn(|| kernel_exchange(lab.kernel_connect(to), BYTES, 1));
            let (stack, reason, _) = rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(60), async {
                    let (conn, _) = listener.accept().await.unwrap();
                    stack_exchange(conn, BYTES, 2).await
                })
                .await
                .expect("in time")
            });
            let kernel = kernel.join().unwrap();
            assert_eq!(kernel.received_digest, stack.sent_digest);
            assert_eq!(stack.received_digest, kernel.sent_digest);
            assert_eq!(reason, squarepeg_io::CloseReason::Normal);
        });
        // Squarepeg client → kernel server.
        port += 1;
        let listener = lab.kernel_listen(v6, port);
        let to = SocketAddr::new(lab.kernel_addr(v6), port);
        std::thread::scope(|s| {
            let kernel = s.spawn(|| kernel_exchange(listener.accept().unwrap().0, BYTES, 3));
            let (stack, reason, _) = rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(60), async {
                    let conn = lab.stack.connect(to).await.unwrap();
                    stack_exchange(conn, BYTES, 4).await
                })
                .await
                .expect("in time")
            });
            let kernel = kernel.join().unwrap();
            assert_eq!(kernel.received_digest, stack.sent_digest);
            assert_eq!(stack.received_digest, kernel.sent_digest);
            assert_eq!(reason, squarepeg_io::CloseReason::Normal);
        });
    }
    let stats = lab.finish();
    assert!(stats.device.captured > 4 * 2 * (BYTES / 1500));

    let tcp = tshark(&capture, "tcp", &["frame.number"]);
    assert!(
        tcp.len() as u64 > 4 * 2 * (BYTES / 1500),
        "{} TCP packets",
        tcp.len()
    );
    let malformed = tshark(
        &capture,
        "_ws.malformed || _ws.expert.severity == error",
        &["frame.number", "_ws.expert.message"],
    );
    assert!(
        malformed.is_empty(),
        "malformed or erroneous: {malformed:?}"
    );
    let good_tcp = tshark(&capture, "tcp.checksum.status == 1", &["frame.number"]);
    assert_eq!(
        good_tcp.len(),
        tcp.len(),
        "every TCP checksum verified good"
    );
    let ipv4 = tshark(&capture, "ip", &["frame.number"]);
    let good_ip = tshark(&capture, "ip.checksum.status == 1", &["frame.number"]);
    assert!(!ipv4.is_empty());
    assert_eq!(
        good_ip.len(),
        ipv4.len(),
        "every IPv4 header checksum verified good"
    );
    let resets = tshark(&capture, "tcp.flags.reset == 1", &["frame.number"]);
    assert!(resets.is_empty(), "resets: {resets:?}");
    let fins = tshark(
        &capture,
        "tcp.flags.fin == 1",
        &["tcp.stream", "ip.src", "ipv6.src"],
    );
    for stream in 0..4 {
        let senders: std::collections::BTreeSet<String> = fins
            .iter()
            .filter(|l| l.split('|').next() == Some(&stream.to_string()))
            .map(|l| l.split('|').skip(1).collect::<String>())
            .collect();
        assert_eq!(
            senders.len(),
            2,
            "FIN from both ends of stream {stream}: {fins:?}"
        );
    }

    // Options of every SYN and SYN-ACK: MSS (1460 over IPv4, 1440 over IPv6 at MTU 1500),
    // window scale, SACK-permitted (kind 4), timestamps (kind 8).
    let syns = tshark(
        &capture,
        "tcp.flags.syn == 1",
        &[
            "tcp.flags.ack",
            "ip.src",
            "ipv6.src",
            "tcp.options.mss_val",
            "tcp.options.wscale.shift",
            "tcp.option_kind",
            "tcp.options.timestamp.tsval",
        ],
    );
    assert_eq!(
        syns.len(),
        8,
        "one SYN and one SYN-ACK per connection: {syns:?}"
    );
    let mut from_stack = 0;
    for line in &syns {
        let f: Vec<&str> = line.split('|').collect();
        let v6 = f[1].is_empty();
        let src = if v6 { f[2] } else { f[1] };
        let expected_mss = if v6 { "1440" } else { "1460" };
        assert_eq!(f[3], expected_mss, "MSS in {line}");
        assert!(!f[4].is_empty(), "window scale in {line}");
        let kinds: Vec<&str> = f[5].split(',').collect();
        for kind in ["2", "3", "4", "8"] {
            assert!(kinds.contains(&kind), "option kind {kind} in {line}");
        }
        assert!(!f[6].is_empty(), "timestamp value in {line}");
        if src == squarepeg_io::LAB_V4.stack.to_string()
            || src == squarepeg_io::LAB_V6.stack.to_string()
        {
            from_stack += 1;
            // The stack's window shift covers its 4 MiB receive buffer (RFC 7323 §2.3).
            assert_eq!(f[4], "7", "squarepeg's window scale in {line}");
        }
    }
    assert_eq!(from_stack, 4, "squarepeg sent two SYNs and two SYN-ACKs");
}
