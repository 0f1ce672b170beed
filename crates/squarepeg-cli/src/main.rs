//! `peg`: the squarepeg command-line tool. Each verb lives in its own module
//! under `cmd/`; this file only parses the command line and dispatches.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// The main job, no privileges needed: VoIP over standard TCP, unordered TCP (with and
    /// without inconsistent retransmissions) and UDP on the simulator, Hollywood's scenarios.
    Demo(cmd::demo::DemoArgs),
    /// Userspace TCP on a TUN device: servers and clients to use with nc, socat or curl.
    Tcp(Box<cmd::tcp::TcpArgs>),
    /// Accept one connection and exchange messages and files (over kernel TCP, or the
    /// userspace TCP with --substrate utcp).
    Listen(Box<cmd::listen::ListenArgs>),
    /// Connect and exchange messages and files (over kernel TCP, or the userspace TCP with
    /// --substrate utcp).
    Connect(Box<cmd::connect::ConnectArgs>),
    /// An IP tunnel through TCP-only networks: each packet one squarepeg message, unordered
    /// over the userspace TCP, stale packets dropped, ACKs and small packets first (root).
    Tunnel(cmd::tunnel::TunnelArgs),
    /// Run benchmarks.
    Bench(cmd::bench::BenchArgs),
    /// The network lab: namespaces joined through the userspace link emulator.
    Lab(cmd::lab::LabArgs),
}

fn main() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Which options were given, not defaulted (the substrate check needs it).
    let given = |verb: &str| {
        matches
            .subcommand_matches(verb)
            .map(cmd::stack::StackArgs::given_in)
            .unwrap_or_default()
    };
    match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Tcp(a) => cmd::tcp::run(*a),
        Command::Listen(a) => cmd::listen::run(*a, &given("listen")),
        Command::Connect(a) => cmd::connect::run(*a, &given("connect")),
        Command::Tunnel(a) => {
            let side = match &a.side {
                cmd::tunnel::Side::Server(_) => "server",
                cmd::tunnel::Side::Client(_) => "client",
            };
            let given = matches
                .subcommand_matches("tunnel")
                .and_then(|m| m.subcommand_matches(side))
                .map(cmd::stack::StackArgs::given_in)
                .unwrap_or_default();
            cmd::tunnel::run(a, &given)
        }
        Command::Bench(a) => cmd::bench::run(a),
        Command::Lab(args) => cmd::lab::run(args),
    }
}
