//! `peg bench rpc`: one request and its answer on the real lab, for TCP, TCP + TLS 1.3,
//! squarepeg at first contact and as a returning client (TCP Fast Open + TLS 1.3 early
//! data), and quinn at first contact and with 0-RTT; round trips and segments from the lab's
//! captures, a replay attempt, JSON and a timeline plot. The experiment itself is
//! `squarepeg_experiments::rpc`. Needs root (network namespaces).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use squarepeg_experiments::rpc::{self, Contender, RpcConfig};

#[derive(Args, Debug)]
pub struct RpcArgs {
    /// The path's round-trip time in ms (half each way).
    #[arg(long, default_value_t = 50)]
    rtt_ms: u64,
    /// Measured runs per contender (the table shows medians).
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Bytes of the request.
    #[arg(long, default_value_t = 100)]
    request_bytes: usize,
    /// Bytes of the answer.
    #[arg(long, default_value_t = 100)]
    answer_bytes: usize,
    /// Contenders, comma-separated: tcp, tcp+tls, peg-first, peg-return, peg-utcp-return
    /// (squarepeg's userspace TCP at the client; needs /dev/net/tun), quinn-first,
    /// quinn-0rtt.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tcp,tcp+tls,peg-first,peg-return,peg-utcp-return,quinn-first,quinn-0rtt"
    )]
    contenders: Vec<String>,
    /// Directory for rpc.json, the timeline plot and the lab's captures.
    #[arg(long, default_value = "rpc-out")]
    out: PathBuf,
    /// No plot.
    #[arg(long)]
    no_plots: bool,
}

pub fn run(a: RpcArgs) -> anyhow::Result<()> {
    let contenders = a
        .contenders
        .iter()
        .map(|n| Contender::by_name(n))
        .collect::<Result<Vec<_>, _>>()?;
    let config = RpcConfig {
        rtt: Duration::from_millis(a.rtt_ms.max(1)),
        runs: a.runs,
        request_bytes: a.request_bytes,
        answer_bytes: a.answer_bytes,
        contenders,
        capture_dir: a.out.join("captures"),
    };
    eprintln!(
        "peg bench rpc: {} contender(s) × {} run(s) on a {} ms path (a few seconds each)",
        config.contenders.len(),
        config.runs,
        a.rtt_ms
    );
    let report = rpc::run_lab(&config, &|line| eprintln!("{line}"))?;
    print!("{}", report.table());
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let json = a.out.join("rpc.json");
    let value = serde_json::json!({
        "summary": report.summary(),
        "report": report,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    std::fs::write(&json, serde_json::to_string_pretty(&value)?)
        .with_context(|| format!("writing {}", json.display()))?;
    eprintln!("wrote {}", json.display());
    if !a.no_plots {
        for f in rpc::plot(&a.out, &report)? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}
