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
    /// Userspace TCP on a TUN device: servers and clients to use with nc, socat or curl.
    Tcp(Box<cmd::tcp::TcpArgs>),
    /// Run benchmarks.
    Bench(cmd::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Tcp(a) => cmd::tcp::run(*a),
        Command::Bench(a) => cmd::bench::run(a),
    }
}
