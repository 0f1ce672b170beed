//! A userspace-TCP [`Stack`] inside one end of a running network lab
//! ([`squarepeg_lab::net::Lab`]), so that squarepeg's own TCP crosses the lab's emulator and
//! its middleboxes like any kernel TCP there.
//!
//! # How the stack is wired in
//!
//! The lab's client and server namespaces each have one veth towards the emulator, with
//! addresses `.1` (client) and `.2` (server) in a shared IPv4 /24 and IPv6 /64. Attaching a
//! stack to one end:
//!
//! 1. opens a TUN device ([`DEVICE`]) in that end's namespace and gives the stack the next
//!    free host address of both prefixes: `.3`/`::3` on the client end, `.4`/`::4` on the
//!    server end — inside the lab's prefix, so the far end reaches it without a route;
//! 2. routes that address (`/32`, `/128`) into the TUN device and turns on forwarding in the
//!    namespace: the namespace's kernel becomes a one-hop router between its veth and the
//!    stack (it decrements the TTL / hop limit, and nothing else);
//! 3. tells the far end's kernel, with a permanent neighbour entry, that the stack's
//!    addresses live at the near veth's MAC address. That replaces proxy ARP / proxy NDP,
//!    whose answers the kernel delays by up to `proxy_delay` (0.8 s by default) — a delay
//!    that would show up in every first connection.
//!
//! The near end's own kernel TCP keeps its address, so a test can run the kernel and the
//! stack side by side in one namespace. Everything configured here disappears with the
//! lab: the TUN device (and its routes) when the [`LabStack`] is dropped, the sysctls and
//! neighbour entries with the namespaces at teardown.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use squarepeg_lab::net::{Lab, NetNs, Role};

use crate::device::{TunConfig, TunDevice};
use crate::error::Error;
use crate::netns::run_command;
use crate::stack::{Stack, StackConfig};

/// The TUN device's name inside the lab namespace (namespaces keep labs apart).
pub const DEVICE: &str = "sptun0";

/// A [`Stack`] attached to one end of a lab.
pub struct LabStack {
    stack: Stack,
    role: Role,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
}

impl std::fmt::Debug for LabStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabStack")
            .field("role", &self.role)
            .field("v4", &self.v4)
            .field("v6", &self.v6)
            .finish_non_exhaustive()
    }
}

/// The stack's addresses on one end of a lab: the lab's prefix with host part 3 (client) or
/// 4 (server). `None` for the emulator, which has no addresses.
pub fn stack_addresses(lab: &Lab, role: Role) -> Option<(Ipv4Addr, Ipv6Addr)> {
    let host = match role {
        Role::Client => 3,
        Role::Server => 4,
        Role::Emulator => return None,
    };
    let a = lab.addresses();
    let [o0, o1, o2, _] = a.client_v4.octets();
    let mut s6 = a.client_v6.segments();
    s6[7] = host;
    Some((Ipv4Addr::new(o0, o1, o2, host as u8), Ipv6Addr::from(s6)))
}

impl LabStack {
    /// Opens the TUN device in `role`'s namespace, wires it in (see the module docs) and
    /// starts a stack on it. `config.addresses` is replaced by the addresses of
    /// [`stack_addresses`]; `mtu` is the device's (the lab's veths carry 1500).
    pub fn attach(
        lab: &Lab,
        role: Role,
        mut config: StackConfig,
        mtu: Option<u16>,
    ) -> Result<LabStack, Error> {
        let (v4, v6) = stack_addresses(lab, role).ok_or_else(|| Error::Namespace {
            name: lab.info().emulator_ns.clone(),
            reason: "a stack attaches to the client or the server end, not the emulator".into(),
        })?;
        let info = lab.info();
        let (near, far, near_if, far_if) = if role == Role::Client {
            (
                lab.client(),
                lab.server(),
                &info.interfaces.client,
                &info.interfaces.server,
            )
        } else {
            (
                lab.server(),
                lab.client(),
                &info.interfaces.server,
                &info.interfaces.client,
            )
        };
        let tun = TunConfig {
            name: Some(DEVICE.into()),
            mtu,
            tx_queue_len: None,
        };
        let device = near
            .run(|| TunDevice::open(&tun))
            .map_err(|e| Error::Namespace {
                name: near.name().to_owned(),
                reason: e.to_string(),
            })??;

        let ns = near.name();
        for args in [
            vec!["link", "set", "dev", DEVICE, "up"],
            vec!["-4", "route", "add", &format!("{v4}/32"), "dev", DEVICE],
            vec!["-6", "route", "add", &format!("{v6}/128"), "dev", DEVICE],
        ] {
            ip_in(ns, &args)?;
        }
        for key in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
            run_command(near.command("sysctl").args(["-qw", &format!("{key}=1")]))?;
        }
        let mac = link_address(near, near_if)?;
        for address in [IpAddr::V4(v4), IpAddr::V6(v6)] {
            let address = address.to_string();
            ip_in(
                far.name(),
                &[
                    "neigh",
                    "replace",
                    &address,
                    "lladdr",
                    &mac,
                    "dev",
                    far_if,
                    "nud",
                    "permanent",
                ],
            )?;
        }

        config.addresses = vec![IpAddr::V4(v4), IpAddr::V6(v6)];
        let stack = Stack::new(device, config)?;
        Ok(LabStack {
            stack,
            role,
            v4,
            v6,
        })
    }

    /// The stack.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    /// The end of the lab it is attached to.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The stack's address of one family.
    pub fn address(&self, ipv6: bool) -> IpAddr {
        if ipv6 {
            IpAddr::V6(self.v6)
        } else {
            IpAddr::V4(self.v4)
        }
    }

    /// The stack, detached from this guard (the device stays configured while it runs).
    pub fn into_stack(self) -> Stack {
        self.stack
    }
}

fn ip_in(ns: &str, args: &[&str]) -> Result<String, Error> {
    run_command(std::process::Command::new("ip").args(["-n", ns]).args(args))
}

/// The MAC address of `interface` in `ns`, as `ip` prints it.
fn link_address(ns: &NetNs, interface: &str) -> Result<String, Error> {
    let out = ip_in(ns.name(), &["-o", "link", "show", "dev", interface])?;
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| Error::Command {
            command: format!("ip -n {} -o link show dev {interface}", ns.name()),
            message: format!("no link/ether address in `{}`", out.trim()),
        })
}
