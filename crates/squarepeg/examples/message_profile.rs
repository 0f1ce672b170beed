//! Runs one contender of the message benchmark alone, for profiling:
//! `cargo run --release -p squarepeg --example message_profile -- peg 1024 268435456`
//! (contender `peg` or `raw`, message size, payload bytes). Prints wall
//! time, process CPU time, context switches and heap allocations per
//! message, so that `perf record`, `strace -c -f` and `valgrind` runs see
//! only the contender under study. `PEG_READ`, `PEG_BATCH`, `PEG_QUEUES` (both message queues), `PEG_STATUS`
//! and `PEG_LOWAT`
//! (bytes; `PEG_LOWAT=0` leaves the system default) override the
//! connection's read size, write batch, message queues, status queue and
//! `TCP_NOTSENT_LOWAT`, for both
//! contenders where they apply.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use squarepeg::ConnectionConfig;
use squarepeg::bench::{raw_tcp_messages_with, squarepeg_messages};

/// Counts heap allocations (a figure per message is what matters).
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn rusage() -> libc::rusage {
    // SAFETY: getrusage fills the struct it is given; all-zero is a valid
    // rusage.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    }
}

fn secs(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let contender = args.get(1).map_or("peg", String::as_str).to_string();
    let size: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let bytes: usize = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(256 << 20);
    let runs: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1);
    let count = (bytes / size).max(1);
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let mut config = ConnectionConfig::default();
    if let Some(v) = env("PEG_READ") {
        config.read_buffer = v;
    }
    if let Some(v) = env("PEG_BATCH") {
        config.write_batch = v;
    }
    if let Some(v) = env("PEG_QUEUES") {
        config.session.message_send_queue = v;
        config.session.message_receive_queue = v;
    }
    if let Some(v) = env("PEG_STATUS") {
        config.status_queue = v;
    }
    if let Some(v) = env("PEG_LOWAT") {
        config.notsent_lowat = (v > 0).then_some(v as u32);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    for _ in 0..runs {
        let before = rusage();
        let allocs = ALLOCS.load(Ordering::Relaxed);
        let m = match contender.as_str() {
            "raw" => rt.block_on(raw_tcp_messages_with(size, count, &config))?,
            _ => rt.block_on(squarepeg_messages(size, count, config.clone()))?,
        };
        let after = rusage();
        let allocs = ALLOCS.load(Ordering::Relaxed) - allocs;
        let user = secs(after.ru_utime) - secs(before.ru_utime);
        let sys = secs(after.ru_stime) - secs(before.ru_stime);
        let wall = m.elapsed.as_secs_f64();
        println!(
            "{contender} size {size} count {count}: {:.1} MB/s wall {:.3}s cpu user {:.3}s sys {:.3}s ({:.2} cores, {:.2} ns cpu/byte) vcsw {} ivcsw {} ({:.3}/msg) allocs/msg {:.2}",
            m.bytes_per_sec() / 1e6,
            wall,
            user,
            sys,
            (user + sys) / wall,
            (user + sys) * 1e9 / (size * count) as f64,
            after.ru_nvcsw - before.ru_nvcsw,
            after.ru_nivcsw - before.ru_nivcsw,
            (after.ru_nvcsw - before.ru_nvcsw) as f64 / count as f64,
            allocs as f64 / count as f64,
        );
    }
    Ok(())
}
