//! What a connection is built from: its session limits, its framing choices and the kind of
//! substrate below it.

use std::time::Duration;

use squarepeg_session::{Config as SessionConfig, ConfigError};

use crate::record::TlsSetup;

/// Configuration of one [`crate::Connection`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The session core's limits (windows, queues, chunk size).
    pub session: SessionConfig,
    /// Bytes the in-order receive path offers per read. Received payloads are slices of
    /// shared chunks of about this size (no copy or allocation per message); while chunks
    /// kept alive by payloads the application still holds exceed
    /// `session.message_receive_queue` plus four reads, further payloads are copied out
    /// instead, so held payloads cannot pin unbounded memory.
    pub read_buffer: usize,
    /// Switch each direction to plain frames (no byte stuffing, markers or checksum;
    /// docs/wire.md §3) when the receiver reads in order and the sender never replaces
    /// retransmitted bytes. Off: uCOBS both ways, always.
    pub plain_frames: bool,
    /// TLS 1.3 on this connection (see `record`); `None`: cleartext.
    pub tls: Option<TlsSetup>,
    /// A TLS handshake not complete this long after the connection first ran (was first
    /// polled or fed) fails it (`TlsFailure::HandshakeTimedOut`): a peer that stopped
    /// answering, or bytes injected into the stream that the handshake would wait on for
    /// ever, must not hold it open.
    pub handshake_timeout: Duration,
    /// After this long without bytes read or written, the connection gives back the memory
    /// of its empty buffers (read buffers, idle chunks, TLS buffers, queues grown in a
    /// burst; [`crate::Connection::release_idle_memory`]), so that a server's idle
    /// connections hold a few KiB each rather than what their busiest moment needed. The
    /// next bytes allocate again. `None`: never.
    pub release_idle_after: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            session: SessionConfig::default(),
            read_buffer: 64 * 1024,
            plain_frames: true,
            tls: None,
            handshake_timeout: Duration::from_secs(10),
            // Long enough that a connection between the messages of a call, a game or an
            // RPC exchange keeps its buffers; short enough that idle ones stop holding them.
            release_idle_after: Some(Duration::from_secs(1)),
        }
    }
}

impl Config {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.session.validate()?;
        if self.read_buffer == 0 {
            return Err(ConfigError("read_buffer must be > 0"));
        }
        if self.handshake_timeout.is_zero() {
            return Err(ConfigError("handshake_timeout must be > 0"));
        }
        if self.release_idle_after.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError("release_idle_after must be > 0 (None: never)"));
        }
        Ok(())
    }
}

/// How the substrate hands over received bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receive {
    /// An in-order byte stream from offset 0 (kernel TCP; the userspace TCP read in order).
    InOrder,
    /// Segments with their stream offsets, in any order and possibly more than once
    /// (Minion §4.1 unordered receive). `window` is the most bytes the transport accepts
    /// beyond what is delivered in order (its receive buffer); it sizes the reassembler, so
    /// that nothing the transport accepts is refused.
    Segments {
        /// The transport's receive buffer in bytes.
        window: usize,
    },
}

/// How the substrate takes bytes to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Send {
    /// An in-order byte stream: what is handed over is committed, in order (kernel TCP;
    /// late binding happens in the session, before the bytes are handed over).
    ByteStream,
    /// Whole frames as tagged writes (priority, squash key, deadline, dependency, message
    /// number) into the userspace TCP's send queue, which binds late itself (Minion §4.2)
    /// and reports each message's fate.
    TaggedWrites,
}

/// The substrate below a connection: how it receives and how it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Substrate {
    pub receive: Receive,
    pub send: Send,
}

impl Substrate {
    /// An in-order byte stream both ways (kernel TCP).
    pub const fn byte_stream() -> Self {
        Self {
            receive: Receive::InOrder,
            send: Send::ByteStream,
        }
    }

    /// The userspace TCP's uTCP interface: unordered segments in, tagged writes out.
    /// `window` is the TCP receive buffer.
    pub const fn utcp(window: usize) -> Self {
        Self {
            receive: Receive::Segments { window },
            send: Send::TaggedWrites,
        }
    }

    /// Whether this side may receive plain frames: only a receiver that reads the stream in
    /// order can find frame boundaries without markers.
    pub fn receives_in_order(&self) -> bool {
        self.receive == Receive::InOrder
    }

    /// Whether this side may switch its sending direction to plain frames. A tagged send
    /// queue may put a later, more urgent write ahead of earlier unsent ones, so the point
    /// where a format switch takes effect would not be fixed in the stream; and with
    /// inconsistent retransmissions the receiver needs the markers and checksums (Hollywood
    /// §4.5). Only a byte stream sender switches.
    pub fn may_send_plain(&self) -> bool {
        self.send == Send::ByteStream
    }
}
