//! `peg lab tunnel`: Minion §8.4 on the real lab — a voice call and an iperf3 download with
//! 0–3 competing uploads through the direct path, OpenVPN in TCP mode, and `peg tunnel` over
//! kernel TCP and over the userspace TCP without and with priACKs
//! (`squarepeg_experiments::tunnel`).
//!
//! ```text
//! sudo peg lab tunnel                                  # every variant, 0-3 uploads, 30 s each
//! sudo peg lab tunnel --uploads 0,2 --duration 60s --repeat 3 --out results/tunnel
//! sudo peg lab tunnel --variant direct,peg-utcp-priacks --loss 1% --json
//! ```
//!
//! Prints a table (per variant × uploads: voice received, late loss, latency percentiles,
//! download and upload goodput) or the JSON (`--json`, schema `squarepeg.tunnel/1`), and
//! writes `tunnel.json` and the plots to the output directory. Needs root, `iperf3` and (for
//! `openvpn-tcp`) Debian's `openvpn`; each cell builds a lab of its own and removes it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use squarepeg_experiments::tunnel::{
    MAX_UPLOADS, TunnelLabConfig, Variant, check_tools, plot, run_cell, tunnel_json, tunnel_table,
};
use squarepeg_experiments::voip::{self, lab::Progress};

use crate::cmd::{parse_duration_arg, write_experiment};

/// `peg lab tunnel`: the Minion §8.4 tunnel experiment.
#[derive(Debug, Args)]
pub struct TunnelLabArgs {
    /// The path: a VoIP scenario's links (hollywood-70ms: ADSL 8/1 Mbit/s, RTT 70 ms;
    /// hollywood-15ms).
    #[arg(long, default_value = "hollywood-70ms")]
    path: String,
    /// Random loss in each direction (e.g. 0.1% or 0.001); default: the path's (0.1 %).
    #[arg(long, value_parser = parse_loss)]
    loss: Option<f64>,
    /// The voice receiver's playout delay (the playout time is send + one-way delay + this).
    #[arg(long, default_value = "150ms", value_parser = parse_duration_arg)]
    playout: Duration,
    /// How long the call lasts per cell (the bulk flows start 3 s earlier).
    #[arg(long, default_value = "30s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// Variants to run, comma-separated (direct, openvpn-tcp, peg-kernel, peg-utcp,
    /// peg-utcp-priacks); default all.
    #[arg(long, value_delimiter = ',')]
    variant: Vec<String>,
    /// Numbers of competing uploads, comma-separated (0-3).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3")]
    uploads: Vec<u32>,
    /// Congestion control of the tunneled iperf3 flows (the outer kernel TCPs keep the
    /// kernel's default).
    #[arg(long, default_value = "cubic")]
    congestion: String,
    /// Congestion control of the outer kernel TCP connections (OpenVPN's, peg-kernel's), set
    /// on the route between the ends; `default` keeps the kernel's default.
    #[arg(long, default_value = "cubic")]
    outer_congestion: String,
    /// Seed of the link emulator's random loss.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run every cell this many times, with seeds SEED, SEED+1, …; the plots show the means.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    repeat: u64,
    /// Where tunnel.json and the plots go.
    #[arg(long, value_name = "DIR", default_value = "tunnel-out")]
    out: PathBuf,
    /// Print the JSON on standard output instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
}

fn parse_loss(text: &str) -> Result<f64, String> {
    let (number, scale) = match text.strip_suffix('%') {
        Some(n) => (n, 100.0),
        None => (text, 1.0),
    };
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a loss rate (e.g. 0.1% or 0.001)"))?;
    let v = v / scale;
    if !(0.0..1.0).contains(&v) {
        return Err(format!("loss {text} is outside 0..100 %"));
    }
    Ok(v)
}

/// Runs `peg lab tunnel`.
pub fn run(args: TunnelLabArgs) -> Result<()> {
    let variants: Vec<Variant> = if args.variant.is_empty() {
        Variant::ALL.to_vec()
    } else {
        args.variant
            .iter()
            .map(|n| Variant::by_name(n.trim()))
            .collect::<Result<_, _>>()?
    };
    if let Some(&n) = args.uploads.iter().find(|&&n| n > MAX_UPLOADS) {
        bail!("{n} uploads: at most {MAX_UPLOADS}");
    }
    let mut scenario = voip::scenario(&args.path)?;
    scenario.playout_delay = args.playout;
    if let Some(loss) = args.loss {
        scenario.bottleneck.left_to_right.loss = loss;
        scenario.bottleneck.right_to_left.loss = loss;
    }
    let peg = std::env::current_exe().context("finding the peg binary")?;
    let mut config = TunnelLabConfig::new(peg, scenario, args.duration)?;
    config.congestion = args.congestion.clone();
    config.outer_congestion =
        (args.outer_congestion != "default").then(|| args.outer_congestion.clone());
    if !squarepeg_lab::net::is_root() {
        bail!(
            "peg lab tunnel needs root (network namespaces, TUN devices, routes): run it with \
             sudo"
        );
    }
    check_tools(&config, &variants)?;
    let mut cells: Vec<(u64, Variant, u32)> = Vec::new();
    for seed in args.seed..args.seed + args.repeat {
        for &n in &args.uploads {
            cells.extend(variants.iter().map(|&v| (seed, v, n)));
        }
    }
    let mut runs = Vec::new();
    for (i, &(seed, variant, uploads)) in cells.iter().enumerate() {
        let label = format!(
            "[{}/{}] {} with {uploads} upload(s), seed {seed}",
            i + 1,
            cells.len(),
            variant.name()
        );
        let bar = if args.json || !std::io::stderr().is_terminal() {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new(config.voice.count);
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} voice messages ({elapsed})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar
        };
        bar.set_prefix(label.clone());
        if bar.is_hidden() && !args.json {
            eprintln!(
                "{label}: {} s call …",
                config.voice.duration().as_secs_f64()
            );
        }
        let progress = |p: Progress| bar.set_position(p.sent);
        let run = run_cell(&config, variant, uploads, seed, &progress)
            .with_context(|| format!("running {} with {uploads} upload(s)", variant.name()))?;
        bar.finish_and_clear();
        if !args.json {
            eprintln!(
                "{label}: voice late loss {:.2} %, download {} Mbit/s, uploads {:.2} Mbit/s",
                run.voice.late_loss_rate * 100.0,
                run.download_mbps
                    .map_or_else(|| "-".to_owned(), |d| format!("{d:.2}")),
                run.upload_total_mbps()
            );
            for w in &run.warnings {
                eprintln!("warning: {label}: {w}");
            }
        }
        runs.push(run);
    }
    write_experiment(
        &args.out,
        "tunnel.json",
        &tunnel_json(&config, args.seed, &runs),
        (args.json, args.no_plots),
        || Ok(plot(&args.out, &config, &runs)?),
        || tunnel_table(&runs),
    )
}

#[cfg(test)]
mod tests {
    use super::parse_loss;

    #[test]
    fn loss_rates() {
        assert_eq!(parse_loss("0.1%"), Ok(0.001));
        assert_eq!(parse_loss("0.02"), Ok(0.02));
        assert!(parse_loss("100%").is_err());
        assert!(parse_loss("x").is_err());
    }
}
