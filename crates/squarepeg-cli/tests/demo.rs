//! `peg demo`: the JSON table on standard output, the files, and bad input.

mod common;

use common::peg;
use serde_json::Value;

#[test]
fn demo_prints_the_table_as_json_and_writes_plots() {
    let dir = std::env::temp_dir().join(format!("sqpg-cli-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().expect("utf-8 path");
    let args = [
        "demo",
        "--duration",
        "2s",
        "--seed",
        "3",
        "--out",
        out,
        "--json",
    ];
    let output = peg(&args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(table["schema"], "squarepeg.demo/1");
    assert_eq!(table["seed"], 3);
    let rows = table["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows
        .iter()
        .take(7)
        .filter_map(|r| r["transport"].as_str())
        .collect();
    assert_eq!(
        names,
        ["tcp", "utcp", "utcp-ir", "udp", "tls", "utls", "utls-ir"]
    );
    assert_eq!(rows.len(), 14);
    // Over TLS the wire does not show which message a lost packet carried.
    assert!(
        rows.iter()
            .filter(|r| r["transport"].as_str().is_some_and(|t| t.contains("tls")))
            .all(|r| r["lost_by_network"].is_null())
    );
    assert!(rows.iter().all(|r| r["messages_sent"] == 100));
    for plot in [
        "plots/sim-hollywood-70ms-cdf.png",
        "plots/sim-hollywood-15ms-cdf.svg",
        "plots/sim-hollywood-70ms-ccdf.png",
        "plots/sim-hollywood-15ms-ccdf.svg",
        "plots/sim-hollywood-70ms-late-loss.png",
        "plots/sim-hollywood-15ms-late-loss.svg",
        "plots/sim-hollywood-70ms-utcp-ir-delay.png",
    ] {
        assert!(dir.join(plot).exists(), "{plot}");
    }
    // The same seed gives the same table.
    let again = peg(&args);
    assert_eq!(again.stdout, output.stdout);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn demo_refuses_a_call_without_messages() {
    let output = peg(&["demo", "--duration", "10ms", "--out", "/nonexistent/x"]);
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("sends no message"), "{err}");
}

/// "What would my network do?": the user's path, playout and message size replace
/// Hollywood's scenarios; a bad link spec says which option is wrong.
#[test]
fn demo_runs_a_users_own_path() {
    let dir = std::env::temp_dir().join(format!("sqpg-cli-demo-path-{}", std::process::id()));
    let out = dir.to_str().expect("utf-8 path");
    let output = peg(&[
        "demo",
        "--duration",
        "4s",
        "--out",
        out,
        "--json",
        "--no-plots",
        "--preset",
        "hollywood-15ms",
        "--down",
        "rate=4mbit delay=20ms loss=50%",
        "--playout",
        "40ms",
        "--message-bytes",
        "300",
        "--interval",
        "10ms",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(table["message_bytes"], 300);
    let rows = table["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 7, "one scenario: the user's");
    for r in rows {
        assert_eq!(r["scenario"], "custom-hollywood-15ms");
        assert_eq!(r["messages_sent"], 400);
    }
    // Half of the downlink's packets are lost: UDP loses about half of the messages.
    let udp = rows.iter().find(|r| r["transport"] == "udp").unwrap();
    let lost = udp["late_loss_count"].as_u64().unwrap();
    assert!((120..280).contains(&lost), "{udp}");

    let bad = peg(&[
        "demo",
        "--duration",
        "1s",
        "--down",
        "rate=fast",
        "--no-plots",
        "--out",
        out,
    ]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--down"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
