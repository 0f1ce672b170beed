//! `peg lab tunnel` end to end on the real lab: a short run of four variants with one
//! competing upload; the JSON must hold every variant asked for with voice received and
//! goodput in both directions. Correctness only: no figure is compared with another (the
//! experiment's numbers are in docs/results.md). Needs root, iperf3 and openvpn (`.ci/run`
//! installs them); each cell's lab and processes are removed by the experiment. Bad input is
//! refused before anything is built (no root needed).

mod common;

use common::{TempDir, can_run, peg};
use serde_json::Value;

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn lab_tunnel_reports_every_variant() {
    if !can_run() {
        return;
    }
    let dir = TempDir::new("lab-tunnel");
    let out = dir.0.to_str().expect("utf-8 path");
    let variants = ["direct", "openvpn-tcp", "peg-kernel", "peg-utcp-priacks"];
    let output = peg(&[
        "lab",
        "tunnel",
        "--duration",
        "3s",
        "--uploads",
        "1",
        "--variant",
        &variants.join(","),
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
    assert_eq!(summary["schema"], "squarepeg.tunnel/1");
    assert_eq!(summary["path"]["name"], "hollywood-70ms");
    let runs = summary["runs"].as_array().expect("runs");
    let names: Vec<&str> = runs.iter().filter_map(|r| r["variant"].as_str()).collect();
    assert_eq!(names, variants);
    for r in runs {
        let v = &r["voice"];
        assert_eq!(r["uploads"], 1, "{r}");
        assert_eq!(v["messages_sent"], 150, "{r}");
        let received = v["messages_received"].as_u64().expect("received");
        assert!(received > 0 && received <= 150, "{r}");
        let rate = v["late_loss_rate"].as_f64().expect("late-loss rate");
        assert!((0.0..=1.0).contains(&rate), "{r}");
        assert!(v["latency_ms"]["p50"].as_f64().expect("p50") > 0.0, "{r}");
        assert!(r["download_mbps"].as_f64().expect("download") > 0.0, "{r}");
        let uploads = r["upload_mbps"].as_array().expect("uploads");
        assert_eq!(uploads.len(), 1, "{r}");
        assert!(uploads[0].as_f64().expect("upload") > 0.0, "{r}");
    }
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("tunnel.json")).expect("tunnel.json"))
            .expect("JSON");
    assert_eq!(on_disk, summary);
}

#[test]
fn bad_input_is_refused_clearly() {
    for (args, expect) in [
        (
            vec!["--variant", "wireguard"],
            "unknown transport `wireguard`",
        ),
        (vec!["--uploads", "4"], "at most 3"),
        (vec!["--path", "adsl"], "unknown scenario `adsl`"),
        (vec!["--loss", "200%"], "outside 0..100 %"),
        (vec!["--duration", "10ms"], "sends no message"),
    ] {
        let mut all = vec!["lab", "tunnel", "--no-plots", "--out", "/nonexistent/x"];
        all.extend(args);
        let output = peg(&all);
        assert!(!output.status.success());
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains(expect), "{expect}: {err}");
    }
}
