//! Whole uCOBS frames: `0x00 ‖ COBS(header ‖ payload ‖ CRC32C) ‖ 0x00`.
//!
//! The zero marker at both ends lets a receiver holding any fragment of the
//! stream find every frame that lies wholly inside it (Minion §5.3); the
//! CRC32C over header and payload rejects frames a middlebox assembled from
//! two different transmissions of the same sequence range (Hollywood §4.5).
//! The checksum is written big-endian.

use crate::{FrameError, FrameHeader, cobs};

/// Bytes of the CRC32C trailer.
pub const CRC_LEN: usize = 4;

/// The default limit on a decoded frame body (header, payload and CRC).
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// The smallest padding frame on the wire: two markers, one COBS code byte,
/// a 2-byte header and the CRC. Gaps shorter than this are padded with bare
/// zero bytes, which receivers skip as empty frames.
pub const MIN_PADDING_FRAME: usize = 2 + 1 + 2 + CRC_LEN;

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Vec<u8>,
}

/// Appends `0x00 ‖ COBS(header ‖ payload ‖ crc) ‖ 0x00` to `out` and returns
/// the number of bytes appended. `out` is unchanged on error.
pub fn encode_frame(
    header: &FrameHeader,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<usize, FrameError> {
    let mut head = Vec::with_capacity(20);
    header.encode(&mut head)?;
    if let FrameHeader::StreamChunk { offset, .. } = *header
        && offset
            .checked_add(payload.len() as u64)
            .is_none_or(|end| end > crate::varint::MAX)
    {
        return Err(FrameError::OffsetOverflow);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head), payload).to_be_bytes();
    let start = out.len();
    out.push(0);
    cobs::encode_parts(&[&head, payload, &crc], out);
    out.push(0);
    Ok(out.len() - start)
}

/// Decodes the bytes between two markers (no zero byte inside) into a frame,
/// checking the CRC. `max_body` bounds the decoded body.
pub fn decode_frame(encoded: &[u8], max_body: usize) -> Result<Frame, FrameError> {
    // The body is never longer than its encoding.
    if encoded.len() > cobs::max_encoded_len(max_body) {
        return Err(FrameError::Oversize {
            len: encoded.len(),
            limit: max_body,
        });
    }
    let mut body = Vec::with_capacity(encoded.len());
    cobs::decode(encoded, &mut body)?;
    if body.len() > max_body {
        return Err(FrameError::Oversize {
            len: body.len(),
            limit: max_body,
        });
    }
    let (header, header_len) = FrameHeader::decode(&body)?;
    if body.len() < header_len + CRC_LEN {
        return Err(FrameError::TooShort);
    }
    let crc_at = body.len() - CRC_LEN;
    let mut crc = [0u8; CRC_LEN];
    crc.copy_from_slice(&body[crc_at..]);
    let expected = u32::from_be_bytes(crc);
    let computed = crc32c::crc32c(&body[..crc_at]);
    if expected != computed {
        return Err(FrameError::ChecksumMismatch { expected, computed });
    }
    if let FrameHeader::StreamChunk { offset, .. } = header
        && offset
            .checked_add((crc_at - header_len) as u64)
            .is_none_or(|end| end > crate::varint::MAX)
    {
        return Err(FrameError::OffsetOverflow);
    }
    body.truncate(crc_at);
    body.drain(..header_len);
    Ok(Frame {
        header,
        payload: body,
    })
}

/// Appends exactly `wire_len` bytes of padding to `out`: a padding frame if
/// `wire_len >= MIN_PADDING_FRAME`, otherwise zero bytes (empty frames).
/// Used to keep an inconsistent retransmission the length of the original
/// (Hollywood §4.2).
pub fn encode_padding(wire_len: usize, out: &mut Vec<u8>) {
    if wire_len < MIN_PADDING_FRAME {
        out.resize(out.len() + wire_len, 0);
        return;
    }
    // A body of zeros has no 254-byte zero-free run in its payload; only the
    // header and CRC could form one, and they are 6 bytes. So the encoding is
    // exactly body + 1 bytes, and body = wire_len - 3.
    let payload = vec![0u8; wire_len - MIN_PADDING_FRAME];
    let start = out.len();
    // Padding headers never fail to encode and padding has no offset.
    let _ = encode_frame(&FrameHeader::Padding, &payload, out);
    debug_assert_eq!(out.len() - start, wire_len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeaderError;

    #[test]
    fn round_trip_and_markers() {
        let h = FrameHeader::Message {
            substream: 7,
            number: 42,
        };
        let payload = b"hello\0world";
        let mut wire = Vec::new();
        let n = encode_frame(&h, payload, &mut wire).unwrap();
        assert_eq!(n, wire.len());
        assert_eq!((wire[0], wire[n - 1]), (0, 0));
        assert!(!wire[1..n - 1].contains(&0));
        let f = decode_frame(&wire[1..n - 1], DEFAULT_MAX_BODY).unwrap();
        assert_eq!(
            f,
            Frame {
                header: h,
                payload: payload.to_vec()
            }
        );
    }

    #[test]
    fn corruption_is_caught() {
        let mut wire = Vec::new();
        encode_frame(
            &FrameHeader::Message {
                substream: 1,
                number: 2,
            },
            b"abcdef",
            &mut wire,
        )
        .unwrap();
        let inner = &mut wire[1..];
        inner[5] ^= 0x40;
        let n = inner.len() - 1;
        assert!(matches!(
            decode_frame(&inner[..n], DEFAULT_MAX_BODY),
            Err(FrameError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn limits_and_short_bodies() {
        let mut wire = Vec::new();
        encode_frame(&FrameHeader::Control, &[1u8; 100], &mut wire).unwrap();
        let inner = &wire[1..wire.len() - 1];
        assert!(matches!(
            decode_frame(inner, 50),
            Err(FrameError::Oversize { .. })
        ));
        // A body of only a header: no room for the CRC.
        let mut enc = Vec::new();
        cobs::encode(&[0x13, 0x00], &mut enc);
        assert_eq!(decode_frame(&enc, 100), Err(FrameError::TooShort));
        let mut enc = Vec::new();
        cobs::encode(&[0x23, 0x00, 1, 2, 3, 4], &mut enc);
        assert_eq!(
            decode_frame(&enc, 100),
            Err(FrameError::Header(HeaderError::UnsupportedVersion(2)))
        );
        let mut out = Vec::new();
        let h = FrameHeader::StreamChunk {
            stream: 0,
            offset: crate::varint::MAX,
            fin: false,
        };
        assert_eq!(
            encode_frame(&h, b"x", &mut out),
            Err(FrameError::OffsetOverflow)
        );
        assert!(out.is_empty());
    }

    #[test]
    fn padding_is_exact() {
        for len in 0..2000 {
            let mut out = vec![0xaa];
            encode_padding(len, &mut out);
            assert_eq!(out.len(), len + 1, "len {len}");
        }
    }
}
