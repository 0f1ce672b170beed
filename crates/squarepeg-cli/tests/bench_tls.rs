//! `peg bench tls` end to end, kept small: each contender moves 4 MiB once over loopback, and
//! the JSON report has a row per contender with its ratios to tokio-rustls and to quinn.
//! Asserts the report's shape, never the speeds.

mod common;

use common::peg;
use serde_json::Value;

#[test]
fn bench_tls_json_has_every_contender_with_both_ratios() {
    let output = peg(&[
        "bench", "tls", "--bytes", "4194304", "--runs", "1", "--json",
    ]);
    assert!(
        output.status.success(),
        "peg bench tls failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(report["suite"], "TLS13_AES_128_GCM_SHA256");
    assert_eq!(report["bytes"], 4_194_304);
    let rows = report["rows"].as_array().expect("rows");
    let contenders: Vec<&str> = rows
        .iter()
        .map(|r| r["contender"].as_str().expect("contender"))
        .collect();
    assert_eq!(
        contenders,
        ["squarepeg", "tokio_rustls", "quinn", "raw_tcp"]
    );
    for row in rows {
        assert!(
            row["gbit_per_second"].as_f64().is_some_and(|g| g > 0.0),
            "{row}"
        );
        for rival in [
            "ratio_to_rustls",
            "ratio_to_quinn",
            "paired_to_rustls",
            "paired_to_quinn",
        ] {
            for what in ["throughput", "cpu"] {
                let ratio = row[rival][what].as_f64();
                assert!(ratio.is_some_and(|r| r > 0.0), "{rival}.{what} in {row}");
            }
        }
    }
    // Each rival against itself.
    assert_eq!(rows[1]["ratio_to_rustls"]["throughput"], 1.0);
    assert_eq!(rows[2]["ratio_to_quinn"]["cpu"], 1.0);
    assert_eq!(rows[1]["paired_to_rustls"]["throughput"], 1.0);
    // One round: the paired ratio is the ratio of the two runs.
    assert_eq!(rows[0]["paired_to_rustls"], rows[0]["ratio_to_rustls"]);
}
