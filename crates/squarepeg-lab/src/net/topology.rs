//! The lab's three namespaces and two veth pairs:
//!
//! ```text
//!  client ns                    emulator ns                         server ns
//!  sqpg-<pid>-<name>-cli        sqpg-<pid>-<name>-emu               sqpg-<pid>-<name>-srv
//!  [sqpg<pid>-cli] ══ veth ══ [sqpg<pid>-ec]  [sqpg<pid>-es] ══ veth ══ [sqpg<pid>-srv]
//!   10.a.b.1/24                (no addresses, IPv6 off,               10.a.b.2/24
//!   fdxx:xxxx:xxxx::1/64        forwarding off: the userspace          fdxx:xxxx:xxxx::2/64
//!                               emulator bridges the two ends)
//! ```
//!
//! # Several paths
//!
//! [`Topology::create_paths`] adds paths 1 to 3 beside path 0 (which stays exactly as above):
//! each its own two veth pairs and its own subnets, derived like path 0's from the pid, the
//! lab name and the path number (and never equal to another path's).
//!
//! ```text
//!  client ns                    emulator ns                         server ns
//!  [sqpg<pid>-cli] ══ veth ══ [sqpg<pid>-ec]  [sqpg<pid>-es] ══ veth ══ [sqpg<pid>-srv]   path 0
//!   10.a.b.1/24, fdxx:…::1/64                                          10.a.b.2, fdxx:…::2
//!  [sqpg<pid>-c1]  ══ veth ══ [sqpg<pid>-ec1] [sqpg<pid>-es1] ══ veth ══ [sqpg<pid>-s1]   path 1
//!   10.c.d.1/24, fdyy:…::1/64                                          10.c.d.2, fdyy:…::2
//! ```
//!
//! With more than one path the client routes by source address: `ip rule from <path i client
//! address> lookup 100+i`, whose table sends everything out of path `i`'s interface (its
//! subnet directly, the rest via path `i`'s server address), for IPv4 and IPv6. So a socket
//! bound to a path's client address uses that path even towards another path's server
//! address (how kernel MPTCP's extra subflows reach the server), and reaches nothing while
//! the path is cut (the table ends in an `unreachable` default). The server routes by
//! destination: answers take the path of the client address they go to. Cutting a path sets
//! its client interface down ([`Topology::set_client_link`]); the client namespace keeps IPv6
//! addresses over a down link (`keep_addr_on_down`), and bringing it up restores the routes.
//!
//! Names carry the prefix `sqpg` and the pid of the owning process, so that any later run can
//! recognise the leftovers of a crashed owner (its pid no longer exists) and remove them
//! ([`cleanup_leftovers`]); [`Topology`]'s `Drop` removes its own, also on panic. The veths
//! are created directly inside their namespaces, so no interface ever exists in the host's
//! namespace, and removing a namespace removes its veth ends with it.
//!
//! Addresses come from a hash of the owner's pid and the lab name: each lab is isolated in its
//! own namespaces anyway, but distinct prefixes keep captures and logs of parallel labs apart.
//! Offloads that would hand the emulator super-frames or partial checksums (GRO, GSO, TSO,
//! checksum offload) are switched off on all four veth ends with `ethtool -K`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::netns::{NETNS_DIR, NetNs, remove_namespace};
use super::{NetError, cmd, sys};

/// The prefix of every namespace and interface the lab creates.
pub const PREFIX: &str = "sqpg";

/// Longest lab name (namespace names stay readable; interface names do not use it).
pub const MAX_NAME_LEN: usize = 32;

/// Most paths between client and server (interface names have room for one digit).
pub const MAX_PATHS: usize = 4;

/// First routing table of the client's per-path source routing (path `i` uses `100 + i`).
pub const PATH_TABLE_BASE: u32 = 100;

/// The three namespaces of a lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The client's namespace (the simulator's left side).
    Client,
    /// The emulator's namespace, between the two veth pairs.
    Emulator,
    /// The server's namespace (the simulator's right side).
    Server,
}

impl Role {
    /// All three.
    pub const ALL: [Role; 3] = [Role::Client, Role::Emulator, Role::Server];

    /// The suffix of the namespace name.
    pub fn suffix(self) -> &'static str {
        match self {
            Role::Client => "cli",
            Role::Emulator => "emu",
            Role::Server => "srv",
        }
    }
}

/// The namespace name of `role` in lab `name` owned by `pid`: `sqpg-<pid>-<name>-<role>`.
pub fn namespace_name(pid: u32, name: &str, role: Role) -> String {
    format!("{PREFIX}-{pid}-{name}-{}", role.suffix())
}

/// The owner pid, lab name and role of a namespace name this module made, or `None`.
pub fn parse_namespace_name(ns: &str) -> Option<(u32, String, Role)> {
    let rest = ns.strip_prefix(PREFIX)?.strip_prefix('-')?;
    let (pid, rest) = rest.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pid = pid.parse().ok()?;
    let (name, suffix) = rest.rsplit_once('-')?;
    let role = Role::ALL.into_iter().find(|r| r.suffix() == suffix)?;
    Some((pid, name.to_owned(), role))
}

/// The owner pid of an interface name this module made (`sqpg<pid>-…`), or `None`.
pub fn parse_interface_name(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, _) = rest.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Checks a lab name: 1 to 32 of `a-z A-Z 0-9 _ -`.
pub fn validate_name(name: &str) -> Result<(), NetError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(NetError::InvalidName(name.to_owned()))
    }
}

/// The interface names of a lab (each at most 15 bytes, the kernel's limit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interfaces {
    /// In the client namespace, facing the emulator.
    pub client: String,
    /// In the emulator namespace, facing the client.
    pub emulator_client: String,
    /// In the emulator namespace, facing the server.
    pub emulator_server: String,
    /// In the server namespace, facing the emulator.
    pub server: String,
}

impl Interfaces {
    fn for_pid(pid: u32) -> Self {
        let name = |suffix: &str| format!("{PREFIX}{pid}-{suffix}");
        Self {
            client: name("cli"),
            emulator_client: name("ec"),
            emulator_server: name("es"),
            server: name("srv"),
        }
    }

    /// The names of path `index`: path 0's are the single-path lab's (`…-cli`, `…-ec`,
    /// `…-es`, `…-srv`), path `i` ≥ 1 has `…-c<i>`, `…-ec<i>`, `…-es<i>`, `…-s<i>` (at most
    /// 15 bytes with a 7-digit pid).
    pub fn for_path(pid: u32, index: usize) -> Self {
        if index == 0 {
            return Self::for_pid(pid);
        }
        let name = |suffix: &str| format!("{PREFIX}{pid}-{suffix}{index}");
        Self {
            client: name("c"),
            emulator_client: name("ec"),
            emulator_server: name("es"),
            server: name("s"),
        }
    }
}

/// One path of a lab: its interfaces and the two ends' addresses on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathInfo {
    /// Interface names of this path.
    pub interfaces: Interfaces,
    /// Addresses of client and server on this path (their own /24 and /64).
    pub addresses: Addresses,
}

/// The addresses of a lab's two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Addresses {
    /// The client's IPv4 address (in a /24 shared with the server).
    pub client_v4: Ipv4Addr,
    /// The server's IPv4 address.
    pub server_v4: Ipv4Addr,
    /// The client's IPv6 address (in a /64 ULA prefix, RFC 4193, shared with the server).
    pub client_v6: Ipv6Addr,
    /// The server's IPv6 address.
    pub server_v6: Ipv6Addr,
}

impl Addresses {
    /// The addresses of lab `name` owned by `pid`: 10.a.b.1 and .2, and fdxx:xxxx:xxxx::1
    /// and ::2, where a, b and the 40-bit ULA global ID come from a hash of both.
    pub fn derive(pid: u32, name: &str) -> Self {
        Self::from_seed(&format!("{pid}-{name}"))
    }

    /// The addresses of the `count` paths of lab `name` owned by `pid`: path 0's are
    /// [`Addresses::derive`]'s, path `i`'s are derived the same way from `<pid>-<name>/<i>`
    /// (rehashed until its /24 and /64 differ from every earlier path's).
    pub fn derive_paths(pid: u32, name: &str, count: usize) -> Vec<Self> {
        let mut all = vec![Self::derive(pid, name)];
        for index in 1..count {
            let mut attempt = 0u32;
            let next = loop {
                let candidate = Self::from_seed(&format!("{pid}-{name}/{index}/{attempt}"));
                let clash = all.iter().any(|a| {
                    a.client_v4.octets()[..3] == candidate.client_v4.octets()[..3]
                        || a.client_v6.segments()[..4] == candidate.client_v6.segments()[..4]
                });
                if !clash {
                    break candidate;
                }
                attempt += 1;
            };
            all.push(next);
        }
        all
    }

    fn from_seed(seed: &str) -> Self {
        // FNV-1a: stable across Rust versions, unlike the std hasher.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in seed.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let b = hash.to_be_bytes();
        let v4 = |host: u8| Ipv4Addr::new(10, b[0], b[1], host);
        let v6 = |host: u16| {
            Ipv6Addr::new(
                0xfd00 | u16::from(b[2]),
                u16::from_be_bytes([b[3], b[4]]),
                u16::from_be_bytes([b[5], b[6]]),
                0,
                0,
                0,
                0,
                host,
            )
        };
        Self {
            client_v4: v4(1),
            server_v4: v4(2),
            client_v6: v6(1),
            server_v6: v6(2),
        }
    }

    /// The client's address of one family.
    pub fn client(&self, ipv6: bool) -> IpAddr {
        if ipv6 {
            self.client_v6.into()
        } else {
            self.client_v4.into()
        }
    }

    /// The server's address of one family.
    pub fn server(&self, ipv6: bool) -> IpAddr {
        if ipv6 {
            self.server_v6.into()
        } else {
            self.server_v4.into()
        }
    }
}

/// The facts of a lab that other processes need (the CLI's state file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyInfo {
    /// The lab name.
    pub name: String,
    /// The owning process.
    pub owner_pid: u32,
    /// Namespace names.
    pub client_ns: String,
    /// The emulator's namespace.
    pub emulator_ns: String,
    /// The server's namespace.
    pub server_ns: String,
    /// Interface names.
    pub interfaces: Interfaces,
    /// Addresses.
    pub addresses: Addresses,
    /// Every path, path 0 first (whose interfaces and addresses are the two fields above).
    /// Empty in state files written before labs had several paths.
    #[serde(default)]
    pub paths: Vec<PathInfo>,
}

impl TopologyInfo {
    /// Every path, path 0 first.
    pub fn path_list(&self) -> Vec<PathInfo> {
        if self.paths.is_empty() {
            vec![PathInfo {
                interfaces: self.interfaces.clone(),
                addresses: self.addresses,
            }]
        } else {
            self.paths.clone()
        }
    }

    /// Path `index`, if the lab has it.
    pub fn path(&self, index: usize) -> Option<PathInfo> {
        self.path_list().into_iter().nth(index)
    }

    /// How many paths the lab has.
    pub fn path_count(&self) -> usize {
        self.paths.len().max(1)
    }
}

/// A lab's namespaces and veths; removed on [`teardown`](Topology::teardown) or drop.
#[derive(Debug)]
pub struct Topology {
    info: TopologyInfo,
    client: NetNs,
    emulator: NetNs,
    server: NetNs,
    created: Created,
}

/// Namespaces created so far, removed on drop: a guard from the first `ip netns add` on, so
/// that a creation failing half-way leaves nothing behind.
#[derive(Debug, Default)]
struct Created(Vec<String>);

impl Created {
    /// Removes them all, reporting the first failure.
    fn remove(&mut self) -> Result<(), NetError> {
        let mut first_error = None;
        for ns in std::mem::take(&mut self.0) {
            if let Err(error) = remove_namespace(&ns) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if let Err(error) = self.remove() {
            eprintln!("squarepeg-lab: removing a lab: {error}");
        }
    }
}

/// Writes a sysctl of the calling thread's network namespace (`/proc/sys/net` follows the
/// namespace of the thread that opens it).
pub(crate) fn write_sysctl(path: &str, value: &str) -> Result<(), NetError> {
    std::fs::write(path, value).map_err(|source| NetError::Io {
        context: format!("writing {value} to {path}"),
        source,
    })
}

impl Topology {
    /// Creates lab `name` owned by this process. Fails with [`NetError::NotRoot`] unless root,
    /// and with [`NetError::NamespaceExists`] if this process already has a lab of that name.
    pub fn create(name: &str) -> Result<Self, NetError> {
        Self::create_paths(name, 1)
    }

    /// Creates lab `name` with `paths` (1 to [`MAX_PATHS`]) independent paths between client
    /// and server: path 0 exactly as [`Topology::create`] makes it, each further one with its
    /// own two veth pairs and its own subnets; with more than one, the client routes by
    /// source address (see the module documentation).
    pub fn create_paths(name: &str, paths: usize) -> Result<Self, NetError> {
        if paths == 0 || paths > MAX_PATHS {
            return Err(NetError::Paths(paths));
        }
        validate_name(name)?;
        if !sys::is_root() {
            return Err(NetError::NotRoot);
        }
        let pid = std::process::id();
        let path_addresses = Addresses::derive_paths(pid, name, paths);
        let info = TopologyInfo {
            name: name.to_owned(),
            owner_pid: pid,
            client_ns: namespace_name(pid, name, Role::Client),
            emulator_ns: namespace_name(pid, name, Role::Emulator),
            server_ns: namespace_name(pid, name, Role::Server),
            interfaces: Interfaces::for_pid(pid),
            addresses: path_addresses[0],
            paths: path_addresses
                .iter()
                .enumerate()
                .map(|(index, addresses)| PathInfo {
                    interfaces: Interfaces::for_path(pid, index),
                    addresses: *addresses,
                })
                .collect(),
        };
        for ns in [&info.client_ns, &info.emulator_ns, &info.server_ns] {
            if NetNs::path_of(ns).exists() {
                return Err(NetError::NamespaceExists(ns.clone()));
            }
        }
        let mut created = Created::default();
        // On error, `created` drops here and removes what was made.
        let [client, emulator, server] = Self::build(&info, &mut created)?;
        Ok(Self {
            info,
            client,
            emulator,
            server,
            created,
        })
    }

    fn build(info: &TopologyInfo, created: &mut Created) -> Result<[NetNs; 3], NetError> {
        for ns in [&info.client_ns, &info.emulator_ns, &info.server_ns] {
            cmd::ip(&["netns", "add", ns]).map_err(|error| match error {
                NetError::CommandFailed { stderr, .. } if stderr.contains("File exists") => {
                    NetError::NamespaceExists(ns.clone())
                }
                other => other,
            })?;
            created.0.push(ns.clone());
        }
        let client = NetNs::open(&info.client_ns)?;
        let emulator = NetNs::open(&info.emulator_ns)?;
        let server = NetNs::open(&info.server_ns)?;

        // Set before the veths exist, so that the `default` values apply to them. The
        // emulator's kernel must not take part: no IPv6 (no link-local addresses, no
        // neighbour discovery of its own), no IPv4 addresses, no forwarding (off by default
        // in a new namespace). The ends skip duplicate address detection, so that IPv6 works
        // at once, and send no router solicitations (nothing would answer).
        emulator.run(|| -> Result<(), NetError> {
            write_sysctl("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1")?;
            write_sysctl("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1")?;
            write_sysctl("/proc/sys/net/ipv4/ip_forward", "0")
        })??;
        for ns in [&client, &server] {
            ns.run(|| -> Result<(), NetError> {
                write_sysctl("/proc/sys/net/ipv6/conf/default/accept_dad", "0")?;
                write_sysctl("/proc/sys/net/ipv6/conf/default/router_solicitations", "0")?;
                // A path that is cut (its client interface set down) and restored gets its
                // IPv6 addresses back.
                write_sysctl("/proc/sys/net/ipv6/conf/default/keep_addr_on_down", "1")
            })??;
        }
        for (index, path) in info.path_list().iter().enumerate() {
            Self::build_path(info, index, path)?;
        }
        if info.path_list().len() > 1 {
            for index in 0..info.path_list().len() {
                client_routes(info, index)?;
            }
        }
        Ok([client, emulator, server])
    }

    /// Makes path `index`'s two veth pairs, addresses and links.
    fn build_path(info: &TopologyInfo, index: usize, path: &PathInfo) -> Result<(), NetError> {
        let ifs = &path.interfaces;
        let base = 10 + 4 * index;
        let [i0, i1, i2, i3] = [base, base + 1, base + 2, base + 3].map(|i| i.to_string());

        // Explicit interface indices, all different: the kernel delays the carrier of a veth
        // whose own index equals its peer's (in another namespace) by up to a second
        // (linkwatch treats it as a non-urgent event), and until then drops its packets.
        let pairs = [
            (&info.client_ns, &ifs.client, &i0, &ifs.emulator_client, &i1),
            (&info.server_ns, &ifs.server, &i3, &ifs.emulator_server, &i2),
        ];
        for (end_ns, end, end_index, emulator_end, emulator_index) in pairs {
            cmd::ip(&[
                "link",
                "add",
                "name",
                end,
                "index",
                end_index,
                "netns",
                end_ns,
                "type",
                "veth",
                "peer",
                "name",
                emulator_end,
                "index",
                emulator_index,
                "netns",
                &info.emulator_ns,
            ])?;
        }
        for (ns, dev) in [
            (&info.client_ns, &ifs.client),
            (&info.emulator_ns, &ifs.emulator_client),
            (&info.emulator_ns, &ifs.emulator_server),
            (&info.server_ns, &ifs.server),
        ] {
            cmd::run(
                "ip",
                &[
                    "netns", "exec", ns, "ethtool", "-K", dev, "gro", "off", "gso", "off", "tso",
                    "off", "tx", "off", "rx", "off",
                ],
            )?;
        }
        let addresses = path.addresses;
        for (ns, dev, v4, v6) in [
            (
                &info.client_ns,
                &ifs.client,
                addresses.client_v4,
                addresses.client_v6,
            ),
            (
                &info.server_ns,
                &ifs.server,
                addresses.server_v4,
                addresses.server_v6,
            ),
        ] {
            cmd::ip(&["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", dev])?;
            cmd::ip(&[
                "-n",
                ns,
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                dev,
                "nodad",
            ])?;
            cmd::ip(&["-n", ns, "link", "set", "lo", "up"])?;
            cmd::ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        for dev in [&ifs.emulator_client, &ifs.emulator_server] {
            // Promiscuous: the emulator reads frames addressed to the far end's MAC.
            cmd::ip(&[
                "-n",
                &info.emulator_ns,
                "link",
                "set",
                dev,
                "promisc",
                "on",
                "up",
            ])?;
        }
        for (ns, dev) in [
            (&info.client_ns, &ifs.client),
            (&info.emulator_ns, &ifs.emulator_client),
            (&info.emulator_ns, &ifs.emulator_server),
            (&info.server_ns, &ifs.server),
        ] {
            wait_until_up(ns, dev)?;
        }
        Ok(())
    }

    /// The lab's names and addresses.
    pub fn info(&self) -> &TopologyInfo {
        &self.info
    }

    /// The addresses of the two ends.
    pub fn addresses(&self) -> &Addresses {
        &self.info.addresses
    }

    /// The namespace of `role`.
    pub fn namespace(&self, role: Role) -> &NetNs {
        match role {
            Role::Client => &self.client,
            Role::Emulator => &self.emulator,
            Role::Server => &self.server,
        }
    }

    /// The client's namespace.
    pub fn client(&self) -> &NetNs {
        self.namespace(Role::Client)
    }

    /// The server's namespace.
    pub fn server(&self) -> &NetNs {
        self.namespace(Role::Server)
    }

    /// The emulator's namespace.
    pub fn emulator(&self) -> &NetNs {
        self.namespace(Role::Emulator)
    }

    /// Takes the client's interface of path `index` down (the kernel sees the link gone:
    /// its routes go, sockets bound to its address get no route) or brings it back up,
    /// waits until both ends of the veth are up again, and restores the path's routes.
    pub fn set_client_link(&self, index: usize, up: bool) -> Result<(), NetError> {
        let path = self.info.path(index).ok_or(NetError::NoPath(index))?;
        let ns = &self.info.client_ns;
        let dev = &path.interfaces.client;
        cmd::ip(&["-n", ns, "link", "set", dev, if up { "up" } else { "down" }])?;
        if up {
            wait_until_up(ns, dev)?;
            wait_until_up(&self.info.emulator_ns, &path.interfaces.emulator_client)?;
            if self.info.path_count() > 1 {
                client_routes(&self.info, index)?;
            }
        }
        Ok(())
    }

    /// Removes the namespaces (and with them the veths), reporting the first failure.
    /// Dropping the topology does the same, reporting on standard error.
    pub fn teardown(mut self) -> Result<(), NetError> {
        self.created.remove()
    }
}

/// The client's source routing for path `index` of a lab with several paths: packets from
/// the path's client address (v4 and v6) look up table `100 + index`, which sends everything
/// through the path's interface (its subnet directly, the rest via the path's server
/// address). So a socket bound to a path's address uses that path whatever the destination —
/// what a multipath transport's subflows (kernel MPTCP's among them) need. The server routes
/// by destination: its answers take the path of the client address they go to.
fn client_routes(info: &TopologyInfo, index: usize) -> Result<(), NetError> {
    const LAST_RESORT: &str = "1000000";
    let path = info.path(index).ok_or(NetError::NoPath(index))?;
    let ns = &info.client_ns;
    let dev = &path.interfaces.client;
    let table = (PATH_TABLE_BASE + index as u32).to_string();
    let a = path.addresses;
    let v4_net = {
        let o = a.client_v4.octets();
        format!("{}.{}.{}.0/24", o[0], o[1], o[2])
    };
    let v6_net = {
        let s = a.client_v6.segments();
        format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
    };
    let client_v4 = a.client_v4.to_string();
    let client_v6 = a.client_v6.to_string();
    let server_v4 = a.server_v4.to_string();
    let server_v6 = a.server_v6.to_string();
    for args in [
        vec![
            "route", "replace", &v4_net, "dev", dev, "src", &client_v4, "table", &table,
        ],
        vec![
            "route", "replace", "default", "via", &server_v4, "dev", dev, "table", &table,
        ],
        vec![
            "-6", "route", "replace", &v6_net, "dev", dev, "table", &table,
        ],
        vec![
            "-6", "route", "replace", "default", "via", &server_v6, "dev", dev, "table", &table,
        ],
        // While the path is cut its routes are gone: its address then reaches nothing,
        // instead of falling through to another path's routes.
        vec![
            "route",
            "replace",
            "unreachable",
            "default",
            "metric",
            LAST_RESORT,
            "table",
            &table,
        ],
        vec![
            "-6",
            "route",
            "replace",
            "unreachable",
            "default",
            "metric",
            LAST_RESORT,
            "table",
            &table,
        ],
    ] {
        let mut all = vec!["-n", ns.as_str()];
        all.extend(args);
        cmd::ip(&all)?;
    }
    let priority = table.clone();
    for (family, from) in [("-4", &client_v4), ("-6", &client_v6)] {
        let rule = [
            "from",
            from.as_str(),
            "lookup",
            &table,
            "priority",
            &priority,
        ];
        let listed = cmd::ip(&["-n", ns, family, "rule", "show", "priority", &priority])?;
        if listed.trim().is_empty() {
            let mut all = vec!["-n", ns.as_str(), family, "rule", "add"];
            all.extend(rule);
            cmd::ip(&all)?;
        }
    }
    Ok(())
}

/// Waits (up to 3 s) until interface `dev` in namespace `ns` has its carrier and is
/// operationally up, so that the lab carries packets as soon as it is returned.
fn wait_until_up(ns: &str, dev: &str) -> Result<(), NetError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let line = cmd::ip(&["-n", ns, "-o", "link", "show", "dev", dev])?;
        if line.contains("state UP") && !line.contains("NO-CARRIER") {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(NetError::LinkNotUp {
                interface: dev.to_owned(),
                state: line.trim().to_owned(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// What [`cleanup_leftovers`] or [`remove_labs_of`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    /// Namespaces removed.
    pub namespaces: Vec<String>,
    /// Interfaces removed from this process's namespace.
    pub interfaces: Vec<String>,
    /// Leftovers that could not be removed, with the reason.
    pub failed: Vec<String>,
}

/// Every lab namespace on the host: (name, owner pid, owner alive).
pub fn lab_namespaces() -> Vec<(String, u32, bool)> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut found: Vec<(String, u32, bool)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|name| {
            let (pid, _, _) = parse_namespace_name(&name)?;
            Some((name, pid, sys::pid_alive(pid)))
        })
        .collect();
    found.sort();
    found
}

/// Removes the namespaces and interfaces of labs whose owner process is gone (a crashed
/// test, a killed `peg lab` daemon). Labs of living processes are left alone.
pub fn cleanup_leftovers() -> CleanupReport {
    remove_labs_where(|pid| !sys::pid_alive(pid))
}

/// Removes every lab of process `owner` at once, with the processes it started in them (an
/// OpenVPN, say) — for an owner about to exit on a signal, whose labs' `Drop` will not run.
/// Processes inside the namespaces are killed (SIGKILL) first: a namespace lives on while a
/// process is in it. The owner itself is spared.
pub fn remove_labs_of(owner: u32) -> CleanupReport {
    for (ns, pid, _) in lab_namespaces() {
        if pid != owner {
            continue;
        }
        let Ok(pids) = cmd::ip(&["netns", "pids", &ns]) else {
            continue;
        };
        for inside in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            if inside != owner {
                sys::kill(inside);
            }
        }
    }
    remove_labs_where(|pid| pid == owner)
}

/// Removes the lab namespaces and stray host-side lab interfaces whose owner pid `doomed`
/// picks.
fn remove_labs_where(doomed: impl Fn(u32) -> bool) -> CleanupReport {
    let mut report = CleanupReport::default();
    for (ns, pid, _) in lab_namespaces() {
        if !doomed(pid) {
            continue;
        }
        match remove_namespace(&ns) {
            Ok(()) => report.namespaces.push(ns),
            Err(error) => report.failed.push(format!("{ns}: {error}")),
        }
    }
    // Interfaces never live in the host's namespace, but a kernel or tool that ignored the
    // `netns` argument would leave them here: remove those too.
    if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
        for name in entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
        {
            let Some(pid) = parse_interface_name(&name) else {
                continue;
            };
            if !doomed(pid) {
                continue;
            }
            match cmd::ip(&["link", "del", &name]) {
                Ok(_) => report.interfaces.push(name),
                Err(error) => report.failed.push(format!("{name}: {error}")),
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let ns = namespace_name(4_194_304, "rtt-v6_a", Role::Emulator);
        assert_eq!(ns, "sqpg-4194304-rtt-v6_a-emu");
        assert_eq!(
            parse_namespace_name(&ns),
            Some((4_194_304, "rtt-v6_a".to_owned(), Role::Emulator))
        );
        assert_eq!(parse_namespace_name("sqpg-x-a-cli"), None);
        assert_eq!(parse_namespace_name("sqpg-12-a-xyz"), None);
        assert_eq!(parse_namespace_name("other-12-a-cli"), None);
        let ifs = Interfaces::for_pid(4_194_304);
        for name in [
            &ifs.client,
            &ifs.emulator_client,
            &ifs.emulator_server,
            &ifs.server,
        ] {
            assert!(name.len() <= 15, "{name}");
            assert_eq!(parse_interface_name(name), Some(4_194_304));
        }
        assert_eq!(parse_interface_name("sqpgx-cli"), None);
        assert!(validate_name("a-b_C9").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(33)] {
            assert!(matches!(validate_name(bad), Err(NetError::InvalidName(_))));
        }
    }

    #[test]
    fn addresses_are_private_and_differ_between_labs() {
        let a = Addresses::derive(100, "one");
        let b = Addresses::derive(100, "two");
        assert_ne!(a.client_v4, b.client_v4);
        assert_ne!(a.client_v6, b.client_v6);
        for addresses in [a, b] {
            assert!(addresses.client_v4.is_private());
            assert_eq!(
                addresses.client_v4.octets()[..3],
                addresses.server_v4.octets()[..3]
            );
            assert_eq!(addresses.client_v6.segments()[0] & 0xff00, 0xfd00);
            assert_eq!(
                addresses.client_v6.segments()[..4],
                addresses.server_v6.segments()[..4]
            );
        }
        assert_eq!(Addresses::derive(100, "one"), a);
    }
}
