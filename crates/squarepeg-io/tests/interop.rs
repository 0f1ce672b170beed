//! Interoperability with the Linux kernel's TCP over a TUN device, in a network namespace of
//! each test's own (needs root; skipped otherwise).
//!
//! Every case moves data both ways at once on one connection — the kernel and squarepeg each
//! send a seeded pseudo-random stream, then FIN — and checks:
//! - each receiver's byte count and SHA-256 equal the sender's;
//! - the connection closed normally on squarepeg's side (both FINs exchanged and
//!   acknowledged) and the kernel read its end of stream;
//! - the capture of the device (headers only) shows a FIN from each side and no RST at all.
//!
//! Clean path: 64 MiB each way, MSS from MTU 1500 (1460 for IPv4, 1440 for IPv6) and MSS 536
//! (both ends advertise it: squarepeg by configuration, the kernel by TCP_MAXSEG), IPv4 and
//! IPv6, kernel client → squarepeg server and squarepeg client → kernel server. The device
//! keeps the kernel's default transmit queue (500 packets): when the kernel outpaces the driver
//! it drops there and retransmits (the summary line prints how many), so even the clean path
//! exercises squarepeg's out-of-order receive and the kernel's loss recovery against it.
//!
//! Impaired path: the same matrix through the driver's impairment shim (the lab's link model,
//! one direction each way, seeded): 2 ms one-way delay, 1 % random loss, and 1 % of packets
//! held back 3 ms (so later ones overtake them), in both directions. At this loss rate TCP's
//! throughput is a few MB/s (Mathis: MSS/RTT · 1.22/√p), so these cases move 4 MiB each way
//! to stay within a few seconds.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use squarepeg_io::{CloseReason, Impairment};
use squarepeg_lab::model::LinkConfig;

const CLEAN_BYTES: u64 = 64 << 20;
const IMPAIRED_BYTES: u64 = 4 << 20;
const PORT: u16 = 5001;

#[derive(Clone, Copy, Debug)]
enum Role {
    /// The kernel connects to squarepeg's listener.
    KernelClient,
    /// Squarepeg connects to the kernel's listener.
    StackClient,
}

fn impaired_path(seed: u64) -> Impairment {
    let link = LinkConfig::new()
        .with_delay(Duration::from_millis(2))
        .with_loss(0.01)
        .with_reorder(0.01, Duration::from_millis(3));
    squarepeg_lab::stack::impairment(link.clone(), link, seed).expect("link config")
}

fn run_case(role: Role, v6: bool, mss: Option<u16>, impaired: bool) {
    if !can_run() {
        return;
    }
    let bytes = if impaired {
        IMPAIRED_BYTES
    } else {
        CLEAN_BYTES
    };
    let scratch = ScratchDir::new("cap");
    let capture = scratch.0.join("interop.pcap");
    let options = LabOptions {
        mtu: 1500,
        mss,
        impairment: impaired.then(|| impaired_path(0x5eed ^ u64::from(v6) ^ bytes)),
        capture: Some((capture.clone(), 96)),
        ..Default::default()
    };
    let lab = Lab::start("io", options);
    let started = std::time::Instant::now();
    let (kernel_seed, stack_seed) = (11, 22);
    let rt = runtime();

    let (kernel, (stack, reason, conn_stats)) = match role {
        Role::KernelClient => {
            let listener = lab.stack.listen_port(PORT).expect("listen");
            let to = SocketAddr::new(lab.stack_addr(v6), PORT);
            std::thread::scope(|s| {
                let kernel = s.spawn(|| {
                    let stream = lab.kernel_connect(to);
                    kernel_exchange(stream, bytes, kernel_seed)
                });
                let stack = rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(180), async {
                        let (conn, peer) = listener.accept().await.expect("accept");
                        assert_eq!(peer.ip(), lab.kernel_addr(v6));
                        stack_exchange(conn, bytes, stack_seed).await
                    })
                    .await
                    .expect("stack side finished in time")
                });
                (kernel.join().expect("kernel side"), stack)
            })
        }
        Role::StackClient => {
            let listener = lab.kernel_listen(v6, PORT);
            let to = SocketAddr::new(lab.kernel_addr(v6), PORT);
            std::thread::scope(|s| {
                let kernel = s.spawn(|| {
                    let (stream, peer) = listener.accept().expect("kernel accept");
                    assert_eq!(peer.ip(), lab.stack_addr(v6));
                    stream
                        .set_read_timeout(Some(Duration::from_secs(60)))
                        .unwrap();
                    kernel_exchange(stream, bytes, kernel_seed)
                });
                let stack = rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(180), async {
                        let conn = lab.stack.connect(to).await.expect("connect");
                        let n = conn.negotiated().unwrap();
                        assert!(n.sack && n.timestamps && n.send_window_scale.is_some());
                        stack_exchange(conn, bytes, stack_seed).await
                    })
                    .await
                    .expect("stack side finished in time")
                });
                (kernel.join().expect("kernel side"), stack)
            })
        }
    };

    // Every byte arrived, in order, both ways.
    assert_eq!(kernel.received, bytes, "bytes squarepeg → kernel");
    assert_eq!(stack.received, bytes, "bytes kernel → squarepeg");
    assert_eq!(
        kernel.received_digest, stack.sent_digest,
        "SHA-256 squarepeg → kernel"
    );
    assert_eq!(
        stack.received_digest, kernel.sent_digest,
        "SHA-256 kernel → squarepeg"
    );
    assert_eq!(reason, CloseReason::Normal);
    let expected_mss = mss.map(|m| m - 12);
    if let Some(m) = expected_mss {
        assert_eq!(conn_stats.send_mss, m, "segment payload with timestamps");
    }
    if impaired {
        assert!(
            conn_stats.packets_retransmitted > 0,
            "1 % loss must cost retransmissions"
        );
    }

    let counters = lab.device_counters();
    let stats = lab.finish();
    assert_eq!(stats.endpoint.resets_sent, 0);
    if impaired {
        let inbound = stats.inbound.as_ref().unwrap();
        let outbound = stats.outbound.as_ref().unwrap();
        assert!(inbound.dropped > 0 && outbound.dropped > 0);
        assert!(inbound.reordered > 0 && outbound.reordered > 0);
    }
    let flags = flags_in_capture(&capture, &[lab_stack_v4(), lab_stack_v6()]);
    eprintln!(
        "{role:?} v6={v6} mss={mss:?} impaired={impaired}: {bytes} B each way in {:.2?}; \
         squarepeg sent {} packets, retransmitted {} ({} fast, {} RTO); \
         kernel → TUN drops {}; device reads {} writes {} for {} / {} packets, super-packets \
         split {} coalesced {}; capture {flags:?}",
        started.elapsed(),
        conn_stats.packets_sent,
        conn_stats.packets_retransmitted,
        conn_stats.fast_retransmits,
        conn_stats.rto_timeouts,
        counters.tx_dropped,
        stats.device.reads,
        stats.device.writes,
        stats.device.packets_read,
        stats.device.packets_written,
        stats.device.gso_reads,
        stats.device.gro_writes,
    );
    assert_eq!(stats.device.offload_errors, 0);
    assert_eq!(stats.device.bad_checksums, 0);
    assert_eq!(flags.rst, [0, 0], "no RST in the capture: {flags:?}");
    assert!(
        flags.fin[0] >= 1 && flags.fin[1] >= 1,
        "FIN both ways: {flags:?}"
    );
    match role {
        Role::KernelClient => assert!(flags.syn[0] >= 1 && flags.syn_ack[1] >= 1),
        Role::StackClient => assert!(flags.syn[1] >= 1 && flags.syn_ack[0] >= 1),
    }
}

fn lab_stack_v4() -> std::net::IpAddr {
    squarepeg_io::LAB_V4.stack
}

fn lab_stack_v6() -> std::net::IpAddr {
    squarepeg_io::LAB_V6.stack
}

macro_rules! case {
    ($name:ident, $role:ident, $v6:expr, $mss:expr, $impaired:expr) => {
        #[test]
        #[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
        fn $name() {
            run_case(Role::$role, $v6, $mss, $impaired);
        }
    };
}

case!(kernel_client_ipv4_mtu_mss, KernelClient, false, None, false);
case!(
    kernel_client_ipv4_mss536,
    KernelClient,
    false,
    Some(536),
    false
);
case!(kernel_client_ipv6_mtu_mss, KernelClient, true, None, false);
case!(
    kernel_client_ipv6_mss536,
    KernelClient,
    true,
    Some(536),
    false
);
case!(stack_client_ipv4_mtu_mss, StackClient, false, None, false);
case!(
    stack_client_ipv4_mss536,
    StackClient,
    false,
    Some(536),
    false
);
case!(stack_client_ipv6_mtu_mss, StackClient, true, None, false);
case!(
    stack_client_ipv6_mss536,
    StackClient,
    true,
    Some(536),
    false
);

case!(
    impaired_kernel_client_ipv4_mtu_mss,
    KernelClient,
    false,
    None,
    true
);
case!(
    impaired_kernel_client_ipv4_mss536,
    KernelClient,
    false,
    Some(536),
    true
);
case!(
    impaired_kernel_client_ipv6_mtu_mss,
    KernelClient,
    true,
    None,
    true
);
case!(
    impaired_kernel_client_ipv6_mss536,
    KernelClient,
    true,
    Some(536),
    true
);
case!(
    impaired_stack_client_ipv4_mtu_mss,
    StackClient,
    false,
    None,
    true
);
case!(
    impaired_stack_client_ipv4_mss536,
    StackClient,
    false,
    Some(536),
    true
);
case!(
    impaired_stack_client_ipv6_mtu_mss,
    StackClient,
    true,
    None,
    true
);
case!(
    impaired_stack_client_ipv6_mss536,
    StackClient,
    true,
    Some(536),
    true
);

/// Flow control against the kernel: each side's reader stalls until the other's sender has
/// filled its window (a small one), then drains. The kernel probes squarepeg's zero window and
/// squarepeg must announce the reopened window; squarepeg probes the kernel's (RFC 9293
/// §3.8.6.1) and resumes when the kernel reopens it. Everything arrives, both ways.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn zero_windows_both_ways() {
    if !can_run() {
        return;
    }
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BYTES: usize = 2 << 20;
    let lab = Lab::start("zwin", LabOptions::default());
    let rt = runtime();
    let data: Vec<u8> = (0..BYTES).map(|i| (i * 7 % 251) as u8).collect();

    // Kernel → squarepeg, squarepeg's 64 KiB receive buffer full while it sleeps.
    let mut small = squarepeg_io::ConnectionConfig::default();
    small.recv_buffer = 64 << 10;
    let addr = SocketAddr::new(lab.stack_addr(false), 7600);
    let listener = lab.stack.listen_with(&[addr], small).unwrap();
    std::thread::scope(|s| {
        let kernel = s.spawn(|| {
            let mut c = lab.kernel_connect(addr);
            c.write_all(&data).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            c.read_to_end(&mut rest).unwrap();
        });
        let got = rt.block_on(async {
            let (mut c, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_millis(600)).await;
            let stats = c.stats().unwrap();
            assert_eq!(stats.recv_window, 0, "the window closed while we slept");
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            c.shutdown().await.unwrap();
            c.wait_closed().await.unwrap();
            got
        });
        kernel.join().unwrap();
        assert!(got == data, "kernel → squarepeg bytes differ");
    });

    // Squarepeg → kernel, the kernel's small receive buffer full while its reader sleeps.
    let klistener = {
        let s = lab
            .ns
            .run(|| {
                socket2::Socket::new(
                    socket2::Domain::IPV4,
                    socket2::Type::STREAM,
                    Some(socket2::Protocol::TCP),
                )
            })
            .unwrap()
            .unwrap();
        s.set_recv_buffer_size(4096).unwrap();
        s.bind(&SocketAddr::new(lab.kernel_addr(false), 7601).into())
            .unwrap();
        s.listen(4).unwrap();
        std::net::TcpListener::from(s)
    };
    std::thread::scope(|s| {
        let kernel = s.spawn(|| {
            let (mut c, _) = klistener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            got
        });
        let stats = rt.block_on(async {
            let to = SocketAddr::new(lab.kernel_addr(false), 7601);
            let mut c = lab.stack.connect(to).await.unwrap();
            c.write_all(&data).await.unwrap();
            c.shutdown().await.unwrap();
            let mut rest = Vec::new();
            c.read_to_end(&mut rest).await.unwrap();
            c.wait_closed().await.unwrap();
            c.stats().unwrap()
        });
        let got = kernel.join().unwrap();
        assert!(got == data, "squarepeg → kernel bytes differ");
        assert!(
            stats.zero_window_probes > 0,
            "probed the kernel's zero window: {stats:?}"
        );
    });
    let stats = lab.finish();
    assert_eq!(stats.endpoint.resets_sent, 0);
}

/// The same exchange with squarepeg offering no TCP options beyond MSS (no window scaling, no
/// SACK, no timestamps), through the impaired path: the kernel falls back to the RFC 9293
/// basics and squarepeg recovers losses with NewReno (RFC 6582), both roles, IPv4.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn impaired_without_options_both_roles() {
    if !can_run() {
        return;
    }
    const BYTES: u64 = 1 << 20;
    let mut plain = squarepeg_io::ConnectionConfig::default();
    plain.window_scaling = false;
    plain.sack = false;
    plain.timestamps = false;
    let lab = Lab::start(
        "plain",
        LabOptions {
            impairment: Some(impaired_path(99)),
            ..Default::default()
        },
    );
    let rt = runtime();
    // Kernel client → squarepeg server.
    let addr = SocketAddr::new(lab.stack_addr(false), 7700);
    let listener = lab.stack.listen_with(&[addr], plain.clone()).unwrap();
    std::thread::scope(|s| {
        let kernel = s.spawn(|| kernel_exchange(lab.kernel_connect(addr), BYTES, 1));
        let (stack, reason, stats) = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(120), async {
                let (c, _) = listener.accept().await.unwrap();
                let n = c.negotiated().unwrap();
                assert!(!n.sack && !n.timestamps && n.send_window_scale.is_none());
                stack_exchange(c, BYTES, 2).await
            })
            .await
            .expect("in time")
        });
        let kernel = kernel.join().unwrap();
        assert_eq!(stack.received_digest, kernel.sent_digest);
        assert_eq!(kernel.received_digest, stack.sent_digest);
        assert_eq!(reason, CloseReason::Normal);
        assert!(stats.packets_retransmitted > 0);
    });
    // Squarepeg client → kernel server.
    let klistener = lab.kernel_listen(false, 7701);
    let to = SocketAddr::new(lab.kernel_addr(false), 7701);
    std::thread::scope(|s| {
        let kernel = s.spawn(|| kernel_exchange(klistener.accept().unwrap().0, BYTES, 3));
        let (stack, reason, _) = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(120), async {
                let c = lab.stack.connect_with(to, plain.clone()).await.unwrap();
                stack_exchange(c, BYTES, 4).await
            })
            .await
            .expect("in time")
        });
        let kernel = kernel.join().unwrap();
        assert_eq!(stack.received_digest, kernel.sent_digest);
        assert_eq!(kernel.received_digest, stack.sent_digest);
        assert_eq!(reason, CloseReason::Normal);
    });
    let stats = lab.finish();
    assert_eq!(stats.endpoint.resets_sent, 0);
}

/// A kernel client against a squarepeg listener that answers every SYN with a SYN cookie
/// (RFC 4987 §3.6): the options the cookie carries in the timestamp (window scale, SACK) must
/// come back to life, and the exchange is the same as without cookies.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn kernel_client_against_syn_cookies() {
    if !can_run() {
        return;
    }
    const BYTES: u64 = 4 << 20;
    for v6 in [false, true] {
        let lab = Lab::start(
            "cookie",
            LabOptions {
                syn_cookies_always: true,
                ..Default::default()
            },
        );
        let listener = lab.stack.listen_port(7800).unwrap();
        let to = SocketAddr::new(lab.stack_addr(v6), 7800);
        let rt = runtime();
        std::thread::scope(|s| {
            let kernel = s.spawn(|| kernel_exchange(lab.kernel_connect(to), BYTES, 1));
            let (stack, reason, _) = rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(60), async {
                    let (c, _) = listener.accept().await.unwrap();
                    let n = c.negotiated().unwrap();
                    assert!(
                        n.sack && n.timestamps && n.send_window_scale.is_some(),
                        "{n:?}"
                    );
                    stack_exchange(c, BYTES, 2).await
                })
                .await
                .expect("in time")
            });
            let kernel = kernel.join().unwrap();
            assert_eq!(stack.received_digest, kernel.sent_digest);
            assert_eq!(kernel.received_digest, stack.sent_digest);
            assert_eq!(reason, CloseReason::Normal);
        });
        let stats = lab.finish();
        assert_eq!(stats.endpoint.syn_cookies_sent, 1);
        assert_eq!(stats.endpoint.syn_cookies_accepted, 1);
        assert_eq!(stats.endpoint.resets_sent, 0);
    }
}
