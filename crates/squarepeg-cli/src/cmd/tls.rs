//! `--tls` for `peg listen` and `peg connect`: TLS 1.3 with squarepeg's record layer
//! (`squarepeg::tls`), over kernel TCP or the userspace TCP (`--substrate utcp`: numbered
//! records, opened out of order).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use squarepeg::ConnectionConfig;
use squarepeg::tls::config::{self, Trust, fingerprint_hex, parse_fingerprint};

/// TLS options of `peg listen`.
#[derive(Args, Debug, Clone, Default)]
pub struct ListenTlsArgs {
    /// Run TLS 1.3. Without --cert/--key a self-signed certificate is made for this run and
    /// its SHA-256 fingerprint printed (give it to `peg connect --pin`).
    #[arg(long)]
    pub tls: bool,
    /// The certificate chain, PEM (leaf first).
    #[arg(long, requires_all = ["tls", "key"])]
    pub cert: Option<PathBuf>,
    /// The certificate's private key, PEM.
    #[arg(long, requires_all = ["tls", "cert"])]
    pub key: Option<PathBuf>,
}

/// TLS options of `peg connect`.
#[derive(Args, Debug, Clone, Default)]
pub struct ConnectTlsArgs {
    /// Run TLS 1.3, checking the server's certificate against the system's trusted roots
    /// unless --ca, --pin or --insecure says otherwise.
    #[arg(long)]
    pub tls: bool,
    /// Trust the certificate authorities in this PEM file instead of the system's.
    #[arg(long, requires = "tls", conflicts_with_all = ["pin", "insecure"])]
    pub ca: Option<PathBuf>,
    /// Accept only the certificate with this SHA-256 fingerprint (64 hex digits, colons
    /// allowed), as `peg listen --tls` prints it.
    #[arg(long, requires = "tls", conflicts_with = "insecure")]
    pub pin: Option<String>,
    /// Accept any certificate: encrypted, but not authenticated (labs only).
    #[arg(long, requires = "tls")]
    pub insecure: bool,
    /// The name the server's certificate must carry (default: the host in ADDR).
    #[arg(long, requires = "tls")]
    pub server_name: Option<String>,
}

impl ListenTlsArgs {
    /// Adds the server side of TLS to `config`; `addr` names the self-signed certificate.
    pub fn apply(&self, config: ConnectionConfig, addr: &str) -> anyhow::Result<ConnectionConfig> {
        if !self.tls {
            return Ok(config);
        }
        let (cert, key) = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => (
                std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?,
                std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
            ),
            _ => {
                let mut names = vec!["localhost".to_string()];
                if let Some(host) = host_of(addr)
                    && host != "localhost"
                {
                    names.push(host);
                }
                let made = config::self_signed(&names)?;
                eprintln!(
                    "TLS: self-signed certificate for {}; SHA-256 fingerprint {}",
                    names.join(", "),
                    fingerprint_hex(&made.fingerprint)
                );
                (made.cert_pem.into_bytes(), made.key_pem.into_bytes())
            }
        };
        let what = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => format!(
                "TLS certificate {} and key {}",
                cert.display(),
                key.display()
            ),
            _ => "the self-signed TLS certificate".to_string(),
        };
        let server = config::server_config(&cert, &key).context(what)?;
        Ok(config.with_tls_server(server))
    }
}

impl ConnectTlsArgs {
    /// Adds the client side of TLS to `config`, for a server at `addr`.
    pub fn apply(&self, config: ConnectionConfig, addr: &str) -> anyhow::Result<ConnectionConfig> {
        if !self.tls {
            return Ok(config);
        }
        let trust = if self.insecure {
            Trust::Insecure
        } else if let Some(pin) = &self.pin {
            Trust::PinnedSha256(parse_fingerprint(pin)?)
        } else if let Some(ca) = &self.ca {
            Trust::CaPem(std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?)
        } else {
            Trust::SystemRoots
        };
        let Some(name) = self.server_name.clone().or_else(|| host_of(addr)) else {
            bail!("cannot tell the server's name from {addr:?}: give --server-name");
        };
        let client = config::client_config(trust)?;
        Ok(config.with_tls_client(client, name))
    }
}

/// The host part of `HOST:PORT` or `[V6]:PORT`.
fn host_of(addr: &str) -> Option<String> {
    let (host, _port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_string())
}

/// What the TLS handshake settled, for stderr.
pub fn describe(conn: &squarepeg::Connection) -> Option<String> {
    let info = conn.tls_info()?;
    Some(format!(
        "TLS 1.3, {}{}{}",
        info.cipher_suite,
        info.peer_certificate_sha256
            .map(|f| format!(", peer certificate {}", fingerprint_hex(&f)))
            .unwrap_or_default(),
        if info.resumed { ", resumed" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts() {
        assert_eq!(host_of("127.0.0.1:4433").as_deref(), Some("127.0.0.1"));
        assert_eq!(host_of("[::1]:4433").as_deref(), Some("::1"));
        assert_eq!(host_of("example.com:443").as_deref(), Some("example.com"));
        assert_eq!(host_of("4433"), None);
    }
}
