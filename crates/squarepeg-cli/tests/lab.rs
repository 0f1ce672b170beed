//! `peg lab` end to end: up, exec, status, capture, down, cleanup, and the errors a user
//! meets. Needs root, `ip` and `ethtool` for the parts that build a lab (CI runs as root);
//! the state directory is private to the test run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// A state directory per test (tests run in parallel).
fn state_root() -> PathBuf {
    let test = std::thread::current()
        .name()
        .unwrap_or("main")
        .replace("::", "-");
    std::env::temp_dir().join(format!("sqpg-cli-state-{}-{test}", std::process::id()))
}

fn peg(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peg"))
        .args(args)
        .env("SQUAREPEG_LAB_STATE_DIR", state_root())
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("run peg")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["ip", "ethtool"].iter().all(|tool| {
        Command::new(tool)
            .arg(if *tool == "ip" { "-V" } else { "--version" })
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !(root && tools) {
        eprintln!("SKIPPED: `peg lab` needs root, ip and ethtool; CI has them");
    }
    root && tools
}

/// Brings the lab down however the test ends.
struct Down(&'static str);

impl Drop for Down {
    fn drop(&mut self) {
        let output = peg(&["lab", "down", "--name", self.0]);
        if !output.status.success() {
            eprintln!("lab down: {}", text(&output));
        }
        let _ = std::fs::remove_dir_all(state_root());
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn bad_input_is_refused_with_a_clear_message() {
    let output = peg(&["lab", "up", "--up", "rate=8mbit delay=35"]);
    assert!(!output.status.success());
    assert!(
        text(&output).contains("--up \"rate=8mbit delay=35\""),
        "{}",
        text(&output)
    );
    assert!(text(&output).contains("missing unit"), "{}", text(&output));
    let output = peg(&["lab", "up", "--preset", "dialup"]);
    assert!(text(&output).contains("unknown preset `dialup` (known: adsl-15ms, adsl-70ms)"));
    let output = peg(&["lab", "up", "--middlebox", "nat"]);
    assert!(
        text(&output).contains("unknown middlebox `nat`"),
        "{}",
        text(&output)
    );
    let output = peg(&["lab", "up", "--name", "no/slash"]);
    assert!(
        text(&output).contains("lab name `no/slash`"),
        "{}",
        text(&output)
    );
    if can_run() {
        let output = peg(&["lab", "status", "--name", "absent"]);
        assert!(
            text(&output).contains("no lab `absent`"),
            "{}",
            text(&output)
        );
    }
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn a_lab_from_up_to_down() {
    if !can_run() {
        return;
    }
    let name = "clitest";
    let captures = std::env::temp_dir().join(format!("sqpg-cli-cap-{}", std::process::id()));
    let _down = Down(name);
    let output = peg(&[
        "lab",
        "up",
        "--name",
        name,
        "--preset",
        "adsl-15ms",
        "--up",
        "delay=10ms rate=2mbit",
        "--middlebox",
        "seq-offset,window=cap:60000",
        "--capture-dir",
        captures.to_str().expect("utf-8"),
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let up = text(&output);
    assert!(up.contains("lab `clitest` is up"), "{up}");
    assert!(
        up.contains("up   (client → server): delay=10ms rate=2mbit"),
        "{up}"
    );
    assert!(
        up.contains("down (server → client): delay=7500us rate=8mbit loss=0.1%"),
        "{up}"
    );

    let again = peg(&["lab", "up", "--name", name]);
    assert!(!again.status.success());
    assert!(text(&again).contains("is already up"), "{}", text(&again));

    let status = peg(&["lab", "status", "--name", name]);
    assert!(status.status.success(), "{}", text(&status));
    let status: Value = serde_json::from_slice(&status.stdout).expect("status is JSON");
    let server = status["lab"]["topology"]["addresses"]["server_v4"]
        .as_str()
        .expect("server address")
        .to_owned();
    let server6 = status["lab"]["topology"]["addresses"]["server_v6"]
        .as_str()
        .expect("server address")
        .to_owned();
    let pid = status["lab"]["pid"].as_u64().expect("pid");

    // Both address families through the emulator; ping's exit status comes back.
    for address in [&server, &server6] {
        let ping = peg(&[
            "lab", "exec", "--name", name, "client", "--", "ping", "-c", "3", "-i", "0.05", "-q",
            address,
        ]);
        assert!(ping.status.success(), "{}", text(&ping));
    }
    let fails = peg(&[
        "lab", "exec", "--name", name, "server", "--", "sh", "-c", "exit 3",
    ]);
    assert_eq!(fails.status.code(), Some(3));

    let late = captures.join("late");
    let start = peg(&[
        "lab",
        "capture",
        "--name",
        name,
        "--side",
        "server",
        "--dir",
        late.to_str().expect("utf-8"),
    ]);
    assert!(start.status.success(), "{}", text(&start));
    let ping = peg(&[
        "lab", "exec", "--name", name, "client", "--", "ping", "-c", "2", "-i", "0.05", &server,
    ]);
    assert!(ping.status.success(), "{}", text(&ping));
    let stop = peg(&[
        "lab", "capture", "--name", name, "--side", "server", "--stop",
    ]);
    let packets: u64 = text(&stop)
        .strip_prefix("server capture stopped: ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", text(&stop)));
    assert!(packets >= 4, "2 echo requests and 2 replies: {packets}");
    assert!(late.join("server.pcap").exists());

    // A longer way back from now on: ping sees it, status reports it.
    let set = peg(&["lab", "set", "--name", name, "--down", "delay=40ms"]);
    assert!(set.status.success(), "{}", text(&set));
    let ping = peg(&[
        "lab", "exec", "--name", name, "client", "--", "ping", "-c", "2", "-i", "0.05", "-q",
        &server,
    ]);
    let summary = text(&ping);
    let min_rtt: f64 = summary
        .split("= ")
        .nth(1)
        .and_then(|v| v.split('/').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(min_rtt >= 50.0, "10 ms up + 40 ms down: {summary}");
    let bad = peg(&["lab", "set", "--name", name, "--up", "loss=200%"]);
    assert!(text(&bad).contains("above 100%"), "{}", text(&bad));

    let status = peg(&["lab", "status", "--name", name]);
    let status: Value = serde_json::from_slice(&status.stdout).expect("status is JSON");
    assert_eq!(status["lab"]["config"]["down"]["delay"], "40ms");
    let up_packets = status["stats"]["up"]["ip_packets_in"]
        .as_u64()
        .expect("counter");
    assert!(up_packets >= 8, "{status}");
    assert!(status["stats"]["client_side_middleboxes"]["window_segments_rewritten"].is_u64());

    let down = peg(&["lab", "down", "--name", name]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(text(&down).contains("lab `clitest` is down"));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "daemon exited"
    );
    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&format!("sqpg-{pid}-")));
    for side in ["client.pcap", "server.pcap"] {
        let size = std::fs::metadata(captures.join(side))
            .expect("capture")
            .len();
        assert!(size > 24, "{side} holds packets");
    }
    let _ = std::fs::remove_dir_all(&captures);
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn cleanup_removes_what_a_dead_daemon_left() {
    if !can_run() {
        return;
    }
    let _down = Down("ghost");
    let dir = state_root().join("ghost");
    std::fs::create_dir_all(&dir).expect("state dir");
    // A pid that no longer exists: a child that has exited.
    let mut child = Command::new("true").spawn().expect("spawn");
    let dead = child.id();
    child.wait().expect("wait");
    let ns = format!("sqpg-{dead}-ghost-cli");
    let added = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .expect("ip");
    assert!(added.success());
    let state = serde_json::json!({
        "pid": dead, "started_unix": 0,
        "topology": {"name": "ghost", "owner_pid": dead, "client_ns": ns,
            "emulator_ns": format!("sqpg-{dead}-ghost-emu"), "server_ns": format!("sqpg-{dead}-ghost-srv"),
            "interfaces": {"client": "a", "emulator_client": "b", "emulator_server": "c", "server": "d"},
            "addresses": {"client_v4": "10.0.0.1", "server_v4": "10.0.0.2",
                "client_v6": "fd00::1", "server_v6": "fd00::2"}},
        "config": {"name": "ghost", "up": {}, "down": {}}
    });
    std::fs::write(dir.join("state.json"), state.to_string()).expect("state");
    let list = peg(&["lab", "list"]);
    assert!(text(&list).contains("ghost\tdead"), "{}", text(&list));
    let exec = peg(&["lab", "exec", "--name", "ghost", "client", "--", "true"]);
    assert!(text(&exec).contains("is not running"), "{}", text(&exec));
    let cleanup = peg(&["lab", "cleanup"]);
    assert!(cleanup.status.success(), "{}", text(&cleanup));
    assert!(text(&cleanup).contains("removed stale state of lab `ghost`"));
    assert!(text(&cleanup).contains(&format!("removed namespace {ns}")));
    assert!(!dir.exists());
    assert!(!Path::new("/run/netns").join(&ns).exists());
}
