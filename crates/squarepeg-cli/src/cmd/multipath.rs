//! The multipath options of `peg connect` and `peg listen`: one session over several TCP
//! connections (TLS 1.3 required), with steering and failover (docs/wire.md §7).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use squarepeg::{ListenAddress, MultipathOptions, PathAddress, PathPolicy};

use super::substrate::{Substrate, SubstrateArgs};

#[derive(Args, Debug, Default)]
pub struct MultipathArgs {
    /// One session over several TCP connections (needs --tls). `peg connect`: a further path,
    /// REMOTE or REMOTE@LOCAL_IP (the local address picks the interface); `peg listen`: a
    /// further address to listen on. Prefixed `utcp:`, over the userspace TCP (its device as
    /// for --substrate utcp; the first address follows --substrate), else over the kernel's.
    /// Repeat for more. Implies --multipath.
    #[arg(long = "path", value_name = "[utcp:]ADDR")]
    pub paths: Vec<String>,
    /// A multipath session even with one address (a listener takes joins; a client re-joins
    /// after its connection dies).
    #[arg(long)]
    pub multipath: bool,
    /// Which connection carries this side's messages and file: aggregate, lowest-rtt,
    /// round-robin, redundant or pinned:N (messages default to lowest-rtt, the file to
    /// aggregate).
    #[arg(long, value_parser = parse_steer)]
    pub steer: Option<PathPolicy>,
    /// A connection with data outstanding and no acknowledgement for this long is dead, and
    /// what it carried moves to the others (default 1s).
    #[arg(long, value_parser = super::parse_duration_arg)]
    pub path_timeout: Option<Duration>,
    /// How often every connection is probed (RTT and liveness; default 250ms).
    #[arg(long, value_parser = super::parse_duration_arg)]
    pub probe_interval: Option<Duration>,
}

impl MultipathArgs {
    pub fn enabled(&self) -> bool {
        self.multipath || !self.paths.is_empty()
    }

    /// A multipath session needs TLS.
    pub fn check(&self, config: &squarepeg::ConnectionConfig) -> anyhow::Result<()> {
        if config.tls.is_none() {
            bail!("a multipath session needs --tls (joins are TLS resumptions)");
        }
        Ok(())
    }

    pub fn options(&self) -> anyhow::Result<MultipathOptions> {
        let mut options = MultipathOptions::default();
        if let Some(t) = self.path_timeout {
            options.core.path_timeout = t;
        }
        if let Some(t) = self.probe_interval {
            options.core.probe_interval = t;
        }
        options
            .core
            .validate()
            .context("--path-timeout / --probe-interval")?;
        Ok(options)
    }

    /// Whether this is a multipath session with an address over the userspace TCP (the
    /// first one with `--substrate utcp`).
    pub fn uses_stack(&self, substrate: Substrate) -> bool {
        self.enabled()
            && (substrate == Substrate::Utcp
                || self
                    .paths
                    .iter()
                    .any(|p| split_tcp(p).is_ok_and(|(utcp, _)| utcp)))
    }

    /// The addresses, `first` then every --path, each with whether it runs over the
    /// userspace TCP.
    fn addresses<'a>(
        &'a self,
        first: &'a str,
        substrate: Substrate,
    ) -> impl Iterator<Item = anyhow::Result<(bool, &'a str)>> + 'a {
        std::iter::once(Ok((substrate == Substrate::Utcp, first)))
            .chain(self.paths.iter().map(|p| split_tcp(p)))
    }

    /// The client's paths: `first` then every --path, checked before any device is
    /// touched; those marked `true` go over the userspace TCP ([`on_stack`]).
    pub fn client_paths(
        &self,
        first: &str,
        substrate: &SubstrateArgs,
    ) -> anyhow::Result<Vec<(bool, PathAddress)>> {
        self.addresses(first, substrate.substrate)
            .map(|a| {
                let (utcp, text) = a?;
                let path = parse_path(text)?;
                if utcp {
                    if path.local.is_some() {
                        bail!(
                            "{text}: a path over the userspace TCP leaves from the stack's address"
                        );
                    }
                    super::stack::check_target(&substrate.stack, path.remote)?;
                }
                Ok((utcp, path))
            })
            .collect()
    }

    /// The listener's addresses: `first` then every --path, checked before any device is
    /// touched; those marked `true` are the userspace TCP's ([`on_stack`]).
    pub fn listen_addrs(
        &self,
        first: &str,
        substrate: &SubstrateArgs,
    ) -> anyhow::Result<Vec<(bool, ListenAddress)>> {
        self.addresses(first, substrate.substrate)
            .map(|a| {
                let (utcp, text) = a?;
                let addr: SocketAddr = text
                    .parse()
                    .with_context(|| format!("{text:?} is not an address (IP:PORT)"))?;
                if utcp {
                    substrate.stack.listen_addrs(addr)?;
                }
                Ok((utcp, ListenAddress::kernel(addr)))
            })
            .collect()
    }
}

/// Moves the addresses marked `true` onto the userspace TCP's `stack`.
pub fn on_stack<T>(
    addresses: Vec<(bool, T)>,
    stack: Option<&Arc<squarepeg_io::Stack>>,
    over_stack: impl Fn(Arc<squarepeg_io::Stack>, T) -> T,
) -> Vec<T> {
    addresses
        .into_iter()
        .map(|(utcp, a)| match (utcp, stack) {
            (true, Some(stack)) => over_stack(stack.clone(), a),
            _ => a,
        })
        .collect()
}

/// `utcp:ADDR`, `kernel:ADDR` or `ADDR` (the kernel's TCP): whether it is the userspace TCP's,
/// and the address.
fn split_tcp(text: &str) -> anyhow::Result<(bool, &str)> {
    if let Some(rest) = text.strip_prefix("utcp:") {
        return Ok((true, rest));
    }
    if let Some(rest) = text.strip_prefix("kernel:") {
        return Ok((false, rest));
    }
    if let Some((prefix, _)) = text.split_once(':')
        && !prefix.is_empty()
        && prefix.chars().all(|c| c.is_ascii_alphabetic())
    {
        bail!("{text}: unknown TCP {prefix:?} (utcp: or kernel:)");
    }
    Ok((false, text))
}

/// `REMOTE` or `REMOTE@LOCAL_IP`.
fn parse_path(text: &str) -> anyhow::Result<PathAddress> {
    let (remote, local) = match text.split_once('@') {
        Some((r, l)) => (r, Some(l)),
        None => (text, None),
    };
    let remote: SocketAddr = remote
        .parse()
        .with_context(|| format!("{remote:?} is not an address (IP:PORT)"))?;
    let local = match local {
        None => None,
        Some(l) => {
            let ip: IpAddr = l
                .parse()
                .with_context(|| format!("{l:?} is not an IP address"))?;
            if ip.is_ipv4() != remote.is_ipv4() {
                bail!("{text}: local and remote addresses of different families");
            }
            Some(SocketAddr::new(ip, 0))
        }
    };
    Ok(match local {
        Some(local) => PathAddress::from_local(local, remote),
        None => PathAddress::to(remote),
    })
}

pub(crate) fn parse_steer(text: &str) -> Result<PathPolicy, String> {
    Ok(match text {
        "aggregate" => PathPolicy::Aggregate,
        "lowest-rtt" => PathPolicy::LowestRtt,
        "round-robin" => PathPolicy::RoundRobin,
        "redundant" => PathPolicy::Redundant,
        other => match other.strip_prefix("pinned:").map(str::parse) {
            Some(Ok(n)) => PathPolicy::Pinned(n),
            _ => {
                return Err(format!(
                    "{other:?}: expected aggregate, lowest-rtt, round-robin, redundant or pinned:N"
                ));
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_policies_parse() {
        let p = parse_path("10.0.0.1:443@10.1.0.2").unwrap();
        assert_eq!(p.remote, "10.0.0.1:443".parse().unwrap());
        assert_eq!(p.local, Some("10.1.0.2:0".parse().unwrap()));
        assert_eq!(parse_path("[::1]:4433").unwrap().local, None);
        assert!(parse_path("10.0.0.1:443@::1").is_err());
        assert!(parse_path("nowhere").is_err());
        assert_eq!(
            split_tcp("utcp:10.0.0.1:443").unwrap(),
            (true, "10.0.0.1:443")
        );
        assert_eq!(split_tcp("kernel:[::1]:443").unwrap(), (false, "[::1]:443"));
        assert_eq!(split_tcp("[::1]:443").unwrap(), (false, "[::1]:443"));
        assert_eq!(split_tcp("10.0.0.1:443").unwrap(), (false, "10.0.0.1:443"));
        assert!(split_tcp("quic:10.0.0.1:443").is_err());
        assert_eq!(parse_steer("pinned:1"), Ok(PathPolicy::Pinned(1)));
        assert_eq!(parse_steer("redundant"), Ok(PathPolicy::Redundant));
        assert!(parse_steer("fastest").is_err());
    }
}
