//! The host configuration around a tunnel device, as `wg-quick` does it: the device's
//! addresses, routes into the tunnel, and a default route through it that excludes the
//! tunnel's own path. Routes through the device disappear with the device (the process
//! created it, so it goes when the process exits, however it exits); the one route this
//! module adds elsewhere — the host route that keeps the server reachable outside the
//! tunnel — is removed when the [`HostConfig`] is dropped, as are the server's forwarding
//! and masquerading ([`HostConfig::nat`]).

use std::net::IpAddr;
use std::process::Command;

use thiserror::Error;

use crate::control::Assigned;
use crate::pool::Subnet;

/// A configuration command that failed.
#[derive(Debug, Error)]
#[error("`ip {args}` failed: {message}")]
pub struct SetupError {
    /// The arguments of `ip`.
    pub args: String,
    /// What it said.
    pub message: String,
}

/// Runs `ip ARGS`; returns its standard output.
fn ip(args: &[&str]) -> Result<String, SetupError> {
    let fail = |message: String| SetupError {
        args: args.join(" "),
        message,
    };
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| fail(format!("running ip (is iproute2 installed?): {e}")))?;
    if !out.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `nft ARGS`.
fn nft(args: &[&str]) -> Result<(), SetupError> {
    let fail = |message: String| SetupError {
        args: format!("(nft) {}", args.join(" ")),
        message,
    };
    let out = Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| fail(format!("running nft (is nftables installed?): {e}")))?;
    if !out.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// One thing to undo.
#[derive(Debug)]
enum Undo {
    /// `ip ARGS`.
    Ip(Vec<String>),
    /// `nft delete table inet NAME`.
    NftTable(String),
    /// Write the old value back to a sysctl file.
    Sysctl { path: String, old: String },
}

/// What was configured outside the device, undone on drop.
#[derive(Debug, Default)]
pub struct HostConfig {
    undo: Vec<Undo>,
}

impl HostConfig {
    /// Nothing configured yet.
    pub fn new() -> HostConfig {
        HostConfig::default()
    }

    /// Gives device `dev` the local side of each address (`server` is the local side on the
    /// server, `client` on a client) with its subnet's prefix.
    pub fn addresses(
        &mut self,
        dev: &str,
        assigned: &[Assigned],
        server_side: bool,
    ) -> Result<(), SetupError> {
        for a in assigned {
            let local = if server_side { a.server } else { a.client };
            let with_prefix = format!("{local}/{}", a.prefix_len);
            let mut args = vec![family(local), "addr", "add", &with_prefix, "dev", dev];
            if local.is_ipv6() {
                // A point-to-point tunnel needs no duplicate address detection, which would
                // hold the address back for a second or more.
                args.push("nodad");
            }
            ip(&args)?;
        }
        if !assigned.iter().any(|a| a.client.is_ipv6()) {
            // No IPv6 in the tunnel: keep the kernel from sending link-local IPv6 (router
            // solicitations) into it, which the peer would only drop. Where IPv6 is off
            // altogether the file is missing, which is as good.
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
        }
        Ok(())
    }

    /// Routes `subnet` into device `dev`.
    pub fn route(&mut self, dev: &str, subnet: &Subnet) -> Result<(), SetupError> {
        ip(&[
            family(subnet.network()),
            "route",
            "add",
            &subnet.to_string(),
            "dev",
            dev,
        ])?;
        Ok(())
    }

    /// Sends everything of `families` (the client's tunnel addresses) through `dev` except
    /// the traffic to `server`, which keeps the path it has now: a host route to `server`
    /// over today's route, then the two halves of the address space into the device (more
    /// specific than any default route, which stays untouched — OpenVPN's `def1`).
    pub fn default_route(
        &mut self,
        dev: &str,
        server: IpAddr,
        families: &[Assigned],
    ) -> Result<(), SetupError> {
        let current = ip(&["route", "get", &server.to_string()])?;
        let (via, out_dev) = parse_route_get(&current).ok_or_else(|| SetupError {
            args: format!("route get {server}"),
            message: format!("no route to the server in `{}`", current.trim()),
        })?;
        let host = format!("{server}/{}", if server.is_ipv4() { 32 } else { 128 });
        let mut args = vec![family(server), "route", "replace", host.as_str()];
        if let Some(via) = &via {
            args.extend(["via", via.as_str()]);
        }
        args.extend(["dev", out_dev.as_str()]);
        ip(&args)?;
        self.undo.push(Undo::Ip(
            [family(server), "route", "del", host.as_str()]
                .into_iter()
                .map(String::from)
                .collect(),
        ));
        for a in families {
            let halves = if a.client.is_ipv4() {
                ["0.0.0.0/1", "128.0.0.0/1"]
            } else {
                ["::/1", "8000::/1"]
            };
            for half in halves {
                ip(&[family(a.client), "route", "add", half, "dev", dev])?;
            }
        }
        Ok(())
    }
}

impl HostConfig {
    /// Lets the clients of `subnets` (on device `dev`) reach beyond the server, as a home
    /// router does: turns on forwarding for their families and masquerades what they send out
    /// of any other interface (an nftables table of this process's own, `peg_tunnel_PID`).
    /// Both are undone on drop (forwarding to the value it had).
    pub fn nat(&mut self, dev: &str, subnets: &[Subnet]) -> Result<(), SetupError> {
        let table = format!("peg_tunnel_{}", std::process::id());
        nft(&["add", "table", "inet", &table])?;
        self.undo.push(Undo::NftTable(table.clone()));
        nft(&[
            "add",
            "chain",
            "inet",
            &table,
            "post",
            "{ type nat hook postrouting priority srcnat; policy accept; }",
        ])?;
        for s in subnets {
            let (key, path) = if s.network().is_ipv4() {
                ("ip", "/proc/sys/net/ipv4/ip_forward")
            } else {
                ("ip6", "/proc/sys/net/ipv6/conf/all/forwarding")
            };
            let subnet = s.to_string();
            nft(&[
                "add",
                "rule",
                "inet",
                &table,
                "post",
                key,
                "saddr",
                &subnet,
                "oifname",
                "!=",
                dev,
                "masquerade",
            ])?;
            let fail = |e: std::io::Error| SetupError {
                args: format!("(sysctl) {path}"),
                message: e.to_string(),
            };
            let old = std::fs::read_to_string(path).map_err(fail)?;
            if old.trim() != "1" {
                std::fs::write(path, "1").map_err(fail)?;
                self.undo.push(Undo::Sysctl {
                    path: path.to_string(),
                    old: old.trim().to_string(),
                });
            }
        }
        Ok(())
    }
}

impl Drop for HostConfig {
    fn drop(&mut self) {
        for undo in self.undo.drain(..).rev() {
            let result = match &undo {
                Undo::Ip(args) => {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    ip(&args).map(drop)
                }
                Undo::NftTable(name) => nft(&["delete", "table", "inet", name]),
                Undo::Sysctl { path, old } => std::fs::write(path, old).map_err(|e| SetupError {
                    args: format!("(sysctl) {path}"),
                    message: e.to_string(),
                }),
            };
            if let Err(e) = result {
                eprintln!("peg tunnel: undoing the host configuration: {e}");
            }
        }
    }
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "-4" } else { "-6" }
}

/// The gateway and device of `ip route get`'s answer (`A via G dev D …` or `A dev D …`).
fn parse_route_get(out: &str) -> Option<(Option<String>, String)> {
    let words: Vec<&str> = out.split_whitespace().collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
            .map(|w| w.to_string())
    };
    Some((after("via"), after("dev")?))
}

#[cfg(test)]
mod tests {
    use super::parse_route_get;

    #[test]
    fn route_get_answers() {
        assert_eq!(
            parse_route_get(
                "203.0.113.7 via 192.168.1.1 dev wlan0 src 192.168.1.20 uid 0 \n    cache"
            ),
            Some((Some("192.168.1.1".into()), "wlan0".into()))
        );
        assert_eq!(
            parse_route_get("10.0.0.2 dev veth0 src 10.0.0.1 uid 0\n    cache"),
            Some((None, "veth0".into()))
        );
        assert_eq!(parse_route_get("unreachable"), None);
    }
}
