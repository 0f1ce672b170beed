//! `peg bench messages`: message throughput over loopback, squarepeg over kernel TCP
//! against plain tokio TCP carrying the same bytes as length-prefixed records.

use clap::Args;

#[derive(Args, Debug)]
pub struct MessagesArgs {
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 256, 1024, 4096, 16384])]
    pub sizes: Vec<usize>,
    /// Payload bytes per run.
    #[arg(long, default_value_t = 64 << 20)]
    pub bytes: usize,
    /// Runs per size and contender; the best run counts.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: MessagesArgs) -> anyhow::Result<()> {
    use squarepeg::bench::{raw_tcp_messages, squarepeg_messages};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if !args.json {
        println!(
            "{:>8} {:>10} {:>14} {:>14} {:>12} {:>7}",
            "size", "messages", "squarepeg MB/s", "raw TCP MB/s", "squarepeg k/s", "ratio"
        );
    }
    for &size in &args.sizes {
        anyhow::ensure!(size > 0, "message size must be > 0");
        let count = (args.bytes / size).max(1);
        let mut best_peg = f64::MIN;
        let mut best_raw = f64::MIN;
        let mut best_rate = f64::MIN;
        for _ in 0..args.runs.max(1) {
            let p = rt.block_on(squarepeg_messages(
                size,
                count,
                squarepeg::ConnectionConfig::default(),
            ))?;
            let r = rt.block_on(raw_tcp_messages(size, count))?;
            best_peg = best_peg.max(p.bytes_per_sec());
            best_rate = best_rate.max(p.messages_per_sec());
            best_raw = best_raw.max(r.bytes_per_sec());
        }
        let ratio = best_peg / best_raw;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "messages", "size": size, "count": count,
                    "squarepeg_bytes_per_sec": best_peg, "raw_tcp_bytes_per_sec": best_raw,
                    "squarepeg_messages_per_sec": best_rate, "ratio": ratio,
                })
            );
        } else {
            println!(
                "{:>8} {:>10} {:>14.1} {:>14.1} {:>12.1} {:>7.2}",
                size,
                count,
                best_peg / 1e6,
                best_raw / 1e6,
                best_rate / 1e3,
                ratio
            );
        }
    }
    Ok(())
}
