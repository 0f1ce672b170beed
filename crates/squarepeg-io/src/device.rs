//! Opening a TUN device (IFF_TUN | IFF_NO_PI: each read and write is one whole IPv4 or IPv6
//! packet, no link-layer header, no packet-information prefix). With offloads (IFF_VNET_HDR
//! and TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6), each packet is preceded by a virtio-net header
//! and may be a TCP super-packet of up to 64 KB that the driver splits (reads) or coalesced
//! (writes): see the driver in `stack.rs`.

use std::io;

use crate::error::Error;

/// Smallest MTU the driver accepts: IPv4's minimum reassembly size, so the TCP MSS stays at
/// or above 536 (RFC 9293 §3.7.1). IPv6 needs 1280 (RFC 8200 §5); below that the kernel turns
/// IPv6 off on the device.
pub const MIN_MTU: u16 = 576;

/// Whether the device moves TCP super-packets with virtio-net headers (IFF_VNET_HDR with
/// TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6). Reads then carry the kernel's 64 KB TSO packets (one
/// system call per 64 KB instead of per segment), and writes carry coalesced segments marked
/// "checksum needed", which the kernel neither verifies nor recomputes and receives as one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Offload {
    /// On where the kernel supports it; otherwise off, with a warning in the log.
    #[default]
    Auto,
    /// On, or opening the device fails ([`Error::OffloadUnsupported`]).
    On,
    /// Off: one packet per read and write, checksums verified by the TCP core.
    Off,
}

/// How to open the device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TunConfig {
    /// Interface name; `None` lets the kernel pick `tunN`. An existing persistent device of
    /// that name is attached to (no root needed if it belongs to the caller's user).
    pub name: Option<String>,
    /// MTU to set; `None` keeps the device's (1500 for a new one). Changing it needs root.
    pub mtu: Option<u16>,
    /// Transmit queue length (packets the kernel queues for the driver to read; the kernel
    /// drops beyond it). `None` keeps the device's (500 for a new one).
    pub tx_queue_len: Option<u32>,
    /// TUN offloads (GSO/GRO with virtio-net headers); on where supported by default.
    pub offload: Offload,
}

impl TunConfig {
    /// A device of this name, other settings left as they are.
    pub fn named(name: impl Into<String>) -> Self {
        TunConfig {
            name: Some(name.into()),
            ..Default::default()
        }
    }
}

/// An open TUN device, up, in the network namespace of the thread that opened it.
///
/// A device this process created disappears (with its addresses and routes) when the last
/// file descriptor to it closes; a persistent one (`ip tuntap add`, `peg tcp setup`) stays.
pub struct TunDevice {
    pub(crate) device: tun_rs::SyncDevice,
    name: String,
    mtu: u16,
    offload: bool,
}

impl std::fmt::Debug for TunDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunDevice")
            .field("name", &self.name)
            .field("mtu", &self.mtu)
            .field("offload", &self.offload)
            .finish()
    }
}

/// Checks an interface name as the kernel does (`dev_valid_name`).
pub fn validate_device_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace());
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidDeviceName(name.to_string()))
    }
}

/// Checks an MTU for the driver.
pub fn validate_mtu(mtu: u32) -> Result<u16, Error> {
    if mtu < u32::from(MIN_MTU) {
        return Err(Error::InvalidMtu {
            mtu,
            reason: "below 576 the TCP MSS would fall under 536",
        });
    }
    u16::try_from(mtu).map_err(|_| Error::InvalidMtu {
        mtu,
        reason: "an IP packet on a TUN device is at most 65535 bytes",
    })
}

impl TunDevice {
    /// Opens (creating if needed) a TUN device, sets its MTU and queue length if asked, and
    /// brings it up. The device lives in the calling thread's network namespace.
    pub fn open(config: &TunConfig) -> Result<TunDevice, Error> {
        let shown = config.name.clone().unwrap_or_else(|| "tun%d".to_string());
        if let Some(name) = &config.name {
            validate_device_name(name)?;
        }
        if let Some(mtu) = config.mtu {
            validate_mtu(u32::from(mtu))?;
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
        {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::NoTunSupport),
            Err(e) => return Err(Error::TunNodeAccess(e)),
        }
        // Leave the up/down state, MTU and queue length alone while attaching: an unprivileged
        // user may attach to a persistent device they own but not change its settings.
        let build = |offload: bool| {
            let mut builder = tun_rs::DeviceBuilder::new()
                .inherit_enable_state()
                .offload(offload);
            if let Some(name) = &config.name {
                builder = builder.name(name.clone());
            }
            builder.build_sync()
        };
        let device = match config.offload {
            Offload::Off => build(false).map_err(|e| open_error(e, &shown))?,
            Offload::On => build(true).map_err(|e| offload_error(e, &shown))?,
            Offload::Auto => match build(true) {
                Ok(d) => d,
                Err(e) if offload_unsupported(&e) => {
                    tracing::warn!(
                        "TUN device `{shown}`: the kernel refused offloads ({e}); running \
                         without them, one packet per system call"
                    );
                    build(false).map_err(|e| open_error(e, &shown))?
                }
                Err(e) => return Err(open_error(e, &shown)),
            },
        };
        let offload = device.tcp_gso();
        let name = device
            .name()
            .map_err(|e| Error::io(format!("reading the name of {shown}"), e))?;
        let setting = |what: &str, e: io::Error| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => Error::Io {
                context: format!(
                    "{what} of TUN device `{name}` needs root (CAP_NET_ADMIN); set it when \
                     creating the device instead"
                ),
                source: e,
            },
            _ => Error::io(format!("{what} of TUN device `{name}`"), e),
        };
        let current_mtu = device.mtu().map_err(|e| setting("reading the MTU", e))?;
        let mtu = match config.mtu {
            Some(m) if m != current_mtu => {
                device
                    .set_mtu(m)
                    .map_err(|e| setting("setting the MTU", e))?;
                m
            }
            _ => current_mtu,
        };
        validate_mtu(u32::from(mtu))?;
        if let Some(len) = config.tx_queue_len
            && device.tx_queue_len().ok() != Some(len)
        {
            device
                .set_tx_queue_len(len)
                .map_err(|e| setting("setting the transmit queue length", e))?;
        }
        if !device.is_running().unwrap_or(false) {
            device
                .enabled(true)
                .map_err(|e| setting("bringing up", e))?;
        }
        Ok(TunDevice {
            device,
            name,
            mtu,
            offload,
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The MTU (the largest packet read or written).
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// Whether the device runs with offloads (virtio-net headers, TCP super-packets).
    pub fn offload(&self) -> bool {
        self.offload
    }
}

/// The device's file descriptor, non-blocking, registered with the driver's runtime.
pub(crate) type DeviceFd = tokio::io::unix::AsyncFd<tun_rs::SyncDevice>;

/// Reads one packet; `Ok(None)` when none is waiting.
pub(crate) fn read_packet(fd: &DeviceFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: read(2) into a buffer we own, of its length. The raw system call skips
        // libc's cancellation-point bookkeeping, measurable at one call per packet.
        let n = unsafe {
            libc::syscall(
                libc::SYS_read,
                fd.get_ref().as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// Writes one packet; `Ok(false)` when the device says "try again".
pub(crate) fn write_packet(fd: &DeviceFd, packet: &[u8]) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: write(2) of a buffer we borrow, of its length (see `read_packet`).
        let n = unsafe {
            libc::syscall(
                libc::SYS_write,
                fd.get_ref().as_raw_fd(),
                packet.as_ptr(),
                packet.len(),
            )
        };
        if n >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(false),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// A TUN device read and written one whole IP packet at a time from tokio tasks, for
/// applications of the device other than the userspace TCP's driver (`peg tunnel`'s device).
/// Opened without offloads ([`TunDevice::into_packets`]), so a read is never a super-packet.
pub struct PacketDevice {
    fd: DeviceFd,
    name: String,
    mtu: u16,
}

impl std::fmt::Debug for PacketDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketDevice")
            .field("name", &self.name)
            .field("mtu", &self.mtu)
            .finish()
    }
}

impl TunDevice {
    /// The device as a [`PacketDevice`], registered with the current tokio runtime. Fails
    /// for a device opened with offloads (open it with [`Offload::Off`]): its reads would be
    /// virtio-net headers and super-packets, not IP packets.
    pub fn into_packets(self) -> Result<PacketDevice, Error> {
        if self.offload {
            return Err(Error::io(
                format!("TUN device `{}`", self.name),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "opened with offloads; packet access needs Offload::Off",
                ),
            ));
        }
        let TunDevice {
            device, name, mtu, ..
        } = self;
        device
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("making TUN device `{name}` non-blocking"), e))?;
        // SAFETY: the device owns its descriptor, keeps it open until it is dropped (with the
        // AsyncFd) and always reports the same one.
        let fd = unsafe { tokio::io::unix::AsyncFd::register(device) }
            .map_err(|e| Error::io(format!("registering TUN device `{name}`"), e.into()))?;
        Ok(PacketDevice { fd, name, mtu })
    }
}

impl PacketDevice {
    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The MTU.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// Waits for the next packet and reads it into `buf` (a packet longer than `buf` is
    /// truncated by the kernel: give at least the MTU); returns its length.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.fd.readable().await?;
            match read_packet(&self.fd, buf)? {
                Some(n) => return Ok(n),
                None => ready.clear_ready(),
            }
        }
    }

    /// Writes one IP packet, waiting while the device's queue is full.
    pub async fn send(&self, packet: &[u8]) -> io::Result<()> {
        loop {
            let mut ready = self.fd.writable().await?;
            if write_packet(&self.fd, packet)? {
                return Ok(());
            }
            ready.clear_ready();
        }
    }
}

/// Errors that mean "this kernel (or device) cannot do offloads", as opposed to errors that
/// opening without offloads would meet as well: TUNSETIFF without IFF_VNET_HDR support or
/// TUNSETOFFLOAD without TSO/CSUM support answer EINVAL (or ENOTTY, EOPNOTSUPP).
fn offload_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::ENOTTY) | Some(libc::EOPNOTSUPP)
    )
}

fn offload_error(e: io::Error, device: &str) -> Error {
    if offload_unsupported(&e) {
        Error::OffloadUnsupported {
            device: device.to_string(),
            source: e,
        }
    } else {
        open_error(e, device)
    }
}

fn open_error(e: io::Error, device: &str) -> Error {
    let device = device.to_string();
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Error::PermissionDenied { device },
        Some(libc::EBUSY) => Error::DeviceBusy { device },
        Some(libc::EINVAL) => Error::NotTun { device },
        Some(libc::ENOENT) | Some(libc::ENODEV) => Error::NoTunSupport,
        _ => Error::io(format!("opening TUN device `{device}`"), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_mtus_are_checked() {
        assert!(validate_device_name("sp0").is_ok());
        assert!(validate_device_name("a-very-long-na").is_ok());
        for bad in ["", "a-very-long-name", "a/b", "a b", "a:b", "."] {
            assert!(
                matches!(validate_device_name(bad), Err(Error::InvalidDeviceName(_))),
                "{bad:?}"
            );
        }
        assert_eq!(validate_mtu(1500).unwrap(), 1500);
        assert_eq!(validate_mtu(65535).unwrap(), 65535);
        assert!(matches!(validate_mtu(575), Err(Error::InvalidMtu { .. })));
        assert!(matches!(validate_mtu(65536), Err(Error::InvalidMtu { .. })));
    }
}

/// An interface's counters as the kernel keeps them (`/proc/net/dev`). For a TUN device, `tx`
/// is kernel → driver (`tx_dropped`: packets the kernel dropped because the driver had not
/// read the queue in time) and `rx` is driver → kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    /// Bytes received by the kernel on the interface.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Bytes sent by the kernel through the interface.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Packets the kernel dropped on the way out (for TUN: the queue to the driver was full).
    pub tx_dropped: u64,
}

impl InterfaceCounters {
    /// Reads the counters of interface `name` in the calling thread's network namespace (from
    /// a thread that has joined another namespace, e.g. in `squarepeg_lab::net::NetNs::run`).
    pub fn read(name: &str) -> Result<InterfaceCounters, Error> {
        let path = "/proc/thread-self/net/dev";
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        for line in text.lines() {
            let Some((iface, rest)) = line.split_once(':') else {
                continue;
            };
            if iface.trim() != name {
                continue;
            }
            let v: Vec<u64> = rest
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            if v.len() < 12 {
                break;
            }
            return Ok(InterfaceCounters {
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_dropped: v[11],
            });
        }
        Err(Error::io(
            format!("reading counters of `{name}`"),
            io::Error::new(io::ErrorKind::NotFound, "no such interface here"),
        ))
    }
}
