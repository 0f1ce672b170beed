//! `peg bench messages`: message throughput over loopback, squarepeg over kernel TCP (with
//! the negotiated plain frames, and held to uCOBS) against plain tokio TCP carrying the same
//! bytes as length-prefixed records; wall-clock and CPU-time ratios.

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

/// The best of a contender's runs: wall-clock rate and CPU per byte, each at its best.
#[derive(Clone, Copy)]
struct Best {
    bytes_per_sec: f64,
    messages_per_sec: f64,
    cpu_ns_per_byte: f64,
}

impl Best {
    fn new() -> Self {
        Self {
            bytes_per_sec: f64::MIN,
            messages_per_sec: f64::MIN,
            cpu_ns_per_byte: f64::MAX,
        }
    }

    fn add(&mut self, m: &squarepeg::bench::Measurement) {
        self.bytes_per_sec = self.bytes_per_sec.max(m.bytes_per_sec());
        self.messages_per_sec = self.messages_per_sec.max(m.messages_per_sec());
        self.cpu_ns_per_byte = self.cpu_ns_per_byte.min(m.cpu_ns_per_byte());
    }
}

pub fn run(args: MessagesArgs) -> anyhow::Result<()> {
    use squarepeg::bench::{raw_tcp_messages, squarepeg_messages};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // squarepeg as negotiated over kernel TCP (plain frames, docs/wire.md §3), squarepeg held
    // to uCOBS, and raw TCP, in turn within each round, so that load on the machine hits all
    // three alike.
    let plain = squarepeg::ConnectionConfig::default();
    let mut ucobs = squarepeg::ConnectionConfig::default();
    ucobs.plain_frames = false;
    if !args.json {
        println!(
            "{:>6} {:>9} | {:>9} {:>9} {:>9} | {:>6} {:>6} | {:>7} {:>7} {:>7} | {:>6} {:>6}",
            "size",
            "messages",
            "plain",
            "uCOBS",
            "raw",
            "plain",
            "uCOBS",
            "plain",
            "uCOBS",
            "raw",
            "plain",
            "uCOBS"
        );
        println!(
            "{:>6} {:>9} | {:>29} | {:>13} | {:>23} | {:>13}",
            "B", "", "MB/s", "ratio (wall)", "CPU ns/B", "ratio (CPU)"
        );
    }
    for &size in &args.sizes {
        anyhow::ensure!(size > 0, "message size must be > 0");
        let count = (args.bytes / size).max(1);
        let (mut p, mut u, mut r) = (Best::new(), Best::new(), Best::new());
        for _ in 0..args.runs.max(1) {
            p.add(&rt.block_on(squarepeg_messages(size, count, plain.clone()))?);
            u.add(&rt.block_on(squarepeg_messages(size, count, ucobs.clone()))?);
            r.add(&rt.block_on(raw_tcp_messages(size, count))?);
        }
        let wall = |b: &Best| b.bytes_per_sec / r.bytes_per_sec;
        let cpu = |b: &Best| r.cpu_ns_per_byte / b.cpu_ns_per_byte;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "messages", "size": size, "count": count,
                    "squarepeg_bytes_per_sec": p.bytes_per_sec,
                    "squarepeg_messages_per_sec": p.messages_per_sec,
                    "squarepeg_cpu_ns_per_byte": p.cpu_ns_per_byte,
                    "ucobs_bytes_per_sec": u.bytes_per_sec,
                    "ucobs_cpu_ns_per_byte": u.cpu_ns_per_byte,
                    "raw_tcp_bytes_per_sec": r.bytes_per_sec,
                    "raw_tcp_cpu_ns_per_byte": r.cpu_ns_per_byte,
                    "ratio": wall(&p), "ucobs_ratio": wall(&u),
                    "cpu_ratio": cpu(&p), "ucobs_cpu_ratio": cpu(&u),
                })
            );
        } else {
            println!(
                "{:>6} {:>9} | {:>9.1} {:>9.1} {:>9.1} | {:>6.2} {:>6.2} | {:>7.3} {:>7.3} {:>7.3} | {:>6.2} {:>6.2}",
                size,
                count,
                p.bytes_per_sec / 1e6,
                u.bytes_per_sec / 1e6,
                r.bytes_per_sec / 1e6,
                wall(&p),
                wall(&u),
                p.cpu_ns_per_byte,
                u.cpu_ns_per_byte,
                r.cpu_ns_per_byte,
                cpu(&p),
                cpu(&u),
            );
        }
    }
    Ok(())
}
