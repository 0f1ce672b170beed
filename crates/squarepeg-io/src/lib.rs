//! Packet I/O for squarepeg's userspace TCP: a driver that runs a sans-IO
//! [`squarepeg_tcp::Endpoint`] on a Linux TUN device and gives tokio users connections.
//!
//! The TUN device carries whole IPv4 and IPv6 packets (IFF_TUN | IFF_NO_PI). A [`Stack`] owns
//! the device from a driver thread, feeds every packet it reads to the endpoint, writes every
//! packet the endpoint produces, and runs the endpoint's timers; per wake-up it drains all
//! readable packets and all packets ready to send, in batches. Applications hold
//! [`TcpStream`]s (`AsyncRead` + `AsyncWrite`, shutdown = FIN) and [`TcpListener`]s. The
//! endpoint's secret key (ISNs, SYN cookies, timestamp offsets) comes from the operating
//! system's random generator. The driver holds no protocol logic: everything TCP is the
//! endpoint's.
//!
//! # Setting up the host
//!
//! The kernel and squarepeg are two hosts joined by the TUN device. Four things are needed
//! (`docs/tun.md` has the long form):
//!
//! 1. **A TUN device the user may open.** Root (CAP_NET_ADMIN) can create one on the fly
//!    ([`TunDevice::open`]; it disappears when the process closes it). Otherwise create a
//!    persistent device owned by the user once:
//!    `sudo ip tuntap add dev sp0 mode tun user $USER` (or `sudo peg tcp setup --user $USER`).
//! 2. **An address for the kernel side** on the device, e.g. `ip addr add 10.77.0.1/24 dev sp0`
//!    and `ip -6 addr add fd00:77::1/64 dev sp0 nodad`, and the device up
//!    (`ip link set sp0 up`).
//! 3. **The address squarepeg's stack uses** behind the device, e.g. 10.77.0.2 and
//!    fd00:77::2: given to [`StackConfig::addresses`], configured nowhere in the kernel.
//! 4. **A route** from the kernel to that address through the device. The prefix of the
//!    kernel's address gives it (10.77.0.0/24 dev sp0); for a stack address outside the
//!    prefix, `ip route add 10.99.0.2 dev sp0`.
//!
//! [`HostSetup`] runs exactly these `ip` commands (in a namespace if asked), and
//! [`HostSetup::create_persistent`] does step 1 too. Kernel programs then reach the stack at
//! its address (`nc 10.77.0.2 7`), and the stack reaches them at the kernel's.
//!
//! # Example
//!
//! ```no_run
//! use squarepeg_io::{HostSetup, Stack, StackConfig, TunConfig, TunDevice};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let device = TunDevice::open(&TunConfig::named("sp0"))?;
//! let setup = HostSetup::lab("sp0"); // kernel 10.77.0.1/24, stack 10.77.0.2, and IPv6
//! setup.apply()?;
//! let stack = Stack::new(device, StackConfig::new(setup.stack_addresses()))?;
//!
//! // A server on the stack's port 7: `nc 10.77.0.2 7` from the kernel side.
//! let listener = stack.listen_port(7)?;
//! let (mut conn, peer) = listener.accept().await?;
//! let mut buf = vec![0; 4096];
//! let n = conn.read(&mut buf).await?;
//! conn.write_all(&buf[..n]).await?;
//! conn.shutdown().await?; // FIN
//! println!("{peer}: {:?}", conn.stats()?);
//!
//! // A client: the kernel's sockets listen on 10.77.0.1.
//! let mut c = stack.connect("10.77.0.1:8080".parse()?).await?;
//! c.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
//! # Ok(()) }
//! ```
//!
//! # Offloads
//!
//! By default ([`Offload::Auto`] in [`TunConfig::offload`]) the device is opened with
//! IFF_VNET_HDR and the kernel's TSO and checksum offloads where the kernel supports them
//! (a warning is logged otherwise, and the driver runs one packet per system call). Reads then
//! deliver the kernel's TCP super-packets of up to 64 KB, which the driver splits into
//! MSS-sized segments with complete checksums; writes coalesce consecutive segments of a flow
//! (GRO) into one super-packet the kernel receives in one pass, without checksumming it. The
//! TCP core still sees and makes ordinary segments, and so do the capture and the impairment
//! shim. [`DeviceStats`] counts the system calls and the super-packets both ways.
//!
//! # Impairments and captures
//!
//! [`StackConfig::impairment`] puts a [`PathModel`], one each way, between the device and the
//! endpoint: packets are lost, delayed, reordered or duplicated as the model says and held
//! until their arrival time (delivered at the driver's timer resolution, 1 ms).
//! [`StackConfig::capture`] hands every packet crossing the device to a [`PacketTap`], as the
//! kernel sees it. This crate brings no model and no file format of its own: the lab's link
//! model and pcap writer plug in there (`squarepeg_lab::stack`), so that using the driver
//! does not mean compiling the lab.
//!
//! # Namespaces
//!
//! A TUN device belongs to the network namespace of the thread that creates it, so opening it
//! on a thread that has joined another namespace (`squarepeg_lab::net::NetNs::run`) puts it
//! there; [`HostSetup::netns`] configures the kernel's side of it in that namespace. The lab
//! puts a stack on one end of its network with `squarepeg_lab::stack::LabStack`.

mod device;
mod error;
mod offload;
mod setup;
mod shim;
mod stack;
mod stream;

pub use device::{
    InterfaceCounters, MIN_MTU, Offload, PacketDevice, TunConfig, TunDevice, validate_device_name,
    validate_mtu,
};
pub use error::Error;
pub use setup::{AddressPair, HostSetup, LAB_V4, LAB_V6, check_unicast};
pub use shim::{DEFAULT_MAX_HELD_PACKETS, Impairment, PathModel, ShimStats};
pub use stack::{
    DEFAULT_BACKLOG, DEFAULT_BATCH, DeviceStats, PacketTap, Stack, StackConfig, StackStats,
    TURN_BYTES,
};
pub use stream::{TcpListener, TcpStream};

/// The TCP core's types a user of this crate needs.
pub use squarepeg_tcp::{
    CloseReason, ConnectionConfig, ConnectionStats, EndpointConfig, EndpointStats, FastOpenCookie,
    FastOpenEntry, FastOpenStats, Negotiated, State as TcpState,
};
