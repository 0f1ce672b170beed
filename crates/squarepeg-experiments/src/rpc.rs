//! `peg bench rpc`: one request and its answer on the real lab (NGTCP's transaction; issue
//! "Transactions"), for every way of carrying it: kernel TCP, TCP + TLS 1.3 (tokio-rustls),
//! squarepeg at first contact and as a returning client (TCP Fast Open + TLS 1.3 early data,
//! through [`squarepeg::Transactor`]), and quinn at first contact and with 0-RTT. For each:
//! the time from the first packet to the answer (in ms and in round trips of the path) and
//! the segments (TCP) or datagrams (QUIC) on the wire in both directions, close included,
//! counted on the emulator's capture; the packets of each run for a timeline plot. Then a
//! replay attempt: the returning client's SYN data (ClientHello and early request) sent
//! again on a new connection; the server must not execute the request again.
//!
//! Each run is alone on the path: runs follow each other with a pause of a few round trips
//! so that each one's close is over before the next starts, and the capture is cut into runs
//! by time and by the server's port.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Serialize;
use squarepeg::tls::config::{self, SelfSigned, Trust};
use squarepeg::tls::rustls;
use squarepeg::{ConnectionConfig, Endpoint, MessageProps, Transactor, TransportProperties};
use squarepeg_lab::net::{CaptureSide, Lab, LabConfig, capture_path};
use squarepeg_lab::packet::parse_ip;
use squarepeg_lab::pcap::read_pcap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::voip::VoipError;
use crate::voip::plot::{Chart, FONT, ensure_font, plot_err, write_svg_and_png};

/// The ways of carrying a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Contender {
    /// Kernel TCP: connect, request, answer, close.
    Tcp,
    /// TCP and a full TLS 1.3 handshake (tokio-rustls), then the request.
    TcpTls,
    /// squarepeg over TLS and kernel TCP at first contact (no cookie, no ticket).
    PegFirst,
    /// squarepeg returning: TCP Fast Open and TLS 1.3 early data.
    PegReturn,
    /// squarepeg returning over its userspace TCP (`squarepeg-io` on TUN at the client; the
    /// server is the same kernel-TCP one): the stack's Fast Open SYN carries the ClientHello
    /// and the early data.
    PegUtcpReturn,
    /// quinn (QUIC) at first contact.
    QuinnFirst,
    /// quinn returning, the request as 0-RTT data.
    Quinn0Rtt,
}

impl Contender {
    /// All, in table order.
    pub const ALL: [Contender; 7] = [
        Contender::Tcp,
        Contender::TcpTls,
        Contender::PegFirst,
        Contender::PegReturn,
        Contender::PegUtcpReturn,
        Contender::QuinnFirst,
        Contender::Quinn0Rtt,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Tcp => "tcp",
            Contender::TcpTls => "tcp+tls",
            Contender::PegFirst => "peg-first",
            Contender::PegReturn => "peg-return",
            Contender::PegUtcpReturn => "peg-utcp-return",
            Contender::QuinnFirst => "quinn-first",
            Contender::Quinn0Rtt => "quinn-0rtt",
        }
    }

    /// The contender called `name`.
    pub fn by_name(name: &str) -> Result<Contender, VoipError> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| VoipError::UnknownTransport {
                name: name.to_owned(),
                known: Self::ALL.map(|c| c.name()).join(", "),
            })
    }

    fn port(self) -> u16 {
        match self {
            Contender::Tcp => 6301,
            Contender::TcpTls => 6302,
            Contender::PegFirst | Contender::PegReturn | Contender::PegUtcpReturn => 6303,
            Contender::QuinnFirst | Contender::Quinn0Rtt => 6304,
        }
    }

    fn udp(self) -> bool {
        matches!(self, Contender::QuinnFirst | Contender::Quinn0Rtt)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// The path's round-trip time (half each way).
    pub rtt: Duration,
    /// Measured runs per contender.
    pub runs: u32,
    /// Bytes of the request and of the answer (one segment each by default).
    pub request_bytes: usize,
    /// Bytes of the answer.
    pub answer_bytes: usize,
    /// Which contenders, in order.
    pub contenders: Vec<Contender>,
    /// Where the lab's captures go (kept for inspection).
    pub capture_dir: PathBuf,
}

/// One packet of a run, as the client's side of the path saw it.
#[derive(Debug, Clone, Serialize)]
pub struct RunPacket {
    /// Milliseconds since the run's first packet.
    pub t_ms: f64,
    /// Sent by the client.
    pub up: bool,
    /// Bytes of payload (TCP) or of the datagram (UDP).
    pub len: usize,
    /// TCP flags in letters (`S`, `A`, `F`, `R`, `P`); empty for UDP.
    pub flags: String,
}

/// One measured transaction.
#[derive(Debug, Clone, Serialize)]
pub struct RpcRun {
    /// Who carried it.
    pub contender: Contender,
    /// The run's index.
    pub run: u32,
    /// From the first packet on the wire to the answer at the client, in ms.
    pub latency_ms: f64,
    /// The same in round trips of the path.
    pub rtts: f64,
    /// Segments (datagrams for QUIC) both ways, from the first to the close.
    pub segments: usize,
    /// Of those, sent by the client.
    pub segments_up: usize,
    /// Its packets.
    pub packets: Vec<RunPacket>,
}

/// The replay attempt.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayResult {
    /// Whether a returning client's SYN with data was found to replay.
    pub attempted: bool,
    /// Bytes replayed (the SYN's data: ClientHello and early data).
    pub bytes: usize,
    /// Whether the server answered the copy (it should: a full handshake).
    pub server_answered: bool,
    /// Requests the server executed because of the copy (must be 0).
    pub requests_executed: u32,
}

/// Everything `peg bench rpc` measured.
#[derive(Debug, Clone, Serialize)]
pub struct RpcReport {
    /// The path's RTT in ms.
    pub rtt_ms: f64,
    /// Request and answer sizes.
    pub request_bytes: usize,
    /// Answer size.
    pub answer_bytes: usize,
    /// Every measured run.
    pub runs: Vec<RpcRun>,
    /// The replay attempt.
    pub replay: ReplayResult,
}

/// A median of the runs of one contender.
#[derive(Debug, Clone, Serialize)]
pub struct RpcSummary {
    /// Who.
    pub contender: Contender,
    /// Median latency, ms.
    pub latency_ms: f64,
    /// Median latency in round trips.
    pub rtts: f64,
    /// Median segments both ways.
    pub segments: usize,
    /// Median segments from the client.
    pub segments_up: usize,
}

impl RpcReport {
    /// The median run of each contender, in table order.
    pub fn summary(&self) -> Vec<RpcSummary> {
        let mut out = Vec::new();
        for c in Contender::ALL {
            let mut runs: Vec<&RpcRun> = self.runs.iter().filter(|r| r.contender == c).collect();
            if runs.is_empty() {
                continue;
            }
            runs.sort_by(|a, b| a.latency_ms.total_cmp(&b.latency_ms));
            let mid = runs[runs.len() / 2];
            let mut segs: Vec<(usize, usize)> =
                runs.iter().map(|r| (r.segments, r.segments_up)).collect();
            segs.sort_unstable();
            let (segments, segments_up) = segs[segs.len() / 2];
            out.push(RpcSummary {
                contender: c,
                latency_ms: mid.latency_ms,
                rtts: mid.rtts,
                segments,
                segments_up,
            });
        }
        out
    }

    /// The table `peg bench rpc` prints.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<16} {:>11} {:>6} {:>9} {:>6}\n",
            "contender", "answer (ms)", "RTTs", "segments", "up"
        );
        for r in self.summary() {
            s.push_str(&format!(
                "{:<16} {:>11.1} {:>6.2} {:>9} {:>6}\n",
                r.contender.name(),
                r.latency_ms,
                r.rtts,
                r.segments,
                r.segments_up
            ));
        }
        s.push_str(&format!(
            "replay of the returning client's SYN data ({} bytes): server answered {}, requests \
             executed {}\n",
            self.replay.bytes,
            if self.replay.server_answered {
                "with a full handshake"
            } else {
                "nothing"
            },
            self.replay.requests_executed
        ));
        s
    }
}

/// The certificates and TLS configurations of one lab run.
struct Tls {
    cert: SelfSigned,
    server_name: String,
}

impl Tls {
    fn client(&self) -> Arc<rustls::ClientConfig> {
        config::client_config(Trust::PinnedSha256(self.cert.fingerprint)).expect("client config")
    }

    fn server(&self) -> Arc<rustls::ServerConfig> {
        config::server_config(self.cert.cert_pem.as_bytes(), self.cert.key_pem.as_bytes())
            .expect("server config")
    }
}

fn wall_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn runtime() -> Result<tokio::runtime::Runtime, VoipError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(VoipError::io("tokio runtime"))
}

/// Forgets what the kernel of namespace `ns` learnt about other hosts (Fast Open cookies and
/// cached metrics live in `tcp_metrics`): the next connection is a first contact.
fn forget_server(ns: &str) -> Result<(), VoipError> {
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ip", "tcp_metrics", "flush", "all"])
        .status()
        .map_err(VoipError::io("ip tcp_metrics"))?;
    if status.success() {
        Ok(())
    } else {
        Err(VoipError::Config("ip tcp_metrics flush failed".into()))
    }
}

/// The servers, one per contender kind, in the server namespace.
async fn serve(
    server_ip: IpAddr,
    tls: Arc<Tls>,
    answer_bytes: usize,
    request_bytes: usize,
    peg_requests: Arc<AtomicU32>,
    ready: std::sync::mpsc::Sender<()>,
) -> Result<(), VoipError> {
    let answer: Arc<[u8]> = vec![0xA5; answer_bytes].into();
    // Kernel TCP.
    let tcp = tokio::net::TcpListener::bind((server_ip, Contender::Tcp.port()))
        .await
        .map_err(VoipError::io("tcp listener"))?;
    // TCP + TLS 1.3 (tokio-rustls).
    let tls_listener = tokio::net::TcpListener::bind((server_ip, Contender::TcpTls.port()))
        .await
        .map_err(VoipError::io("tls listener"))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server());
    // squarepeg: Fast Open, early data with single-use tickets.
    let peg_tls = config::server_accepting_early_data(&tls.server(), 16 * 1024)
        .map_err(|e| VoipError::Config(e.to_string()))?;
    let mut peg_config = ConnectionConfig::default().with_tls_server(peg_tls);
    peg_config.fast_open = true;
    let peg = Endpoint::bind((server_ip, Contender::PegFirst.port()), peg_config)
        .await
        .map_err(|e| VoipError::Config(format!("squarepeg endpoint: {e}")))?;
    // quinn, 0-RTT accepted.
    let mut quic_tls = (*tls.server()).clone();
    quic_tls.max_early_data_size = u32::MAX;
    quic_tls.alpn_protocols = vec![b"rpc".to_vec()];
    let quic_tls = quinn::crypto::rustls::QuicServerConfig::try_from(quic_tls)
        .map_err(|e| VoipError::Config(format!("quinn server: {e}")))?;
    let quinn_server = quinn::Endpoint::server(
        quinn::ServerConfig::with_crypto(Arc::new(quic_tls)),
        SocketAddr::new(server_ip, Contender::QuinnFirst.port()),
    )
    .map_err(VoipError::io("quinn endpoint"))?;
    let _ = ready.send(());

    let a = answer.clone();
    let tcp_task = async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            let _ = s.set_nodelay(true);
            let a = a.clone();
            tokio::spawn(async move {
                let mut req = vec![0u8; request_bytes];
                if s.read_exact(&mut req).await.is_ok() && s.write_all(&a).await.is_ok() {
                    let _ = s.read(&mut req).await;
                }
            });
        }
    };
    let a = answer.clone();
    let tls_task = async move {
        while let Ok((s, _)) = tls_listener.accept().await {
            let _ = s.set_nodelay(true);
            let (a, acceptor) = (a.clone(), acceptor.clone());
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(s).await else {
                    return;
                };
                let mut req = vec![0u8; request_bytes];
                if s.read_exact(&mut req).await.is_ok() && s.write_all(&a).await.is_ok() {
                    let _ = s.flush().await;
                    let _ = s.read(&mut req).await;
                    let _ = s.shutdown().await;
                }
            });
        }
    };
    let a = answer.clone();
    let peg_task = async move {
        while let Ok(conn) = peg.accept().await {
            let (a, requests) = (a.clone(), peg_requests.clone());
            tokio::spawn(async move {
                while conn.recv_message().await.is_ok() {
                    requests.fetch_add(1, Ordering::SeqCst);
                    if conn
                        .send_message(a.to_vec(), MessageProps::default())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    };
    let a = answer.clone();
    let quinn_task = async move {
        while let Some(incoming) = quinn_server.accept().await {
            let a = a.clone();
            tokio::spawn(async move {
                let Ok(connecting) = incoming.accept() else {
                    return;
                };
                // Take 0-RTT data at once (the request is replayable by contract here).
                let conn = match connecting.into_0rtt() {
                    Ok((conn, _)) => conn,
                    Err(connecting) => match connecting.await {
                        Ok(conn) => conn,
                        Err(_) => return,
                    },
                };
                if let Ok((mut send, mut recv)) = conn.accept_bi().await
                    && recv.read_to_end(1 << 20).await.is_ok()
                    && send.write_all(&a).await.is_ok()
                {
                    let _ = send.finish();
                    conn.closed().await;
                }
            });
        }
    };
    tokio::join!(tcp_task, tls_task, peg_task, quinn_task);
    Ok(())
}

/// The client's side of one transaction; returns when the answer is in.
struct Clients<'a> {
    tls: Arc<Tls>,
    server_ip: IpAddr,
    request: Vec<u8>,
    answer_bytes: usize,
    /// The returning squarepeg client (tickets in its configuration).
    peg: Transactor,
    /// The userspace TCP's stack at the client (Fast Open on) and the configuration of the
    /// returning squarepeg client over it (tickets in its TLS configuration).
    utcp: Option<(&'a squarepeg::Stack, ConnectionConfig)>,
    /// The returning quinn client (tickets in its endpoint's configuration).
    quinn: quinn::Endpoint,
}

fn peg_transactor(tls: &Tls) -> Result<Transactor, VoipError> {
    let config = ConnectionConfig::default().with_tls_client(tls.client(), tls.server_name.clone());
    Transactor::new(config, TransportProperties::transaction())
        .map_err(|e| VoipError::Config(e.to_string()))
}

fn quinn_client(tls: &Tls) -> Result<quinn::Endpoint, VoipError> {
    let mut crypto = (*tls.client()).clone();
    crypto.enable_early_data = true;
    crypto.alpn_protocols = vec![b"rpc".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(crypto)
        .map_err(|e| VoipError::Config(format!("quinn client: {e}")))?;
    let mut endpoint = quinn::Endpoint::client(SocketAddr::new(
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        0,
    ))
    .map_err(VoipError::io("quinn client endpoint"))?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    Ok(endpoint)
}

fn failed(what: &str) -> impl FnOnce(String) -> VoipError + '_ {
    move |e| VoipError::Config(format!("{what}: {e}"))
}

impl Clients<'_> {
    /// Runs one transaction; returns when the answer was in (closes may follow).
    async fn transact(&self, c: Contender) -> Result<Instant, VoipError> {
        let server = SocketAddr::new(self.server_ip, c.port());
        let mut answer = vec![0u8; self.answer_bytes];
        match c {
            Contender::Tcp => {
                let mut s = tokio::net::TcpStream::connect(server)
                    .await
                    .map_err(VoipError::io("tcp connect"))?;
                s.set_nodelay(true).map_err(VoipError::io("nodelay"))?;
                s.write_all(&self.request)
                    .await
                    .map_err(VoipError::io("tcp request"))?;
                s.read_exact(&mut answer)
                    .await
                    .map_err(VoipError::io("tcp answer"))?;
                Ok(Instant::now())
            }
            Contender::TcpTls => {
                let s = tokio::net::TcpStream::connect(server)
                    .await
                    .map_err(VoipError::io("tls connect"))?;
                s.set_nodelay(true).map_err(VoipError::io("nodelay"))?;
                // A fresh configuration: no ticket, a full handshake.
                let connector = tokio_rustls::TlsConnector::from(self.tls.client());
                let name = rustls::pki_types::ServerName::try_from(self.tls.server_name.clone())
                    .map_err(|e| failed("server name")(e.to_string()))?;
                let mut s = connector
                    .connect(name, s)
                    .await
                    .map_err(VoipError::io("tls handshake"))?;
                s.write_all(&self.request)
                    .await
                    .map_err(VoipError::io("tls request"))?;
                s.flush().await.map_err(VoipError::io("tls flush"))?;
                s.read_exact(&mut answer)
                    .await
                    .map_err(VoipError::io("tls answer"))?;
                let answered = Instant::now();
                let _ = s.shutdown().await;
                Ok(answered)
            }
            Contender::PegFirst => {
                let fresh = peg_transactor(&self.tls)?;
                let got = fresh
                    .transact(server, self.request.clone())
                    .await
                    .map_err(|e| failed("squarepeg first contact")(e.to_string()))?;
                check_len(got.len(), self.answer_bytes)?;
                Ok(Instant::now())
            }
            Contender::PegReturn => {
                let got = self
                    .peg
                    .transact(server, self.request.clone())
                    .await
                    .map_err(|e| failed("squarepeg returning")(e.to_string()))?;
                check_len(got.len(), self.answer_bytes)?;
                Ok(Instant::now())
            }
            Contender::PegUtcpReturn => {
                let (stack, config) = self.utcp.as_ref().ok_or_else(|| {
                    VoipError::Config("no userspace TCP stack at the client".into())
                })?;
                let props = TransportProperties::transaction().message_props();
                let (conn, _) = squarepeg::Connection::connect_utcp_with_messages(
                    stack,
                    server,
                    config.clone(),
                    vec![(self.request.clone().into(), props)],
                )
                .await
                .map_err(|e| failed("squarepeg over the userspace TCP")(e.to_string()))?;
                let got = conn
                    .recv_message()
                    .await
                    .map_err(|e| failed("squarepeg over the userspace TCP")(e.to_string()))?;
                let answered = Instant::now();
                check_len(got.payload.len(), self.answer_bytes)?;
                // Dropping the last handle closes gracefully, in the background.
                drop(conn);
                Ok(answered)
            }
            Contender::QuinnFirst => {
                let fresh = quinn_client(&self.tls)?;
                let answered =
                    quinn_transact(&fresh, server, &self.tls.server_name, &self.request).await?;
                fresh.wait_idle().await;
                Ok(answered)
            }
            Contender::Quinn0Rtt => {
                quinn_transact(&self.quinn, server, &self.tls.server_name, &self.request).await
            }
        }
    }
}

fn check_len(got: usize, want: usize) -> Result<(), VoipError> {
    if got == want {
        Ok(())
    } else {
        Err(VoipError::Config(format!(
            "answer of {got} bytes, expected {want}"
        )))
    }
}

async fn quinn_transact(
    endpoint: &quinn::Endpoint,
    server: SocketAddr,
    name: &str,
    request: &[u8],
) -> Result<Instant, VoipError> {
    let connecting = endpoint
        .connect(server, name)
        .map_err(|e| failed("quinn connect")(e.to_string()))?;
    let conn = match connecting.into_0rtt() {
        Ok((conn, _accepted)) => conn,
        Err(connecting) => connecting
            .await
            .map_err(|e| failed("quinn handshake")(e.to_string()))?,
    };
    let (mut send, mut recv) = conn
        .open_bi()
        .await
        .map_err(|e| failed("quinn stream")(e.to_string()))?;
    send.write_all(request)
        .await
        .map_err(|e| failed("quinn request")(e.to_string()))?;
    send.finish()
        .map_err(|e| failed("quinn finish")(e.to_string()))?;
    recv.read_to_end(1 << 20)
        .await
        .map_err(|e| failed("quinn answer")(e.to_string()))?;
    let answered = Instant::now();
    conn.close(0u32.into(), b"");
    Ok(answered)
}

/// A packet of the client-side capture: its time, direction (up: towards the server), IP
/// length, TCP flags, the server's port, whether it is UDP (quinn), and the payload of a
/// client SYN with data.
struct Captured {
    t: Duration,
    up: bool,
    len: usize,
    flags: String,
    server_port: u16,
    udp: bool,
    syn_data: Option<Vec<u8>>,
}

fn read_capture(path: &Path, server_ip: IpAddr) -> Result<Vec<Captured>, VoipError> {
    let bytes =
        std::fs::read(path).map_err(VoipError::io(format!("reading {}", path.display())))?;
    let file = read_pcap(&bytes).map_err(|e| VoipError::Config(format!("capture: {e}")))?;
    let mut out = Vec::new();
    for r in &file.records {
        let p = &r.data;
        let Ok(ip) = parse_ip(p) else { continue };
        if ip.fragment || ip.total_len > p.len() {
            continue;
        }
        let t = ip.header_len;
        let port = |at: usize| u16::from_be_bytes([p[t + at], p[t + at + 1]]);
        let up = ip.dst == server_ip;
        if !up && ip.src != server_ip {
            continue;
        }
        match ip.protocol {
            6 => {
                let Ok(seg) = squarepeg_tcp::wire::parse_packet(p, false) else {
                    continue;
                };
                let mut flags = String::new();
                for (on, letter) in [
                    (seg.flags.syn(), 'S'),
                    (seg.flags.fin(), 'F'),
                    (seg.flags.rst(), 'R'),
                    (seg.flags.psh(), 'P'),
                    (seg.flags.ack(), 'A'),
                ] {
                    if on {
                        flags.push(letter);
                    }
                }
                let syn = seg.flags.syn() && !seg.flags.ack();
                out.push(Captured {
                    t: r.timestamp,
                    up,
                    len: seg.payload.len(),
                    flags,
                    server_port: if up { seg.dst.port() } else { seg.src.port() },
                    udp: false,
                    syn_data: (up && syn && !seg.payload.is_empty()).then(|| seg.payload.to_vec()),
                });
            }
            17 if ip.total_len >= t + 8 => out.push(Captured {
                t: r.timestamp,
                up,
                len: ip.total_len - t - 8,
                flags: String::new(),
                server_port: if up { port(2) } else { port(0) },
                udp: true,
                syn_data: None,
            }),
            _ => {}
        }
    }
    Ok(out)
}

/// One measured run: its time on the capture's clock (from before its first packet to after
/// its close) and its latency as the client measured it.
struct RunWindow {
    contender: Contender,
    run: u32,
    start: Duration,
    end: Duration,
    latency_ms: f64,
}

/// Runs the experiment on a fresh lab. `progress` gets a line per step.
pub fn run_lab(config: &RpcConfig, progress: &dyn Fn(&str)) -> Result<RpcReport, VoipError> {
    if config.runs == 0 || config.contenders.is_empty() {
        return Err(VoipError::Config("nothing to run".into()));
    }
    if config.request_bytes == 0 || config.answer_bytes == 0 {
        return Err(VoipError::Config(
            "request and answer need at least one byte".into(),
        ));
    }
    std::fs::create_dir_all(&config.capture_dir).map_err(VoipError::io(format!(
        "creating {}",
        config.capture_dir.display()
    )))?;
    let half = config.rtt / 2;
    let link = |d: Duration| -> Result<squarepeg_lab::model::LinkConfig, VoipError> {
        format!("delay={}us", d.as_micros())
            .parse()
            .map_err(|e| VoipError::Config(format!("link: {e}")))
    };
    let lab = Lab::start(
        LabConfig::new(&format!("sqrpc{}", std::process::id() % 10_000))
            .with_up(link(half)?)
            .with_down(link(config.rtt - half)?)
            .with_capture_dir(&config.capture_dir),
    )?;
    for ns in [lab.client(), lab.server()] {
        crate::write_sysctl(ns, "/proc/sys/net/ipv4/tcp_fastopen", "3")?;
    }
    let server_ip = lab.addresses().server(false);
    let tls = Arc::new(Tls {
        cert: config::self_signed(&[server_ip.to_string()])
            .map_err(|e| VoipError::Config(e.to_string()))?,
        server_name: server_ip.to_string(),
    });
    let peg_requests = Arc::new(AtomicU32::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server_ns = lab.server().try_clone()?;
    let (server_tls, server_requests) = (tls.clone(), peg_requests.clone());
    let (request_bytes, answer_bytes) = (config.request_bytes, config.answer_bytes);
    let server = std::thread::spawn(move || -> Result<(), VoipError> {
        server_ns.run(move || {
            runtime()?.block_on(async move {
                tokio::select! {
                    r = serve(server_ip, server_tls, answer_bytes, request_bytes, server_requests, ready_tx) => r,
                    _ = stop_rx => Ok(()),
                }
            })
        })?
    });
    if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
        drop(stop_tx);
        return Err(match server.join() {
            Ok(Err(e)) => e,
            _ => VoipError::Config("the servers did not start".into()),
        });
    }
    // Long enough for each run's close (FINs, QUIC's close) to be over before the next.
    let settle = config.rtt * 4 + Duration::from_millis(200);
    // The userspace TCP at the client, for its contender only.
    let stack = if config.contenders.contains(&Contender::PegUtcpReturn) {
        let mut stack_config = squarepeg_io::StackConfig::new([]);
        stack_config.connection.fast_open = true;
        Some(
            squarepeg_lab::stack::LabStack::attach(
                &lab,
                squarepeg_lab::net::Role::Client,
                stack_config,
                Some(1500),
            )
            .map_err(|e| VoipError::Transport(format!("userspace TCP at the client: {e}")))?,
        )
    } else {
        None
    };
    let stack_ref = stack.as_ref();
    let client_ns = lab.client().try_clone()?;
    let client_ns_name = lab.client().name().to_owned();
    let cfg = config.clone();
    let client_tls = tls.clone();
    let windows = client_ns.run(move || -> Result<Vec<RunWindow>, VoipError> {
        runtime()?.block_on(async move {
            let peg = peg_transactor(&client_tls)?;
            let utcp = stack_ref.map(|s| {
                let mut config = peg.config().clone();
                config.fast_open = true;
                (s.stack(), config)
            });
            let clients = Clients {
                tls: client_tls.clone(),
                server_ip,
                request: vec![0x5A; cfg.request_bytes],
                answer_bytes: cfg.answer_bytes,
                peg,
                utcp,
                quinn: quinn_client(&client_tls)?,
            };
            let mut windows = Vec::new();
            for &c in &cfg.contenders {
                // Warm-ups (not measured): the returning clients' tickets and cookie.
                match c {
                    Contender::PegReturn | Contender::PegUtcpReturn | Contender::Quinn0Rtt => {
                        clients.transact(c).await?;
                    }
                    _ => {}
                }
                tokio::time::sleep(settle).await;
                for run in 0..cfg.runs {
                    if matches!(c, Contender::Tcp | Contender::TcpTls | Contender::PegFirst) {
                        forget_server(&client_ns_name)?;
                    }
                    let wall = wall_now();
                    let start = Instant::now();
                    let latency = clients.transact(c).await?.duration_since(start);
                    tokio::time::sleep(settle).await;
                    // The window ends before anything else starts (the next contender's
                    // warm-up may use the same port).
                    windows.push(RunWindow {
                        contender: c,
                        run,
                        start: wall,
                        end: wall_now(),
                        latency_ms: latency.as_secs_f64() * 1e3,
                    });
                }
            }
            Ok(windows)
        })
    })??;
    let executed_before = peg_requests.load(Ordering::SeqCst);
    lab.flush_captures()?;
    let captured = read_capture(
        &capture_path(&config.capture_dir, CaptureSide::Client),
        server_ip,
    )?;

    let mut runs = Vec::new();
    for w in &windows {
        let (c, run, wall, end, latency_ms) = (w.contender, w.run, w.start, w.end, w.latency_ms);
        let packets: Vec<&Captured> = captured
            .iter()
            .filter(|p| p.t >= wall && p.t < end && p.server_port == c.port() && p.udp == c.udp())
            .collect();
        let first = packets.first().map_or(wall, |p| p.t);
        // The latency runs from the first packet on the wire (name resolution and socket
        // set-up before it are not the protocol's): the client's clock started a little
        // earlier, at most by the time to the first packet.
        let lead = first.saturating_sub(wall).as_secs_f64() * 1e3;
        let latency_ms = (latency_ms - lead).max(0.0);
        runs.push(RpcRun {
            contender: c,
            run,
            latency_ms,
            rtts: latency_ms / (config.rtt.as_secs_f64() * 1e3),
            segments: packets.len(),
            segments_up: packets.iter().filter(|p| p.up).count(),
            packets: packets
                .iter()
                .map(|p| RunPacket {
                    t_ms: p.t.saturating_sub(first).as_secs_f64() * 1e3,
                    up: p.up,
                    len: p.len,
                    flags: p.flags.clone(),
                })
                .collect(),
        });
    }

    // Replay the last returning squarepeg SYN's data on a new, ordinary connection.
    let syn_data = captured
        .iter()
        .rev()
        .find(|p| p.server_port == Contender::PegReturn.port() && p.syn_data.is_some())
        .and_then(|p| p.syn_data.clone());
    let mut replay = ReplayResult {
        attempted: syn_data.is_some(),
        bytes: syn_data.as_ref().map_or(0, Vec::len),
        server_answered: false,
        requests_executed: 0,
    };
    if let Some(data) = syn_data {
        progress("replaying the returning client's SYN data");
        let client_ns = lab.client().try_clone()?;
        let server = SocketAddr::new(server_ip, Contender::PegReturn.port());
        replay.server_answered = client_ns.run(move || -> Result<bool, VoipError> {
            runtime()?.block_on(async move {
                let mut s = tokio::net::TcpStream::connect(server)
                    .await
                    .map_err(VoipError::io("replay connect"))?;
                s.write_all(&data)
                    .await
                    .map_err(VoipError::io("replay write"))?;
                let mut buf = vec![0u8; 64 * 1024];
                let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
                    .await
                    .map(|r| r.unwrap_or(0))
                    .unwrap_or(0);
                // Time for the server to act on anything it took.
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(n > 0)
            })
        })??;
        replay.requests_executed = peg_requests.load(Ordering::SeqCst) - executed_before;
    }
    drop(stack);
    let _ = stop_tx.send(());
    match server.join() {
        Ok(r) => r?,
        Err(_) => return Err(VoipError::Config("the server thread panicked".into())),
    }
    lab.teardown()?;
    Ok(RpcReport {
        rtt_ms: config.rtt.as_secs_f64() * 1e3,
        request_bytes: config.request_bytes,
        answer_bytes: config.answer_bytes,
        runs,
        replay,
    })
}

/// The timeline of each contender's median run: the packets of the client's side of the
/// path against time in round trips, client's above the line, server's below, data filled
/// and bare segments hollow, the answer's arrival marked.
struct Timeline<'a> {
    report: &'a RpcReport,
}

impl Chart for Timeline<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), VoipError> {
        root.fill(&WHITE).map_err(plot_err)?;
        let rtt = self.report.rtt_ms;
        let rows: Vec<&RpcRun> = self
            .report
            .summary()
            .iter()
            .filter_map(|s| {
                self.report.runs.iter().find(|r| {
                    r.contender == s.contender && r.latency_ms.total_cmp(&s.latency_ms).is_eq()
                })
            })
            .collect();
        let x_max = rows
            .iter()
            .flat_map(|r| r.packets.iter().map(|p| p.t_ms / rtt))
            .fold(1.0f64, f64::max)
            .ceil()
            + 0.25;
        let names: Vec<&'static str> = rows.iter().map(|r| r.contender.name()).collect();
        let n = rows.len() as f64;
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!(
                    "one request and its answer, {rtt:.0} ms RTT: packets at the client (above: \
                     sent, below: received; filled: data)"
                ),
                (FONT, 20),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(110)
            .build_cartesian_2d(0f64..x_max, -0.6f64..(n - 0.4))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("time since the first packet (round trips)")
            .y_labels(rows.len().max(1))
            .y_label_formatter(&|y| {
                let i = y.round();
                if (y - i).abs() < 0.01 && i >= 0.0 {
                    names
                        .get(rows.len().saturating_sub(1 + i as usize))
                        .map_or(String::new(), |s| (*s).to_owned())
                } else {
                    String::new()
                }
            })
            .disable_y_mesh()
            .label_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        let up = RGBColor(31, 119, 180);
        let down = RGBColor(214, 39, 40);
        for (i, run) in rows.iter().enumerate() {
            let y = (rows.len() - 1 - i) as f64;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, y), (x_max, y)],
                    BLACK.mix(0.2),
                )))
                .map_err(plot_err)?;
            chart
                .draw_series(run.packets.iter().map(|p| {
                    let (dy, color) = if p.up { (0.18, up) } else { (-0.18, down) };
                    let style = if p.len > 0 {
                        color.filled()
                    } else {
                        color.stroke_width(2)
                    };
                    Circle::new((p.t_ms / rtt, y + dy), 5, style)
                }))
                .map_err(plot_err)?;
            let t = run.latency_ms / rtt;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(t, y - 0.4), (t, y + 0.4)],
                    BLACK.stroke_width(2),
                )))
                .map_err(plot_err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("answer: {t:.2} RTT, {} segments", run.segments),
                    (t + 0.05, y + 0.3),
                    (FONT, 13),
                )))
                .map_err(plot_err)?;
        }
        Ok(())
    }
}

/// Writes the timeline plot (`rpc-timeline.svg`/`.png`) into `dir`.
pub fn plot(dir: &Path, report: &RpcReport) -> Result<Vec<PathBuf>, VoipError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(VoipError::io(format!("creating {}", dir.display())))?;
    Ok(write_svg_and_png(&dir.join("rpc-timeline"), &Timeline { report })?.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contender_names_round_trip() {
        for c in Contender::ALL {
            assert_eq!(Contender::by_name(c.name()).unwrap(), c);
        }
        assert!(Contender::by_name("http3").is_err());
        assert_eq!(Contender::ALL.len(), 7);
    }

    #[test]
    fn summary_takes_medians() {
        let run = |c, run, latency_ms, segments| RpcRun {
            contender: c,
            run,
            latency_ms,
            rtts: latency_ms / 50.0,
            segments,
            segments_up: segments / 2,
            packets: Vec::new(),
        };
        let report = RpcReport {
            rtt_ms: 50.0,
            request_bytes: 100,
            answer_bytes: 100,
            runs: vec![
                run(Contender::Tcp, 0, 110.0, 10),
                run(Contender::Tcp, 1, 100.0, 9),
                run(Contender::Tcp, 2, 300.0, 12),
                run(Contender::PegReturn, 0, 52.0, 8),
            ],
            replay: ReplayResult {
                attempted: false,
                bytes: 0,
                server_answered: false,
                requests_executed: 0,
            },
        };
        let s = report.summary();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].contender, s[0].latency_ms, s[0].segments),
            (Contender::Tcp, 110.0, 10)
        );
        assert_eq!((s[1].contender, s[1].segments), (Contender::PegReturn, 8));
        assert!(report.table().contains("peg-return"));
    }
}
