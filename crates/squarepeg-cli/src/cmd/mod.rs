//! One module per `peg` verb.

pub mod bench;
pub mod connect;
pub mod demo;
pub mod failover_lab;
mod interrupt;
pub mod lab;
pub mod listen;
pub mod multipath;
mod peer;
pub mod priority;
pub mod stack;
pub mod substrate;
pub mod tcp;
pub mod tls;
pub mod transfer_lab;
pub mod tunnel;
pub mod tunnel_lab;
pub mod voip;

/// Copies `r` to `w` until the end of `r`, counting on `bar`; returns the bytes and their
/// SHA-256 (what `peg` prints on both ends of a transfer).
pub(crate) async fn copy_hashing(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(u64, [u8; 32])> {
    use sha2::{Digest, Sha256};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        w.write_all(&buf[..n]).await?;
        total += n as u64;
        bar.set_position(total);
    }
    Ok((total, hash.finalize().into()))
}

/// A duration argument (`20ms`, `5s`, `1m`) for clap.
pub(crate) fn parse_duration_arg(text: &str) -> Result<std::time::Duration, String> {
    squarepeg_lab::units::parse_duration(text).map_err(|e| e.to_string())
}

/// What to check when a connection through a TUN device gets no answer.
pub(crate) const THROUGH_DEVICE: &str =
    "is the route through the device right? is the peer's firewall open?";

/// Awaits `connecting` (a connection to `to`) for at most `limit`; `hint` says what to check
/// when nothing answers.
pub(crate) async fn connect_within<T, E>(
    to: impl std::fmt::Display,
    limit: std::time::Duration,
    hint: &str,
    connecting: impl Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    use anyhow::Context;
    tokio::time::timeout(limit, connecting)
        .await
        .map_err(|_| anyhow::anyhow!("connecting to {to}: no answer in {limit:?} ({hint})"))?
        .with_context(|| format!("connecting to {to}"))
}

/// Runs one step of a lab experiment under a spinner labelled `label` (plain lines on
/// standard error when it is no terminal; nothing with `quiet_json`), handing `run` the
/// progress callback the experiments take.
pub(crate) fn with_progress<T>(
    label: &str,
    quiet_json: bool,
    run: impl FnOnce(&dyn Fn(&str)) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let plain = quiet_json || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = if plain {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {prefix}: {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    };
    bar.set_prefix(label.to_owned());
    let progress = |what: &str| {
        if plain {
            if !quiet_json {
                eprintln!("{label}: {what}");
            }
        } else {
            bar.set_message(what.to_owned());
        }
    };
    let result = run(&progress);
    bar.finish_and_clear();
    result
}

/// The end of every lab experiment: writes `value` as `<out>/<file>` and, unless `no_plots`,
/// the plots `plots` draws; then prints the JSON (`json`) or `table` on standard output and
/// what was written on standard error.
pub(crate) fn write_experiment(
    out: &std::path::Path,
    file: &str,
    value: &serde_json::Value,
    (json, no_plots): (bool, bool),
    plots: impl FnOnce() -> anyhow::Result<Vec<std::path::PathBuf>>,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join(file);
    std::fs::write(&path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let mut files = vec![path];
    if !no_plots {
        files.extend(plots().context("plotting")?);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", table());
        eprintln!("wrote {} files under {}", files.len(), out.display());
    }
    Ok(())
}
