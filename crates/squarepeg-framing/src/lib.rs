//! uCOBS framing for squarepeg (Minion §5).
//!
//! Every frame travels as `0x00 ‖ COBS(header ‖ payload ‖ CRC32C) ‖ 0x00`.
//! The markers at both ends make each frame self-delimiting in any fragment
//! of the TCP stream, so a receiver handed segments out of order can still
//! find complete frames; the checksum rejects frames assembled from bytes of
//! different transmissions. The exact format is in docs/wire.md.
//!
//! - [`varint`]: QUIC variable-length integers used in the header.
//! - [`header`]: the versioned frame header.
//! - [`cobs`]: the byte-stuffing codec.
//! - [`frame`]: whole frames, checksums, padding.
//! - [`decoder`]: in-order decoding of a byte stream.

pub mod cobs;
pub mod decoder;
pub mod frame;
pub mod header;
pub mod varint;

pub use decoder::StreamDecoder;
pub use frame::{DEFAULT_MAX_BODY, Frame, decode_frame, encode_frame, encode_padding};
pub use header::{FrameHeader, FrameKind, VERSION};

/// A frame header that cannot be parsed or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("frame header truncated")]
    Truncated,
    #[error("unsupported frame version {0} (this build speaks version {VERSION})")]
    UnsupportedVersion(u8),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("reserved flag bits set: {0:#04x}")]
    ReservedFlags(u8),
    #[error("value {0} does not fit a varint (max 2^62-1)")]
    VarintTooLarge(u64),
}

/// Bytes that are not valid COBS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CobsError {
    #[error("empty COBS encoding")]
    Empty,
    #[error("COBS block runs past the end of the frame")]
    Truncated,
    #[error("zero byte inside a COBS encoding at index {at}")]
    ZeroByte { at: usize },
}

/// A frame that cannot be encoded or decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error(transparent)]
    Cobs(#[from] CobsError),
    #[error("frame body shorter than header plus checksum")]
    TooShort,
    #[error("frame checksum mismatch (sent {expected:#010x}, computed {computed:#010x})")]
    ChecksumMismatch { expected: u32, computed: u32 },
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    Oversize { len: usize, limit: usize },
    #[error("stream offset plus length exceeds 2^62-1")]
    OffsetOverflow,
    #[error("bytes before the first frame marker")]
    GarbageBeforeMarker,
}
