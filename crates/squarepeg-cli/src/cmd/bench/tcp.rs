//! `peg bench tcp`: bulk throughput of squarepeg's userspace TCP over a TUN device against the
//! kernel's TCP, next to the kernel talking to itself over a veth pair, in one run, with CPU
//! seconds per GiB for each side.
//!
//! Every contender runs in network namespaces this command creates (and removes). The kernel
//! ends are this same program re-run as a hidden peer (`--peer sink|source`) inside a
//! namespace, so that their CPU time is their own process's (getrusage). The squarepeg end is
//! this process: the app task and the driver thread. Writing a packet to a TUN device runs the
//! kernel's receive path (and any ACK it sends at once) in the writer's context, so that work
//! is in squarepeg's column, as it is in the sending kernel process's column on the veth.
//! Throughput is always the receiver's: bytes over the time from accepting the connection to
//! reading its end.
//!
//! smoltcp's TCP runs on the same path as squarepeg's rows (see [`super::smoltcp`]), so that
//! squarepeg can be put next to another userspace TCP over TUN (docs/results.md).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use squarepeg_io::{
    HostSetup, InterfaceCounters, Offload, Stack, StackConfig, TunConfig, TunDevice,
};
use squarepeg_lab::net::NetNs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cmd::tcp::{parse_bytes, rate};

#[derive(Args, Debug)]
pub struct TcpBenchArgs {
    /// Bytes per transfer (K, M, G suffixes).
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    bytes: u64,
    /// MTUs of the TUN device (and of the veth pair for the kernel baseline).
    #[arg(long, value_delimiter = ',', default_values_t = [1500u16, 65535])]
    mtus: Vec<u16>,
    /// Transmit queue of the TUN device (kernel → squarepeg), packets.
    #[arg(long, default_value_t = 4096)]
    txqueuelen: u32,
    /// Send and receive buffers of squarepeg's connections, bytes.
    #[arg(long, default_value = "4M", value_parser = parse_bytes)]
    buffer: u64,
    /// Packets the driver reads, or sends, per turn.
    #[arg(long, default_value_t = squarepeg_io::DEFAULT_BATCH)]
    batch: usize,
    /// squarepeg with TUN offloads (IFF_VNET_HDR: the kernel's TSO super-packets split on
    /// read, squarepeg's segments coalesced on write), without, or both next to each other.
    #[arg(long, value_enum, default_value_t = OffloadChoice::Both)]
    offload: OffloadChoice,
    /// Which contenders to run: the kernel over veth (the baseline of the ratios), squarepeg
    /// and smoltcp over TUN.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Contender::Kernel, Contender::Squarepeg, Contender::Smoltcp])]
    contenders: Vec<Contender>,
    /// A smoltcp transfer that moves no byte and changes no state for this long fails.
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    stall_timeout: Duration,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,

    // The kernel peer (this program re-run inside a namespace).
    #[arg(long, hide = true)]
    peer: Option<PeerRole>,
    #[arg(long, hide = true)]
    peer_addr: Option<SocketAddr>,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum OffloadChoice {
    On,
    Off,
    Both,
}

impl OffloadChoice {
    fn modes(self) -> &'static [bool] {
        match self {
            OffloadChoice::On => &[true],
            OffloadChoice::Off => &[false],
            OffloadChoice::Both => &[false, true],
        }
    }
}

/// The TCP implementations `peg bench tcp` can put side by side.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Contender {
    /// Kernel TCP at both ends of a veth pair.
    Kernel,
    /// squarepeg's TCP over a TUN device, the kernel at the other end.
    Squarepeg,
    /// smoltcp's TCP over a TUN device, the kernel at the other end.
    Smoltcp,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|e| format!("`{s}` is not a number of seconds: {e}"))?;
    if secs.is_finite() && secs > 0.0 && secs <= 3600.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(format!("`{s}`: give a number of seconds in (0, 3600]"))
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(super) enum PeerRole {
    Sink,
    Source,
}

pub fn run(a: TcpBenchArgs) -> anyhow::Result<()> {
    if let Some(role) = a.peer {
        let addr = a.peer_addr.context("--peer needs --peer-addr")?;
        return peer(role, addr, a.bytes);
    }
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "peg bench tcp builds network namespaces, a veth pair and a TUN device: run as root"
    );
    ensure!(!a.mtus.is_empty(), "--mtus: give at least one MTU");
    for &m in &a.mtus {
        squarepeg_io::validate_mtu(u32::from(m))?;
    }
    ensure!(a.bytes > 0, "--bytes must be positive");
    ensure!(!a.contenders.is_empty(), "--contenders: give at least one");
    let buffer = usize::try_from(a.buffer).context("--buffer too large")?;
    let mut rows = Vec::new();
    for &mtu in &a.mtus {
        if a.contenders.contains(&Contender::Kernel) {
            let baseline = kernel_over_veth(mtu, a.bytes, a.quiet)
                .with_context(|| format!("kernel ↔ kernel over veth, MTU {mtu}"))?;
            rows.push(baseline);
        }
        for direction in [Direction::SquarepegSends, Direction::SquarepegReceives] {
            if a.contenders.contains(&Contender::Smoltcp) {
                let r = super::smoltcp::smoltcp_over_tun(
                    &super::smoltcp::SmoltcpRun {
                        mtu,
                        bytes: a.bytes,
                        txqueuelen: a.txqueuelen,
                        buffer,
                        stall_timeout: a.stall_timeout,
                    },
                    direction,
                    a.quiet,
                )
                .with_context(|| {
                    let way = match direction {
                        Direction::SquarepegSends => "sending",
                        Direction::SquarepegReceives => "receiving",
                    };
                    format!("smoltcp over TUN, MTU {mtu}, {way}")
                })?;
                rows.push(r);
            }
            if !a.contenders.contains(&Contender::Squarepeg) {
                continue;
            }
            for &offload in a.offload.modes() {
                let r = squarepeg_over_tun(
                    &TunRun {
                        mtu,
                        bytes: a.bytes,
                        txqueuelen: a.txqueuelen,
                        buffer,
                        batch: a.batch,
                        offload,
                    },
                    direction,
                    a.quiet,
                )
                .with_context(|| {
                    format!("squarepeg over TUN, MTU {mtu}, {direction:?}, offload {offload}")
                })?;
                rows.push(r);
            }
        }
    }
    let report = Report::new(rows, &a);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(())
}

// ------------------------------------------------------------------ measurements

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(super) struct Cpu {
    user: f64,
    system: f64,
}

impl Cpu {
    pub(super) fn now() -> Cpu {
        // SAFETY: getrusage writes into the zeroed struct we own.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF with a valid pointer.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Cpu {
            user: secs(u.ru_utime),
            system: secs(u.ru_stime),
        }
    }
    pub(super) fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            user: self.user - earlier.user,
            system: self.system - earlier.system,
        }
    }
    fn total(self) -> f64 {
        self.user + self.system
    }
}

/// What a kernel peer reports on its last stdout line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PeerReport {
    pub(super) bytes: u64,
    /// Accept (or connect) to the end of the transfer.
    pub(super) seconds: f64,
    pub(super) cpu: Cpu,
}

/// Which way the data goes between the userspace stack (squarepeg or smoltcp) and the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Direction {
    #[serde(rename = "userspace_sends")]
    SquarepegSends,
    #[serde(rename = "userspace_receives")]
    SquarepegReceives,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub(super) contender: String,
    /// Whose TCP this row measures, and which way the userspace stack's data went (`None`
    /// for the kernel baseline).
    pub(super) stack: Contender,
    pub(super) direction: Option<Direction>,
    pub(super) mtu: u16,
    pub(super) bytes: u64,
    /// Receiver's bytes per second.
    pub(super) bytes_per_second: f64,
    /// CPU seconds per GiB moved, by side.
    pub(super) sender_cpu_per_gib: f64,
    pub(super) receiver_cpu_per_gib: f64,
    pub(super) sender_cpu: Cpu,
    pub(super) receiver_cpu: Cpu,
    /// For TUN rows: throughput over the kernel-over-veth baseline of the same MTU.
    pub(super) ratio_to_kernel: Option<f64>,
    /// For squarepeg rows: throughput over smoltcp's in the same direction at the same MTU.
    pub(super) ratio_to_smoltcp: Option<f64>,
    /// Packets the kernel dropped at the TUN queue, squarepeg's retransmissions.
    pub(super) tun_queue_drops: Option<u64>,
    pub(super) retransmitted_packets: Option<u64>,
    /// Receiver's transfer time.
    pub(super) seconds: f64,
    /// CPU seconds of squarepeg's driver thread (part of squarepeg's side), and that over the
    /// transfer time: near 1 means the driver thread is the bottleneck.
    pub(super) driver_cpu: Option<f64>,
    pub(super) driver_busy: Option<f64>,
    /// For squarepeg rows: whether TUN offloads were on.
    pub(super) offload: Option<bool>,
    /// For squarepeg rows: segments moved per read and per write system call.
    pub(super) segments_per_read: Option<f64>,
    pub(super) segments_per_write: Option<f64>,
}

pub(super) fn per_gib(cpu: Cpu, bytes: u64) -> f64 {
    cpu.total() / (bytes as f64 / f64::from(1u32 << 30))
}

// ------------------------------------------------------------------ the kernel peer

fn peer(role: PeerRole, addr: SocketAddr, bytes: u64) -> anyhow::Result<()> {
    let mut buf = vec![0u8; 256 << 10];
    let report = match role {
        PeerRole::Sink => {
            let listener = std::net::TcpListener::bind(addr)
                .with_context(|| format!("peer: binding {addr}"))?;
            println!("ready");
            std::io::stdout().flush()?;
            let (mut s, _) = listener.accept()?;
            let (t0, c0) = (Instant::now(), Cpu::now());
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            let (t1, c1) = (Instant::now(), Cpu::now());
            drop(s);
            PeerReport {
                bytes: total,
                seconds: (t1 - t0).as_secs_f64(),
                cpu: c1.since(c0),
            }
        }
        PeerRole::Source => {
            let (t0, c0) = (Instant::now(), Cpu::now());
            let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .with_context(|| format!("peer: connecting to {addr}"))?;
            let mut left = bytes;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                s.write_all(&buf[..n])?;
                left -= n as u64;
            }
            s.shutdown(std::net::Shutdown::Write)?;
            while s.read(&mut buf)? > 0 {}
            let (t1, c1) = (Instant::now(), Cpu::now());
            PeerReport {
                bytes,
                seconds: (t1 - t0).as_secs_f64(),
                cpu: c1.since(c0),
            }
        }
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// A kernel peer process in a namespace.
pub(super) struct PeerProcess {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl PeerProcess {
    pub(super) fn spawn(
        ns: &NetNs,
        role: PeerRole,
        addr: SocketAddr,
        bytes: u64,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding this program")?;
        let exe = exe.to_str().context("this program's path is not UTF-8")?;
        let mut child = ns
            .command(exe)
            .args(["bench", "tcp", "--quiet", "--peer"])
            .arg(match role {
                PeerRole::Sink => "sink",
                PeerRole::Source => "source",
            })
            .arg("--peer-addr")
            .arg(addr.to_string())
            .arg("--bytes")
            .arg(bytes.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the kernel peer")?;
        let stdout = child.stdout.take().context("peer stdout")?;
        let mut p = PeerProcess {
            child,
            lines: BufReader::new(stdout).lines(),
        };
        if role == PeerRole::Sink {
            let line = p.next_line()?;
            ensure!(line == "ready", "kernel peer: unexpected `{line}`");
        }
        Ok(p)
    }

    fn next_line(&mut self) -> anyhow::Result<String> {
        match self.lines.next() {
            Some(l) => Ok(l?),
            None => bail!("the kernel peer exited early ({:?})", self.child.wait()?),
        }
    }

    pub(super) fn report(mut self) -> anyhow::Result<PeerReport> {
        let line = self.next_line()?;
        let status = self.child.wait()?;
        ensure!(status.success(), "kernel peer failed: {status}");
        serde_json::from_str(&line).with_context(|| format!("kernel peer said `{line}`"))
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(super) fn unique(tag: &str) -> String {
    format!("spbench-{tag}-{}", std::process::id())
}

fn spinner(quiet: bool, what: String) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(what);
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

pub(super) fn bytes_bar(quiet: bool, total: u64, what: String) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(what);
    bar
}

// ------------------------------------------------------------------ kernel ↔ kernel

fn kernel_over_veth(mtu: u16, bytes: u64, quiet: bool) -> anyhow::Result<Row> {
    let a = NetNs::create(&unique(&format!("a{mtu}")))?;
    let b = NetNs::create(&unique(&format!("b{mtu}")))?;
    let run = |args: &[&str]| -> anyhow::Result<()> {
        let out = std::process::Command::new("ip").args(args).output()?;
        ensure!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    };
    run(&[
        "link",
        "add",
        "va",
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        "vb",
        "netns",
        b.name(),
    ])?;
    let mtu_s = mtu.to_string();
    for (ns, dev, addr) in [(&a, "va", "10.78.0.1/24"), (&b, "vb", "10.78.0.2/24")] {
        ns.ip(&["link", "set", "dev", dev, "mtu", &mtu_s])
            .with_context(|| format!("veth MTU {mtu}"))?;
        ns.ip(&["addr", "add", addr, "dev", dev])?;
        ns.ip(&["link", "set", "dev", dev, "up"])?;
    }
    let server = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 78, 0, 1)), 5201);
    let bar = spinner(quiet, format!("kernel → kernel over veth, MTU {mtu}"));
    let sink = PeerProcess::spawn(&a, PeerRole::Sink, server, bytes)?;
    let source = PeerProcess::spawn(&b, PeerRole::Source, server, bytes)?;
    let sent = source.report()?;
    let got = sink.report()?;
    bar.finish_and_clear();
    ensure!(
        got.bytes == bytes,
        "the kernel sink got {} of {bytes} bytes",
        got.bytes
    );
    Ok(Row {
        contender: "kernel → kernel (veth)".into(),
        stack: Contender::Kernel,
        direction: None,
        mtu,
        bytes,
        bytes_per_second: bytes as f64 / got.seconds,
        sender_cpu_per_gib: per_gib(sent.cpu, bytes),
        receiver_cpu_per_gib: per_gib(got.cpu, bytes),
        sender_cpu: sent.cpu,
        receiver_cpu: got.cpu,
        ratio_to_kernel: None,
        ratio_to_smoltcp: None,
        tun_queue_drops: None,
        retransmitted_packets: None,
        seconds: got.seconds,
        driver_cpu: None,
        driver_busy: None,
        offload: None,
        segments_per_read: None,
        segments_per_write: None,
    })
}

// ------------------------------------------------------------------ squarepeg ↔ kernel

/// The settings of one squarepeg run.
struct TunRun {
    mtu: u16,
    bytes: u64,
    txqueuelen: u32,
    buffer: usize,
    batch: usize,
    offload: bool,
}

fn squarepeg_over_tun(run: &TunRun, direction: Direction, quiet: bool) -> anyhow::Result<Row> {
    let &TunRun {
        mtu,
        bytes,
        txqueuelen,
        buffer,
        batch,
        offload,
    } = run;
    let ns = NetNs::create(&unique(&format!("t{mtu}")))?;
    let mut tun = TunConfig::default();
    tun.name = Some("sp0".into());
    tun.mtu = Some(mtu);
    tun.tx_queue_len = Some(txqueuelen);
    tun.offload = if offload { Offload::On } else { Offload::Off };
    let device = ns.run(|| TunDevice::open(&tun))??;
    let mut setup = HostSetup::lab("sp0");
    setup.netns = Some(ns.name().to_string());
    setup.pairs.truncate(1); // IPv4 only: the baseline is IPv4 too.
    setup.apply()?;
    let mut config = StackConfig::new(setup.stack_addresses());
    config.connection.send_buffer = buffer;
    config.connection.recv_buffer = buffer;
    config.batch = batch;
    let stack = Stack::new(device, config)?;
    let kernel = SocketAddr::new(setup.pairs[0].kernel, 5201);
    let ours = SocketAddr::new(setup.pairs[0].stack, 5201);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let with = if offload { "offloads" } else { "no offloads" };
    let label = match direction {
        Direction::SquarepegSends => format!("squarepeg → kernel over TUN, MTU {mtu}, {with}"),
        Direction::SquarepegReceives => {
            format!("kernel → squarepeg over TUN, MTU {mtu}, {with}")
        }
    };
    let bar = bytes_bar(quiet, bytes, label.clone());
    let outcome = rt.block_on(async {
        match direction {
            Direction::SquarepegSends => {
                let sink = PeerProcess::spawn(&ns, PeerRole::Sink, kernel, bytes)?;
                let c0 = Cpu::now();
                let mut conn = stack.connect(kernel).await?;
                let buf = vec![0u8; 256 << 10];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(buf.len() as u64) as usize;
                    conn.write_all(&buf[..n]).await?;
                    left -= n as u64;
                    bar.inc(n as u64);
                }
                conn.shutdown().await?;
                let mut scratch = [0u8; 64];
                while conn.read(&mut scratch).await? > 0 {}
                conn.wait_closed().await?;
                let cpu = Cpu::now().since(c0);
                let retransmitted = conn.stats()?.packets_retransmitted;
                drop(conn);
                let got = tokio::task::spawn_blocking(move || sink.report()).await??;
                ensure!(
                    got.bytes == bytes,
                    "the kernel sink got {} of {bytes} bytes",
                    got.bytes
                );
                anyhow::Ok((got.seconds, cpu, got.cpu, retransmitted))
            }
            Direction::SquarepegReceives => {
                let listener = stack.listen(ours)?;
                let source = PeerProcess::spawn(&ns, PeerRole::Source, ours, bytes)?;
                let (mut conn, _) = listener.accept().await?;
                let (t0, c0) = (Instant::now(), Cpu::now());
                let mut buf = vec![0u8; 256 << 10];
                let mut total = 0u64;
                loop {
                    let n = conn.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                    bar.set_position(total);
                }
                let seconds = t0.elapsed().as_secs_f64();
                conn.shutdown().await?;
                conn.wait_closed().await?;
                let cpu = Cpu::now().since(c0);
                let retransmitted = conn.stats()?.packets_retransmitted;
                drop(conn);
                let sent = tokio::task::spawn_blocking(move || source.report()).await??;
                ensure!(total == bytes, "squarepeg got {total} of {bytes} bytes");
                anyhow::Ok((seconds, sent.cpu, cpu, retransmitted))
            }
        }
    });
    bar.finish_and_clear();
    let drops = ns
        .run(|| InterfaceCounters::read("sp0"))?
        .map(|c| c.tx_dropped)
        .ok();
    let final_stats = rt.block_on(stack.shutdown())?;
    let (seconds, sender_cpu, receiver_cpu, retransmitted) = outcome?;
    let device = &final_stats.device;
    let driver_cpu = device.driver_cpu.as_secs_f64();
    let per_call = |segments: u64, calls: u64| (calls > 0).then(|| segments as f64 / calls as f64);
    if !quiet {
        eprintln!("{label}: {}", rate(bytes, seconds));
    }
    Ok(Row {
        contender: match (direction, offload) {
            (Direction::SquarepegSends, false) => "squarepeg → kernel (TUN)".into(),
            (Direction::SquarepegSends, true) => "squarepeg → kernel (TUN+offload)".into(),
            (Direction::SquarepegReceives, false) => "kernel → squarepeg (TUN)".into(),
            (Direction::SquarepegReceives, true) => "kernel → squarepeg (TUN+offload)".into(),
        },
        stack: Contender::Squarepeg,
        direction: Some(direction),
        mtu,
        bytes,
        bytes_per_second: bytes as f64 / seconds,
        sender_cpu_per_gib: per_gib(sender_cpu, bytes),
        receiver_cpu_per_gib: per_gib(receiver_cpu, bytes),
        sender_cpu,
        receiver_cpu,
        ratio_to_kernel: None,
        ratio_to_smoltcp: None,
        tun_queue_drops: drops,
        retransmitted_packets: Some(retransmitted),
        seconds,
        driver_cpu: Some(driver_cpu),
        driver_busy: Some(driver_cpu / seconds),
        offload: Some(offload),
        segments_per_read: per_call(device.packets_read, device.reads),
        segments_per_write: per_call(device.packets_written, device.writes),
    })
}

// ------------------------------------------------------------------ report

#[derive(Debug, Serialize)]
struct Report {
    bytes: u64,
    txqueuelen: u32,
    buffer: u64,
    batch: usize,
    offload: OffloadChoice,
    contenders: Vec<Contender>,
    cpus: usize,
    rows: Vec<Row>,
}

impl Report {
    fn new(mut rows: Vec<Row>, a: &TcpBenchArgs) -> Report {
        let baselines: Vec<(u16, f64)> = rows
            .iter()
            .filter(|r| r.stack == Contender::Kernel)
            .map(|r| (r.mtu, r.bytes_per_second))
            .collect();
        let smoltcp: Vec<(u16, Option<Direction>, f64)> = rows
            .iter()
            .filter(|r| r.stack == Contender::Smoltcp)
            .map(|r| (r.mtu, r.direction, r.bytes_per_second))
            .collect();
        for r in rows.iter_mut() {
            if r.stack != Contender::Kernel
                && let Some((_, base)) = baselines.iter().find(|(m, _)| *m == r.mtu)
            {
                r.ratio_to_kernel = Some(r.bytes_per_second / base);
            }
            if r.stack == Contender::Squarepeg
                && let Some((_, _, rival)) = smoltcp
                    .iter()
                    .find(|(m, d, _)| *m == r.mtu && *d == r.direction)
            {
                r.ratio_to_smoltcp = Some(r.bytes_per_second / rival);
            }
        }
        Report {
            bytes: a.bytes,
            txqueuelen: a.txqueuelen,
            buffer: a.buffer,
            batch: a.batch,
            offload: a.offload,
            contenders: a.contenders.clone(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            rows,
        }
    }

    fn print(&self) {
        println!(
            "{:<34} {:>6} {:>8} {:>6} {:>6} {:>14} {:>14} {:>7} {:>9} {:>8} {:>11}",
            "contender",
            "MTU",
            "Gbit/s",
            "ratio",
            "÷smol",
            "send CPU s/GiB",
            "recv CPU s/GiB",
            "driver",
            "TUN drops",
            "retrans",
            "seg/rd,wr"
        );
        let per_call = |x: Option<f64>| x.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
        for r in &self.rows {
            println!(
                "{:<34} {:>6} {:>8.2} {:>6} {:>6} {:>14.2} {:>14.2} {:>7} {:>9} {:>8} {:>11}",
                r.contender,
                r.mtu,
                r.bytes_per_second * 8.0 / 1e9,
                match (r.stack, r.ratio_to_kernel) {
                    (Contender::Kernel, _) => "1".into(),
                    (_, Some(x)) => format!("{x:.2}×"),
                    (_, None) => "-".into(),
                },
                r.ratio_to_smoltcp
                    .map(|x| format!("{x:.2}×"))
                    .unwrap_or_else(|| "-".into()),
                r.sender_cpu_per_gib,
                r.receiver_cpu_per_gib,
                r.driver_busy
                    .map(|b| format!("{:.0}%", b * 100.0))
                    .unwrap_or_else(|| "-".into()),
                r.tun_queue_drops
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.retransmitted_packets
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "-".into()),
                if r.offload.is_some() {
                    format!(
                        "{},{}",
                        per_call(r.segments_per_read),
                        per_call(r.segments_per_write)
                    )
                } else {
                    "-".into()
                },
            );
        }
        println!(
            "{} bytes per transfer, {} CPUs. squarepeg's CPU includes the kernel's processing \
             of the packets it writes to the TUN device; `driver` is its driver thread's CPU \
             time over the transfer time; `seg/rd,wr` are the segments per read and per write \
             system call of the device; `÷smol` is squarepeg's throughput over smoltcp's in the \
             same direction at the same MTU.",
            self.bytes, self.cpus
        );
    }
}
