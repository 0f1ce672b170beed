//! What `peg listen` and `peg connect` do once connected: each stdin line
//! is sent as a message, received messages are printed as
//! `[substream N #number] text`, and files travel over streams with a
//! progress bar and their SHA-256 printed on both ends.
//!
//! A file stream carries `name length (u16, big-endian) ‖ name (UTF-8) ‖
//! size (u64, big-endian) ‖ bytes`, then FIN. The receiver answers on the same
//! stream with one line, `ok SHA256-HEX` once the file is stored (or hashed),
//! or `error REASON` (then it stops reading), and FIN: the sender reports
//! success only for a matching `ok`.
//!
//! The connecting side closes the connection gracefully once stdin ends and
//! its file is sent; the listening side stops sending at the end of its
//! stdin and runs until the peer closes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use squarepeg::{
    Connection, ConnectionConfig, ConnectionError, MessageProps, MessageStatus, Priority, Stream,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Options shared by `listen` and `connect`.
#[derive(Args, Debug, Clone)]
pub struct PeerArgs {
    /// Sub-stream id of the messages sent from stdin.
    #[arg(long, default_value_t = 0)]
    pub substream: u64,
    /// Urgency of the messages sent, 0 (most urgent) to 7 (least).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub priority: u8,
    /// Lifetime of each message in milliseconds: a message not yet handed to
    /// the kernel by then is dropped (and reported on stderr).
    #[arg(long)]
    pub lifetime_ms: Option<u64>,
    /// Send this file over a stream, with progress, and print its SHA-256.
    #[arg(long)]
    pub send_file: Option<PathBuf>,
    /// Store files the peer sends in this directory (without it they are
    /// hashed and discarded).
    #[arg(long)]
    pub recv_dir: Option<PathBuf>,
    /// Do not read stdin.
    #[arg(long)]
    pub no_stdin: bool,
    /// Close the connection (and fail) once nothing has been sent or received for this long
    /// (e.g. 30s): a silent peer does not hold the command for ever.
    #[arg(long, value_parser = super::parse_duration_arg)]
    pub idle_timeout: Option<Duration>,
    /// No progress bars (set from `--quiet`, which the substrate options carry).
    #[arg(skip)]
    pub quiet: bool,
    /// In a multipath session: which connection carries messages and the file.
    #[arg(skip)]
    pub steer: Option<squarepeg::PathPolicy>,
    /// Kernel unsent-queue bound in bytes (TCP_NOTSENT_LOWAT); 0 leaves the
    /// system default.
    #[arg(long, default_value_t = 64 * 1024)]
    pub notsent_lowat: u32,
}

impl PeerArgs {
    /// Refuses, before any connection, a file to send that cannot be read and a directory
    /// for received files that is not one.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(path) = &self.send_file {
            std::fs::File::open(path).with_context(|| format!("--send-file {}", path.display()))?;
            if !path.is_file() {
                bail!("--send-file {}: not a regular file", path.display());
            }
        }
        if let Some(dir) = &self.recv_dir
            && !dir.is_dir()
        {
            bail!(
                "--recv-dir {}: not a directory (create it first)",
                dir.display()
            );
        }
        Ok(())
    }

    pub fn connection_config(&self) -> ConnectionConfig {
        let mut config = ConnectionConfig::default();
        config.notsent_lowat = (self.notsent_lowat > 0).then_some(self.notsent_lowat);
        config
    }

    fn props(&self) -> MessageProps {
        MessageProps {
            substream: self.substream,
            priority: Priority::new(self.priority).unwrap_or_default(),
            lifetime: self.lifetime_ms.map(Duration::from_millis),
            path: self.steer,
            ..MessageProps::default()
        }
    }
}

fn progress(len: u64, quiet: bool, what: String) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what);
    bar
}

/// How long an abort may take to reach the peer before the process exits anyway.
pub const ABORT_FLUSH: Duration = Duration::from_secs(2);

/// Whether a close is a normal end of the conversation.
fn normal_close(e: &ConnectionError) -> bool {
    matches!(
        e,
        ConnectionError::LocallyClosed | ConnectionError::ApplicationClosed { code: 0, .. }
    )
}

/// Runs the conversation on `conn`. The `initiator` (the connecting side)
/// closes the connection once its stdin and file are done; the other side
/// runs until the peer closes.
pub async fn run_peer(conn: Connection, args: PeerArgs, initiator: bool) -> anyhow::Result<()> {
    let printer = tokio::spawn(print_messages(conn.clone()));
    let statuses = tokio::spawn(report_statuses(conn.clone()));
    let acceptor = tokio::spawn(accept_files(
        conn.clone(),
        args.recv_dir.clone(),
        args.quiet,
    ));
    let local = async {
        let file = async {
            if let Some(path) = &args.send_file {
                send_file(&conn, path, args.quiet, args.steer).await?;
            }
            anyhow::Ok(())
        };
        let lines = async {
            if !args.no_stdin {
                send_stdin(&conn, args.props()).await?;
            }
            anyhow::Ok(())
        };
        let (f, l) = tokio::join!(file, lines);
        f.and(l)
    };
    // The watchdog closes an idle connection, which ends everything below.
    let idled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = args.idle_timeout.map(|limit| {
        let (conn, idled) = (conn.clone(), idled.clone());
        tokio::spawn(async move {
            idle_for(&conn, limit).await;
            idled.store(true, std::sync::atomic::Ordering::Relaxed);
            conn.close().await;
        })
    });
    tokio::select! {
        r = local => {
            if let Err(e) = r {
                conn.abort(1, format!("{e:#}").as_bytes());
                // The abort (with why) reaches the peer before this process ends, which
                // would otherwise close the socket with it still queued.
                let _ = tokio::time::timeout(ABORT_FLUSH, conn.closed()).await;
                return Err(e);
            }
            if initiator {
                conn.close().await;
            }
        }
        _ = conn.closed() => {}
    }
    // The printer ends after the last message that arrived before the close. The reason is
    // the connection's final one: a graceful close may still turn into an error when the
    // peer's end shows it never took part (`TransportError::NothingReceived`).
    let printed = printer.await?;
    let reason = conn.close_reason().unwrap_or(printed);
    let files = acceptor.await?;
    statuses.await?;
    if let Some(w) = watchdog {
        w.abort();
    }
    if let Some(limit) = args.idle_timeout
        && idled.load(std::sync::atomic::Ordering::Relaxed)
    {
        bail!("nothing sent or received for {limit:?} (--idle-timeout): closed the connection");
    }
    if !normal_close(&reason) {
        bail!("connection closed: {reason}");
    }
    if matches!(reason, ConnectionError::ApplicationClosed { .. }) {
        eprintln!("peer closed the connection");
    }
    files
}

/// Resolves with `limit` once no frame has been sent or received for `limit`.
async fn idle_for(conn: &Connection, limit: Duration) -> Duration {
    let frames = || {
        let s = conn.stats().session;
        s.frames_sent + s.frames_received
    };
    let mut last = frames();
    let mut since = tokio::time::Instant::now();
    let tick = (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(tick).await;
        let now = frames();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= limit {
            return limit;
        }
    }
}

async fn send_stdin(conn: &Connection, props: MessageProps) -> anyhow::Result<()> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        conn.send_message(line.into_bytes(), props.clone()).await?;
    }
    Ok(())
}

async fn print_messages(conn: Connection) -> ConnectionError {
    let mut out = tokio::io::stdout();
    loop {
        match conn.recv_message().await {
            Ok(m) => {
                let text = String::from_utf8_lossy(&m.payload);
                let line = format!("[substream {} #{}] {}\n", m.substream, m.number, text);
                if out.write_all(line.as_bytes()).await.is_err() {
                    return ConnectionError::LocallyClosed;
                }
                let _ = out.flush().await;
            }
            Err(e) => return e,
        }
    }
}

async fn report_statuses(conn: Connection) {
    while let Ok((number, status)) = conn.next_message_status().await {
        match status {
            MessageStatus::Sent => {}
            other => eprintln!("message #{number}: {other:?}"),
        }
    }
}

async fn send_file(
    conn: &Connection,
    path: &Path,
    quiet: bool,
    steer: Option<squarepeg::PathPolicy>,
) -> anyhow::Result<()> {
    let mut file = tokio::fs::File::open(path)
        .await
        .with_context(|| format!("opening {}", path.display()))?;
    let size = file.metadata().await?.len();
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("file name is not UTF-8")?
        .to_string();
    if name.len() > usize::from(u16::MAX) {
        bail!("file name too long");
    }
    let mut stream = conn.open_stream().await?;
    if let Some(steer) = steer {
        stream.set_path(steer)?;
    }
    let mut header = Vec::new();
    header.extend_from_slice(&(name.len() as u16).to_be_bytes());
    header.extend_from_slice(name.as_bytes());
    header.extend_from_slice(&size.to_be_bytes());
    stream.write_all(&header).await?;
    let bar = progress(size, quiet, format!("sending {name}"));
    let copied = super::copy_hashing(&mut file, &mut stream, &bar).await;
    let copied = match copied {
        Ok(c) => stream
            .shutdown()
            .await
            .map(|()| c)
            .map_err(anyhow::Error::from),
        Err(e) => Err(e),
    };
    // The receiver's verdict, also after a failed write (it stops reading when it cannot
    // store the file, and says why first).
    let verdict = read_verdict(&mut stream).await;
    bar.finish_and_clear();
    let theirs = match verdict {
        Ok(Verdict::Refused(why)) => bail!("the peer could not take {name}: {why}"),
        Ok(Verdict::Taken(theirs)) => Ok(theirs),
        Err(e) => Err(e.context(format!("the peer did not confirm {name}"))),
    };
    let (sent, digest) = copied?;
    if sent != size {
        bail!(
            "{} changed while being sent ({sent} of {size} bytes)",
            path.display()
        );
    }
    let digest = hex::encode(digest);
    let theirs = theirs?;
    if theirs != digest {
        bail!("the peer received {name} with sha256 {theirs}, sent {digest}");
    }
    println!("sent {name} ({sent} bytes) sha256 {digest}");
    Ok(())
}

/// What the receiver of a file says back on its stream once it has it (or cannot take it):
/// `ok SHA256-HEX` or `error REASON`, one line.
enum Verdict {
    Taken(String),
    Refused(String),
}

/// Longest verdict line read.
const MAX_VERDICT: u64 = 4096;

async fn read_verdict(stream: &mut Stream) -> anyhow::Result<Verdict> {
    let mut line = Vec::new();
    stream
        .take(MAX_VERDICT)
        .read_to_end(&mut line)
        .await
        .context("reading the receiver's verdict")?;
    let line = String::from_utf8_lossy(&line);
    let line = line.trim_end();
    if let Some(digest) = line.strip_prefix("ok ") {
        Ok(Verdict::Taken(digest.to_string()))
    } else if let Some(why) = line.strip_prefix("error ") {
        Ok(Verdict::Refused(why.to_string()))
    } else if line.is_empty() {
        bail!("the stream ended without a verdict")
    } else {
        bail!("unexpected verdict {line:?}")
    }
}

async fn accept_files(conn: Connection, dir: Option<PathBuf>, quiet: bool) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    while let Ok(stream) = conn.accept_stream().await {
        let dir = dir.clone();
        tasks.push(tokio::spawn(receive_file(stream, dir, quiet)));
    }
    let mut result = Ok(());
    for t in tasks {
        if let Err(e) = t.await? {
            eprintln!("receiving a file failed: {e:#}");
            result = Err(e);
        }
    }
    result
}

/// Receives one file and tells the sender how it went (see [`Verdict`]).
async fn receive_file(mut stream: Stream, dir: Option<PathBuf>, quiet: bool) -> anyhow::Result<()> {
    let result = store_file(&mut stream, dir, quiet).await;
    let verdict = match &result {
        Ok(digest) => format!("ok {digest}\n"),
        Err(e) => format!("error {e:#}\n"),
    };
    // Best effort: the sender may be gone.
    let _ = stream.write_all(verdict.as_bytes()).await;
    if result.is_err() {
        // Nothing more is read: the sender's writes fail, and it reads the verdict.
        let _ = stream.stop(FILE_REFUSED);
    }
    let _ = stream.shutdown().await;
    result.map(|_| ())
}

/// The STOP_SENDING code of a file the receiver could not take.
const FILE_REFUSED: u64 = 1;

/// Reads a file from `stream` into `dir` (or hashes it); returns its SHA-256 in hex.
async fn store_file(
    stream: &mut Stream,
    dir: Option<PathBuf>,
    quiet: bool,
) -> anyhow::Result<String> {
    let name_len = stream.read_u16().await.context("file header")?;
    let mut name = vec![0u8; usize::from(name_len)];
    stream.read_exact(&mut name).await.context("file header")?;
    let name = String::from_utf8(name).context("file name is not UTF-8")?;
    let size = stream.read_u64().await.context("file header")?;
    // Only the last path component: a peer must not write outside DIR.
    let safe = Path::new(&name)
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .with_context(|| format!("unusable file name {name:?}"))?
        .to_string();
    let mut file = match &dir {
        Some(d) => {
            let path = d.join(&safe);
            let file = tokio::fs::File::create(&path)
                .await
                .with_context(|| format!("creating {}", path.display()))?;
            Some(file)
        }
        None => None,
    };
    let bar = progress(size, quiet, format!("receiving {safe}"));
    let (got, digest) = match &mut file {
        Some(f) => {
            let copied = super::copy_hashing(&mut *stream, f, &bar).await?;
            f.flush().await?;
            copied
        }
        None => super::copy_hashing(&mut *stream, &mut tokio::io::sink(), &bar).await?,
    };
    bar.finish_and_clear();
    if got != size {
        bail!("{safe}: received {got} of {size} bytes");
    }
    let digest = hex::encode(digest);
    println!("received {safe} ({got} bytes) sha256 {digest}");
    Ok(digest)
}
