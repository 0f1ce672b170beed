//! The kernel-TCP substrate: an ordinary socket carrying the core's byte stream.
//!
//! Reads go straight into the core's in-order receiver, which the driver borrows for the
//! read and decodes outside the connection's lock (and which an application's receive call
//! that finds nothing received may borrow to read the socket itself, `Shared::read_inline`);
//! output is the core's frames, taken in batches no larger than the `TCP_NOTSENT_LOWAT` in
//! force (late binding, see the crate docs). Over TLS the core keeps its receiver (records
//! are opened there), and reads go into a buffer of the wire's own that the core takes
//! under the lock.

use std::io;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use squarepeg_connection::{Connection as SingleCore, Protection, Receiver, Role, Substrate};
use squarepeg_session::{MessageNumber, MessageProps};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::ConnectionConfig;
use crate::connection::{Connection, Handle, Shared};
use crate::core::{Core, Port};
use crate::driver::{self, PeerCheck, Wire};
use crate::endpoint::ConnectError;
use crate::fast_open::KernelStream;
use crate::unsent::AdaptiveLowat;

/// Queues `messages` in `core`'s session; returns their numbers.
pub(crate) fn queue(
    core: &mut SingleCore,
    now: Instant,
    messages: Vec<(Bytes, MessageProps)>,
) -> Result<Vec<MessageNumber>, ConnectError> {
    messages
        .into_iter()
        .map(|(payload, props)| {
            core.session_mut()
                .send_message(now, payload, props)
                .map_err(ConnectError::Message)
        })
        .collect()
}

/// What the byte-stream wire needs of its stream beyond reading and writing: the kernel's
/// socket options (an adaptive `TCP_NOTSENT_LOWAT`, `TCP_CORK`); other streams (the
/// userspace TCP read as a plain stream, a multipath session's path over it) have none.
pub(crate) trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The kernel socket, if it is one.
    fn kernel(&self) -> Option<&TcpStream>;

    /// The sending MSS, if known (the kernel socket's).
    fn send_mss(&self) -> Option<usize> {
        crate::unsent::send_mss(self.kernel()?)
    }
}

impl ByteStream for KernelStream {
    fn kernel(&self) -> Option<&TcpStream> {
        Some(&*self.0)
    }
}

#[cfg(feature = "utcp")]
impl ByteStream for squarepeg_io::TcpStream {
    fn kernel(&self) -> Option<&TcpStream> {
        None
    }
}

/// How often the socket's MSS is read again (it follows the path's MTU).
const MSS_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A byte stream carrying the core's output and reads (over TLS, records).
pub(crate) struct KernelWire<S = KernelStream> {
    /// Which of the core's connections this socket carries.
    port: Port,
    /// The core's receiver while a read is under way.
    receiver: Option<Box<Receiver>>,
    /// Over TLS: ciphertext read, and how much of it.
    ciphertext: Vec<u8>,
    ciphertext_len: usize,
    /// Over TLS: the read size; 0 in cleartext, where the core's receiver is read into.
    tls_read_size: usize,
    /// Over TLS: what `ciphertext` must hold for the next read — the read size, or at the
    /// start and after an idle release [`IDLE_READ`] until a read fills that (the driver
    /// waits for reads with the buffer in hand, so an idle connection would otherwise hold
    /// a whole one).
    tls_read_now: usize,
    /// Frames taken from the core are committed: a batch larger than the lowat would hold an
    /// urgent message behind it, and one write larger than the lowat fills the kernel past
    /// it (the kernel checks the lowat only between its buffers, up to 64 KB each), so the
    /// batch follows the lowat down.
    batch: usize,
    write_batch: usize,
    /// The lowat following the delivery rate, if configured.
    lowat: Option<AdaptiveLowat>,
    /// Reads are made when the socket is readable, with the core's receiver taken for the
    /// read alone: between reads it stays in the core, where the application's receive
    /// calls may take it and read themselves (`Shared::read_inline`). Plain frames over a
    /// single kernel-TCP connection.
    lend_receiver: bool,
    /// The batch being written carries application data (messages or stream bytes), not
    /// only the session's own frames.
    batch_has_data: bool,
    /// After a batch of only the session's own frames, the socket leaves Linux's delayed-ACK
    /// "ping-pong" mode (`TCP_QUICKACK`, see `wrote_batch`). Off where delayed ACKs are
    /// wanted (Fast Open transactions, whose ACKs ride on the answer).
    quickack_after_control: bool,
    /// `ConnectionConfig::dead_peer_timeout`, and when to look next whether the peer still
    /// acknowledges (`None`: not until output is taken again).
    dead_peer_timeout: Option<Duration>,
    peer_check_at: Option<Instant>,
    /// Output was taken since the last look.
    took_output: bool,
    /// While data is outstanding: the bytes acknowledged (`tcpi_bytes_acked`) as last seen
    /// to change, and when.
    acked_progress: Option<(u64, Instant)>,
    /// The socket's sending MSS as last read, and when to read it again.
    mss: Option<usize>,
    mss_checked: Option<Instant>,
    shared: Arc<Shared>,
    stream: std::marker::PhantomData<fn() -> S>,
}

impl<S: ByteStream> Wire for KernelWire<S> {
    type Io = S;

    fn batch(&mut self, io: &S, now: Instant) -> usize {
        if let Some(lowat) = self.lowat.as_mut()
            && let Some(socket) = io.kernel()
            && let Some(new) = lowat.update(now, socket)
        {
            self.batch = self.write_batch.min(new as usize).max(1);
            self.shared.lock().notsent_lowat = Some(new);
        }
        self.batch
    }

    fn fill(&mut self, core: &mut Core, now: Instant, out: &mut Vec<u8>, limit: usize) -> bool {
        let sent = |core: &Core| {
            let stats = core.session().stats();
            (stats.messages_sent, stats.stream_bytes_sent)
        };
        let before = sent(core);
        let len = out.len();
        core.poll_transmit(self.port, now, out, limit);
        self.batch_has_data |= sent(core) != before;
        self.took_output |= out.len() > len;
        // Short of the limit: the core has nothing more.
        out.len() >= limit
    }

    fn segment_size(&mut self, io: &S, now: Instant) -> Option<usize> {
        if self.mss_checked.is_none_or(|t| now >= t) {
            // The MSS changes only with the path's MTU: one `TCP_INFO` read now and then.
            self.mss_checked = Some(now + MSS_CHECK_EVERY);
            self.mss = io.send_mss();
        }
        self.mss
    }

    fn wrote_batch(&mut self, io: &S) {
        // Linux delays ACKs on a connection whose side sent data soon after it received
        // ("ping-pong" mode, meant for request/answer exchanges): an ACK waits for an answer
        // to ride on, or for a second segment. A squarepeg side that only receives still
        // sends its own frames now and then (PARAMS and the format switch at the start,
        // credit), which put it in that mode for good: with one small message every 20 ms
        // the peer got an ACK every other message, its RTT samples grew by a message
        // interval, and its loss detection sometimes waited a message longer (`peg lab voip`,
        // hollywood-70ms: 17–18 messages late against kernel TCP's 16). Application data
        // keeps the mode (its ACKs ride on the data, as for any TCP application).
        if !std::mem::take(&mut self.batch_has_data)
            && self.quickack_after_control
            && let Some(socket) = io.kernel()
        {
            let _ = crate::fast_open::set_quickack(socket, true);
        }
    }

    fn lends_receiver(&self) -> bool {
        self.lend_receiver
    }

    fn check_peer(&mut self, io: &S, now: Instant) -> PeerCheck {
        let Some(timeout) = self.dead_peer_timeout else {
            return PeerCheck::Answering(None);
        };
        match self.peer_check_at {
            Some(at) if now < at => return PeerCheck::Answering(Some(at)),
            Some(_) => {}
            None => {
                if std::mem::take(&mut self.took_output) {
                    // The first look once the output has had time to leave and be
                    // acknowledged.
                    self.peer_check_at = Some(now + timeout / 4);
                }
                return PeerCheck::Answering(self.peer_check_at);
            }
        }
        self.took_output = false;
        let Some(socket) = io.kernel() else {
            self.peer_check_at = None;
            return PeerCheck::Answering(None);
        };
        let state = match crate::unsent::ack_state(socket) {
            Some(state) if state.unacked > 0 => state,
            // Everything acknowledged (or a closed window whose probes are answered: the
            // data waits unsent): the keepalive probes watch a connection with nothing
            // outstanding. Looked at again once more output is taken.
            _ => {
                self.peer_check_at = None;
                self.acked_progress = None;
                return PeerCheck::Answering(None);
            }
        };
        let silence = unacknowledged_for(state, &mut self.acked_progress, now);
        if silence >= timeout {
            // Said once: the connection fails now. A reset rather than a FIN queued behind
            // data that never leaves.
            self.dead_peer_timeout = None;
            self.peer_check_at = None;
            let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
            return PeerCheck::Silent;
        }
        let at = now + (timeout - silence).max(MIN_PEER_CHECK);
        self.peer_check_at = Some(at);
        PeerCheck::Answering(Some(at))
    }

    fn poll_read_ready(&mut self, io: &S, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        match io.kernel() {
            Some(socket) => socket.poll_read_ready(cx),
            None => Poll::Pending,
        }
    }

    fn try_read(&mut self, io: &S) -> io::Result<usize> {
        let Some(socket) = io.kernel() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        match self.receiver.as_mut() {
            Some(r) => socket.try_read(r.buffer()),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn begin_read(&mut self, core: &mut Core) {
        // Over TLS the core keeps its receiver: `None`.
        if self.receiver.is_none()
            && let Some(core) = core.single_mut()
        {
            self.receiver = core.take_receiver();
        }
    }

    fn read_buffer(&mut self) -> &mut [u8] {
        match self.receiver.as_mut() {
            Some(r) => r.buffer(),
            None => {
                if self.ciphertext.len() < self.tls_read_now {
                    self.ciphertext.resize(self.tls_read_now, 0);
                }
                &mut self.ciphertext
            }
        }
    }

    fn release_idle(&mut self) {
        if self.ciphertext_len == 0 {
            // The driver waits for reads with this buffer in hand: a small one.
            self.tls_read_now = self.tls_read_size.min(IDLE_READ);
            self.ciphertext = vec![0; self.tls_read_now];
        }
    }

    fn buffer_capacity(&self) -> usize {
        self.ciphertext.capacity()
    }

    fn filled(&mut self, n: usize) {
        match self.receiver.as_mut() {
            Some(r) => r.filled(n),
            None => {
                self.ciphertext_len = n;
                if n >= self.ciphertext.len() {
                    // Traffic again: whole reads.
                    self.tls_read_now = self.tls_read_size;
                }
            }
        }
    }

    fn last_write(&mut self, io: &S, last: bool) {
        // TCP_CORK holds the short last write until the FIN, which the kernel then sets on
        // it and sends at once (shutdown pushes corked data); uncorked after the shutdown.
        if let Some(socket) = io.kernel() {
            let _ = crate::fast_open::set_cork(socket, last);
        }
    }

    fn end_read(&mut self, core: &mut Core, now: Instant) {
        if let Some(r) = self.receiver.take() {
            if let Some(core) = core.single_mut() {
                core.return_receiver(now, r);
            }
        } else if self.ciphertext_len > 0 {
            // The records are opened where they were read; `ciphertext` may come back as
            // another buffer of at least the same length.
            core.handle_read(self.port, now, &mut self.ciphertext, self.ciphertext_len);
            self.ciphertext_len = 0;
        }
    }
}

/// How long the peer has acknowledged nothing new while data is outstanding (`state`, read
/// now; `progress`: the bytes acknowledged as last seen to change, and when). ACKs that
/// acknowledge nothing new (window updates, answers to probes, the peer's own traffic where
/// the kernel counts it) keep `since_last_ack` short, but a connection whose data never gets
/// through — a link that drops its full-sized segments without an ICMP error, say — is as
/// dead as a silent peer. Progress is seen only at these looks, so it counts from the look
/// that saw it.
fn unacknowledged_for(
    state: crate::unsent::AckState,
    progress: &mut Option<(u64, Instant)>,
    now: Instant,
) -> Duration {
    let stalled = match (state.bytes_acked, *progress) {
        (Some(acked), Some((seen, since))) if acked == seen => now.saturating_duration_since(since),
        (Some(acked), _) => {
            *progress = Some((acked, now));
            Duration::ZERO
        }
        (None, _) => Duration::ZERO,
    };
    state.since_last_ack.max(stalled)
}

/// The shortest wait between two looks at whether the peer still acknowledges.
const MIN_PEER_CHECK: Duration = Duration::from_millis(10);

/// Over TLS, the read size of a new connection, and of one idle since its memory was given
/// back, until a read fills it.
const IDLE_READ: usize = 4096;

/// The socket options of every kernel-TCP connection.
pub(crate) fn prepare_socket(socket: &TcpStream, config: &ConnectionConfig) -> io::Result<()> {
    // Messages must not wait for Nagle (Hollywood §4.2).
    socket.set_nodelay(true)?;
    if let Some(lowat) = config.notsent_lowat {
        set_notsent_lowat(socket, lowat)?;
    }
    if let Some(timeout) = config.dead_peer_timeout {
        set_dead_peer_timeout(socket, timeout)?;
    }
    Ok(())
}

/// `ConnectionConfig::dead_peer_timeout` for a connection with nothing outstanding:
/// keepalive probes (the first after a third of `timeout`, then every sixth, whole seconds, as
/// many as fit), after which the kernel fails the socket with `ETIMEDOUT`. Data that waits
/// for acknowledgement is watched by the driver instead (`KernelWire::check_peer`, from
/// `TCP_INFO`): the kernel's own bound on it, `TCP_USER_TIMEOUT` (RFC 5482), also fails a
/// connection whose peer answers but keeps its window closed longer than that (Linux 5.11
/// and later) — an application that pauses reading, which must not lose its connection.
fn set_dead_peer_timeout(socket: &TcpStream, timeout: Duration) -> io::Result<()> {
    let (idle, interval, _probes) = crate::config::dead_peer_keepalive(timeout, true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval);
    #[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
    let keepalive = keepalive.with_retries(_probes);
    socket2::SockRef::from(socket).set_tcp_keepalive(&keepalive)
}

impl<S> KernelWire<S> {
    /// The wire of `port` of the core in `shared`; `tls`: the core opens records (reads go
    /// into a buffer of the wire's own).
    pub(crate) fn new(
        port: Port,
        config: &ConnectionConfig,
        tls: bool,
        shared: Arc<Shared>,
    ) -> Self {
        KernelWire {
            port,
            receiver: None,
            // Over TLS reads go here (an empty buffer otherwise: the core's receiver is
            // used).
            // Allocated by the first read.
            ciphertext: Vec::new(),
            ciphertext_len: 0,
            tls_read_size: if tls { config.read_buffer.max(1) } else { 0 },
            // A new connection's first reads are a handshake's few KiB: a whole read buffer
            // only once traffic fills a small one (a client that connects and says nothing
            // holds 4 KiB until the handshake times out, not 64).
            tls_read_now: if tls {
                config.read_buffer.clamp(1, IDLE_READ)
            } else {
                0
            },
            batch: config
                .write_batch
                .min(config.notsent_lowat.map_or(usize::MAX, |l| l as usize))
                .max(1),
            write_batch: config.write_batch.max(1),
            lowat: match (config.notsent_lowat, config.unsent_drain) {
                (Some(max), Some(drain)) => Some(AdaptiveLowat::new(drain, max)),
                _ => None,
            },
            lend_receiver: false,
            batch_has_data: false,
            quickack_after_control: !config.fast_open,
            mss: None,
            mss_checked: None,
            dead_peer_timeout: config.dead_peer_timeout,
            peer_check_at: None,
            took_output: false,
            acked_progress: None,
            shared,
            stream: std::marker::PhantomData,
        }
    }
}

/// Sets the socket options, builds the core and spawns the driver.
pub(crate) fn start(
    socket: TcpStream,
    role: Role,
    config: ConnectionConfig,
) -> Result<Connection, ConnectError> {
    let remote = socket.peer_addr()?;
    start_with(socket, remote, role, config, Vec::new()).map(|(c, _)| c)
}

/// [`start`] for a socket whose peer is `remote` (a Fast Open socket has not connected
/// yet), queueing `first` before the driver's first poll: messages marked safely
/// replayable go as TLS early data where a ticket allows. Returns their numbers.
pub(crate) fn start_with(
    socket: TcpStream,
    remote: std::net::SocketAddr,
    role: Role,
    config: ConnectionConfig,
    first: Vec<(Bytes, MessageProps)>,
) -> Result<(Connection, Vec<MessageNumber>), ConnectError> {
    prepare_socket(&socket, &config)?;
    if config.fast_open {
        // Transactions: ACKs wait to ride on the answer or the close (delayed-ACK
        // "ping-pong" mode) rather than go in segments of their own.
        let _ = crate::fast_open::set_quickack(&socket, false);
    }
    let local = socket.local_addr()?;
    let mut core = SingleCore::new(role, config.core_config(), Substrate::byte_stream())?;
    let numbers = queue(&mut core, Instant::now(), first)?;
    let tls = core.protection() == Protection::Tls;
    let shared = Arc::new(Shared::new(core, config.status_queue, local, remote));
    shared.lock().notsent_lowat = config.notsent_lowat;
    let mut wire: KernelWire = KernelWire::new(Port::Single, &config, tls, shared.clone());
    let socket = Arc::new(socket);
    if !tls {
        // Plain frames: the application's receive calls may read the socket themselves.
        wire.lend_receiver = true;
        shared.allow_inline_reads(socket.clone());
    }
    tokio::spawn(driver::run(
        shared.clone(),
        Port::Single,
        KernelStream(socket),
        wire,
        config.write_batch,
    ));
    Ok((
        Connection {
            handle: Arc::new(Handle(shared)),
        },
        numbers,
    ))
}

#[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
pub(crate) fn set_notsent_lowat(socket: &TcpStream, lowat: u32) -> io::Result<()> {
    socket2::SockRef::from(socket).set_tcp_notsent_lowat(lowat)
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
pub(crate) fn set_notsent_lowat(_socket: &TcpStream, _lowat: u32) -> io::Result<()> {
    // Not available: the kernel queue is bounded by the send buffer only.
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::Context;

    use tokio::io::{DuplexStream, ReadBuf};

    use super::*;

    /// One end of an in-memory pipe posing as a socket with a given MSS, recording the
    /// length of every write.
    struct RecordingStream {
        inner: DuplexStream,
        mss: Option<usize>,
        writes: Arc<Mutex<Vec<usize>>>,
    }

    impl AsyncRead for RecordingStream {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for RecordingStream {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let r = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = r {
                self.writes.lock().unwrap().push(n);
            }
            r
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    impl ByteStream for RecordingStream {
        fn kernel(&self) -> Option<&TcpStream> {
            None
        }
        fn send_mss(&self) -> Option<usize> {
            self.mss
        }
    }

    /// A connection over `io` with the kernel-TCP wire (plain frames, no inline reads).
    fn start_over(io: RecordingStream, role: Role, config: &ConnectionConfig) -> Connection {
        let core = SingleCore::new(role, config.core_config(), Substrate::byte_stream()).unwrap();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let shared = Arc::new(Shared::new(core, config.status_queue, addr, addr));
        let wire = KernelWire::<RecordingStream>::new(Port::Single, config, false, shared.clone());
        tokio::spawn(driver::run(
            shared.clone(),
            Port::Single,
            io,
            wire,
            config.write_batch,
        ));
        Connection {
            handle: Arc::new(Handle(shared)),
        }
    }

    /// The dead-peer watch counts the time nothing new was acknowledged, whatever ACKs
    /// keep coming; progress starts it again.
    #[test]
    fn acknowledgements_of_nothing_new_do_not_keep_a_stuck_connection_alive() {
        use crate::unsent::AckState;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let state = |since_last_ack: u64, acked: u64| AckState {
            unacked: 5,
            since_last_ack: Duration::from_millis(since_last_ack),
            bytes_acked: Some(acked),
        };
        let mut progress = None;
        // ACKs every 200 ms, none acknowledging anything past 1 000 bytes.
        assert_eq!(
            unacknowledged_for(state(200, 1000), &mut progress, at(0)),
            Duration::from_millis(200)
        );
        assert_eq!(
            unacknowledged_for(state(100, 1000), &mut progress, at(10)),
            Duration::from_secs(10)
        );
        assert_eq!(
            unacknowledged_for(state(150, 1000), &mut progress, at(31)),
            Duration::from_secs(31)
        );
        // Progress: counted again from this look.
        assert_eq!(
            unacknowledged_for(state(50, 9000), &mut progress, at(32)),
            Duration::from_millis(50)
        );
        assert_eq!(
            unacknowledged_for(state(50, 9000), &mut progress, at(35)),
            Duration::from_secs(3)
        );
        // A silent peer: the kernel's own clock of the last ACK, whatever was seen before.
        let mut fresh = None;
        assert_eq!(
            unacknowledged_for(state(40_000, 9000), &mut fresh, at(40)),
            Duration::from_secs(40)
        );
        // A kernel without `tcpi_bytes_acked`: the last ACK alone.
        let old = AckState {
            bytes_acked: None,
            ..state(700, 0)
        };
        assert_eq!(
            unacknowledged_for(old, &mut None, at(50)),
            Duration::from_millis(700)
        );
    }

    /// While more output is ready, every write ends on a segment boundary (the tail waits
    /// for the next batch), and nothing is lost, repeated or moved by holding it back.
    #[tokio::test(flavor = "current_thread")]
    async fn writes_end_on_segment_boundaries_while_more_output_waits() {
        const MSS: usize = 1000;
        const MESSAGES: usize = 3000;
        const SIZE: usize = 1024;
        // Room for the whole transfer: no write is cut short by the pipe.
        let (a, b) = tokio::io::duplex(16 << 20);
        let writes = Arc::new(Mutex::new(Vec::new()));
        let config = ConnectionConfig::default();
        let client = start_over(
            RecordingStream {
                inner: a,
                mss: Some(MSS),
                writes: writes.clone(),
            },
            Role::Client,
            &config,
        );
        let server = start_over(
            RecordingStream {
                inner: b,
                mss: None,
                writes: Arc::new(Mutex::new(Vec::new())),
            },
            Role::Server,
            &config,
        );
        // Queued before either driver runs (one thread): the client's driver finds 3 MB
        // waiting and takes it in batches.
        for i in 0..MESSAGES {
            let payload = Bytes::from(vec![(i % 251) as u8; SIZE]);
            client
                .try_send_message(payload, MessageProps::default())
                .unwrap();
        }
        for i in 0..MESSAGES {
            let m = server.recv_message().await.unwrap();
            assert_eq!(m.payload.len(), SIZE, "message {i}");
            assert!(
                m.payload.iter().all(|&b| b == (i % 251) as u8),
                "message {i}"
            );
        }
        let writes = writes.lock().unwrap().clone();
        let total: usize = writes.iter().sum();
        assert!(total >= MESSAGES * SIZE, "{total}");
        // The batches (64 KiB by default) are written as whole segments; only where the
        // output ran out may a write end elsewhere.
        let large: Vec<usize> = writes.iter().copied().filter(|&n| n >= 2 * MSS).collect();
        assert!(large.len() >= 40, "{writes:?}");
        let unaligned = large.iter().filter(|&&n| n % MSS != 0).count();
        assert!(unaligned <= 1, "{unaligned} unaligned of {writes:?}");
    }
}
