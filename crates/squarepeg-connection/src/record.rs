//! The record layer: the place between the frame codec and the substrate where a connection's
//! bytes are protected.
//!
//! Today every connection is cleartext, and the layer passes bytes through untouched: on a
//! byte stream the session's frames are written straight into the driver's output, and the
//! driver's reads go straight into the frame reader. TLS 1.3 slots in here, once, for every
//! driver:
//!
//! - **send (byte stream)**: the session writes frames into a plaintext staging buffer, and
//!   the layer seals it into TLS records (`0x17 0x03 0x03 len`) in the driver's output,
//!   sized for latency when messages are small and 16 KiB for bulk; inside records, frames
//!   need no byte stuffing (records delimit, the AEAD authenticates), so the session writes
//!   plain frames (docs/wire.md §3);
//! - **receive (byte stream)**: the driver's bytes are opened record by record and the
//!   plaintext goes to the frame reader;
//! - **receive (segments)**: the scanner finds records in out-of-order segments (Minion §6),
//!   opens each complete one and hands its frames to the session, instead of the uCOBS
//!   reassembler;
//! - **send (tagged writes)**: each write becomes whole records, so that the TCP's queue
//!   still moves and replaces whole records.
//!
//! [`crate::Connection`] calls into this module at exactly those four points; the handshake
//! runs before the session starts, in the same core.

/// How a connection's bytes are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protection {
    /// No protection: frames go to the substrate as they are.
    #[default]
    Cleartext,
}
