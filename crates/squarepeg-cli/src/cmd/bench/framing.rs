//! `peg bench framing`: COBS encode and decode throughput against the `cobs` and
//! `corncobs` crates and memcpy.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use squarepeg_framing::cobs as sp;
use squarepeg_framing::sample::{PayloadKind, payload};

#[derive(Args, Debug)]
pub struct FramingArgs {
    /// Milliseconds of measurement per cell (one codec on one input).
    #[arg(long, default_value_t = 300)]
    time_ms: u64,
    /// Input sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [64, 1024, 16384])]
    sizes: Vec<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Time with the wall clock instead of the thread's CPU time.
    #[arg(long)]
    wall_clock: bool,
}

/// What the benchmarks time with.
#[derive(Clone, Copy, Debug)]
enum Clock {
    /// The thread's CPU time: unlike the wall clock it does not count the
    /// time the scheduler gives to other processes, which on a shared
    /// machine is most of the noise.
    ThreadCpu,
    Wall(Instant),
}

impl Clock {
    /// Time elapsed on this clock since an arbitrary fixed point.
    fn now(self) -> Duration {
        match self {
            Clock::ThreadCpu => thread_cpu_time(),
            Clock::Wall(epoch) => epoch.elapsed(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Clock::ThreadCpu => "thread CPU time",
            Clock::Wall(_) => "wall-clock time",
        }
    }
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call, and CLOCK_THREAD_CPUTIME_ID is a clock Linux always provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Rounds per cell; each codec of a case runs once per round, in turn, so
/// that noise from other processes spreads over all of them. The best
/// round counts (the usual estimator on a shared machine: interference
/// only ever slows a round down).
const ROUNDS: u32 = 15;

#[derive(Serialize)]
struct Report {
    bench: &'static str,
    unit: &'static str,
    time_ms_per_cell: u64,
    clock: &'static str,
    estimator: &'static str,
    cells: Vec<Cell>,
}

/// One operation on one input, every codec: throughput in GB/s (10^9
/// bytes of unencoded data per second).
#[derive(Serialize)]
struct Cell {
    op: &'static str,
    input: &'static str,
    size: usize,
    /// Encoding: `cobs::encode`. Decoding: `cobs::decode_run_into`, what
    /// frame decoding runs on the bytes the marker scan found between two
    /// markers (no zero check; corncobs does none either).
    squarepeg: f64,
    /// Decoding only: `cobs::decode_into`, which first checks the input
    /// for zero bytes (one memchr pass), as the `cobs` crate does.
    #[serde(skip_serializing_if = "Option::is_none")]
    squarepeg_checked: Option<f64>,
    cobs: f64,
    corncobs: f64,
    memcpy: f64,
    /// squarepeg / memcpy.
    vs_memcpy: f64,
    /// squarepeg / the faster of `cobs` and `corncobs`.
    vs_best_rival: f64,
}

/// A codec under test: runs one operation (on the next input of its
/// cell), returns something derived from its output so that it cannot be
/// optimised away.
type Run<'a> = Box<dyn FnMut() -> usize + 'a>;

pub fn run(args: &FramingArgs) -> anyhow::Result<()> {
    ensure!(!args.sizes.is_empty(), "no sizes given");
    ensure!(args.sizes.iter().all(|&s| s > 0), "sizes must be positive");
    let cases: Vec<(&'static str, PayloadKind, usize)> = ["encode", "decode"]
        .into_iter()
        .flat_map(|op| {
            PayloadKind::ALL
                .into_iter()
                .flat_map(move |kind| args.sizes.iter().map(move |&size| (op, kind, size)))
        })
        .collect();
    let progress = ProgressBar::new(cases.len() as u64 * 4).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} cells  {msg}")
            .context("progress template")?,
    );
    let per_round = Duration::from_millis(args.time_ms) / ROUNDS;
    let clock = if args.wall_clock {
        Clock::Wall(Instant::now())
    } else {
        Clock::ThreadCpu
    };
    ensure!(
        args.wall_clock || thread_cpu_time() > Duration::ZERO,
        "no thread CPU clock here; use --wall-clock"
    );
    let mut cells = Vec::new();
    for (op, kind, size) in cases {
        progress.set_message(format!("{op} {kind} {size} B"));
        let inputs = cell_inputs(kind, size);
        let (squarepeg, squarepeg_checked, cobs, corncobs, memcpy) = match op {
            "encode" => {
                let [a, b, c, d] = measure(encoders(inputs)?, size, per_round, clock);
                (a, None, b, c, d)
            }
            _ => {
                let [a, e, b, c, d] = measure(decoders(inputs)?, size, per_round, clock);
                (a, Some(e), b, c, d)
            }
        };
        progress.inc(4);
        let best_rival = cobs.max(corncobs);
        cells.push(Cell {
            op,
            input: kind.name(),
            size,
            squarepeg,
            squarepeg_checked,
            cobs,
            corncobs,
            memcpy,
            vs_memcpy: squarepeg / memcpy,
            vs_best_rival: squarepeg / best_rival,
        });
    }
    progress.finish_and_clear();
    if args.json {
        let report = Report {
            bench: "framing",
            unit: "GB/s",
            time_ms_per_cell: args.time_ms,
            clock: clock.name(),
            estimator: "best of 15 interleaved rounds",
            cells,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&cells, clock);
    }
    Ok(())
}

fn print_table(cells: &[Cell], clock: Clock) {
    println!(
        "COBS throughput, GB/s of unencoded data (best of {ROUNDS} interleaved rounds, {})\n\
         decode: squarepeg = the frame path (run between markers, no zero check);\n\
         checked = cobs::decode_into, which scans for zero bytes first\n",
        clock.name()
    );
    println!(
        "{:<7} {:<11} {:>6} {:>10} {:>8} {:>8} {:>9} {:>8} {:>10} {:>10}",
        "op",
        "input",
        "bytes",
        "squarepeg",
        "checked",
        "cobs",
        "corncobs",
        "memcpy",
        "vs memcpy",
        "vs rivals"
    );
    for c in cells {
        let checked = c
            .squarepeg_checked
            .map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:<7} {:<11} {:>6} {:>10.2} {:>8} {:>8.2} {:>9.2} {:>8.2} {:>9.0}% {:>9.1}x",
            c.op,
            c.input,
            c.size,
            c.squarepeg,
            checked,
            c.cobs,
            c.corncobs,
            c.memcpy,
            100.0 * c.vs_memcpy,
            c.vs_best_rival
        );
    }
}

/// The inputs of one cell: distinct samples of the kind, cycled through
/// so that branch predictors cannot learn one input by heart (a single
/// 64-byte input repeated flatters byte-at-a-time codecs several times
/// over), about 64 KiB of them in all.
fn cell_inputs(kind: PayloadKind, size: usize) -> Vec<Vec<u8>> {
    let count = ((64 << 10) / size).clamp(1, 1024);
    (0..count as u64)
        .map(|seed| payload(kind, size, seed + 1))
        .collect()
}

/// Items taken in turn, round and round.
struct Cycle<T> {
    items: Vec<T>,
    next: usize,
}

impl<T> Cycle<T> {
    fn new(items: Vec<T>) -> Self {
        Self { items, next: 0 }
    }

    fn next(&mut self) -> &T {
        let k = self.next;
        self.next = (k + 1) % self.items.len();
        &self.items[k]
    }
}

/// Encoders, each writing into a buffer allocated here, once.
fn encoders(inputs: Vec<Vec<u8>>) -> anyhow::Result<[Run<'static>; 4]> {
    let n = inputs[0].len();
    // Every codec must produce a decodable encoding of the inputs.
    for input in &inputs {
        let mut enc = Vec::new();
        sp::encode(input, &mut enc);
        let mut back = Vec::new();
        sp::decode(&enc, &mut back).context("squarepeg round trip")?;
        ensure!(back == *input, "squarepeg round trip differs");
    }
    let mut ours = Vec::with_capacity(sp::max_encoded_len(n));
    let mut theirs = vec![0u8; ::cobs::max_encoding_length(n)];
    let mut corn = vec![0u8; corncobs::max_encoded_len(n)];
    let mut copy = vec![0u8; n];
    let (mut a, mut b, mut c, mut d) = (
        Cycle::new(inputs.clone()),
        Cycle::new(inputs.clone()),
        Cycle::new(inputs.clone()),
        Cycle::new(inputs),
    );
    Ok([
        Box::new(move || {
            ours.clear();
            sp::encode(black_box(a.next()), &mut ours);
            ours.len()
        }),
        Box::new(move || ::cobs::encode(black_box(b.next()), &mut theirs)),
        Box::new(move || corncobs::encode_buf(black_box(c.next()), &mut corn)),
        Box::new(move || {
            copy.copy_from_slice(black_box(d.next()));
            usize::from(copy[0])
        }),
    ])
}

/// Decoders, each decoding its own codec's encodings of the inputs into a
/// buffer allocated here, once.
fn decoders(inputs: Vec<Vec<u8>>) -> anyhow::Result<[Run<'static>; 5]> {
    let n = inputs[0].len();
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut corn = Vec::new();
    let mut out = vec![0u8; n + 64];
    for input in &inputs {
        let mut enc = Vec::new();
        sp::encode(input, &mut enc);
        let got = sp::decode_into(&enc, &mut out).context("squarepeg decode")?;
        ensure!(out[..got] == *input, "squarepeg decode differs");
        let got = sp::decode_run_into(&enc, &mut out).context("squarepeg decode")?;
        ensure!(out[..got] == *input, "squarepeg decode differs");
        ours.push(enc);

        let mut enc = vec![0u8; ::cobs::max_encoding_length(n)];
        let len = ::cobs::encode(input, &mut enc);
        enc.truncate(len);
        let report = ::cobs::decode(&enc, &mut out).map_err(|e| anyhow::anyhow!("cobs: {e:?}"))?;
        ensure!(out[..report.frame_size()] == *input, "cobs decode differs");
        theirs.push(enc);

        let mut enc = vec![0u8; corncobs::max_encoded_len(n)];
        let len = corncobs::encode_buf(input, &mut enc);
        enc.truncate(len);
        let got =
            corncobs::decode_buf(&enc, &mut out).map_err(|e| anyhow::anyhow!("corncobs: {e:?}"))?;
        ensure!(out[..got] == *input, "corncobs decode differs");
        corn.push(enc);
    }
    let (mut o1, mut o2, mut o3, mut o4, mut o5) =
        (out.clone(), out.clone(), out.clone(), out.clone(), out);
    let (mut a, mut e) = (Cycle::new(ours.clone()), Cycle::new(ours));
    let (mut b, mut c, mut d) = (Cycle::new(theirs), Cycle::new(corn), Cycle::new(inputs));
    Ok([
        Box::new(move || sp::decode_run_into(black_box(a.next()), &mut o1).unwrap_or(0)),
        Box::new(move || sp::decode_into(black_box(e.next()), &mut o5).unwrap_or(0)),
        Box::new(move || {
            ::cobs::decode(black_box(b.next()), &mut o2).map_or(0, |r| r.frame_size())
        }),
        Box::new(move || corncobs::decode_buf(black_box(c.next()), &mut o3).unwrap_or(0)),
        Box::new(move || {
            o4[..n].copy_from_slice(black_box(d.next()));
            usize::from(o4[0])
        }),
    ])
}

/// Throughput of each runner in GB/s of `bytes`-sized operations.
fn measure<const N: usize>(
    mut runs: [Run<'_>; N],
    bytes: usize,
    per_round: Duration,
    clock: Clock,
) -> [f64; N] {
    // Calibrate a batch to take about a millisecond, so that reading the
    // clock costs nothing measurable.
    let batches: Vec<u64> = runs
        .iter_mut()
        .map(|run| {
            let mut batch = 1u64;
            loop {
                let t = clock.now();
                for _ in 0..batch {
                    black_box(run());
                }
                if clock.now() - t >= Duration::from_millis(1) || batch >= 1 << 30 {
                    return batch;
                }
                batch *= 2;
            }
        })
        .collect();
    let mut best = [0f64; N];
    for _ in 0..ROUNDS {
        for (i, run) in runs.iter_mut().enumerate() {
            let start = clock.now();
            let mut ops = 0u64;
            let elapsed = loop {
                for _ in 0..batches[i] {
                    black_box(run());
                }
                ops += batches[i];
                let elapsed = clock.now() - start;
                if elapsed >= per_round {
                    break elapsed;
                }
            };
            let rate = (ops as f64 * bytes as f64) / elapsed.as_secs_f64() / 1e9;
            best[i] = best[i].max(rate);
        }
    }
    best
}
