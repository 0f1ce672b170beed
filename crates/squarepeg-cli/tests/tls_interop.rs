//! `peg listen --tls` and `peg connect --tls` against stock TLS 1.3 (OpenSSL's `s_client` and
//! `s_server`), each in a network namespace of the test's own with a packet capture that
//! tshark must dissect as TLS 1.3 without a malformed record; a key update forced from the
//! OpenSSL side in the middle must be answered (squarepeg's own KeyUpdate, RFC 8446 §4.6.3)
//! and data must flow after it. Needs root, iproute2, openssl, tcpdump and tshark.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::TempDir;
use squarepeg_framing::{FrameHeader, encode_plain_frame};
use squarepeg_lab::net::NetNs;

const PEG: &str = env!("CARGO_BIN_EXE_peg");
const PORT: &str = "4433";

fn can_run() -> bool {
    let tools = ["openssl", "tcpdump", "tshark", "ip"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    // SAFETY: geteuid has no preconditions.
    let ok = tools && unsafe { libc::geteuid() } == 0;
    if !ok {
        eprintln!("skipped: needs root, openssl, tcpdump and tshark");
    }
    ok
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A namespace with loopback up, removed on drop.
fn namespace(tag: &str) -> NetNs {
    let name = format!(
        "sptls-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let ns = NetNs::create(&name).expect("namespace");
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    ns
}

/// A child killed on drop.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Reaper {
    /// Waits at most `limit` for the exit (then kills it); returns stdout + stderr.
    fn output_within(mut self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        while self.0.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.0.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut text = String::new();
        use std::io::Read;
        if let Some(mut o) = self.0.stdout.take() {
            let mut bytes = Vec::new();
            let _ = o.read_to_end(&mut bytes);
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
        if let Some(mut e) = self.0.stderr.take() {
            let mut bytes = Vec::new();
            let _ = e.read_to_end(&mut bytes);
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
        text
    }
}

fn spawn(mut command: Command, stdin: bool) -> Reaper {
    command
        .env("RUST_BACKTRACE", "0")
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Reaper(command.spawn().expect("spawn"))
}

/// Starts a capture of the namespace's loopback into `pcap`; stop it by dropping.
fn capture(ns: &NetNs, pcap: &std::path::Path) -> Reaper {
    let mut c = ns.command("tcpdump");
    c.args(["-i", "lo", "-U", "-w"])
        .arg(pcap)
        .args(["tcp", "port", PORT]);
    let r = spawn(c, false);
    // tcpdump needs a moment before it sees packets; waiting for its file is enough.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pcap.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    r
}

/// tshark's view of the capture: it must see a TLS 1.3 handshake, application data and no
/// malformed packet.
fn check_capture(pcap: &std::path::Path) {
    let run = |filter: &str| {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(pcap)
            .args(["-d", &format!("tcp.port=={PORT},tls"), "-Y", filter])
            .output()
            .expect("tshark");
        assert!(out.status.success(), "tshark: {out:?}");
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert!(run("tls.handshake.type == 1") >= 1, "no ClientHello");
    assert!(
        run("tls.handshake.extensions.supported_version == 0x0304") >= 2,
        "not TLS 1.3"
    );
    assert!(
        run("tls.record.opaque_type == 23") >= 4,
        "no application data"
    );
    assert_eq!(run("_ws.malformed || _ws.expert.severity == error"), 0);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, openssl, tcpdump and tshark")]
fn openssl_s_client_completes_a_handshake_with_peg_listen_and_a_key_update() {
    if !can_run() {
        return;
    }
    let dir = TempDir::new("tls-s-client");
    let pcap = dir.0.join("s_client.pcap");
    let ns = namespace("sc");
    let tap = capture(&ns, &pcap);
    let mut listen = ns.command(PEG);
    listen.args([
        "listen",
        &format!("127.0.0.1:{PORT}"),
        "--tls",
        "--quiet",
        "--no-stdin",
    ]);
    let listener = spawn(listen, false);
    std::thread::sleep(Duration::from_millis(500));
    let mut client = ns.command("openssl");
    client.args([
        "s_client",
        "-connect",
        &format!("127.0.0.1:{PORT}"),
        "-tls1_3",
        "-msg",
        "-servername",
        "localhost",
    ]);
    let mut client = spawn(client, true);
    let mut stdin = client.0.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    // s_client's command: a KeyUpdate that asks the peer to update too.
    stdin.write_all(b"K\n").unwrap();
    std::thread::sleep(Duration::from_millis(700));
    drop(stdin);
    let said = client.output_within(Duration::from_secs(10));
    let listener_said = listener.output_within(Duration::from_secs(10));
    drop(tap);
    assert!(said.contains("Protocol  : TLSv1.3"), "{said}");
    assert!(
        said.contains(">>> TLS 1.3, Handshake [length 0005], KeyUpdate")
            && said.contains("<<< TLS 1.3, Handshake [length 0005], KeyUpdate"),
        "the key update was not answered: {said}"
    );
    assert!(
        listener_said.contains("TLS 1.3, TLS13_"),
        "peg listen: {listener_said}"
    );
    check_capture(&pcap);
}

/// What a squarepeg peer sends inside TLS (docs/wire.md §4): PARAMS, then messages, as plain
/// frames — written here by hand and sent by `openssl s_server` as its application data.
fn squarepeg_frames(first_number: u64, text: &str) -> Vec<u8> {
    let mut wire = Vec::new();
    if first_number == 0 {
        encode_plain_frame(&FrameHeader::Control, &[0x01], &mut wire).unwrap();
    }
    let message = FrameHeader::Message {
        substream: 2,
        number: first_number,
    };
    encode_plain_frame(&message, text.as_bytes(), &mut wire).unwrap();
    wire
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, openssl, tcpdump and tshark")]
fn peg_connect_receives_what_openssl_s_server_sends_across_a_key_update() {
    if !can_run() {
        return;
    }
    let dir = TempDir::new("tls-s-server");
    let pcap = dir.0.join("s_server.pcap");
    let cert = squarepeg::tls::config::self_signed(&["localhost".into()]).unwrap();
    let (cert_path, key_path) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
    std::fs::write(&cert_path, &cert.cert_pem).unwrap();
    std::fs::write(&key_path, &cert.key_pem).unwrap();
    let ns = namespace("ss");
    let tap = capture(&ns, &pcap);
    let mut server = ns.command("openssl");
    server
        .args(["s_server", "-accept", PORT, "-tls1_3", "-msg", "-cert"])
        .arg(&cert_path)
        .arg("-key")
        .arg(&key_path);
    let mut server = spawn(server, true);
    std::thread::sleep(Duration::from_millis(500));
    let mut connect = ns.command(PEG);
    connect.args([
        "connect",
        &format!("127.0.0.1:{PORT}"),
        "--tls",
        "--pin",
        &squarepeg::tls::config::fingerprint_hex(&cert.fingerprint),
        "--server-name",
        "localhost",
        "--quiet",
    ]);
    // Its stdin stays open (the connecting side closes when its stdin ends).
    let mut client = spawn(connect, true);
    let client_stdin = client.0.stdin.take();
    std::thread::sleep(Duration::from_millis(700));
    let mut stdin = server.0.stdin.take().unwrap();
    stdin
        .write_all(&squarepeg_frames(0, "before the key update"))
        .unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    // s_server's command: a KeyUpdate that asks the client to update too.
    stdin.write_all(b"K\n").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    stdin
        .write_all(&squarepeg_frames(1, "after the key update"))
        .unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    drop(client_stdin);
    std::thread::sleep(Duration::from_millis(500));
    drop(stdin);
    let server_said = server.output_within(Duration::from_secs(5));
    let client_said = client.output_within(Duration::from_secs(10));
    drop(tap);
    assert!(
        client_said.contains("[substream 2 #0] before the key update")
            && client_said.contains("[substream 2 #1] after the key update"),
        "peg connect: {client_said}"
    );
    assert!(
        client_said.contains("peer certificate"),
        "peg connect: {client_said}"
    );
    assert!(
        server_said.contains("<<< TLS 1.3, Handshake [length 0005], KeyUpdate"),
        "the key update was not answered: {server_said}"
    );
    check_capture(&pcap);
}
