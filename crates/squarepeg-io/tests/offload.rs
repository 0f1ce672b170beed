//! TUN offloads (IFF_VNET_HDR): the driver really moves super-packets when they are on, and
//! one packet per system call when they are off, with every byte delivered either way (needs
//! root; skipped otherwise).
//!
//! Each case moves 16 MiB each way at once on one connection against the kernel's TCP in the
//! test's own namespace (MTU 1500), checks both SHA-256 digests and a normal close, and then
//! the driver's counters: with offloads the kernel's TSO output must have arrived as
//! super-packets (split into more segments than reads) and squarepeg's bulk segments must have
//! left coalesced (more segments than writes); without, every read and write is one packet.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use squarepeg_io::{CloseReason, Offload, StackStats};
use squarepeg_tcp::DropReason;

const BYTES: u64 = 16 << 20;
const PORT: u16 = 5002;

/// Runs a bidirectional transfer, kernel client to the stack's listener; returns the stack's
/// counters and the capture's flag counts.
fn transfer(offload: Offload, v6: bool) -> Option<(StackStats, FlagCounts)> {
    if !can_run() {
        return None;
    }
    let scratch = ScratchDir::new("off");
    let capture = scratch.0.join("offload.pcap");
    let lab = Lab::start(
        "off",
        LabOptions {
            offload,
            capture: Some((capture.clone(), 96)),
            ..Default::default()
        },
    );
    assert_eq!(lab.stack.offload(), offload != Offload::Off);
    let rt = runtime();
    let listener = lab.stack.listen_port(PORT).expect("listen");
    let to = SocketAddr::new(lab.stack_addr(v6), PORT);
    let (kernel, (stack, reason, _)) = std::thread::scope(|s| {
        let kernel = s.spawn(|| kernel_exchange(lab.kernel_connect(to), BYTES, 1));
        let stack = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(120), async {
                let (conn, _) = listener.accept().await.expect("accept");
                stack_exchange(conn, BYTES, 2).await
            })
            .await
            .expect("stack side finished in time")
        });
        (kernel.join().expect("kernel side"), stack)
    });
    assert_eq!((kernel.received, stack.received), (BYTES, BYTES));
    assert_eq!(kernel.received_digest, stack.sent_digest);
    assert_eq!(stack.received_digest, kernel.sent_digest);
    assert_eq!(reason, CloseReason::Normal);
    let stats = lab.finish();
    let flags = flags_in_capture(&capture, &[lab_v4(), lab_v6()]);
    let d = &stats.device;
    eprintln!(
        "{offload:?} v6={v6}: reads {} for {} packets ({} super-packets → {} segments), \
         writes {} for {} packets ({} coalesced ← {} segments); capture {flags:?}",
        d.reads,
        d.packets_read,
        d.gso_reads,
        d.gso_segments,
        d.writes,
        d.packets_written,
        d.gro_writes,
        d.gro_segments
    );
    assert_eq!(d.offload_errors, 0);
    assert_eq!(d.bad_checksums, 0);
    assert_eq!(d.write_errors, 0);
    assert_eq!(stats.endpoint.resets_sent, 0);
    assert_eq!(flags.rst, [0, 0]);
    Some((stats, flags))
}

fn lab_v4() -> std::net::IpAddr {
    squarepeg_io::LAB_V4.stack
}

fn lab_v6() -> std::net::IpAddr {
    squarepeg_io::LAB_V6.stack
}

fn assert_offloaded(stats: &StackStats, flags: &FlagCounts) {
    let d = &stats.device;
    assert!(d.gso_reads > 0, "no super-packet read: {d:?}");
    assert!(
        d.gso_segments > 2 * d.gso_reads,
        "super-packets of one segment: {d:?}"
    );
    assert!(d.reads < d.packets_read, "{d:?}");
    assert!(d.gro_writes > 0, "nothing coalesced: {d:?}");
    assert!(d.gro_segments > 2 * d.gro_writes, "{d:?}");
    assert!(d.writes < d.packets_written, "{d:?}");
    // The capture holds segments, not super-packets: every one the driver moved (the TCP
    // ones counted by flag; the kernel may add an ICMPv6 solicitation or two).
    assert_eq!(d.captured, d.packets_read + d.packets_written, "{d:?}");
    assert_eq!(flags.packets[1], d.packets_written, "{flags:?} {d:?}");
    assert!(flags.packets[0] + 8 >= d.packets_read, "{flags:?} {d:?}");
    // No endpoint checksum drops: the split's checksums are right and trusted.
    for reason in [DropReason::BadIpChecksum, DropReason::BadTcpChecksum] {
        assert_eq!(stats.endpoint.dropped(reason), 0, "{:?}", stats.endpoint);
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn offloads_move_super_packets_ipv4() {
    if let Some((stats, flags)) = transfer(Offload::On, false) {
        assert_offloaded(&stats, &flags);
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn offloads_move_super_packets_ipv6() {
    if let Some((stats, flags)) = transfer(Offload::On, true) {
        assert_offloaded(&stats, &flags);
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn without_offloads_every_packet_is_a_system_call() {
    if let Some((stats, _)) = transfer(Offload::Off, false) {
        let d = &stats.device;
        assert_eq!((d.gso_reads, d.gso_segments), (0, 0));
        assert_eq!((d.gro_writes, d.gro_segments), (0, 0));
        assert_eq!(d.reads, d.packets_read);
        assert_eq!(d.writes, d.packets_written);
    }
}
