//! The per-connection driver task, the same for every substrate: it owns the transport,
//! hands the connection core (`squarepeg_connection::Connection`, shared with the
//! application's handles) what the transport reads, writes what the core gives, and runs the
//! core's timer. Everything protocol-related is in the core; what differs between substrates
//! — how output is encoded for the transport and where reads go — is a [`Wire`].

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use squarepeg_connection::TransportError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection::{Shared, State};
use crate::core::{Core, Port};

/// Bytes of output taken from the core per lock acquisition: encoding happens under the
/// lock, and the application should not wait a whole batch to queue a message.
const LOCK_SLICE: usize = 16 * 1024;

/// While the application's receive calls read the socket ([`State::application_reads`]) and
/// none is waiting for its readiness, the driver checks this often that they still read, and
/// reads again itself if none did meanwhile: frames that need no receive call (flow credit, a
/// CLOSE, acknowledgements) wait at most about twice this long for an application busy
/// elsewhere.
const READ_DUTY_CHECK: Duration = Duration::from_millis(2);

/// How a substrate's transport meets the core. Methods marked "under the lock" are called
/// with the connection's state locked; the others without.
pub(crate) trait Wire: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Before a new batch is taken (without the lock): the batch size in force, which may
    /// follow the transport's state.
    fn batch(&mut self, io: &Self::Io, now: Instant) -> usize;

    /// Under the lock: appends the core's next output, encoded for the transport, until
    /// `out` holds `limit` bytes or the core has nothing more now. Returns whether it
    /// stopped at `limit` (there may be more).
    fn fill(&mut self, core: &mut Core, now: Instant, out: &mut Vec<u8>, limit: usize) -> bool;

    /// Whether reads wait for the transport's readiness with nothing taken from the core
    /// ([`Self::poll_read_ready`], then [`Self::begin_read`] and [`Self::try_read`] for the
    /// read alone), so that the core's receiver stays in the core between reads, where the
    /// application's receive calls may borrow it and read themselves. Otherwise the
    /// receiver is taken before the wait and the read is a `poll_read`.
    fn lends_receiver(&self) -> bool {
        false
    }

    /// With [`Self::lends_receiver`]: whether the transport has something to read.
    fn poll_read_ready(
        &mut self,
        _io: &Self::Io,
        _cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Pending
    }

    /// With [`Self::lends_receiver`], after [`Self::begin_read`]: reads into
    /// [`Self::read_buffer`] without waiting (`WouldBlock` if there is nothing, or the
    /// application holds the receiver).
    fn try_read(&mut self, _io: &Self::Io) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Under the lock, before a read: takes what the read needs from the core.
    fn begin_read(&mut self, core: &mut Core);

    /// Where the next read goes (empty: nothing to read into now).
    fn read_buffer(&mut self) -> &mut [u8];

    /// `n > 0` bytes were read into [`Self::read_buffer`] (without the lock: decoding here
    /// keeps it off the application's path).
    fn filled(&mut self, n: usize);

    /// Under the lock: hands what was read to the core.
    fn end_read(&mut self, core: &mut Core, now: Instant);

    /// The batch about to be written is the last before the end of the sending direction
    /// (`last`), or the end was sent: a transport that can may hold a short last write back
    /// so that it leaves in one segment with the FIN (a transaction's final flight).
    fn last_write(&mut self, _io: &Self::Io, _last: bool) {}

    /// The batch taken last is written whole.
    fn wrote_batch(&mut self, _io: &Self::Io) {}

    /// The transport's segment size, if writes should end on segment boundaries while more
    /// output is ready (see `unsent::whole_segments`).
    fn segment_size(&mut self, _io: &Self::Io, _now: Instant) -> Option<usize> {
        None
    }

    /// The connection is idle (the core gave its idle memory back): gives back the memory of
    /// the wire's own buffers that hold nothing now.
    fn release_idle(&mut self) {}

    /// Whether the peer still acknowledges what was sent (`ConnectionConfig::
    /// dead_peer_timeout`), and when to ask again.
    fn check_peer(&mut self, _io: &Self::Io, _now: Instant) -> PeerCheck {
        PeerCheck::Answering(None)
    }

    /// Bytes the wire's own buffers hold, by capacity.
    fn buffer_capacity(&self) -> usize {
        0
    }
}

/// What [`Wire::check_peer`] found.
pub(crate) enum PeerCheck {
    /// Answering, as far as is known; check again at this time, if ever.
    Answering(Option<Instant>),
    /// Nothing sent has been acknowledged for the whole dead-peer timeout: the connection
    /// fails with `TransportError::TimedOut`.
    Silent,
}

/// What ended one wait of the driver.
enum Wake {
    Read(usize),
    /// The transport is readable ([`Wire::lends_receiver`]).
    Readable,
    Wrote(usize),
    ShutDown,
    Failed(io::Error),
    Notified,
    Timer,
}

/// Runs the connection (`port` of the core) until it is drained, then closes the transport.
pub(crate) async fn run<W: Wire>(
    shared: Arc<Shared>,
    port: Port,
    io: W::Io,
    wire: W,
    write_batch: usize,
) {
    let notify = shared.driver_notify(port);
    let mut driver = Driver {
        shared,
        port,
        notify,
        io,
        wire,
        // Allocated by the first batch (`refill`): a connection that never sends much never
        // holds a whole batch's memory.
        out: Vec::new(),
        out_capacity: write_batch + LOCK_SLICE,
        out_pos: 0,
        write_end: 0,
        read_open: true,
        fin: Fin::NotYet,
        answer_first: false,
        corked: false,
        read_duty: None,
    };
    driver.drive().await;
    let sh = &driver.shared;
    let mut st = sh.lock();
    let unfinished = match port {
        Port::Single => st.conn.session().error().is_none(),
        Port::Path(_) => !st.conn.is_drained(port),
    };
    if unfinished {
        // Not reached while the core runs to its end; a safety net for a driver bug.
        st.conn.handle_transport_closed(
            port,
            Instant::now(),
            TransportError::Io(io::ErrorKind::Other),
        );
    }
    // The socket closes as the driver lets go of it: the application's calls no longer
    // read it.
    st.inline_socket = None;
    sh.driver_stopped(&mut st, port);
    sh.dispatch(&mut st);
    sh.wake_all(&mut st);
    // Dropping the transport closes it (close(2) for a socket; the userspace stack finishes
    // the exchange while it runs).
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fin {
    NotYet,
    /// The core's last frame is out: end the sending direction once `out` is written.
    Due,
    /// Sent, or the sending direction failed.
    Done,
}

struct Driver<W: Wire> {
    shared: Arc<Shared>,
    /// Which of the core's transport connections this driver runs.
    port: Port,
    /// Wakes this driver (the application's calls, a new path's data to send).
    notify: Arc<tokio::sync::Notify>,
    io: W::Io,
    wire: W,
    /// Output taken from the core, written from `out_pos`.
    out: Vec<u8>,
    /// The memory `out` is given once a batch is under way (a whole batch and a lock slice):
    /// it starts with none and gives it back when the connection is idle.
    out_capacity: usize,
    out_pos: usize,
    /// Where the part of `out` written now ends: the rest, shorter than a segment, is held
    /// for the next batch while the core has more output ready ([`Wire::segment_size`]).
    write_end: usize,
    read_open: bool,
    fin: Fin,
    /// A read during the handshake delivered to the application: let it answer before the
    /// next batch is taken, so that the answer leaves with the handshake's flight (a server's
    /// 0.5-RTT answer to early data; a client's close behind its Finished) instead of in a
    /// segment of its own.
    answer_first: bool,
    /// [`Wire::last_write`] was told the batch being written is the last.
    corked: bool,
    /// While the application reads the socket ([`State::application_reads`]): when to check
    /// next that it still does, and its read count when the check was set.
    read_duty: Option<(Instant, u64)>,
}

impl<W: Wire> Driver<W> {
    async fn drive(&mut self) {
        let mut woken_by_application = false;
        loop {
            if woken_by_application || std::mem::take(&mut self.answer_first) {
                // The application's call woke this task from the application's worker, and
                // tokio runs a task woken so next on the same worker (in a slot no other
                // worker takes from). In a transfer every hop between the application and
                // the driver is such a wake, so both applications and both drivers of a
                // loopback transfer would share one worker while the others idle (measured
                // with `peg bench tls`: one core busy, the other idle). Yielding once moves
                // the driver to the worker's run queue, where an idle worker takes it; the
                // sealing, opening and system calls then run next to the application.
                tokio::task::yield_now().await;
            }
            let now = Instant::now();
            if self.out_pos == self.write_end && self.fin == Fin::NotYet {
                self.refill(now);
                if self.out_pos < self.out.len() && self.shared.lock().conn.poll_shutdown(self.port)
                {
                    // The core's last output: the FIN follows it (`poll_shutdown` says so
                    // once), and nothing is held back.
                    self.fin = Fin::Due;
                    self.write_end = self.out.len();
                    self.corked = true;
                    self.wire.last_write(&self.io, true);
                }
            }
            let peer_check = match self.wire.check_peer(&self.io, now) {
                PeerCheck::Answering(at) => at,
                PeerCheck::Silent => {
                    self.failed(&io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer acknowledged nothing for the dead-peer timeout",
                    ));
                    continue;
                }
            };
            let lends = self.wire.lends_receiver();
            let (timeout, wants_read, drained) = {
                let mut st = self.shared.lock();
                if self.out_pos == self.out.len() && st.conn.poll_shutdown(self.port) {
                    self.fin = Fin::Due;
                }
                let mut wants_read = self.read_open && st.conn.wants_read(self.port);
                let mut duty_check = None;
                if !st.application_reads {
                    // A check set while the application read belongs to that time.
                    self.read_duty = None;
                }
                if wants_read
                    && lends
                    && st.application_reads
                    && let Some(check) = leave_reading(&mut self.read_duty, &mut st, now)
                {
                    wants_read = false;
                    duty_check = check;
                }
                if wants_read && lends && !st.receiver_available() {
                    // An application's call is reading: it wakes this driver when it is
                    // done (waiting for readiness now would find the socket readable and
                    // spin).
                    st.driver_waits_for_receiver = true;
                    wants_read = false;
                }
                if wants_read && !lends {
                    self.wire.begin_read(&mut st.conn);
                }
                let r = (
                    (st.conn.poll_timeout(), duty_check),
                    wants_read,
                    st.conn.is_drained(self.port),
                );
                self.shared.dispatch(&mut st);
                r
            };
            if drained && self.out_pos == self.out.len() {
                return;
            }
            let (core_timeout, duty_check) = timeout;
            let wake_at = core_timeout
                .into_iter()
                .chain(duty_check)
                .chain(peer_check)
                .min();
            let wake = {
                let notify = self.notify.clone();
                let mut notified = pin!(notify.notified());
                let mut sleep = wake_at.map(|t| Box::pin(tokio::time::sleep_until(t.into())));
                let Self {
                    io,
                    wire,
                    out,
                    out_pos,
                    write_end,
                    fin,
                    ..
                } = self;
                let pending = &out[*out_pos..*write_end];
                let fin_due = *fin == Fin::Due && *out_pos == out.len();
                std::future::poll_fn(|cx| {
                    // Each poll registers the transport's waker for what would block, so any
                    // of them wakes this one future.
                    if !pending.is_empty() {
                        match Pin::new(&mut *io).poll_write(cx, pending) {
                            Poll::Ready(Ok(n)) => return Poll::Ready(Wake::Wrote(n)),
                            Poll::Ready(Err(e)) => return Poll::Ready(Wake::Failed(e)),
                            Poll::Pending => {}
                        }
                    }
                    if fin_due {
                        match Pin::new(&mut *io).poll_shutdown(cx) {
                            Poll::Ready(Ok(())) => return Poll::Ready(Wake::ShutDown),
                            Poll::Ready(Err(e)) => return Poll::Ready(Wake::Failed(e)),
                            Poll::Pending => {}
                        }
                    }
                    if wants_read && lends {
                        match wire.poll_read_ready(io, cx) {
                            Poll::Ready(Ok(())) => return Poll::Ready(Wake::Readable),
                            Poll::Ready(Err(e)) => return Poll::Ready(Wake::Failed(e)),
                            Poll::Pending => {}
                        }
                    } else if wants_read {
                        let mut buf = ReadBuf::new(wire.read_buffer());
                        if buf.remaining() > 0 {
                            match Pin::new(&mut *io).poll_read(cx, &mut buf) {
                                Poll::Ready(Ok(())) => {
                                    return Poll::Ready(Wake::Read(buf.filled().len()));
                                }
                                Poll::Ready(Err(e)) => return Poll::Ready(Wake::Failed(e)),
                                Poll::Pending => {}
                            }
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
            let read = matches!(wake, Wake::Read(_));
            woken_by_application = matches!(wake, Wake::Notified);
            match wake {
                Wake::Wrote(n) => {
                    self.out_pos += n;
                    if self.out_pos == self.out.len() {
                        self.wire.wrote_batch(&self.io);
                    }
                }
                Wake::ShutDown => {
                    self.fin = Fin::Done;
                    if std::mem::take(&mut self.corked) {
                        self.wire.last_write(&self.io, false);
                    }
                }
                Wake::Read(n) => self.received(n),
                Wake::Readable => self.read_now(),
                Wake::Failed(e) => self.failed(&e),
                Wake::Notified => {}
                Wake::Timer => {
                    // Or the read-duty check's: the next round makes it.
                    let now = Instant::now();
                    if core_timeout.is_some_and(|t| t <= now) {
                        let shared = self.shared.clone();
                        let mut st = shared.lock();
                        st.conn.handle_timeout(now);
                        if st.conn.take_idle_released() {
                            self.release_idle(&mut st);
                        }
                    }
                }
            }
            if wants_read && !read && !lends {
                // Nothing was read: give back what `begin_read` took.
                let mut st = self.shared.lock();
                self.wire.end_read(&mut st.conn, Instant::now());
            }
        }
    }

    /// The core gave its idle memory back (`st` locked): so do this driver's buffers that
    /// hold nothing now, the wire's and the application's queues between the two.
    fn release_idle(&mut self, st: &mut State) {
        if self.out_pos == self.out.len() {
            self.out = Vec::new();
            self.out_pos = 0;
            self.write_end = 0;
        }
        self.wire.release_idle();
        self.shared.release_idle_queues(st);
        self.publish_buffer_capacity(st);
    }

    /// Tells the connection's stats what this driver's buffers hold (`st` locked).
    fn publish_buffer_capacity(&self, st: &mut State) {
        if self.port == Port::Single {
            st.driver_buffer_bytes = self.out.capacity() + self.wire.buffer_capacity();
        }
    }

    /// Takes a new batch of output from the core, in slices of [`LOCK_SLICE`], only once the
    /// last batch is written (but for a tail held back, which leads the new one): until then
    /// frames wait in the core, where the scheduler (or the TCP's tagged queue) still decides
    /// what goes first (late binding).
    fn refill(&mut self, now: Instant) {
        self.out.drain(..self.out_pos);
        self.out_pos = 0;
        let batch = self.wire.batch(&self.io, now).max(1);
        let mut more;
        loop {
            let mut st = self.shared.lock();
            let slice_end = (self.out.len() + LOCK_SLICE).min(batch);
            let capacity = self.out.capacity();
            more = self.wire.fill(&mut st.conn, now, &mut self.out, slice_end);
            self.shared.note_transmitted(&st);
            if more && self.out.capacity() < self.out_capacity {
                // A batch is under way: its whole memory at once, not grown step by step.
                self.out.reserve(self.out_capacity - self.out.len());
            }
            if self.out.capacity() != capacity {
                self.publish_buffer_capacity(&mut st);
            }
            drop(st);
            if !more || self.out.len() >= batch {
                break;
            }
        }
        // With more output ready, a write ending just past a segment boundary would send a
        // short segment of its own: the tail waits for the next batch instead (it leaves no
        // later than it would have, behind the whole segments). The last of the output is
        // written whole.
        self.write_end = match self.wire.segment_size(&self.io, now) {
            Some(mss) if more => crate::unsent::whole_segments(self.out.len(), mss),
            _ => self.out.len(),
        };
    }

    /// The transport is readable ([`Wire::lends_receiver`]): takes the receiver and reads,
    /// unless the core stopped wanting reads meanwhile, the application reads the socket
    /// itself now, or an application's call holds the receiver (it then wakes this driver
    /// when it gives it back).
    fn read_now(&mut self) {
        {
            let mut st = self.shared.lock();
            if !(self.read_open && st.conn.wants_read(self.port)) || st.application_reads {
                return;
            }
            if !st.receiver_available() {
                st.driver_waits_for_receiver = true;
                return;
            }
            self.wire.begin_read(&mut st.conn);
        }
        match self.wire.try_read(&self.io) {
            Ok(n) => self.received(n),
            Err(e) => {
                let mut st = self.shared.lock();
                self.wire.end_read(&mut st.conn, Instant::now());
                drop(st);
                if e.kind() != io::ErrorKind::WouldBlock {
                    self.failed(&e);
                }
            }
        }
    }

    /// `n` bytes were read (0: the end of the peer's stream).
    fn received(&mut self, n: usize) {
        if n > 0 {
            self.wire.filled(n);
        }
        let now = Instant::now();
        let mut st = self.shared.lock();
        let handshaking = !st.conn.is_established();
        self.wire.end_read(&mut st.conn, now);
        // Reads may have grown (or swapped) the wire's buffer.
        self.publish_buffer_capacity(&mut st);
        st.peer_bytes_read |= n > 0;
        self.answer_first = handshaking && st.conn.session().has_events();
        self.shared.note_established(&mut st);
        if n == 0 {
            self.read_open = false;
            st.conn
                .handle_transport_closed(self.port, now, TransportError::PeerClosed);
        }
        self.shared.dispatch(&mut st);
    }

    fn failed(&mut self, e: &io::Error) {
        self.out.clear();
        self.out_pos = 0;
        self.write_end = 0;
        self.read_open = false;
        self.fin = Fin::Done;
        let mut st = self.shared.lock();
        st.conn
            .handle_transport_closed(self.port, Instant::now(), TransportError::from_io(e));
        self.shared.dispatch(&mut st);
    }
}

/// While the application reads the socket itself (`st.application_reads`): whether the
/// driver leaves the reading to it now, and if so until when (`Some(None)`: no timer, calls
/// wait for readiness and the last of them wakes the driver when it stops). `None`: the
/// application has not read since the last check and none of its calls waits, so the
/// reading is the driver's again.
fn leave_reading(
    read_duty: &mut Option<(Instant, u64)>,
    st: &mut State,
    now: Instant,
) -> Option<Option<Instant>> {
    if st.application_waits_readable > 0 {
        // A call is waiting for readiness: it reads. Checking on it with a timer would wake
        // every idle connection's driver every few milliseconds.
        *read_duty = None;
        st.driver_relies_on_waiters = true;
        return Some(None);
    }
    st.driver_relies_on_waiters = false;
    let reads = st.reads_by_application;
    match *read_duty {
        Some((check, seen)) if now >= check => {
            if reads == seen {
                st.application_reads = false;
                st.reads_taken_back += 1;
                *read_duty = None;
                return None;
            }
            *read_duty = Some((now + READ_DUTY_CHECK, reads));
        }
        Some(_) => {}
        None => *read_duty = Some((now + READ_DUTY_CHECK, reads)),
    }
    read_duty.map(|(check, _)| Some(check))
}
