//! `peg demo`: the main job for a new user, no privileges needed — the VoIP late-loss
//! experiment in Hollywood's two scenarios on the deterministic simulator, over standard
//! TCP, unordered delivery, unordered delivery with inconsistent retransmissions, and UDP
//! (`squarepeg_experiments::voip::demo`).
//!
//! ```text
//! peg demo                        # 60 s calls, seed 1, plots in demo-out/
//! peg demo --seed 7 --duration 20s --out /tmp/demo --json
//! ```
//!
//! Prints the late-loss table (or, with `--json`, the same table as JSON, schema
//! `squarepeg.demo/1`) and writes `summary.json`, `records/` and the plots (per-message
//! delay, latency CDFs) to the output directory, as `peg lab voip --sim` does.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use squarepeg_experiments::voip::{VoipConfig, demo, report};

use crate::cmd::parse_duration_arg;

/// `peg demo`: VoIP over TCP, uTCP and UDP on the simulator.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Seed of the simulator (the same seed gives the same table).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long each call lasts (one 160-byte message every 20 ms).
    #[arg(long, default_value = "60s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// Where summary.json, records/ and plots/ go.
    #[arg(long, value_name = "DIR", default_value = "demo-out")]
    out: PathBuf,
    /// Print the table as JSON (schema squarepeg.demo/1) instead of text.
    #[arg(long)]
    json: bool,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
    /// Message payload size in bytes.
    #[arg(long, default_value_t = 160)]
    message_bytes: usize,
    /// Time between messages.
    #[arg(long, default_value = "20ms", value_parser = parse_duration_arg)]
    interval: Duration,
    #[command(
        flatten,
        next_help_heading = "Your own path (instead of Hollywood's two)"
    )]
    path: crate::cmd::voip::PathArgs,
}

/// Runs `peg demo`.
pub fn run(args: DemoArgs) -> Result<()> {
    let config = VoipConfig {
        message_bytes: args.message_bytes,
        interval: args.interval,
        ..VoipConfig::default()
    }
    .with_duration(args.duration)?;
    let scenarios = match args.path.scenario()? {
        Some(s) => vec![s],
        None => demo::demo_scenarios(),
    };
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} runs {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix("peg demo");
        bar
    } else {
        ProgressBar::hidden()
    };
    let progress = |done: usize, total: usize, label: &str| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(label.to_owned());
    };
    let runs =
        demo::run_demo(&config, args.seed, &scenarios, &progress).context("running the demo")?;
    bar.set_message("writing plots");
    let written = report::write_outputs(&args.out, &config, &runs, !args.no_plots)
        .with_context(|| format!("writing results to {}", args.out.display()))?;
    bar.finish_and_clear();
    if args.json {
        let value = demo::demo_json(&config, args.seed, &runs);
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!(
        "VoIP on the simulator: {} s calls, {}-byte messages every {} ms, seed {}",
        config.duration().as_secs_f64(),
        config.message_bytes,
        config.interval.as_secs_f64() * 1e3,
        args.seed
    );
    for s in &scenarios {
        println!("{}: {}", s.name, s.description);
    }
    print!("{}", demo::demo_table(&runs));
    println!(
        "late-loss = messages that missed their playout (late or never delivered); net lost = \
         messages whose first transmission the network dropped; sender dr = dropped or \
         replaced by the sender."
    );
    for run in &runs {
        for w in &run.warnings {
            eprintln!("warning: {} {}: {w}", run.scenario.name, run.transport);
        }
    }
    eprintln!(
        "wrote {} files under {} (summary.json, records/, plots/)",
        written.files.len(),
        args.out.display()
    );
    Ok(())
}
