//! The multipath options of `peg connect` and `peg listen`: one session over several TCP
//! connections (TLS 1.3 required), with steering and failover (docs/wire.md §7).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use squarepeg::{MultipathOptions, PathAddress, PathPolicy};

#[derive(Args, Debug, Default)]
pub struct MultipathArgs {
    /// One session over several TCP connections (needs --tls). `peg connect`: a further path,
    /// REMOTE or REMOTE@LOCAL_IP (the local address picks the interface); `peg listen`: a
    /// further address to listen on. Repeat for more. Implies --multipath.
    #[arg(long = "path", value_name = "ADDR")]
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

    /// A multipath session needs kernel TCP and TLS.
    pub fn check(
        &self,
        substrate: super::substrate::Substrate,
        config: &squarepeg::ConnectionConfig,
    ) -> anyhow::Result<()> {
        if substrate != super::substrate::Substrate::Kernel {
            bail!("a multipath session runs over kernel TCP (--substrate kernel)");
        }
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

    /// The client's paths: `first` then every --path.
    pub fn client_paths(&self, first: &str) -> anyhow::Result<Vec<PathAddress>> {
        std::iter::once(first)
            .chain(self.paths.iter().map(String::as_str))
            .map(parse_path)
            .collect()
    }

    /// The listener's addresses: `first` then every --path.
    pub fn listen_addrs(&self, first: &str) -> anyhow::Result<Vec<SocketAddr>> {
        std::iter::once(first)
            .chain(self.paths.iter().map(String::as_str))
            .map(|a| {
                a.parse()
                    .with_context(|| format!("{a:?} is not an address (IP:PORT)"))
            })
            .collect()
    }
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
        assert_eq!(parse_steer("pinned:1"), Ok(PathPolicy::Pinned(1)));
        assert_eq!(parse_steer("redundant"), Ok(PathPolicy::Redundant));
        assert!(parse_steer("fastest").is_err());
    }
}
