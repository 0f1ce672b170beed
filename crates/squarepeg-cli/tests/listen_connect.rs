//! `peg listen` and `peg connect` as processes: stdin lines become messages
//! printed on the other side, and a file sent over a stream arrives intact
//! with the same SHA-256 printed on both ends.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use sha2::{Digest, Sha256};

/// A directory removed when the test ends, even on failure.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
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

    let mut listener = Reaper(Some(
        Command::new(peg)
            .args(["listen", addr, "--quiet", "--recv-dir"])
            .arg(&recv)
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
    let bound = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected: {line}"))
        .to_string();

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
