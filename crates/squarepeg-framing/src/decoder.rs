//! In-order decoding: the receive side over a plain TCP byte stream, where
//! bytes arrive in sequence from stream offset 0 (Minion §5.2, "Reception"
//! without uTCP).

use crate::frame::Frame;
use crate::reassembler::Reassembler;
use crate::{FrameError, cobs};

/// Splits an in-order byte stream into frames.
///
/// The stream must begin with a marker. Runs of zero bytes are empty frames
/// and are skipped. This is the [`Reassembler`] fed at consecutive offsets,
/// so both share one scanner: frames wholly inside a pushed slice are
/// decoded straight from it, and only a partial frame at its end is kept
/// (never more than the encoding of one `max_body` frame). Frames are
/// decoded when pushed and wait in a queue for [`StreamDecoder::next_frame`].
#[derive(Debug)]
pub struct StreamDecoder {
    inner: Reassembler,
    /// Stream offset of the next pushed byte.
    offset: u64,
}

impl StreamDecoder {
    /// A decoder that rejects frames whose body exceeds `max_body` bytes.
    pub fn new(max_body: usize) -> Self {
        // In-order data never needs more than one partial frame, which any
        // limit of at least one maximal frame holds.
        let limit = cobs::max_encoded_len(max_body).saturating_add(2);
        Self {
            inner: Reassembler::with_limit(max_body, limit),
            offset: 0,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        // In-order bytes are always accepted: they extend the in-order point
        // and overlap nothing. Only a stream longer than 2^64 bytes could
        // fail, and its excess is dropped.
        if self.inner.insert(self.offset, data).is_ok() {
            self.offset += data.len() as u64;
        }
    }

    /// Returns the next complete frame, `None` if more bytes are needed, or
    /// an error for bytes that cannot be a frame. After an error the decoder
    /// has skipped the offending bytes, but a caller on a reliable stream
    /// should treat it as a protocol violation by the peer.
    pub fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        Some(match self.inner.next_frame()? {
            Ok(found) => Ok(found.frame),
            Err(rejected) => Err(rejected.error),
        })
    }

    /// Bytes held waiting for the end of a frame.
    pub fn buffered(&self) -> usize {
        self.inner.partial_frame_len()
    }

    /// Stream offset of the next byte to push (the bytes pushed so far).
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FrameHeader, encode_frame, encode_padding};

    #[test]
    fn byte_by_byte() {
        let mut wire = Vec::new();
        let frames: Vec<Frame> = (0..20u64)
            .map(|i| Frame {
                header: FrameHeader::Message {
                    substream: i % 3,
                    number: i,
                },
                payload: vec![i as u8; i as usize * 37],
            })
            .collect();
        for f in &frames {
            encode_frame(&f.header, &f.payload, &mut wire).unwrap();
        }
        let mut d = StreamDecoder::new(1 << 16);
        let mut got = Vec::new();
        for b in &wire {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame() {
                got.push(f.unwrap());
            }
        }
        assert_eq!(got, frames);
        assert_eq!(d.buffered(), 0);
        assert_eq!(d.offset(), wire.len() as u64);
    }

    #[test]
    fn garbage_and_oversize() {
        let mut d = StreamDecoder::new(16);
        d.push(b"xx\0");
        assert_eq!(d.next_frame(), Some(Err(FrameError::GarbageBeforeMarker)));
        assert_eq!(d.next_frame(), None);
        d.push(&[7u8; 40]);
        assert!(matches!(
            d.next_frame(),
            Some(Err(FrameError::Oversize { .. }))
        ));
        // The rest of the oversize frame is skipped silently, and nothing
        // of it is held.
        d.push(&[7u8; 4000]);
        assert_eq!(d.next_frame(), None);
        assert_eq!(d.buffered(), 0);
        let mut wire = Vec::new();
        encode_padding(12, &mut wire);
        d.push(&wire);
        assert!(matches!(
            d.next_frame(),
            Some(Ok(Frame {
                header: FrameHeader::Padding,
                ..
            }))
        ));
        assert_eq!(d.next_frame(), None);
    }

    #[test]
    fn bad_frames_do_not_block_later_ones() {
        let mut wire = Vec::new();
        encode_frame(&FrameHeader::Control, b"one", &mut wire).unwrap();
        let bad_at = wire.len() + 4; // the payload's first byte
        encode_frame(&FrameHeader::Control, b"two", &mut wire).unwrap();
        encode_frame(&FrameHeader::Control, b"three", &mut wire).unwrap();
        wire[bad_at] ^= 0x20;
        let mut d = StreamDecoder::new(100);
        d.push(&wire);
        assert_eq!(d.next_frame().unwrap().unwrap().payload, b"one");
        assert!(matches!(
            d.next_frame(),
            Some(Err(FrameError::ChecksumMismatch { .. }))
        ));
        assert_eq!(d.next_frame().unwrap().unwrap().payload, b"three");
        assert_eq!(d.next_frame(), None);
    }
}
