//! Framing for squarepeg: uCOBS (Minion §5), and plain length-prefixed frames
//! where uCOBS's markers are not needed.
//!
//! Every frame travels as `0x00 ‖ COBS(header ‖ payload ‖ CRC32C) ‖ 0x00`.
//! The markers at both ends make each frame self-delimiting in any fragment
//! of the TCP stream, so a receiver handed segments out of order can still
//! find complete frames (Minion §5.3); the checksum rejects frames assembled
//! from bytes of different transmissions (Hollywood §4.5). The exact format,
//! with test vectors the tests check, is in docs/wire.md §1.
//!
//! - [`varint`]: QUIC variable-length integers used in the header.
//! - [`header`]: the versioned frame header ([`FrameHeader`]).
//! - [`cobs`]: the byte-stuffing codec, written for speed: vector compares
//!   find the zeros and whole runs are copied at once (AVX2 and AVX-512 code
//!   paths chosen at run time, a portable one elsewhere). [`cobs::Encoder`] encodes
//!   a body from several parts without joining them; [`cobs::decode_into`]
//!   decodes into a caller's buffer. With the `reference` feature (always
//!   in tests) `cobs::reference` holds the plain byte-at-a-time codec the
//!   fast one is checked against.
//! - [`frame`]: whole frames: [`encode_frame`], [`decode_frame`] (and
//!   [`frame::decode_frame_into`] to reuse a payload buffer),
//!   [`encode_padding`]. A [`Frame`]'s payload is a [`bytes::Bytes`].
//! - [`reassembler`]: the receive side with out-of-order segments:
//!   [`Reassembler`] takes byte ranges at stream offsets, in any order, with
//!   duplicates, overlaps and conflicting retransmissions, within a memory
//!   limit, and yields each complete frame once with its stream offset.
//! - [`decoder`]: the receive side over an in-order byte stream
//!   ([`StreamDecoder`]): the caller reads into its buffer, one `memchr`
//!   pass finds the markers, and the frames of a read are decoded into one
//!   pooled chunk, their payloads [`bytes::Bytes`] slices of it (no
//!   allocation or copy per frame); it reports exactly what the
//!   [`Reassembler`] reports for the same bytes (tested against it).
//! - [`plain`]: plain frames, `varint(length) ‖ header ‖ payload`, for a
//!   direction whose receiver reads in order and whose sender never
//!   replaces retransmitted bytes (docs/wire.md §3); [`FrameFormat`]
//!   encodes in either format (with the `reference` feature,
//!   `plain::reference` decodes a stream frame by frame, the oracle for the
//!   reader's message runs).
//! - [`reader`]: [`FrameReader`], the in-order receive side that follows
//!   the sender's switch from uCOBS to plain frames.
//! - [`run`]: [`MessageRun`], consecutive plain MESSAGE frames of a read
//!   handed on whole, each message cut out only where it is delivered.
//! - `crc`: CRC32C, by `crc-fast` (carry-less multiplication folding).
//! - [`sample`]: deterministic sample payloads (random, text-like,
//!   zero-heavy) for the benchmarks and tests.
//!
//! Speed: `cargo bench -p squarepeg-framing` (criterion: COBS against the
//! `cobs` and `corncobs` crates and memcpy; the receive path against plain
//! frame decoding) and `peg bench framing`; figures in docs/results.md.
//!
//! Nothing here does I/O or reads a clock; every error a peer can cause is
//! a value, and every buffer a peer can grow is bounded.

pub mod cobs;
mod crc;
pub mod decoder;
pub mod frame;
pub mod header;
pub mod plain;
pub mod reader;
pub mod reassembler;
pub mod run;
pub mod sample;
pub mod varint;

pub use decoder::StreamDecoder;
pub use frame::{
    DEFAULT_MAX_BODY, Frame, MAX_PADDING_FRAME, MIN_PADDING_FRAME, decode_frame, encode_frame,
    encode_padding,
};
pub use header::{FrameHeader, FrameKind, MAX_HEADER_LEN, VERSION};
pub use plain::{FrameFormat, encode_plain_frame, encode_plain_message};
pub use reader::FrameReader;
pub use reassembler::{
    ReassembledFrame, Reassembler, ReassemblyError, ReassemblyStats, RejectedFrame,
};
pub use run::{Decoded, MessageRun, RunMessage};

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
    #[error("COBS output buffer of {capacity} bytes is too small")]
    OutputTooSmall { capacity: usize },
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
    /// A frame body over `limit` bytes. `len` is the body's size when it is known (a plain
    /// frame's declared length, or a body decoded whole); a COBS frame is given up on as soon as
    /// its encoding is too long for any body within the limit, before its size is known.
    #[error("frame {}exceeds the limit of {limit} bytes", len.map(|n| format!("of {n} bytes ")).unwrap_or_default())]
    Oversize { len: Option<usize>, limit: usize },
    #[error("stream offset plus length exceeds 2^62-1")]
    OffsetOverflow,
    #[error("bytes before the first frame marker")]
    GarbageBeforeMarker,
    /// The stream begins with what a TLS record begins with (RFC 8446 §5.1: type handshake
    /// or alert, legacy version 3.x) where the first frame marker was due: the peer runs TLS
    /// and this side does not.
    #[error("a TLS record where the first frame was due: the peer runs TLS, this side does not")]
    TlsRecord,
}

impl FrameError {
    /// The error for a stream whose first bytes, `first` (not empty), are not a frame
    /// marker: [`FrameError::TlsRecord`] if they start like a TLS record (a ClientHello, a
    /// ServerHello or an alert), else [`FrameError::GarbageBeforeMarker`].
    pub fn before_first_marker(first: &[u8]) -> Self {
        const HANDSHAKE: u8 = 0x16;
        const ALERT: u8 = 0x15;
        match first {
            [HANDSHAKE | ALERT] | [HANDSHAKE | ALERT, 0x03, ..] => Self::TlsRecord,
            _ => Self::GarbageBeforeMarker,
        }
    }
}
