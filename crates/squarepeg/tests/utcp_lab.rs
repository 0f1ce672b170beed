//! squarepeg over the userspace TCP on real packets: a `squarepeg_lab::stack::LabStack` on one end
//! of a network lab (client — emulator — server namespaces), every packet through the lab's
//! emulator with loss on the path.
//!
//! - squarepeg-uTCP ↔ squarepeg-kernel, either side opening: messages both ways (each
//!   delivered exactly once, byte-identical, out of order where the uTCP side receives) and a
//!   stream each way with equal SHA-256, then a clean close;
//! - the emulator's capture on the uTCP sender's side, with deadlines so that inconsistent
//!   retransmissions happen: `WireAudit` (no holes, retransmissions keep the original layout,
//!   ACKs never ahead) and `tshark` (no malformed packets, no bad checksums);
//! - uTCP ↔ uTCP through the re-segmenting and the retransmission-caching middleboxes (alone
//!   and together), with deadlines: every message delivered is byte-identical to one sent,
//!   none twice.
//!
//! Needs root, /dev/net/tun and iproute2; skipped with a message otherwise. Tests assert
//! outcomes, never durations.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use squarepeg::{
    Connection, ConnectionConfig, ConnectionError, Endpoint, MessageNumber, MessageProps,
    MessageStatus,
};
use squarepeg_io::StackConfig;
use squarepeg_lab::middlebox::{
    MiddleboxConfig, PathMtuConfig, ResegmentConfig, RetransmitCacheConfig,
};
use squarepeg_lab::net::{CaptureSide, Lab, LabConfig, Role, capture_path};
use squarepeg_lab::stack::{LabStack, stack_addresses};
use squarepeg_tcp::audit::WireAudit;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PORT: u16 = 6100;

/// Fails a test that would otherwise hang; not a timing assertion.
async fn no_hang<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(150), f)
        .await
        .expect("test stalled")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn lab_config(tag: &str, seed: u64, up: &str, down: &str) -> LabConfig {
    LabConfig::new(&format!("sq{tag}{}", std::process::id() % 10_000))
        .with_seed(seed)
        .with_up(up.parse().expect("link"))
        .with_down(down.parse().expect("link"))
}

/// A directory removed on drop unless the test panicked (then its path is printed).
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("squarepeg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        ScratchDir(p)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("captures kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

// ------------------------------------------------------------------------ traffic

/// What one side sends.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Tells this side's payloads from the other's.
    seed: u8,
    messages: u32,
    /// Bytes of the one stream this side opens (0: none).
    stream_bytes: usize,
    /// Lifetime of every message (`None`: fully reliable).
    lifetime: Option<Duration>,
    /// Pause between messages (pacing, so that deadlines matter).
    gap: Option<Duration>,
}

/// Message `i` of the side with `seed`: its index and seed first, then a pattern; lengths
/// vary from 5 bytes to a few segments.
fn payload(seed: u8, i: u32) -> Vec<u8> {
    let len = 5 + (i as usize * 7919) % 3000;
    let mut p = Vec::with_capacity(len);
    p.push(seed);
    p.extend_from_slice(&i.to_be_bytes());
    p.extend((5..len).map(|k| (k as u32 ^ i.wrapping_mul(2_654_435_761)) as u8 ^ seed));
    p
}

fn stream_data(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| ((k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 29) as u8 ^ seed)
        .collect()
}

/// What one side received.
#[derive(Debug)]
struct Received {
    /// Distinct messages delivered (each checked byte-identical, none twice).
    messages: u32,
    /// Deliveries of a message numbered below one delivered before it.
    out_of_order: u32,
    stream_sha: Option<[u8; 32]>,
    close: ConnectionError,
    stats: squarepeg::ConnectionStats,
    /// Indices of the peer's messages delivered.
    delivered: HashSet<u32>,
    /// The final status of each of our messages, by index (checked: exactly one each).
    statuses: HashMap<u32, MessageStatus>,
}

/// Sends `me`'s traffic and takes `peer`'s: every message must be one the peer sent
/// (byte-identical) and none may come twice; with `peer.lifetime == None` all must come.
async fn exchange(conn: Connection, me: Plan, peer: Plan) -> Received {
    let c = conn.clone();
    let sender = tokio::spawn(async move {
        let mut numbers = HashMap::new();
        for i in 0..me.messages {
            // One sub-stream: the sender's session hands them to TCP in index order, so
            // any out-of-order delivery is the receiving transport's doing.
            let props = MessageProps {
                lifetime: me.lifetime,
                ..Default::default()
            };
            let n = c
                .send_message(payload(me.seed, i), props)
                .await
                .expect("send");
            numbers.insert(n, i);
            if let Some(g) = me.gap {
                tokio::time::sleep(g).await;
            }
        }
        numbers
    });
    let c = conn.clone();
    let writer = tokio::spawn(async move {
        if me.stream_bytes > 0 {
            let mut s = c.open_stream().await.expect("open stream");
            s.write_all(&stream_data(me.seed, me.stream_bytes))
                .await
                .expect("stream write");
            s.shutdown().await.expect("stream shutdown");
        }
    });
    let c = conn.clone();
    let reader = tokio::spawn(async move {
        if peer.stream_bytes == 0 {
            return None;
        }
        let mut s = c.accept_stream().await.expect("accept stream");
        let mut data = Vec::new();
        s.read_to_end(&mut data).await.expect("stream read");
        Some(<[u8; 32]>::from(Sha256::digest(&data)))
    });

    let c = conn.clone();
    let receiver = tokio::spawn(async move {
        let mut seen = HashSet::new();
        let mut highest: Option<u32> = None;
        let mut out_of_order = 0;
        let reliable = peer.lifetime.is_none();
        loop {
            if reliable && seen.len() as u32 == peer.messages {
                break;
            }
            let m = match c.recv_message().await {
                Ok(m) => m,
                // With lifetimes, a close ends the messages.
                Err(e) if !reliable => {
                    eprintln!("messages ended: {e}");
                    break;
                }
                Err(e) => panic!("connection lost after {} messages: {e}", seen.len()),
            };
            let p = &m.payload[..];
            assert!(p.len() >= 5, "message too short: {p:?}");
            let i = u32::from_be_bytes([p[1], p[2], p[3], p[4]]);
            assert_eq!(p[0], peer.seed, "message {i} is not from the peer");
            assert!(i < peer.messages, "message index {i} was never sent");
            assert!(
                p == payload(peer.seed, i),
                "message {i} is not what was sent"
            );
            assert!(seen.insert(i), "message {i} delivered twice");
            if highest.is_some_and(|h| i < h) {
                out_of_order += 1;
            }
            highest = highest.max(Some(i));
        }
        (seen, out_of_order)
    });
    let numbers = sender.await.expect("sender");
    writer.await.expect("writer");
    // Who closes: a side whose messages have lifetimes, once they are sent and have had time
    // to arrive; a side receiving only reliable data, once it has it all. A side receiving
    // messages with lifetimes waits for the peer's close.
    let (delivered, out_of_order) = if me.lifetime.is_some() {
        tokio::time::sleep(Duration::from_millis(400)).await;
        conn.close().await;
        let r = receiver.await.expect("receiver");
        let stream_sha = reader.await.expect("reader");
        let close = conn.closed().await;
        // After the close: its records count too.
        let stats = conn.stats();
        return Received {
            messages: r.0.len() as u32,
            out_of_order: r.1,
            stream_sha,
            close,
            stats,
            delivered: r.0,
            statuses: final_statuses(&conn, &numbers),
        };
    } else {
        receiver.await.expect("receiver")
    };
    let stream_sha = reader.await.expect("reader");
    if peer.lifetime.is_none() {
        conn.close().await;
    }
    let close = conn.closed().await;
    let stats = conn.stats();
    Received {
        messages: delivered.len() as u32,
        out_of_order,
        stream_sha,
        close,
        stats,
        delivered,
        statuses: final_statuses(&conn, &numbers),
    }
}

/// The statuses reported for our messages (after the close, so all are final): exactly one
/// each.
fn final_statuses(
    conn: &Connection,
    numbers: &HashMap<MessageNumber, u32>,
) -> HashMap<u32, MessageStatus> {
    let mut out = HashMap::new();
    while let Some((n, status)) = conn.try_next_message_status() {
        let i = *numbers.get(&n).expect("a status for a message we sent");
        assert!(
            out.insert(i, status).is_none(),
            "two statuses for message {i}"
        );
    }
    assert_eq!(out.len(), numbers.len(), "a final status for every message");
    out
}

fn sha(seed: u8, len: usize) -> [u8; 32] {
    Sha256::digest(stream_data(seed, len)).into()
}

fn assert_clean_close(who: &str, e: &ConnectionError) {
    assert!(
        matches!(
            e,
            ConnectionError::LocallyClosed | ConnectionError::ApplicationClosed { code: 0, .. }
        ),
        "{who}: not a clean close: {e}"
    );
}

// ------------------------------------------------------------- uTCP ↔ kernel

/// Connects the uTCP stack on the client end and a kernel-TCP squarepeg endpoint in the
/// server namespace (`utcp_connects` picks who opens, `ipv6` the address family) and runs
/// [`exchange`] with the two plans on both; returns (kernel side, uTCP side).
fn utcp_kernel_exchange(
    lab: &Lab,
    stack: &LabStack,
    utcp_connects: bool,
    ipv6: bool,
    utcp_plan: Plan,
    kernel_plan: Plan,
) -> (Received, Received) {
    let server_addr = SocketAddr::new(lab.addresses().server(ipv6), PORT);
    let stack_addr = SocketAddr::new(stack.address(ipv6), PORT);
    let rt = runtime();

    std::thread::scope(|s| {
        let (bound_tx, bound_rx) = mpsc::channel();
        let server_ns = lab.server();
        let kernel = s.spawn(move || {
            server_ns
                .run(move || {
                    runtime().block_on(no_hang(async move {
                        let conn = if utcp_connects {
                            let ep = Endpoint::bind(server_addr, ConnectionConfig::default())
                                .await
                                .expect("kernel bind");
                            bound_tx.send(()).expect("signal");
                            ep.accept().await.expect("kernel accept")
                        } else {
                            Connection::connect(stack_addr, ConnectionConfig::default())
                                .await
                                .expect("kernel connect")
                        };
                        exchange(conn, kernel_plan, utcp_plan).await
                    }))
                })
                .expect("enter server namespace")
        });
        let utcp = rt.block_on(no_hang(async {
            let conn = if utcp_connects {
                bound_rx.recv().expect("kernel bound");
                Connection::connect_utcp(stack.stack(), server_addr, ConnectionConfig::default())
                    .await
                    .expect("uTCP connect")
            } else {
                let ep = Endpoint::listen_utcp(stack.stack(), stack_addr, Default::default())
                    .expect("uTCP listen");
                ep.accept().await.expect("uTCP accept")
            };
            exchange(conn, utcp_plan, kernel_plan).await
        }));
        (kernel.join().expect("kernel side"), utcp)
    })
}

/// The uTCP stack on the client end, the kernel-TCP squarepeg endpoint in the server
/// namespace; `utcp_connects` picks who opens, `ipv6` the address family. Reliable messages
/// and a stream both ways.
fn utcp_kernel(utcp_connects: bool, ipv6: bool, seed: u64) {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let lab = Lab::start(lab_config(
        match (utcp_connects, ipv6) {
            (true, false) => "uk",
            (false, false) => "ku",
            (true, true) => "uk6",
            (false, true) => "ku6",
        },
        seed,
        "delay=5ms loss=1.5% reorder=1%,2ms",
        "delay=5ms loss=1.5%",
    ))
    .expect("start lab");
    let stack = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach stack");
    let utcp_plan = Plan {
        seed: 0xA1,
        messages: 1200,
        stream_bytes: 3 << 20,
        lifetime: None,
        gap: None,
    };
    let kernel_plan = Plan {
        seed: 0xB2,
        ..utcp_plan
    };
    let (kernel, utcp) =
        utcp_kernel_exchange(&lab, &stack, utcp_connects, ipv6, utcp_plan, kernel_plan);
    eprintln!("uTCP side: {utcp:?}\nkernel side: {kernel:?}");
    let emu = lab.stats().expect("emulator stats");
    eprintln!("emulator: {}", emu.to_json());

    assert_eq!(utcp.messages, kernel_plan.messages);
    assert_eq!(kernel.messages, utcp_plan.messages);
    assert_eq!(
        utcp.stream_sha,
        Some(sha(kernel_plan.seed, kernel_plan.stream_bytes))
    );
    assert_eq!(
        kernel.stream_sha,
        Some(sha(utcp_plan.seed, utcp_plan.stream_bytes))
    );
    assert!(
        utcp.out_of_order > 0,
        "losses on the path, yet the uTCP side received every message in order"
    );
    assert_eq!(kernel.out_of_order, 0, "kernel TCP delivers in order");
    for r in [&utcp, &kernel] {
        assert!(
            r.statuses.values().all(|&s| s == MessageStatus::Sent),
            "reliable messages all end Sent"
        );
    }
    let glue = utcp.stats.utcp.expect("uTCP stats");
    assert!(glue.segments_read > 0);
    assert_eq!(glue.frames_rejected, 0, "no middlebox mixes here");
    assert_clean_close("uTCP side", &utcp.close);
    assert_clean_close("kernel side", &kernel.close);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_client_with_kernel_server_through_lossy_lab() {
    utcp_kernel(true, false, 11);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn kernel_client_with_utcp_server_through_lossy_lab() {
    utcp_kernel(false, false, 12);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_client_with_kernel_server_through_lossy_lab_over_ipv6() {
    utcp_kernel(true, true, 13);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn kernel_client_with_utcp_server_through_lossy_lab_over_ipv6() {
    utcp_kernel(false, true, 14);
}

// ------------------------------------------------------------- path MTU

/// The uTCP stack on the client end and the kernel-TCP server, both at MTU 1500, across a
/// link of 1400 bytes in the middle of the path: the uTCP side's full-sized segments (they
/// carry DF) are dropped there. With the link's ICMP errors (`icmp`) the uTCP side lowers its
/// MSS at once (RFC 1191, RFC 8201) and streams and messages flow both ways (the kernel finds
/// the path MTU the same way); without them (an ICMP black hole) its third timeout in a row
/// does (RFC 8899 §4.3), and the kernel side sends only what fits (Linux, without
/// `tcp_mtu_probing`, would stall as the uTCP side once did).
fn utcp_kernel_across_a_narrow_link(tag: &str, icmp: bool, ipv6: bool) {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let lab = Lab::start(
        lab_config(tag, 31, "delay=5ms", "delay=5ms").with_client_side(vec![
            MiddleboxConfig::PathMtu(PathMtuConfig { mtu: 1400, icmp }),
        ]),
    )
    .expect("start lab");
    let stack = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach stack");
    let utcp_plan = Plan {
        seed: 0xA7,
        messages: 300,
        stream_bytes: 1 << 20,
        lifetime: None,
        gap: None,
    };
    let kernel_plan = if icmp {
        Plan {
            seed: 0xB8,
            ..utcp_plan
        }
    } else {
        Plan {
            seed: 0xB8,
            messages: 0,
            stream_bytes: 0,
            ..utcp_plan
        }
    };
    let (kernel, utcp) = utcp_kernel_exchange(&lab, &stack, true, ipv6, utcp_plan, kernel_plan);
    let emu = lab.stats().expect("emulator stats");
    let boxes = &emu.client_side_middleboxes;
    let endpoint = stack.stack().stats().endpoint;
    eprintln!(
        "middlebox {boxes:?}; uTCP endpoint: {} packet-too-big errors believed",
        endpoint.packet_too_big_believed
    );
    assert_eq!(kernel.messages, utcp_plan.messages);
    assert_eq!(
        kernel.stream_sha,
        Some(sha(utcp_plan.seed, utcp_plan.stream_bytes))
    );
    assert_eq!(utcp.messages, kernel_plan.messages);
    if kernel_plan.stream_bytes > 0 {
        assert_eq!(
            utcp.stream_sha,
            Some(sha(kernel_plan.seed, kernel_plan.stream_bytes))
        );
    }
    // The link did drop full-sized segments.
    assert!(boxes["mtu_dropped_too_big"] > 0, "{boxes:?}");
    if icmp {
        assert!(boxes["mtu_icmp_sent"] > 0);
        assert!(endpoint.packet_too_big_believed > 0);
    } else {
        assert_eq!(boxes["mtu_icmp_sent"], 0);
    }
    assert_clean_close("uTCP side", &utcp.close);
    assert_clean_close("kernel side", &kernel.close);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_across_a_narrow_link_learns_the_path_mtu_from_icmp() {
    utcp_kernel_across_a_narrow_link("mtu", true, false);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_across_a_narrow_link_learns_the_path_mtu_from_icmpv6() {
    utcp_kernel_across_a_narrow_link("mtu6", true, true);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_across_an_icmp_black_hole_finds_a_size_that_passes() {
    utcp_kernel_across_a_narrow_link("mtubh", false, false);
}

// ------------------------------------------------------------- capture and wire audit

/// tshark's view of a capture: packets it calls malformed or whose checksums are bad, and
/// the number of TCP conversations. `None` (with the reason printed) if tshark is absent.
fn tshark_check(pcap: &Path) -> Option<(Vec<String>, usize)> {
    let run = |args: &[&str]| {
        std::process::Command::new("tshark")
            .arg("-n")
            .arg("-r")
            .arg(pcap)
            .args([
                "-o",
                "tcp.check_checksum:TRUE",
                "-o",
                "ip.check_checksum:TRUE",
            ])
            .args(args)
            .output()
    };
    let bad = match run(&[
        "-Y",
        "_ws.malformed || tcp.checksum.status == 0 || ip.checksum.status == 0",
    ]) {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>(),
        Ok(o) => panic!("tshark failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("tshark part skipped: tshark not available ({e})");
            return None;
        }
    };
    let streams = run(&["-Y", "tcp", "-T", "fields", "-e", "tcp.stream"]).expect("tshark");
    let conversations = String::from_utf8_lossy(&streams.stdout)
        .lines()
        .collect::<HashSet<_>>()
        .len();
    Some((bad, conversations))
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn emulator_capture_of_utcp_sender_with_deadlines_passes_wire_audit_and_tshark() {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let dir = ScratchDir::new("utcp-capture");
    // 40 ms RTT and loss both ways: a retransmission arrives a round trip after the
    // original would have, past a 45 ms lifetime, so its range carries live messages instead.
    let lab = Lab::start(
        lab_config("cap", 21, "delay=20ms loss=3%", "delay=20ms loss=2%").with_capture_dir(&dir.0),
    )
    .expect("start lab");
    let stack = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach stack");
    let sender = Plan {
        seed: 0xC3,
        messages: 1500,
        stream_bytes: 0,
        lifetime: Some(Duration::from_millis(45)),
        gap: Some(Duration::from_millis(1)),
    };
    let quiet = Plan {
        seed: 0xD4,
        messages: 0,
        stream_bytes: 0,
        lifetime: None,
        gap: None,
    };
    let server_addr = SocketAddr::new(lab.addresses().server(false), PORT);
    let rt = runtime();
    let (kernel, utcp) = std::thread::scope(|s| {
        let (bound_tx, bound_rx) = mpsc::channel();
        let server_ns = lab.server();
        let kernel = s.spawn(move || {
            server_ns
                .run(move || {
                    runtime().block_on(no_hang(async move {
                        let ep = Endpoint::bind(server_addr, ConnectionConfig::default())
                            .await
                            .expect("kernel bind");
                        bound_tx.send(()).expect("signal");
                        let conn = ep.accept().await.expect("kernel accept");
                        exchange(conn, quiet, sender).await
                    }))
                })
                .expect("enter server namespace")
        });
        let utcp = rt.block_on(no_hang(async {
            bound_rx.recv().expect("kernel bound");
            let conn =
                Connection::connect_utcp(stack.stack(), server_addr, ConnectionConfig::default())
                    .await
                    .expect("uTCP connect");
            exchange(conn, sender, quiet).await
        }));
        (kernel.join().expect("kernel side"), utcp)
    });
    let utcp_stats = utcp.stats;
    lab.flush_captures().expect("flush captures");
    eprintln!("uTCP sender: {utcp:?} {utcp_stats:?}\nkernel receiver: {kernel:?}");
    let glue = utcp_stats.utcp.expect("uTCP stats");
    assert!(kernel.messages > 0, "nothing delivered");
    assert!(
        glue.replaced > 0 && glue.sent_as_replacement > 0,
        "no inconsistent retransmission happened: {glue:?}"
    );

    // Statuses stay true: a message reported Sent was acknowledged, so the kernel side,
    // which read the whole stream, delivered it; Expired counts the drops before
    // transmission, Replaced the replacements.
    let count = |st| utcp.statuses.values().filter(|&&s| s == st).count() as u64;
    assert_eq!(count(MessageStatus::Expired), glue.expired_in_tcp);
    assert_eq!(count(MessageStatus::Replaced), glue.replaced);
    assert_eq!(
        count(MessageStatus::Sent) + count(MessageStatus::Expired) + count(MessageStatus::Replaced),
        u64::from(sender.messages)
    );
    for (i, s) in &utcp.statuses {
        if *s == MessageStatus::Sent {
            assert!(
                kernel.delivered.contains(i),
                "message {i} reported Sent, never delivered"
            );
        }
    }

    let pcap = capture_path(&dir.0, CaptureSide::Client);
    let bytes = std::fs::read(&pcap).expect("read capture");
    let file = squarepeg_lab::pcap::read_pcap(&bytes).expect("parse capture");
    let mut audit = WireAudit::new(true);
    assert_eq!(file.linktype, 101, "raw IP packets");
    for p in &file.records {
        assert_eq!(
            p.data.len(),
            p.original_len as usize,
            "whole packets captured"
        );
        audit.packet(&p.data);
    }
    let stats = audit
        .result()
        .unwrap_or_else(|v| panic!("wire audit of {}:\n{v}", pcap.display()));
    eprintln!("wire audit: {stats:?}");
    assert!(stats.packets > 100, "the capture holds the conversation");

    if let Some((bad, conversations)) = tshark_check(&pcap) {
        assert!(
            bad.is_empty(),
            "tshark: malformed or bad checksums:\n{}",
            bad.join("\n")
        );
        assert_eq!(conversations, 1, "one TCP conversation");
    }
}

// ------------------------------------------------------------- middleboxes

/// uTCP on both ends (client `.3`, server `.4`), messages with deadlines both ways through
/// `boxes`, on a lossy path.
fn utcp_pair_through(
    tag: &str,
    seed: u64,
    client_side: Vec<MiddleboxConfig>,
    server_side: Vec<MiddleboxConfig>,
) {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let lab = Lab::start(
        lab_config(tag, seed, "delay=10ms loss=3%", "delay=10ms loss=3%")
            .with_client_side(client_side)
            .with_server_side(server_side),
    )
    .expect("start lab");
    let client = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach client stack");
    let server = LabStack::attach(&lab, Role::Server, StackConfig::new([]), Some(1500))
        .expect("attach server stack");
    let plan = |seed| Plan {
        seed,
        messages: 800,
        stream_bytes: 0,
        lifetime: Some(Duration::from_millis(25)),
        gap: Some(Duration::from_millis(1)),
    };
    let (a, b) = (plan(0xE5), plan(0xF6));
    let addr = SocketAddr::new(server.address(false), PORT);
    let (ra, rb) = runtime().block_on(no_hang(async {
        let ep = Endpoint::listen_utcp(server.stack(), addr, Default::default()).expect("listen");
        let (c, s) = tokio::join!(
            Connection::connect_utcp(client.stack(), addr, ConnectionConfig::default()),
            ep.accept()
        );
        let (c, s) = (c.expect("connect"), s.expect("accept"));
        let ta = tokio::spawn(exchange(c, a, b));
        let tb = tokio::spawn(exchange(s, b, a));
        (ta.await.expect("client"), tb.await.expect("server"))
    }));
    eprintln!("client: {ra:?}\nserver: {rb:?}");
    eprintln!("emulator: {}", lab.stats().expect("stats").to_json());
    assert!(
        ra.messages > 0 && rb.messages > 0,
        "messages were delivered"
    );
    for r in [&ra, &rb] {
        let glue = r.stats.utcp.expect("uTCP stats");
        assert!(glue.segments_read > 0);
    }
}

fn reseg(seed: u64) -> MiddleboxConfig {
    MiddleboxConfig::Resegment(ResegmentConfig {
        seed,
        ..Default::default()
    })
}

fn cache() -> MiddleboxConfig {
    MiddleboxConfig::RetransmitCache(RetransmitCacheConfig::default())
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_through_resegmenter_delivers_only_sent_messages_once() {
    utcp_pair_through("rs", 31, vec![reseg(31)], vec![]);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_through_retransmission_cache_delivers_only_sent_messages_once() {
    utcp_pair_through("rc", 32, vec![], vec![cache()]);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_through_resegmenter_and_cache_delivers_only_sent_messages_once() {
    utcp_pair_through("rb", 33, vec![reseg(33)], vec![cache(), reseg(34)]);
}

// ------------------------------------------------------------- TLS over uTCP

/// A server configuration with a fresh self-signed certificate, and a client configuration
/// that pins it.
fn tls_configs() -> (ConnectionConfig, ConnectionConfig) {
    use squarepeg::tls::config::{self, Trust};
    let cert = config::self_signed(&["peg.test".into()]).expect("certificate");
    let server = ConnectionConfig::default().with_tls_server(
        config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).expect("server"),
    );
    let client = ConnectionConfig::default().with_tls_client(
        config::client_config(Trust::PinnedSha256(cert.fingerprint)).expect("client"),
        "peg.test",
    );
    (client, server)
}

/// TLS 1.3 over the userspace TCP at both ends of a lossy lab: reliable messages and a
/// stream each way arrive intact; records behind a loss are opened out of order; a TLS
/// set-up of the wrong side is refused before anything is sent.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn tls_over_utcp_both_ends_through_lossy_lab() {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let lab = Lab::start(lab_config(
        "tls",
        41,
        "delay=5ms loss=2%",
        "delay=5ms loss=2%",
    ))
    .expect("start lab");
    let client = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach client stack");
    let server = LabStack::attach(&lab, Role::Server, StackConfig::new([]), Some(1500))
        .expect("attach server stack");
    let plan = |seed| Plan {
        seed,
        messages: 1000,
        stream_bytes: 1 << 20,
        lifetime: None,
        gap: None,
    };
    let (a, b) = (plan(0x17), plan(0x71));
    let addr = SocketAddr::new(server.address(false), PORT);
    let (client_config, server_config) = tls_configs();
    let (ra, rb, client_info, server_info) = runtime().block_on(no_hang(async {
        // The wrong side of TLS for the role: refused, nothing sent.
        assert!(matches!(
            Endpoint::listen_utcp(server.stack(), addr, client_config.clone()),
            Err(squarepeg::ConnectError::Config(_))
        ));
        assert!(matches!(
            Connection::connect_utcp(client.stack(), addr, server_config.clone()).await,
            Err(squarepeg::ConnectError::Config(_))
        ));
        let ep = Endpoint::listen_utcp(server.stack(), addr, server_config).expect("listen");
        let (c, s) = tokio::join!(
            Connection::connect_utcp(client.stack(), addr, client_config),
            ep.accept()
        );
        let (c, s) = (c.expect("connect"), s.expect("accept"));
        // connect_utcp returned after the handshake; the accepted side learns it as well.
        let client_info = c.tls_info().expect("the client's handshake is done");
        s.established().await.expect("server handshake");
        let server_info = s.tls_info().expect("the server's handshake is done");
        let ta = tokio::spawn(exchange(c, a, b));
        let tb = tokio::spawn(exchange(s, b, a));
        (
            ta.await.expect("client"),
            tb.await.expect("server"),
            client_info,
            server_info,
        )
    }));
    eprintln!("client: {ra:?}\nserver: {rb:?}\n{client_info:?}\n{server_info:?}");
    eprintln!("emulator: {}", lab.stats().expect("stats").to_json());
    for info in [&client_info, &server_info] {
        assert!(info.cipher_suite.starts_with("TLS13_"), "{info:?}");
    }
    assert!(client_info.peer_certificate_sha256.is_some());
    assert_eq!(ra.messages, b.messages);
    assert_eq!(rb.messages, a.messages);
    assert_eq!(ra.stream_sha, Some(sha(b.seed, b.stream_bytes)));
    assert_eq!(rb.stream_sha, Some(sha(a.seed, a.stream_bytes)));
    for r in [&ra, &rb] {
        assert!(
            r.statuses.values().all(|&s| s == MessageStatus::Sent),
            "reliable messages all end Sent"
        );
        let tls = r.stats.tls.expect("TLS stats");
        assert!(
            tls.sending_numbered && tls.receiving_numbered,
            "numbered records both ways: {tls:?}"
        );
        assert!(tls.records_sealed > 0 && tls.records_opened > 0, "{tls:?}");
        // Each end's close_notify said where in the stream it starts (docs/wire.md §5): the
        // tagged queue's reports placed everything before it. (Whether the peer's was read
        // is a race: a side stops reading once both CLOSE frames are through, and the
        // close_notify behind the peer's may come in a later segment.)
        assert!(tls.close_sent_at_offset, "{tls:?}");
        assert!(r.stats.utcp.expect("uTCP stats").segments_read > 0);
    }
    let out_of_order: u64 = [&ra, &rb]
        .iter()
        .map(|r| r.stats.tls.expect("TLS stats").records_out_of_order)
        .sum();
    assert!(
        out_of_order > 0 && ra.out_of_order + rb.out_of_order > 0,
        "losses on the path, yet every record was opened in order"
    );
    assert_clean_close("client", &ra.close);
    assert_clean_close("server", &rb.close);
}

/// A client configuration offering TLS early data with Fast Open, and a server configuration
/// accepting early data with Fast Open (over kernel TCP: a Fast Open queue; a userspace-TCP
/// listener follows its stack's configuration).
fn early_data_configs() -> (ConnectionConfig, ConnectionConfig) {
    use squarepeg::tls::config::{self, Trust};
    let cert = config::self_signed(&["peg.test".into()]).expect("certificate");
    let server_tls = config::server_accepting_early_data(
        &config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).expect("server"),
        16 * 1024,
    )
    .expect("early data");
    let mut server = ConnectionConfig::default().with_tls_server(server_tls);
    server.fast_open = true;
    let mut client = ConnectionConfig::default().with_tls_client(
        config::client_offering_early_data(
            &config::client_config(Trust::PinnedSha256(cert.fingerprint)).expect("client"),
        ),
        "peg.test",
    );
    client.fast_open = true;
    (client, server)
}

/// Two connections from `stack` to an echo server at `addr`, each opened with one replayable
/// 64-byte request (early data once a ticket is held); checks each echo and closes.
async fn two_replayable_requests(
    stack: &squarepeg_io::Stack,
    addr: SocketAddr,
    config: &ConnectionConfig,
) {
    for i in 0..2u8 {
        let request = MessageProps {
            safely_replayable: true,
            ..MessageProps::default()
        };
        let (conn, _) = Connection::connect_utcp_with_messages(
            stack,
            addr,
            config.clone(),
            vec![(vec![i; 64].into(), request)],
        )
        .await
        .expect("connect");
        let echo = conn.recv_message().await.expect("echo");
        assert_eq!(&echo.payload[..], &[i; 64][..]);
        conn.close().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// TCP Fast Open and TLS 1.3 early data over the userspace TCP through the tokio API: a
/// `connect_utcp_with_messages` client with `fast_open` and a client configuration offering
/// early data, to a kernel squarepeg server with a Fast Open queue that accepts early data.
/// The first connection learns a cookie and a ticket (its SYN carries a cookie request and no
/// data); the second's SYN carries the ClientHello and the request as early data, in one uTCP
/// message record written before the SYN, and the server takes the request as early data;
/// both requests are answered once.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_fast_open_client_sends_its_request_as_early_data_on_the_syn() {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let dir = ScratchDir::new("utcp-tfo");
    let lab = Lab::start(lab_config("tfo", 5, "delay=5ms", "delay=5ms").with_capture_dir(&dir.0))
        .expect("start lab");
    let status = lab
        .server()
        .command("sysctl")
        .args(["-qw", "net.ipv4.tcp_fastopen=3"])
        .status()
        .expect("sysctl");
    assert!(status.success());
    let stack = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach stack");
    let server_addr = SocketAddr::new(lab.addresses().server(false), PORT);
    let (client_config, server_config) = early_data_configs();
    let (bound_tx, bound_rx) = mpsc::channel();
    let server_ns = lab.server().try_clone().expect("namespace");
    let server = std::thread::spawn(move || {
        server_ns
            .run(move || {
                runtime().block_on(no_hang(async move {
                    let ep = Endpoint::bind(server_addr, server_config)
                        .await
                        .expect("bind");
                    bound_tx.send(()).expect("signal");
                    let mut early = Vec::new();
                    for _ in 0..2 {
                        let conn = ep.accept().await.expect("accept");
                        let m = conn.recv_message().await.expect("request");
                        conn.send_message(m.payload, MessageProps::default())
                            .await
                            .expect("answer");
                        assert!(matches!(
                            conn.recv_message().await,
                            Err(ConnectionError::ApplicationClosed { .. })
                        ));
                        early.push(conn.stats().tls.expect("TLS").early_data_received);
                    }
                    early
                }))
            })
            .expect("server namespace")
    });
    bound_rx.recv().expect("bound");
    runtime().block_on(no_hang(two_replayable_requests(
        stack.stack(),
        server_addr,
        &client_config,
    )));
    let early = server.join().expect("server");
    assert_eq!(early[0], 0, "first contact: no early data");
    assert!(
        early[1] > 64,
        "the returning request did not come as early data: {early:?}"
    );
    lab.flush_captures().expect("flush");
    let bytes = std::fs::read(capture_path(&dir.0, CaptureSide::Server)).expect("capture");
    let file = squarepeg_lab::pcap::read_pcap(&bytes).expect("pcap");
    let syn_payloads: Vec<usize> = file
        .records
        .iter()
        .filter_map(|r| squarepeg_tcp::wire::parse_packet(&r.data, false).ok())
        .filter(|s| s.dst == server_addr && s.flags.syn() && !s.flags.ack())
        .map(|s| s.payload.len())
        .collect();
    assert_eq!(syn_payloads.len(), 2, "{syn_payloads:?}");
    assert_eq!(
        syn_payloads[0], 0,
        "first contact: a cookie request, no data"
    );
    assert!(
        syn_payloads[1] as u64 > 100 + early[1],
        "the ClientHello and the early data were not on the SYN: {syn_payloads:?}"
    );
    let fo = stack.stack().fast_open_cache();
    assert_eq!(fo.len(), 1, "one cookie, for the server: {fo:?}");
    lab.teardown().expect("teardown");
}

/// Both ends on the userspace TCP with Fast Open, over TLS with early data: the returning
/// client's request reaches the server's application as early data taken from the SYN, and
/// the answer (sealed as 0.5-RTT data behind the server's handshake flight) arrives; each
/// request is answered once.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_to_utcp_early_data_on_fast_open() {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let lab = Lab::start(lab_config("tfo2", 6, "delay=5ms", "delay=5ms")).expect("start lab");
    let stack_config = || {
        let mut c = StackConfig::new([]);
        c.connection.fast_open = true;
        c
    };
    let client = LabStack::attach(&lab, Role::Client, stack_config(), Some(1500))
        .expect("attach client stack");
    let server = LabStack::attach(&lab, Role::Server, stack_config(), Some(1500))
        .expect("attach server stack");
    let addr = SocketAddr::new(server.address(false), PORT);
    let (client_config, server_config) = early_data_configs();
    let early = runtime().block_on(no_hang(async {
        let ep = Endpoint::listen_utcp(server.stack(), addr, server_config).expect("listen");
        let serve = async {
            let mut early = Vec::new();
            for _ in 0..2 {
                let conn = ep.accept().await.expect("accept");
                let m = conn.recv_message().await.expect("request");
                conn.send_message(m.payload, MessageProps::default())
                    .await
                    .expect("answer");
                let _ = conn.recv_message().await;
                early.push(conn.stats().tls.expect("TLS").early_data_received);
            }
            early
        };
        let talk = two_replayable_requests(client.stack(), addr, &client_config);
        tokio::join!(serve, talk).0
    }));
    assert_eq!(early[0], 0, "first contact: no early data");
    assert!(
        early[1] > 64,
        "no early data on the returning connection: {early:?}"
    );
    let fo = client.stack().fast_open_cache();
    assert_eq!(fo.len(), 1, "{fo:?}");
    lab.teardown().expect("teardown");
}

/// One multipath session over a mix of substrates on the two-path lab: path 0 over
/// squarepeg's userspace TCP (a stack in the client namespace), path 1 over the kernel's TCP
/// (bound to the client's path-1 address); the second joined by TLS resumption. Every
/// message and stream byte arrives once, and both connections carry the session.
#[test]
fn multipath_session_over_userspace_and_kernel_tcp() {
    if !squarepeg_lab::stack::can_run() {
        eprintln!("SKIPPED multipath_session_over_userspace_and_kernel_tcp: needs root, TUN, ip");
        return;
    }
    multipath_over_mixed_substrates("mpu", false);
}

/// The same with the server's end of path 0 on a userspace stack too: its
/// `MultipathEndpoint` listens on the stack's address (path 0, userspace TCP at both ends)
/// and on the kernel's (path 1), and the client learns the second from the first.
#[test]
fn multipath_session_with_a_server_path_on_userspace_tcp() {
    if !squarepeg_lab::stack::can_run() {
        eprintln!(
            "SKIPPED multipath_session_with_a_server_path_on_userspace_tcp: needs root, TUN, ip"
        );
        return;
    }
    multipath_over_mixed_substrates("mps", true);
}

fn multipath_over_mixed_substrates(name: &str, server_on_stack: bool) {
    use squarepeg::tls::config::{self, Trust};
    use squarepeg::{ListenAddress, MultipathEndpoint, MultipathOptions, PathAddress, PathPolicy};
    use squarepeg_lab::net::PathConfig;
    use std::sync::Arc;
    let link = "delay=5ms rate=50mbit";
    let lab = Lab::start(
        lab_config(name, 1, link, link).with_path(
            PathConfig::default()
                .with_up(link.parse().expect("link"))
                .with_down(link.parse().expect("link"))
                .with_seed(2),
        ),
    )
    .expect("start lab");
    let stack = Arc::new(
        LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
            .expect("attach stack")
            .into_stack(),
    );
    let server_stack = server_on_stack.then(|| {
        Arc::new(
            LabStack::attach(&lab, Role::Server, StackConfig::new([]), Some(1500))
                .expect("attach server stack")
                .into_stack(),
        )
    });
    let name = "peg.lab".to_owned();
    let cert = config::self_signed(std::slice::from_ref(&name)).expect("cert");
    let server_config = ConnectionConfig::default().with_tls_server(
        config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).expect("tls"),
    );
    let client_config = ConnectionConfig::default().with_tls_client(
        config::client_config(Trust::PinnedSha256(cert.fingerprint)).expect("tls"),
        name,
    );
    let p0 = lab.path_addresses(0).expect("path 0");
    let p1 = lab.path_addresses(1).expect("path 1");
    let server0 = match &server_stack {
        Some(_) => SocketAddr::new(
            stack_addresses(&lab, Role::Server)
                .expect("stack address")
                .0
                .into(),
            PORT,
        ),
        None => SocketAddr::new(p0.server_v4.into(), PORT),
    };
    let server1 = SocketAddr::new(p1.server_v4.into(), PORT);
    let client1 = SocketAddr::new(p1.client_v4.into(), 0);
    const MESSAGES: u64 = 400;
    let data = stream_data(0xC3, 2 << 20);
    let (received, paths) = std::thread::scope(|s| {
        let (bound_tx, bound_rx) = mpsc::channel();
        let server_ns = lab.server();
        let listen = [
            match &server_stack {
                Some(stack) => ListenAddress::over_stack(stack.clone(), server0),
                None => ListenAddress::kernel(server0),
            },
            ListenAddress::kernel(server1),
        ];
        let server = s.spawn(move || {
            server_ns
                .run(move || {
                    runtime().block_on(no_hang(async move {
                        let mut ep = MultipathEndpoint::bind_on(
                            &listen,
                            server_config,
                            MultipathOptions::default(),
                        )
                        .await
                        .expect("bind");
                        bound_tx.send(()).expect("signal");
                        let conn = ep.accept().await.expect("accept");
                        let mut numbers = std::collections::BTreeSet::new();
                        for _ in 0..MESSAGES {
                            let m = conn.recv_message().await.expect("message");
                            let n = u64::from_be_bytes(m.payload[..8].try_into().expect("n"));
                            assert!(numbers.insert(n), "message {n} twice");
                        }
                        let mut stream = conn.accept_stream().await.expect("stream");
                        let mut got = Vec::new();
                        stream.read_to_end(&mut got).await.expect("read");
                        let paths = conn.paths();
                        conn.close().await;
                        ((numbers.len() as u64, got), paths)
                    }))
                })
                .expect("enter server namespace")
        });
        bound_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server bound");
        let client_ns = lab.client();
        let stack = stack.clone();
        let data = &data;
        let client = s.spawn(move || {
            client_ns
                .run(move || {
                    runtime().block_on(no_hang(async move {
                        // With the server on a stack the client learns path 1's address
                        // from the server (ADD_ADDRESS) rather than being given it.
                        let mut paths = vec![PathAddress::over_stack(stack, server0)];
                        if !server_on_stack {
                            paths.push(PathAddress::from_local(client1, server1));
                        }
                        let conn = Connection::connect_multipath(
                            &paths,
                            client_config,
                            MultipathOptions::default(),
                        )
                        .await
                        .expect("connect");
                        for _ in 0..500 {
                            if conn.paths().iter().filter(|p| p.usable).count() == 2 {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        assert_eq!(
                            conn.paths().iter().filter(|p| p.usable).count(),
                            2,
                            "{:?}",
                            conn.paths()
                        );
                        for n in 0..MESSAGES {
                            let mut payload = vec![0x5a; 300];
                            payload[..8].copy_from_slice(&n.to_be_bytes());
                            let props = MessageProps {
                                path: Some(PathPolicy::RoundRobin),
                                ..MessageProps::default()
                            };
                            conn.send_message(payload, props).await.expect("send");
                        }
                        let mut stream = conn.open_stream().await.expect("open");
                        stream.write_all(data).await.expect("write");
                        stream.shutdown().await.expect("finish");
                        conn.closed().await;
                    }))
                })
                .expect("enter client namespace")
        });
        client.join().expect("client");
        server.join().expect("server")
    });
    assert_eq!(received.0, MESSAGES);
    assert!(
        received.1 == data,
        "stream bytes differ ({} of {})",
        received.1.len(),
        data.len()
    );
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(
        paths.iter().all(|p| p.received > 50_000),
        "both connections carry the session: {paths:?}"
    );
    // Path 0's connection was the userspace stack's: its device wrote that path's share.
    let device = stack.stats().device;
    assert!(
        device.bytes_written > 50_000,
        "the userspace TCP carried path 0: {device:?}"
    );
    if let Some(server_stack) = &server_stack {
        // … and at the server too: its device read what the client sent on path 0.
        let device = server_stack.stats().device;
        assert!(
            device.bytes_read > 50_000,
            "the server's userspace TCP carried path 0: {device:?}"
        );
    }
    drop(stack);
    drop(server_stack);
    lab.teardown_paths().expect("teardown");
}

// ------------------------------------------------------------- idle memory

/// The uTCP end of a connection to the kernel-TCP server gives back the memory of its
/// buffers once idle (`ConnectionConfig::release_idle_after`), as the kernel substrate does:
/// after 8 MiB each way, its buffers hold a few KiB, and traffic flows again.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn an_idle_utcp_connection_gives_back_its_buffers() {
    if !squarepeg_lab::stack::can_run() {
        return;
    }
    let lab = Lab::start(lab_config("idle", 41, "delay=2ms", "delay=2ms")).expect("start lab");
    let stack = LabStack::attach(&lab, Role::Client, StackConfig::new([]), Some(1500))
        .expect("attach stack");
    let server_addr = SocketAddr::new(lab.addresses().server(false), PORT);
    let mut config = ConnectionConfig::default();
    config.release_idle_after = Some(Duration::from_millis(100));
    let server_config = config.clone();
    std::thread::scope(|s| {
        let (bound_tx, bound_rx) = mpsc::channel();
        let server_ns = lab.server();
        let kernel = s.spawn(move || {
            server_ns
                .run(move || {
                    runtime().block_on(no_hang(async move {
                        let ep = Endpoint::bind(server_addr, server_config)
                            .await
                            .expect("kernel bind");
                        bound_tx.send(()).expect("signal");
                        let conn = ep.accept().await.expect("kernel accept");
                        // Echoes every message back.
                        while let Ok(m) = conn.recv_message().await {
                            if conn
                                .send_message(m.payload, MessageProps::default())
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                    }))
                })
                .expect("enter server namespace")
        });
        runtime().block_on(no_hang(async {
            bound_rx.recv().expect("kernel bound");
            let conn = Connection::connect_utcp(stack.stack(), server_addr, config)
                .await
                .expect("uTCP connect");
            let held = |c: &Connection| c.stats().buffer_bytes;
            for round in 0..2 {
                let sender = conn.clone();
                let send = tokio::spawn(async move {
                    for i in 0..2048u32 {
                        let payload = i.to_be_bytes().repeat(1024);
                        sender
                            .send_message(payload, MessageProps::default())
                            .await
                            .unwrap();
                    }
                });
                let mut most = 0;
                // Delivered as they arrive (unordered over the userspace TCP): each intact,
                // none twice, none missing.
                let mut seen = HashSet::new();
                for k in 0..2048u32 {
                    let m = conn.recv_message().await.unwrap();
                    let i = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
                    assert!(
                        m.payload[..] == i.to_be_bytes().repeat(1024)[..],
                        "message {i} damaged"
                    );
                    assert!(seen.insert(i) && i < 2048, "message {i} twice or unknown");
                    if k % 64 == 0 {
                        most = most.max(held(&conn));
                    }
                }
                send.await.unwrap();
                let mut polls = 0;
                while held(&conn) > 16 * 1024 {
                    polls += 1;
                    assert!(
                        polls < 300,
                        "round {round}: still {} B held (at most {most} in the burst)",
                        held(&conn)
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                eprintln!(
                    "round {round}: at most {most} B in the burst, {} B idle",
                    held(&conn)
                );
                assert!(most >= 64 * 1024, "round {round}: at most {most} B");
            }
            conn.close().await;
        }));
        kernel.join().expect("kernel side");
    });
}
