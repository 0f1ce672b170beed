//! `peg lab voip --sim`: the table, the JSON on standard output, the files, and the errors a
//! user meets.

mod common;

use common::peg;
use serde_json::Value;

#[test]
fn sim_run_prints_json_and_writes_files() {
    let dir = std::env::temp_dir().join(format!("sqpg-cli-voip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().expect("utf-8 path");
    let output = peg(&[
        "lab",
        "voip",
        "--sim",
        "--scenario",
        "hollywood-70ms",
        "--duration",
        "2s",
        "--drain",
        "1s",
        "--seed",
        "5",
        "--out",
        out,
        "--json",
        "--no-plots",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(summary["schema"], "squarepeg.voip/1");
    let runs = summary["runs"].as_array().expect("runs");
    let names: Vec<&str> = runs
        .iter()
        .filter_map(|r| r["transport"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "udp",
            "tcp",
            "squarepeg",
            "tls",
            "utcp",
            "utcp-ir",
            "utls",
            "utls-ir"
        ]
    );
    assert!(
        runs.iter()
            .all(|r| r["messages_sent"] == 100 && r["seed"] == 5)
    );
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).expect("summary.json"))
            .expect("JSON");
    assert_eq!(on_disk, summary);
    assert!(dir.join("records/sim-hollywood-70ms-tcp.jsonl").exists());

    // The table, one line per transport.
    let output = peg(&[
        "lab",
        "voip",
        "--sim",
        "--scenario",
        "hollywood-15ms",
        "--transport",
        "udp",
        "--duration",
        "1s",
        "--out",
        out,
        "--no-plots",
    ]);
    assert!(output.status.success());
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(table.contains("late-loss") && table.contains("hollywood-15ms"));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn bad_input_is_refused_clearly() {
    for (args, expect) in [
        (vec!["--scenario", "adsl"], "unknown scenario `adsl`"),
        (vec!["--transport", "quic"], "unknown transport `quic`"),
        (vec!["--duration", "10ms"], "sends no message"),
        (vec!["--message-bytes", "8"], "message size 8"),
    ] {
        let mut all = vec![
            "lab",
            "voip",
            "--sim",
            "--no-plots",
            "--out",
            "/nonexistent/x",
        ];
        all.extend(args);
        let output = peg(&all);
        assert!(!output.status.success());
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains(expect), "{expect}: {err}");
    }
}
