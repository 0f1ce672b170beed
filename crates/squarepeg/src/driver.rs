//! The per-connection driver task: owns the socket, feeds the session what
//! the socket reads, writes what the session's scheduler chooses, and runs
//! the session's timer. Everything protocol-related is in the session.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use squarepeg_framing::StreamDecoder;
use squarepeg_session::MAX_FRAME_BODY;
use tokio::net::TcpStream;

use crate::config::ConnectionConfig;
use crate::connection::Shared;
use crate::unsent::AdaptiveLowat;

/// Reads per wake-up before the driver turns to writing again.
const READ_BUDGET: usize = 16;

/// Bytes of frames taken from the session per lock acquisition.
const LOCK_SLICE: usize = 16 * 1024;

pub(crate) async fn run(shared: Arc<Shared>, socket: TcpStream, config: ConnectionConfig) {
    let mut driver = Driver {
        shared,
        socket,
        decoder: StreamDecoder::with_buffers(
            MAX_FRAME_BODY,
            config.read_buffer,
            config.session.message_receive_queue + 4 * config.read_buffer,
        ),
        out: Vec::with_capacity(config.write_batch + 64 * 1024),
        out_pos: 0,
        // Frames taken from the session are committed: a batch larger than
        // the lowat would hold an urgent message behind it, and one write
        // larger than the lowat fills the kernel past it (the kernel checks
        // the lowat only between its buffers, up to 64 KB each), so the
        // batch follows the lowat down.
        batch: config
            .write_batch
            .min(config.notsent_lowat.map_or(usize::MAX, |l| l as usize))
            .max(1),
        write_batch: config.write_batch.max(1),
        lowat: match (config.notsent_lowat, config.unsent_drain) {
            (Some(max), Some(drain)) => Some(AdaptiveLowat::new(drain, max)),
            _ => None,
        },
        read_open: true,
        write_shut: false,
    };
    driver.shared.lock().notsent_lowat = config.notsent_lowat;
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
}

struct Driver {
    shared: Arc<Shared>,
    socket: TcpStream,
    /// Reads go straight into the decoder's buffer; payloads come out as
    /// slices of shared chunks (see `StreamDecoder`).
    decoder: StreamDecoder,
    /// Encoded frames taken from the session, written from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes taken from the session per batch: the configured write batch,
    /// at most the lowat in force.
    batch: usize,
    write_batch: usize,
    /// The lowat following the delivery rate, if configured.
    lowat: Option<AdaptiveLowat>,
    read_open: bool,
    write_shut: bool,
}

/// What ended the driver's wait (only the timer needs handling; the other
/// wake-ups lead to the next round of writing and reading).
enum Wake {
    Io,
    Timer,
}

impl Driver {
    async fn drive(&mut self) {
        loop {
            let write_blocked = self.write();
            let (timeout, receive_blocked, drained) = {
                let mut st = self.shared.lock();
                self.shared.dispatch(&mut st);
                if st.session.is_send_finished()
                    && self.out_pos == self.out.len()
                    && !self.write_shut
                {
                    // Our CLOSE is out: end our direction (TCP FIN).
                    self.write_shut = true;
                    let _ =
                        socket2::SockRef::from(&self.socket).shutdown(std::net::Shutdown::Write);
                }
                (
                    st.session.poll_timeout(),
                    st.session.receive_blocked(),
                    st.session.is_drained(),
                )
            };
            if drained && self.out_pos == self.out.len() {
                return;
            }
            if self.read_open && !receive_blocked && self.read() {
                // Read something: go round to answer it before sleeping.
                continue;
            }
            let wake = {
                let readable = self.read_open && !receive_blocked;
                let sleep = async {
                    match timeout {
                        Some(t) => tokio::time::sleep_until(t.into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = self.socket.readable(), if readable => Wake::Io,
                    _ = self.socket.writable(), if write_blocked => Wake::Io,
                    _ = self.shared.driver.notified() => Wake::Io,
                    _ = sleep => Wake::Timer,
                }
            };
            if let Wake::Timer = wake {
                let mut st = self.shared.lock();
                st.session.handle_timeout(Instant::now());
            }
        }
    }

    /// Writes frames while the socket takes them, asking the session for a
    /// new batch only when the previous one is fully written, so that the
    /// scheduler decides as late as possible. Returns whether the socket is
    /// full (wait for writability).
    fn write(&mut self) -> bool {
        loop {
            if self.out_pos == self.out.len() {
                self.out.clear();
                self.out_pos = 0;
                if self.write_shut {
                    return false;
                }
                if let Some(lowat) = self.lowat.as_mut()
                    && let Some(new) = lowat.update(Instant::now(), &self.socket)
                {
                    self.batch = self.write_batch.min(new as usize).max(1);
                    self.shared.lock().notsent_lowat = Some(new);
                }
                // Take the lock per slice of the batch: encoding happens
                // under it, and the application should not wait a whole
                // batch to queue a message.
                let now = Instant::now();
                loop {
                    let mut st = self.shared.lock();
                    let slice_end = (self.out.len() + LOCK_SLICE).min(self.batch);
                    st.session
                        .poll_transmit_batch(now, &mut self.out, slice_end);
                    // Short of the slice end: the session has nothing more.
                    let more = self.out.len() >= slice_end;
                    drop(st);
                    if !more || self.out.len() >= self.batch {
                        break;
                    }
                }
                if self.out.is_empty() {
                    return false;
                }
            }
            match self.socket.try_write(&self.out[self.out_pos..]) {
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.transport_failed(&e);
                    return false;
                }
            }
        }
    }

    /// Reads and processes what the socket has, up to a budget. Returns
    /// whether anything was read.
    fn read(&mut self) -> bool {
        let mut any = false;
        for _ in 0..READ_BUDGET {
            match self.socket.try_read(self.decoder.unfilled()) {
                Ok(0) => {
                    self.read_open = false;
                    let mut st = self.shared.lock();
                    st.session
                        .handle_transport_closed(Instant::now(), "peer closed the TCP connection");
                    return true;
                }
                Ok(n) => {
                    any = true;
                    // Decode (COBS, CRC) without the lock, so the
                    // application's calls are not held up by it.
                    self.decoder.filled(n);
                    // The frames wait decoded in the decoder's queue; under
                    // the lock they are only moved into the session.
                    let mut st = self.shared.lock();
                    let now = Instant::now();
                    while let Some(frame) = self.decoder.next_frame() {
                        match frame {
                            Ok(f) => st.session.handle_frame(now, f),
                            Err(e) => st.session.handle_decode_error(now, e),
                        }
                    }
                    if st.session.receive_blocked() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.read_open = false;
                    self.transport_failed(&e);
                    return true;
                }
            }
        }
        any
    }

    fn transport_failed(&mut self, e: &io::Error) {
        self.out.clear();
        self.out_pos = 0;
        self.write_shut = true;
        let mut st = self.shared.lock();
        st.session
            .handle_transport_closed(Instant::now(), &e.to_string());
    }
}
