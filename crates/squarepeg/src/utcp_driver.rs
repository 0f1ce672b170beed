//! The tokio driver of a connection over the userspace TCP: one task per connection owns a
//! `squarepeg-io` [`TcpStream`] in record mode (unordered receive + message writes, Minion's
//! `SO_UNORDERED` / `SO_UNORDEREDSEND`) and moves records between it and the uTCP glue
//! ([`Glue`]), which sits with the session in the state the application's handles share.
//! See the crate docs ("Over the userspace TCP") for why record mode.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use squarepeg_io::TcpStream;
use squarepeg_tcp::utcp::MIN_READ_BUFFER;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::config::ConnectionConfig;
use crate::connection::{Shared, State};
use crate::utcp::Glue;

/// What ended one wait of the driver.
enum Wake {
    Read(usize),
    Wrote(usize),
    Failed(io::Error),
    Notified,
    Timer,
}

pub(crate) async fn run(shared: Arc<Shared>, stream: TcpStream, config: ConnectionConfig) {
    let mut driver = Driver {
        shared,
        stream,
        rbuf: vec![0; config.read_buffer.max(MIN_READ_BUFFER)],
        out: Vec::with_capacity(config.write_batch + 64 * 1024),
        out_pos: 0,
        batch: config.write_batch.max(1),
        read_open: true,
    };
    driver.drive().await;
    let sh = &driver.shared;
    let mut st = sh.lock();
    if st.session.error().is_none() {
        st.session
            .handle_transport_closed(Instant::now(), "driver stopped");
    }
    st.driver_done = true;
    sh.dispatch(&mut st);
    sh.wake_all(&mut st);
    // Dropping the stream closes the TCP connection as close(2) does; the stack finishes the
    // exchange while it runs.
}

struct Driver {
    shared: Arc<Shared>,
    stream: TcpStream,
    /// One `read`: whole records (reports, segments).
    rbuf: Vec<u8>,
    /// Message records taken from the session, written from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    batch: usize,
    read_open: bool,
}

/// The glue and the session of a state that has the glue.
fn parts(st: &mut State) -> Option<(&mut Glue, &mut squarepeg_session::Session)> {
    let State { utcp, session, .. } = st;
    utcp.as_deref_mut().map(|g| (g, session))
}

impl Driver {
    async fn drive(&mut self) {
        loop {
            let now = Instant::now();
            let (timeout, receive_blocked, drained, fin) = {
                let mut st = self.shared.lock();
                let Some((glue, session)) = parts(&mut st) else {
                    return;
                };
                if self.out_pos == self.out.len() {
                    // A new batch only when the last one is written whole: frames wait in
                    // the session (or, once written, in the TCP's tagged queue), where late
                    // binding still applies to them.
                    self.out.clear();
                    self.out_pos = 0;
                    glue.poll_records(now, session, &mut self.out, self.batch);
                }
                let fin = self.out.is_empty() && glue.wants_fin(session);
                if fin {
                    glue.fin_sent = true;
                }
                let r = (
                    session.poll_timeout(),
                    session.receive_blocked(),
                    session.is_drained(),
                    fin,
                );
                self.shared.dispatch(&mut st);
                r
            };
            if fin && let Err(e) = self.stream.shutdown().await {
                self.failed(&e);
                continue;
            }
            if drained && self.out_pos == self.out.len() {
                return;
            }
            let readable = self.read_open && !receive_blocked;
            let wake = {
                let notified = pin!(self.shared.driver.notified());
                let mut notified = notified;
                let mut sleep = timeout.map(|t| Box::pin(tokio::time::sleep_until(t.into())));
                let (stream, rbuf, pending) =
                    (&mut self.stream, &mut self.rbuf, &self.out[self.out_pos..]);
                std::future::poll_fn(|cx| {
                    // Each poll registers the stack's waker for what would block, so any of
                    // them wakes this one future.
                    if !pending.is_empty() {
                        match Pin::new(&mut *stream).poll_write(cx, pending) {
                            Poll::Ready(Ok(n)) => return Poll::Ready(Wake::Wrote(n)),
                            Poll::Ready(Err(e)) => return Poll::Ready(Wake::Failed(e)),
                            Poll::Pending => {}
                        }
                    }
                    if readable {
                        let mut buf = ReadBuf::new(rbuf);
                        match Pin::new(&mut *stream).poll_read(cx, &mut buf) {
                            Poll::Ready(Ok(())) => {
                                return Poll::Ready(Wake::Read(buf.filled().len()));
                            }
                            Poll::Ready(Err(e)) => return Poll::Ready(Wake::Failed(e)),
                            Poll::Pending => {}
                        }
                    }
                    if notified.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Wake::Notified);
                    }
                    if let Some(s) = sleep.as_mut()
                        && s.as_mut().poll(cx).is_ready()
                    {
                        return Poll::Ready(Wake::Timer);
                    }
                    Poll::Pending
                })
                .await
            };
            match wake {
                Wake::Wrote(n) => self.out_pos += n,
                Wake::Read(n) => self.received(n),
                Wake::Failed(e) => self.failed(&e),
                Wake::Notified => {}
                Wake::Timer => {
                    let mut st = self.shared.lock();
                    let now = Instant::now();
                    if st.session.poll_timeout().is_some_and(|t| t <= now) {
                        st.session.handle_timeout(now);
                    }
                }
            }
        }
    }

    /// `n` bytes of records were read (0: the end of the peer's stream).
    fn received(&mut self, n: usize) {
        let now = Instant::now();
        let mut st = self.shared.lock();
        let Some((glue, session)) = parts(&mut st) else {
            return;
        };
        if n == 0 {
            self.read_open = false;
            glue.transport_closed(now, session, "peer closed the TCP connection");
        } else if let Err(e) = glue.handle_records(now, session, &self.rbuf[..n]) {
            // Our own stack's records: malformed ones are a bug, not the peer's doing.
            tracing::error!("uTCP record stream: {e}");
            self.read_open = false;
            self.out.clear();
            self.out_pos = 0;
            glue.transport_closed(now, session, &e.to_string());
        }
        self.shared.dispatch(&mut st);
    }

    fn failed(&mut self, e: &io::Error) {
        self.out.clear();
        self.out_pos = 0;
        self.read_open = false;
        let mut st = self.shared.lock();
        if let Some((glue, session)) = parts(&mut st) {
            glue.fin_sent = true;
            glue.transport_closed(Instant::now(), session, &e.to_string());
        }
        self.shared.dispatch(&mut st);
    }
}
