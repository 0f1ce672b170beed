//! An AF_PACKET socket bound to one interface: whole Ethernet frames in and out.
//!
//! Why AF_PACKET and not TUN: the emulator sits *between* two veth ends as a bridge, so it
//! must see and produce Ethernet frames (ARP and neighbour discovery included) on existing
//! interfaces; a TUN device would be a routed hop with its own addresses, and the kernel of
//! the emulator namespace would then forward, fragment and answer ICMP itself.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Receive and send buffer asked for each socket: a burst of a few thousand full-size frames
/// (a TCP sender's window arriving at once) must fit while the emulator thread is busy.
const SOCKET_BUFFER: libc::c_int = 16 * 1024 * 1024;

/// An AF_PACKET raw socket on one interface (non-blocking).
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
    kernel_drops: u64,
}

/// What [`PacketSocket::recv`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A frame of this many bytes (cut to the buffer if `truncated`).
    Frame {
        /// Bytes in the buffer.
        len: usize,
        /// The frame was longer than the buffer.
        truncated: bool,
    },
    /// Nothing is waiting.
    Empty,
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl PacketSocket {
    /// Opens a socket on interface `ifindex` of the calling thread's network namespace. It
    /// receives frames arriving on the interface (not the ones it or the host sends) and sends
    /// whole frames out of it.
    pub fn open(ifindex: u32) -> io::Result<Self> {
        // Protocol 0 receives nothing until bound, so no frame of another interface slips in
        // between socket() and bind().
        // SAFETY: plain socket creation; the result is checked.
        let fd = check(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let socket = Self {
            fd,
            ifindex,
            kernel_drops: 0,
        };
        // Frames this socket sends would otherwise come back as PACKET_OUTGOING copies.
        socket.set_int(libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)?;
        // Root may exceed rmem_max/wmem_max with the FORCE variants; fall back if not root.
        if socket
            .set_int(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCKET_BUFFER)
            .is_err()
        {
            socket.set_int(libc::SOL_SOCKET, libc::SO_RCVBUF, SOCKET_BUFFER)?;
        }
        if socket
            .set_int(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCKET_BUFFER)
            .is_err()
        {
            socket.set_int(libc::SOL_SOCKET, libc::SO_SNDBUF, SOCKET_BUFFER)?;
        }
        let address = socket.address();
        // SAFETY: address is a valid sockaddr_ll of the size passed.
        check(unsafe {
            libc::bind(
                socket.fd.as_raw_fd(),
                (&address as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(socket)
    }

    fn address(&self) -> libc::sockaddr_ll {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as libc::c_ushort;
        address.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        address.sll_ifindex = self.ifindex as libc::c_int;
        address
    }

    fn set_int(&self, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
        // SAFETY: value is a live c_int of the size passed.
        check(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
        .map(|_| ())
    }

    /// Receives one frame into `buf` without blocking.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Received> {
        loop {
            // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buf and from are valid for the lengths passed; MSG_TRUNC makes the
            // kernel return the real frame length even when it is cut.
            let rc = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if rc < 0 {
                let error = io::Error::last_os_error();
                return match error.kind() {
                    io::ErrorKind::WouldBlock => Ok(Received::Empty),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(error),
                };
            }
            // Belt and braces: old kernels ignore PACKET_IGNORE_OUTGOING.
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let len = rc as usize;
            return Ok(Received::Frame {
                len: len.min(buf.len()),
                truncated: len > buf.len(),
            });
        }
    }

    /// Sends one whole frame without blocking.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: frame is valid for its length.
        let rc = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Frames the kernel dropped because this socket's receive buffer was full, since it was
    /// opened.
    pub fn kernel_drops(&mut self) -> u64 {
        // SAFETY: tpacket_stats is plain data; all-zero is a valid value.
        let mut stats: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: stats is valid for len bytes. The kernel resets its counters on each read,
        // so they are accumulated here.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc == 0 {
            self.kernel_drops += u64::from(stats.tp_drops);
        }
        self.kernel_drops
    }

    /// The descriptor, for polling.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
