//! `peg`: the squarepeg command-line tool. Each verb lives in its own module
//! under `cmd/`; this file only parses the command line and dispatches.

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(
    name = "peg",
    version,
    about = "squarepeg: QUIC-class transport services over TCP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Quick self-timed benchmarks (`cargo bench` has the criterion versions).
    Bench(cmd::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => cmd::bench::run(args),
    }
}
