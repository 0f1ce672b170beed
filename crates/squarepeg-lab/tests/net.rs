//! The real network lab: calibration of the emulator against its configuration, middlebox
//! behaviours seen in captures with kernel TCP running through them, agreement with the
//! simulator, and certain cleanup.
//!
//! These tests need root (namespaces, veths, AF_PACKET), `ip` and `ethtool`; without them
//! each test says SKIPPED and passes. CI runs them as root. Each builds its own lab (names
//! carry the test process's pid) and removes it even when it fails (the `Lab` guard); the
//! tests take a lock so that one lab runs at a time and timing is not disturbed by another.

#[path = "common/lab.rs"]
mod lab_harness;

use lab_harness::{can_run, lab_lock};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use sha2::{Digest, Sha256};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use squarepeg_lab::Side;
use squarepeg_lab::checksum;
use squarepeg_lab::middlebox::parse_middleboxes;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_lab::net::{self, CaptureSide, Lab, LabConfig, NetNs, TopologyInfo, capture_path};
use squarepeg_lab::pcap::read_pcap;
use squarepeg_lab::sim::{
    KIND_DATA, PeriodicFlow, SimConfig, Simulator, UdpHost, decode_payload, encode_payload,
};

const MS: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------------
// Harness

/// Asserts that none of a lab's namespaces is left.
fn assert_removed(info: &TopologyInfo) {
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for ns in [&info.client_ns, &info.emulator_ns, &info.server_ns] {
        assert!(!listed.contains(ns.as_str()), "{ns} left behind: {listed}");
        assert!(!NetNs::path_of(ns).exists(), "{ns} left behind");
    }
}

/// Waits until the emulator holds no packet (the last ones are delivered and captured).
fn settle(lab: &Lab) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.stats().expect("stats").in_flight > 0 {
        assert!(Instant::now() < deadline, "packets still in flight");
        thread::sleep(MS);
    }
}

/// Stops and removes a lab once its packets are delivered, checks nothing is left, returns
/// the final counters.
fn finish(lab: Lab) -> net::EmulatorStats {
    settle(&lab);
    let info = lab.info().clone();
    let stats = lab.teardown().expect("teardown");
    assert_removed(&info);
    stats
}

/// A scratch directory for captures, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sqpg-net-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn link(spec: &str) -> LinkConfig {
    spec.parse().expect("link spec")
}

fn bind_udp(ns: &NetNs, address: SocketAddr) -> UdpSocket {
    ns.run(|| -> std::io::Result<UdpSocket> {
        let socket = Socket::new(Domain::for_address(address), Type::DGRAM, None)?;
        // Room for a burst of thousands of datagrams while the reader is descheduled.
        socket.set_recv_buffer_size(8 << 20)?;
        socket.set_send_buffer_size(8 << 20)?;
        socket.bind(&address.into())?;
        Ok(socket.into())
    })
    .expect("enter namespace")
    .expect("bind")
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    assert!(!sorted.is_empty());
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index]
}

/// Half-width of a two-sided bound on a binomial count: `z` standard deviations (z = 5: a
/// correct emulator fails about once in 1.7 million runs).
fn binomial_bound(n: u64, p: f64, z: f64) -> f64 {
    z * (n as f64 * p * (1.0 - p)).sqrt()
}

// ---------------------------------------------------------------------------------------------
// Calibration: delay

/// UDP echo: the server sends every datagram back; returns the thread, stopped by `stop`.
fn spawn_echo(socket: UdpSocket, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    socket
        .set_read_timeout(Some(50 * MS))
        .expect("read timeout");
    thread::spawn(move || {
        let mut echoed = 0;
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            if let Ok((n, from)) = socket.recv_from(&mut buf) {
                socket.send_to(&buf[..n], from).expect("echo");
                echoed += 1;
            }
        }
        echoed
    })
}

/// Round trips of `count` probes sent every `interval` from the client, in order of sending.
fn udp_rtts(lab: &Lab, ipv6: bool, count: u64, interval: Duration) -> Vec<Duration> {
    let addresses = lab.addresses();
    let server_addr = SocketAddr::new(addresses.server(ipv6), 7007);
    let server = bind_udp(lab.server(), server_addr);
    let client = bind_udp(lab.client(), SocketAddr::new(addresses.client(ipv6), 0));
    client.set_read_timeout(Some(MS)).expect("timeout");
    let stop = Arc::new(AtomicBool::new(false));
    let echo = spawn_echo(server, Arc::clone(&stop));
    let epoch = Instant::now();
    let mut sent_at = vec![None; count as usize];
    let mut rtts = vec![None; count as usize];
    let mut buf = [0u8; 2048];
    let mut receive = |rtts: &mut Vec<Option<Duration>>, sent_at: &[Option<Instant>]| {
        while let Ok((n, _)) = client.recv_from(&mut buf) {
            let now = Instant::now();
            let (_, seq, _) = decode_payload(&buf[..n]).expect("a probe comes back intact");
            let sent = sent_at[seq as usize].expect("echo of a probe sent");
            rtts[seq as usize] = Some(now - sent);
        }
    };
    for seq in 0..count {
        let target = epoch + interval * seq as u32;
        while Instant::now() < target {
            receive(&mut rtts, &sent_at);
        }
        let payload = encode_payload(KIND_DATA, seq, Instant::now() - epoch, 64);
        sent_at[seq as usize] = Some(Instant::now());
        client.send_to(&payload, server_addr).expect("send probe");
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while rtts.iter().any(Option::is_none) && Instant::now() < deadline {
        receive(&mut rtts, &sent_at);
    }
    stop.store(true, Ordering::Relaxed);
    echo.join().expect("echo thread");
    let lost = rtts.iter().filter(|r| r.is_none()).count();
    assert_eq!(lost, 0, "probes lost on a lossless path");
    rtts.into_iter().flatten().collect()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn rtt_matches_the_configured_delay_within_a_millisecond() {
    if !can_run("rtt_matches_the_configured_delay_within_a_millisecond") {
        return;
    }
    let _lock = lab_lock();
    let config = LabConfig::new("rtt")
        .with_up(link("delay=20ms"))
        .with_down(link("delay=20ms"));
    let lab = Lab::start(config).expect("lab");
    let configured = 40 * MS;
    for ipv6 in [false, true] {
        // A VM thread stalled for a few milliseconds moves the median: a miss is measured
        // again, up to three times in all (an emulator that is late every time still fails).
        // Early is never allowed.
        for attempt in 1..=3 {
            let mut rtts = udp_rtts(&lab, ipv6, 300, 3 * MS);
            rtts.sort();
            let (min, median, p99) = (rtts[0], quantile(&rtts, 0.5), quantile(&rtts, 0.99));
            eprintln!(
                "RTT over IPv{} (configured {configured:?}): min {min:?}, median {median:?}, p99 {p99:?}",
                if ipv6 { 6 } else { 4 }
            );
            // Never early: the model's delay is a floor.
            assert!(min >= configured, "a probe came back in {min:?}");
            if median - configured < MS {
                break;
            }
            assert!(
                attempt < 3,
                "median RTT {median:?} is not within 1 ms of {configured:?}, three times"
            );
        }
    }
    // Ping agrees (ICMP through the same path).
    let ping = lab
        .client()
        .command("ping")
        .args(["-c", "5", "-i", "0.05", "-q"])
        .arg(lab.addresses().server_v4.to_string())
        .output();
    if let Ok(ping) = ping {
        let text = String::from_utf8_lossy(&ping.stdout);
        eprintln!("ping: {}", text.lines().last().unwrap_or(""));
        assert!(ping.status.success(), "ping failed: {text}");
    }
    let stats = finish(lab);
    eprintln!(
        "emulator lateness up {:?} down {:?}",
        stats.up.lateness, stats.down.lateness
    );
    assert_eq!(stats.up.send_errors + stats.down.send_errors, 0);
    assert_eq!(stats.up.link.dropped(), 0);
}

// ---------------------------------------------------------------------------------------------
// Calibration: loss

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn loss_rate_is_within_binomial_bounds_over_20000_datagrams() {
    if !can_run("loss_rate_is_within_binomial_bounds_over_20000_datagrams") {
        return;
    }
    let _lock = lab_lock();
    let p = 0.01;
    let config = LabConfig::new("loss")
        .with_up(link("delay=5ms loss=1%"))
        .with_down(link("delay=5ms"))
        .with_seed(0x5eed);
    let lab = Lab::start(config).expect("lab");
    let server_addr = SocketAddr::new(lab.addresses().server_v4.into(), 7008);
    let server = bind_udp(lab.server(), server_addr);
    server.set_read_timeout(Some(500 * MS)).expect("timeout");
    let client = bind_udp(
        lab.client(),
        SocketAddr::new(lab.addresses().client_v4.into(), 0),
    );
    let n: u64 = 20_000;
    let receiver = thread::spawn(move || {
        let mut seen = vec![false; n as usize];
        let mut buf = [0u8; 2048];
        // Stops 500 ms after the last datagram.
        while let Ok((len, _)) = server.recv_from(&mut buf) {
            let (_, seq, _) = decode_payload(&buf[..len]).expect("datagram intact");
            assert!(!seen[seq as usize], "datagram {seq} arrived twice");
            seen[seq as usize] = true;
        }
        seen.iter().filter(|&&s| s).count() as u64
    });
    // 20 datagrams every millisecond: a modest 20 000 packets/s.
    let epoch = Instant::now();
    for seq in 0..n {
        if seq % 20 == 0 {
            let target = epoch + MS * (seq / 20) as u32;
            if let Some(wait) = target.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
        }
        let payload = encode_payload(KIND_DATA, seq, Duration::ZERO, 100);
        client.send_to(&payload, server_addr).expect("send");
    }
    let received = receiver.join().expect("receiver");
    let stats = finish(lab);
    let lost = n - received;
    let expected = n as f64 * p;
    let bound = binomial_bound(n, p, 5.0);
    eprintln!(
        "loss: {lost} of {n} lost ({:.3} %), configured 1 %, 5σ bound {expected:.0} ± {bound:.0}",
        lost as f64 * 100.0 / n as f64
    );
    assert!(
        (lost as f64 - expected).abs() <= bound,
        "{lost} losses is outside {expected} ± {bound}"
    );
    // And every loss is the model's: nothing lost anywhere else on the way.
    assert_eq!(stats.up.link.offered, n);
    assert_eq!(stats.up.link.dropped_random_loss, lost);
    assert_eq!(
        stats.up.kernel_drops + stats.up.send_errors + stats.up.dropped_overload,
        0
    );
}

// ---------------------------------------------------------------------------------------------
// Calibration: rate

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn rate_limited_path_carries_kernel_tcp_at_the_configured_rate() {
    if !can_run("rate_limited_path_carries_kernel_tcp_at_the_configured_rate") {
        return;
    }
    let _lock = lab_lock();
    // A VM thread stalled for a while in the 5 s window costs the emulator some of its rate:
    // a miss is measured again, on a lab of its own, up to three times in all (a wrong rate
    // still fails).
    for attempt in 1..=3 {
        if rate_limited_goodput_is_right(attempt == 3) {
            return;
        }
    }
}

/// One measurement of [`rate_limited_path_carries_kernel_tcp_at_the_configured_rate`]:
/// whether the goodput was within 5 % of the link's rate (`last`: assert it).
fn rate_limited_goodput_is_right(last: bool) -> bool {
    // 20 Mbit/s with 10 ms each way: the bandwidth-delay product is 20e6 × 0.02 / 8 = 50 000
    // bytes, and the queue holds one BDP.
    let rate = 20_000_000.0;
    let config = LabConfig::new("rate")
        .with_up(link("rate=20mbit delay=10ms queue=50000b"))
        .with_down(link("delay=10ms"));
    let lab = Lab::start(config).expect("lab");
    let server_addr = SocketAddr::new(lab.addresses().server_v4.into(), 7009);
    let listener = lab
        .server()
        .run(|| TcpListener::bind(server_addr))
        .expect("ns")
        .expect("listen");
    let warmup = Duration::from_secs(1);
    let window = Duration::from_secs(5);
    let reader = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 256 * 1024];
        let mut total: u64 = 0;
        let mut first: Option<Instant> = None;
        let mut mark: Option<(Instant, u64)> = None;
        loop {
            let n = stream.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            let now = Instant::now();
            total += n as u64;
            let start = *first.get_or_insert(now);
            if mark.is_none() && now - start >= warmup {
                mark = Some((now, total));
            }
            if let Some((t0, b0)) = mark
                && now - t0 >= window
            {
                return (total - b0) as f64 * 8.0 / (now - t0).as_secs_f64();
            }
        }
        panic!("the sender stopped before the measurement window ended");
    });
    let stream = lab
        .client()
        .run(|| TcpStream::connect(server_addr))
        .expect("ns")
        .expect("connect");
    let writer = thread::spawn(move || {
        let mut stream = stream;
        let chunk = vec![0x5au8; 64 * 1024];
        // Until the reader has its figure and closes.
        while stream.write_all(&chunk).is_ok() {}
    });
    let goodput = reader.join().expect("reader");
    writer.join().expect("writer");
    let stats = finish(lab);
    // The model counts IP bytes: each full segment is a 1500-byte IP packet (the veth MTU)
    // carrying 1448 bytes of data (20 IPv4 + 20 TCP + 12 timestamp-option bytes of header),
    // so the goodput of a saturated link is rate × 1448 / 1500. ACKs travel the other way.
    let expected = rate * 1448.0 / 1500.0;
    eprintln!(
        "TCP goodput {:.3} Mbit/s, expected {:.3} Mbit/s (rate 20 Mbit/s minus headers); \
         queue max {} packets, {} queue drops",
        goodput / 1e6,
        expected / 1e6,
        stats.up.link.max_queue_packets,
        stats.up.link.dropped_queue_full
    );
    let right = (goodput - expected).abs() <= 0.05 * expected;
    assert!(
        right || !last,
        "goodput {goodput} is not within 5 % of {expected}, three times"
    );
    right
}

// ---------------------------------------------------------------------------------------------
// Middleboxes, seen in captures, with kernel TCP through each

/// One TCP segment from a capture.
#[derive(Debug, Clone)]
struct Segment {
    src: SocketAddr,
    dst: SocketAddr,
    ip_id: Option<u16>,
    seq: u32,
    ack: u32,
    syn: bool,
    window: u16,
    /// Option kinds, in order, without NOP and EOL.
    options: Vec<u8>,
    payload: Vec<u8>,
    /// The whole IP packet.
    packet: Vec<u8>,
}

fn option_kinds(options: &[u8]) -> Vec<u8> {
    let mut kinds = Vec::new();
    let mut at = 0;
    while at < options.len() {
        match options[at] {
            0 => break,
            1 => at += 1,
            kind => {
                kinds.push(kind);
                let len = options.get(at + 1).copied().unwrap_or(0) as usize;
                at += len.max(2);
            }
        }
    }
    kinds
}

fn segments(pcap: &Path) -> Vec<Segment> {
    let bytes = std::fs::read(pcap).expect("read capture");
    let file = read_pcap(&bytes).expect("parse capture");
    file.records
        .iter()
        .filter_map(|record| {
            let packet = SlicedPacket::from_ip(&record.data).ok()?;
            let (src_ip, dst_ip, ip_id): (IpAddr, IpAddr, Option<u16>) = match &packet.net {
                Some(NetSlice::Ipv4(ip)) => (
                    ip.header().source_addr().into(),
                    ip.header().destination_addr().into(),
                    Some(ip.header().identification()),
                ),
                Some(NetSlice::Ipv6(ip)) => (
                    ip.header().source_addr().into(),
                    ip.header().destination_addr().into(),
                    None,
                ),
                _ => return None,
            };
            let Some(TransportSlice::Tcp(tcp)) = &packet.transport else {
                return None;
            };
            Some(Segment {
                src: SocketAddr::new(src_ip, tcp.source_port()),
                dst: SocketAddr::new(dst_ip, tcp.destination_port()),
                ip_id,
                seq: tcp.sequence_number(),
                ack: tcp.acknowledgment_number(),
                syn: tcp.syn(),
                window: tcp.window_size(),
                options: option_kinds(tcp.options()),
                payload: tcp.payload().to_vec(),
                packet: record.data.clone(),
            })
        })
        .collect()
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    // Never the byte 'X', which the retransmission test uses as a forgery.
    (0..len)
        .map(|i| b'a' + ((i * 7 + usize::from(seed)) % 23) as u8)
        .collect()
}

/// Sends `payload` from the client to the server over kernel TCP and returns the SHA-256 of
/// what the server read (the server's side runs on its own thread).
fn tcp_transfer(lab: &Lab, ipv6: bool, port: u16, payload: &[u8]) -> [u8; 32] {
    let server_addr = SocketAddr::new(lab.addresses().server(ipv6), port);
    let listener = lab
        .server()
        .run(|| TcpListener::bind(server_addr))
        .expect("ns")
        .expect("listen");
    let reader = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut received = Vec::new();
        stream.read_to_end(&mut received).expect("read");
        Sha256::digest(&received).into()
    });
    let mut stream = lab
        .client()
        .run(|| TcpStream::connect(server_addr))
        .expect("ns")
        .expect("connect");
    for piece in payload.chunks(1000) {
        stream.write_all(piece).expect("write");
    }
    stream.shutdown(Shutdown::Write).expect("shutdown");
    let digest = reader.join().expect("reader");
    // Wait for the server's FIN, so the capture holds the whole connection.
    let mut rest = Vec::new();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream.read_to_end(&mut rest).ok();
    digest
}

fn middlebox_lab(name: &str, spec: &str, captures: &TempDir) -> Lab {
    let config = LabConfig::new(name)
        .with_up(link("delay=2ms"))
        .with_down(link("delay=2ms"))
        .with_client_side(parse_middleboxes(spec).expect("middlebox spec"))
        .with_capture_dir(&captures.0);
    Lab::start(config).expect("lab")
}

/// Client-to-server segments of a capture, in capture order.
fn upstream(segments: &[Segment], lab_client: IpAddr) -> Vec<&Segment> {
    segments
        .iter()
        .filter(|s| s.src.ip() == lab_client)
        .collect()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn resegmentation_changes_segment_sizes_and_tcp_still_works() {
    if !can_run("resegmentation_changes_segment_sizes_and_tcp_still_works") {
        return;
    }
    let _lock = lab_lock();
    let dir = TempDir::new("reseg");
    let lab = middlebox_lab("reseg", "resegment=split:100%/coalesce:off/dir:up", &dir);
    let client_ip = lab.addresses().client_v4.into();
    let payload = data(300_000, 1);
    let digest = tcp_transfer(&lab, false, 7010, &payload);
    let stats = finish(lab);
    assert_eq!(
        digest,
        <[u8; 32]>::from(Sha256::digest(&payload)),
        "stream corrupted"
    );
    let before = segments(&capture_path(&dir.0, CaptureSide::Client));
    let after = segments(&capture_path(&dir.0, CaptureSide::Server));
    let sizes = |segs: &[&Segment]| -> Vec<usize> {
        segs.iter()
            .map(|s| s.payload.len())
            .filter(|&l| l > 0)
            .collect()
    };
    let sent = sizes(&upstream(&before, client_ip));
    let arrived = sizes(&upstream(&after, client_ip));
    eprintln!(
        "resegment: {} data segments sent (largest {:?}), {} arrived (largest {:?}); counters {:?}",
        sent.len(),
        sent.iter().max(),
        arrived.len(),
        arrived.iter().max(),
        stats.client_side_middleboxes
    );
    // Every data segment was split in 2 or 3 pieces, so the largest piece is smaller than
    // the largest segment, and there are between 2 and 3 times as many.
    assert!(arrived.len() >= 2 * sent.len() && arrived.len() <= 3 * sent.len());
    assert!(arrived.iter().max() < sent.iter().max());
    assert_eq!(arrived.iter().sum::<usize>(), sent.iter().sum::<usize>());
    assert_eq!(
        stats.client_side_middleboxes["resegment_segments_split"],
        sent.len() as u64
    );
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn option_stripping_removes_options_and_tcp_still_works() {
    if !can_run("option_stripping_removes_options_and_tcp_still_works") {
        return;
    }
    let _lock = lab_lock();
    let dir = TempDir::new("strip");
    // Keep only the MSS: window scaling, SACK-permitted and timestamps are stripped.
    let lab = middlebox_lab("strip", "strip-options=keep:mss", &dir);
    let client_ip: IpAddr = lab.addresses().client_v6.into();
    let payload = data(200_000, 2);
    let digest = tcp_transfer(&lab, true, 7011, &payload);
    finish(lab);
    assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(&payload)));
    let before = segments(&capture_path(&dir.0, CaptureSide::Client));
    let after = segments(&capture_path(&dir.0, CaptureSide::Server));
    let syn = |segs: &[Segment]| -> Vec<u8> {
        let syn = segs
            .iter()
            .find(|s| s.syn && s.src.ip() == client_ip)
            .expect("the client's SYN is captured");
        syn.options.clone()
    };
    let (sent, arrived) = (syn(&before), syn(&after));
    eprintln!("strip-options: SYN options sent {sent:?}, arrived {arrived:?}");
    let sent: BTreeSet<u8> = sent.into_iter().collect();
    assert!(sent.is_superset(&BTreeSet::from([2, 3, 4, 8])), "{sent:?}");
    assert_eq!(arrived, vec![2], "only the MSS survives");
    // Without timestamps negotiated, the server's segments carry none either.
    assert!(
        after
            .iter()
            .filter(|s| s.src.ip() != client_ip && !s.syn)
            .all(|s| s.options.is_empty())
    );
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn sequence_rewriting_offsets_one_side_and_tcp_still_works() {
    if !can_run("sequence_rewriting_offsets_one_side_and_tcp_still_works") {
        return;
    }
    let _lock = lab_lock();
    let dir = TempDir::new("seq");
    let lab = middlebox_lab("seq", "seq-offset=seed:99/dir:up", &dir);
    let client_ip = lab.addresses().client_v4.into();
    let payload = data(200_000, 3);
    let digest = tcp_transfer(&lab, false, 7012, &payload);
    finish(lab);
    assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(&payload)));
    let before = segments(&capture_path(&dir.0, CaptureSide::Client));
    let after = segments(&capture_path(&dir.0, CaptureSide::Server));
    let (up_before, up_after) = (upstream(&before, client_ip), upstream(&after, client_ip));
    assert_eq!(
        up_before.len(),
        up_after.len(),
        "no loss, no reordering: one to one"
    );
    let offset = up_after[0].seq.wrapping_sub(up_before[0].seq);
    assert_ne!(offset, 0);
    for (b, a) in up_before.iter().zip(&up_after) {
        assert_eq!(
            a.seq.wrapping_sub(b.seq),
            offset,
            "client sequence numbers shift"
        );
        assert_eq!(a.payload, b.payload);
    }
    // The server's acknowledgments are shifted back on their way to the client.
    let down_before: Vec<&Segment> = before.iter().filter(|s| s.src.ip() != client_ip).collect();
    let down_after: Vec<&Segment> = after.iter().filter(|s| s.src.ip() != client_ip).collect();
    assert_eq!(down_before.len(), down_after.len());
    for (client_view, server_view) in down_before.iter().zip(&down_after) {
        if !client_view.syn || client_view.ack != 0 {
            assert_eq!(server_view.ack.wrapping_sub(client_view.ack), offset);
        }
        assert_eq!(
            server_view.seq, client_view.seq,
            "server sequence numbers untouched"
        );
    }
    eprintln!("seq-offset: client sequence numbers shifted by {offset:#010x}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn window_rewriting_caps_the_advertised_window_and_tcp_still_works() {
    if !can_run("window_rewriting_caps_the_advertised_window_and_tcp_still_works") {
        return;
    }
    let _lock = lab_lock();
    let dir = TempDir::new("window");
    // The server's advertised windows (raw field, as the box does not track scaling) are
    // capped on their way to the client.
    let lab = middlebox_lab("window", "window=cap:100/dir:down", &dir);
    let server_ip: IpAddr = lab.addresses().server_v4.into();
    let payload = data(100_000, 6);
    let digest = tcp_transfer(&lab, false, 7015, &payload);
    let stats = finish(lab);
    assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(&payload)));
    let windows = |side| -> Vec<u16> {
        segments(&capture_path(&dir.0, side))
            .iter()
            .filter(|s| s.src.ip() == server_ip)
            .map(|s| s.window)
            .collect()
    };
    let (sent, arrived) = (windows(CaptureSide::Server), windows(CaptureSide::Client));
    eprintln!(
        "window: server advertised up to {:?}, client saw up to {:?}",
        sent.iter().max(),
        arrived.iter().max()
    );
    assert_eq!(sent.len(), arrived.len());
    assert!(sent.iter().any(|&w| w > 100));
    assert!(arrived.iter().all(|&w| w <= 100));
    for (s, a) in sent.iter().zip(&arrived) {
        assert_eq!(*a, (*s).min(100));
    }
    assert!(stats.client_side_middleboxes["window_segments_rewritten"] > 0);
}

/// The IP packets of a capture, whole.
fn packets(pcap: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(pcap).expect("read capture");
    let file = read_pcap(&bytes).expect("parse capture");
    file.records.into_iter().map(|r| r.data).collect()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn a_narrower_link_answers_with_icmp_and_kernel_tcp_finds_the_path_mtu() {
    if !can_run("a_narrower_link_answers_with_icmp_and_kernel_tcp_finds_the_path_mtu") {
        return;
    }
    let _lock = lab_lock();
    let dir = TempDir::new("mtu");
    // The veths carry 1500 bytes; a link of 1400 sits between the client and the bottleneck.
    let lab = middlebox_lab("mtu", "mtu=1400", &dir);
    let addresses = *lab.addresses();
    let payload = data(200_000, 7);
    let digest_v4 = tcp_transfer(&lab, false, 7016, &payload);
    let digest_v6 = tcp_transfer(&lab, true, 7017, &payload);
    let stats = finish(lab);
    let expected = <[u8; 32]>::from(Sha256::digest(&payload));
    assert_eq!(digest_v4, expected, "IPv4 stream");
    assert_eq!(digest_v6, expected, "IPv6 stream");

    let before = packets(&capture_path(&dir.0, CaptureSide::Client));
    let after = packets(&capture_path(&dir.0, CaptureSide::Server));
    let largest = |packets: &[Vec<u8>]| packets.iter().map(Vec::len).max().unwrap_or(0);
    // The client starts at its interface's MTU; nothing longer than 1400 crosses.
    assert!(largest(&before) > 1400, "largest sent {}", largest(&before));
    assert!(
        largest(&after) <= 1400,
        "largest arrived {}",
        largest(&after)
    );
    // The errors reach the client, from the server's address, with the link's MTU.
    let mut frag_needed = 0;
    let mut too_big = 0;
    for packet in &before {
        let Ok(sliced) = SlicedPacket::from_ip(packet) else {
            continue;
        };
        match (&sliced.net, &sliced.transport) {
            (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Icmpv4(icmp))) => {
                assert_eq!((icmp.type_u8(), icmp.code_u8()), (3, 4));
                assert_eq!(icmp.bytes5to8()[2..], 1400u16.to_be_bytes());
                assert_eq!(ip.header().source_addr(), addresses.server_v4);
                assert_eq!(ip.header().destination_addr(), addresses.client_v4);
                frag_needed += 1;
            }
            (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(icmp)))
                if icmp.type_u8() == 2 =>
            {
                assert_eq!(icmp.bytes5to8(), 1400u32.to_be_bytes());
                assert!(icmp.is_checksum_valid(
                    ip.header().source_addr().octets(),
                    ip.header().destination_addr().octets()
                ));
                assert_eq!(ip.header().source_addr(), addresses.server_v6);
                too_big += 1;
            }
            _ => {}
        }
    }
    let counters = &stats.client_side_middleboxes;
    eprintln!(
        "mtu=1400: sent up to {} bytes, arrived up to {}; {frag_needed} Fragmentation Needed, \
         {too_big} Packet Too Big; counters {counters:?}",
        largest(&before),
        largest(&after)
    );
    assert!(frag_needed > 0 && too_big > 0);
    assert_eq!(counters["mtu_icmp_sent"], frag_needed + too_big);
    assert_eq!(counters["mtu_dropped_too_big"], counters["mtu_icmp_sent"]);
    assert_eq!(counters["mtu_dropped_fragmentable"], 0);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn retransmission_cache_restores_original_bytes_and_tcp_still_works() {
    if !can_run("retransmission_cache_restores_original_bytes_and_tcp_still_works") {
        return;
    }
    let _lock = lab_lock();
    let dir = TempDir::new("retx");
    // The cache forgets data once the server acknowledges it; a long way back keeps the
    // acknowledgment away from the cache while the forged retransmission passes.
    let config = LabConfig::new("retx")
        .with_up(link("delay=2ms"))
        .with_down(link("delay=1s"))
        .with_client_side(parse_middleboxes("retx-cache").expect("spec"))
        .with_capture_dir(&dir.0);
    let lab = Lab::start(config).expect("lab");
    let client_ip: IpAddr = lab.addresses().client_v4.into();
    let server_addr = SocketAddr::new(lab.addresses().server_v4.into(), 7013);
    let listener = lab
        .server()
        .run(|| TcpListener::bind(server_addr))
        .expect("ns")
        .expect("listen");
    let reader = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut received = Vec::new();
        stream.read_to_end(&mut received).expect("read");
        received
    });
    let mut stream = lab
        .client()
        .run(|| TcpStream::connect(server_addr))
        .expect("ns")
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let first = data(1000, 4);
    stream.write_all(&first).expect("write");
    // The segment is in the client-side capture as soon as the emulator has read it.
    let original = {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            lab.flush_captures().expect("flush");
            let segs = segments(&capture_path(&dir.0, CaptureSide::Client));
            if let Some(s) = segs.into_iter().find(|s| s.payload == first) {
                break s;
            }
            assert!(Instant::now() < deadline, "data segment never captured");
            thread::sleep(10 * MS);
        }
    };
    // Forge a retransmission of the same range with different bytes (an inconsistent
    // retransmission, Hollywood §4) and send it from the client's namespace.
    let mut forged = original.packet.clone();
    let ihl = usize::from(forged[0] & 0x0f) * 4;
    let tcp_len = usize::from(forged[ihl + 12] >> 4) * 4;
    forged[4..6].copy_from_slice(&0xBEEFu16.to_be_bytes());
    forged[ihl + tcp_len..].fill(b'X');
    forged[ihl + 16..ihl + 18].fill(0);
    let sum = checksum::transport_checksum(original.src.ip(), original.dst.ip(), 6, &forged[ihl..]);
    forged[ihl + 16..ihl + 18].copy_from_slice(&sum.to_be_bytes());
    lab.client()
        .run(|| -> std::io::Result<()> {
            // IPPROTO_RAW: we give the IP header; the kernel fills in its checksum.
            let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(255)))?;
            raw.send_to(&forged, &SockAddr::from(original.dst))?;
            Ok(())
        })
        .expect("ns")
        .expect("inject");
    let second = data(50_000, 5);
    stream.write_all(&second).expect("write");
    stream.shutdown(Shutdown::Write).expect("shutdown");
    let received = reader.join().expect("reader");
    let stats = finish(lab);
    let mut expected = first.clone();
    expected.extend_from_slice(&second);
    assert_eq!(received, expected, "the server's stream is the original");
    let find_forged = |side| {
        segments(&capture_path(&dir.0, side))
            .into_iter()
            .find(|s| s.ip_id == Some(0xBEEF) && s.src.ip() == client_ip)
            .expect("the forged segment is captured")
    };
    let before = find_forged(CaptureSide::Client);
    let after = find_forged(CaptureSide::Server);
    eprintln!(
        "retx-cache: forged segment seq {} sent with {:?}…, arrived with {:?}…; counters {:?}",
        before.seq,
        String::from_utf8_lossy(&before.payload[..8]),
        String::from_utf8_lossy(&after.payload[..8]),
        stats.client_side_middleboxes
    );
    assert!(before.payload.iter().all(|&b| b == b'X'));
    assert_eq!(after.seq, original.seq);
    assert_eq!(
        after.payload, first,
        "the retransmitted range carries the original bytes"
    );
    assert_eq!(
        stats.client_side_middleboxes["cache_bytes_restored"],
        first.len() as u64
    );
}

// ---------------------------------------------------------------------------------------------
// The two engines agree

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn simulator_and_emulator_agree_on_loss_and_delay_distribution() {
    if !can_run("simulator_and_emulator_agree_on_loss_and_delay_distribution") {
        return;
    }
    let _lock = lab_lock();
    // Independent uniform jitter (reordering allowed, so each packet's delay is its own
    // draw), a fast bottleneck (no queueing, which would make the result depend on how
    // evenly a real sender paces) and 2 % loss.
    let up = link("delay=10ms jitter=4ms,uniform,reorder rate=100mbit loss=2%");
    let down = link("delay=10ms");
    let (n, interval, payload_len) = (10_000u64, Duration::from_micros(250), 200usize);

    // The simulator, with the same schedule from its own UDP host.
    let mut sim = Simulator::new(SimConfig::new(
        11,
        Bottleneck {
            left_to_right: up.clone(),
            right_to_left: down.clone(),
        },
    ))
    .expect("sim");
    let (caller, callee): (SocketAddr, SocketAddr) = (
        "10.0.0.1:4000".parse().expect("addr"),
        "10.0.1.1:4000".parse().expect("addr"),
    );
    let mut host = UdpHost::new(caller.ip(), sim.start());
    host.add_flow(PeriodicFlow {
        dest: callee,
        src_port: caller.port(),
        payload_len,
        interval,
        count: n,
        start: Duration::ZERO,
    })
    .expect("flow");
    sim.add_host(Side::Left, host).expect("host");
    let far = sim
        .add_host(Side::Right, UdpHost::new(callee.ip(), sim.start()))
        .expect("host");
    sim.run_for(interval * n as u32 + Duration::from_secs(1))
        .expect("run");
    let mut sim_delays: Vec<Duration> = sim
        .host::<UdpHost>(far)
        .expect("host")
        .received()
        .iter()
        .map(|a| a.one_way_delay())
        .collect();

    // The emulator, with real sockets and a different seed: one run, and a second only if
    // the first disagrees (a host that stalls this VM's threads for a tenth of a second
    // shifts a whole quantile by milliseconds; an emulator that is wrong disagrees twice).
    let emulate = || {
        let config = LabConfig::new("agree")
            .with_up(up.clone())
            .with_down(down.clone())
            .with_seed(12);
        let lab = Lab::start(config).expect("lab");
        let server_addr = SocketAddr::new(lab.addresses().server_v4.into(), 7014);
        let server = bind_udp(lab.server(), server_addr);
        server.set_read_timeout(Some(500 * MS)).expect("timeout");
        let client = bind_udp(
            lab.client(),
            SocketAddr::new(lab.addresses().client_v4.into(), 0),
        );
        let epoch = Instant::now();
        let receiver = thread::spawn(move || {
            let mut arrivals = Vec::new();
            let mut buf = [0u8; 2048];
            while let Ok((len, _)) = server.recv_from(&mut buf) {
                let now = Instant::now();
                let (_, _, sent) = decode_payload(&buf[..len]).expect("intact");
                arrivals.push(now - (epoch + sent));
            }
            arrivals
        });
        for seq in 0..n {
            let target = epoch + interval * seq as u32;
            while Instant::now() < target {
                std::hint::spin_loop();
            }
            let sent = Instant::now() - epoch;
            let payload = encode_payload(KIND_DATA, seq, sent, payload_len);
            client.send_to(&payload, server_addr).expect("send");
        }
        let mut real_delays = receiver.join().expect("receiver");
        real_delays.sort();
        (real_delays, finish(lab))
    };
    sim_delays.sort();
    // Delay quantiles: the emulator adds only its own small latency (sockets, wake-up), so
    // each quantile lies within 1 ms above the simulator's; the sampling error of a quantile
    // of 9800 draws from a uniform 8 ms wide is about 0.05 ms.
    let disagreement = |real_delays: &[Duration]| {
        [0.05, 0.25, 0.5, 0.75, 0.95].into_iter().find_map(|q| {
            let (s, r) = (quantile(&sim_delays, q), quantile(real_delays, q));
            eprintln!("  q{:02.0}: simulator {s:?}, emulator {r:?}", q * 100.0);
            (r + Duration::from_micros(300) < s || r > s + MS)
                .then(|| format!("quantile {q}: emulator {r:?} vs simulator {s:?}"))
        })
    };
    let (mut real_delays, mut stats) = emulate();
    if let Some(first) = disagreement(&real_delays) {
        eprintln!(
            "first run: {first} (emulator lateness {:?}); once more",
            stats.up.lateness
        );
        (real_delays, stats) = emulate();
        if let Some(second) = disagreement(&real_delays) {
            panic!("twice: {first}; then {second}");
        }
    }

    let loss = |received: usize| 1.0 - received as f64 / n as f64;
    let (sim_loss, real_loss) = (loss(sim_delays.len()), loss(real_delays.len()));
    // Two-proportion bound: 5 standard deviations of the difference.
    let pooled = (sim_loss + real_loss) / 2.0;
    let bound = 5.0 * (pooled * (1.0 - pooled) * 2.0 / n as f64).sqrt();
    eprintln!(
        "agreement: loss simulator {:.3} %, emulator {:.3} % (bound ±{:.3} %); emulator lateness {:?}",
        sim_loss * 100.0,
        real_loss * 100.0,
        bound * 100.0,
        stats.up.lateness
    );
    assert!((sim_loss - real_loss).abs() <= bound);
    assert_eq!(stats.up.link.offered, n, "every datagram reached the link");
}

// ---------------------------------------------------------------------------------------------
// Cleanup is certain

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn a_panicking_test_leaves_nothing_behind() {
    if !can_run("a_panicking_test_leaves_nothing_behind") {
        return;
    }
    let _lock = lab_lock();
    let info = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&info);
    let result = std::panic::catch_unwind(move || {
        let lab = Lab::start(LabConfig::new("panics")).expect("lab");
        *seen.lock().expect("lock") = Some(lab.info().clone());
        panic!("a test fails with its lab up");
    });
    assert!(result.is_err());
    let info = info.lock().expect("lock").clone().expect("lab was up");
    assert_removed(&info);
}

/// Run as a child process by `leftovers_of_a_killed_owner_are_removed_by_the_next_run`: builds
/// a lab, says so, and waits to be killed.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
#[ignore = "helper: run by another test as a child process"]
fn child_holds_a_lab_until_killed() {
    if std::env::var_os("SQPG_LAB_CHILD").is_none() {
        return;
    }
    let lab = Lab::start(LabConfig::new("orphan")).expect("lab");
    let info = lab.info();
    println!(
        "READY {} {} {}",
        info.client_ns, info.emulator_ns, info.server_ns
    );
    std::io::stdout().flush().expect("flush");
    thread::sleep(Duration::from_secs(60));
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn leftovers_of_a_killed_owner_are_removed_by_the_next_run() {
    if !can_run("leftovers_of_a_killed_owner_are_removed_by_the_next_run") {
        return;
    }
    let _lock = lab_lock();
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_holds_a_lab_until_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("SQPG_LAB_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut namespaces = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("line");
        if let Some(rest) = line.strip_prefix("READY ") {
            namespaces = rest.split(' ').map(str::to_owned).collect();
            break;
        }
    }
    // SIGKILL: no destructor runs, as after a crash.
    child.kill().expect("kill");
    child.wait().expect("wait");
    assert_eq!(namespaces.len(), 3, "child never built its lab");
    for ns in &namespaces {
        assert!(NetNs::path_of(ns).exists(), "{ns} should be left over");
    }
    // A living owner's lab is not touched by the cleanup.
    let mine = Lab::start(LabConfig::new("survivor")).expect("lab");
    let report = mine.cleaned_leftovers().clone();
    let mut removed = report.namespaces.clone();
    removed.sort();
    namespaces.sort();
    assert!(
        namespaces.iter().all(|ns| removed.contains(ns)),
        "{report:?} should include {namespaces:?}"
    );
    for ns in &namespaces {
        assert!(!NetNs::path_of(ns).exists());
    }
    let again = net::cleanup_leftovers();
    assert!(
        again.namespaces.is_empty() && again.failed.is_empty(),
        "{again:?}"
    );
    assert!(NetNs::path_of(&mine.info().client_ns).exists());
    finish(mine);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn invalid_configurations_fail_clearly() {
    let too_long = LabConfig::new(&"x".repeat(40));
    assert!(matches!(
        Lab::start(too_long),
        Err(net::NetError::InvalidName(_))
    ));
    let mut bad_link = LabConfig::new("bad");
    bad_link.up.loss = 2.0;
    assert!(matches!(
        Lab::start(bad_link),
        Err(net::NetError::Config(_))
    ));
    if !can_run("invalid_configurations_fail_clearly") {
        return;
    }
    let _lock = lab_lock();
    let lab = Lab::start(LabConfig::new("twice")).expect("lab");
    let error = Lab::start(LabConfig::new("twice")).expect_err("same name twice");
    assert!(
        matches!(error, net::NetError::NamespaceExists(_)),
        "{error}"
    );
    finish(lab);
}
