//! The userspace-TCP substrate: the core's uTCP interface carried over a `squarepeg-io`
//! [`TcpStream`] in *record mode* (unordered receive and message writes, Minion's
//! `SO_UNORDERED` / `SO_UNORDEREDSEND` socket options): reads return SEGMENT and REPORT
//! records, writes take MESSAGE records (`squarepeg_tcp::utcp::record`). See the crate
//! docs, "Over the userspace TCP", for why record mode.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use squarepeg_connection::{
    Connection as SingleCore, Role, Substrate, TaggedWrite, TransportError,
    tcp_config as core_tcp_config,
};
use squarepeg_io::{Stack, TcpStream};
use squarepeg_session::{MessageNumber, MessageProps};
use squarepeg_tcp::utcp::MIN_READ_BUFFER;
use squarepeg_tcp::utcp::record;

use crate::config::ConnectionConfig;
use crate::connection::{Connection, Handle, Shared};
use crate::core::{Core, Port};
use crate::driver::{self, Wire};
use crate::endpoint::ConnectError;

/// The TCP configuration of a squarepeg connection over `stack`: the stack's defaults with
/// the uTCP options on (unordered receive, message writes, consistent segmentation, and,
/// with `inconsistent_retransmissions`, the uCOBS padder for inconsistent retransmissions),
/// and `dead_peer_timeout` as the TCP's user timeout and keepalive.
pub(crate) fn tcp_config(
    stack: &Stack,
    config: &ConnectionConfig,
) -> squarepeg_tcp::ConnectionConfig {
    let base = stack.connection_config();
    let window = base.recv_buffer;
    let mut tcp = core_tcp_config(
        base,
        Substrate::utcp(window),
        config.inconsistent_retransmissions,
    );
    if let Some(timeout) = config.dead_peer_timeout {
        set_dead_peer_timeout(&mut tcp, timeout);
    }
    tcp
}

/// `ConnectionConfig::dead_peer_timeout` on the userspace TCP: as over kernel TCP
/// (`kernel::set_dead_peer_timeout`), keepalive probes for a connection with nothing
/// outstanding (the first after a third of `timeout`, then every sixth, failing after the
/// last), and data unacknowledged for `timeout` ends it (the user timeout, RFC 9293 §3.8.3).
/// Here the user timeout can be used: this TCP counts only unanswered zero-window probes
/// against it, so a live peer that keeps its window closed keeps its connection.
fn set_dead_peer_timeout(tcp: &mut squarepeg_tcp::ConnectionConfig, timeout: Duration) {
    let (idle, interval, probes) = crate::config::dead_peer_keepalive(timeout, false);
    tcp.user_timeout = Some(timeout);
    tcp.keepalive = Some(squarepeg_tcp::KeepaliveConfig::new(idle, interval, probes));
}

struct UtcpWire {
    /// One read: whole records (reports, segments; a segment larger than the buffer comes
    /// in pieces). Its length is the read size now: `read_size`, or [`IDLE_READ`] at the
    /// start and after an idle release until a read fills that (the driver waits for reads
    /// with the buffer in hand, so an idle connection would otherwise hold a whole one).
    rbuf: Vec<u8>,
    /// `ConnectionConfig::read_buffer`, at least `MIN_READ_BUFFER`.
    read_size: usize,
    filled: usize,
    /// Bytes of records taken from the core at a time.
    write_batch: usize,
}

impl Wire for UtcpWire {
    type Io = TcpStream;

    fn batch(&mut self, _io: &TcpStream, _now: Instant) -> usize {
        // Records taken from the core are committed to this write: a larger batch would hold
        // a later, more urgent message behind frames the session could still have reordered.
        // The next batch is taken once this one is written whole, as the TCP's send buffer
        // takes it; frames wait in the session or in the TCP's tagged queue, where late
        // binding applies.
        self.write_batch
    }

    fn fill(&mut self, core: &mut Core, now: Instant, out: &mut Vec<u8>, limit: usize) -> bool {
        let Some(core) = core.single_mut() else {
            return false;
        };
        while out.len() < limit {
            let Some(w) = core.poll_write(now) else {
                return false;
            };
            // A deadline travels as a lifetime counted from the write: encoded just before
            // it, and counted by the TCP from its next clock update (at most one stack turn
            // later), so a message may live that much longer, never shorter.
            encode_write(&w, now, out);
            core.write_done();
        }
        true
    }

    fn begin_read(&mut self, _core: &mut Core) {}

    fn read_buffer(&mut self) -> &mut [u8] {
        &mut self.rbuf
    }

    fn filled(&mut self, n: usize) {
        self.filled = n;
    }

    fn release_idle(&mut self) {
        if self.filled == 0 {
            self.rbuf = vec![0; self.read_size.min(IDLE_READ)];
        }
    }

    fn buffer_capacity(&self) -> usize {
        self.rbuf.capacity()
    }

    fn end_read(&mut self, core: &mut Core, now: Instant) {
        let n = std::mem::take(&mut self.filled);
        let grow = n >= self.rbuf.len() && self.rbuf.len() < self.read_size;
        let Some(core) = core.single_mut() else {
            return;
        };
        for r in record::decode_read(&self.rbuf[..n]) {
            match r {
                Ok(record::ReadRecord::Segment { offset, data }) => {
                    core.handle_segment(now, offset, data)
                }
                Ok(record::ReadRecord::Report(report)) => core.handle_report(report),
                Err(e) => {
                    // Our own stack's records: a malformed one is a bug, not the peer's doing.
                    tracing::error!("uTCP record stream: {e}");
                    core.handle_transport_closed(
                        now,
                        TransportError::Io(io::ErrorKind::InvalidData),
                    );
                    return;
                }
            }
        }
        if grow {
            // Traffic again: whole reads.
            self.rbuf = vec![0; self.read_size];
        }
    }
}

/// The read size of a new connection, and of one idle since its memory was given back,
/// until a read fills it.
const IDLE_READ: usize = 4096;

/// Appends `w` as the uTCP MESSAGE record that carries a tagged write (the stream's writes
/// are records in the uTCP mode).
fn encode_write(w: &TaggedWrite<'_>, now: Instant, out: &mut Vec<u8>) {
    let meta = record::MessageMeta {
        priority: w.tag.priority,
        squash_key: w.tag.squash_key,
        lifetime: w.tag.deadline.map(|d| d.saturating_duration_since(now)),
        depends_on: w.tag.depends_on,
        message_id: w.tag.message_id,
    };
    record::encode_message(&meta, w.frame, out);
}

/// Builds the core for a connection of `stack` and spawns its driver.
pub(crate) fn start(
    stream: TcpStream,
    role: Role,
    config: ConnectionConfig,
    window: usize,
) -> Result<Connection, ConnectError> {
    let core = SingleCore::new(role, config.core_config(), Substrate::utcp(window))?;
    start_core(stream, core, config)
}

/// Spawns the driver of `core` on `stream`.
fn start_core(
    stream: TcpStream,
    mut core: SingleCore,
    config: ConnectionConfig,
) -> Result<Connection, ConnectError> {
    // With inconsistent retransmissions on, the core's own padder (TLS: padding records).
    if let Some(padder) = core.padder() {
        stream.replace_padder(padder).map_err(ConnectError::Io)?;
    }
    let shared = Arc::new(Shared::new(
        core,
        config.status_queue,
        stream.local_addr(),
        stream.peer_addr(),
    ));
    let read_size = config.read_buffer.max(MIN_READ_BUFFER);
    let wire = UtcpWire {
        // A new connection's first reads are a handshake's few KiB: a whole read buffer
        // only once traffic fills a small one.
        rbuf: vec![0; read_size.min(IDLE_READ)],
        read_size,
        filled: 0,
        write_batch: config.write_batch.max(1),
    };
    tokio::spawn(driver::run(
        shared.clone(),
        Port::Single,
        stream,
        wire,
        config.write_batch,
    ));
    Ok(Connection {
        handle: Arc::new(Handle(shared)),
    })
}

/// Listens on `addr` of `stack` with the uTCP options — an unspecified address (`0.0.0.0`,
/// `[::]`) means that port on every address of the stack; see
/// [`crate::Endpoint::listen_utcp`].
pub(crate) fn listen(
    stack: &Stack,
    addr: SocketAddr,
    config: &ConnectionConfig,
) -> io::Result<(squarepeg_io::TcpListener, usize)> {
    let tcp = tcp_config(stack, config);
    let window = tcp.recv_buffer;
    let addrs: Vec<SocketAddr> = if addr.ip().is_unspecified() {
        stack
            .addresses()
            .into_iter()
            .map(|ip| SocketAddr::new(ip, addr.port()))
            .collect()
    } else {
        vec![addr]
    };
    Ok((stack.listen_with(&addrs, tcp)?, window))
}

/// Opens a uTCP connection to `addr` from `stack`.
pub(crate) async fn connect(
    stack: &Stack,
    addr: SocketAddr,
    config: &ConnectionConfig,
) -> io::Result<(TcpStream, usize)> {
    let tcp = tcp_config(stack, config);
    let window = tcp.recv_buffer;
    Ok((stack.connect_with(addr, tcp).await?, window))
}

/// Opens a connection to `addr` from `stack` with TCP Fast Open (RFC 7413, the userspace
/// TCP's own): the core's first write (the ClientHello over TLS, PARAMS in cleartext; a
/// write nothing overtakes either way) is taken before the connection exists and goes on
/// the SYN when the stack holds a cookie from the server, with a cookie request otherwise
/// (`Stack::connect_fast_open`). Returns once the TCP connection is established.
pub(crate) async fn connect_fast_open(
    stack: &Stack,
    addr: SocketAddr,
    config: ConnectionConfig,
    messages: Vec<(Bytes, MessageProps)>,
) -> Result<(Connection, Vec<MessageNumber>), ConnectError> {
    let tcp = tcp_config(stack, &config);
    let window = tcp.recv_buffer;
    let mut core = SingleCore::new(Role::Client, config.core_config(), Substrate::utcp(window))?;
    let now = Instant::now();
    // Queued first, so that those marked safely replayable go as TLS early data in the
    // first write (see `Connection::connect_with_messages`).
    let numbers = crate::kernel::queue(&mut core, now, messages)?;
    let mut first = Vec::new();
    if let Some(w) = core.poll_write(now) {
        encode_write(&w, now, &mut first);
        core.write_done();
    }
    let stream = stack
        .connect_fast_open(addr, tcp, &first)
        .await
        .map_err(crate::endpoint::connect_error)?;
    Ok((start_core(stream, core, config)?, numbers))
}

/// Opens a connection to `addr` from `stack` (no Fast Open) with `messages` queued before
/// its driver starts.
pub(crate) async fn connect_with_messages(
    stack: &Stack,
    addr: SocketAddr,
    config: ConnectionConfig,
    messages: Vec<(Bytes, MessageProps)>,
) -> Result<(Connection, Vec<MessageNumber>), ConnectError> {
    let (stream, window) = connect(stack, addr, &config)
        .await
        .map_err(crate::endpoint::connect_error)?;
    let mut core = SingleCore::new(Role::Client, config.core_config(), Substrate::utcp(window))?;
    let numbers = crate::kernel::queue(&mut core, Instant::now(), messages)?;
    Ok((start_core(stream, core, config)?, numbers))
}
