//! squarepeg's userspace TCP ([`squarepeg_io::Stack`]) in the lab: a stack inside one end of a
//! running network lab ([`LabStack`]), so that squarepeg's own TCP crosses the lab's emulator
//! and its middleboxes like any kernel TCP there; and the lab's link model and pcap writer as
//! the driver's impairment shim ([`impairment`]) and packet tap ([`pcap_capture`]).
//!
//! The driver knows neither: it takes any [`PathModel`] and any [`PacketTap`], so that
//! `squarepeg-io` does not depend on the lab. This module is where the two meet.
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

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use squarepeg_io::{Impairment, PacketTap, PathModel, Stack, StackConfig, TunConfig, TunDevice};
use thiserror::Error;

use crate::model::{ConfigError, LinkConfig, LinkDirection};
use crate::net::{Lab, NetError, NetNs, Role, write_sysctl};
use crate::pcap::{PcapWriter, Resolution};
use crate::rng::derive_seed;

/// The TUN device's name inside the lab namespace (namespaces keep labs apart).
pub const DEVICE: &str = "sptun0";

/// Why a stack could not be attached to a lab.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StackError {
    /// The emulator's namespace has no addresses to give a stack.
    #[error("a stack attaches to the client or the server end of a lab, not the emulator")]
    NotAnEnd,
    /// Configuring a namespace failed.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The TUN device or the stack could not be brought up.
    #[error(transparent)]
    Io(#[from] squarepeg_io::Error),
    /// `ip link show` gave no MAC address for the near end's veth.
    #[error("no link/ether address for {interface} in `{output}`")]
    NoLinkAddress {
        /// The interface.
        interface: String,
        /// What `ip` printed.
        output: String,
    },
}

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

/// Whether this machine can run a [`LabStack`] (root, `/dev/net/tun`, iproute2); prints
/// why not, so that a test that returns early says it was skipped.
pub fn can_run() -> bool {
    let root = crate::net::is_root();
    let tun = Path::new("/dev/net/tun").exists();
    let ip = std::process::Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(root && tun && ip) {
        eprintln!("skipped: needs root, /dev/net/tun and iproute2 (root={root} tun={tun} ip={ip})");
        return false;
    }
    true
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
    ) -> Result<LabStack, StackError> {
        let (v4, v6) = stack_addresses(lab, role).ok_or(StackError::NotAnEnd)?;
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
        let mut tun = TunConfig::default();
        tun.name = Some(DEVICE.into());
        tun.mtu = mtu;
        tun.tx_queue_len = None;
        let device = near.run(|| TunDevice::open(&tun))??;

        for args in [
            vec!["link", "set", "dev", DEVICE, "up"],
            vec!["-4", "route", "add", &format!("{v4}/32"), "dev", DEVICE],
            vec!["-6", "route", "add", &format!("{v6}/128"), "dev", DEVICE],
        ] {
            near.ip(&args)?;
        }
        near.run(|| -> Result<(), NetError> {
            write_sysctl("/proc/sys/net/ipv4/ip_forward", "1")?;
            write_sysctl("/proc/sys/net/ipv6/conf/all/forwarding", "1")
        })??;
        let mac = link_address(near, near_if)?;
        for address in [IpAddr::V4(v4), IpAddr::V6(v6)] {
            let address = address.to_string();
            far.ip(&[
                "neigh",
                "replace",
                &address,
                "lladdr",
                &mac,
                "dev",
                far_if,
                "nud",
                "permanent",
            ])?;
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

/// The MAC address of `interface` in `ns`, as `ip` prints it.
fn link_address(ns: &NetNs, interface: &str) -> Result<String, StackError> {
    let out = ns.ip(&["-o", "link", "show", "dev", interface])?;
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| StackError::NoLinkAddress {
            interface: interface.to_owned(),
            output: out.trim().to_owned(),
        })
}

/// The link model as the driver's path model: the packet's fate by its length, as in the
/// simulator and the emulator.
impl PathModel for LinkDirection {
    fn offer(&mut self, now: Instant, packet: &[u8], arrivals: &mut Vec<Instant>) {
        arrivals.extend(LinkDirection::offer(self, now, packet.len()).arrivals());
    }
}

/// Labels of the per-direction seeds derived from [`impairment`]'s seed.
const SEED_INBOUND: u64 = 1;
const SEED_OUTBOUND: u64 = 2;

/// The lab's link model between the TUN device and the endpoint ([`StackConfig::impairment`]),
/// one [`LinkDirection`] each way. Each direction draws from its own seed derived from `seed`,
/// so a run's impairment pattern (per packet index) replays exactly.
pub fn impairment(
    inbound: LinkConfig,
    outbound: LinkConfig,
    seed: u64,
) -> Result<Impairment, ConfigError> {
    Ok(Impairment::new(
        LinkDirection::new(inbound, derive_seed(seed, SEED_INBOUND))?,
        LinkDirection::new(outbound, derive_seed(seed, SEED_OUTBOUND))?,
    ))
}

/// Wall-clock timestamps: the kernel's own captures (tcpdump on the device) use them too.
impl<W: Write + Send> PacketTap for PcapWriter<W> {
    fn packet(&mut self, packet: &[u8]) -> io::Result<()> {
        let ts = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.write_packet(ts, packet)
    }

    fn flush(&mut self) -> io::Result<()> {
        PcapWriter::flush(self)
    }
}

/// A pcap capture of the device's packets ([`StackConfig::capture`]) into a new file.
/// `snaplen` cuts each packet (headers only: 128 is plenty for IP and TCP headers with
/// options); the original length is still recorded.
pub fn pcap_capture(path: &Path, snaplen: u32) -> io::Result<Box<dyn PacketTap>> {
    let context =
        |e: io::Error| io::Error::new(e.kind(), format!("capture file {}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(context)?;
    let writer = PcapWriter::with_options(
        io::BufWriter::with_capacity(1 << 20, file),
        Resolution::Nanos,
        snaplen.max(1),
    )
    .map_err(context)?;
    Ok(Box::new(writer))
}
