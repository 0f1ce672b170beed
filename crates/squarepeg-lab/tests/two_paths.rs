//! The two-path lab: client and server joined by two independent emulated paths, each with
//! its own delay, rate and loss, that can be cut, blackholed, reset and restored mid-run —
//! what failover and multipath experiments stand on. Kernel TCP bound to each path's
//! addresses, and kernel MPTCP over both (the rival of squarepeg's own multipath).
//!
//! These tests need root (namespaces, veths, AF_PACKET), `ip` and `ethtool`; without them
//! each says SKIPPED and passes. Each lab is removed even when a test fails (the `Lab` guard),
//! and each test checks that none of its namespaces is left. One lab at a time.

#![allow(clippy::needless_range_loop)] // paths are indices into several arrays

#[path = "common/lab.rs"]
mod lab_harness;

use lab_harness::{can_run, lab_lock};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use squarepeg_lab::model::LinkConfig;
use squarepeg_lab::net::{
    self, Lab, LabConfig, NetNs, PathConfig, PathState, TopologyInfo, parse_namespace_name,
};

const MS: Duration = Duration::from_millis(1);
const IPPROTO_MPTCP: i32 = 262;

fn link(spec: &str) -> LinkConfig {
    spec.parse().expect("link spec")
}

/// A lab with two paths: `path0` and `path1` are link specs used in both directions.
fn two_path_lab(name: &str, path0: &str, path1: &str) -> Lab {
    let config = LabConfig::new(name)
        .with_up(link(path0))
        .with_down(link(path0))
        .with_path(
            PathConfig::default()
                .with_up(link(path1))
                .with_down(link(path1))
                .with_seed(1),
        );
    Lab::start(config).expect("start a two-path lab")
}

/// Removes the lab and checks that no namespace of it (or any other of this process's labs
/// of that name) is left.
fn finish(lab: Lab) {
    let info = lab.info().clone();
    lab.teardown_paths().expect("teardown");
    assert_removed(&info);
}

fn assert_removed(info: &TopologyInfo) {
    let pid = std::process::id();
    let left: Vec<String> = std::fs::read_dir(net::NETNS_DIR)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|ns| {
                    parse_namespace_name(ns)
                        .is_some_and(|(p, name, _)| p == pid && name == info.name)
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    for ns in [&info.client_ns, &info.emulator_ns, &info.server_ns] {
        assert!(!NetNs::path_of(ns).exists(), "{ns} left behind");
    }
}

/// The test data: a pattern that differs per stream and per offset.
fn pattern(seed: u8, offset: u64, buf: &mut [u8]) {
    for (i, byte) in buf.iter_mut().enumerate() {
        let at = offset + i as u64;
        *byte = (at.wrapping_mul(31) ^ (at >> 9) ^ u64::from(seed).wrapping_mul(0x9d)) as u8;
    }
}

/// A TCP connection from the client's address on path `client_path` to the server's address
/// on path `server_path` (a plain kernel TCP socket, or MPTCP with `protocol`).
fn connect_via(
    lab: &Lab,
    client_path: usize,
    server_path: usize,
    protocol: Option<Protocol>,
) -> (TcpStream, TcpStream, TcpListener) {
    let server_ip: IpAddr = lab
        .path_addresses(server_path)
        .expect("path")
        .server_v4
        .into();
    let client_ip: IpAddr = lab
        .path_addresses(client_path)
        .expect("path")
        .client_v4
        .into();
    let listener = lab
        .server()
        .run(|| -> std::io::Result<TcpListener> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, protocol)?;
            socket.set_reuse_address(true)?;
            socket.bind(&SocketAddr::new(server_ip, 0).into())?;
            socket.listen(8)?;
            Ok(socket.into())
        })
        .expect("server namespace")
        .expect("listen");
    let target = listener.local_addr().expect("local address");
    let client = lab
        .client()
        .run(|| -> std::io::Result<TcpStream> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, protocol)?;
            socket.bind(&SocketAddr::new(client_ip, 0).into())?;
            socket.connect_timeout(&target.into(), Duration::from_secs(10))?;
            Ok(socket.into())
        })
        .expect("client namespace")
        .expect("connect");
    let (server, _) = listener.accept().expect("accept");
    for stream in [&client, &server] {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        stream
            .set_write_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
    }
    // The listener too: MPTCP's further subflows join through it.
    (client, server, listener)
}

fn connect(lab: &Lab, path: usize) -> (TcpStream, TcpStream) {
    let (client, server, _) = connect_via(lab, path, path, None);
    (client, server)
}

/// Writes `total` bytes of pattern `seed`; the error kind if the stream failed.
fn spawn_writer(mut stream: TcpStream, seed: u8, total: u64) -> JoinHandle<Result<u64, ErrorKind>> {
    thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        let mut sent = 0u64;
        while sent < total {
            let n = (total - sent).min(buf.len() as u64) as usize;
            pattern(seed, sent, &mut buf[..n]);
            stream.write_all(&buf[..n]).map_err(|e| e.kind())?;
            sent += n as u64;
        }
        Ok(sent)
    })
}

/// Reads `total` bytes, checking each against pattern `seed` and counting progress; the
/// error kind if the stream failed or ended early.
fn spawn_reader(
    mut stream: TcpStream,
    seed: u8,
    total: u64,
    progress: Arc<AtomicU64>,
) -> JoinHandle<Result<TcpStream, ErrorKind>> {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut expected = vec![0u8; 64 * 1024];
        let mut received = 0u64;
        while received < total {
            let want = (total - received).min(buf.len() as u64) as usize;
            let n = stream.read(&mut buf[..want]).map_err(|e| e.kind())?;
            if n == 0 {
                return Err(ErrorKind::UnexpectedEof);
            }
            pattern(seed, received, &mut expected[..n]);
            assert!(
                buf[..n] == expected[..n],
                "stream {seed}: bytes differ at {received}"
            );
            received += n as u64;
            progress.store(received, Ordering::SeqCst);
        }
        Ok(stream)
    })
}

/// Waits (bounded) until `check` holds.
fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(10 * MS);
    }
}

/// The smallest of a few request/answer round trips over a connected pair.
fn min_rtt(client: &mut TcpStream, server: &mut TcpStream) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let mut byte = [0u8; 1];
        let started = Instant::now();
        client.write_all(b"?").expect("ping");
        server.read_exact(&mut byte).expect("ping arrives");
        server.write_all(b"!").expect("pong");
        client.read_exact(&mut byte).expect("pong arrives");
        best = best.min(started.elapsed());
    }
    best
}

fn client_link_line(lab: &Lab, path: usize) -> String {
    let dev = lab.path_info(path).expect("path").interfaces.client;
    lab.client()
        .ip(&["-o", "link", "show", "dev", &dev])
        .expect("ip link show")
}

// ---------------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn each_path_carries_its_own_connection_with_its_own_delay() {
    if !can_run("each_path_carries_its_own_connection_with_its_own_delay") {
        return;
    }
    let _lock = lab_lock();
    let lab = two_path_lab(
        "tp-carry",
        "delay=10ms rate=50mbit",
        "delay=40ms rate=50mbit",
    );
    assert_eq!(lab.path_count(), 2);
    let (a, b) = (
        lab.path_addresses(0).expect("0"),
        lab.path_addresses(1).expect("1"),
    );
    assert_eq!(
        a,
        *lab.addresses(),
        "path 0 keeps the single-path addresses"
    );
    assert_ne!(a.client_v4.octets()[..3], b.client_v4.octets()[..3]);
    assert_ne!(a.client_v6.segments()[..4], b.client_v6.segments()[..4]);
    let names = lab.path_info(1).expect("1").interfaces;
    for name in [
        &names.client,
        &names.emulator_client,
        &names.emulator_server,
        &names.server,
    ] {
        assert!(name.len() <= 15 && name.starts_with(&format!("sqpg{}-", std::process::id())));
    }

    let sizes = [1_000_000u64, 2_000_000];
    let mut rtts = Vec::new();
    for path in 0..2 {
        let (mut client, mut server) = connect(&lab, path);
        rtts.push(min_rtt(&mut client, &mut server));
        let progress = Arc::new(AtomicU64::new(0));
        let reader = spawn_reader(server, path as u8, sizes[path], progress);
        let writer = spawn_writer(client, path as u8, sizes[path]);
        assert_eq!(writer.join().expect("writer"), Ok(sizes[path]));
        reader.join().expect("reader").expect("all bytes, equal");
    }
    eprintln!("RTTs: path 0 {:?}, path 1 {:?}", rtts[0], rtts[1]);
    assert!(
        rtts[0] >= 20 * MS,
        "path 0 RTT {:?} below 2 × 10 ms",
        rtts[0]
    );
    assert!(
        rtts[1] >= 80 * MS,
        "path 1 RTT {:?} below 2 × 40 ms",
        rtts[1]
    );

    let stats = lab.path_stats().expect("stats");
    let up: Vec<u64> = stats.iter().map(|s| s.up.ip_bytes_in).collect();
    eprintln!("up bytes per path: {up:?}");
    assert!(
        up[0] >= sizes[0] && up[0] < sizes[1],
        "path 0 carried {} bytes",
        up[0]
    );
    assert!(
        up[1] >= sizes[1] && up[1] < sizes[1] * 11 / 10,
        "path 1 carried {} bytes",
        up[1]
    );
    assert!(stats.iter().all(|s| s.down.ip_packets_out > 0));
    finish(lab);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn blackhole_stalls_one_path_and_restore_resumes_it() {
    if !can_run("blackhole_stalls_one_path_and_restore_resumes_it") {
        return;
    }
    let _lock = lab_lock();
    let lab = two_path_lab(
        "tp-blackhole",
        "delay=5ms rate=20mbit",
        "delay=15ms rate=20mbit",
    );
    let total = 6_000_000u64;
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    let progress = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    for path in 0..2 {
        let (client, server) = connect(&lab, path);
        readers.push(spawn_reader(
            server,
            10 + path as u8,
            total,
            Arc::clone(&progress[path]),
        ));
        writers.push(spawn_writer(client, 10 + path as u8, total));
    }
    wait_for("both paths under way", Duration::from_secs(10), || {
        progress.iter().all(|p| p.load(Ordering::SeqCst) > 300_000)
    });
    lab.path(1).expect("path 1").blackhole().expect("blackhole");
    assert_eq!(lab.path_state(1).expect("state"), PathState::Blackhole);
    // What was on the link when the hole opened still arrives; then nothing.
    thread::sleep(300 * MS);
    let stalled_at = progress[1].load(Ordering::SeqCst);
    let path0_at = progress[0].load(Ordering::SeqCst);
    thread::sleep(1500 * MS);
    assert_eq!(
        progress[1].load(Ordering::SeqCst),
        stalled_at,
        "path 1 moved in the hole"
    );
    assert!(stalled_at < total, "path 1 finished before the blackhole");
    assert!(
        progress[0].load(Ordering::SeqCst) > path0_at + 500_000
            || progress[0].load(Ordering::SeqCst) == total,
        "path 0 stalled too"
    );
    let hole = lab.path(1).expect("path 1").stats().expect("stats");
    assert!(hole.blocked);
    assert!(hole.up.link.dropped_link_down + hole.down.link.dropped_link_down > 0);
    assert_eq!(
        lab.path(0)
            .expect("path 0")
            .stats()
            .expect("stats")
            .up
            .link
            .dropped_link_down,
        0
    );

    lab.path(1).expect("path 1").restore().expect("restore");
    assert_eq!(lab.path_state(1).expect("state"), PathState::Normal);
    for (writer, reader) in writers.into_iter().zip(readers) {
        assert_eq!(writer.join().expect("writer"), Ok(total));
        reader.join().expect("reader").expect("all bytes, equal");
    }
    assert!(!lab.path(1).expect("path 1").stats().expect("stats").blocked);
    finish(lab);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn reset_kills_the_connections_of_one_path_only() {
    if !can_run("reset_kills_the_connections_of_one_path_only") {
        return;
    }
    let _lock = lab_lock();
    let lab = two_path_lab(
        "tp-reset",
        "delay=5ms rate=20mbit",
        "delay=10ms rate=20mbit",
    );
    let total = 4_000_000u64;
    let progress = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for path in 0..2 {
        let (client, server) = connect(&lab, path);
        readers.push(spawn_reader(
            server,
            20 + path as u8,
            total,
            Arc::clone(&progress[path]),
        ));
        writers.push(spawn_writer(client, 20 + path as u8, total));
    }
    // An idle connection on path 1 too, both ends waiting in read.
    let (mut idle_client, mut idle_server) = connect(&lab, 1);
    idle_client.write_all(b"hello").expect("hello");
    let mut hello = [0u8; 5];
    idle_server.read_exact(&mut hello).expect("hello arrives");
    let idle_reads = [idle_client, idle_server]
        .map(|mut s| thread::spawn(move || s.read(&mut [0u8; 16]).map_err(|e| e.kind())));
    wait_for("both paths under way", Duration::from_secs(10), || {
        progress.iter().all(|p| p.load(Ordering::SeqCst) > 300_000)
    });
    let reset = lab.path(1).expect("path 1").reset().expect("reset");
    assert!(reset >= 2, "only {reset} flows tracked on path 1");

    let mut writers = writers.into_iter();
    let mut readers = readers.into_iter();
    let (w0, r0) = (writers.next().expect("w0"), readers.next().expect("r0"));
    let (w1, r1) = (writers.next().expect("w1"), readers.next().expect("r1"));
    assert_eq!(
        w1.join().expect("writer 1").err(),
        Some(ErrorKind::ConnectionReset)
    );
    assert_eq!(
        r1.join().expect("reader 1").err(),
        Some(ErrorKind::ConnectionReset)
    );
    for read in idle_reads {
        assert_eq!(
            read.join().expect("idle").err(),
            Some(ErrorKind::ConnectionReset)
        );
    }
    // Path 0 is untouched, and path 1 carries new connections at once.
    assert_eq!(w0.join().expect("writer 0"), Ok(total));
    r0.join().expect("reader 0").expect("path 0 completes");
    let (mut client, mut server) = connect(&lab, 1);
    client.write_all(b"again").expect("write");
    let mut again = [0u8; 5];
    server.read_exact(&mut again).expect("read");
    assert_eq!(&again, b"again");
    let stats = lab.path(1).expect("path 1").stats().expect("stats");
    assert!(
        stats.up.resets_sent > 0 && stats.down.resets_sent > 0,
        "{}",
        stats.to_json()
    );
    assert_eq!(
        lab.path(0)
            .expect("path 0")
            .stats()
            .expect("stats")
            .down
            .resets_sent,
        0
    );
    finish(lab);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn cut_takes_the_client_interface_down_and_restore_brings_it_back() {
    if !can_run("cut_takes_the_client_interface_down_and_restore_brings_it_back") {
        return;
    }
    let _lock = lab_lock();
    let lab = two_path_lab("tp-cut", "delay=5ms", "delay=5ms");
    assert!(client_link_line(&lab, 1).contains("state UP"));
    lab.path(1).expect("path 1").cut().expect("cut");
    assert_eq!(lab.path_state(1).expect("state"), PathState::Cut);
    let line = client_link_line(&lab, 1);
    assert!(
        line.contains("state DOWN") && !line.contains(",UP"),
        "{line}"
    );
    assert!(lab.path(1).expect("path 1").stats().expect("stats").blocked);
    // The kernel knows: connecting from path 1's address fails at once (to either server
    // address: nothing falls through to path 0), while path 0 works.
    let (a, b) = (
        lab.path_addresses(0).expect("0"),
        lab.path_addresses(1).expect("1"),
    );
    for server in [b.server_v4, a.server_v4] {
        let refused = lab
            .client()
            .run(|| -> std::io::Result<()> {
                let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
                socket.bind(&SocketAddr::new(b.client_v4.into(), 0).into())?;
                socket.connect_timeout(
                    &SocketAddr::new(server.into(), 9).into(),
                    Duration::from_secs(2),
                )
            })
            .expect("client namespace");
        let kind = refused.err().map(|e| e.kind());
        assert!(
            matches!(
                kind,
                Some(ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable)
            ),
            "from a cut path's address to {server}: {kind:?}"
        );
    }
    let (mut client, mut server) = connect(&lab, 0);
    assert!(min_rtt(&mut client, &mut server) >= 10 * MS);

    lab.path(1).expect("path 1").restore().expect("restore");
    let line = client_link_line(&lab, 1);
    assert!(line.contains("state UP"), "{line}");
    let (mut client, mut server) = connect(&lab, 1);
    assert!(min_rtt(&mut client, &mut server) >= 10 * MS);
    // IPv6 came back too (addresses kept over the link's down time).
    let v6 = lab
        .client()
        .ip(&[
            "-6",
            "-o",
            "addr",
            "show",
            "dev",
            &lab.path_info(1).expect("1").interfaces.client,
        ])
        .expect("ip addr");
    assert!(v6.contains(&b.client_v6.to_string()), "{v6}");
    finish(lab);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn kernel_mptcp_uses_both_paths_and_survives_a_blackhole() {
    if !can_run("kernel_mptcp_uses_both_paths_and_survives_a_blackhole") {
        return;
    }
    let _lock = lab_lock();
    let lab = two_path_lab(
        "tp-mptcp",
        "delay=10ms rate=20mbit",
        "delay=20ms rate=20mbit",
    );
    let mptcp = Some(Protocol::from(IPPROTO_MPTCP));
    let supported = lab
        .client()
        .run(|| Socket::new(Domain::IPV4, Type::STREAM, mptcp).is_ok())
        .expect("client namespace");
    if !supported {
        eprintln!("SKIPPED kernel_mptcp_uses_both_paths_and_survives_a_blackhole: no MPTCP");
        finish(lab);
        return;
    }
    let path1 = lab.path_info(1).expect("1");
    for ns in [lab.client(), lab.server()] {
        ns.ip(&[
            "mptcp",
            "limits",
            "set",
            "subflows",
            "4",
            "add_addr_accepted",
            "4",
        ])
        .expect("mptcp limits");
    }
    lab.client()
        .ip(&[
            "mptcp",
            "endpoint",
            "add",
            &path1.addresses.client_v4.to_string(),
            "dev",
            &path1.interfaces.client,
            "subflow",
        ])
        .expect("mptcp endpoint");

    let total = 12_000_000u64;
    let (client, server, _listener) = connect_via(&lab, 0, 0, mptcp);
    let progress = Arc::new(AtomicU64::new(0));
    let reader = spawn_reader(server, 30, total, Arc::clone(&progress));
    let writer = spawn_writer(client, 30, total);
    let up_bytes = |path: usize| {
        lab.path(path)
            .expect("path")
            .stats()
            .expect("stats")
            .up
            .ip_bytes_in
    };
    wait_for("data on both paths", Duration::from_secs(10), || {
        up_bytes(0) > 200_000 && up_bytes(1) > 200_000
    });
    assert!(
        progress.load(Ordering::SeqCst) < total / 2,
        "too fast to test the blackhole"
    );
    lab.path(0).expect("path 0").blackhole().expect("blackhole");
    let path1_at_blackhole = up_bytes(1);
    assert_eq!(writer.join().expect("writer"), Ok(total));
    reader
        .join()
        .expect("reader")
        .expect("all bytes, equal, over path 1");
    let path1_after = up_bytes(1);
    eprintln!(
        "MPTCP: path 0 {} bytes up, path 1 {} at the blackhole, {} at the end",
        up_bytes(0),
        path1_at_blackhole,
        path1_after
    );
    assert!(
        path1_after > path1_at_blackhole + 1_000_000,
        "path 1 did not take over"
    );
    finish(lab);
}

#[test]
fn path_config_is_serde_and_path_zero_unchanged() {
    let single = LabConfig::new("x");
    let json = serde_json::to_string(&single).expect("json");
    assert!(!json.contains("extra_paths"), "{json}");
    let two = single
        .clone()
        .with_path(PathConfig::default().with_up(link("delay=5ms")));
    assert_eq!(two.path_count(), 2);
    let back: LabConfig =
        serde_json::from_str(&serde_json::to_string(&two).expect("json")).expect("parse");
    assert_eq!(back, two);
    assert_eq!(two.path(0).expect("0").up, single.up);
    let addresses = net::Addresses::derive_paths(7, "x", 4);
    assert_eq!(addresses[0], net::Addresses::derive(7, "x"));
    for i in 0..4 {
        for j in 0..i {
            assert_ne!(
                addresses[i].client_v4.octets()[..3],
                addresses[j].client_v4.octets()[..3]
            );
        }
    }
    for i in 1..4 {
        let ifs = net::Interfaces::for_path(4_194_304, i);
        assert!(ifs.emulator_server.len() <= 15, "{}", ifs.emulator_server);
    }
    let too_many = (0..4).fold(LabConfig::new("y"), |c, _| {
        c.with_path(PathConfig::default())
    });
    assert!(matches!(too_many.validate(), Err(net::NetError::Paths(5))));
}
