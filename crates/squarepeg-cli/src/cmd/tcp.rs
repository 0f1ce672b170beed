//! `peg tcp`: squarepeg's userspace TCP on a TUN device, by hand, so that anyone can talk to
//! it with nc, socat, curl or a script. Servers (`echo`, `sink`, `source`) listen on the
//! stack's addresses; clients (`send`, `recv`) connect to the kernel side. `setup` and
//! `teardown` manage a persistent device for users without root; `--setup` on any verb makes a
//! device for the run and removes it on exit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use squarepeg_io::{HostSetup, TcpStream};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::stack::{RunningStack, StackArgs, check_target};

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
    /// After Ctrl-C, how long the connections in progress may take to finish before they
    /// are abandoned (a second Ctrl-C abandons them at once).
    #[arg(long, default_value = "10s", value_parser = super::parse_duration_arg)]
    grace: Duration,
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
        // Let the connections in progress finish, for at most the grace period: a silent peer
        // must not hold the exit for ever.
        if !tasks.is_empty() {
            eprintln!(
                "waiting up to {:?} for {} connection(s) to finish; Ctrl-C again abandons them",
                a.grace,
                tasks.len()
            );
        }
        let deadline = tokio::time::sleep(a.grace);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = tasks.join_next() => if next.is_none() { break },
                _ = tokio::signal::ctrl_c() => break,
                _ = &mut deadline => break,
            }
        }
        if !tasks.is_empty() {
            eprintln!("abandoned {} connection(s)", tasks.len());
            tasks.abort_all();
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

async fn connect(
    running: &RunningStack,
    to: SocketAddr,
    timeout: u64,
) -> anyhow::Result<TcpStream> {
    let limit = Duration::from_secs(timeout);
    super::connect_within(
        to,
        limit,
        super::THROUGH_DEVICE,
        running.stack().connect(to),
    )
    .await
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
    let to_stdout = a.file.as_os_str() == "-";
    if !to_stdout {
        check_writable(&a.file)?;
    }
    let mut running = a.stack.start()?;
    let quiet = a.stack.quiet;
    let result = rt.block_on(async {
        let conn = connect(&running, a.from, a.connect_timeout).await?;
        let started = Instant::now();
        // The file is created (and an existing one truncated) only once the first byte or a
        // clean end of stream arrives: a refused or reset connection leaves it as it was.
        let mut conn = tokio::io::BufReader::new(conn);
        conn.fill_buf().await?;
        let mut output: Box<dyn AsyncWrite + Unpin + Send> = if to_stdout {
            Box::new(tokio::io::stdout())
        } else {
            Box::new(tokio::fs::File::from_std(
                std::fs::File::create(&a.file)
                    .with_context(|| format!("creating {}", a.file.display()))?,
            ))
        };
        let bar = progress_bar(quiet, None, "receiving");
        let (total, digest) = copy_hashing(&mut conn, &mut output, &bar).await?;
        let mut conn = conn.into_inner();
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

/// Fails early, before any device is made, if `file` surely cannot be written: an existing file
/// not open for writing (opened without truncating it), or a missing directory.
fn check_writable(file: &std::path::Path) -> anyhow::Result<()> {
    if file.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .with_context(|| format!("opening {}", file.display()))?;
    } else {
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        ensure!(
            dir.is_dir(),
            "creating {}: no directory {}",
            file.display(),
            dir.display()
        );
    }
    Ok(())
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
}
