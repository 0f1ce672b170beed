//! The real network: three network namespaces joined through a userspace link emulator, so
//! that real stacks (the Linux kernel's TCP, squarepeg over kernel TCP or TUN, any tool run
//! with [`NetNs::command`]) talk across the lab's impairments and middleboxes — the role netem
//! and Mininet play elsewhere. The kernel here has no netem (machine notes), hence the
//! userspace emulator.
//!
//! ```text
//!  client ns ══ veth ══ [ emulator ns: AF_PACKET bridge running the simulator's path ] ══ veth ══ server ns
//!  10.a.b.1, fdxx::1        client chain → bottleneck (LinkConfig per direction) → server chain        10.a.b.2, fdxx::2
//! ```
//!
//! - [`Topology`]: the namespaces and veths, IPv4 and IPv6 addresses on the two ends (none in
//!   the emulator's namespace, whose kernel forwards nothing), offloads off, names that carry
//!   the owner's pid, removal on drop and [`cleanup_leftovers`] for crashed owners.
//! - [`Emulator`]: the bridge. Every IP packet goes through the same code as in the
//!   simulator — the emulator *is* the simulator's dumbbell ([`crate::sim::Simulator`]) run
//!   against the wall clock, with the two interfaces as its default hosts — so a link spec
//!   and a middlebox list mean exactly the same in both engines. ARP and IPv6 neighbour
//!   discovery pass unimpaired. A dedicated thread (SCHED_FIFO when allowed, timer slack
//!   1 ns) sleeps in `ppoll` until the next frame or the next delivery. Statistics per
//!   direction ([`EmulatorStats`], JSON: the model's counters, forwarding counters, timing
//!   error) and pcap captures on either interface, while running.
//! - [`Lab`]: both together behind one guard ([`Lab::teardown`], or `Drop` — also during a
//!   panic); what tests and `peg lab` use. [`LabConfig`] is serde, so a lab can be described
//!   in JSON.
//!
//! - Several paths ([`LabConfig::with_path`], [`PathConfig`]): up to [`MAX_PATHS`] independent
//!   paths between client and server, each its own veth pairs, subnets and emulator (see
//!   [`Topology`]'s documentation for the routing); [`Lab::path`] gives a [`PathHandle`] to
//!   `cut`, `blackhole`, `reset`, `restore` or `reconfigure` one path mid-run, with counters
//!   per path. The failover and multipath experiments of issue 12 stand on it.
//!
//! Directions: *up* is client to server (the simulator's left to right), *down* server to
//! client. Middleboxes sit on the client side (between the client and the bottleneck) or the
//! server side. Captures: the client-facing interface sees client packets before the
//! impairments and server packets after them; the server-facing one the reverse.
//!
//! # Host set-up
//!
//! Root (CAP_NET_ADMIN for namespaces and veths, CAP_NET_RAW for AF_PACKET; SCHED_FIFO for
//! the emulator thread is used when allowed), `ip` from iproute2, and `ethtool` (offloads are
//! switched off with `ethtool -K`). Nothing else: no kernel module, no netem, no bridge. On
//! Debian: `apt-get install iproute2 ethtool` (`.ci/run` does it). Labs live in `/run/netns`
//! as `sqpg-<owner pid>-<name>-{cli,emu,srv}`.
//!
//! # Accuracy
//!
//! The emulator writes each packet when the clock passes the delivery time the model gave
//! it; how late it is shows in [`DirectionStats::lateness`]. Measured on the 2-core VM while
//! other builds loaded it (load average about 5): mean lateness 12-40 µs, a few packets in a
//! thousand above 100 µs, none above 1 ms; a 40 ms configured RTT measures 40.1 ms (median);
//! 20 Mbit/s carries kernel TCP at 19.31 Mbit/s of goodput (rate × 1448/1500); forwarding
//! without impairments reaches about 2.4 Gbit/s of iperf3 (release build). The tests in
//! `tests/net.rs` check these against the configuration; `docs/results.md` has the figures.
//!
//! # Example
//!
//! ```no_run
//! use std::net::{SocketAddr, UdpSocket};
//! use squarepeg_lab::net::{Lab, LabConfig};
//!
//! let config = LabConfig::new("example")
//!     .with_up("delay=20ms rate=1mbit".parse()?)
//!     .with_down("delay=20ms rate=8mbit loss=0.1%".parse()?);
//! let lab = Lab::start(config)?;
//! let server = SocketAddr::new(lab.addresses().server_v4.into(), 7000);
//! // Sockets stay in the namespace they were created in.
//! let receiver = lab.server().run(|| UdpSocket::bind(server))??;
//! let sender = lab.client().run(|| UdpSocket::bind("0.0.0.0:0"))??;
//! sender.send_to(b"hello", server)?;
//! let mut buf = [0; 16];
//! let (n, _) = receiver.recv_from(&mut buf)?; // 20 ms later
//! assert_eq!(&buf[..n], b"hello");
//! println!("{}", lab.stats()?.to_json());
//! lab.teardown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! From the command line (`peg lab --help`):
//!
//! ```text
//! peg lab up --down "rate=8mbit delay=35ms loss=0.1%" --up "rate=1mbit delay=35ms" \
//!            --middlebox resegment,retx-cache --capture-dir /tmp/caps
//! peg lab exec client -- ping -c 3 10.a.b.2
//! peg lab status          # JSON: addresses and emulator statistics
//! peg lab set --down "rate=2mbit delay=35ms"   # change a link while running
//! peg lab capture --side server --dir /tmp/more  # (and --stop)
//! peg lab down            # peg lab list / peg lab cleanup for leftovers of dead labs
//! ```

mod cmd;
mod emulator;
mod lab;
mod netns;
mod packet_socket;
pub(crate) mod sys;
mod topology;

use thiserror::Error;

pub use emulator::{
    CaptureSide, CaptureStatus, DEFAULT_MAX_IN_FLIGHT, DirectionStats, Emulator, EmulatorConfig,
    EmulatorStats, Lateness,
};
pub use lab::{Lab, LabConfig, PathConfig, PathHandle, PathState, capture_path, path_capture_path};
pub use netns::{NETNS_DIR, NetNs};
pub use packet_socket::{PacketSocket, Received};
#[cfg(feature = "stack")]
pub(crate) use topology::write_sysctl;
pub use topology::{
    Addresses, CleanupReport, Interfaces, MAX_NAME_LEN, MAX_PATHS, PATH_TABLE_BASE, PREFIX,
    PathInfo, Role, Topology, TopologyInfo, cleanup_leftovers, lab_namespaces, namespace_name,
    parse_namespace_name, remove_labs_of, validate_name,
};

/// True when running as root, which the network lab needs.
pub fn is_root() -> bool {
    sys::is_root()
}

/// True if process `pid` exists.
pub fn pid_alive(pid: u32) -> bool {
    sys::pid_alive(pid)
}

/// Why the network lab failed.
#[derive(Debug, Error)]
pub enum NetError {
    /// Namespaces, veths and AF_PACKET sockets need root.
    #[error("the network lab needs root (CAP_NET_ADMIN and CAP_NET_RAW): run it with sudo")]
    NotRoot,
    /// A tool is not installed.
    #[error("`{program}` is not installed (Debian package: {package})")]
    ToolMissing {
        /// The program.
        program: String,
        /// The package to install.
        package: &'static str,
    },
    /// A command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on standard error.
        stderr: String,
    },
    /// A namespace of that name exists already.
    #[error("network namespace {0} exists already (is a lab of that name running?)")]
    NamespaceExists(String),
    /// An interface did not come up.
    #[error("interface {interface} did not come up: {state}")]
    LinkNotUp {
        /// The interface.
        interface: String,
        /// What `ip link show` said last.
        state: String,
    },
    /// A network namespace name that cannot be used.
    #[error("network namespace name `{0}` must be 1 to 200 bytes, without `/` or a leading `.`")]
    InvalidNamespace(String),
    /// A number of paths the lab cannot have.
    #[error("a lab has 1 to {max} paths, not {0}", max = topology::MAX_PATHS)]
    Paths(usize),
    /// A path the lab does not have.
    #[error("the lab has no path {0}")]
    NoPath(usize),
    /// A lab name that cannot be used.
    #[error("lab name `{0}` must be 1 to {MAX_NAME_LEN} characters of a-z, A-Z, 0-9, `_` and `-`")]
    InvalidName(String),
    /// A link config is invalid.
    #[error("invalid link: {0}")]
    Config(#[from] crate::model::ConfigError),
    /// The path engine failed.
    #[error("emulator path: {0}")]
    Sim(#[from] crate::sim::SimError),
    /// The emulator thread is not running.
    #[error("the emulator is not running: {0}")]
    EmulatorStopped(String),
    /// A capture could not be written.
    #[error("capture: {0}")]
    Capture(String),
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}
