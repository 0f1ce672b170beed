//! `peg lab priority --sim`: the JSON on standard output and the refusal without `--sim`.

mod common;

use common::peg;
use serde_json::Value;

#[test]
fn priority_sim_prints_json() {
    let dir = std::env::temp_dir().join(format!("sqpg-cli-priority-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().expect("utf-8 path");
    let output = peg(&[
        "lab",
        "priority",
        "--sim",
        "--duration",
        "1s",
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
    let v: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(v["schema"], "squarepeg.priority/1");
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    let prio = &runs[0];
    assert_eq!(prio["variant"], "priority");
    assert_eq!(
        prio["overtaking"]["pairs"], prio["overtaking"]["delivered_first"],
        "{prio}"
    );
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(dir.join("priority.json")).expect("file"))
            .expect("JSON");
    assert_eq!(on_disk, v);
    std::fs::remove_dir_all(&dir).expect("clean up");

    let output = peg(&[
        "lab",
        "priority",
        "--sim",
        "--high-every",
        "1",
        "--out",
        out,
    ]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("high_every"));
}
