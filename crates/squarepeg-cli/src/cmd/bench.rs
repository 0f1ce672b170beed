//! `peg bench`: benchmarks that put squarepeg next to its rivals in one run and print ratios.
//! Each sub-verb lives in its own module.

use clap::{Args, Subcommand};

use super::bench_tcp;

/// Run benchmarks.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Bulk throughput and CPU per GiB: squarepeg's userspace TCP over TUN against the kernel,
    /// next to kernel TCP over a veth pair (root).
    Tcp(bench_tcp::TcpBenchArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchCommand::Tcp(a) => bench_tcp::run(a),
    }
}
