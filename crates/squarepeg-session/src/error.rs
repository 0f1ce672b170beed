//! Typed errors of the session core.

use crate::control::ControlError;
use squarepeg_framing::FrameError;

/// Transport error codes carried by CLOSE frames (docs/wire.md §2.4).
pub mod transport_code {
    /// Graceful close, nothing wrong.
    pub const NO_ERROR: u64 = 0x00;
    /// The sender hit an internal error.
    pub const INTERNAL_ERROR: u64 = 0x01;
    /// A frame failed to decode (COBS, header, checksum, size).
    pub const FRAME_ERROR: u64 = 0x02;
    /// Stream data beyond the credit the receiver gave.
    pub const FLOW_CONTROL_ERROR: u64 = 0x03;
    /// A stream opened beyond the receiver's MAX_STREAMS.
    pub const STREAM_LIMIT_ERROR: u64 = 0x04;
    /// A frame for a stream in a state that does not allow it.
    pub const STREAM_STATE_ERROR: u64 = 0x05;
    /// Data past a stream's final size, or two different final sizes.
    pub const FINAL_SIZE_ERROR: u64 = 0x06;
    /// A control frame that cannot be parsed, or of unknown type.
    pub const CONTROL_FRAME_ERROR: u64 = 0x07;
    /// Any other breach of the protocol.
    pub const PROTOCOL_VIOLATION: u64 = 0x08;
}

/// Something the peer sent that breaks the protocol. The session closes the
/// connection with the matching CLOSE code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("bad control frame: {0}")]
    Control(#[from] ControlError),
    #[error("stream {stream} data up to offset {end} exceeds the credit of {limit}")]
    StreamFlowControl { stream: u64, end: u64, limit: u64 },
    #[error("connection data total {total} exceeds the credit of {limit}")]
    ConnectionFlowControl { total: u64, limit: u64 },
    #[error("peer opened stream {stream} beyond its limit of {limit} streams")]
    StreamLimit { stream: u64, limit: u64 },
    #[error("stream {stream}: {what}")]
    StreamState { stream: u64, what: &'static str },
    #[error("stream {stream}: final size {got} conflicts with {known}")]
    FinalSize { stream: u64, known: u64, got: u64 },
    /// A Switch frame to a format this side did not announce, or a second one.
    #[error("unexpected switch to frame format {format}")]
    UnexpectedSwitch { format: u64 },
    /// A control frame this side did not ask for (RECORDS_REPLACED to a side that does not
    /// read numbered records out of order).
    #[error("unexpected control frame type {frame_type:#04x}")]
    UnexpectedControl { frame_type: u8 },
    /// A session over several connections: the peer acknowledged plaintext up to `acked`
    /// on a connection that carried `sent` bytes, or not at the end of a frame
    /// (docs/wire.md §7).
    #[error("acknowledgement of {acked} bytes on a connection that sent {sent}")]
    BadAcknowledgement { acked: u64, sent: u64 },
    /// This side runs a session over several connections and the peer's first frame on a
    /// connection was not PATH_PROBE: the peer runs a single-connection session
    /// (docs/wire.md §7).
    #[error("one end runs a session over several connections (multipath), the other does not")]
    NotMultipath,
}

impl ProtocolError {
    /// The CLOSE code that reports this error to the peer.
    pub fn code(&self) -> u64 {
        use transport_code::*;
        match self {
            Self::Frame(_) => FRAME_ERROR,
            Self::Control(_) => CONTROL_FRAME_ERROR,
            Self::StreamFlowControl { .. } | Self::ConnectionFlowControl { .. } => {
                FLOW_CONTROL_ERROR
            }
            Self::StreamLimit { .. } => STREAM_LIMIT_ERROR,
            Self::StreamState { .. } => STREAM_STATE_ERROR,
            Self::FinalSize { .. } => FINAL_SIZE_ERROR,
            Self::UnexpectedSwitch { .. }
            | Self::UnexpectedControl { .. }
            | Self::BadAcknowledgement { .. }
            | Self::NotMultipath => PROTOCOL_VIOLATION,
        }
    }
}

/// Why a connection is no longer usable. Every application call on a closed
/// connection returns the error that closed it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionError {
    /// The peer's application closed the connection (APPLICATION_CLOSE).
    #[error(
        "peer closed the connection (application code {code}{})",
        fmt_reason(reason)
    )]
    ApplicationClosed { code: u64, reason: String },
    /// The peer closed the connection reporting a transport error code
    /// (`transport_code`), usually because it found us misbehaving.
    #[error(
        "peer closed the connection with transport error {code:#x}{}",
        fmt_reason(reason)
    )]
    PeerError { code: u64, reason: String },
    /// The peer broke the protocol; we closed the connection.
    #[error("protocol violation by the peer: {0}")]
    ProtocolViolation(ProtocolError),
    /// This side closed the connection gracefully.
    #[error("connection closed locally")]
    LocallyClosed,
    /// This side aborted the connection with an application code.
    #[error("connection aborted locally (code {0})")]
    LocallyAborted(u64),
    /// The transport below ended or failed without a CLOSE frame.
    #[error("transport: {0}")]
    Transport(TransportError),
    /// A graceful close did not finish in time.
    #[error("timed out waiting for the peer to finish closing")]
    TimedOut,
}

/// How the transport under a session ended without a CLOSE frame: the
/// reasons an application can act on, from the kernel's socket errors or the
/// userspace TCP's close reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The peer ended its byte stream (TCP FIN) without a CLOSE frame.
    #[error("the peer closed the TCP connection without a CLOSE frame")]
    PeerClosed,
    /// This side closed gracefully, and the peer ended its byte stream (or let the drain
    /// timeout pass) without ever having sent a frame (every squarepeg session opens with
    /// PARAMS, docs/wire.md §2.2): nothing sent reached a squarepeg session. Another
    /// protocol, or a squarepeg peer running TLS while this side does not.
    #[error(
        "the peer never sent a frame: it does not run squarepeg (or TLS is on at one end only)"
    )]
    NothingReceived,
    /// The peer reset the connection (TCP RST).
    #[error("connection reset by the peer")]
    Reset,
    /// Retransmissions, keepalives or the user timeout gave up.
    #[error("connection timed out")]
    TimedOut,
    /// The peer refused the connection.
    #[error("connection refused")]
    Refused,
    /// The peer's host or network cannot be reached.
    #[error("peer unreachable")]
    Unreachable,
    /// A local I/O error of this kind.
    #[error("local I/O error: {0}")]
    Io(std::io::ErrorKind),
    /// TLS failed: the handshake, or a record (RFC 8446).
    #[error("TLS: {0}")]
    Tls(TlsFailure),
}

/// How TLS failed, as an application can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The peer's certificate was refused: unknown issuer, wrong name, expired, not the
    /// pinned one, or none at all.
    #[error("the peer's certificate was refused")]
    Certificate,
    /// The peer offers nothing this side accepts: not TLS 1.3 (a TLS 1.2-only peer), or no
    /// cipher suite, key exchange group or signature scheme in common.
    #[error(
        "the peer offers no TLS version, cipher suite, group or signature scheme in common \
         (squarepeg runs TLS 1.3 only)"
    )]
    Incompatible,
    /// The handshake failed otherwise: a malformed or unexpected handshake message, a
    /// refused parameter.
    #[error("handshake failed")]
    Handshake,
    /// A record did not authenticate (bad_record_mac, RFC 8446 §5.2): bytes were corrupted
    /// or forged on the way; nothing of it was delivered.
    #[error("a record failed authentication (bad_record_mac)")]
    Decrypt,
    /// The peer broke the record protocol: a malformed or oversized record, an unexpected
    /// message or parameter (RFC 8446 §6.2).
    #[error("the peer broke the record protocol")]
    Protocol,
    /// The peer sent this fatal alert (its description, RFC 8446 §6).
    #[error("the peer sent alert {0}")]
    AlertReceived(u8),
    /// The peer does not run TLS: its first bytes were not a TLS record (a squarepeg peer
    /// without TLS, or another protocol).
    #[error("the peer does not speak TLS (its first bytes are not a TLS record)")]
    NotTls,
    /// The handshake did not complete within the connection's handshake timeout: a peer
    /// that stopped answering, or bytes a middlebox put in the stream that the handshake
    /// waits on for ever.
    #[error("the TLS handshake timed out")]
    HandshakeTimedOut,
}

impl TransportError {
    /// The error a socket operation's `io::Error` stands for.
    pub fn from_io(e: &std::io::Error) -> Self {
        Self::from_io_kind(e.kind())
    }

    /// The error an `io::ErrorKind` stands for.
    pub fn from_io_kind(kind: std::io::ErrorKind) -> Self {
        use std::io::ErrorKind as K;
        match kind {
            // EPIPE after the peer's RST reads as a broken pipe.
            K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => Self::Reset,
            K::TimedOut => Self::TimedOut,
            K::ConnectionRefused => Self::Refused,
            K::HostUnreachable | K::NetworkUnreachable | K::NetworkDown => Self::Unreachable,
            K::UnexpectedEof => Self::PeerClosed,
            other => Self::Io(other),
        }
    }
}

fn fmt_reason(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

/// Why a message was not queued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("send queue full ({queued} of {limit} bytes queued)")]
    QueueFull { queued: usize, limit: usize },
    #[error("message depends on #{depends_on}, which has not been sent yet (next is #{next})")]
    UnknownDependency { depends_on: u64, next: u64 },
    #[error("connection is closing: no new messages")]
    Closing,
    #[error(transparent)]
    Connection(#[from] ConnectionError),
}

/// A stream operation that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("no stream {0}")]
    UnknownStream(u64),
    #[error("the peer allows no more streams now")]
    StreamsBlocked,
    #[error("stream {0} was already finished or reset by this side")]
    SendClosed(u64),
    #[error("the peer stopped reading stream {id} (code {code})")]
    Stopped { id: u64, code: u64 },
    #[error("the peer reset stream {id} (code {code})")]
    Reset { id: u64, code: u64 },
    #[error("stream {0} was stopped by this side")]
    ReadClosed(u64),
    #[error("connection is closing: no new streams")]
    Closing,
    #[error(transparent)]
    Connection(#[from] ConnectionError),
}
