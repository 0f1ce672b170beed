//! `peg tcp`: squarepeg's userspace TCP on a TUN device, by hand, so that anyone can talk to
//! it with nc, socat, curl or a script. Servers (`echo`, `sink`, `source`) listen on the
//! stack's addresses; clients (`send`, `recv`) connect to the kernel side. `setup` and
//! `teardown` manage a persistent device for users without root; `--setup` on any verb makes a
//! device for the run and removes it on exit.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use squarepeg_io::{
    AddressPair, Capture, HostSetup, Impairment, LAB_V4, LAB_V6, NetNs, Stack, StackConfig,
    TcpStream, TunConfig, TunDevice,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Args, Debug)]
pub struct TcpArgs {
    #[command(subcommand)]
    verb: TcpVerb,
}

#[derive(Subcommand, Debug)]
enum TcpVerb {
    /// Create a persistent TUN device with its addresses and route (root), e.g. for a user who
    /// then runs the other verbs without root.
    Setup(SetupArgs),
    /// Remove a device made by `setup`.
    Teardown(TeardownArgs),
    /// Server: send every connection's bytes back.
    Echo(ServerArgs),
    /// Server: read each connection to its end; print its byte count and SHA-256.
    Sink(ServerArgs),
    /// Server: send N bytes (seeded pseudo-random) to each connection; print their SHA-256.
    Source(SourceArgs),
    /// Client: send a file (`-` for stdin) to ADDR:PORT; print its SHA-256.
    Send(SendArgs),
    /// Client: receive from ADDR:PORT into a file (`-` for stdout); print its SHA-256.
    Recv(RecvArgs),
}

pub fn run(args: TcpArgs) -> anyhow::Result<()> {
    match args.verb {
        TcpVerb::Setup(a) => setup(a),
        TcpVerb::Teardown(a) => teardown(a),
        TcpVerb::Echo(a) => serve(a, Service::Echo),
        TcpVerb::Sink(a) => serve(a, Service::Sink),
        TcpVerb::Source(a) => {
            let bytes = a.bytes;
            let seed = a.seed;
            serve(a.server, Service::Source { bytes, seed })
        }
        TcpVerb::Send(a) => send(a),
        TcpVerb::Recv(a) => recv(a),
    }
}

// ------------------------------------------------------------------ the stack's options

/// How to find or make the device and run the stack on it.
#[derive(Args, Debug, Clone)]
pub struct StackArgs {
    /// TUN device to use.
    #[arg(long, default_value = "sp0")]
    pub dev: String,
    /// Create the device, the kernel's addresses and the route for this run (root); all of it
    /// disappears on exit. Without it the device must exist (see `peg tcp setup`).
    #[arg(long)]
    pub setup: bool,
    /// The stack's own address behind the device; repeat for IPv4 and IPv6.
    /// [default: 10.77.0.2 and fd00:77::2]
    #[arg(long = "addr", value_name = "IP")]
    pub addrs: Vec<IpAddr>,
    /// With --setup: the kernel's address on the device, as IP/PREFIX; repeat per family.
    /// [default: 10.77.0.1/24 and fd00:77::1/64]
    #[arg(long = "kernel-addr", value_name = "IP/PREFIX", value_parser = parse_prefixed)]
    pub kernel_addrs: Vec<(IpAddr, u8)>,
    /// Device MTU (set with --setup, or checked against an existing device).
    #[arg(long)]
    pub mtu: Option<u16>,
    /// MSS to advertise (default: from the MTU).
    #[arg(long)]
    pub mss: Option<u16>,
    /// Device transmit queue (kernel → squarepeg) in packets; the kernel drops beyond it.
    /// [default with --setup: 4096]
    #[arg(long)]
    pub txqueuelen: Option<u32>,
    /// Open the device in this network namespace (it must exist).
    #[arg(long)]
    pub netns: Option<String>,
    /// Capture the device's packets to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Bytes kept per captured packet.
    #[arg(long, default_value_t = 65535)]
    pub snaplen: u32,
    /// Impair both directions with the lab's link model, e.g. "delay=5ms loss=1%".
    #[arg(long, value_name = "SPEC")]
    pub impair: Option<String>,
    /// Impair only kernel → squarepeg (overrides --impair for that direction).
    #[arg(long, value_name = "SPEC")]
    pub impair_in: Option<String>,
    /// Impair only squarepeg → kernel (overrides --impair for that direction).
    #[arg(long, value_name = "SPEC")]
    pub impair_out: Option<String>,
    /// Seed of the impairments.
    #[arg(long, default_value_t = 1)]
    pub impair_seed: u64,
    /// No progress display.
    #[arg(short, long)]
    pub quiet: bool,
}

fn parse_prefixed(s: &str) -> Result<(IpAddr, u8), String> {
    let (ip, prefix) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: expected IP/PREFIX, e.g. 10.77.0.1/24"))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|e| format!("`{ip}` is not an IP address: {e}"))?;
    let prefix: u8 = prefix
        .parse()
        .map_err(|_| format!("`{prefix}` is not a prefix length"))?;
    Ok((ip, prefix))
}

/// Parses a byte count: a number with an optional binary suffix (K, M, G, T; `KiB` and `KB`
/// mean the same here).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}`: expected a byte count such as 1048576, 64M or 1G"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("`{s}`: unknown unit `{other}` (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

impl StackArgs {
    /// The address pairs: given or the lab defaults.
    fn host_setup(&self) -> anyhow::Result<HostSetup> {
        let stack_addrs = if self.addrs.is_empty() {
            vec![LAB_V4.stack, LAB_V6.stack]
        } else {
            self.addrs.clone()
        };
        let kernel: Vec<(IpAddr, u8)> = if self.kernel_addrs.is_empty() {
            vec![
                (LAB_V4.kernel, LAB_V4.prefix_len),
                (LAB_V6.kernel, LAB_V6.prefix_len),
            ]
        } else {
            self.kernel_addrs.clone()
        };
        let mut pairs = Vec::new();
        for stack in &stack_addrs {
            let Some(&(k, p)) = kernel.iter().find(|(k, _)| k.is_ipv4() == stack.is_ipv4()) else {
                bail!(
                    "bad address {stack}: give the kernel's address of its family too \
                     (--kernel-addr IP/PREFIX)"
                );
            };
            pairs.push(AddressPair {
                kernel: k,
                prefix_len: p,
                stack: *stack,
            });
        }
        let setup = HostSetup {
            device: self.dev.clone(),
            netns: self.netns.clone(),
            pairs,
        };
        setup.validate()?;
        Ok(setup)
    }

    fn impairment(&self) -> anyhow::Result<Option<Impairment>> {
        let parse =
            |s: &Option<String>| -> anyhow::Result<Option<squarepeg_lab::model::LinkConfig>> {
                s.as_deref()
                    .map(|spec| {
                        squarepeg_lab::model::parse_spec(spec)
                            .with_context(|| format!("bad impairment `{spec}`"))
                    })
                    .transpose()
            };
        let both = parse(&self.impair)?;
        let inbound = parse(&self.impair_in)?.or_else(|| both.clone());
        let outbound = parse(&self.impair_out)?.or(both);
        if inbound.is_none() && outbound.is_none() {
            return Ok(None);
        }
        let mut i = Impairment::symmetric(Default::default(), self.impair_seed);
        i.inbound = inbound.unwrap_or_default();
        i.outbound = outbound.unwrap_or_default();
        Ok(Some(i))
    }

    /// Opens (or creates, with --setup) the device and starts the stack.
    pub fn start(&self) -> anyhow::Result<RunningStack> {
        let setup = self.host_setup()?;
        let impairment = self.impairment()?;
        let ns = self.netns.as_deref().map(NetNs::existing).transpose()?;
        let in_ns = |f: &(dyn Fn() -> anyhow::Result<TunDevice> + Sync)| match &ns {
            Some(ns) => ns.run(f)?,
            None => f(),
        };
        squarepeg_io::validate_device_name(&self.dev)?;
        let exists = std::process::Command::new("ip")
            .args(setup.netns.iter().flat_map(|n| ["-n", n.as_str()]))
            .args(["link", "show", "dev", &self.dev])
            .output()
            .is_ok_and(|o| o.status.success());
        if self.setup {
            // SAFETY: geteuid has no preconditions.
            ensure!(
                unsafe { libc::geteuid() } == 0,
                "--setup creates a TUN device and configures addresses: run as root, or have \
                 root create a device for you once (`sudo peg tcp setup --user $USER`)"
            );
            ensure!(
                !exists,
                "device `{}` exists already: run without --setup to use it, or choose another \
                 --dev",
                self.dev
            );
        } else {
            ensure!(
                exists,
                "no device `{}`: create one with `sudo peg tcp setup [--user $USER]`, or pass \
                 --setup to make one for this run (root)",
                self.dev
            );
        }
        let tun = TunConfig {
            name: Some(self.dev.clone()),
            mtu: self.mtu,
            tx_queue_len: self.txqueuelen.or(self.setup.then_some(4096)),
            ..Default::default()
        };
        let device = in_ns(&|| Ok(TunDevice::open(&tun)?))?;
        if self.setup {
            setup.apply()?;
            if !self.quiet {
                for line in setup.command_lines() {
                    eprintln!("set up: {line}");
                }
            }
        } else if self.mtu.is_some_and(|m| m != device.mtu()) {
            bail!(
                "device `{}` has MTU {}, not {}",
                device.name(),
                device.mtu(),
                self.mtu.unwrap_or_default()
            );
        }
        let mut config = StackConfig::new(setup.stack_addresses());
        config.connection.mss = self.mss;
        config.impairment = impairment;
        if let Some(path) = &self.pcap {
            config.capture = Some(Capture::to_file(path, self.snaplen)?);
        }
        let stack = Stack::new(device, config)?;
        Ok(RunningStack {
            stack: Some(stack),
            _ns: ns,
        })
    }
}

/// A running stack (and the namespace handle it was opened in).
pub struct RunningStack {
    pub stack: Option<Stack>,
    _ns: Option<NetNs>,
}

impl RunningStack {
    pub fn stack(&self) -> &Stack {
        self.stack.as_ref().expect("stack running")
    }

    /// Stops the stack, reporting the driver's error if it had one.
    pub async fn finish(&mut self, quiet: bool) -> anyhow::Result<()> {
        if let Some(stack) = self.stack.take() {
            let stats = stack.shutdown().await?;
            if !quiet {
                eprintln!(
                    "stack: {} packets in, {} out, {} dropped by the endpoint, {} resets sent",
                    stats.device.packets_read,
                    stats.device.packets_written,
                    stats.endpoint.dropped_total(),
                    stats.endpoint.resets_sent,
                );
                if let Some(e) = stats.capture_error {
                    eprintln!("capture stopped early: {e}");
                }
            }
        }
        Ok(())
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

// ------------------------------------------------------------------ setup / teardown

#[derive(Args, Debug)]
struct SetupArgs {
    #[command(flatten)]
    stack: StackArgs,
    /// User who may then open the device without root.
    #[arg(long)]
    user: Option<String>,
}

#[derive(Args, Debug)]
struct TeardownArgs {
    /// The device.
    #[arg(long, default_value = "sp0")]
    dev: String,
    /// Its network namespace.
    #[arg(long)]
    netns: Option<String>,
}

fn setup(a: SetupArgs) -> anyhow::Result<()> {
    let setup = a.stack.host_setup()?;
    setup.create_persistent(a.user.as_deref(), a.stack.mtu)?;
    if let Some(q) = a.stack.txqueuelen.or(Some(4096)) {
        let mut c = std::process::Command::new("ip");
        c.args(setup.netns.iter().flat_map(|n| ["-n", n.as_str()]))
            .args([
                "link",
                "set",
                "dev",
                &setup.device,
                "txqueuelen",
                &q.to_string(),
            ]);
        let out = c.output().context("running ip")?;
        ensure!(
            out.status.success(),
            "setting txqueuelen: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    println!("created TUN device {} (persistent)", setup.device);
    for p in &setup.pairs {
        println!(
            "  kernel side {}/{}   squarepeg stack {}",
            p.kernel, p.prefix_len, p.stack
        );
    }
    println!(
        "commands run: ip tuntap add dev {} mode tun{}",
        setup.device,
        a.user.map(|u| format!(" user {u}")).unwrap_or_default()
    );
    for line in setup.command_lines() {
        println!("              {line}");
    }
    println!("remove with: peg tcp teardown --dev {}", setup.device);
    Ok(())
}

fn teardown(a: TeardownArgs) -> anyhow::Result<()> {
    let setup = HostSetup {
        device: a.dev.clone(),
        netns: a.netns,
        pairs: vec![],
    };
    setup.remove_persistent()?;
    println!("removed {}", a.dev);
    Ok(())
}

// ------------------------------------------------------------------ servers

#[derive(Args, Debug)]
struct ServerArgs {
    #[command(flatten)]
    stack: StackArgs,
    /// Port to listen on at every stack address [default: echo 7, sink 9, source 19].
    #[arg(long)]
    port: Option<u16>,
    /// Serve one connection, then exit.
    #[arg(long)]
    once: bool,
}

#[derive(Args, Debug)]
struct SourceArgs {
    /// Bytes to send per connection (K, M, G suffixes).
    #[arg(value_parser = parse_bytes)]
    bytes: u64,
    #[command(flatten)]
    server: ServerArgs,
    /// Seed of the pseudo-random bytes (ChaCha8 keystream).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Clone, Copy, Debug)]
enum Service {
    Echo,
    Sink,
    Source { bytes: u64, seed: u64 },
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix} {bytes} {binary_bytes_per_sec} {elapsed} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

fn serve(a: ServerArgs, service: Service) -> anyhow::Result<()> {
    let port = a.port.unwrap_or(match service {
        Service::Echo => 7,
        Service::Sink => 9,
        Service::Source { .. } => 19,
    });
    let rt = runtime()?;
    let mut running = a.stack.start()?;
    let quiet = a.stack.quiet;
    let result = rt.block_on(async {
        let listener = running.stack().listen_port(port)?;
        let addrs: Vec<String> = listener
            .local_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        eprintln!(
            "{} on {} (device {}); Ctrl-C stops",
            match service {
                Service::Echo => "echo",
                Service::Sink => "sink",
                Service::Source { .. } => "source",
            },
            addrs.join(" and "),
            running.stack().device_name()
        );
        let progress = Arc::new(if quiet {
            MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden())
        } else {
            MultiProgress::new()
        });
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                r = listener.accept() => {
                    let (conn, peer) = r?;
                    let progress = progress.clone();
                    tasks.spawn(async move {
                        let bar = progress.add(ProgressBar::new_spinner());
                        bar.set_style(bar_style());
                        bar.set_prefix(peer.to_string());
                        bar.enable_steady_tick(Duration::from_millis(200));
                        let r = serve_one(conn, service, &bar).await;
                        bar.finish_and_clear();
                        match r {
                            Ok(line) => println!("{peer}: {line}"),
                            Err(e) => eprintln!("{peer}: {e:#}"),
                        }
                    });
                    if a.once {
                        break;
                    }
                }
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("interrupted");
                    break;
                }
            }
        }
        // Let the connections in progress finish (a second Ctrl-C abandons them).
        loop {
            tokio::select! {
                next = tasks.join_next() => if next.is_none() { break },
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        drop(listener);
        anyhow::Ok(())
    });
    rt.block_on(running.finish(quiet))?;
    result
}

async fn serve_one(conn: TcpStream, service: Service, bar: &ProgressBar) -> anyhow::Result<String> {
    let started = Instant::now();
    let line = match service {
        Service::Echo => {
            let (mut r, mut w) = tokio::io::split(conn);
            let mut buf = vec![0u8; 64 << 10];
            let mut total = 0u64;
            loop {
                let n = r.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                w.write_all(&buf[..n]).await?;
                total += n as u64;
                bar.set_position(total);
            }
            w.shutdown().await?;
            let conn = r.unsplit(w);
            conn.wait_closed().await?;
            format!("echoed {total} bytes")
        }
        Service::Sink => {
            let mut conn = conn;
            let (total, digest) = drain(&mut conn, bar).await?;
            conn.shutdown().await?;
            conn.wait_closed().await?;
            format!("received {total} bytes, sha256 {}", hex::encode(digest))
        }
        Service::Source { bytes, seed } => {
            let (mut r, mut w) = tokio::io::split(conn);
            bar.set_length(bytes);
            let sending = async {
                let d = send_pattern(&mut w, bytes, seed, bar).await?;
                w.shutdown().await?;
                anyhow::Ok(d)
            };
            // Read (and count) whatever the client sends, so closing never meets unread data.
            let discard = async {
                let mut buf = vec![0u8; 64 << 10];
                let mut n = 0u64;
                loop {
                    let k = r.read(&mut buf).await?;
                    if k == 0 {
                        return anyhow::Ok(n);
                    }
                    n += k as u64;
                }
            };
            let (digest, got) = tokio::try_join!(sending, discard)?;
            let conn = r.unsplit(w);
            conn.wait_closed().await?;
            let extra = if got > 0 {
                format!(" (and received {got} bytes)")
            } else {
                String::new()
            };
            format!("sent {bytes} bytes, sha256 {}{extra}", hex::encode(digest))
        }
    };
    Ok(format!(
        "{line} in {:.2} s",
        started.elapsed().as_secs_f64()
    ))
}

/// Reads to the end, hashing; returns the count and SHA-256.
use super::copy_hashing;

async fn drain(
    r: &mut (impl AsyncRead + Unpin),
    bar: &ProgressBar,
) -> anyhow::Result<(u64, [u8; 32])> {
    copy_hashing(r, &mut tokio::io::sink(), bar).await
}

/// Sends `bytes` of the seed's ChaCha8 keystream; returns their SHA-256.
async fn send_pattern(
    w: &mut (impl AsyncWrite + Unpin),
    bytes: u64,
    seed: u64,
    bar: &ProgressBar,
) -> anyhow::Result<[u8; 32]> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        hash.update(&buf[..n]);
        w.write_all(&buf[..n]).await?;
        left -= n as u64;
        bar.inc(n as u64);
    }
    Ok(hash.finalize().into())
}

// ------------------------------------------------------------------ clients

#[derive(Args, Debug)]
struct SendArgs {
    /// File to send (`-` for stdin).
    file: PathBuf,
    /// The kernel-side peer, e.g. 10.77.0.1:9000.
    #[arg(long)]
    to: SocketAddr,
    #[command(flatten)]
    stack: StackArgs,
    /// Give up connecting after this many seconds.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
}

#[derive(Args, Debug)]
struct RecvArgs {
    /// File to write (`-` for stdout).
    file: PathBuf,
    /// The kernel-side peer, e.g. 10.77.0.1:9000.
    #[arg(long)]
    from: SocketAddr,
    #[command(flatten)]
    stack: StackArgs,
    /// Give up connecting after this many seconds.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
}

/// Checks a client's target before any device is touched.
fn check_target(stack: &StackArgs, to: SocketAddr) -> anyhow::Result<()> {
    squarepeg_io::check_unicast(to.ip())?;
    let setup = stack.host_setup()?;
    ensure!(
        !setup.stack_addresses().contains(&to.ip()),
        "bad address {to}: that is the stack's own address; connect to the kernel side (e.g. {})",
        setup
            .pairs
            .iter()
            .find(|p| p.kernel.is_ipv4() == to.is_ipv4())
            .map(|p| p.kernel.to_string())
            .unwrap_or_default()
    );
    ensure!(
        setup
            .pairs
            .iter()
            .any(|p| p.stack.is_ipv4() == to.is_ipv4()),
        "bad address {to}: the stack has no {} address (--addr)",
        if to.is_ipv4() { "IPv4" } else { "IPv6" }
    );
    Ok(())
}

async fn connect(
    running: &RunningStack,
    to: SocketAddr,
    timeout: u64,
) -> anyhow::Result<TcpStream> {
    let conn = tokio::time::timeout(Duration::from_secs(timeout), running.stack().connect(to))
        .await
        .with_context(|| {
            format!(
                "connecting to {to}: no answer in {timeout} s (is the route through the \
                 device right? is the peer's firewall open?)"
            )
        })?
        .with_context(|| format!("connecting to {to}"))?;
    Ok(conn)
}

fn send(a: SendArgs) -> anyhow::Result<()> {
    check_target(&a.stack, a.to)?;
    let rt = runtime()?;
    let (mut input, len): (Box<dyn AsyncRead + Unpin + Send>, Option<u64>) =
        if a.file.as_os_str() == "-" {
            (Box::new(tokio::io::stdin()), None)
        } else {
            let f = std::fs::File::open(&a.file)
                .with_context(|| format!("opening {}", a.file.display()))?;
            let len = f.metadata().ok().map(|m| m.len());
            (Box::new(tokio::fs::File::from_std(f)), len)
        };
    let mut running = a.stack.start()?;
    let quiet = a.stack.quiet;
    let result = rt.block_on(async {
        let conn = connect(&running, a.to, a.connect_timeout).await?;
        let bar = progress_bar(quiet, len, "sending");
        let started = Instant::now();
        let (mut r, mut w) = tokio::io::split(conn);
        let sending = async {
            let sent = copy_hashing(&mut input, &mut w, &bar).await?;
            w.shutdown().await?;
            anyhow::Ok(sent)
        };
        let hidden = ProgressBar::hidden();
        let (sent, back) = tokio::try_join!(sending, drain(&mut r, &hidden))?;
        let conn = r.unsplit(w);
        conn.wait_closed().await?;
        bar.finish_and_clear();
        let secs = started.elapsed().as_secs_f64();
        println!(
            "sent {} bytes to {} in {secs:.2} s ({}), sha256 {}",
            sent.0,
            a.to,
            rate(sent.0, secs),
            hex::encode(sent.1)
        );
        if back.0 > 0 {
            println!(
                "received back {} bytes, sha256 {}",
                back.0,
                hex::encode(back.1)
            );
        }
        anyhow::Ok(())
    });
    rt.block_on(running.finish(quiet))?;
    result
}

fn recv(a: RecvArgs) -> anyhow::Result<()> {
    check_target(&a.stack, a.from)?;
    let rt = runtime()?;
    let mut output: Box<dyn AsyncWrite + Unpin + Send> = if a.file.as_os_str() == "-" {
        Box::new(tokio::io::stdout())
    } else {
        Box::new(tokio::fs::File::from_std(
            std::fs::File::create(&a.file)
                .with_context(|| format!("creating {}", a.file.display()))?,
        ))
    };
    let mut running = a.stack.start()?;
    let quiet = a.stack.quiet;
    let result = rt.block_on(async {
        let mut conn = connect(&running, a.from, a.connect_timeout).await?;
        let bar = progress_bar(quiet, None, "receiving");
        let started = Instant::now();
        let (total, digest) = copy_hashing(&mut conn, &mut output, &bar).await?;
        output.flush().await?;
        // FIN only after the peer's: some senders stop at the first end of stream they see.
        conn.shutdown().await?;
        conn.wait_closed().await?;
        bar.finish_and_clear();
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "received {total} bytes from {} in {secs:.2} s ({})",
            a.from,
            rate(total, secs)
        );
        // The digest on stdout unless the data went there.
        if a.file.as_os_str() == "-" {
            eprintln!("sha256 {}", hex::encode(digest));
        } else {
            println!("received {total} bytes, sha256 {}", hex::encode(digest));
        }
        anyhow::Ok(())
    });
    rt.block_on(running.finish(quiet))?;
    result
}

fn progress_bar(quiet: bool, len: Option<u64>, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(l) => ProgressBar::new(l).with_style(
            ProgressStyle::with_template(
                "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner().with_style(bar_style()),
    };
    bar.set_prefix(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// A human rate in bytes per second.
pub fn rate(bytes: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    let bps = bytes as f64 / secs;
    if bps >= 1e9 {
        format!("{:.2} GB/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.1} MB/s", bps / 1e6)
    } else {
        format!("{:.1} kB/s", bps / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("2k"), Ok(2048));
        assert!(parse_bytes("1.5M").is_err());
        assert!(parse_bytes("5X").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }

    #[test]
    fn prefixed_addresses() {
        assert_eq!(
            parse_prefixed("10.1.0.1/24"),
            Ok(("10.1.0.1".parse().unwrap(), 24))
        );
        assert!(parse_prefixed("10.1.0.1").is_err());
        assert!(parse_prefixed("10.1.0/24").is_err());
    }
}
