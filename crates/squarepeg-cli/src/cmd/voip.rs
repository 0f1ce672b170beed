//! `peg lab voip`: the VoIP late-loss experiment (Hollywood §5, Minion §8.2) on the real
//! network lab, or with `--sim` on the deterministic simulator
//! (`squarepeg_experiments::voip`).
//!
//! ```text
//! peg lab voip                                   # every scenario and transport, 60 s, real lab
//! peg lab voip --sim                             # the same in virtual time (seconds)
//! peg lab voip --scenario hollywood-70ms --transport tcp --transport udp --duration 20s
//! peg lab voip --sim --seed 7 --out results/voip --json
//! ```
//!
//! Prints a table (per scenario × transport: sent, lost by the network, late, never
//! delivered, on time, late-loss rate, missed beyond the network's losses, p99 latency,
//! longest burst) and writes `summary.json`, `records/*.jsonl` and `plots/*.{svg,png}` to
//! the output directory; `--json` prints the summary on standard output instead of the
//! table. The real lab needs root (it builds its own namespaces for each run and removes
//! them).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use squarepeg_experiments::voip::{
    self, RunResult, SCENARIOS, Scenario, VoipConfig, lab, report, sim,
};

use crate::cmd::parse_duration_arg;

/// A user's own path for `peg demo` and `peg lab voip`: "what would my network do?".
#[derive(Debug, Args)]
pub struct PathArgs {
    /// Start from this scenario's path and playout delay (default hollywood-70ms) and run
    /// only that, changed by --up, --down and --playout.
    #[arg(long, value_name = "SCENARIO")]
    preset: Option<String>,
    /// The client-to-server link, as `peg lab up --up` takes it, e.g. "rate=1mbit
    /// delay=35ms ge=p:0.34%,r:33%" (keys: delay, jitter, rate, queue, overhead, loss, ge,
    /// reorder, dup, mtu).
    #[arg(long, value_name = "SPEC")]
    up: Option<String>,
    /// The server-to-client link (the voice direction), e.g. "rate=8mbit delay=35ms
    /// jitter=10ms loss=1%".
    #[arg(long, value_name = "SPEC")]
    down: Option<String>,
    /// The de-jitter playout delay (Hollywood's T_playout).
    #[arg(long, value_parser = parse_duration_arg)]
    playout: Option<Duration>,
}

impl PathArgs {
    /// The user's scenario, if any path option was given.
    pub fn scenario(&self) -> Result<Option<Scenario>> {
        if self.preset.is_none()
            && self.up.is_none()
            && self.down.is_none()
            && self.playout.is_none()
        {
            return Ok(None);
        }
        let base = voip::scenario(self.preset.as_deref().unwrap_or("hollywood-70ms"))?;
        let link = |spec: &Option<String>, what: &str| -> Result<_> {
            spec.as_deref()
                .map(|s| {
                    squarepeg_lab::model::parse_spec(s).with_context(|| format!("--{what} {s:?}"))
                })
                .transpose()
        };
        let (up, down) = (link(&self.up, "up")?, link(&self.down, "down")?);
        if up.is_none() && down.is_none() && self.playout.is_none() {
            // Only a preset: that scenario as it is.
            return Ok(Some(base));
        }
        Ok(Some(base.customized(up, down, self.playout)?))
    }
}

/// `peg lab voip`: run the VoIP experiment.
#[derive(Debug, Args)]
pub struct VoipArgs {
    /// Run on the deterministic simulator (virtual time, squarepeg's userspace TCP) instead
    /// of the real lab (namespaces, kernel TCP and UDP, the `squarepeg` crate).
    #[arg(long)]
    sim: bool,
    /// Scenario to run (repeatable; default: all). Known: hollywood-15ms, hollywood-70ms,
    /// minion-contention, bursty-loss, jitter, jitter-reorder, heavy-loss, long-rtt.
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// Transport to run (repeatable; default: all). Known: udp, tcp, squarepeg, tls, utcp, utcp-ir, utls, utls-ir.
    #[arg(long = "transport", value_name = "NAME")]
    transports: Vec<String>,
    /// How long the call lasts (messages = duration / interval).
    #[arg(long, default_value = "60s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// How long after the last message late arrivals are still counted.
    #[arg(long, default_value = "5s", value_parser = parse_duration_arg)]
    drain: Duration,
    /// Message payload size in bytes.
    #[arg(long, default_value_t = 160)]
    message_bytes: usize,
    /// Time between messages.
    #[arg(long, default_value = "20ms", value_parser = parse_duration_arg)]
    interval: Duration,
    /// Seed of the link model's random decisions (and, on the simulator, of everything).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where summary.json, records/ and plots/ go.
    #[arg(long, value_name = "DIR", default_value = "voip-results")]
    out: PathBuf,
    /// Print the JSON summary on standard output instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten, next_help_heading = "Your own path (instead of --scenario)")]
    path: PathArgs,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
}

/// Runs `peg lab voip`.
pub fn run(args: VoipArgs) -> Result<()> {
    let config = VoipConfig {
        message_bytes: args.message_bytes,
        interval: args.interval,
        drain: args.drain,
        ..VoipConfig::default()
    }
    .with_duration(args.duration)?;
    let custom = args.path.scenario()?;
    if custom.is_some() && !args.scenarios.is_empty() {
        bail!("give either --scenario or a path of your own (--preset, --up, --down, --playout)");
    }
    let scenarios: Vec<Scenario> = if let Some(c) = custom {
        vec![c]
    } else if args.scenarios.is_empty() {
        SCENARIOS
            .iter()
            .map(|n| voip::scenario(n))
            .collect::<Result<_, _>>()?
    } else {
        args.scenarios
            .iter()
            .map(|n| voip::scenario(n))
            .collect::<Result<_, _>>()?
    };
    let runs = if args.sim {
        run_sim(&args, &config, &scenarios)?
    } else {
        run_lab(&args, &config, &scenarios)?
    };
    let written = report::write_outputs(&args.out, &config, &runs, !args.no_plots)
        .with_context(|| format!("writing results to {}", args.out.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&written.summary)?);
    } else {
        print!("{}", report::table(&runs));
        for run in &runs {
            for w in &run.warnings {
                eprintln!(
                    "warning: {} {} {}: {w}",
                    run.engine.name(),
                    run.scenario.name,
                    run.transport
                );
            }
        }
        eprintln!(
            "wrote {} files under {} (summary.json, records/, plots/)",
            written.files.len(),
            args.out.display()
        );
    }
    Ok(())
}

fn run_sim(args: &VoipArgs, config: &VoipConfig, scenarios: &[Scenario]) -> Result<Vec<RunResult>> {
    let transports = if args.transports.is_empty() {
        sim::transports()
    } else {
        args.transports
            .iter()
            .map(|n| sim::transport(n))
            .collect::<Result<_, _>>()?
    };
    let mut runs = Vec::new();
    for scenario in scenarios {
        for transport in &transports {
            let run =
                sim::run(scenario, transport.as_ref(), config, args.seed).with_context(|| {
                    format!("simulating {} over {}", transport.name(), scenario.name)
                })?;
            runs.push(run);
        }
    }
    Ok(runs)
}

fn run_lab(args: &VoipArgs, config: &VoipConfig, scenarios: &[Scenario]) -> Result<Vec<RunResult>> {
    if !squarepeg_lab::net::is_root() {
        bail!(
            "peg lab voip needs root for the real lab (network namespaces, veths and raw \
             sockets): run it with sudo, or use --sim"
        );
    }
    let transports = if args.transports.is_empty() {
        lab::transports()
    } else {
        args.transports
            .iter()
            .map(|n| lab::transport(n))
            .collect::<Result<_, _>>()?
    };
    let mut runs = Vec::new();
    let total = scenarios.len() * transports.len();
    for scenario in scenarios {
        for transport in &transports {
            let bar = if args.json || !std::io::stderr().is_terminal() {
                ProgressBar::hidden()
            } else {
                let bar = ProgressBar::new(config.count);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix} [{bar:30}] {pos}/{len} messages ({elapsed})",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar
            };
            let label = format!(
                "[{}/{total}] {} over {}",
                runs.len() + 1,
                transport.name(),
                scenario.name
            );
            bar.set_prefix(label.clone());
            if bar.is_hidden() && !args.json {
                eprintln!("{label}: {} s call …", config.duration().as_secs_f64());
            }
            let progress = |p: lab::Progress| bar.set_position(p.sent);
            let run = lab::run(scenario, transport.as_ref(), config, args.seed, &progress)
                .with_context(|| {
                    format!(
                        "running {} over {} on the lab",
                        transport.name(),
                        scenario.name
                    )
                })?;
            bar.finish_and_clear();
            if !args.json {
                let s = &run.analysis.summary;
                // Over TLS the wire does not show which message a dropped packet carried.
                let lost = if run.network_losses_visible() {
                    s.lost_by_network.to_string()
                } else {
                    "?".to_owned()
                };
                eprintln!(
                    "{label}: {} sent, {lost} lost by the network, {} late, {} never delivered",
                    s.messages_sent, s.delivered_late, s.never_delivered
                );
            }
            runs.push(run);
        }
    }
    Ok(runs)
}
