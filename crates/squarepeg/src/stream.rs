//! Streams as tokio `AsyncRead` + `AsyncWrite`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use squarepeg_session::{Priority, ReadOutcome, StreamError, StreamId};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection::Connection;

/// An ordered, reliable, bidirectional byte stream of a [`Connection`].
///
/// Reading returns the peer's bytes in order and then end-of-file at its
/// FIN; `shutdown` sends our FIN. Errors are `io::Error`s wrapping a
/// [`StreamError`] (get it with `io::Error::get_ref` and `downcast_ref`):
/// `ConnectionReset` for a peer's reset, `BrokenPipe` when the peer stopped
/// reading, `ConnectionAborted` when the connection closed.
///
/// Dropping the stream finishes its sending side (if not finished or
/// reset) and stops its receiving side (if not read to the end).
pub struct Stream {
    conn: Connection,
    id: StreamId,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("id", &self.id).finish()
    }
}

fn io_error(e: StreamError) -> io::Error {
    let kind = match e {
        StreamError::Reset { .. } => io::ErrorKind::ConnectionReset,
        StreamError::Stopped { .. } | StreamError::SendClosed(_) => io::ErrorKind::BrokenPipe,
        StreamError::Connection(_) => io::ErrorKind::ConnectionAborted,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

impl Stream {
    pub(crate) fn new(conn: Connection, id: StreamId) -> Self {
        Self { conn, id }
    }

    /// The stream id (client-opened even, server-opened odd).
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The connection this stream belongs to.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    fn with<T>(&self, f: impl FnOnce(&mut squarepeg_session::Session) -> T) -> T {
        let sh = self.conn.shared();
        let mut st = sh.lock();
        let r = f(st.conn.session_mut());
        sh.dispatch(&mut st);
        drop(st);
        sh.wake_driver();
        r
    }

    /// Sets the urgency class of this stream's data (default 3).
    pub fn set_priority(&self, priority: Priority) -> Result<(), StreamError> {
        self.with(|s| s.set_stream_priority(self.id, priority))
    }

    /// In a multipath session: which connection carries this stream's data (default:
    /// aggregate, spread over all).
    pub fn set_path(&self, path: squarepeg_session::PathPolicy) -> Result<(), StreamError> {
        self.with(|s| s.set_stream_path(self.id, path))
    }

    /// Abandons the sending side: unsent data is dropped, the peer's reads
    /// fail with `code`.
    pub fn reset(&self, code: u64) -> Result<(), StreamError> {
        self.with(|s| s.stream_reset(self.id, code))
    }

    /// Stops reading: the peer's writes fail with `code`.
    pub fn stop(&self, code: u64) -> Result<(), StreamError> {
        self.with(|s| s.stream_stop(self.id, code))
    }

    /// Ends the sending side (FIN), like `AsyncWriteExt::shutdown`.
    pub fn finish(&self) -> Result<(), StreamError> {
        self.with(|s| s.stream_finish(self.id))
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Take part in tokio's cooperative budget (see send_message).
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let sh = self.conn.shared();
        let mut st = sh.lock();
        let r = st
            .conn
            .session_mut()
            .stream_read(self.id, buf.initialize_unfilled());
        if !matches!(r, Ok(ReadOutcome::Blocked)) {
            coop.made_progress();
        }
        match r {
            Ok(ReadOutcome::Data(n)) => {
                buf.advance(n);
                // Reading may have freed credit the peer is waiting for.
                let wake_driver = st.conn.session_mut().has_pending_control();
                drop(st);
                if wake_driver {
                    sh.wake_driver();
                }
                Poll::Ready(Ok(()))
            }
            Ok(ReadOutcome::Finished) => Poll::Ready(Ok(())),
            Ok(ReadOutcome::Blocked) => {
                st.read_wakers.insert(self.id, cx.waker().clone());
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let sh = self.conn.shared();
        let mut st = sh.lock();
        let r = st.conn.session_mut().stream_write(self.id, buf);
        if !matches!(r, Ok(0)) {
            coop.made_progress();
        }
        match r {
            Ok(0) => {
                st.write_wakers.insert(self.id, cx.waker().clone());
                Poll::Pending
            }
            Ok(n) => {
                drop(st);
                sh.wake_driver();
                Poll::Ready(Ok(n))
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written bytes are in the session's queue; the driver sends them
        // as the scheduler and flow control allow.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.with(|s| s.stream_finish(self.id)) {
            Ok(()) | Err(StreamError::SendClosed(_)) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let sh = self.conn.shared();
        let mut st = sh.lock();
        st.read_wakers.remove(&self.id);
        st.write_wakers.remove(&self.id);
        st.conn.session_mut().stream_release(self.id);
        sh.dispatch(&mut st);
        drop(st);
        sh.wake_driver();
    }
}
