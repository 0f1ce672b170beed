//! The uCOBS frame header (wire version 1), specified byte by byte in
//! docs/wire.md.
//!
//! ```text
//! byte 0      version (high 4 bits, = 1) | kind (low 4 bits)
//! byte 1      flags: bit 0 = FIN (stream chunks only); bits 1-7 reserved, must be 0
//! then, by kind:
//!   Message      varint sub-stream id, varint message number
//!   StreamChunk  varint stream id, varint stream offset
//!   Padding      nothing
//!   Control      nothing (the payload is a control body, see squarepeg-session)
//!   Switch       varint frame format (docs/wire.md §3): every later byte of the
//!                direction is in that format
//! ```
//!
//! Varints are QUIC varints (RFC 9000 §16). Only the sub-stream id travels
//! with a message; its lifetime, dependency and priority stay with the sender
//! (Hollywood §4.2, §7.2).

use crate::{HeaderError, varint};

/// The frame format version this crate writes and reads.
pub const VERSION: u8 = 1;

/// The longest header: two bytes and two 8-byte varints.
pub const MAX_HEADER_LEN: usize = 18;

const FLAG_FIN: u8 = 0x01;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// A whole application message (a datagram).
    Message = 1,
    /// A chunk of an ordered, reliable byte stream.
    StreamChunk = 2,
    /// Filler the receiver discards: pads inconsistent retransmissions to
    /// the original length (Hollywood §4.2).
    Padding = 3,
    /// Connection control (flow control, stream open/reset, close).
    Control = 4,
    /// The sender's frame format changes after this frame (docs/wire.md §3).
    Switch = 5,
}

impl FrameKind {
    fn from_nibble(n: u8) -> Result<Self, HeaderError> {
        match n {
            1 => Ok(Self::Message),
            2 => Ok(Self::StreamChunk),
            3 => Ok(Self::Padding),
            4 => Ok(Self::Control),
            5 => Ok(Self::Switch),
            other => Err(HeaderError::UnknownKind(other)),
        }
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameHeader {
    /// Message number `number` of sub-stream `substream`. Numbers are
    /// assigned by the sender per connection, starting at 0.
    Message { substream: u64, number: u64 },
    /// Bytes of stream `stream` starting at byte `offset` of that stream;
    /// `fin` is set on the chunk holding the stream's last byte (or on an
    /// empty chunk at the final offset).
    StreamChunk { stream: u64, offset: u64, fin: bool },
    /// Padding; its payload is ignored.
    Padding,
    /// A control frame; its payload is a control body.
    Control,
    /// From the byte after this frame, the sender writes frames in `format`
    /// (a [`crate::FrameFormat`] id); its payload is empty.
    Switch { format: u64 },
}

impl FrameHeader {
    /// The kind of frame this header introduces.
    pub fn kind(&self) -> FrameKind {
        match self {
            Self::Message { .. } => FrameKind::Message,
            Self::StreamChunk { .. } => FrameKind::StreamChunk,
            Self::Padding => FrameKind::Padding,
            Self::Control => FrameKind::Control,
            Self::Switch { .. } => FrameKind::Switch,
        }
    }

    /// Number of bytes [`FrameHeader::encode`] writes.
    pub fn encoded_len(&self) -> Result<usize, HeaderError> {
        let vlen = |v: u64| varint::len(v).ok_or(HeaderError::VarintTooLarge(v));
        Ok(2 + match *self {
            Self::Message { substream, number } => vlen(substream)? + vlen(number)?,
            Self::StreamChunk { stream, offset, .. } => vlen(stream)? + vlen(offset)?,
            Self::Switch { format } => vlen(format)?,
            Self::Padding | Self::Control => 0,
        })
    }

    /// Appends the encoded header to `out`. On error `out` is unchanged.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), HeaderError> {
        let (bytes, n) = self.to_bytes()?;
        out.extend_from_slice(&bytes[..n]);
        Ok(())
    }

    /// The encoded header: the first `n` bytes of the array. Lets a frame be
    /// built without allocating for its header.
    #[inline]
    pub fn to_bytes(&self) -> Result<([u8; MAX_HEADER_LEN], usize), HeaderError> {
        let mut buf = [0u8; MAX_HEADER_LEN];
        buf[0] = (VERSION << 4) | self.kind() as u8;
        let (flags, fields) = match *self {
            Self::Message { substream, number } => (0, [Some(substream), Some(number)]),
            Self::StreamChunk {
                stream,
                offset,
                fin,
            } => (if fin { FLAG_FIN } else { 0 }, [Some(stream), Some(offset)]),
            Self::Switch { format } => (0, [Some(format), None]),
            Self::Padding | Self::Control => (0, [None, None]),
        };
        buf[1] = flags;
        let mut n = 2;
        for v in fields.into_iter().flatten() {
            let (bytes, len) = varint::to_bytes(v)?;
            // Copy all eight bytes (a fixed-size move, not a memcpy
            // call): the next field or the unused tail overwrites the
            // excess, and two fields never need more than the array.
            buf[n..n + 8].copy_from_slice(&bytes);
            n += len;
        }
        Ok((buf, n))
    }

    /// Parses a header from the front of `buf` (a decoded frame body);
    /// returns it and its length in bytes.
    #[inline]
    pub fn decode(buf: &[u8]) -> Result<(Self, usize), HeaderError> {
        let [first, flags, ..] = *buf else {
            return Err(HeaderError::Truncated);
        };
        let version = first >> 4;
        if version != VERSION {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        let kind = FrameKind::from_nibble(first & 0x0f)?;
        let allowed = if kind == FrameKind::StreamChunk {
            FLAG_FIN
        } else {
            0
        };
        if flags & !allowed != 0 {
            return Err(HeaderError::ReservedFlags(flags));
        }
        // The two varint fields of the kinds that have them.
        let fields = || -> Result<(u64, u64, usize), HeaderError> {
            let (a, n) = varint::decode(&buf[2..])?;
            let (b, m) = varint::decode(&buf[2 + n..])?;
            Ok((a, b, 2 + n + m))
        };
        Ok(match kind {
            FrameKind::Message => {
                let (substream, number, len) = fields()?;
                (Self::Message { substream, number }, len)
            }
            FrameKind::StreamChunk => {
                let (stream, offset, len) = fields()?;
                let fin = flags & FLAG_FIN != 0;
                (
                    Self::StreamChunk {
                        stream,
                        offset,
                        fin,
                    },
                    len,
                )
            }
            FrameKind::Padding => (Self::Padding, 2),
            FrameKind::Control => (Self::Control, 2),
            FrameKind::Switch => {
                let (format, n) = varint::decode(&buf[2..])?;
                (Self::Switch { format }, 2 + n)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(h: FrameHeader) -> Vec<u8> {
        let mut out = Vec::new();
        h.encode(&mut out).unwrap();
        assert_eq!(out.len(), h.encoded_len().unwrap());
        let mut with_tail = out.clone();
        with_tail.extend_from_slice(b"payload");
        assert_eq!(FrameHeader::decode(&with_tail).unwrap(), (h, out.len()));
        out
    }

    #[test]
    fn round_trips() {
        assert_eq!(
            round_trip(FrameHeader::Message {
                substream: 0,
                number: 0
            }),
            [0x11, 0, 0, 0]
        );
        assert_eq!(
            round_trip(FrameHeader::StreamChunk {
                stream: 3,
                offset: 1000,
                fin: true
            }),
            [0x12, 0x01, 0x03, 0x43, 0xe8]
        );
        assert_eq!(round_trip(FrameHeader::Padding), [0x13, 0]);
        assert_eq!(round_trip(FrameHeader::Control), [0x14, 0]);
        round_trip(FrameHeader::Message {
            substream: varint::MAX,
            number: varint::MAX,
        });
    }

    #[test]
    fn rejects_bad_headers() {
        use HeaderError::*;
        let cases: [(&[u8], HeaderError); 8] = [
            (&[], Truncated),
            (&[0x11], Truncated),
            (&[0x21, 0, 0, 0], UnsupportedVersion(2)),
            (&[0x16, 0], UnknownKind(6)),
            (&[0x15, 0], Truncated),
            (&[0x10, 0], UnknownKind(0)),
            (&[0x11, 0x01, 0, 0], ReservedFlags(1)),
            (&[0x12, 0x02, 0, 0], ReservedFlags(2)),
        ];
        for (bytes, err) in cases {
            assert_eq!(FrameHeader::decode(bytes).unwrap_err(), err, "{bytes:02x?}");
        }
        assert_eq!(
            FrameHeader::decode(&[0x11, 0, 0x40]).unwrap_err(),
            Truncated
        );
    }
}
