//! Whole uCOBS frames: `0x00 ‖ COBS(header ‖ payload ‖ CRC32C) ‖ 0x00`.
//!
//! The zero marker at both ends lets a receiver holding any fragment of the
//! stream find every frame that lies wholly inside it (Minion §5.3); the
//! CRC32C over header and payload rejects frames a middlebox assembled from
//! two different transmissions of the same sequence range (Hollywood §4.5).
//! The checksum is written big-endian.

use std::ops::Range;

use bytes::Bytes;

use crate::header::MAX_HEADER_LEN;
use crate::{CobsError, FrameError, FrameHeader, FrameKind, cobs};

/// Bytes of the CRC32C trailer.
pub const CRC_LEN: usize = 4;

/// The default limit on a decoded frame body (header, payload and CRC).
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// The smallest padding frame on the wire: two markers, one COBS code byte,
/// a 2-byte header and the CRC. Gaps shorter than this are padded with bare
/// zero bytes, which receivers skip as empty frames.
pub const MIN_PADDING_FRAME: usize = 2 + 1 + 2 + CRC_LEN;

/// A decoded frame. The payload is a [`Bytes`]: the in-order decoder
/// hands out slices of one shared buffer per read instead of allocating
/// a buffer per frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Bytes,
}

/// Padding frames are at most this long on the wire; a longer gap is padded
/// with several. This keeps every padding body (at most 1021 bytes) within
/// any sensible receiver's body limit, so padding is never reported as
/// oversize (see docs/wire.md §1.2).
pub const MAX_PADDING_FRAME: usize = 1024;

/// Appends `0x00 ‖ COBS(header ‖ payload ‖ crc) ‖ 0x00` to `out` and returns
/// the number of bytes appended. `out` is unchanged on error. Header,
/// payload and checksum are encoded in place as parts; nothing is copied
/// into a temporary body.
pub fn encode_frame(
    header: &FrameHeader,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<usize, FrameError> {
    let (head, head_len) = header.to_bytes()?;
    let head = &head[..head_len];
    check_stream_end(header, payload.len())?;
    let start = out.len();
    out.reserve(cobs::max_encoded_len(head_len + payload.len() + CRC_LEN) + 2);
    out.push(0);
    if payload.len() <= SMALL_PAYLOAD {
        // A small frame: gather the body on the stack, so that the
        // checksum and the encoder each make one call, not three.
        let mut body = [0u8; MAX_HEADER_LEN + SMALL_PAYLOAD + CRC_LEN];
        let crc_at = head_len + payload.len();
        body[..head_len].copy_from_slice(head);
        body[head_len..crc_at].copy_from_slice(payload);
        let crc = crate::crc::crc32c(&[&body[..crc_at]]).to_be_bytes();
        body[crc_at..crc_at + CRC_LEN].copy_from_slice(&crc);
        cobs::encode(&body[..crc_at + CRC_LEN], out);
    } else {
        let crc = crate::crc::crc32c(&[head, payload]).to_be_bytes();
        let mut enc = cobs::Encoder::new(out);
        enc.push(head);
        enc.push(payload);
        enc.push(&crc);
        enc.finish();
    }
    out.push(0);
    Ok(out.len() - start)
}

/// A stream chunk must end at an offset a varint can carry (docs/wire.md §1.1).
#[inline]
pub(crate) fn check_stream_end(header: &FrameHeader, payload_len: usize) -> Result<(), FrameError> {
    match *header {
        FrameHeader::StreamChunk { offset, .. }
            if offset
                .checked_add(payload_len as u64)
                .is_none_or(|end| end > crate::varint::MAX) =>
        {
            Err(FrameError::OffsetOverflow)
        }
        _ => Ok(()),
    }
}

/// Payloads up to this size are encoded from one contiguous copy of the
/// body (see [`encode_frame`]); larger ones in place, as parts.
const SMALL_PAYLOAD: usize = 128;

/// Decodes the bytes between two markers (no zero byte inside) into a frame,
/// checking the CRC. `max_body` bounds the decoded body.
pub fn decode_frame(encoded: &[u8], max_body: usize) -> Result<Frame, FrameError> {
    let mut payload = Vec::new();
    let header = decode_frame_into(encoded, max_body, &mut payload)?;
    Ok(Frame {
        header,
        payload: payload.into(),
    })
}

/// Like [`decode_frame`], but writes the payload into `payload` (cleared
/// first), so a caller can reuse one buffer for many frames. On error
/// `payload` holds unspecified bytes.
pub fn decode_frame_into(
    encoded: &[u8],
    max_body: usize,
    payload: &mut Vec<u8>,
) -> Result<FrameHeader, FrameError> {
    payload.clear();
    // The body is never longer than its encoding.
    if encoded.len() > cobs::max_encoded_len(max_body) {
        return Err(FrameError::Oversize {
            len: None,
            limit: max_body,
        });
    }
    if encoded.is_empty() {
        return Err(CobsError::Empty.into());
    }
    if memchr::memchr(0, encoded).is_some() {
        // Malformed input: let the reference-order checks name the error.
        let mut scratch = Vec::new();
        return Err(cobs::decode(encoded, &mut scratch)
            .err()
            .unwrap_or(CobsError::Empty)
            .into());
    }
    decode_zero_free(encoded, max_body, payload)
}

/// Decodes a run the decoders found between two markers (non-empty, no
/// zero byte): the same checks as [`decode_frame`].
pub(crate) fn decode_run(encoded: &[u8], max_body: usize) -> Result<Frame, FrameError> {
    debug_assert!(!encoded.is_empty());
    if encoded.len() > cobs::max_encoded_len(max_body) {
        return Err(FrameError::Oversize {
            len: None,
            limit: max_body,
        });
    }
    let mut payload = Vec::new();
    let header = decode_zero_free(encoded, max_body, &mut payload)?;
    Ok(Frame {
        header,
        payload: payload.into(),
    })
}

/// Decodes a run the decoders found between two markers (non-empty, no
/// zero byte) into the front of `out`, whole body at once, and checks it:
/// the same checks in the same order as [`decode_frame`]. Returns the
/// header and where the payload lies in `out`. `out` must hold the body
/// (`encoded.len()` bytes always suffice); [`cobs::WINDOW`] bytes of slack
/// beyond that let the decoder copy small blocks in fixed-size windows.
/// The checksum runs over the decoded body in one pass, while it is still
/// in cache.
pub(crate) fn decode_run_to_slice(
    encoded: &[u8],
    max_body: usize,
    out: &mut [u8],
) -> Result<(FrameHeader, Range<usize>), FrameError> {
    debug_assert!(!encoded.is_empty());
    if encoded.len() > cobs::max_encoded_len(max_body) {
        return Err(FrameError::Oversize {
            len: None,
            limit: max_body,
        });
    }
    let body_len = cobs::decode_run_into(encoded, out)?;
    if body_len > max_body {
        return Err(FrameError::Oversize {
            len: Some(body_len),
            limit: max_body,
        });
    }
    let body = &out[..body_len];
    let (header, head_len) = FrameHeader::decode(body)?;
    let Some(crc_at) = body_len.checked_sub(CRC_LEN).filter(|&at| at >= head_len) else {
        return Err(FrameError::TooShort);
    };
    let mut crc = [0u8; CRC_LEN];
    crc.copy_from_slice(&body[crc_at..]);
    let expected = u32::from_be_bytes(crc);
    let computed = crate::crc::crc32c(&[&body[..crc_at]]);
    if expected != computed {
        return Err(FrameError::ChecksumMismatch { expected, computed });
    }
    if let FrameHeader::StreamChunk { offset, .. } = header
        && offset
            .checked_add((crc_at - head_len) as u64)
            .is_none_or(|end| end > crate::varint::MAX)
    {
        return Err(FrameError::OffsetOverflow);
    }
    Ok((header, head_len..crc_at))
}

/// Decodes a frame whose encoding is known to be non-empty and zero-free
/// (the decoders found it between two markers). The checks run in the
/// order of the specification (docs/wire.md §1.1): COBS structure, body
/// limit, header, length, checksum, offset range.
pub(crate) fn decode_zero_free(
    encoded: &[u8],
    max_body: usize,
    payload: &mut Vec<u8>,
) -> Result<FrameHeader, FrameError> {
    payload.clear();
    // The header is read byte by byte off the front of the decoding, so
    // that the payload can be decoded straight into its own buffer.
    let mut reader = cobs::Reader::new(encoded);
    let mut head = [0u8; MAX_HEADER_LEN];
    let head_len = read_header(&mut reader, &mut head)?;
    let header = match FrameHeader::decode(&head[..head_len]) {
        Ok((header, n)) => {
            debug_assert_eq!(n, head_len);
            header
        }
        Err(e) => {
            // A malformed block or an oversize body later on takes
            // precedence over a bad header.
            let body_len = head_len + reader.rest_len()?;
            if body_len > max_body {
                return Err(FrameError::Oversize {
                    len: Some(body_len),
                    limit: max_body,
                });
            }
            return Err(e.into());
        }
    };
    reader.read_rest(payload)?;
    let body_len = head_len + payload.len();
    if body_len > max_body {
        return Err(FrameError::Oversize {
            len: Some(body_len),
            limit: max_body,
        });
    }
    let Some(crc_at) = payload.len().checked_sub(CRC_LEN) else {
        return Err(FrameError::TooShort);
    };
    let mut crc = [0u8; CRC_LEN];
    crc.copy_from_slice(&payload[crc_at..]);
    let expected = u32::from_be_bytes(crc);
    let computed = crate::crc::crc32c(&[&head[..head_len], &payload[..crc_at]]);
    if expected != computed {
        return Err(FrameError::ChecksumMismatch { expected, computed });
    }
    if let FrameHeader::StreamChunk { offset, .. } = header
        && offset
            .checked_add(crc_at as u64)
            .is_none_or(|end| end > crate::varint::MAX)
    {
        return Err(FrameError::OffsetOverflow);
    }
    payload.truncate(crc_at);
    Ok(header)
}

/// Reads the header bytes off the front of a body: two bytes, then, for
/// kinds with fields, their varints whose first bytes give their lengths.
/// Stops early at the end of the body, leaving [`FrameHeader::decode`] to
/// name the problem, as it does for versions and kinds it does not know.
fn read_header(
    reader: &mut cobs::Reader<'_>,
    head: &mut [u8; MAX_HEADER_LEN],
) -> Result<usize, CobsError> {
    let mut n = 0;
    let mut take =
        |reader: &mut cobs::Reader<'_>, n: &mut usize| -> Result<Option<u8>, CobsError> {
            let b = reader.next_byte()?;
            if let Some(b) = b {
                head[*n] = b;
                *n += 1;
            }
            Ok(b)
        };
    let Some(first) = take(reader, &mut n)? else {
        return Ok(n);
    };
    if take(reader, &mut n)?.is_none() {
        return Ok(n);
    }
    let kind = first & 0x0f;
    let fields = if first >> 4 != crate::VERSION {
        0
    } else if kind == FrameKind::Message as u8 || kind == FrameKind::StreamChunk as u8 {
        2
    } else if kind == FrameKind::Switch as u8 {
        1
    } else {
        0
    };
    for _field in 0..fields {
        let Some(b) = take(reader, &mut n)? else {
            return Ok(n);
        };
        // RFC 9000 §16: the top two bits give the varint's length.
        for _ in 1..1usize << (b >> 6) {
            if take(reader, &mut n)?.is_none() {
                return Ok(n);
            }
        }
    }
    Ok(n)
}

/// Appends exactly `wire_len` bytes of padding to `out`: padding frames
/// (each at most [`MAX_PADDING_FRAME`] bytes) while at least
/// [`MIN_PADDING_FRAME`] bytes remain, then zero bytes (empty frames).
/// Used to keep an inconsistent retransmission the length of the original
/// (Hollywood §4.2).
pub fn encode_padding(wire_len: usize, out: &mut Vec<u8>) {
    out.reserve(wire_len);
    let mut left = wire_len;
    while left >= MIN_PADDING_FRAME {
        // Split so that no remainder shorter than a padding frame is left
        // over: bare zeros only ever fill gaps shorter than one frame.
        let take = if left <= MAX_PADDING_FRAME {
            left
        } else if left - MAX_PADDING_FRAME < MIN_PADDING_FRAME {
            left - MIN_PADDING_FRAME
        } else {
            MAX_PADDING_FRAME
        };
        encode_padding_frame(take, out);
        left -= take;
    }
    out.resize(out.len() + left, 0);
}

/// One padding frame of exactly `wire_len` bytes
/// (`MIN_PADDING_FRAME..=MAX_PADDING_FRAME`), without allocating its body.
fn encode_padding_frame(wire_len: usize, out: &mut Vec<u8>) {
    // The payload is zeros, so the body has no 254-byte zero-free run (the
    // header and CRC are 6 bytes): its encoding is exactly body + 1 bytes,
    // and body = wire_len - 3.
    const ZEROS: [u8; MAX_PADDING_FRAME] = [0; MAX_PADDING_FRAME];
    let zeros = wire_len - MIN_PADDING_FRAME;
    let head = [(crate::VERSION << 4) | FrameKind::Padding as u8, 0];
    let crc = crate::crc::crc32c(&[&head, &ZEROS[..zeros]]).to_be_bytes();
    let start = out.len();
    out.push(0);
    let mut enc = cobs::Encoder::new(out);
    enc.push(&head);
    enc.push_zeros(zeros);
    enc.push(&crc);
    enc.finish();
    out.push(0);
    debug_assert_eq!(out.len() - start, wire_len);
}

/// The original straightforward frame decoder (decode the whole body, then
/// parse it), kept as the oracle for tests and differential fuzzing.
#[cfg(any(test, feature = "reference"))]
pub mod reference {
    use super::{CRC_LEN, Frame};
    use crate::{FrameError, FrameHeader, cobs};

    /// Decodes the bytes between two markers into a frame.
    pub fn decode_frame(encoded: &[u8], max_body: usize) -> Result<Frame, FrameError> {
        if encoded.len() > cobs::max_encoded_len(max_body) {
            return Err(FrameError::Oversize {
                len: None,
                limit: max_body,
            });
        }
        let mut body = Vec::with_capacity(encoded.len());
        cobs::reference::decode(encoded, &mut body)?;
        if body.len() > max_body {
            return Err(FrameError::Oversize {
                len: Some(body.len()),
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
        let computed = crate::crc::crc32c(&[&body[..crc_at]]);
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
            payload: body.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeaderError;
    use proptest::prelude::*;

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
                payload: Bytes::copy_from_slice(payload)
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

    fn any_header() -> impl Strategy<Value = FrameHeader> {
        let v = prop_oneof![0u64..64, 0u64..20_000, 0u64..=crate::varint::MAX];
        prop_oneof![
            (v.clone(), v.clone())
                .prop_map(|(substream, number)| FrameHeader::Message { substream, number }),
            (v.clone(), 0u64..1 << 40, any::<bool>()).prop_map(|(stream, offset, fin)| {
                FrameHeader::StreamChunk {
                    stream,
                    offset,
                    fin,
                }
            }),
            Just(FrameHeader::Padding),
            Just(FrameHeader::Control),
        ]
    }

    fn any_payload() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..700),
            proptest::collection::vec(1u8..=255, 250..600),
            proptest::collection::vec(prop_oneof![Just(0u8), 1u8..4], 0..300),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Any frame round-trips, and its encoding is what the reference
        /// codec produces for the concatenated body.
        #[test]
        fn frames_round_trip(header in any_header(), payload in any_payload()) {
            let mut wire = vec![0xaa];
            let n = encode_frame(&header, &payload, &mut wire).unwrap();
            prop_assert_eq!(n, wire.len() - 1);
            let inner = &wire[2..wire.len() - 1];
            prop_assert_eq!((wire[1], wire[wire.len() - 1]), (0, 0));
            let mut body = Vec::new();
            header.encode(&mut body).unwrap();
            body.extend_from_slice(&payload);
            let crc = crc32c::crc32c(&body).to_be_bytes();
            body.extend_from_slice(&crc);
            let mut expected = Vec::new();
            cobs::reference::encode(&body, &mut expected);
            prop_assert_eq!(inner, &expected[..]);
            let frame = decode_frame(inner, DEFAULT_MAX_BODY).unwrap();
            prop_assert_eq!(&frame, &Frame { header, payload: payload.clone().into() });
            let mut reused = vec![1, 2, 3];
            prop_assert_eq!(decode_frame_into(inner, DEFAULT_MAX_BODY, &mut reused), Ok(header));
            prop_assert_eq!(reused, payload);
        }

        /// On any input (valid frames with random damage, or noise), the
        /// fast decoder returns exactly what the reference decoder does,
        /// error variant included.
        #[test]
        fn decode_matches_reference(
            header in any_header(),
            payload in any_payload(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..4),
            cut in any::<proptest::sample::Index>(),
            truncate in any::<bool>(),
            max_body in prop_oneof![Just(DEFAULT_MAX_BODY), 0usize..40, 100usize..800],
            noise in proptest::collection::vec(any::<u8>(), 0..40),
            use_noise in proptest::bool::weighted(0.2),
        ) {
            let mut enc = if use_noise {
                noise
            } else {
                let mut wire = Vec::new();
                encode_frame(&header, &payload, &mut wire).unwrap();
                wire[1..wire.len() - 1].to_vec()
            };
            for (at, x) in flips {
                if !enc.is_empty() {
                    let i = at.index(enc.len());
                    enc[i] ^= x;
                }
            }
            if truncate && !enc.is_empty() {
                enc.truncate(cut.index(enc.len()));
            }
            let expected = reference::decode_frame(&enc, max_body);
            prop_assert_eq!(decode_frame(&enc, max_body), expected.clone());
            // The whole-body decoder the stream decoder uses, on runs
            // between markers (non-empty, zero-free).
            if !enc.is_empty() && !enc.contains(&0) {
                let mut out = vec![0xee; enc.len() + cobs::WINDOW];
                let got = decode_run_to_slice(&enc, max_body, &mut out).map(|(header, range)| Frame {
                    header,
                    payload: Bytes::copy_from_slice(&out[range]),
                });
                prop_assert_eq!(got, expected);
            }
        }
    }

    #[test]
    fn padding_frames_are_bounded_and_valid() {
        for len in [
            0, 8, 9, 10, 1023, 1024, 1025, 1032, 1033, 1034, 5000, 70_000,
        ] {
            let mut out = Vec::new();
            encode_padding(len, &mut out);
            assert_eq!(out.len(), len);
            let mut d = crate::StreamDecoder::new(MAX_PADDING_FRAME);
            d.push(&out);
            let mut frames = 0;
            while let Some(f) = d.next_frame() {
                let f = f.unwrap();
                assert_eq!(f.header, FrameHeader::Padding);
                assert!(f.payload.iter().all(|&b| b == 0));
                frames += 1;
            }
            let expected = if len < MIN_PADDING_FRAME {
                0
            } else {
                len.div_ceil(MAX_PADDING_FRAME)
            };
            assert_eq!(frames, expected, "len {len}");
        }
    }
}
