//! Errors of the TLS layer, each with the alert it sends (RFC 8446 §6.2).

/// Alert descriptions this crate sends or names (RFC 8446 §6).
pub mod alert {
    /// `close_notify` (RFC 8446 §6.1).
    pub const CLOSE_NOTIFY: u8 = 0;
    /// `unexpected_message` (RFC 8446 §6.2).
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    /// `bad_record_mac` (RFC 8446 §6.2).
    pub const BAD_RECORD_MAC: u8 = 20;
    /// `record_overflow` (RFC 8446 §6.2).
    pub const RECORD_OVERFLOW: u8 = 22;
    /// `illegal_parameter` (RFC 8446 §6.2).
    pub const ILLEGAL_PARAMETER: u8 = 47;
    /// `decode_error` (RFC 8446 §6.2).
    pub const DECODE_ERROR: u8 = 50;
    /// `internal_error` (RFC 8446 §6.2).
    pub const INTERNAL_ERROR: u8 = 80;
    /// `user_canceled` (RFC 8446 §6.1).
    pub const USER_CANCELED: u8 = 90;
}

/// What went wrong. Every fatal error a peer caused also queues the matching alert
/// (RFC 8446 §6.2) for [`crate::Tls::poll_output`]; [`TlsError::alert`] says which.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The handshake failed in rustls (rustls queued its own alert), or rustls refused a
    /// post-handshake step (a session ticket it cannot parse, a key update it cannot derive).
    #[error("TLS handshake: {0}")]
    Handshake(rustls::Error),
    /// A record or message that does not parse: an alert of the wrong length, a KeyUpdate
    /// of the wrong length, a handshake message longer than any allowed (`decode_error`).
    #[error("malformed TLS record or message")]
    BadRecord,
    /// A record that does not authenticate under the current key and sequence number
    /// (`bad_record_mac`, RFC 8446 §5.2).
    #[error("TLS record failed to decrypt (bad_record_mac)")]
    Decrypt,
    /// The peer sent this fatal alert (RFC 8446 §6.2); nothing is sent back.
    #[error("TLS alert received: {description}")]
    Alert {
        /// The alert's description byte.
        description: u8,
    },
    /// A message that is not allowed here: a content type other than application data,
    /// handshake or alert, a handshake message other than KeyUpdate (or NewSessionTicket on a
    /// client), a zero-length handshake record, a handshake message spanning a key change,
    /// a record whose inner plaintext is all padding, too many KeyUpdates or user_canceled
    /// alerts without application data between them (`unexpected_message`).
    #[error("unexpected TLS message")]
    UnexpectedMessage,
    /// A record longer than RFC 8446 §5.2 allows: more than 2^14 + 256 bytes of ciphertext,
    /// or more than 2^14 + 1 bytes of inner plaintext (`record_overflow`).
    #[error("TLS record too long (record_overflow)")]
    RecordOverflow,
    /// A field with a value the protocol forbids, e.g. a KeyUpdate's request_update
    /// other than 0 or 1 (`illegal_parameter`, RFC 8446 §4.6.3).
    #[error("illegal TLS parameter")]
    IllegalParameter,
    /// Application data cannot be sealed before the handshake has finished.
    #[error("TLS handshake not finished")]
    NotReady,
    /// The connection is closed for sending (close_notify queued) or has failed; or the
    /// peer closed during the handshake.
    #[error("TLS connection closed")]
    Closed,
    /// The peer's first bytes are not a TLS record (RFC 8446 §5.1: a handshake or alert
    /// record, legacy version 3.x): it does not run TLS (a squarepeg peer without TLS sends
    /// frames in the clear). An unexpected_message alert goes back in the clear.
    #[error("the peer does not speak TLS: its first bytes are not a TLS record")]
    NotTls,
    /// A configuration that cannot be used (bad PEM, no certificate, a server name that is
    /// not one, secret extraction disabled, ...).
    #[error("TLS configuration: {0}")]
    Config(String),
}

impl TlsError {
    /// The alert this error sends to the peer, if any (RFC 8446 §6.2). Errors from rustls's
    /// handshake carry none here because rustls queued its own.
    pub fn alert(&self) -> Option<u8> {
        match self {
            TlsError::BadRecord => Some(alert::DECODE_ERROR),
            TlsError::Decrypt => Some(alert::BAD_RECORD_MAC),
            TlsError::UnexpectedMessage => Some(alert::UNEXPECTED_MESSAGE),
            TlsError::RecordOverflow => Some(alert::RECORD_OVERFLOW),
            TlsError::IllegalParameter => Some(alert::ILLEGAL_PARAMETER),
            TlsError::Handshake(_)
            | TlsError::Alert { .. }
            | TlsError::NotReady
            | TlsError::NotTls
            | TlsError::Closed
            | TlsError::Config(_) => None,
        }
    }
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        match e {
            rustls::Error::AlertReceived(description) => TlsError::Alert {
                description: u8::from(description),
            },
            e => TlsError::Handshake(e),
        }
    }
}
