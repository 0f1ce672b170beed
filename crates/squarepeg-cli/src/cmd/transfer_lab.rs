//! `peg lab transfer`: McTiny appendix A on the real lab — a 1-byte request answered with
//! 1 MB over 100 Mbit/s at RTT 117 ms, cold and for a returning client, with Linux TCP
//! (CUBIC, BBR) and squarepeg's userspace TCP with Careful Resume
//! (`squarepeg_experiments::transfer`).
//!
//! ```text
//! sudo peg lab transfer                                   # 1 MB, 100 Mbit/s, 117 ms
//! sudo peg lab transfer --substrate utcp,utcp-plain --runs 3 --out results/transfer
//! sudo peg lab transfer --size 256kb --rate 20mbit --rtt 50ms --json
//! sudo peg lab transfer --substrate utcp --fast-open --warm-up 8mb  # cached state at its best
//! ```
//!
//! Prints a table (per contender, run and transfer: connect() to last byte in ms and RTTs,
//! request to last byte, the last byte on the wire, retransmissions, what Careful Resume did)
//! or the JSON (`--json`, schema `squarepeg.transfer/1`), and writes `transfer.json`, the
//! captures and the sequence-number plots to the output directory. Needs root; every lab is
//! removed after its run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use squarepeg_experiments::transfer::{
    Substrate, TransferConfig, plot, run_lab, transfer_json, transfer_table,
};

use crate::cmd::{parse_duration_arg, with_progress, write_experiment};

/// `peg lab transfer`: the short-transfer experiment.
#[derive(Debug, Args)]
pub struct TransferLabArgs {
    /// Bytes the server sends (e.g. 1mb, 256kb).
    #[arg(long, default_value = "1mb", value_parser = parse_size_arg)]
    size: u64,
    /// The path's rate in each direction (e.g. 100mbit).
    #[arg(long, default_value = "100mbit", value_parser = parse_rate_arg)]
    rate: u64,
    /// The path's round-trip time (half each way).
    #[arg(long, default_value = "117ms", value_parser = parse_duration_arg)]
    rtt: Duration,
    /// The bottleneck queue (default: one bandwidth-delay product).
    #[arg(long, value_parser = parse_size_arg)]
    queue: Option<u64>,
    /// Contenders, comma-separated (kernel-cubic, kernel-bbr, utcp, utcp-plain); default
    /// kernel-cubic, kernel-bbr, utcp.
    #[arg(long, value_delimiter = ',')]
    substrate: Vec<String>,
    /// Runs per contender (a lab each; seeds SEED, SEED+1, …).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
    /// Seed of the link emulator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where transfer.json, the captures and the plots go.
    #[arg(long, value_name = "DIR", default_value = "transfer-out")]
    out: PathBuf,
    /// TCP Fast Open on every contender: the returning client's request rides on the SYN
    /// and the server answers in SYN-RECEIVED.
    #[arg(long)]
    fast_open: bool,
    /// A transfer of this many bytes between the cold and the returning ones (e.g. 8mb),
    /// so that the returning client starts from a path state that saw the whole capacity.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    warm_up: Option<u64>,
    /// Print the JSON on standard output instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
}

fn parse_size_arg(text: &str) -> Result<u64, String> {
    squarepeg_lab::units::parse_size(text).map_err(|e| e.to_string())
}

fn parse_rate_arg(text: &str) -> Result<u64, String> {
    squarepeg_lab::units::parse_rate(text).map_err(|e| e.to_string())
}

/// Runs `peg lab transfer`.
pub fn run(args: TransferLabArgs) -> Result<()> {
    let substrates: Vec<Substrate> = if args.substrate.is_empty() {
        Substrate::DEFAULT.to_vec()
    } else {
        args.substrate
            .iter()
            .map(|n| Substrate::by_name(n.trim()))
            .collect::<Result<_, _>>()?
    };
    let config = TransferConfig {
        size: args.size,
        rate: args.rate,
        rtt: args.rtt,
        queue: args.queue,
        runs: args.runs,
        seed: args.seed,
        fast_open: args.fast_open,
        warm_up: args.warm_up,
    };
    config.validate()?;
    if !squarepeg_lab::net::is_root() {
        bail!("peg lab transfer needs root (network namespaces, TUN devices): run it with sudo");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let cells: Vec<(Substrate, u64)> = substrates
        .iter()
        .flat_map(|&s| (0..u64::from(args.runs)).map(move |i| (s, args.seed + i)))
        .collect();
    let mut runs = Vec::new();
    for (i, &(substrate, seed)) in cells.iter().enumerate() {
        let label = format!(
            "[{}/{}] {} seed {seed}",
            i + 1,
            cells.len(),
            substrate.name()
        );
        let captures = args
            .out
            .join(format!("captures-{}-{seed}", substrate.name()));
        let run = with_progress(&label, args.json, |progress| {
            run_lab(&config, substrate, seed, &captures, progress)
                .with_context(|| format!("running {} (seed {seed})", substrate.name()))
        })?;
        if !args.json {
            for t in &run.transfers {
                eprintln!(
                    "{label}: {} {:.1} ms ({:.2} RTT)",
                    t.phase,
                    t.last_byte.as_secs_f64() * 1000.0,
                    t.last_byte.as_secs_f64() / config.rtt.as_secs_f64()
                );
            }
            for w in &run.warnings {
                eprintln!("warning: {label}: {w}");
            }
        }
        runs.push(run);
    }
    write_experiment(
        &args.out,
        "transfer.json",
        &transfer_json(&config, &runs),
        (args.json, args.no_plots),
        || Ok(plot(&args.out, &config, &runs)?),
        || transfer_table(&config, &runs),
    )
}
