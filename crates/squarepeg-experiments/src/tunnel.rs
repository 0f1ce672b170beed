//! Minion §8.4 on the real lab: voice and bulk TCP through an IP tunnel over TCP
//! (`peg lab tunnel`, issue 15).
//!
//! People whose network blocks UDP fall back to a VPN over TCP, and TCP inside TCP hurts:
//! every loss on the outer connection stalls every tunneled flow, the inner TCPs see delay
//! spikes instead of losses, and voice breaks up. `peg tunnel` carries each IP packet as one
//! squarepeg message: unordered over the userspace TCP, with the tunneled flows' pure ACKs
//! and small packets ahead of bulk (Minion's priACKs). This experiment measures what that
//! buys, with the kernel's own applications inside the tunnel.
//!
//! # One cell
//!
//! Each (variant, number of competing uploads) cell runs on a fresh lab
//! (`squarepeg_lab::net::Lab`: client, emulator and server namespaces, the userspace link
//! emulator with the path's delay, rate and random loss). Through the variant's path, at the
//! same time:
//!
//! - a voice call server → client: the VoIP experiment's generator and receiver
//!   ([`crate::voip::lab`], kernel UDP sockets bound to the tunnel's addresses):
//!   [`VoipConfig::message_bytes`] = 160 bytes every 20 ms (64 kbit/s), played out
//!   [`Scenario::playout_offset`] after sending (the path's one-way delay plus the playout
//!   delay); a message that arrives after its playout time or never is a late loss
//!   ([`crate::voip::analysis`]);
//! - one `iperf3` download (server → client, `iperf3 -R`) and 0–3 competing `iperf3`
//!   uploads (client → server), each its own TCP connection, from before the first voice
//!   message to its last; goodput from `iperf3 -J` (bytes the receiver got per second).
//!
//! # Variants ([`Variant`])
//!
//! - `direct`: no tunnel, the voice as UDP and iperf3's TCP straight over the path;
//! - `openvpn-tcp`: OpenVPN 2.6 in TCP mode, point-to-point with a static key
//!   (AES-128-CBC with HMAC-SHA256: static-key mode has no AEAD cipher), `--dev tun`,
//!   addresses 10.98.0.1 (server) and 10.98.0.2 (client), `TCP_NODELAY` on its socket;
//! - `peg-kernel`: `peg tunnel` over kernel TCP (in order, late binding), TLS 1.3 with the
//!   server's fingerprint pinned (`--pin`), as users run it;
//! - `peg-utcp`: `peg tunnel` over squarepeg's userspace TCP at both ends (unordered
//!   delivery of the tunneled packets), TLS with `--pin`, `--no-priority`;
//! - `peg-utcp-priacks`: the same with priorities on (pure ACKs, DNS, ICMP and small packets
//!   ahead of bulk).
//!
//! The tunneled iperf3 flows use [`TunnelLabConfig::congestion`] (default `cubic`,
//! loss-based like Minion's flows; `iperf3 -C`). The outer kernel connections (OpenVPN's,
//! `peg-kernel`'s) use [`TunnelLabConfig::outer_congestion`] (default `cubic`), set on a host
//! route between the two ends (`ip route … congctl`: a namespace's default may only be an
//! algorithm the host allows, a route's may be any); squarepeg's userspace TCP runs its own
//! CUBIC. So every outer connection is loss-based CUBIC, whatever the host's default.
//!
//! # Output, schema `squarepeg.tunnel/1`
//!
//! ```text
//! { "schema": "squarepeg.tunnel/1", "seed", "path": { "name", "down", "up" },
//!   "playout_delay_ms", "playout_offset_ms", "duration_s", "congestion",
//!   "outer_kernel_congestion", "peg_security",
//!   "openvpn", "runs": [ { "variant", "uploads",
//!     "voice": { "messages_sent", "messages_received", "on_time", "late", "never_delivered",
//!                "late_loss_rate", "latency_ms": { "p50", "p95", "p99", "max" } },
//!     "download_mbps", "upload_mbps": [ … per upload ], "upload_total_mbps",
//!     "emulator": { "down", "up" }, "tunnel_stats": [ … ], "warnings": [ … ] }, … ] }
//! ```
//!
//! `download_mbps` is `null` when iperf3 gave no result (a warning says why).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use squarepeg_lab::net::{Lab, LabConfig, NetNs};

use crate::voip::analysis::{MessageState, Observations, analyse, ms, percentile};
use crate::voip::config::{Scenario, VoipConfig};
use crate::voip::lab::{LabCall, LabUdp, Progress, VOICE_PORT, run_call};
use crate::voip::plot::{CdfChart, Chart, FONT, PALETTE, ensure_font, plot_err, write_svg_and_png};
use crate::voip::{Engine, VoipError};
use crate::write_sysctl;

/// The schema name and version of the JSON output.
pub const TUNNEL_SCHEMA: &str = "squarepeg.tunnel/1";
/// The most competing uploads a cell may have (Minion Fig. 11 goes to 3).
pub const MAX_UPLOADS: u32 = 3;
/// The port of the tunnel servers (`peg tunnel`, OpenVPN).
const TUNNEL_PORT: u16 = 4443;
/// iperf3's download server port; upload `k` uses the next ones.
const IPERF_PORT: u16 = 5201;
/// How long a tunnel may take to come up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopped child may take to exit before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// What carries the traffic between the client and server namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// No tunnel: UDP and TCP straight over the path.
    Direct,
    /// OpenVPN 2.6 in TCP mode (static key).
    OpenvpnTcp,
    /// `peg tunnel` over kernel TCP.
    PegKernel,
    /// `peg tunnel` over the userspace TCP, unordered, no priorities.
    PegUtcp,
    /// `peg tunnel` over the userspace TCP, unordered, priorities on (priACKs).
    PegUtcpPriacks,
}

impl Variant {
    /// All, in report order.
    pub const ALL: [Variant; 5] = [
        Variant::Direct,
        Variant::OpenvpnTcp,
        Variant::PegKernel,
        Variant::PegUtcp,
        Variant::PegUtcpPriacks,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Direct => "direct",
            Variant::OpenvpnTcp => "openvpn-tcp",
            Variant::PegKernel => "peg-kernel",
            Variant::PegUtcp => "peg-utcp",
            Variant::PegUtcpPriacks => "peg-utcp-priacks",
        }
    }

    /// One line for people.
    pub fn description(self) -> &'static str {
        match self {
            Variant::Direct => "no tunnel: voice as UDP, iperf3 TCP straight over the path",
            Variant::OpenvpnTcp => {
                "OpenVPN 2.6, TCP mode, static key (AES-128-CBC + HMAC-SHA256), TCP_NODELAY"
            }
            Variant::PegKernel => "peg tunnel over kernel TCP (in order), TLS 1.3 pinned",
            Variant::PegUtcp => {
                "peg tunnel over the userspace TCP (unordered), TLS 1.3 pinned, --no-priority"
            }
            Variant::PegUtcpPriacks => {
                "peg tunnel over the userspace TCP (unordered), TLS 1.3 pinned, priorities on"
            }
        }
    }

    /// A variant by name.
    pub fn by_name(name: &str) -> Result<Variant, VoipError> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == name)
            .ok_or_else(|| VoipError::UnknownTransport {
                name: name.to_owned(),
                known: Variant::ALL.map(Variant::name).join(", "),
            })
    }
}

/// The experiment's parameters.
#[derive(Debug, Clone)]
pub struct TunnelLabConfig {
    /// The `peg` binary that runs the tunnels.
    pub peg: PathBuf,
    /// The `openvpn` binary.
    pub openvpn: PathBuf,
    /// The `iperf3` binary.
    pub iperf3: PathBuf,
    /// The path and the playout delay (no bulk flows of its own).
    pub scenario: Scenario,
    /// The voice call (its lead-in lets the bulk flows start first).
    pub voice: VoipConfig,
    /// Congestion control of the tunneled iperf3 flows.
    pub congestion: String,
    /// Congestion control of the outer kernel TCP connections (OpenVPN's, `peg-kernel`'s),
    /// set on the route between the two ends; `None`: the kernel's default.
    pub outer_congestion: Option<String>,
}

impl TunnelLabConfig {
    /// The default call of `duration` over `scenario`, tools from `PATH` except `peg`.
    pub fn new(peg: PathBuf, scenario: Scenario, duration: Duration) -> Result<Self, VoipError> {
        let voice = VoipConfig {
            lead_in: Duration::from_secs(3),
            drain: Duration::from_secs(2),
            ..VoipConfig::default()
        }
        .with_duration(duration)?;
        Ok(Self {
            peg,
            openvpn: "openvpn".into(),
            iperf3: "iperf3".into(),
            scenario: Scenario {
                bulk: None,
                ..scenario
            },
            voice,
            congestion: "cubic".into(),
            outer_congestion: Some("cubic".into()),
        })
    }

    /// How long iperf3's flows run: from the start of the call's lead-in to its last
    /// message.
    fn bulk_seconds(&self) -> u64 {
        (self.voice.lead_in + self.voice.duration())
            .as_secs_f64()
            .ceil() as u64
    }
}

/// The voice call's outcome in one cell.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceResult {
    /// Messages sent.
    pub sent: u64,
    /// Messages received (at any time).
    pub received: u64,
    /// Arrived by their playout time.
    pub on_time: u64,
    /// Arrived after it.
    pub late: u64,
    /// Never arrived.
    pub never: u64,
    /// (late + never) / sent.
    pub late_loss_rate: f64,
    /// Transport delays of the received messages, in ms, sorted.
    pub delays_ms: Vec<f64>,
    /// p50, p95, p99, max of the transport delay (ms).
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

/// One cell: a variant with a number of competing uploads.
#[derive(Debug, Clone)]
pub struct TunnelRun {
    /// The variant.
    pub variant: Variant,
    /// Competing uploads.
    pub uploads: u32,
    /// The seed of the lab's link model.
    pub seed: u64,
    /// The call.
    pub voice: VoiceResult,
    /// The download's goodput in Mbit/s.
    pub download_mbps: Option<f64>,
    /// Each upload's goodput in Mbit/s.
    pub upload_mbps: Vec<Option<f64>>,
    /// The emulator's counters.
    pub emulator: Value,
    /// What each `peg tunnel` process said about its packets when it stopped (packets it
    /// sent and received; what the server sent and the client did not receive expired in
    /// the tunnel).
    pub tunnel_stats: Vec<String>,
    /// What went wrong without stopping the cell.
    pub warnings: Vec<String>,
}

impl TunnelRun {
    /// The uploads' goodput together.
    pub fn upload_total_mbps(&self) -> f64 {
        self.upload_mbps.iter().flatten().fold(0.0, |a, b| a + b)
    }
}

/// A child process in a namespace, stopped (SIGTERM, then SIGKILL) when dropped; its output
/// lines (both streams) arrive on a channel.
struct Proc {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
    fn spawn(ns: &NetNs, program: &Path, args: &[String], name: &str) -> Result<Proc, VoipError> {
        let program = program
            .to_str()
            .ok_or_else(|| VoipError::Config(format!("{}: not a UTF-8 path", program.display())))?;
        let mut command: Command = ns.command(program);
        command
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(VoipError::io(format!("starting {name} ({program})")))?;
        let (tx, rx) = mpsc::channel();
        fn pump(stream: impl Read + Send + 'static, tx: mpsc::Sender<String>) {
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        if let Some(out) = child.stdout.take() {
            pump(out, tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            pump(err, tx);
        }
        Ok(Proc {
            name: name.to_owned(),
            child,
            lines: rx,
            seen: Vec::new(),
        })
    }

    /// Waits for an output line containing `text` and returns it.
    fn wait_for(&mut self, text: &str, timeout: Duration) -> Result<String, VoipError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .lines
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                Ok(line) => {
                    let hit = line.contains(text);
                    self.seen.push(line.clone());
                    if hit {
                        return Ok(line);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        // Gather what it said before it exited.
                        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                            self.seen.push(line);
                        }
                        return Err(self.failed(&format!("exited ({status}) before {text:?}")));
                    }
                }
                Err(_) => return Err(self.failed(&format!("never said {text:?}"))),
            }
        }
    }

    fn failed(&self, what: &str) -> VoipError {
        let tail: Vec<&str> = self
            .seen
            .iter()
            .rev()
            .take(8)
            .rev()
            .map(String::as_str)
            .collect();
        VoipError::Transport(format!(
            "{} {what}; it said: {}",
            self.name,
            tail.join(" | ")
        ))
    }

    /// Waits until it exits by itself (at most `timeout`, then stops it); returns every line
    /// it printed and whether it exited successfully.
    fn wait_output(mut self, timeout: Duration) -> (bool, String) {
        let deadline = Instant::now() + timeout;
        let ok = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    self.stop();
                    break false;
                }
            }
        };
        // The pumps end with the process's streams.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) {
            self.seen.push(line);
        }
        (ok, std::mem::take(&mut self.seen).join("\n"))
    }

    /// SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]; reaps it.
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = libc_pid(self.child.id()) {
            // SAFETY: kill(2) on our own child, which has not been reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn libc_pid(id: u32) -> Result<libc::pid_t, std::num::TryFromIntError> {
    libc::pid_t::try_from(id)
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running tunnel: its processes (stopped when dropped) and the addresses the traffic
/// uses.
struct Tunnel {
    procs: Vec<Proc>,
    server: Ipv4Addr,
    client: Ipv4Addr,
    /// Files to remove afterwards.
    _dir: Option<TempDir>,
}

impl Tunnel {
    /// Stops the processes (client first) and returns what each said last about its
    /// packets: `peg tunnel`'s `tunnel: sent … received …` line, prefixed with the process.
    fn finish(mut self) -> Vec<String> {
        let mut stats = Vec::new();
        while let Some(mut p) = self.procs.pop() {
            p.stop();
            while let Ok(line) = p.lines.recv_timeout(Duration::from_millis(500)) {
                p.seen.push(line);
            }
            if let Some(line) = p.seen.iter().rev().find(|l| l.starts_with("tunnel: sent")) {
                stats.push(format!("{}: {}", p.name, &line["tunnel: ".len()..]));
            }
        }
        stats
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        // The client first: the server sees its peer leave.
        while let Some(mut p) = self.procs.pop() {
            p.stop();
        }
    }
}

/// Removes a directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static LABS: AtomicU32 = AtomicU32::new(0);

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The fingerprint `peg tunnel server` printed (its last word).
fn fingerprint(server: &mut Proc) -> Result<String, VoipError> {
    let line = server.wait_for("fingerprint", SETUP_TIMEOUT)?;
    line.rsplit(' ')
        .next()
        .map(str::to_owned)
        .ok_or_else(|| server.failed("printed no fingerprint"))
}

/// The client's and the server's tunnel addresses from `tunnel up: device D, C/P (server S),
/// …`.
fn tunnel_addresses(line: &str) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let (_, rest) = line.split_once(", ")?;
    let (client, rest) = rest.split_once('/')?;
    let (_, rest) = rest.split_once("(server ")?;
    let (server, _) = rest.split_once(')')?;
    Some((client.parse().ok()?, server.parse().ok()?))
}

fn open_tunnel(lab: &Lab, config: &TunnelLabConfig, variant: Variant) -> Result<Tunnel, VoipError> {
    let a = *lab.addresses();
    let (server_ip, client_ip) = (a.server_v4, a.client_v4);
    match variant {
        Variant::Direct => Ok(Tunnel {
            procs: Vec::new(),
            server: server_ip,
            client: client_ip,
            _dir: None,
        }),
        Variant::OpenvpnTcp => {
            let index = LABS.fetch_add(1, Ordering::Relaxed);
            let dir = TempDir(
                std::env::temp_dir().join(format!("sqpg-ovpn-{}-{index}", std::process::id())),
            );
            std::fs::create_dir_all(&dir.0)
                .map_err(VoipError::io(format!("creating {}", dir.0.display())))?;
            let key = dir.0.join("static.key");
            let key_s = key.to_string_lossy().into_owned();
            let out = Command::new(&config.openvpn)
                .args(["--genkey", "secret", &key_s])
                .output()
                .map_err(VoipError::io(format!(
                    "running {} (install Debian's openvpn package)",
                    config.openvpn.display()
                )))?;
            if !out.status.success() {
                return Err(VoipError::Transport(format!(
                    "openvpn --genkey: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            let common = |direction: &str, local: &str, remote: &str| {
                args(&[
                    "--dev",
                    "tun",
                    "--ifconfig",
                    local,
                    remote,
                    "--secret",
                    &key_s,
                    direction,
                    "--cipher",
                    "AES-128-CBC",
                    "--auth",
                    "SHA256",
                    "--socket-flags",
                    "TCP_NODELAY",
                    "--verb",
                    "3",
                ])
            };
            let mut server_args = args(&[
                "--proto",
                "tcp-server",
                "--local",
                &server_ip.to_string(),
                "--lport",
                &TUNNEL_PORT.to_string(),
            ]);
            server_args.extend(common("0", "10.98.0.1", "10.98.0.2"));
            let mut server = Proc::spawn(
                lab.server(),
                &config.openvpn,
                &server_args,
                "openvpn server",
            )?;
            server.wait_for("Listening for incoming TCP connection", SETUP_TIMEOUT)?;
            let mut client_args = args(&[
                "--proto",
                "tcp-client",
                "--remote",
                &server_ip.to_string(),
                &TUNNEL_PORT.to_string(),
                "--connect-retry",
                "1",
            ]);
            client_args.extend(common("1", "10.98.0.2", "10.98.0.1"));
            let mut client = Proc::spawn(
                lab.client(),
                &config.openvpn,
                &client_args,
                "openvpn client",
            )?;
            let mut tunnel = Tunnel {
                procs: Vec::new(),
                server: Ipv4Addr::new(10, 98, 0, 1),
                client: Ipv4Addr::new(10, 98, 0, 2),
                _dir: Some(dir),
            };
            tunnel.procs.push(server);
            client.wait_for("Initialization Sequence Completed", SETUP_TIMEOUT)?;
            tunnel.procs.push(client);
            Ok(tunnel)
        }
        Variant::PegKernel | Variant::PegUtcp | Variant::PegUtcpPriacks => {
            let utcp = variant != Variant::PegKernel;
            let port = TUNNEL_PORT.to_string();
            let (mut server_args, connect) = if utcp {
                // Each end's stack has a subnet of its own behind its namespace's kernel,
                // which forwards; each side routes the other's stack subnet over the lab.
                for ns in [lab.client(), lab.server()] {
                    write_sysctl(ns, "/proc/sys/net/ipv4/ip_forward", "1")?;
                }
                lab.client().ip(&[
                    "route",
                    "add",
                    "10.78.0.0/24",
                    "via",
                    &server_ip.to_string(),
                ])?;
                lab.server().ip(&[
                    "route",
                    "add",
                    "10.77.0.0/24",
                    "via",
                    &client_ip.to_string(),
                ])?;
                (
                    args(&[
                        "tunnel",
                        "server",
                        &format!("10.78.0.2:{port}"),
                        "--substrate",
                        "utcp",
                        "--setup",
                        "--addr",
                        "10.78.0.2",
                        "--kernel-addr",
                        "10.78.0.1/24",
                        "--quiet",
                    ]),
                    format!("10.78.0.2:{port}"),
                )
            } else {
                (
                    args(&["tunnel", "server", &format!("{server_ip}:{port}")]),
                    format!("{server_ip}:{port}"),
                )
            };
            server_args.extend(args(&["--subnet", "10.99.0.0/24"]));
            if variant == Variant::PegUtcp {
                server_args.push("--no-priority".into());
            }
            let mut server = Proc::spawn(lab.server(), &config.peg, &server_args, "peg server")?;
            let pin = fingerprint(&mut server)?;
            server.wait_for("tunnel server on", SETUP_TIMEOUT)?;
            let mut client_args = args(&["tunnel", "client", &connect, "--pin", &pin]);
            if utcp {
                client_args.extend(args(&[
                    "--substrate",
                    "utcp",
                    "--setup",
                    "--addr",
                    "10.77.0.2",
                    "--kernel-addr",
                    "10.77.0.1/24",
                    "--quiet",
                ]));
            }
            if variant == Variant::PegUtcp {
                client_args.push("--no-priority".into());
            }
            let mut tunnel = Tunnel {
                procs: vec![server],
                server: Ipv4Addr::UNSPECIFIED,
                client: Ipv4Addr::UNSPECIFIED,
                _dir: None,
            };
            let mut client = Proc::spawn(lab.client(), &config.peg, &client_args, "peg client")?;
            let line = client.wait_for("tunnel up", SETUP_TIMEOUT)?;
            let (c, s) = tunnel_addresses(&line)
                .ok_or_else(|| client.failed(&format!("said {line:?}: no addresses")))?;
            tunnel.procs.push(client);
            tunnel.client = c;
            tunnel.server = s;
            Ok(tunnel)
        }
    }
}

/// What iperf3 measured.
struct Bulk {
    /// Server processes, stopped when dropped.
    servers: Vec<Proc>,
    /// Client processes: the download first.
    clients: Vec<Proc>,
}

fn start_bulk(
    lab: &Lab,
    config: &TunnelLabConfig,
    tunnel: &Tunnel,
    uploads: u32,
) -> Result<Bulk, VoipError> {
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    let seconds = config.bulk_seconds().to_string();
    let server_ip = tunnel.server.to_string();
    for k in 0..=uploads {
        let port = (IPERF_PORT + k as u16).to_string();
        let mut server = Proc::spawn(
            lab.server(),
            &config.iperf3,
            &args(&["-s", "-1", "-p", &port, "-B", &server_ip, "--forceflush"]),
            "iperf3 server",
        )?;
        server.wait_for("Server listening", SETUP_TIMEOUT)?;
        servers.push(server);
    }
    for k in 0..=uploads {
        let port = (IPERF_PORT + k as u16).to_string();
        let mut a = args(&[
            "-c",
            &server_ip,
            "-p",
            &port,
            "-t",
            &seconds,
            "-J",
            "--connect-timeout",
            "5000",
            "-C",
            &config.congestion,
        ]);
        if k == 0 {
            a.push("-R".into());
        }
        let name = if k == 0 {
            "iperf3 download".to_owned()
        } else {
            format!("iperf3 upload {k}")
        };
        clients.push(Proc::spawn(lab.client(), &config.iperf3, &a, &name)?);
    }
    Ok(Bulk { servers, clients })
}

/// Bits per second the receiver got, from `iperf3 -J`.
fn goodput_mbps(output: &str) -> Result<f64, String> {
    let start = output.find('{').ok_or("no JSON")?;
    let v: Value = serde_json::from_str(&output[start..]).map_err(|e| format!("JSON: {e}"))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(e.to_owned());
    }
    v.pointer("/end/sum_received/bits_per_second")
        .and_then(Value::as_f64)
        .map(|b| b / 1e6)
        .ok_or_else(|| "no end.sum_received.bits_per_second".to_owned())
}

/// Checks that the tools `variants` need are there (`iperf3`; `openvpn` for
/// [`Variant::OpenvpnTcp`]), so that a missing package is named before any lab is built.
pub fn check_tools(config: &TunnelLabConfig, variants: &[Variant]) -> Result<(), VoipError> {
    let found = |program: &Path| {
        if program.components().count() > 1 {
            return program.is_file();
        }
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join(program).is_file())
        })
    };
    let mut needed = vec![(&config.iperf3, "iperf3")];
    if variants.contains(&Variant::OpenvpnTcp) {
        needed.push((&config.openvpn, "openvpn"));
    }
    for (program, package) in needed {
        if !found(program) {
            return Err(VoipError::Config(format!(
                "{} not found: install Debian's {package} package",
                program.display()
            )));
        }
    }
    Ok(())
}

/// Runs one cell on a lab of its own; `progress` is called about once a second during the
/// call.
pub fn run_cell(
    config: &TunnelLabConfig,
    variant: Variant,
    uploads: u32,
    seed: u64,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<TunnelRun, VoipError> {
    config.voice.validate()?;
    if uploads > MAX_UPLOADS {
        return Err(VoipError::Config(format!(
            "{uploads} uploads: at most {MAX_UPLOADS}"
        )));
    }
    let index = LABS.fetch_add(1, Ordering::Relaxed);
    let lab = Lab::start(
        LabConfig::new(&format!("tun{index}"))
            .with_bottleneck(config.scenario.bottleneck.clone())
            .with_seed(seed),
    )?;
    let outcome = run_in_lab(&lab, config, variant, uploads, progress);
    let stats = lab.teardown();
    let (observations, download, upload, mut warnings, tunnel_stats) = outcome?;
    let stats = stats?;
    if stats.down.kernel_drops > 0 || stats.down.dropped_overload > 0 {
        warnings.push(format!(
            "the emulator missed {} frames and refused {} packets on the downlink",
            stats.down.kernel_drops, stats.down.dropped_overload
        ));
    }
    let analysis = analyse(&config.voice, &config.scenario, &observations);
    let s = &analysis.summary;
    let mut delays: Vec<Duration> = analysis
        .records
        .iter()
        .filter_map(|r| r.transport_delay())
        .collect();
    delays.sort_unstable();
    let count = |state| analysis.records.iter().filter(|r| r.state == state).count() as u64;
    let voice = VoiceResult {
        sent: s.messages_sent,
        received: delays.len() as u64,
        on_time: count(MessageState::OnTime),
        late: count(MessageState::Late),
        never: count(MessageState::Lost),
        late_loss_rate: s.late_loss_rate,
        p50: percentile(&delays, 0.50),
        p95: percentile(&delays, 0.95),
        p99: percentile(&delays, 0.99),
        max: delays.last().map(|d| ms(*d)),
        delays_ms: delays.iter().map(|d| ms(*d)).collect(),
    };
    Ok(TunnelRun {
        variant,
        uploads,
        seed,
        voice,
        download_mbps: download,
        upload_mbps: upload,
        emulator: json!({ "down": stats.down, "up": stats.up, "elapsed_s": stats.elapsed_s }),
        tunnel_stats,
        warnings,
    })
}

type CellOutcome = (
    Observations,
    Option<f64>,
    Vec<Option<f64>>,
    Vec<String>,
    Vec<String>,
);

fn run_in_lab(
    lab: &Lab,
    config: &TunnelLabConfig,
    variant: Variant,
    uploads: u32,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<CellOutcome, VoipError> {
    if let Some(cc) = &config.outer_congestion {
        // A host route to the far end with its own congestion control: every kernel TCP
        // between the two ends' lab addresses (OpenVPN's, peg-kernel's) uses it. Unlike a
        // namespace's default, a route may name an algorithm the host restricts.
        let a = *lab.addresses();
        let i = &lab.info().interfaces;
        for (ns, to, dev) in [
            (lab.client(), a.server_v4, &i.client),
            (lab.server(), a.client_v4, &i.server),
        ] {
            ns.ip(&[
                "route",
                "add",
                &format!("{to}/32"),
                "dev",
                dev,
                "congctl",
                cc,
            ])?;
        }
    }
    let tunnel = open_tunnel(lab, config, variant)?;
    let bulk = start_bulk(lab, config, &tunnel, uploads)?;
    let call = LabCall {
        sender: SocketAddr::new(tunnel.server.into(), VOICE_PORT),
        receiver: SocketAddr::new(tunnel.client.into(), VOICE_PORT),
        config: config.voice,
        scenario: config.scenario.clone(),
    };
    let (sent, arrivals, mut warnings, drops, _) = run_call(lab, &call, &LabUdp, progress)?;
    let mut download = None;
    let mut upload = Vec::new();
    let limit = Duration::from_secs(config.bulk_seconds() + 20);
    for (k, client) in bulk.clients.into_iter().enumerate() {
        let name = client.name.clone();
        let (_, output) = client.wait_output(limit);
        let result = goodput_mbps(&output);
        if let Err(e) = &result {
            warnings.push(format!("{name}: {e}"));
        }
        if k == 0 {
            download = result.ok();
        } else {
            upload.push(result.ok());
        }
    }
    drop(bulk.servers);
    let tunnel_stats = tunnel.finish();
    let observations = Observations {
        sent,
        arrivals,
        // Inside a tunnel the wire does not show which voice packet was lost.
        lost_by_network: Default::default(),
        dropped_by_sender: drops.dropped,
        replaced_by_sender: drops.replaced,
    };
    Ok((observations, download, upload, warnings, tunnel_stats))
}

fn opt(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |v| json!((v * 1000.0).round() / 1000.0))
}

/// The runs as JSON (schema [`TUNNEL_SCHEMA`]).
pub fn tunnel_json(config: &TunnelLabConfig, seed: u64, runs: &[TunnelRun]) -> Value {
    let b = &config.scenario.bottleneck;
    let runs: Vec<Value> = runs
        .iter()
        .map(|r| {
            let v = &r.voice;
            json!({
                "variant": r.variant.name(),
                "description": r.variant.description(),
                "uploads": r.uploads,
                "seed": r.seed,
                "voice": {
                    "messages_sent": v.sent,
                    "messages_received": v.received,
                    "on_time": v.on_time,
                    "late": v.late,
                    "never_delivered": v.never,
                    "late_loss_rate": v.late_loss_rate,
                    "latency_ms": { "p50": opt(v.p50), "p95": opt(v.p95), "p99": opt(v.p99), "max": opt(v.max) },
                },
                "download_mbps": opt(r.download_mbps),
                "upload_mbps": r.upload_mbps.iter().map(|u| opt(*u)).collect::<Vec<_>>(),
                "upload_total_mbps": opt(Some(r.upload_total_mbps())),
                "emulator": r.emulator,
                "tunnel_stats": r.tunnel_stats,
                "warnings": r.warnings,
            })
        })
        .collect();
    json!({
        "schema": TUNNEL_SCHEMA,
        "engine": Engine::Lab,
        "seed": seed,
        "path": {
            "name": config.scenario.name,
            "down": b.right_to_left.to_string(),
            "up": b.left_to_right.to_string(),
        },
        "voice": {
            "message_bytes": config.voice.message_bytes,
            "interval_ms": ms(config.voice.interval),
            "count": config.voice.count,
        },
        "playout_delay_ms": ms(config.scenario.playout_delay),
        "playout_offset_ms": ms(config.scenario.playout_offset()),
        "duration_s": config.voice.duration().as_secs_f64(),
        "bulk_s": config.bulk_seconds(),
        "congestion": config.congestion,
        "outer_kernel_congestion": config.outer_congestion.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        }),
        "peg_security": "TLS 1.3, server certificate pinned (--pin)",
        "openvpn": "TCP mode, static key, AES-128-CBC + HMAC-SHA256, TCP_NODELAY",
        "runs": runs,
    })
}

/// The table for people: one line per run (cell and seed).
pub fn tunnel_table(runs: &[TunnelRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<17} {:>3} {:>4} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10} {:>10}",
        "variant",
        "ul",
        "seed",
        "received",
        "late-loss",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "down Mb/s",
        "up Mb/s"
    );
    let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    for r in runs {
        let v = &r.voice;
        let _ = writeln!(
            out,
            "{:<17} {:>3} {:>4} {:>9} {:>8.2}% {:>8} {:>8} {:>8} {:>10} {:>10.2}",
            r.variant.name(),
            r.uploads,
            r.seed,
            format!("{}/{}", v.received, v.sent),
            v.late_loss_rate * 100.0,
            f(v.p50),
            f(v.p95),
            f(v.p99),
            r.download_mbps
                .map_or_else(|| "-".to_owned(), |d| format!("{d:.2}")),
            r.upload_total_mbps(),
        );
    }
    out
}

/// One line: its name, its points and whether it is dashed.
type Line = (String, Vec<(f64, f64)>, bool);

/// Lines over x = competing uploads, one per variant (solid) and optionally a second set
/// (dashed).
struct UploadsChart {
    caption: String,
    y_desc: &'static str,
    series: Vec<Line>,
}

impl Chart for UploadsChart {
    fn draw<DB: plotters::prelude::DrawingBackend>(
        &self,
        root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), VoipError> {
        use plotters::prelude::*;
        root.fill(&WHITE).map_err(plot_err)?;
        let (mut x_hi, mut y_hi) = (1.0f64, 0.0f64);
        for (_, points, _) in &self.series {
            for &(x, y) in points {
                x_hi = x_hi.max(x);
                y_hi = y_hi.max(y);
            }
        }
        let y_hi = if y_hi > 0.0 { y_hi * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(root)
            .caption(&self.caption, (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.2..x_hi + 0.2, 0.0..y_hi)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("competing uploads in the tunnel")
            .y_desc(self.y_desc)
            .x_labels(x_hi as usize + 1)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        let mut colours: Vec<String> = Vec::new();
        for (name, points, dashed) in &self.series {
            let key = name.split(' ').next().unwrap_or_default().to_owned();
            let i = colours.iter().position(|c| *c == key).unwrap_or_else(|| {
                colours.push(key);
                colours.len() - 1
            });
            let colour = PALETTE[i % PALETTE.len()];
            let style = colour.stroke_width(2);
            if *dashed {
                chart
                    .draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))
                    .map_err(plot_err)?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 8, y)], colour.stroke_width(2))
                    });
            } else {
                chart
                    .draw_series(LineSeries::new(points.clone(), style))
                    .map_err(plot_err)?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
            }
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))
                .map_err(plot_err)?;
        }
        crate::voip::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}

/// The variants in `runs`, in report order.
fn variants(runs: &[TunnelRun]) -> Vec<Variant> {
    Variant::ALL
        .into_iter()
        .filter(|v| runs.iter().any(|r| r.variant == *v))
        .collect()
}

fn series(
    runs: &[TunnelRun],
    variant: Variant,
    y: impl Fn(&TunnelRun) -> Option<f64>,
) -> Vec<(f64, f64)> {
    // The mean over the cell's runs (one per seed).
    let mut cells: std::collections::BTreeMap<u32, (f64, u32)> = Default::default();
    for r in runs.iter().filter(|r| r.variant == variant) {
        if let Some(v) = y(r) {
            let c = cells.entry(r.uploads).or_default();
            c.0 += v;
            c.1 += 1;
        }
    }
    cells
        .into_iter()
        .map(|(n, (sum, k))| (f64::from(n), sum / f64::from(k)))
        .collect()
}

/// Writes the plots into `dir` (SVG and PNG each) and returns the files; a cell run with
/// several seeds shows their mean (the CDFs: all their messages together):
///
/// - `tunnel-late-loss`: the voice's late-loss percentage per variant over the number of
///   competing uploads;
/// - `tunnel-download`: the download's goodput per variant over the number of uploads
///   (Minion Fig. 11);
/// - `tunnel-goodput`: download (solid) and total upload (dashed) goodput per variant
///   (Minion Fig. 12's totals);
/// - `tunnel-latency-cdf-<n>ul`: the voice's transport-delay CDF per variant with `n`
///   uploads, the playout deadline marked.
pub fn plot(
    dir: &Path,
    config: &TunnelLabConfig,
    runs: &[TunnelRun],
) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(VoipError::io(format!("creating {}", dir.display())))?;
    let path = &config.scenario.name;
    let mut files = Vec::new();
    let vs = variants(runs);
    let late = UploadsChart {
        caption: format!(
            "voice late loss (after playout or never), {path}, playout {:.0} ms",
            ms(config.scenario.playout_delay)
        ),
        y_desc: "messages that missed playout (%)",
        series: vs
            .iter()
            .map(|&v| {
                let p = series(runs, v, |r| Some(r.voice.late_loss_rate * 100.0));
                (v.name().to_owned(), p, false)
            })
            .collect(),
    };
    files.extend(write_svg_and_png(&dir.join("tunnel-late-loss"), &late)?);
    let download = UploadsChart {
        caption: format!("download goodput with competing uploads, {path} (Minion Fig. 11)"),
        y_desc: "download goodput (Mbit/s)",
        series: vs
            .iter()
            .map(|&v| {
                (
                    v.name().to_owned(),
                    series(runs, v, |r| r.download_mbps),
                    false,
                )
            })
            .collect(),
    };
    files.extend(write_svg_and_png(&dir.join("tunnel-download"), &download)?);
    let mut both = Vec::new();
    for &v in &vs {
        both.push((
            format!("{} download", v.name()),
            series(runs, v, |r| r.download_mbps),
            false,
        ));
        both.push((
            format!("{} uploads", v.name()),
            series(runs, v, |r| (r.uploads > 0).then(|| r.upload_total_mbps())),
            true,
        ));
    }
    let goodput = UploadsChart {
        caption: format!("download and total upload goodput, {path} (Minion Fig. 12)"),
        y_desc: "goodput (Mbit/s)",
        series: both,
    };
    files.extend(write_svg_and_png(&dir.join("tunnel-goodput"), &goodput)?);
    let mut counts: Vec<u32> = runs.iter().map(|r| r.uploads).collect();
    counts.sort_unstable();
    counts.dedup();
    for n in counts {
        // Each variant's runs (seeds) together.
        let curves = vs
            .iter()
            .filter_map(|&v| {
                let cell: Vec<&TunnelRun> = runs
                    .iter()
                    .filter(|r| r.uploads == n && r.variant == v)
                    .collect();
                (!cell.is_empty()).then(|| {
                    (
                        v.name().to_owned(),
                        cell.iter()
                            .flat_map(|r| r.voice.delays_ms.iter().copied())
                            .collect(),
                        cell.iter().map(|r| r.voice.sent as usize).sum(),
                    )
                })
            })
            .collect();
        let chart = CdfChart::new(
            (
                format!("voice transport delay, {path}, download + {n} upload(s)"),
                20,
            ),
            "transport delay (ms)",
            "fraction of messages sent",
            curves,
            Some(ms(config.scenario.playout_offset())),
        );
        files.extend(write_svg_and_png(
            &dir.join(format!("tunnel-latency-cdf-{n}ul")),
            &chart,
        )?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_tools_print() {
        assert_eq!(
            tunnel_addresses("tunnel up: device peg0, 10.99.0.2/24 (server 10.99.0.1), MTU 1400"),
            Some((Ipv4Addr::new(10, 99, 0, 2), Ipv4Addr::new(10, 99, 0, 1)))
        );
        assert_eq!(tunnel_addresses("tunnel up"), None);
        let out = "junk\n{\"end\": {\"sum_received\": {\"bits_per_second\": 2500000.0}}}";
        assert_eq!(goodput_mbps(out), Ok(2.5));
        assert_eq!(
            goodput_mbps("{\"error\": \"unable to connect\"}"),
            Err("unable to connect".to_owned())
        );
        for v in Variant::ALL {
            assert_eq!(Variant::by_name(v.name()).unwrap(), v);
        }
        assert!(Variant::by_name("wireguard").is_err());
    }
}
