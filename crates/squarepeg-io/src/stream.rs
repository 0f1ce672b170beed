//! Connection and listener handles for tokio users.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use squarepeg_tcp::{
    CloseReason, ConnectionHandle, ConnectionStats, ListenerHandle, Negotiated, State as TcpState,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::tcp_to_io;
use crate::stack::{ConnSlot, Shared, register, wake_all};

/// The error a connection that closed for `reason` gives to operations that need it open.
fn closed_error(reason: CloseReason) -> io::Error {
    let (kind, what) = match reason {
        CloseReason::Normal => (io::ErrorKind::NotConnected, "connection closed"),
        CloseReason::Reset => (io::ErrorKind::ConnectionReset, "connection reset by peer"),
        CloseReason::Refused => (io::ErrorKind::ConnectionRefused, "connection refused"),
        CloseReason::TimedOut => (io::ErrorKind::TimedOut, "connection timed out"),
        CloseReason::Aborted => (io::ErrorKind::ConnectionAborted, "connection aborted"),
    };
    io::Error::new(kind, what)
}

/// A TCP connection of a [`Stack`](crate::Stack): tokio `AsyncRead` and `AsyncWrite`.
///
/// `poll_shutdown` sends FIN after the data written so far (a half-close: reading goes on
/// until the peer's FIN). Dropping the stream closes it as `close(2)` does: FIN, and the stack
/// finishes the exchange in the background while it runs; with data still unread, or data
/// arriving later, the connection is reset instead (RFC 9293 §3.10.4, RFC 2525 §2.17). To know
/// that the peer has everything, shut down, read to the end, and await
/// [`wait_closed`](Self::wait_closed) before dropping.
///
/// Reads and writes from several tasks are fine (e.g. after `tokio::io::split`): reading and
/// writing each keep their own waker.
pub struct TcpStream {
    shared: Arc<Shared>,
    handle: ConnectionHandle,
    local: SocketAddr,
    peer: SocketAddr,
    /// The handle was released already (by `abort`).
    released: bool,
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStream")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish()
    }
}

impl TcpStream {
    pub(crate) fn new(
        shared: Arc<Shared>,
        handle: ConnectionHandle,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Self {
        TcpStream {
            shared,
            handle,
            local,
            peer,
            released: false,
        }
    }

    /// The stack's end of the connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer's end.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The connection's counters: RTT, congestion window, retransmissions, buffers, ...
    pub fn stats(&self) -> io::Result<ConnectionStats> {
        self.shared
            .lock()
            .endpoint
            .stats_of(self.handle)
            .map_err(tcp_to_io)
    }

    /// The options negotiated in the handshake (MSS, window scale, SACK, timestamps).
    pub fn negotiated(&self) -> io::Result<Negotiated> {
        self.shared
            .lock()
            .endpoint
            .connection(self.handle)
            .map(|c| c.negotiated())
            .ok_or_else(|| tcp_to_io(squarepeg_tcp::Error::UnknownConnection))
    }

    /// Replaces the connection's padder (inconsistent retransmissions), when it has one: the
    /// layer above installs its own once it exists (a TLS connection seals padding records,
    /// `squarepeg_tcp::Endpoint::set_padder`). Returns whether one was replaced.
    pub fn replace_padder(&self, padder: squarepeg_tcp::Padder) -> io::Result<bool> {
        let mut st = self.shared.lock();
        let has = st
            .endpoint
            .connection(self.handle)
            .ok_or_else(|| tcp_to_io(squarepeg_tcp::Error::UnknownConnection))?
            .has_padder();
        if has {
            st.endpoint
                .set_padder(self.handle, Some(padder))
                .map_err(tcp_to_io)?;
        }
        Ok(has)
    }

    /// The TCP state (RFC 9293 §3.3.2).
    pub fn state(&self) -> io::Result<TcpState> {
        self.shared
            .lock()
            .endpoint
            .connection(self.handle)
            .map(|c| c.state())
            .ok_or_else(|| tcp_to_io(squarepeg_tcp::Error::UnknownConnection))
    }

    /// Completes when the connection has closed: both FINs sent and acknowledged (TIME-WAIT
    /// or CLOSED), or a reset, refusal, time-out or abort. Returns why.
    pub async fn wait_closed(&self) -> io::Result<CloseReason> {
        poll_fn(|cx| {
            let mut st = self.shared.lock();
            let slot = st.conns.get_mut(&self.handle);
            if let Some(reason) = slot.as_ref().and_then(|s| s.closed) {
                return Poll::Ready(Ok(reason));
            }
            st.check_running()?;
            if let Some(slot) = st.conns.get_mut(&self.handle) {
                register(&mut slot.closed_waiter, cx.waker());
            }
            Poll::Pending
        })
        .await
    }

    /// Completes when the handshake has.
    pub(crate) async fn wait_established(&self) -> io::Result<()> {
        poll_fn(|cx| {
            let mut st = self.shared.lock();
            let Some(slot) = st.conns.get_mut(&self.handle) else {
                return Poll::Ready(Err(tcp_to_io(squarepeg_tcp::Error::UnknownConnection)));
            };
            if slot.established {
                return Poll::Ready(Ok(()));
            }
            if let Some(reason) = slot.closed {
                return Poll::Ready(Err(closed_error(reason)));
            }
            register(&mut slot.connect, cx.waker());
            st.check_running()?;
            Poll::Pending
        })
        .await
    }

    /// Resets the connection (RST) and releases it.
    pub fn abort(mut self) {
        {
            let mut st = self.shared.lock();
            let _ = st.endpoint.abort(Instant::now(), self.handle);
            st.conns.remove(&self.handle);
        }
        self.released = true;
        self.shared.wake_driver.notify_one();
    }

    /// Runs `op` on the endpoint for this connection; on `WouldBlock`, parks the waker that
    /// `slot` selects.
    fn poll_op<T>(
        &self,
        cx: &mut Context<'_>,
        op: impl FnOnce(
            &mut squarepeg_tcp::Endpoint,
            ConnectionHandle,
        ) -> Result<T, squarepeg_tcp::Error>,
        slot: fn(&mut ConnSlot) -> &mut Option<std::task::Waker>,
    ) -> Poll<io::Result<T>> {
        let mut wake = Vec::new();
        let mut st = self.shared.lock();
        st.check_running()?;
        let r = op(&mut st.endpoint, self.handle);
        match r {
            Ok(v) => {
                st.dispatch(&mut wake);
                drop(st);
                wake_all(wake);
                self.shared.wake_driver.notify_one();
                Poll::Ready(Ok(v))
            }
            Err(squarepeg_tcp::Error::WouldBlock) => {
                if let Some(s) = st.conns.get_mut(&self.handle) {
                    register(slot(s), cx.waker());
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(tcp_to_io(e))),
        }
    }
}

impl AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let unfilled = buf.initialize_unfilled();
        let n = std::task::ready!(this.poll_op(cx, |ep, h| ep.read(h, unfilled), |s| &mut s.read))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TcpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.get_mut()
            .poll_op(cx, |ep, h| ep.write(h, data), |s| &mut s.write)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written data is in the endpoint's send buffer, which sends it as the windows allow.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_op(cx, |ep, h| ep.shutdown(Instant::now(), h), |s| &mut s.write)
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        {
            let mut st = self.shared.lock();
            let _ = st.endpoint.close(Instant::now(), self.handle);
            st.conns.remove(&self.handle);
        }
        self.shared.wake_driver.notify_one();
    }
}

/// A listener of a [`Stack`](crate::Stack), on one or more addresses.
pub struct TcpListener {
    shared: Arc<Shared>,
    handles: Vec<ListenerHandle>,
    addrs: Vec<SocketAddr>,
}

impl std::fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListener")
            .field("addrs", &self.addrs)
            .finish()
    }
}

impl TcpListener {
    pub(crate) fn new(
        shared: Arc<Shared>,
        handles: Vec<ListenerHandle>,
        addrs: Vec<SocketAddr>,
    ) -> Self {
        TcpListener {
            shared,
            handles,
            addrs,
        }
    }

    /// The addresses listened on.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Waits for the next established connection; returns it and the peer's address.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for the next established connection.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        let mut wake = Vec::new();
        let mut st = self.shared.lock();
        st.check_running()?;
        for &l in &self.handles {
            let Some(h) = st.endpoint.accept(l) else {
                continue;
            };
            let Some((local, peer)) = st
                .endpoint
                .connection(h)
                .map(|c| (c.local_addr(), c.remote_addr()))
            else {
                continue;
            };
            st.conns.insert(
                h,
                ConnSlot {
                    established: true,
                    ..Default::default()
                },
            );
            // `accept` reports what happened before the connection was visible.
            st.dispatch(&mut wake);
            drop(st);
            wake_all(wake);
            return Poll::Ready(Ok((
                TcpStream::new(self.shared.clone(), h, local, peer),
                peer,
            )));
        }
        for l in &self.handles {
            if let Some(w) = st.listeners.get_mut(l) {
                register(w, cx.waker());
            }
        }
        Poll::Pending
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            for h in &self.handles {
                st.listeners.remove(h);
                let _ = st.endpoint.unlisten(Instant::now(), *h);
            }
        }
        self.shared.wake_driver.notify_one();
    }
}
