//! `peg listen` and `peg connect` as processes: stdin lines become messages
//! printed on the other side, and a file sent over a stream arrives intact
//! with the same SHA-256 printed on both ends.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};

use common::TempDir;
use sha2::{Digest, Sha256};

/// Kills a child left running by a failed test.
struct Reaper(Option<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn sha_line(out: &str, verb: &str) -> String {
    out.lines()
        .find(|l| l.starts_with(verb))
        .unwrap_or_else(|| panic!("no `{verb}` line in:\n{out}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string()
}

/// Starts `peg ARGS` (a `peg listen`), waits for its "listening on ADDR" line (after the
/// certificate's fingerprint with `--tls`); returns the child, the rest of its stderr and ADDR.
fn spawn_listener(args: &[&str]) -> (Reaper, BufReader<std::process::ChildStderr>, String) {
    let mut listener = Reaper(Some(
        Command::new(env!("CARGO_BIN_EXE_peg"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let l = listener.0.as_mut().unwrap();
    let mut err = BufReader::new(l.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    if line.starts_with("TLS: self-signed certificate") {
        line.clear();
        err.read_line(&mut line).unwrap();
    }
    let bound = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected: {line}"))
        .to_string();
    (listener, err, bound)
}

fn run(addr: &str) {
    let peg = env!("CARGO_BIN_EXE_peg");
    let dir = TempDir::new(&format!("{}", addr.len()));
    let recv = dir.0.join("recv");
    std::fs::create_dir_all(&recv).unwrap();
    let file = dir.0.join("payload.bin");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let digest = hex::encode(Sha256::digest(&data));

    let recv_arg = recv.to_str().unwrap();
    let (mut listener, mut err, bound) =
        spawn_listener(&["listen", addr, "--quiet", "--recv-dir", recv_arg]);

    let mut client = Reaper(Some(
        Command::new(peg)
            .args([
                "connect",
                &bound,
                "--quiet",
                "--substream",
                "3",
                "--priority",
                "1",
                "--send-file",
            ])
            .arg(&file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    // Once it has its connection the listener listens no more: a second client is refused
    // instead of completing a handshake nobody answers.
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.starts_with("connection from "), "unexpected: {line}");
    let second = std::net::TcpStream::connect(&bound);
    assert_eq!(
        second.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "a second client was let in"
    );
    let c = client.0.as_mut().unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(b"hello\nsecond line\n")
        .unwrap();
    let c = client.0.take().unwrap().wait_with_output().unwrap();
    let c_out = String::from_utf8_lossy(&c.stdout).into_owned();
    assert!(
        c.status.success(),
        "connect failed: {}",
        String::from_utf8_lossy(&c.stderr)
    );

    let mut l = listener.0.take().unwrap();
    let mut l_out = String::new();
    l.stdout.take().unwrap().read_to_string(&mut l_out).unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(l.wait().unwrap().success(), "listen failed: {rest}");
    // A clean close by the peer is said, as an error would be.
    assert!(rest.contains("peer closed the connection"), "{rest}");

    assert!(l_out.contains("[substream 3 #0] hello\n"), "{l_out}");
    assert!(l_out.contains("[substream 3 #1] second line\n"), "{l_out}");
    assert_eq!(sha_line(&c_out, "sent payload.bin"), digest);
    assert_eq!(sha_line(&l_out, "received payload.bin"), digest);
    assert_eq!(std::fs::read(recv.join("payload.bin")).unwrap(), data);
}

#[test]
fn listen_and_connect_exchange_messages_and_a_file_ipv4() {
    run("127.0.0.1:0");
}

#[test]
fn listen_and_connect_exchange_messages_and_a_file_ipv6() {
    run("[::1]:0");
}

/// Bad input is refused with a message that says what to change, before any device, namespace
/// or socket is made (none of these needs root: each fails before touching anything).
#[test]
fn bad_substrate_input_is_refused_with_what_to_change() {
    let cases: &[(&[&str], &str)] = &[
        // Stack options would be silently ignored over kernel TCP.
        (
            &["listen", "127.0.0.1:0", "--dev", "sp9", "--setup"],
            "--dev, --setup apply to the userspace TCP's device: add --substrate utcp",
        ),
        (
            &["connect", "127.0.0.1:1", "--impair", "loss=1%"],
            "--impair applies to the userspace TCP's device",
        ),
        (
            &["connect", "--substrate", "utcp", "localhost:4433"],
            "give IP:PORT",
        ),
        (
            &["listen", "--substrate", "utcp", "10.77.0.2:0"],
            "give a port",
        ),
        (
            &["listen", "--substrate", "utcp", "10.77.0.1:4433"],
            "the kernel's side of the device",
        ),
        (
            &["connect", "--substrate", "utcp", "10.77.0.2:4433"],
            "the stack's own address",
        ),
        (
            &[
                "connect",
                "--substrate",
                "utcp",
                "--addr",
                "fd00:9::2",
                "--kernel-addr",
                "10.9.0.1/24",
                "[fd00:9::1]:1",
            ],
            "give the kernel's address of its family too",
        ),
        (
            &["listen", "--substrate", "udp", "[::]:1"],
            "invalid value 'udp'",
        ),
        (
            &["connect", "127.0.0.1:1", "--connect-timeout", "soon"],
            "invalid value 'soon'",
        ),
        // A PEM file without a certificate: the message names the files.
        (
            &[
                "listen",
                "127.0.0.1:0",
                "--tls",
                "--cert",
                "Cargo.toml",
                "--key",
                "Cargo.toml",
            ],
            "TLS certificate Cargo.toml and key Cargo.toml",
        ),
        (
            &["connect", "127.0.0.1:1", "--send-file", "no-such-file"],
            "--send-file no-such-file",
        ),
    ];
    for (args, says) in cases {
        let out = common::peg(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A first peer that connects and then says nothing does not hold `peg listen` for ever
/// with `--idle-timeout`: it closes and says why.
#[test]
fn listen_gives_up_on_a_silent_peer_after_the_idle_timeout() {
    let (mut listener, mut err, addr) = spawn_listener(&[
        "listen",
        "127.0.0.1:0",
        "--quiet",
        "--no-stdin",
        "--idle-timeout",
        "300ms",
    ]);
    // A plain TCP client that never sends a byte, and stays connected.
    let silent = std::net::TcpStream::connect(&addr).unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = listener.0.take().unwrap().wait().unwrap();
    drop(silent);
    assert!(!status.success(), "{rest}");
    assert!(rest.contains("--idle-timeout"), "{rest}");
}

/// `peg connect` to something that is not the squarepeg it expects never reports success:
/// a TLS listener without `--tls` on the connecting side, a cleartext listener with it, and
/// a TCP server that takes the bytes and closes without a word. Each side says why.
#[test]
fn connect_to_the_wrong_kind_of_peer_fails_and_says_why() {
    let peg = env!("CARGO_BIN_EXE_peg");
    let connect = |addr: &str, tls: bool| {
        let mut args = vec!["connect", addr];
        if tls {
            args.extend(["--tls", "--insecure"]);
        }
        let mut child = Command::new(peg)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for listener_tls in [true, false] {
        let mut args = vec!["listen", "127.0.0.1:0", "--no-stdin", "--quiet"];
        if listener_tls {
            args.push("--tls");
        }
        let (mut listener, mut err, addr) = spawn_listener(&args);
        let (status, says) = connect(&addr, !listener_tls);
        assert!(!status.success(), "{says}");
        let want = if listener_tls {
            "the peer runs TLS"
        } else {
            "does not speak TLS"
        };
        assert!(
            says.contains(want) || says.contains("does not run squarepeg"),
            "{says}"
        );
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        let status = listener.0.take().unwrap().wait().unwrap();
        assert!(!status.success(), "{rest}");
        let want = if listener_tls {
            "does not speak TLS"
        } else {
            "the peer runs TLS"
        };
        assert!(rest.contains(want), "{rest}");
    }
    // A TCP server that reads everything and closes without sending a byte.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let sink = std::thread::spawn(move || {
        let (mut s, _) = server.accept().unwrap();
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
    });
    let (status, says) = connect(&addr, false);
    sink.join().unwrap();
    assert!(!status.success(), "{says}");
    assert!(says.contains("does not run squarepeg"), "{says}");
}

/// A file the receiver cannot store is reported on both sides, not "sent" on one and lost
/// on the other: the receiver says why on the file's stream; the sender fails with that
/// reason — for a small file, and for one it is still writing when the receiver stops it.
/// A `--recv-dir` that is not a directory is refused before anything listens.
#[test]
fn a_file_the_receiver_cannot_store_fails_on_both_sides() {
    let peg = env!("CARGO_BIN_EXE_peg");
    let dir = TempDir::new("refused");
    let recv = dir.0.join("recv");
    std::fs::create_dir_all(&recv).unwrap();
    let out = Command::new(peg)
        .args(["listen", "127.0.0.1:0", "--no-stdin", "--recv-dir"])
        .arg(dir.0.join("missing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(
        says.contains("--recv-dir") && says.contains("not a directory"),
        "{says}"
    );
    for (name, size) in [("small.bin", 1000usize), ("large.bin", 20_000_000)] {
        let file = dir.0.join(name);
        std::fs::write(&file, vec![7u8; size]).unwrap();
        // A directory where the file would go: creating it fails.
        std::fs::create_dir_all(recv.join(name)).unwrap();
        let recv_arg = recv.to_str().unwrap();
        let (mut listener, mut err, bound) = spawn_listener(&[
            "listen",
            "127.0.0.1:0",
            "--quiet",
            "--no-stdin",
            "--recv-dir",
            recv_arg,
        ]);
        let out = Command::new(peg)
            .args(["connect", &bound, "--quiet", "--no-stdin", "--send-file"])
            .arg(&file)
            .output()
            .unwrap();
        let says = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{says}");
        assert!(says.contains(&format!("could not take {name}")), "{says}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("sent "));
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        let status = listener.0.take().unwrap().wait().unwrap();
        assert!(!status.success(), "{rest}");
        assert!(rest.contains("receiving a file failed"), "{rest}");
    }
}

/// A `peg connect` that gives up (a stdin line longer than a message may be) aborts the
/// connection with its reason, and the reason reaches the listener before the process ends.
#[test]
fn a_local_failure_reaches_the_peer_with_its_reason() {
    let peg = env!("CARGO_BIN_EXE_peg");
    let (mut listener, mut err, addr) =
        spawn_listener(&["listen", "127.0.0.1:0", "--quiet", "--no-stdin"]);
    let mut child = Command::new(peg)
        .args(["connect", &addr, "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = vec![b'a'; 2 << 20];
    line.push(b'\n');
    let _ = child.stdin.take().unwrap().write_all(&line);
    let out = child.wait_with_output().unwrap();
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{says}");
    assert!(says.contains("exceeds the maximum"), "{says}");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = listener.0.take().unwrap().wait().unwrap();
    assert!(!status.success(), "{rest}");
    assert!(
        rest.contains("application code 1") && rest.contains("exceeds the maximum"),
        "{rest}"
    );
}
