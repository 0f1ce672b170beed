//! Sans-IO TLS 1.3 for squarepeg.
//!
//! [`Tls`] is one connection over an in-order byte stream: fed the peer's bytes, polled for its
//! own, no sockets, clock or runtime. [`config`] builds the rustls configurations (TLS 1.3
//! only, ring) and self-signed certificates; [`record`] is the record protection itself.
//!
//! # Who does what
//!
//! **rustls runs the handshake** (RFC 8446 §4) through its unbuffered API: key exchange,
//! certificate checks, the key schedule and session tickets are hard to get right and rustls
//! is well reviewed. When the handshake completes, [`Tls`] takes the traffic secrets and
//! sequence numbers from rustls (`dangerous_into_kernel_connection`, secret extraction on)
//! and keeps rustls's `KernelConnection` only to derive the next secrets at a KeyUpdate
//! (RFC 8446 §7.2) and to store NewSessionTickets, so that resumption keeps working.
//!
//! **squarepeg owns the record layer** (RFC 8446 §5) after the handshake, because it must open
//! records that rustls cannot: squarepeg's userspace TCP hands segments up out of order, and
//! the receiver finds the TLS records in them and opens each complete one on its own (Minion
//! §6), which needs the record's number and its key, i.e. the sequence numbers and keys
//! outside the TLS library. [`record::RecordKeys`] seals and opens any record by sequence
//! number with ring's AEADs (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305; nonce = iv XOR
//! sequence number, additional data = the record header, RFC 8446 §5.2–5.3), and can compute
//! the keystream of a record's first bytes to recognise a record start before the whole
//! record has arrived. On the in-order path [`Tls`] keeps the sequence numbers, sends and
//! answers KeyUpdates (RFC 8446 §4.6.3), rekeys before a key's confidentiality limit
//! (RFC 8446 §5.5), hands NewSessionTickets to rustls, and sends and receives close_notify and
//! alerts (RFC 8446 §6).

pub mod config;
mod error;
pub mod join;
pub mod padding;
pub mod record;
mod tls;
pub mod unordered;

pub use error::{TlsError, alert};
pub use join::{
    JoinConfig, JoinProbe, JoinRefusal, JoinRegistry, JoinStats, JoinTickets, JoinVerdict,
    SessionId,
};
pub use padding::PaddingSealer;
pub use tls::{EarlyData, RecordSlot, Tls, TlsStats};
pub use unordered::{OutOfOrderConfig, OutOfOrderRecord};

/// rustls, as this crate uses it (for its configuration and certificate types).
pub use rustls;
