//! TCP Fast Open (RFC 7413) between squarepeg's userspace TCP and the Linux kernel, in a
//! network namespace of each test's own with `net.ipv4.tcp_fastopen = 3` (client and server;
//! needs root; skipped otherwise).
//!
//! - squarepeg client → kernel server (`TCP_FASTOPEN` on the listener): the first connection
//!   gets a cookie, the second puts its first bytes on the SYN and the kernel's listener takes
//!   them (`TcpExtTCPFastOpenPassive` counts it), and the capture shows the data on the SYN;
//! - kernel client (`TCP_FASTOPEN_CONNECT`) → squarepeg server: the kernel's second SYN
//!   carries the cookie squarepeg gave it and its data, which squarepeg accepts.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use common::*;
use socket2::{Domain, Protocol, Socket, Type};
use squarepeg_io::{ConnectionConfig, Impairment};
use squarepeg_lab::net::NetNs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PORT: u16 = 5003;

/// `net.ipv4.tcp_fastopen = 3` in the lab's namespace (the sysctl is per namespace).
fn enable_kernel_fast_open(ns: &NetNs) {
    ns.run(|| std::fs::write("/proc/sys/net/ipv4/tcp_fastopen", "3"))
        .unwrap()
        .expect("set net.ipv4.tcp_fastopen in the namespace");
}

/// A `TcpExt` counter of the namespace (`nstat`'s source). `/proc/thread-self`: the
/// namespace is the thread's, not the process's.
fn tcp_ext(ns: &NetNs, name: &str) -> u64 {
    let text = ns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/netstat"))
        .unwrap()
        .expect("read netstat");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    let names = lines[0].split_whitespace();
    let values = lines[1].split_whitespace();
    names
        .zip(values)
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no TcpExt {name}"))
}

fn setsockopt_int(s: &Socket, level: i32, name: i32, value: i32) {
    // SAFETY: a valid descriptor and a pointer to an int of the length given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "setsockopt {name}: {}",
        std::io::Error::last_os_error()
    );
}

/// A lab whose packets are captured (256-byte snapshots) to `capture`, with Fast Open on
/// for the kernel of its namespace; `impairment` on the stack's path if given.
fn fast_open_lab(name: &str, capture: &Path, impairment: Option<Impairment>) -> Lab {
    let lab = Lab::start(
        name,
        LabOptions {
            capture: Some((capture.to_path_buf(), 256)),
            impairment,
            ..Default::default()
        },
    );
    enable_kernel_fast_open(&lab.ns);
    lab
}

fn kernel_socket(ns: &NetNs) -> Socket {
    let s = ns
        .run(|| Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)))
        .unwrap()
        .expect("socket");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Packets in the capture from `src` with SYN set and a payload.
fn syns_with_data(path: &Path, src: std::net::IpAddr) -> usize {
    let bytes = std::fs::read(path).expect("read capture");
    let file = squarepeg_lab::pcap::read_pcap(&bytes).expect("a pcap file");
    file.records
        .iter()
        .filter_map(|p| squarepeg_tcp::wire::parse_packet(&p.data, false).ok())
        .filter(|s| s.src.ip() == src && s.flags.syn() && !s.flags.ack() && !s.payload.is_empty())
        .count()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn stack_client_puts_data_on_the_syn_to_a_kernel_server() {
    if !can_run() {
        return;
    }
    let scratch = ScratchDir::new("tfo");
    let capture = scratch.0.join("tfo.pcap");
    let lab = fast_open_lab("tfo", &capture, None);
    let kernel_ip = lab.kernel_addr(false);
    let listener = kernel_socket(&lab.ns);
    listener.set_reuse_address(true).unwrap();
    listener
        .bind(&SocketAddr::new(kernel_ip, PORT).into())
        .expect("bind");
    // TCP_FASTOPEN: the listener's queue of pending Fast Open connections.
    setsockopt_int(&listener, libc::IPPROTO_TCP, libc::TCP_FASTOPEN, 16);
    listener.listen(16).unwrap();
    let listener: std::net::TcpListener = listener.into();
    let passive_before = tcp_ext(&lab.ns, "TCPFastOpenPassive");
    let to = SocketAddr::new(kernel_ip, PORT);
    let rt = runtime();
    for (i, request) in [b"first request".as_slice(), b"second request"]
        .into_iter()
        .enumerate()
    {
        std::thread::scope(|s| {
            let kernel = s.spawn(|| {
                let (mut stream, _) = listener.accept().expect("kernel accept");
                stream
                    .set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                let mut got = Vec::new();
                stream.read_to_end(&mut got).expect("kernel read");
                stream.write_all(b"answer").unwrap();
                got
            });
            rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(30), async {
                    let mut conn = lab
                        .stack
                        .connect_fast_open(to, ConnectionConfig::default(), request)
                        .await
                        .expect("connect");
                    conn.shutdown().await.unwrap();
                    let mut answer = Vec::new();
                    conn.read_to_end(&mut answer).await.unwrap();
                    assert_eq!(answer, b"answer");
                })
                .await
                .expect("in time")
            });
            assert_eq!(kernel.join().unwrap(), request, "connection {i}");
        });
        let fo = lab.stack.stats().endpoint.fast_open;
        if i == 0 {
            assert_eq!(fo.cookie_requests_sent, 1);
            assert_eq!(fo.cookies_received, 1, "the kernel sent a cookie");
            assert_eq!(lab.stack.fast_open_cache().len(), 1);
        } else {
            assert_eq!(fo.syn_data_sent, 1);
            assert_eq!(fo.syn_data_acked, 1, "{fo:?}");
        }
    }
    let passive = tcp_ext(&lab.ns, "TCPFastOpenPassive") - passive_before;
    eprintln!("kernel TcpExtTCPFastOpenPassive +{passive}");
    assert_eq!(passive, 1, "the kernel accepted one SYN with data");
    let stack_ip = lab.stack_addr(false);
    drop(listener);
    lab.finish();
    assert_eq!(
        syns_with_data(&capture, stack_ip),
        1,
        "data on the second SYN"
    );
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn kernel_client_puts_data_on_the_syn_to_the_stack_server() {
    if !can_run() {
        return;
    }
    let scratch = ScratchDir::new("tfo");
    let capture = scratch.0.join("tfo.pcap");
    let lab = fast_open_lab("tfok", &capture, None);
    let mut config = ConnectionConfig::default();
    config.fast_open = true;
    let stack_ip = lab.stack_addr(false);
    let listener = lab
        .stack
        .listen_with(&[SocketAddr::new(stack_ip, PORT)], config)
        .expect("listen");
    let active_before = tcp_ext(&lab.ns, "TCPFastOpenActive");
    let to = SocketAddr::new(stack_ip, PORT);
    let rt = runtime();
    for (i, request) in [b"kernel first".as_slice(), b"kernel second"]
        .into_iter()
        .enumerate()
    {
        std::thread::scope(|s| {
            let kernel = s.spawn(|| {
                let sock = kernel_socket(&lab.ns);
                // TCP_FASTOPEN_CONNECT: connect() returns at once, the first write goes in
                // the SYN.
                setsockopt_int(&sock, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT, 1);
                sock.connect(&to.into()).expect("kernel connect");
                let mut stream: std::net::TcpStream = sock.into();
                stream.write_all(request).unwrap();
                stream.shutdown(std::net::Shutdown::Write).unwrap();
                let mut answer = Vec::new();
                stream.read_to_end(&mut answer).expect("kernel read");
                answer
            });
            let got = rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(30), async {
                    let (mut conn, _) = listener.accept().await.expect("accept");
                    let mut got = Vec::new();
                    conn.read_to_end(&mut got).await.unwrap();
                    conn.write_all(b"answer").await.unwrap();
                    conn.shutdown().await.unwrap();
                    got
                })
                .await
                .expect("in time")
            });
            assert_eq!(got, request, "connection {i}");
            assert_eq!(kernel.join().unwrap(), b"answer");
        });
    }
    let fo = lab.stack.stats().endpoint.fast_open;
    eprintln!("stack server: {fo:?}");
    assert_eq!(fo.cookie_requests_received, 1);
    assert_eq!(fo.cookies_sent, 1);
    assert_eq!(
        fo.syn_data_accepted, 1,
        "the kernel's second SYN carried data"
    );
    let active = tcp_ext(&lab.ns, "TCPFastOpenActive") - active_before;
    eprintln!("kernel TcpExtTCPFastOpenActive +{active}");
    assert_eq!(active, 1);
    let kernel_ip = lab.kernel_addr(false);
    drop(listener);
    lab.finish();
    assert_eq!(syns_with_data(&capture, kernel_ip), 1);
}

/// The stack server's answer to a kernel client's SYN data leaves in SYN-RECEIVED (RFC 7413
/// §4.2.2), before the kernel's ACK of the SYN-ACK reaches the stack, and the kernel client
/// takes it. A 40 ms delay from the kernel to the stack makes "before" plain in the capture
/// (inbound packets are captured before the delay, outbound ones as they leave).
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn kernel_client_gets_the_stack_servers_answer_sent_before_the_handshake_completes() {
    if !can_run() {
        return;
    }
    const INBOUND_DELAY: Duration = Duration::from_millis(40);
    let scratch = ScratchDir::new("tfo");
    let capture = scratch.0.join("tfo-synrecv.pcap");
    let inbound = squarepeg_lab::model::LinkConfig::new().with_delay(INBOUND_DELAY);
    let outbound = squarepeg_lab::model::LinkConfig::new();
    let lab = fast_open_lab(
        "tfoa",
        &capture,
        Some(squarepeg_lab::stack::impairment(inbound, outbound, 7).expect("link config")),
    );
    let mut config = ConnectionConfig::default();
    config.fast_open = true;
    let stack_ip = lab.stack_addr(false);
    let listener = lab
        .stack
        .listen_with(&[SocketAddr::new(stack_ip, PORT)], config)
        .expect("listen");
    let to = SocketAddr::new(stack_ip, PORT);
    let rt = runtime();
    const REQUEST: &[u8] = b"GET /early";
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nearly answer";
    let mut kernel_ports = Vec::new();
    // The first connection gets the kernel a cookie; the second carries the request on its
    // SYN and gets the answer early.
    for i in 0..2 {
        std::thread::scope(|s| {
            let kernel = s.spawn(|| {
                let sock = kernel_socket(&lab.ns);
                setsockopt_int(&sock, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT, 1);
                sock.connect(&to.into()).expect("kernel connect");
                let mut stream: std::net::TcpStream = sock.into();
                let port = stream.local_addr().unwrap().port();
                stream.write_all(REQUEST).unwrap();
                let mut answer = vec![0u8; ANSWER.len()];
                stream.read_exact(&mut answer).expect("kernel read");
                stream.shutdown(std::net::Shutdown::Write).unwrap();
                let mut rest = Vec::new();
                stream.read_to_end(&mut rest).expect("kernel read to end");
                (port, answer, rest)
            });
            rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(30), async {
                    let (mut conn, _) = listener.accept().await.expect("accept");
                    let mut got = vec![0u8; REQUEST.len()];
                    conn.read_exact(&mut got).await.unwrap();
                    assert_eq!(got, REQUEST);
                    conn.write_all(ANSWER).await.unwrap();
                    let mut rest = Vec::new();
                    conn.read_to_end(&mut rest).await.unwrap();
                    assert!(rest.is_empty());
                    conn.shutdown().await.unwrap();
                })
                .await
                .expect("in time")
            });
            let (port, answer, rest) = kernel.join().unwrap();
            assert_eq!(answer, ANSWER, "connection {i}");
            assert!(rest.is_empty());
            kernel_ports.push(port);
        });
    }
    let fo = lab.stack.stats().endpoint.fast_open;
    eprintln!("stack server: {fo:?}");
    assert_eq!(
        fo.syn_data_accepted, 1,
        "the kernel's second SYN carried data"
    );
    let kernel_ip = lab.kernel_addr(false);
    drop(listener);
    lab.finish();
    // The second connection in the capture: the stack's answer left before the kernel's ACK
    // of the SYN-ACK had come through the delay.
    let bytes = std::fs::read(&capture).expect("read capture");
    let file = squarepeg_lab::pcap::read_pcap(&bytes).expect("a pcap file");
    let port = kernel_ports[1];
    let segs: Vec<_> = file
        .records
        .iter()
        .filter_map(|r| {
            let s = squarepeg_tcp::wire::parse_packet(&r.data, false).ok()?;
            let from_kernel = s.src.ip() == kernel_ip && s.src.port() == port;
            let to_kernel = s.dst.ip() == kernel_ip && s.dst.port() == port;
            (from_kernel || to_kernel).then(|| {
                (
                    r.timestamp,
                    from_kernel,
                    s.flags.syn(),
                    s.flags.ack(),
                    s.seq,
                    s.payload.to_vec(),
                )
            })
        })
        .collect();
    let syn = segs.iter().find(|s| s.1 && s.2).expect("the kernel's SYN");
    assert_eq!(syn.5, REQUEST, "the request on the SYN");
    let synack = segs.iter().find(|s| !s.1 && s.2).expect("the SYN-ACK");
    let answer = segs
        .iter()
        .find(|s| !s.1 && s.5 == ANSWER)
        .expect("the answer");
    assert_eq!(
        answer.4,
        synack.4.wrapping_add(1),
        "the answer follows the SYN-ACK"
    );
    let final_ack = segs
        .iter()
        .find(|s| s.1 && !s.2 && s.3)
        .expect("the kernel's ACK of the SYN-ACK");
    eprintln!(
        "answer left {:?} after the SYN-ACK; the kernel's ACK reached the stack {:?} after it",
        answer.0.saturating_sub(synack.0),
        (final_ack.0 + INBOUND_DELAY).saturating_sub(synack.0)
    );
    assert!(
        answer.0 < final_ack.0 + INBOUND_DELAY,
        "the answer left in SYN-RECEIVED"
    );
}
