//! What the `peg` integration tests share.
// Each test crate uses only part of this.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use squarepeg_lab::net::NetNs;

/// Runs the `peg` binary built for these tests with `args`.
pub fn peg(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peg"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run peg")
}

/// A directory removed when the test ends, even on failure.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("peg-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const PEG: &str = env!("CARGO_BIN_EXE_peg");

pub fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    let ok = unsafe { libc::geteuid() } == 0 && std::path::Path::new("/dev/net/tun").exists();
    if !ok {
        eprintln!("skipped: needs root and /dev/net/tun");
    }
    ok
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub fn namespace(tag: &str) -> NetNs {
    let name = format!(
        "spcli-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    NetNs::create(&name).expect("namespace")
}

/// A `peg` child process, killed on drop; its stderr lines arrive on a channel.
pub struct Peg {
    pub child: Child,
    pub stderr: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Peg {
    pub fn spawn(args: &[&str]) -> Peg {
        Peg::spawn_program(PEG, args)
    }

    /// Runs `program` (e.g. `ip netns exec NS peg ...`) with the same handling.
    pub fn spawn_program(program: &str, args: &[&str]) -> Peg {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run peg");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Peg {
            child,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `text`.
    pub fn wait_for(&mut self, text: &str) {
        loop {
            match self.stderr.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => {
                    let hit = line.contains(text);
                    self.seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!("peg never said {text:?}; it said {:?}", self.seen),
            }
        }
    }

    /// Waits (at most a minute, then kills it) for the exit; returns success, stdout and the
    /// rest of stderr.
    pub fn finish(mut self) -> (bool, String, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("peg did not exit within a minute; it said {:?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The tests' peg print a few lines: the pipe held them until the exit.
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out).unwrap();
        }
        let mut err = self.seen.join("\n");
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_secs(2)) {
            err.push('\n');
            err.push_str(&l);
        }
        (status.success(), out, err)
    }
}

impl Drop for Peg {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A kernel TCP socket in the namespace.
pub fn kernel_connect(ns: &NetNs, to: SocketAddr) -> std::net::TcpStream {
    let s = ns
        .run(|| {
            socket2::Socket::new(
                socket2::Domain::for_address(to),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )
        })
        .unwrap()
        .unwrap();
    s.connect_timeout(&to.into(), Duration::from_secs(10))
        .unwrap();
    let s: std::net::TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

pub fn kernel_listen(ns: &NetNs, at: SocketAddr) -> std::net::TcpListener {
    ns.run(|| std::net::TcpListener::bind(at)).unwrap().unwrap()
}

pub fn random(len: usize, seed: u8) -> Vec<u8> {
    // A cheap deterministic pattern that is not periodic at any small period.
    let mut x: u32 = 0x9e37_79b9 ^ u32::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

pub fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}
