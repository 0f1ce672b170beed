//! `peg lab failover` and `peg lab multipath` (issue 12): sessions over two paths on the
//! two-path lab (`squarepeg_experiments::failover`).
//!
//! ```text
//! sudo peg lab failover                                   # blackhole path 0 at 2 s of 6
//! sudo peg lab failover --death reset --at 3s --duration 8s --out results/failover
//! sudo peg lab failover --path0 "delay=10ms rate=50mbit queue=128kb" --path1 "delay=30ms rate=20mbit queue=150kb"
//! sudo peg lab multipath                                  # 10 ms/40 Mbit/s + 30 ms/20 Mbit/s
//! sudo peg lab multipath --rival mptcp --duration 20s --json
//! ```
//!
//! `failover`: per rival (kernel TCP on path 0, kernel MPTCP over both), a bulk download and
//! a voice call while path 0 dies: the longest stall after the death, the time until goodput
//! is back to half its pre-death mean, the call's late and lost messages; writes
//! `failover.json` (schema `squarepeg.failover/1`) and the goodput and voice plots.
//! `multipath`: per rival (TCP on each path alone, MPTCP), the download's goodput against
//! the sum of the paths' rates, the better path's rate and the best single path; writes
//! `multipath.json` (`squarepeg.multipath/1`) and the goodput plot. Both print a table (or
//! the JSON with `--json`), need root, and remove every lab after its run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use squarepeg_experiments::failover::{
    self, Death, FailoverConfig, FailoverReport, MultipathConfig, MultipathReport, Rival,
};
use squarepeg_lab::model::LinkConfig;

use crate::cmd::{parse_duration_arg, with_progress, write_experiment};

/// `peg lab failover`: a download and a call while one of two paths dies.
#[derive(Debug, Args)]
pub struct FailoverLabArgs {
    /// Path 0 (the one that dies), both directions [default: "delay=10ms rate=50mbit
    /// queue=128kb"].
    #[arg(long, value_name = "SPEC")]
    path0: Option<String>,
    /// Path 1, both directions [default: as path 0].
    #[arg(long, value_name = "SPEC")]
    path1: Option<String>,
    /// How path 0 dies: blackhole (silently drops everything), reset (RST to every TCP flow
    /// it carried), cut (blackhole and the client's interface down).
    #[arg(long, default_value = "blackhole", value_parser = parse_death_arg)]
    death: Death,
    /// When path 0 dies, from the start of the traffic.
    #[arg(long, default_value = "2s", value_parser = parse_duration_arg)]
    at: Duration,
    /// How long the download sends and the call lasts.
    #[arg(long, default_value = "6s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// How long the receivers wait after that.
    #[arg(long, default_value = "3s", value_parser = parse_duration_arg)]
    drain: Duration,
    /// The call's playout delay beyond path 0's one-way delay.
    #[arg(long, default_value = "150ms", value_parser = parse_duration_arg)]
    playout: Duration,
    /// Rivals, comma-separated (tcp-path0, tcp-path1, mptcp, squarepeg, squarepeg-redundant) [default: tcp-path0, mptcp, squarepeg, squarepeg-redundant].
    #[arg(long, value_delimiter = ',')]
    rival: Vec<String>,
    /// Seed of path 0's link model (path 1: SEED + 1).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where failover.json and the plots go.
    #[arg(long, value_name = "DIR", default_value = "failover-out")]
    out: PathBuf,
    /// Print the JSON on standard output instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
}

/// `peg lab multipath`: aggregate goodput over two paths.
#[derive(Debug, Args)]
pub struct MultipathLabArgs {
    /// Path 0, both directions [default: "delay=10ms rate=40mbit queue=100kb"].
    #[arg(long, value_name = "SPEC")]
    path0: Option<String>,
    /// Path 1, both directions [default: "delay=30ms rate=20mbit queue=150kb"].
    #[arg(long, value_name = "SPEC")]
    path1: Option<String>,
    /// How long the download sends.
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// The start left out of the steady goodput.
    #[arg(long, default_value = "2s", value_parser = parse_duration_arg)]
    warm_up: Duration,
    /// Rivals, comma-separated (tcp-path0, tcp-path1, mptcp, squarepeg, squarepeg-redundant) [default: tcp-path0, tcp-path1, mptcp, squarepeg].
    #[arg(long, value_delimiter = ',')]
    rival: Vec<String>,
    /// Seed of path 0's link model (path 1: SEED + 1).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where multipath.json and the plot go.
    #[arg(long, value_name = "DIR", default_value = "multipath-out")]
    out: PathBuf,
    /// Print the JSON on standard output instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
}

/// A path's link spec, or `default`.
fn link_arg(flag: &str, spec: Option<&str>, default: &LinkConfig) -> Result<LinkConfig> {
    match spec {
        Some(text) => text
            .parse::<LinkConfig>()
            .with_context(|| format!("{flag} \"{text}\"")),
        None => Ok(default.clone()),
    }
}

fn parse_death_arg(text: &str) -> Result<Death, String> {
    Death::by_name(text).map_err(|e| e.to_string())
}

fn rivals(names: &[String], default: &[Rival]) -> Result<Vec<Rival>> {
    if names.is_empty() {
        return Ok(default.to_vec());
    }
    Ok(names
        .iter()
        .map(|n| Rival::by_name(n.trim()))
        .collect::<Result<_, _>>()?)
}

/// Runs `peg lab failover`.
pub fn run_failover(args: FailoverLabArgs) -> Result<()> {
    let defaults = FailoverConfig::default();
    let path0 = link_arg("--path0", args.path0.as_deref(), &defaults.path0)?;
    let config = FailoverConfig {
        path1: link_arg("--path1", args.path1.as_deref(), &path0)?,
        path0,
        death: args.death,
        at: args.at,
        duration: args.duration,
        drain: args.drain,
        seed: args.seed,
        playout: args.playout,
        ..defaults
    };
    config.validate()?;
    let rivals = rivals(&args.rival, &Rival::FAILOVER)?;
    if !squarepeg_lab::net::is_root() {
        bail!("peg lab failover needs root (network namespaces): run it with sudo");
    }
    let rows = run_rivals(
        &rivals,
        args.json,
        |rival, progress| failover::run_failover(&config, rival, progress),
        |row| {
            let summary = format!(
                "stall {:.2} s{}, voice {} late {} lost of {}",
                row.metrics.stall_s,
                if row.metrics.stalled_to_end {
                    " (to the end)"
                } else {
                    ""
                },
                row.voice.summary.delivered_late,
                row.voice.summary.never_delivered,
                row.voice.summary.messages_sent
            );
            (summary, &row.warnings[..])
        },
    )?;
    let report = FailoverReport::new(config, rows);
    write_experiment(
        &args.out,
        "failover.json",
        &serde_json::to_value(&report)?,
        (args.json, args.no_plots),
        || Ok(failover::plot::failover(&args.out, &report)?),
        || failover::failover_table(&report),
    )
}

/// Runs each rival in turn with a progress line (`[i/n] name`), then prints its one-line
/// summary and warnings (`describe`) unless the output is JSON.
fn run_rivals<R>(
    rivals: &[Rival],
    json: bool,
    run: impl Fn(Rival, &dyn Fn(&str)) -> Result<R, squarepeg_experiments::voip::VoipError>,
    describe: impl Fn(&R) -> (String, &[String]),
) -> Result<Vec<R>> {
    let mut rows = Vec::new();
    for (i, &rival) in rivals.iter().enumerate() {
        let label = format!("[{}/{}] {}", i + 1, rivals.len(), rival.name());
        let row = with_progress(&label, json, |progress| {
            run(rival, progress).with_context(|| format!("running {}", rival.name()))
        })?;
        if !json {
            let (summary, warnings) = describe(&row);
            eprintln!("{label}: {summary}");
            for w in warnings {
                eprintln!("warning: {label}: {w}");
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Runs `peg lab multipath`.
pub fn run_multipath(args: MultipathLabArgs) -> Result<()> {
    let defaults = MultipathConfig::default();
    let config = MultipathConfig {
        path0: link_arg("--path0", args.path0.as_deref(), &defaults.path0)?,
        path1: link_arg("--path1", args.path1.as_deref(), &defaults.path1)?,
        duration: args.duration,
        warm_up: args.warm_up,
        seed: args.seed,
        ..defaults
    };
    config.validate()?;
    let rivals = rivals(&args.rival, &Rival::MULTIPATH)?;
    if !squarepeg_lab::net::is_root() {
        bail!("peg lab multipath needs root (network namespaces): run it with sudo");
    }
    let rows = run_rivals(
        &rivals,
        args.json,
        |rival, progress| failover::run_multipath(&config, rival, progress),
        |row| {
            let summary = format!("{:.1} Mbit/s steady", row.steady_mbps);
            (summary, &row.warnings[..])
        },
    )?;
    let report = MultipathReport::new(config, rows);
    write_experiment(
        &args.out,
        "multipath.json",
        &serde_json::to_value(&report)?,
        (args.json, args.no_plots),
        || Ok(failover::plot::multipath(&args.out, &report)?),
        || failover::multipath_table(&report),
    )
}
