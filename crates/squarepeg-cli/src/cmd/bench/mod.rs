//! `peg bench`: quick self-timed benchmarks, each a sub-verb, that put squarepeg next to its
//! rivals in one run and print ratios (or `--json`). The criterion benches (`cargo bench`)
//! measure the same things more slowly and more precisely.

use clap::{Args, Subcommand};

mod framing;
mod messages;
mod rpc;
mod smoltcp;
mod tcp;
mod tls;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    verb: BenchVerb,
}

#[derive(Subcommand, Debug)]
enum BenchVerb {
    /// COBS encode and decode throughput: squarepeg against the `cobs` and `corncobs` crates
    /// and memcpy, on random, text-like and zero-heavy inputs.
    Framing(framing::FramingArgs),
    /// Message throughput over loopback: squarepeg over kernel TCP against plain tokio TCP
    /// carrying the same bytes as length-prefixed records.
    Messages(messages::MessagesArgs),
    /// Bulk throughput and CPU per GiB: squarepeg's userspace TCP over TUN against the
    /// kernel, next to smoltcp's on the same path and kernel TCP over a veth pair (root).
    Tcp(tcp::TcpBenchArgs),
    /// Bulk throughput and CPU per GiB inside TLS 1.3 over loopback, one cipher suite for
    /// all: squarepeg over kernel TCP against tokio-rustls, quinn (QUIC over UDP) and raw
    /// kernel TCP.
    Tls(tls::TlsBenchArgs),
    /// One request and its answer on the real lab (root): round trips and segments for TCP,
    /// TCP + TLS 1.3, squarepeg at first contact and returning (TCP Fast Open + TLS 1.3 early
    /// data), quinn at first contact and with 0-RTT, and a replay attempt.
    Rpc(rpc::RpcArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.verb {
        BenchVerb::Framing(args) => framing::run(&args),
        BenchVerb::Messages(args) => messages::run(args),
        BenchVerb::Tcp(args) => tcp::run(args),
        BenchVerb::Tls(args) => tls::run(args),
        BenchVerb::Rpc(args) => rpc::run(args),
    }
}
