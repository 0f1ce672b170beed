//! `peg bench tls`: bulk transfer over loopback inside TLS 1.3 with one cipher suite, side by
//! side in one run: squarepeg over kernel TCP (its own record layer after rustls's handshake),
//! tokio-rustls over kernel TCP, quinn with its defaults over UDP, and raw kernel TCP without
//! crypto as the reference line.
//!
//! Both ends of every transfer run in this process, on one tokio runtime with two worker
//! threads (`--workers`), each end in a task of its own; the main thread only waits. (With the
//! receiving end on the main thread, as `peg bench messages` runs it, a third thread would
//! share the two cores.) Throughput is the receiver's, from the first write to the last byte
//! read; CPU is the whole process's (user + system, getrusage) over the same time, so it
//! covers both ends, the drivers and the kernel's work on the loopback path. The handshake and
//! the set-up are outside the timing.
//!
//! Every contender sends the same bytes: a pseudo-random pattern whose period (a prime) no
//! write or read size divides. The receiver compares each read with what is due at its offset,
//! so a contender that loses, repeats or moves bytes fails instead of looking fast; the
//! comparison costs every contender the same.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use serde::Serialize;
use squarepeg::tls::config::{self, Trust};
use squarepeg::tls::rustls::crypto::ring::cipher_suite;
use squarepeg::tls::rustls::{self, SupportedCipherSuite};
use squarepeg::{Bytes, Connection, ConnectionConfig, Endpoint, MessageProps};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::tcp::bytes_bar;
use crate::cmd::tcp::parse_bytes;

/// Bytes per write of every contender (squarepeg's message size in `--squarepeg-bulk
/// messages`), and per read.
const WRITE_SIZE: usize = 64 * 1024;
const READ_SIZE: usize = 64 * 1024;

/// The name the self-signed certificate is made for and the clients ask for.
const SERVER_NAME: &str = "localhost";

#[derive(Args, Debug)]
pub struct TlsBenchArgs {
    /// Bytes per transfer (K, M, G suffixes).
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    bytes: u64,
    /// Runs per contender, taken in turn; the best run counts (throughput and CPU each at
    /// their best).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The TLS 1.3 cipher suite every contender is held to.
    #[arg(long, value_enum, default_value_t = SuiteChoice::Aes128)]
    suite: SuiteChoice,
    /// How squarepeg moves the bytes: one stream (written and read as `AsyncWrite` /
    /// `AsyncRead`), or messages of the write size.
    #[arg(long, value_enum, default_value_t = Bulk::Stream)]
    squarepeg_bulk: Bulk,
    /// Which contenders to run.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Contender::Squarepeg, Contender::TokioRustls, Contender::Quinn,
                              Contender::RawTcp])]
    contenders: Vec<Contender>,
    /// Worker threads of the tokio runtime both ends run on.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum SuiteChoice {
    /// TLS13_AES_128_GCM_SHA256.
    Aes128,
    /// TLS13_AES_256_GCM_SHA384.
    Aes256,
    /// TLS13_CHACHA20_POLY1305_SHA256.
    Chacha20,
}

impl SuiteChoice {
    fn suite(self) -> SupportedCipherSuite {
        match self {
            SuiteChoice::Aes128 => cipher_suite::TLS13_AES_128_GCM_SHA256,
            SuiteChoice::Aes256 => cipher_suite::TLS13_AES_256_GCM_SHA384,
            SuiteChoice::Chacha20 => cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Bulk {
    Stream,
    Messages,
}

/// The transports `peg bench tls` puts side by side.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Contender {
    /// squarepeg over kernel TCP with TLS (`squarepeg::Connection`).
    Squarepeg,
    /// tokio-rustls over kernel TCP.
    TokioRustls,
    /// quinn over loopback UDP, one unidirectional stream, quinn's default transport settings.
    Quinn,
    /// Kernel TCP without TLS: the reference line.
    RawTcp,
}

impl Contender {
    fn label(self, bulk: Bulk) -> &'static str {
        match (self, bulk) {
            (Contender::Squarepeg, Bulk::Stream) => "squarepeg (TLS/TCP, stream)",
            (Contender::Squarepeg, Bulk::Messages) => "squarepeg (TLS/TCP, 64K messages)",
            (Contender::TokioRustls, _) => "tokio-rustls (TLS/TCP)",
            (Contender::Quinn, _) => "quinn (QUIC/UDP, defaults)",
            (Contender::RawTcp, _) => "raw TCP (no crypto)",
        }
    }
}

// ------------------------------------------------------------------ the bytes sent

/// The bytes every contender sends, cyclic with a prime period that no write or read size
/// divides; stored one write longer than the period so that any write is one slice.
struct Pattern {
    bytes: Bytes,
}

const PERIOD: usize = 65_521;

impl Pattern {
    fn new() -> Pattern {
        // xorshift64: any bytes that are not constant will do.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut bytes: Vec<u8> = (0..PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let tail: Vec<u8> = bytes
            .iter()
            .copied()
            .cycle()
            .take(WRITE_SIZE.max(READ_SIZE))
            .collect();
        bytes.extend_from_slice(&tail);
        Pattern {
            bytes: Bytes::from(bytes),
        }
    }

    /// The `len` bytes (at most a write) due at stream offset `offset`.
    fn at(&self, offset: u64, len: usize) -> Bytes {
        let start = (offset % PERIOD as u64) as usize;
        self.bytes.slice(start..start + len)
    }

    /// Whether `data` is what is due at stream offset `offset`.
    fn matches(&self, mut offset: u64, data: &[u8]) -> bool {
        data.chunks(WRITE_SIZE.max(READ_SIZE)).all(|chunk| {
            let start = (offset % PERIOD as u64) as usize;
            offset += chunk.len() as u64;
            chunk == &self.bytes[start..start + chunk.len()]
        })
    }
}

/// The receiving end's account: bytes, whether each was the one due, progress.
struct Received<'a> {
    pattern: &'a Pattern,
    bytes: u64,
    intact: bool,
    bar: &'a ProgressBar,
}

impl<'a> Received<'a> {
    fn new(pattern: &'a Pattern, bar: &'a ProgressBar) -> Self {
        Self {
            pattern,
            bytes: 0,
            intact: true,
            bar,
        }
    }

    fn take(&mut self, data: &[u8]) {
        if self.intact && !self.pattern.matches(self.bytes, data) {
            self.intact = false;
        }
        self.bytes += data.len() as u64;
        self.bar.set_position(self.bytes);
    }

    fn check(&self, expected: u64, who: &str) -> anyhow::Result<()> {
        ensure!(
            self.bytes == expected,
            "{who}: received {} of {expected} bytes",
            self.bytes
        );
        ensure!(self.intact, "{who}: received bytes differ from those sent");
        Ok(())
    }
}

/// Sends `bytes` of the pattern in writes of [`WRITE_SIZE`].
async fn write_pattern<W: AsyncWrite + Unpin>(
    out: &mut W,
    pattern: &Pattern,
    bytes: u64,
) -> std::io::Result<()> {
    let mut offset = 0;
    while offset < bytes {
        let n = (bytes - offset).min(WRITE_SIZE as u64) as usize;
        out.write_all(&pattern.at(offset, n)).await?;
        offset += n as u64;
    }
    Ok(())
}

/// Reads to the end in reads of [`READ_SIZE`].
async fn read_to_end<R: AsyncRead + Unpin>(
    input: &mut R,
    received: &mut Received<'_>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; READ_SIZE];
    loop {
        let n = input.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        received.take(&buf[..n]);
    }
}

// ------------------------------------------------------------------ measurements

/// One transfer: receiver's time and the process's CPU time over it.
#[derive(Clone, Copy)]
struct Run {
    elapsed: Duration,
    cpu: Duration,
}

/// Starts the clocks of a transfer.
struct Clocks {
    wall: Instant,
    cpu: Duration,
}

impl Clocks {
    fn start() -> Self {
        Self {
            cpu: squarepeg::bench::process_cpu(),
            wall: Instant::now(),
        }
    }

    fn stop(self) -> Run {
        let elapsed = self.wall.elapsed();
        Run {
            elapsed,
            cpu: squarepeg::bench::process_cpu().saturating_sub(self.cpu),
        }
    }
}

/// The rustls configurations of one run, for one suite, trusting one self-signed certificate
/// by its fingerprint. squarepeg needs secret extraction (its record layer takes the traffic
/// secrets); the rivals get the same configurations without it.
struct TlsConfigs {
    suite: SupportedCipherSuite,
    squarepeg_client: Arc<rustls::ClientConfig>,
    squarepeg_server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

impl TlsConfigs {
    fn new(suite: SupportedCipherSuite) -> anyhow::Result<Self> {
        let cert = config::self_signed(&[SERVER_NAME.into()])?;
        let squarepeg_server = config::server_config_with_suites(
            cert.cert_pem.as_bytes(),
            cert.key_pem.as_bytes(),
            &[suite],
        )?;
        let squarepeg_client =
            config::client_config_with_suites(Trust::PinnedSha256(cert.fingerprint), &[suite])?;
        let mut client = (*squarepeg_client).clone();
        client.enable_secret_extraction = false;
        let mut server = (*squarepeg_server).clone();
        server.enable_secret_extraction = false;
        Ok(Self {
            suite,
            squarepeg_client,
            squarepeg_server,
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    fn check_suite(
        &self,
        negotiated: Option<SupportedCipherSuite>,
        who: &str,
    ) -> anyhow::Result<()> {
        ensure!(
            negotiated.map(|s| s.suite()) == Some(self.suite.suite()),
            "{who} negotiated {:?}, not {:?}",
            negotiated.map(|s| s.suite()),
            self.suite.suite()
        );
        Ok(())
    }
}

/// squarepeg over kernel TCP with TLS: one stream, or messages of [`WRITE_SIZE`].
async fn squarepeg_transfer(
    bytes: u64,
    bulk: Bulk,
    tls: &TlsConfigs,
    pattern: &Arc<Pattern>,
    bar: &ProgressBar,
) -> anyhow::Result<Run> {
    let server_config = ConnectionConfig::default().with_tls_server(tls.squarepeg_server.clone());
    let client_config =
        ConnectionConfig::default().with_tls_client(tls.squarepeg_client.clone(), SERVER_NAME);
    let endpoint = Endpoint::bind("127.0.0.1:0", server_config).await?;
    let addr = endpoint.local_addr()?;
    let (client, server) =
        tokio::join!(Connection::connect(addr, client_config), endpoint.accept());
    let (client, server) = (client?, server?);
    server.established().await?;
    let suite = client.tls_info().map(|i| i.cipher_suite);
    ensure!(
        suite.as_deref() == Some(format!("{:?}", tls.suite.suite()).as_str()),
        "squarepeg negotiated {suite:?}, not {:?}",
        tls.suite.suite()
    );
    let mut received = Received::new(pattern, bar);
    let clocks = Clocks::start();
    let run = match bulk {
        Bulk::Stream => {
            let mut stream = client.open_stream().await?;
            let p = pattern.clone();
            let sender = tokio::spawn(async move {
                write_pattern(&mut stream, &p, bytes).await?;
                stream.shutdown().await?;
                anyhow::Ok(stream)
            });
            let mut incoming = server.accept_stream().await?;
            read_to_end(&mut incoming, &mut received).await?;
            let run = clocks.stop();
            drop(sender.await??);
            run
        }
        Bulk::Messages => {
            let (sending, p) = (client.clone(), pattern.clone());
            let sender = tokio::spawn(async move {
                let mut offset = 0;
                while offset < bytes {
                    let n = (bytes - offset).min(WRITE_SIZE as u64) as usize;
                    sending
                        .send_message(p.at(offset, n), MessageProps::default())
                        .await?;
                    offset += n as u64;
                }
                anyhow::Ok(())
            });
            while received.bytes < bytes {
                let m = server.recv_message().await?;
                received.take(&m.payload);
            }
            let run = clocks.stop();
            sender.await??;
            run
        }
    };
    tokio::join!(client.close(), server.close());
    received.check(bytes, "squarepeg")?;
    Ok(run)
}

/// A connected pair of loopback TCP sockets (Nagle off, as squarepeg sets it).
async fn tcp_pair() -> anyhow::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let (client, (server, _)) = (client?, server?);
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

/// Sends from `client` in a spawned task, reads `server` to its end here.
async fn stream_transfer<C, S>(
    mut client: C,
    mut server: S,
    bytes: u64,
    pattern: &Arc<Pattern>,
    bar: &ProgressBar,
    who: &str,
) -> anyhow::Result<Run>
where
    C: AsyncWrite + Unpin + Send + 'static,
    S: AsyncRead + Unpin,
{
    let mut received = Received::new(pattern, bar);
    let clocks = Clocks::start();
    let p = pattern.clone();
    let sender = tokio::spawn(async move {
        write_pattern(&mut client, &p, bytes).await?;
        // Over TLS: close_notify, then the FIN.
        client.shutdown().await?;
        anyhow::Ok(client)
    });
    read_to_end(&mut server, &mut received).await?;
    let run = clocks.stop();
    drop(sender.await??);
    received.check(bytes, who)?;
    Ok(run)
}

/// tokio-rustls over kernel TCP.
async fn tokio_rustls_transfer(
    bytes: u64,
    tls: &TlsConfigs,
    pattern: &Arc<Pattern>,
    bar: &ProgressBar,
) -> anyhow::Result<Run> {
    let (client, server) = tcp_pair().await?;
    let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME)?;
    let (client, server) = tokio::join!(connector.connect(name, client), acceptor.accept(server));
    let (client, server) = (client?, server?);
    tls.check_suite(client.get_ref().1.negotiated_cipher_suite(), "tokio-rustls")?;
    stream_transfer(client, server, bytes, pattern, bar, "tokio-rustls").await
}

/// Raw kernel TCP.
async fn raw_tcp_transfer(
    bytes: u64,
    pattern: &Arc<Pattern>,
    bar: &ProgressBar,
) -> anyhow::Result<Run> {
    let (client, server) = tcp_pair().await?;
    stream_transfer(client, server, bytes, pattern, bar, "raw TCP").await
}

/// quinn over loopback UDP with its default endpoint and transport settings; the rustls
/// configurations hold it to the suite. QUIC's Initial packets are always AES-128-GCM
/// (RFC 9001 §5.2), whatever suite the handshake then agrees on.
async fn quinn_transfer(
    bytes: u64,
    tls: &TlsConfigs,
    pattern: &Arc<Pattern>,
    bar: &ProgressBar,
) -> anyhow::Result<Run> {
    use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
    let initial = cipher_suite::TLS13_AES_128_GCM_SHA256
        .tls13()
        .and_then(|s| s.quic_suite())
        .context("the ring provider's AES-128-GCM has no QUIC suite")?;
    let server_crypto = QuicServerConfig::with_initial(tls.server.clone(), initial)?;
    let client_crypto = QuicClientConfig::with_initial(tls.client.clone(), initial)?;
    let server = quinn::Endpoint::server(
        quinn::ServerConfig::with_crypto(Arc::new(server_crypto)),
        "127.0.0.1:0".parse()?,
    )?;
    let addr = server.local_addr()?;
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    client.set_default_client_config(quinn::ClientConfig::new(Arc::new(client_crypto)));
    let connecting = client.connect(addr, SERVER_NAME)?;
    // The server's handshake runs only once the incoming connection is awaited.
    let accepting = async {
        let incoming = server.accept().await.context("quinn endpoint closed")?;
        anyhow::Ok(incoming.await?)
    };
    let (client_conn, server_conn) = tokio::join!(connecting, accepting);
    let (client_conn, server_conn) = (client_conn?, server_conn?);
    let mut received = Received::new(pattern, bar);
    let clocks = Clocks::start();
    let mut send = client_conn.open_uni().await?;
    let p = pattern.clone();
    let sender = tokio::spawn(async move {
        write_pattern(&mut send, &p, bytes).await?;
        send.finish()?;
        anyhow::Ok(send)
    });
    let mut recv = server_conn.accept_uni().await?;
    let mut buf = vec![0u8; READ_SIZE];
    while let Some(n) = recv.read(&mut buf).await? {
        received.take(&buf[..n]);
    }
    let run = clocks.stop();
    drop(sender.await??);
    drop((recv, server_conn));
    client_conn.close(0u32.into(), b"done");
    tokio::join!(client.wait_idle(), server.wait_idle());
    received.check(bytes, "quinn")?;
    Ok(run)
}

// ------------------------------------------------------------------ report

/// A contender's runs, in round order: throughput and CPU per GiB of each.
#[derive(Clone, Default)]
struct Runs(Vec<Best>);

/// One run's figures, or a contender's best (throughput and CPU per GiB, each at its best).
#[derive(Clone, Copy)]
struct Best {
    bytes_per_second: f64,
    cpu_seconds_per_gib: f64,
}

impl Runs {
    fn add(&mut self, run: Run, bytes: u64) {
        let gib = bytes as f64 / f64::from(1u32 << 30);
        self.0.push(Best {
            bytes_per_second: bytes as f64 / run.elapsed.as_secs_f64(),
            cpu_seconds_per_gib: run.cpu.as_secs_f64() / gib,
        });
    }

    fn best(&self) -> Best {
        Best {
            bytes_per_second: self
                .0
                .iter()
                .map(|b| b.bytes_per_second)
                .fold(0.0, f64::max),
            cpu_seconds_per_gib: self
                .0
                .iter()
                .map(|b| b.cpu_seconds_per_gib)
                .fold(f64::INFINITY, f64::min),
        }
    }

    /// The median over rounds of this contender's ratio to `rival` in the same round: load
    /// on the machine that changes from one minute to the next hits both sides of each
    /// ratio alike, which the ratio of two bests does not cancel.
    fn paired(&self, rival: &Runs) -> Option<Ratio> {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            (n > 0).then(|| {
                if n % 2 == 1 {
                    v[n / 2]
                } else {
                    (v[n / 2 - 1] + v[n / 2]) / 2.0
                }
            })
        };
        let pairs = self.0.iter().zip(&rival.0);
        Some(Ratio {
            throughput: median(
                pairs
                    .clone()
                    .map(|(a, b)| a.bytes_per_second / b.bytes_per_second)
                    .collect(),
            )?,
            cpu: median(
                pairs
                    .map(|(a, b)| b.cpu_seconds_per_gib / a.cpu_seconds_per_gib)
                    .collect(),
            )?,
        })
    }
}

/// A row over a rival: > 1 favours the row in both.
#[derive(Clone, Copy, Debug, Serialize)]
struct Ratio {
    /// The row's throughput over the rival's.
    throughput: f64,
    /// The rival's CPU seconds per GiB over the row's.
    cpu: f64,
}

#[derive(Debug, Serialize)]
struct Row {
    contender: Contender,
    label: &'static str,
    bytes_per_second: f64,
    gbit_per_second: f64,
    /// CPU seconds (user + system, both ends) per GiB moved.
    cpu_seconds_per_gib: f64,
    ratio_to_rustls: Option<Ratio>,
    ratio_to_quinn: Option<Ratio>,
    /// The median over rounds of the ratio within each round (both contenders run back to
    /// back in every round).
    paired_to_rustls: Option<Ratio>,
    paired_to_quinn: Option<Ratio>,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    suite: String,
    bytes: u64,
    runs: usize,
    squarepeg_bulk: Bulk,
    write_size: usize,
    read_size: usize,
    cpus: usize,
    /// Worker threads of the runtime both ends ran on.
    workers: usize,
    /// How to read the ratios.
    ratios: &'static str,
    rows: Vec<Row>,
}

const RATIOS: &str = "ratio_to_rustls and ratio_to_quinn: throughput is the row's over the rival's, \
                      cpu is the rival's CPU seconds per GiB over the row's, each of the best runs; \
                      paired_to_rustls and paired_to_quinn: the median over rounds of the same \
                      ratios within a round; above 1 favours the row";

impl Report {
    fn new(a: &TlsBenchArgs, runs: &[(Contender, Runs)]) -> Report {
        let bests: Vec<(Contender, Best)> = runs.iter().map(|(c, r)| (*c, r.best())).collect();
        let rival = |who: Contender| bests.iter().find(|(c, _)| *c == who).map(|(_, b)| *b);
        let rival_runs = |who: Contender| runs.iter().find(|(c, _)| *c == who).map(|(_, r)| r);
        let ratio = |row: &Best, rival: Option<Best>| {
            rival.map(|r| Ratio {
                throughput: row.bytes_per_second / r.bytes_per_second,
                cpu: r.cpu_seconds_per_gib / row.cpu_seconds_per_gib,
            })
        };
        let (rustls, quinn) = (rival(Contender::TokioRustls), rival(Contender::Quinn));
        let rows = bests
            .iter()
            .zip(runs)
            .map(|((c, b), (_, own))| Row {
                contender: *c,
                label: c.label(a.squarepeg_bulk),
                bytes_per_second: b.bytes_per_second,
                gbit_per_second: b.bytes_per_second * 8.0 / 1e9,
                cpu_seconds_per_gib: b.cpu_seconds_per_gib,
                ratio_to_rustls: ratio(b, rustls),
                ratio_to_quinn: ratio(b, quinn),
                paired_to_rustls: rival_runs(Contender::TokioRustls).and_then(|r| own.paired(r)),
                paired_to_quinn: rival_runs(Contender::Quinn).and_then(|r| own.paired(r)),
            })
            .collect();
        Report {
            bench: "tls",
            suite: format!("{:?}", a.suite.suite().suite()),
            bytes: a.bytes,
            runs: a.runs,
            squarepeg_bulk: a.squarepeg_bulk,
            write_size: WRITE_SIZE,
            read_size: READ_SIZE,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            workers: a.workers.max(1),
            ratios: RATIOS,
            rows,
        }
    }

    fn print(&self) {
        println!(
            "{:<34} {:>7} {:>9} | {:>8} {:>8} | {:>8} {:>8}",
            "contender", "Gbit/s", "CPU s/GiB", "÷rustls", "÷quinn", "CPU÷rus", "CPU÷qui"
        );
        let show = |x: Option<f64>| x.map_or_else(|| "-".into(), |v| format!("{v:.2}×"));
        for r in &self.rows {
            println!(
                "{:<34} {:>7.2} {:>9.3} | {:>8} {:>8} | {:>8} {:>8}",
                r.label,
                r.gbit_per_second,
                r.cpu_seconds_per_gib,
                show(r.ratio_to_rustls.map(|x| x.throughput)),
                show(r.ratio_to_quinn.map(|x| x.throughput)),
                show(r.ratio_to_rustls.map(|x| x.cpu)),
                show(r.ratio_to_quinn.map(|x| x.cpu)),
            );
        }
        if self.runs > 1 && self.rows.iter().any(|r| r.paired_to_rustls.is_some()) {
            println!(
                "paired: the median over the {} rounds of the ratio within each round",
                self.runs
            );
            for r in &self.rows {
                println!(
                    "{:<34} {:>7} {:>9} | {:>8} {:>8} | {:>8} {:>8}",
                    r.label,
                    "",
                    "",
                    show(r.paired_to_rustls.map(|x| x.throughput)),
                    show(r.paired_to_quinn.map(|x| x.throughput)),
                    show(r.paired_to_rustls.map(|x| x.cpu)),
                    show(r.paired_to_quinn.map(|x| x.cpu)),
                );
            }
        }
        println!(
            "{}, {} bytes per transfer over loopback, best of {} runs, {} CPUs, {} tokio \
             workers; {}-byte writes, {}-byte reads. CPU is the whole process's (both ends). ÷rustls, ÷quinn: throughput \
             over tokio-rustls's, quinn's; CPU÷: their CPU per GiB over the row's (above 1 \
             favours the row).",
            self.suite,
            self.bytes,
            self.runs,
            self.cpus,
            self.workers,
            self.write_size,
            self.read_size
        );
    }
}

pub fn run(a: TlsBenchArgs) -> anyhow::Result<()> {
    ensure!(a.bytes > 0, "--bytes must be positive");
    ensure!(a.runs > 0, "--runs must be positive");
    ensure!(!a.contenders.is_empty(), "--contenders: give at least one");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.workers.max(1))
        .enable_all()
        .build()?;
    let tls = Arc::new(TlsConfigs::new(a.suite.suite())?);
    let pattern = Arc::new(Pattern::new());
    let mut runs: Vec<(Contender, Runs)> = Vec::new();
    for &c in &a.contenders {
        if !runs.iter().any(|(seen, _)| *seen == c) {
            runs.push((c, Runs::default()));
        }
    }
    // The contenders in turn within each round, so that load on the machine hits all alike.
    for round in 1..=a.runs {
        for (contender, done) in runs.iter_mut() {
            let label = contender.label(a.squarepeg_bulk);
            let bar = bytes_bar(a.quiet, a.bytes, format!("{label}, run {round}/{}", a.runs));
            let (contender, bytes, bulk) = (*contender, a.bytes, a.squarepeg_bulk);
            let (tls, pattern, shown) = (tls.clone(), pattern.clone(), bar.clone());
            // The receiving end runs in a task too, as the sending end does: both on the
            // runtime's two workers, none on this thread, which only waits.
            let transfer = rt.spawn(async move {
                let (tls, pattern, bar) = (&*tls, &pattern, &shown);
                match contender {
                    Contender::Squarepeg => {
                        squarepeg_transfer(bytes, bulk, tls, pattern, bar).await
                    }
                    Contender::TokioRustls => tokio_rustls_transfer(bytes, tls, pattern, bar).await,
                    Contender::Quinn => quinn_transfer(bytes, tls, pattern, bar).await,
                    Contender::RawTcp => raw_tcp_transfer(bytes, pattern, bar).await,
                }
            });
            let run = rt.block_on(transfer)?;
            bar.finish_and_clear();
            done.add(run.with_context(|| label.to_string())?, a.bytes);
        }
    }
    let report = Report::new(&a, &runs);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(figures: &[(f64, f64)]) -> Runs {
        Runs(
            figures
                .iter()
                .map(|&(bytes_per_second, cpu_seconds_per_gib)| Best {
                    bytes_per_second,
                    cpu_seconds_per_gib,
                })
                .collect(),
        )
    }

    /// The paired ratio is the median of the rounds' own ratios, not the ratio of the bests:
    /// a round where the machine was quiet for one contender only does not decide it.
    #[test]
    fn paired_ratio_is_the_median_of_each_rounds_ratio() {
        let row = runs(&[(9.0, 1.0), (5.0, 2.0), (8.0, 1.0)]);
        let rival = runs(&[(10.0, 1.0), (5.0, 1.0), (16.0, 0.5)]);
        let best = row.best();
        assert_eq!(
            (best.bytes_per_second, best.cpu_seconds_per_gib),
            (9.0, 1.0)
        );
        let paired = row.paired(&rival).expect("rounds");
        // Throughput ratios 0.9, 1.0, 0.5; CPU (rival over row) 1.0, 0.5, 0.5.
        assert_eq!(paired.throughput, 0.9);
        assert_eq!(paired.cpu, 0.5);
        // Even count: the mean of the middle two.
        let paired = runs(&[(1.0, 1.0), (3.0, 1.0)])
            .paired(&runs(&[(1.0, 1.0), (1.0, 1.0)]))
            .expect("rounds");
        assert_eq!(paired.throughput, 2.0);
        assert!(Runs::default().paired(&rival).is_none());
    }
}
