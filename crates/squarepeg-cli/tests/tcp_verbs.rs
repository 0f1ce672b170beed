//! `peg tcp` verbs end to end: each test makes a network namespace of its own (unique name,
//! removed on drop), runs `peg tcp ... --setup --netns NS` (which creates the TUN device, the
//! kernel's addresses and the route, and removes them on exit) and talks to it from the
//! kernel's TCP in that namespace — our own sockets, or socat. Needs root (skipped otherwise).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use squarepeg_io::{LAB_V4, LAB_V6};
use squarepeg_lab::net::NetNs;

mod common;
use common::{PEG, Peg, can_run, kernel_connect, kernel_listen, namespace, random, sha};

fn digest_in(text: &str) -> String {
    text.split("sha256 ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no digest in {text:?}"))
        .trim_end_matches(',')
        .to_string()
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn ctrl_c_does_not_wait_for_ever_for_a_silent_peer() {
    if !can_run() {
        return;
    }
    let ns = namespace("grace");
    let mut peg = Peg::spawn(&[
        "tcp",
        "sink",
        "--setup",
        "--netns",
        ns.name(),
        "--port",
        "9000",
        "-q",
        "--grace",
        "500ms",
    ]);
    peg.wait_for("sink on");
    // A client that connects and then says nothing, and keeps its connection open.
    let _silent = kernel_connect(&ns, SocketAddr::new(LAB_V4.stack, 9000));
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(peg.child.id() as libc::pid_t, libc::SIGINT) };
    peg.wait_for("Ctrl-C again abandons");
    // Before the grace period, peg waited for the silent peer until a second Ctrl-C (and
    // `finish` gives up after a minute).
    let (_, _, err) = peg.finish();
    assert!(err.contains("abandoned 1 connection"), "{err}");
    assert!(ns.ip(&["link", "show", "dev", "sp0"]).is_err());
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn sink_prints_the_digest_of_what_a_kernel_client_sent() {
    if !can_run() {
        return;
    }
    let ns = namespace("sink");
    let mut peg = Peg::spawn(&[
        "tcp",
        "sink",
        "--setup",
        "--netns",
        ns.name(),
        "--once",
        "--port",
        "9000",
        "-q",
    ]);
    peg.wait_for("sink on");
    let data = random(3 << 20, 1);
    let mut c = kernel_connect(&ns, SocketAddr::new(LAB_V4.stack, 9000));
    c.write_all(&data).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    let (ok, out, err) = peg.finish();
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("received {} bytes", data.len())),
        "{out}"
    );
    assert_eq!(digest_in(&out), sha(&data), "{out}");
    // The device went away with peg.
    assert!(ns.ip(&["link", "show", "dev", "sp0"]).is_err());
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn source_sends_socat_exactly_what_it_reports() {
    if !can_run() {
        return;
    }
    let ns = namespace("source");
    let mut peg = Peg::spawn(&[
        "tcp",
        "source",
        "2M",
        "--setup",
        "--netns",
        ns.name(),
        "--once",
        "--seed",
        "7",
        "-q",
    ]);
    peg.wait_for("source on");
    let to = format!("TCP:[{}]:19", LAB_V6.stack);
    let out = ns
        .command("socat")
        .args(["-u", &to, "STDOUT"])
        .output()
        .expect("socat (installed by .ci/run)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), 2 << 20);
    let (ok, text, err) = peg.finish();
    assert!(ok, "{err}");
    assert!(text.contains("sent 2097152 bytes"), "{text}");
    assert_eq!(digest_in(&text), sha(&out.stdout), "{text}");
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn echo_returns_every_byte() {
    if !can_run() {
        return;
    }
    let ns = namespace("echo");
    let mut peg = Peg::spawn(&[
        "tcp",
        "echo",
        "--setup",
        "--netns",
        ns.name(),
        "--once",
        "-q",
    ]);
    peg.wait_for("echo on");
    let data = random(1 << 20, 2);
    let c = kernel_connect(&ns, SocketAddr::new(LAB_V4.stack, 7));
    let mut w = c.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut back = Vec::new();
    (&c).read_to_end(&mut back).unwrap();
    writer.join().unwrap();
    assert_eq!(sha(&back), sha(&data));
    let (ok, out, err) = peg.finish();
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("echoed {} bytes", data.len())),
        "{out}"
    );
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn send_and_recv_move_files_to_and_from_kernel_servers() {
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("spcli-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = random(5 << 20, 3);
    let file = dir.join("in.bin");
    std::fs::write(&file, &data).unwrap();

    // send: peg → kernel listener. The listener binds the wildcard so that it can exist
    // before peg creates the device and its addresses.
    let ns = namespace("send");
    let listener = kernel_listen(&ns, "0.0.0.0:9100".parse().unwrap());
    let receiver = std::thread::spawn(move || {
        let (mut c, peer) = listener.accept().unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        (peer.ip(), got)
    });
    let to = SocketAddr::new(LAB_V4.kernel, 9100).to_string();
    let out = Command::new(PEG)
        .args(["tcp", "send"])
        .arg(&file)
        .args(["--to", &to, "--setup", "--netns", ns.name(), "-q"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (peer, got) = receiver.join().unwrap();
    assert_eq!(peer, LAB_V4.stack);
    assert_eq!(sha(&got), sha(&data));
    assert_eq!(digest_in(&String::from_utf8_lossy(&out.stdout)), sha(&data));

    // recv: kernel listener → peg, into a file, over IPv6.
    let ns = namespace("recv");
    let listener = kernel_listen(&ns, "[::]:9101".parse().unwrap());
    let payload = data.clone();
    let sender = std::thread::spawn(move || {
        let (mut c, peer) = listener.accept().unwrap();
        c.write_all(&payload).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        peer.ip()
    });
    let target = dir.join("out.bin");
    let from = SocketAddr::new(LAB_V6.kernel, 9101).to_string();
    let out = Command::new(PEG)
        .args(["tcp", "recv"])
        .arg(&target)
        .args(["--from", &from, "--setup", "--netns", ns.name(), "-q"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sender.join().unwrap(), LAB_V6.stack);
    assert_eq!(std::fs::read(&target).unwrap(), data);
    assert_eq!(digest_in(&String::from_utf8_lossy(&out.stdout)), sha(&data));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `recv` whose connection is refused leaves an existing FILE as it was (issue 14: it used
/// to be truncated before connecting).
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn a_refused_recv_leaves_the_file_alone() {
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("spcli-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("keep.txt");
    std::fs::write(&target, b"precious\n").unwrap();
    // Nothing listens on the kernel's side: its TCP answers with a reset.
    let ns = namespace("refused");
    let from = SocketAddr::new(LAB_V4.kernel, 9102).to_string();
    let out = Command::new(PEG)
        .args(["tcp", "recv"])
        .arg(&target)
        .args(["--from", &from, "--setup", "--netns", ns.name(), "-q"])
        .args(["--connect-timeout", "5"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "recv should fail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"precious\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn errors_are_clear() {
    if !can_run() {
        return;
    }
    let ns = namespace("err");
    let run = |args: &[&str]| {
        let out = Command::new(PEG)
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // No device and no --setup.
    let e = run(&["tcp", "sink", "--netns", ns.name(), "--dev", "nosuch"]);
    assert!(e.contains("no device `nosuch`"), "{e}");
    // Bad addresses.
    let e = run(&[
        "tcp",
        "sink",
        "--setup",
        "--netns",
        ns.name(),
        "--addr",
        "224.0.0.9",
    ]);
    assert!(e.contains("bad address 224.0.0.9"), "{e}");
    let e = run(&[
        "tcp",
        "send",
        "/dev/null",
        "--to",
        "10.77.0.2:80",
        "--netns",
        ns.name(),
    ]);
    assert!(e.contains("the stack's own address"), "{e}");
    let e = run(&[
        "tcp",
        "sink",
        "--setup",
        "--netns",
        ns.name(),
        "--kernel-addr",
        "10.0.0.1",
    ]);
    assert!(e.contains("expected IP/PREFIX"), "{e}");
    let e = run(&[
        "tcp",
        "sink",
        "--setup",
        "--netns",
        ns.name(),
        "--impair",
        "loss=1",
    ]);
    assert!(e.contains("needs a % suffix"), "{e}");
    // A busy device: a second peg on the device the first one holds.
    let mut first = Peg::spawn(&["tcp", "sink", "--setup", "--netns", ns.name(), "-q"]);
    first.wait_for("sink on");
    let e = run(&["tcp", "echo", "--netns", ns.name()]);
    assert!(e.contains("is busy"), "{e}");
    let e = run(&["tcp", "echo", "--setup", "--netns", ns.name()]);
    assert!(e.contains("exists already"), "{e}");
    drop(first);
    // Not root: an unprivileged user cannot create a device.
    if Command::new("setpriv").arg("--version").output().is_ok() {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", PEG])
            .args(["tcp", "sink", "--setup", "--netns", ns.name()])
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains("run as root"), "{e}");
    }
}

/// Runs `peg ARGS` inside `ns` (the kernel's side of the device), with `stdin` as its input.
fn peg_in(ns: &NetNs, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name(), PEG])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run peg in the namespace");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `peg connect FROM --substrate utcp` (plus `extra`) from namespace `ns_name`, writing
/// `line`, retried for a few seconds while the kernel's listener may not be up yet. Returns
/// the successful run's stderr; fails the test if no attempt succeeds.
fn connect_utcp_retrying(ns_name: &str, from: &str, extra: &[&str], line: &str) -> String {
    let mut last = String::new();
    for _ in 0..20 {
        let mut c = Command::new(PEG)
            .args(["connect", from])
            .args(extra)
            .args(["--substrate", "utcp", "--setup", "--netns", ns_name, "-q"])
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            return last;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("utcp connect: {last}");
}

/// `peg listen` and `peg connect` over the userspace TCP (`--substrate utcp`), each facing
/// the other substrate: messages arrive intact, and a file sent over a stream matches.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn listen_and_connect_run_over_the_userspace_tcp() {
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("spcli-substrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = random(2 << 20, 9);
    let file = dir.join("blob.bin");
    std::fs::write(&file, &data).unwrap();

    // The userspace TCP listens; the kernel's `peg connect` sends two lines and a file.
    let ns = namespace("ulisten");
    let recv_dir = dir.join("received");
    std::fs::create_dir_all(&recv_dir).unwrap();
    let mut listener = Peg::spawn(&[
        "listen",
        "[::]:4433",
        "--substrate",
        "utcp",
        "--setup",
        "--netns",
        ns.name(),
        "--no-stdin",
        "-q",
        "--recv-dir",
        recv_dir.to_str().unwrap(),
    ]);
    listener.wait_for("listening on");
    let to = SocketAddr::new(LAB_V4.stack, 4433).to_string();
    let file_arg = file.to_str().unwrap();
    let (ok, _, err) = peg_in(
        &ns,
        &["connect", &to, "-q", "--send-file", file_arg],
        "hello over utcp\nsecond line\n",
    );
    assert!(ok, "kernel connect: {err}");
    let (ok, out, err) = listener.finish();
    assert!(ok, "utcp listen: {err}");
    assert!(out.contains("] hello over utcp"), "{out}");
    assert!(out.contains("] second line"), "{out}");
    assert_eq!(std::fs::read(recv_dir.join("blob.bin")).unwrap(), data);

    // The kernel's `peg listen` (wildcard: it exists before the device does); the userspace
    // TCP connects, over IPv6.
    let ns = namespace("uconnect");
    let ns_name = ns.name().to_string();
    let kernel = std::thread::spawn(move || {
        let r = peg_in(&ns, &["listen", "[::]:4434", "--no-stdin", "-q"], "");
        (r, ns)
    });
    let from = SocketAddr::new(LAB_V6.kernel, 4434).to_string();
    connect_utcp_retrying(&ns_name, &from, &[], "from the userspace side\n");
    let ((ok, out, err), _ns) = kernel.join().unwrap();
    assert!(ok, "kernel listen: {err}");
    assert!(out.contains("] from the userspace side"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A kernel TCP connect that gets no answer (its SYNs dropped by a firewall rule in the test's
/// own namespace) gives up after --connect-timeout, saying so, instead of hanging.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn connect_gives_up_after_the_timeout() {
    if !can_run() {
        return;
    }
    let ns = namespace("timeout");
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    let nft = |rule: &str| {
        let ok = ns
            .command("nft")
            .args(rule.split(' '))
            .status()
            .expect("run nft")
            .success();
        assert!(ok, "nft {rule}");
    };
    nft("add table inet peg_test");
    nft("add chain inet peg_test out { type filter hook output priority 0 ; }");
    nft("add rule inet peg_test out tcp dport 9 drop");
    let out = ns
        .command(PEG)
        .args(["connect", "127.0.0.1:9", "--connect-timeout", "300ms"])
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .expect("run peg");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("connecting to 127.0.0.1:9: no answer in 300ms"),
        "{err}"
    );
}

/// `peg listen --tls` and `peg connect --tls` over the userspace TCP (`--substrate utcp`),
/// each facing the kernel's TCP: the handshake is TLS 1.3 (the pinned self-signed
/// certificate of the listener, or `--insecure`), messages arrive intact, and a file sent
/// over a stream matches.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn listen_and_connect_run_tls_over_the_userspace_tcp() {
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("spcli-utls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = random(1 << 20, 11);
    let file = dir.join("blob.bin");
    std::fs::write(&file, &data).unwrap();

    // The userspace TCP listens with a self-signed certificate; the kernel's `peg connect`
    // pins it and sends two lines and a file.
    let ns = namespace("utlslisten");
    let recv_dir = dir.join("received");
    std::fs::create_dir_all(&recv_dir).unwrap();
    let mut listener = Peg::spawn(&[
        "listen",
        "[::]:4433",
        "--tls",
        "--substrate",
        "utcp",
        "--setup",
        "--netns",
        ns.name(),
        "--no-stdin",
        "-q",
        "--recv-dir",
        recv_dir.to_str().unwrap(),
    ]);
    listener.wait_for("SHA-256 fingerprint");
    let fingerprint = listener
        .seen
        .last()
        .and_then(|l| l.rsplit_once("fingerprint "))
        .map(|(_, f)| f.trim().to_string())
        .expect("the listener prints its fingerprint");
    listener.wait_for("listening on");
    let to = SocketAddr::new(LAB_V4.stack, 4433).to_string();
    let file_arg = file.to_str().unwrap();
    let (ok, _, err) = peg_in(
        &ns,
        &[
            "connect",
            &to,
            "--tls",
            "--pin",
            &fingerprint,
            "--server-name",
            "localhost",
            "-q",
            "--send-file",
            file_arg,
        ],
        "hello over utls\nsecond line\n",
    );
    assert!(ok, "kernel connect: {err}");
    assert!(err.contains("TLS 1.3, TLS13_"), "{err}");
    let (ok, out, err) = listener.finish();
    assert!(ok, "utcp listen: {err}");
    assert!(err.contains("TLS 1.3, TLS13_"), "{err}");
    assert!(out.contains("] hello over utls"), "{out}");
    assert!(out.contains("] second line"), "{out}");
    assert_eq!(std::fs::read(recv_dir.join("blob.bin")).unwrap(), data);

    // The kernel's `peg listen --tls`; the userspace TCP connects with TLS (not
    // authenticated: the kernel side's certificate is made for the run).
    let ns = namespace("utlsconnect");
    let ns_name = ns.name().to_string();
    let kernel = std::thread::spawn(move || {
        let r = peg_in(
            &ns,
            &["listen", "[::]:4434", "--tls", "--no-stdin", "-q"],
            "",
        );
        (r, ns)
    });
    let from = SocketAddr::new(LAB_V4.kernel, 4434).to_string();
    let last = connect_utcp_retrying(
        &ns_name,
        &from,
        &["--tls", "--insecure"],
        "sealed from the userspace side\n",
    );
    assert!(last.contains("TLS 1.3, TLS13_"), "{last}");
    let ((ok, out, err), _ns) = kernel.join().unwrap();
    assert!(ok, "kernel listen: {err}");
    assert!(out.contains("] sealed from the userspace side"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
