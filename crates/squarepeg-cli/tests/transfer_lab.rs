//! `peg lab transfer` end to end on the real lab: a short transfer (256 kB over 100 Mbit/s at
//! RTT 20 ms) with kernel CUBIC and the userspace TCP with Careful Resume, cold and
//! returning. Checks that the JSON is well formed, every byte arrived, the captures gave
//! both ends' sequence series and the returning userspace-TCP connection started from the
//! state the first one left (Reconnaissance entered). No timing is compared (the figures are
//! in docs/results.md). Needs root; every lab is removed by the experiment. Bad input is
//! refused before anything is built (no root needed).

mod common;

use common::{TempDir, can_run, peg};
use serde_json::Value;

const SIZE: u64 = 256 * 1024;

/// Runs `peg lab transfer` of [`SIZE`] bytes at RTT 20 ms with `args` into `dir`; returns
/// the JSON it printed.
fn transfer(dir: &TempDir, args: &[&str]) -> Value {
    let out = dir.0.to_str().expect("utf-8 path");
    let mut all = vec!["lab", "transfer", "--size", "256kb", "--rtt", "20ms"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--out", out, "--json"]);
    let output = peg(&all);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn lab_transfer_reports_cold_and_returning_transfers() {
    if !can_run() {
        return;
    }
    let dir = TempDir::new("lab-transfer");
    let summary = transfer(
        &dir,
        &["--rate", "100mbit", "--substrate", "kernel-cubic,utcp"],
    );
    assert_eq!(summary["schema"], "squarepeg.transfer/1");
    assert_eq!(summary["path"]["size_bytes"], SIZE);
    let runs = summary["runs"].as_array().expect("runs");
    let names: Vec<&str> = runs
        .iter()
        .filter_map(|r| r["substrate"].as_str())
        .collect();
    assert_eq!(names, ["kernel-cubic", "utcp"]);
    for r in runs {
        assert_eq!(r["warnings"].as_array().map(Vec::len), Some(0), "{r}");
        let transfers = r["transfers"].as_array().expect("transfers");
        let phases: Vec<&str> = transfers
            .iter()
            .filter_map(|t| t["phase"].as_str())
            .collect();
        assert_eq!(phases, ["cold", "returning"]);
        for t in transfers {
            assert_eq!(t["bytes"], SIZE, "{t}");
            let established = t["established_ms"].as_f64().expect("established");
            let request = t["request_ms"].as_f64().expect("request");
            let last = t["last_byte_ms"].as_f64().expect("last byte");
            assert!(0.0 < established && established <= request && request <= last);
            // Both ends' series from the captures, ending at the last byte.
            for end in ["sender", "receiver"] {
                let series = t[end].as_array().expect("series");
                assert!(!series.is_empty(), "{end}: {t}");
                let top = series
                    .iter()
                    .filter_map(|p| p[1].as_u64())
                    .max()
                    .expect("sequence numbers");
                assert_eq!(top, SIZE, "{end}");
            }
        }
    }
    let utcp = &runs[1]["transfers"];
    assert_eq!(utcp[0]["server"]["resume"]["reconnaissance"], 0, "cold");
    assert_eq!(
        utcp[1]["server"]["resume"]["reconnaissance"], 1,
        "returning"
    );
    assert!(
        runs[0]["transfers"][0]["server"].is_null(),
        "kernel: no stats"
    );
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("transfer.json")).expect("transfer.json"))
            .expect("JSON");
    assert_eq!(on_disk, summary);
    for name in ["transfer-kernel-cubic.svg", "transfer-utcp.png"] {
        assert!(dir.0.join(name).exists(), "{name}");
    }
}

#[test]
fn bad_input_is_refused_clearly() {
    for (args, expect) in [
        (vec!["--substrate", "quic"], "unknown transport `quic`"),
        (vec!["--size", "0b"], "between 1 byte and 1 GiB"),
        (
            vec!["--warm-up", "2000mb"],
            "warm-up 2097152000 bytes: between 1 byte and 1 GiB",
        ),
        (vec!["--rtt", "5s"], "between 1 ms and 2 s"),
        (vec!["--rate", "fast"], "rate"),
    ] {
        let mut all = vec!["lab", "transfer", "--no-plots", "--out", "/nonexistent/x"];
        all.extend(args);
        let output = peg(&all);
        assert!(!output.status.success());
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains(expect), "{expect}: {err}");
    }
}

/// `--fast-open --warm-up 2mb`: the userspace TCP's returning transfer carries the request
/// on its SYN (no separate request write: `request_ms` is 0), every byte arrives, Careful
/// Resume still jumps (the server's SYN-RECEIVED flight is its initial data), and it starts
/// from what the 2 MB warm-up between the two measured, more than the cold transfer left.
/// No timing is compared.
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn lab_transfer_with_fast_open_and_a_warm_up() {
    if !can_run() {
        return;
    }
    let dir = TempDir::new("lab-transfer-tfo");
    let summary = transfer(
        &dir,
        &[
            "--substrate",
            "utcp",
            "--fast-open",
            "--warm-up",
            "2mb",
            "--no-plots",
        ],
    );
    assert_eq!(summary["fast_open"], true);
    assert_eq!(summary["warm_up_bytes"], 2 << 20);
    let transfers = summary["runs"][0]["transfers"]
        .as_array()
        .expect("transfers");
    let phases: Vec<&str> = transfers
        .iter()
        .map(|t| t["phase"].as_str().expect("phase"))
        .collect();
    assert_eq!(phases, ["cold", "warm-up", "returning"]);
    for t in transfers {
        let size = if t["phase"] == "warm-up" {
            2 << 20
        } else {
            SIZE
        };
        assert_eq!(t["bytes"], size, "{t}");
        assert_eq!(
            t["request_ms"], 0.0,
            "the request goes with the connect: {t}"
        );
    }
    let saved = |i: usize| transfers[i]["server"]["resume"]["saved_cwnd"].as_u64();
    let resume = &transfers[2]["server"]["resume"];
    assert_eq!(resume["reconnaissance"], 1, "{resume}");
    assert_eq!(
        resume["unvalidated"], 1,
        "the returning transfer jumped: {resume}"
    );
    assert!(
        saved(2) > saved(1),
        "the warm-up left more than the cold transfer: {:?} then {:?}",
        saved(1),
        saved(2)
    );
}

/// The namespaces of process `pid`'s labs.
fn labs_of(pid: u32) -> Vec<String> {
    squarepeg_lab::net::lab_namespaces()
        .into_iter()
        .filter(|(_, owner, _)| *owner == pid)
        .map(|(name, _, _)| name)
        .collect()
}

/// Kills the experiment and removes what it left however the test ends.
struct Experiment(std::process::Child);

impl Drop for Experiment {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = squarepeg_lab::net::cleanup_leftovers();
    }
}

/// Ctrl-C in the middle of an experiment: it exits with 130 and leaves no namespace behind
/// (before, its labs stayed until the next lab or `peg lab cleanup` removed them).
#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn an_interrupted_experiment_removes_its_labs() {
    if !can_run() {
        return;
    }
    let dir = TempDir::new("lab-interrupt");
    // Long enough to be interrupted: 64 MB at 10 Mbit/s.
    let child = std::process::Command::new(common::PEG)
        .args([
            "lab", "transfer", "--size", "64mb", "--rate", "10mbit", "--rtt", "20ms",
        ])
        .args(["--substrate", "kernel-cubic", "--no-plots", "--out"])
        .arg(&dir.0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run peg");
    let mut experiment = Experiment(child);
    let pid = experiment.0.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while labs_of(pid).len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the experiment built no lab"
        );
        assert!(
            experiment.0.try_wait().expect("try_wait").is_none(),
            "the experiment ended early"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let status = loop {
        if let Some(status) = experiment.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the experiment did not stop on SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut e) = experiment.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(labs_of(pid), Vec::<String>::new(), "{stderr}");
    let interfaces: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.contains(&pid.to_string()) && n.starts_with("sqpg"))
                .collect()
        })
        .unwrap_or_default();
    assert!(interfaces.is_empty(), "{interfaces:?}");
}
