//! The real network: three network namespaces joined through a userspace link emulator, so
//! that real stacks (the Linux kernel's TCP, squarepeg over kernel TCP or TUN, any tool run
//! with [`NetNs::command`]) talk across the lab's impairments and middleboxes.
//!
//! ```text
//!  client ns ── veth ── [ emulator ns: AF_PACKET bridge running the simulator's path ] ── veth ── server ns
//! ```
//!
//! - [`Topology`]: the namespaces and veths, with IPv4 and IPv6 addresses on the two ends,
//!   offloads off, names that carry the owner's pid, removal on drop and
//!   [`cleanup_leftovers`] for crashed owners.
//! - [`Emulator`]: the bridge. Every IP packet goes through the same code as in the
//!   simulator — the emulator *is* the simulator's dumbbell ([`crate::sim::Simulator`]) run
//!   against the wall clock, with the two interfaces as its hosts — so a link spec and a
//!   middlebox list mean exactly the same in both engines. Statistics per direction
//!   ([`EmulatorStats`], JSON) and pcap captures on either interface, while running.
//! - [`Lab`]: both together behind one guard; what tests and `peg lab` use.
//!
//! The kernel here has no netem (machine notes), hence the userspace emulator. It needs root
//! (namespaces, veths, AF_PACKET), `ip` (iproute2) and `ethtool`.
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
pub use lab::{Lab, LabConfig, capture_path};
pub use netns::{NETNS_DIR, NetNs};
pub use packet_socket::{PacketSocket, Received};
pub use topology::{
    Addresses, CleanupReport, Interfaces, MAX_NAME_LEN, PREFIX, Role, Topology, TopologyInfo,
    cleanup_leftovers, lab_namespaces, namespace_name, parse_namespace_name, validate_name,
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
