//! Short transfers (issue 13 item 5): McTiny's appendix-A example on the real lab — a client
//! connects, sends a 1-byte request, and the server answers with 1 MB over a 100 Mbit/s path
//! with a 117 ms RTT. McTiny measured about 1.07 s (some 9 RTT) on Linux: the transfer is
//! bound by slow start from an initial window of ten segments, not by the path.
//!
//! Each contender runs the transfer twice on one lab, from the same client host to the same
//! server: *cold* (the first connection) and *returning* (a second connection 1 s after the
//! first one closed):
//!
//! | contender | server (sender) |
//! |---|---|
//! | `kernel-cubic`, `kernel-bbr` | Linux TCP with that congestion control (`TCP_CONGESTION` on the listening socket). The cold run starts from an empty `tcp_metrics` cache (flushed); the returning one may use what Linux cached (`tcp_no_metrics_save` = 0): RTT and ssthresh, no window |
//! | `utcp` | squarepeg's userspace TCP (`squarepeg-io` on TUN at both ends, `LabStack`) with Careful Resume on (`ConnectionConfig::careful_resume`): the returning connection starts from the path state the server's endpoint kept for the client's address (RFC 9040, RFC 9959) |
//! | `utcp-plain` | the same without Careful Resume (the returning run is a second cold one) |
//!
//! Measured at the client: connect() to the last byte, and the request's write to the last
//! byte, in ms and in RTTs. From the emulator's captures (server- and client-facing
//! interfaces): each data segment's sequence number against time at the sender and at the
//! receiver (McTiny's figure), written as SVG and PNG, and everything as JSON
//! (`squarepeg.transfer/1`).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{Value, json};
use squarepeg_io::StackConfig;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_lab::net::{CaptureSide, Lab, LabConfig, Role, capture_path};
use squarepeg_lab::pcap::read_pcap;
use squarepeg_lab::stack::{LabStack, stack_addresses};
use squarepeg_tcp::{ConnectionConfig, ConnectionStats, ResumeStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::voip::VoipError;
use crate::voip::plot::{FONT, PALETTE, draw_legend, ensure_font, plot_err, write_svg_and_png};

/// The server's port on every contender.
pub const PORT: u16 = 8013;
/// The pause between the cold connection's end and the returning one.
const BETWEEN: Duration = Duration::from_secs(1);
/// The phases of a run (see [`TransferConfig::plan`]).
pub const COLD: &str = "cold";
/// See [`COLD`].
pub const WARM_UP: &str = "warm-up";
/// See [`COLD`].
pub const RETURNING: &str = "returning";
/// The most any one transfer may take before the run is given up.
const TRANSFER_LIMIT: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// Bytes the server sends per transfer.
    pub size: u64,
    /// The path's rate, each direction (bit/s).
    pub rate: u64,
    /// The path's round-trip time (half each way).
    pub rtt: Duration,
    /// The bottleneck queue in bytes; `None`: one bandwidth-delay product.
    pub queue: Option<u64>,
    /// Runs per contender (each on a lab of its own, seeds `seed`, `seed + 1`, …).
    pub runs: u32,
    /// Seed of the emulator.
    pub seed: u64,
    /// TCP Fast Open (RFC 7413) on every contender: the client's 1-byte request rides on the
    /// SYN once the client holds the server's cookie (the returning transfer), and the
    /// server's answer starts in SYN-RECEIVED, right behind the SYN-ACK (Linux, and the
    /// userspace TCP).
    pub fast_open: bool,
    /// A transfer of this many bytes between the cold and the returning ones (`None`: none).
    /// The returning connection starts from what the connection before it measured: after a
    /// 1 MB cold transfer that is at most the last slow-start round (about half a BDP at
    /// McTiny's numbers), after a long one the path's whole capacity.
    pub warm_up: Option<u64>,
}

impl Default for TransferConfig {
    /// McTiny appendix A: 1 MB, 100 Mbit/s, 117 ms.
    fn default() -> Self {
        TransferConfig {
            size: 1 << 20,
            rate: 100_000_000,
            rtt: Duration::from_millis(117),
            queue: None,
            runs: 1,
            seed: 1,
            fast_open: false,
            warm_up: None,
        }
    }
}

impl TransferConfig {
    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), VoipError> {
        for (what, size) in [("size", Some(self.size)), ("warm-up", self.warm_up)] {
            match size {
                Some(n) if n == 0 || n > 1 << 30 => {
                    return Err(VoipError::Config(format!(
                        "{what} {n} bytes: between 1 byte and 1 GiB"
                    )));
                }
                _ => {}
            }
        }
        if self.rate < 100_000 {
            return Err(VoipError::Config("rate below 100 kbit/s".into()));
        }
        if self.rtt < Duration::from_millis(1) || self.rtt > Duration::from_secs(2) {
            return Err(VoipError::Config(format!(
                "RTT {:?}: between 1 ms and 2 s",
                self.rtt
            )));
        }
        if self.runs == 0 || self.runs > 20 {
            return Err(VoipError::Config("runs: 1 to 20".into()));
        }
        Ok(())
    }

    /// The transfers of one run, in order: the phase's name and the bytes the server sends.
    pub fn plan(&self) -> Vec<(&'static str, u64)> {
        let mut plan = vec![(COLD, self.size)];
        plan.extend(self.warm_up.map(|n| (WARM_UP, n)));
        plan.push((RETURNING, self.size));
        plan
    }

    /// The bottleneck queue in bytes (one BDP unless set), at least 64 kB.
    pub fn queue_bytes(&self) -> u64 {
        self.queue.unwrap_or_else(|| {
            ((self.rate as f64 / 8.0 * self.rtt.as_secs_f64()) as u64).max(64 << 10)
        })
    }

    /// The lab's path: half the RTT each way, the rate and queue each way.
    pub fn bottleneck(&self) -> Bottleneck {
        Bottleneck::symmetric(
            LinkConfig::new()
                .with_delay(self.rtt / 2)
                .with_rate(self.rate)
                .with_queue(Some(self.queue_bytes()), None),
        )
    }
}

/// A contender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Substrate {
    /// Linux TCP, CUBIC.
    KernelCubic,
    /// Linux TCP, BBR.
    KernelBbr,
    /// squarepeg's userspace TCP with Careful Resume.
    Utcp,
    /// squarepeg's userspace TCP without it.
    UtcpPlain,
}

impl Substrate {
    /// Every contender.
    pub const ALL: [Substrate; 4] = [
        Substrate::KernelCubic,
        Substrate::KernelBbr,
        Substrate::Utcp,
        Substrate::UtcpPlain,
    ];
    /// The default set.
    pub const DEFAULT: [Substrate; 3] = [
        Substrate::KernelCubic,
        Substrate::KernelBbr,
        Substrate::Utcp,
    ];

    /// The name on the command line and in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Substrate::KernelCubic => "kernel-cubic",
            Substrate::KernelBbr => "kernel-bbr",
            Substrate::Utcp => "utcp",
            Substrate::UtcpPlain => "utcp-plain",
        }
    }

    /// By name.
    pub fn by_name(name: &str) -> Result<Substrate, VoipError> {
        Substrate::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| VoipError::UnknownTransport {
                name: name.to_owned(),
                known: Substrate::ALL.map(Substrate::name).join(", "),
            })
    }

    fn kernel_congestion(self) -> Option<&'static str> {
        match self {
            Substrate::KernelCubic => Some("cubic"),
            Substrate::KernelBbr => Some("bbr"),
            _ => None,
        }
    }
}

/// One transfer as the client saw it, and on the wire.
#[derive(Debug, Clone)]
pub struct Transfer {
    /// [`COLD`], [`WARM_UP`] or [`RETURNING`].
    pub phase: &'static str,
    /// Bytes received.
    pub bytes: u64,
    /// From connect() to: the connection established, the request written, the last byte.
    pub established: Duration,
    /// When the request was written.
    pub request: Duration,
    /// When the last byte arrived.
    pub last_byte: Duration,
    /// The server connection's statistics when it had written everything (userspace TCP).
    pub server_stats: Option<ConnectionStats>,
    /// The client's port (to find the connection in the captures).
    pub client_port: u16,
    /// From the captures: (time since the client's SYN at the client side, end sequence
    /// number relative to the server's ISN) for each data segment, at the sender and at the
    /// receiver.
    pub sender: Vec<(Duration, u64)>,
    /// See `sender`.
    pub receiver: Vec<(Duration, u64)>,
    /// From the capture: the client's SYN to the last data byte at the client's side.
    pub wire_last_byte: Option<Duration>,
}

impl Transfer {
    /// A transfer as the client measured it; the server's statistics and the series from the
    /// captures are filled in later.
    fn measured(
        phase: &'static str,
        bytes: u64,
        (established, request, last_byte): (Duration, Duration, Duration),
        client_port: u16,
    ) -> Transfer {
        Transfer {
            phase,
            bytes,
            established,
            request,
            last_byte,
            server_stats: None,
            client_port,
            sender: Vec::new(),
            receiver: Vec::new(),
            wire_last_byte: None,
        }
    }

    /// `d` in RTTs of `rtt`.
    pub fn rtts(d: Duration, rtt: Duration) -> f64 {
        d.as_secs_f64() / rtt.as_secs_f64()
    }

    /// Data segments the server sent more than once (from the sender-side capture).
    pub fn retransmissions(&self) -> usize {
        let mut highest = 0;
        let mut again = 0;
        for &(_, end) in &self.sender {
            if end <= highest {
                again += 1;
            }
            highest = highest.max(end);
        }
        again
    }
}

/// One contender's run: a cold and a returning transfer on one lab.
#[derive(Debug, Clone)]
pub struct TransferRun {
    /// The contender.
    pub substrate: Substrate,
    /// The emulator's seed.
    pub seed: u64,
    /// Cold, the warm-up if any, returning.
    pub transfers: Vec<Transfer>,
    /// What went wrong without failing the run.
    pub warnings: Vec<String>,
}

/// Lab runs get distinct names within a process.
static LABS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Runs `substrate` once on a lab of its own (needs root): the cold transfer, then the
/// returning one. Captures go to `captures` (a directory per run); `progress` hears what
/// is going on.
pub fn run_lab(
    config: &TransferConfig,
    substrate: Substrate,
    seed: u64,
    captures: &Path,
    progress: &dyn Fn(&str),
) -> Result<TransferRun, VoipError> {
    config.validate()?;
    std::fs::create_dir_all(captures)
        .map_err(VoipError::io(format!("creating {}", captures.display())))?;
    let index = LABS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let lab = Lab::start(
        LabConfig::new(&format!("xfer{index}"))
            .with_bottleneck(config.bottleneck())
            .with_seed(seed)
            .with_capture_dir(captures),
    )?;
    let outcome = match substrate.kernel_congestion() {
        Some(cc) => kernel_transfers(&lab, config, cc, progress),
        None => utcp_transfers(&lab, config, substrate == Substrate::Utcp, progress),
    };
    let flushed = lab.flush_captures();
    let stats = lab.teardown();
    let (mut transfers, (server_addr, client_addr)) = outcome?;
    flushed?;
    stats?;
    let mut warnings = Vec::new();
    if let Err(e) = read_captures(captures, server_addr, client_addr, &mut transfers) {
        warnings.push(format!("captures: {e}"));
    }
    Ok(TransferRun {
        substrate,
        seed,
        transfers,
        warnings,
    })
}

type Outcome = (Vec<Transfer>, (IpAddr, IpAddr));

/// Sets an integer TCP-level socket option.
fn set_tcp_int(
    s: &socket2::Socket,
    option: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor, and a pointer to an int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The kernel contenders: a plain socket server in the server namespace, a plain client in
/// the client namespace.
fn kernel_transfers(
    lab: &Lab,
    config: &TransferConfig,
    congestion: &'static str,
    progress: &dyn Fn(&str),
) -> Result<Outcome, VoipError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let server_ip = lab.addresses().server(false);
    let client_ip = lab.addresses().client(false);
    let server_addr = SocketAddr::new(server_ip, PORT);
    // Linux keeps RTT and ssthresh per destination (tcp_metrics): start the cold run from an
    // empty cache and let it save what it learns, so that the returning run shows what the
    // kernel does with it.
    for ns in [lab.client(), lab.server()] {
        crate::write_sysctl(ns, "/proc/sys/net/ipv4/tcp_no_metrics_save", "0")?;
        if config.fast_open {
            crate::write_sysctl(ns, "/proc/sys/net/ipv4/tcp_fastopen", "3")?;
        }
        ns.ip(&["tcp_metrics", "flush", "all"])?;
    }
    let fast_open = config.fast_open;
    let listener = lab
        .server()
        .run(|| -> std::io::Result<std::net::TcpListener> {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            s.set_reuse_address(true)?;
            // Accepted sockets inherit the listener's congestion control.
            s.set_tcp_congestion(congestion.as_bytes())?;
            s.bind(&server_addr.into())?;
            s.listen(16)?;
            if fast_open {
                set_tcp_int(&s, libc::TCP_FASTOPEN, 16)?;
            }
            Ok(s.into())
        })?;
    let listener = listener.map_err(VoipError::io(format!(
        "listening on {server_addr} with {congestion}"
    )))?;
    let plan = config.plan();
    let sizes: Vec<u64> = plan.iter().map(|&(_, n)| n).collect();
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let payload = vec![0x5au8; 1 << 16];
        for size in sizes {
            let (mut s, _) = listener.accept()?;
            s.set_nodelay(true)?;
            let mut request = [0u8; 1];
            s.read_exact(&mut request)?;
            let mut left = size;
            while left > 0 {
                let n = left.min(payload.len() as u64) as usize;
                s.write_all(&payload[..n])?;
                left -= n as u64;
            }
            s.shutdown(std::net::Shutdown::Write)?;
            let mut sink = [0u8; 64];
            while s.read(&mut sink)? > 0 {}
        }
        Ok(())
    });
    let mut transfers = Vec::new();
    for &(phase, _) in &plan {
        progress(&format!("{phase} transfer"));
        let socket = lab.client().run(|| -> std::io::Result<Socket> {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            s.set_tcp_congestion(congestion.as_bytes())?;
            s.set_tcp_nodelay(true)?;
            s.set_read_timeout(Some(TRANSFER_LIMIT))?;
            if fast_open {
                // connect() returns at once; the request's write sends the SYN (with the
                // request when a cookie is cached).
                set_tcp_int(&s, libc::TCP_FASTOPEN_CONNECT, 1)?;
            }
            Ok(s)
        })?;
        let socket = socket.map_err(VoipError::io("client socket"))?;
        let t0 = Instant::now();
        socket
            .connect(&server_addr.into())
            .map_err(VoipError::io(format!("connecting to {server_addr}")))?;
        let established = t0.elapsed();
        let client_port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or(0, |a| a.port());
        let mut stream: std::net::TcpStream = socket.into();
        stream
            .write_all(b"?")
            .map_err(VoipError::io("writing the request"))?;
        let request = t0.elapsed();
        let mut buf = vec![0u8; 1 << 16];
        let mut bytes = 0u64;
        let mut last_byte = request;
        loop {
            let n = stream
                .read(&mut buf)
                .map_err(VoipError::io("reading the answer"))?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
            last_byte = t0.elapsed();
        }
        drop(stream);
        transfers.push(Transfer::measured(
            phase,
            bytes,
            (established, request, last_byte),
            client_port,
        ));
        std::thread::sleep(BETWEEN);
    }
    server
        .join()
        .map_err(|_| VoipError::Transport("the server thread panicked".into()))?
        .map_err(VoipError::io("serving"))?;
    Ok((transfers, (server_ip, client_ip)))
}

/// The userspace-TCP contenders: a `squarepeg-io` stack on TUN at each end (`LabStack`).
fn utcp_transfers(
    lab: &Lab,
    config: &TransferConfig,
    resume: bool,
    progress: &dyn Fn(&str),
) -> Result<Outcome, VoipError> {
    let attach = |role: Role, tcp: ConnectionConfig| {
        let mut c = StackConfig::new([]);
        c.connection = tcp;
        LabStack::attach(lab, role, c, None)
            .map_err(|e| VoipError::Transport(format!("userspace TCP on the {role:?} end: {e}")))
    };
    let mut server_tcp = ConnectionConfig::default();
    server_tcp.careful_resume = resume;
    server_tcp.fast_open = config.fast_open;
    let server = attach(Role::Server, server_tcp)?;
    let client = attach(Role::Client, ConnectionConfig::default())?;
    let fast_open = config.fast_open;
    let (server_v4, _) = stack_addresses(lab, Role::Server)
        .ok_or_else(|| VoipError::Transport("no stack address on the server end".into()))?;
    let (client_v4, _) = stack_addresses(lab, Role::Client)
        .ok_or_else(|| VoipError::Transport("no stack address on the client end".into()))?;
    let server_addr = SocketAddr::new(IpAddr::V4(server_v4), PORT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(VoipError::io("building a runtime"))?;
    let plan = config.plan();
    let sizes: Vec<u64> = plan.iter().map(|&(_, n)| n).collect();
    let transfers = runtime.block_on(async {
        let listener = server
            .stack()
            .listen(server_addr)
            .map_err(VoipError::io(format!("listening on {server_addr}")))?;
        let serve = async move {
            let mut stats = Vec::new();
            let payload = vec![0x5au8; 1 << 16];
            for size in sizes {
                let (mut s, _) = listener.accept().await?;
                let mut request = [0u8; 1];
                s.read_exact(&mut request).await?;
                let mut left = size;
                while left > 0 {
                    let n = left.min(payload.len() as u64) as usize;
                    s.write_all(&payload[..n]).await?;
                    left -= n as u64;
                }
                s.shutdown().await?;
                let mut sink = [0u8; 64];
                while s.read(&mut sink).await? > 0 {}
                // Everything is acknowledged: what Careful Resume did is complete.
                stats.push(s.stats().ok());
            }
            Ok::<_, std::io::Error>(stats)
        };
        let server_task = tokio::spawn(serve);
        let mut transfers = Vec::new();
        for &(phase, _) in &plan {
            progress(&format!("{phase} transfer"));
            let t0 = Instant::now();
            let connecting = async {
                if fast_open {
                    // The request goes with the connect (on the SYN once a cookie is
                    // cached).
                    client
                        .stack()
                        .connect_fast_open(server_addr, client.stack().connection_config(), b"?")
                        .await
                } else {
                    client.stack().connect(server_addr).await
                }
            };
            let mut s = tokio::time::timeout(TRANSFER_LIMIT, connecting)
                .await
                .map_err(|_| VoipError::Transport(format!("connecting to {server_addr}: timeout")))?
                .map_err(VoipError::io(format!("connecting to {server_addr}")))?;
            let established = t0.elapsed();
            let client_port = s.local_addr().port();
            let request = if fast_open {
                Duration::ZERO
            } else {
                s.write_all(b"?")
                    .await
                    .map_err(VoipError::io("writing the request"))?;
                t0.elapsed()
            };
            let mut buf = vec![0u8; 1 << 16];
            let mut bytes = 0u64;
            let mut last_byte = request;
            let reading = async {
                loop {
                    let n = s.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    bytes += n as u64;
                    last_byte = t0.elapsed();
                }
                Ok::<_, std::io::Error>(())
            };
            tokio::time::timeout(TRANSFER_LIMIT, reading)
                .await
                .map_err(|_| VoipError::Transport(format!("{phase} transfer: timeout")))?
                .map_err(VoipError::io("reading the answer"))?;
            s.shutdown()
                .await
                .map_err(VoipError::io("closing the client"))?;
            drop(s);
            transfers.push(Transfer::measured(
                phase,
                bytes,
                (established, request, last_byte),
                client_port,
            ));
            tokio::time::sleep(BETWEEN).await;
        }
        let stats = tokio::time::timeout(TRANSFER_LIMIT, server_task)
            .await
            .map_err(|_| VoipError::Transport("the server did not finish".into()))?
            .map_err(|e| VoipError::Transport(format!("the server task: {e}")))?
            .map_err(VoipError::io("serving"))?;
        for (t, s) in transfers.iter_mut().zip(stats) {
            t.server_stats = s;
        }
        Ok::<_, VoipError>(transfers)
    })?;
    drop(runtime);
    drop(client);
    drop(server);
    Ok((transfers, (IpAddr::V4(server_v4), IpAddr::V4(client_v4))))
}

/// Fills each transfer's sequence-against-time series from the emulator's captures.
fn read_captures(
    dir: &Path,
    server: IpAddr,
    client: IpAddr,
    transfers: &mut [Transfer],
) -> Result<(), VoipError> {
    let read = |side| -> Result<Vec<(Duration, Vec<u8>)>, VoipError> {
        let path = capture_path(dir, side);
        let bytes =
            std::fs::read(&path).map_err(VoipError::io(format!("reading {}", path.display())))?;
        let file = read_pcap(&bytes)
            .map_err(|e| VoipError::Wire(format!("capture {}: {e}", path.display())))?;
        Ok(file
            .records
            .into_iter()
            .map(|r| (r.timestamp, r.data))
            .collect())
    };
    let at_client = read(CaptureSide::Client)?;
    let at_server = read(CaptureSide::Server)?;
    for t in transfers.iter_mut() {
        let from_server = |seg: &squarepeg_tcp::wire::Segment<'_>| {
            seg.src == SocketAddr::new(server, PORT)
                && seg.dst == SocketAddr::new(client, t.client_port)
        };
        let mut syn_at = None;
        let mut isn = None;
        for (ts, p) in at_client.iter().chain(at_server.iter()) {
            let Ok(seg) = squarepeg_tcp::wire::parse_packet(p, false) else {
                continue;
            };
            if seg.flags.syn()
                && !seg.flags.ack()
                && seg.src == SocketAddr::new(client, t.client_port)
            {
                syn_at = Some(syn_at.map_or(*ts, |s: Duration| s.min(*ts)));
            }
            if seg.flags.syn() && seg.flags.ack() && from_server(&seg) {
                isn = Some(seg.seq);
            }
        }
        let (Some(syn_at), Some(isn)) = (syn_at, isn) else {
            return Err(VoipError::Wire(format!(
                "no handshake of client port {} in the captures",
                t.client_port
            )));
        };
        let series = |records: &[(Duration, Vec<u8>)]| -> Vec<(Duration, u64)> {
            records
                .iter()
                .filter_map(|(ts, p)| {
                    let seg = squarepeg_tcp::wire::parse_packet(p, false).ok()?;
                    if !from_server(&seg) || seg.payload.is_empty() {
                        return None;
                    }
                    let end =
                        seg.seq.wrapping_sub(isn).wrapping_sub(1) as u64 + seg.payload.len() as u64;
                    Some((ts.saturating_sub(syn_at), end))
                })
                .collect()
        };
        t.sender = series(&at_server);
        t.receiver = series(&at_client);
        t.wire_last_byte = t
            .receiver
            .iter()
            .filter(|&&(_, end)| end >= t.bytes)
            .map(|&(ts, _)| ts)
            .next();
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn resume_json(r: &ResumeStats) -> Value {
    json!({
        "phase": format!("{:?}", r.phase),
        "saved_cwnd": r.saved_cwnd,
        "saved_rtt_ms": r.saved_rtt.map(ms),
        "reconnaissance": r.reconnaissance,
        "unvalidated": r.unvalidated,
        "validating": r.validating,
        "safe_retreats": r.safe_retreats,
        "not_confirmed": r.not_confirmed,
        "jump_cwnd": r.jump_cwnd,
        "pipe_size": r.pipe_size,
    })
}

/// The JSON of a set of runs (schema `squarepeg.transfer/1`).
pub fn transfer_json(config: &TransferConfig, runs: &[TransferRun]) -> Value {
    let rtt = config.rtt;
    json!({
        "schema": "squarepeg.transfer/1",
        "path": {
            "size_bytes": config.size,
            "rate_bps": config.rate,
            "rtt_ms": ms(rtt),
            "queue_bytes": config.queue_bytes(),
        },
        "warm_up_bytes": config.warm_up,
        "fast_open": config.fast_open,
        "runs": runs.iter().map(|r| json!({
            "substrate": r.substrate.name(),
            "seed": r.seed,
            "warnings": r.warnings,
            "transfers": r.transfers.iter().map(|t| json!({
                "phase": t.phase,
                "bytes": t.bytes,
                "established_ms": ms(t.established),
                "request_ms": ms(t.request),
                "last_byte_ms": ms(t.last_byte),
                "rtts": Transfer::rtts(t.last_byte, rtt),
                "rtts_from_request": Transfer::rtts(t.last_byte.saturating_sub(t.request), rtt),
                "wire_last_byte_ms": t.wire_last_byte.map(ms),
                "wire_rtts": t.wire_last_byte.map(|d| Transfer::rtts(d, rtt)),
                "data_segments": t.sender.len(),
                "retransmissions": t.retransmissions(),
                "server": t.server_stats.as_ref().map(|s| json!({
                    "packets_sent": s.packets_sent,
                    "packets_retransmitted": s.packets_retransmitted,
                    "min_rtt_ms": s.min_rtt.map(ms),
                    "cwnd": s.cwnd,
                    "resume": resume_json(&s.resume),
                })),
                "sender": t.sender.iter().map(|&(ts, end)| json!([ms(ts), end])).collect::<Vec<_>>(),
                "receiver": t.receiver.iter().map(|&(ts, end)| json!([ms(ts), end])).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// A table: per run and transfer, the times in ms and RTTs.
pub fn transfer_table(config: &TransferConfig, runs: &[TransferRun]) -> String {
    let rtt = config.rtt;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<13} {:>4} {:<10} {:>10} {:>8} {:>12} {:>9} {:>8}  careful resume",
        "substrate", "seed", "transfer", "total ms", "RTTs", "from request", "wire RTT", "rexmits"
    );
    for r in runs {
        for t in &r.transfers {
            let resume = t.server_stats.as_ref().map_or_else(String::new, |s| {
                let c = s.resume;
                if c.reconnaissance == 0 {
                    "-".to_owned()
                } else {
                    format!(
                        "jump {} kB, retreats {}, not confirmed {}",
                        c.jump_cwnd / 1000,
                        c.safe_retreats,
                        c.not_confirmed
                    )
                }
            });
            let _ = writeln!(
                out,
                "{:<13} {:>4} {:<10} {:>10.1} {:>8.2} {:>12.2} {:>9} {:>8}  {resume}",
                r.substrate.name(),
                r.seed,
                t.phase,
                ms(t.last_byte),
                Transfer::rtts(t.last_byte, rtt),
                Transfer::rtts(t.last_byte.saturating_sub(t.request), rtt),
                t.wire_last_byte.map_or_else(
                    || "-".to_owned(),
                    |d| format!("{:.2}", Transfer::rtts(d, rtt))
                ),
                t.retransmissions(),
            );
        }
    }
    out
}

struct SequenceChart<'a> {
    title: String,
    rtt: Duration,
    run: &'a TransferRun,
}

impl SequenceChart<'_> {
    /// The cold and returning transfers (a warm-up's megabytes would squash them).
    fn plotted(&self) -> impl Iterator<Item = &Transfer> {
        self.run.transfers.iter().filter(|t| t.phase != WARM_UP)
    }
}

impl crate::voip::plot::Chart for SequenceChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        root.fill(&WHITE).map_err(plot_err)?;
        let mut x_end: f64 = 100.0;
        let mut y_end: f64 = 1.0;
        for t in self.plotted() {
            for &(ts, end) in t.sender.iter().chain(&t.receiver) {
                x_end = x_end.max(ms(ts));
                y_end = y_end.max(end as f64 / 1000.0);
            }
        }
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_end * 1.03, 0.0..y_end * 1.05)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("time since the client's SYN (ms)")
            .y_desc("sequence number (kB)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        // A faint line every RTT.
        let rtt = ms(self.rtt);
        let mut k = 1.0;
        while k * rtt < x_end * 1.03 {
            chart
                .draw_series(LineSeries::new(
                    [(k * rtt, 0.0), (k * rtt, y_end * 1.05)],
                    BLACK.mix(0.12),
                ))
                .map_err(plot_err)?;
            k += 1.0;
        }
        // Returning transfers as rings over the cold ones' dots, so that identical runs (the
        // kernel's) show both.
        for (i, t) in self.plotted().enumerate() {
            for (j, (points, end)) in [(&t.sender, "sender"), (&t.receiver, "receiver")]
                .into_iter()
                .enumerate()
            {
                let colour = PALETTE[(2 * i + j) % PALETTE.len()];
                let label = format!("{} at the {end}", t.phase);
                let style = if i == 0 {
                    colour.filled()
                } else {
                    colour.stroke_width(1)
                };
                let radius = if i == 0 { 2 } else { 4 };
                chart
                    .draw_series(
                        points.iter().map(|&(ts, e)| {
                            Circle::new((ms(ts), e as f64 / 1000.0), radius, style)
                        }),
                    )
                    .map_err(plot_err)?
                    .label(label)
                    .legend(move |(x, y)| Circle::new((x + 10, y), radius, style));
            }
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        Ok(())
    }
}

/// Writes `transfer-<substrate>.{svg,png}` for the first run of each contender: sequence
/// number against time at the sender and the receiver, cold and returning (McTiny's
/// figure); returns the files.
pub fn plot(
    dir: &Path,
    config: &TransferConfig,
    runs: &[TransferRun],
) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(VoipError::io(format!("creating {}", dir.display())))?;
    let mut files = Vec::new();
    let mut seen = Vec::new();
    for run in runs {
        if seen.contains(&run.substrate) || run.transfers.iter().all(|t| t.sender.is_empty()) {
            continue;
        }
        seen.push(run.substrate);
        let totals: Vec<String> = run
            .transfers
            .iter()
            .filter(|t| t.phase != WARM_UP)
            .map(|t| {
                format!(
                    "{} {:.0} ms = {:.1} RTT",
                    t.phase,
                    ms(t.last_byte),
                    Transfer::rtts(t.last_byte, config.rtt)
                )
            })
            .collect();
        let chart = SequenceChart {
            title: format!(
                "{}: {} kB at {} Mbit/s, RTT {} ms ({})",
                run.substrate.name(),
                config.size / 1000,
                config.rate / 1_000_000,
                ms(config.rtt),
                totals.join(", ")
            ),
            rtt: config.rtt,
            run,
        };
        files.extend(write_svg_and_png(
            &dir.join(format!("transfer-{}", run.substrate.name())),
            &chart,
        )?);
    }
    Ok(files)
}
