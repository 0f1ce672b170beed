//! TCP Fast Open over kernel TCP (RFC 7413).
//!
//! A client socket gets `TCP_FASTOPEN_CONNECT`: `connect` returns at once and the kernel
//! sends the SYN with the first write, carrying its bytes when it holds a cookie from the
//! server, and with a cookie request otherwise. The kernel does the rest: a SYN-ACK that
//! acknowledges only the SYN makes it send the data again after the handshake, and a SYN
//! with data that goes unanswered makes it retry without data and stop using Fast Open
//! towards that server for a while (its "blackhole" detection). Without a cookie, that
//! first write fails with `EINPROGRESS` and nothing is queued; [`KernelStream`] then waits
//! for the connection as a plain socket would.
//!
//! A listener gets `TCP_FASTOPEN` with a queue length: a SYN with data and a valid cookie is
//! accepted at once, its data readable before the handshake completes, so a server's answer
//! can leave right behind its SYN-ACK.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A kernel TCP socket as the driver uses it: a plain stream, except that a Fast Open
/// client's first write may find the connection not yet open. Shared (an `Arc`): the
/// application's receive calls may read from it themselves ([`crate::connection::Shared`]'s
/// inline reads); reads and writes go through the socket's readiness, as tokio's own
/// `TcpStream` does.
#[derive(Debug)]
pub(crate) struct KernelStream(pub(crate) Arc<TcpStream>);

impl AsyncRead for KernelStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Readiness cleared: the next poll registers for the next.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for KernelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut in_progress_seen = false;
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Fast Open without a cookie: the SYN (with a cookie request) left and
                // nothing was queued. A write now fails with EAGAIN until the handshake
                // completes, which registers this task for the socket's writability.
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) && !in_progress_seen => {
                    in_progress_seen = true;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Nothing is buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write))
    }
}

/// A Fast Open client socket "connected" to `remote`: the SYN goes with the first write.
#[cfg(target_os = "linux")]
pub(crate) fn connect(remote: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_nonblocking(true)?;
    set_int_option(&socket, libc::TCP_FASTOPEN_CONNECT, 1)?;
    match socket.connect(&remote.into()) {
        Ok(()) => {}
        // Fast Open off in the kernel (net.ipv4.tcp_fastopen without bit 0): an ordinary
        // non-blocking connect, which the first write waits for.
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    TcpStream::from_std(socket.into())
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn connect(_remote: SocketAddr) -> io::Result<TcpStream> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "TCP Fast Open is supported on Linux only",
    ))
}

/// Turns on Fast Open on a listening socket, with `queue` pending connections at most.
#[cfg(target_os = "linux")]
pub(crate) fn listen(listener: &TcpListener, queue: u32) -> io::Result<()> {
    set_int_option(
        listener,
        libc::TCP_FASTOPEN,
        queue.min(i32::MAX as u32) as i32,
    )
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn listen(_listener: &TcpListener, _queue: u32) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "TCP Fast Open is supported on Linux only",
    ))
}

#[cfg(target_os = "linux")]
fn set_int_option(
    socket: &impl std::os::fd::AsRawFd,
    option: libc::c_int,
    value: i32,
) -> io::Result<()> {
    // SAFETY: a valid descriptor, and a pointer to an int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `TCP_CORK` on or off: while on, the kernel sends only full segments.
#[cfg(target_os = "linux")]
pub(crate) fn set_cork(socket: &TcpStream, on: bool) -> io::Result<()> {
    socket2::SockRef::from(socket).set_tcp_cork(on)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn set_cork(_socket: &TcpStream, _on: bool) -> io::Result<()> {
    Ok(())
}

/// `TCP_QUICKACK`: off puts the connection in delayed-ACK ("ping-pong") mode, where an ACK
/// waits (up to the delayed-ACK timeout) to ride on data the application sends.
#[cfg(target_os = "linux")]
pub(crate) fn set_quickack(socket: &TcpStream, on: bool) -> io::Result<()> {
    socket2::SockRef::from(socket).set_tcp_quickack(on)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn set_quickack(_socket: &TcpStream, _on: bool) -> io::Result<()> {
    Ok(())
}
