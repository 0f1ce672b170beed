//! Error types of the driver, the device and the host set-up, and the mapping of the TCP core's
//! errors to `std::io::Error` for the tokio traits.

use std::io;

use thiserror::Error;

/// Why a TUN device, a host set-up step or the stack could not be brought up.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening or creating the device needs CAP_NET_ADMIN, unless it is a persistent device
    /// owned by the caller.
    #[error(
        "permission denied opening TUN device `{device}`: run as root (CAP_NET_ADMIN), or create \
         a persistent device owned by your user first (`sudo peg tcp setup --user $USER`)"
    )]
    PermissionDenied {
        /// The device name asked for (or `tun%d`).
        device: String,
    },
    /// `/dev/net/tun` itself may not be opened by this user.
    #[error(
        "cannot open /dev/net/tun: {0}; it must be readable and writable by your user (most \
         distributions make it mode 0666: `sudo chmod 0666 /dev/net/tun`), or run as root"
    )]
    TunNodeAccess(io::Error),
    /// A non-multiqueue TUN device is already attached to another file descriptor.
    #[error("TUN device `{device}` is busy: another process has it open")]
    DeviceBusy {
        /// The device name.
        device: String,
    },
    /// The name belongs to an interface that is not a TUN device of the right kind.
    #[error(
        "`{device}` exists but is not a TUN device this driver can attach to (a TAP, a \
         multiqueue TUN or another kind of interface)"
    )]
    NotTun {
        /// The device name.
        device: String,
    },
    /// Offloads were required ([`Offload::On`](crate::Offload::On)) but the kernel refused
    /// IFF_VNET_HDR or the TSO/checksum offloads on this device.
    #[error(
        "TUN device `{device}`: the kernel refused offloads (IFF_VNET_HDR with TSO and checksum \
         offload): {source}; open it with offloads off (or `auto`)"
    )]
    OffloadUnsupported {
        /// The device name.
        device: String,
        /// What the kernel said.
        source: io::Error,
    },
    /// `/dev/net/tun` is missing (no TUN support in this kernel or container).
    #[error("/dev/net/tun is missing: this kernel or container has no TUN support")]
    NoTunSupport,
    /// A bad device name.
    #[error("invalid device name `{0}`: 1 to 15 bytes, no `/`, whitespace or NUL")]
    InvalidDeviceName(String),
    /// A bad MTU.
    #[error("invalid MTU {mtu}: {reason}")]
    InvalidMtu {
        /// The MTU given.
        mtu: u32,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An address that cannot be used (as the stack's own, as the kernel side's, or as a
    /// peer).
    #[error("bad address {address}: {reason}")]
    BadAddress {
        /// The address.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A host set-up command (iproute2) failed.
    #[error("`{command}` failed: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status and error output.
        message: String,
    },
    /// Any other I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn bad_address(address: impl ToString, reason: impl Into<String>) -> Self {
        Error::BadAddress {
            address: address.to_string(),
            reason: reason.into(),
        }
    }
}

/// Maps a TCP core error to the `std::io::Error` a tokio user expects, keeping the core's error
/// as the source.
pub(crate) fn tcp_to_io(e: squarepeg_tcp::Error) -> io::Error {
    use squarepeg_tcp::Error as E;
    let kind = match e {
        E::WouldBlock => io::ErrorKind::WouldBlock,
        E::NotConnected => io::ErrorKind::NotConnected,
        E::SendShutdown => io::ErrorKind::BrokenPipe,
        E::ConnectionReset => io::ErrorKind::ConnectionReset,
        E::ConnectionRefused => io::ErrorKind::ConnectionRefused,
        E::TimedOut => io::ErrorKind::TimedOut,
        E::Aborted => io::ErrorKind::ConnectionAborted,
        E::Closed => io::ErrorKind::NotConnected,
        E::AddressInUse => io::ErrorKind::AddrInUse,
        E::InvalidAddress(_) => io::ErrorKind::InvalidInput,
        E::TooManyConnections => io::ErrorKind::OutOfMemory,
        E::UnknownConnection | E::UnknownListener | E::InvalidRange => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

/// The error every operation returns once the driver has stopped.
pub(crate) fn stopped_error(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        format!("the squarepeg stack's driver has stopped: {why}"),
    )
}
