//! `peg lab priority`: Minion §8.3 — a network-limited sender on a squarepeg connection over
//! the userspace TCP, 1 message in 100 high priority; per-message delay (send call to
//! delivery) per class, with message priorities (the TCP's queue inserts them ahead of
//! untransmitted lower-priority data) and without (FIFO) (`squarepeg_experiments::priority`).
//!
//! ```text
//! peg lab priority --sim                       # 20 s per variant, seed 1, priority-out/
//! peg lab priority --sim --duration 60s --json
//! sudo peg lab priority                        # the same on the real lab (userspace TCP on TUN)
//! sudo peg lab priority --kernel-tcp           # plus the squarepeg crate over kernel TCP
//! ```
//!
//! Prints the table (or the JSON, schema `squarepeg.priority/1`, with `--json`) and writes
//! `priority.json` and `priority-cdf.{svg,png}` to the output directory.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use squarepeg_experiments::priority::{
    PriorityConfig, Transport, Variant, plot_cdf, priority_json, priority_table, run_all, run_lab,
};

use crate::cmd::{parse_duration_arg, write_experiment};

/// `peg lab priority`: the Minion §8.3 priority experiment.
#[derive(Debug, Args)]
pub struct PriorityArgs {
    /// Run on the deterministic simulator instead of the real lab (which needs root: it
    /// builds namespaces and puts squarepeg's userspace TCP on TUN at both ends).
    #[arg(long)]
    sim: bool,
    /// How long the sender writes, per variant.
    #[arg(long, default_value = "20s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// Bytes per message (one segment at most).
    #[arg(long, default_value_t = 1000)]
    message_bytes: usize,
    /// One message in this many is high priority.
    #[arg(long, default_value_t = 100)]
    high_every: u64,
    /// The sender's TCP send buffer in bytes (over kernel TCP: the session's message queue).
    #[arg(long, default_value_t = 256 * 1024)]
    send_buffer: usize,
    /// On the real lab, also run the `squarepeg` crate over kernel TCP with late binding
    /// (priorities in the session scheduler, the kernel's unsent queue kept short); the
    /// simulator has no kernel TCP.
    #[arg(long, conflicts_with = "sim")]
    kernel_tcp: bool,
    /// A fixed `TCP_NOTSENT_LOWAT` in bytes for the kernel-TCP sender (default: the crate's,
    /// which follows the delivery rate, at most 64 KiB).
    #[arg(long, requires = "kernel_tcp")]
    notsent_lowat: Option<u32>,
    /// Seed of the simulator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where priority.json and the plots go.
    #[arg(long, value_name = "DIR", default_value = "priority-out")]
    out: PathBuf,
    /// Print the JSON on standard output instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
}

/// Runs `peg lab priority`.
pub fn run(args: PriorityArgs) -> Result<()> {
    if !args.sim && !squarepeg_lab::net::is_root() {
        bail!(
            "peg lab priority needs root for the real lab (network namespaces, TUN devices): \
             run it with sudo, or use --sim"
        );
    }
    let config = PriorityConfig {
        duration: args.duration,
        message_bytes: args.message_bytes,
        high_every: args.high_every,
        send_buffer: args.send_buffer,
        notsent_lowat: args.notsent_lowat,
    };
    let runs = if args.sim {
        run_all(&config, args.seed)
    } else {
        let transports: &[Transport] = if args.kernel_tcp {
            &[Transport::Utcp, Transport::KernelTcp]
        } else {
            &[Transport::Utcp]
        };
        transports
            .iter()
            .flat_map(|&t| Variant::ALL.iter().map(move |&v| (t, v)))
            .map(|(t, v)| {
                if !args.json {
                    eprintln!(
                        "{} {} on the real lab: {} s …",
                        t.name(),
                        v.name(),
                        config.duration.as_secs_f64()
                    );
                }
                run_lab(&config, v, args.seed, t)
            })
            .collect()
    }
    .context("running the priority experiment")?;
    write_experiment(
        &args.out,
        "priority.json",
        &priority_json(&config, args.seed, &runs),
        (args.json, args.no_plots),
        || Ok(plot_cdf(&args.out, &runs)?),
        || {
            let mut table = priority_table(&runs);
            for r in &runs {
                let Some(o) = r.overtaking() else { continue };
                table += &format!(
                    "{}: in {} of {} pairs (high message, low message sent before it and not \
                     yet transmitted when it entered the TCP's queue) the high message was \
                     delivered first\n",
                    r.variant.name(),
                    o.delivered_first,
                    o.pairs,
                );
            }
            table
        },
    )
}
