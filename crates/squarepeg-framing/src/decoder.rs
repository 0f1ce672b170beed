//! In-order decoding: the receive side over a plain TCP byte stream, where
//! bytes arrive in sequence from stream offset 0.

use crate::frame::{self, Frame};
use crate::{FrameError, cobs};

/// Splits an in-order byte stream into frames.
///
/// The stream must begin with a marker. Runs of zero bytes are empty frames
/// and are skipped. Buffered bytes never exceed the encoding of one
/// `max_body` frame plus what a single [`StreamDecoder::push`] adds.
#[derive(Debug)]
pub struct StreamDecoder {
    buf: Vec<u8>,
    /// Start of the unscanned part of `buf`.
    pos: usize,
    /// Whether the first marker of the stream has been seen.
    synced: bool,
    max_body: usize,
}

impl StreamDecoder {
    /// A decoder that rejects frames whose body exceeds `max_body` bytes.
    pub fn new(max_body: usize) -> Self {
        Self {
            buf: Vec::new(),
            pos: 0,
            synced: false,
            max_body,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Returns the next complete frame, `None` if more bytes are needed, or
    /// an error for bytes that cannot be a frame. After an error the decoder
    /// has skipped the offending bytes, but a caller on a reliable stream
    /// should treat it as a protocol violation by the peer.
    pub fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        loop {
            let rest = &self.buf[self.pos..];
            if !self.synced {
                let z = memchr::memchr(0, rest);
                let Some(z) = z else {
                    if rest.is_empty() {
                        return None;
                    }
                    self.pos = self.buf.len();
                    return Some(Err(FrameError::GarbageBeforeMarker));
                };
                self.synced = true;
                self.pos += z + 1;
                if z > 0 {
                    return Some(Err(FrameError::GarbageBeforeMarker));
                }
                continue;
            }
            let limit = cobs::max_encoded_len(self.max_body);
            match memchr::memchr(0, rest) {
                Some(0) => self.pos += 1,
                Some(end) => {
                    let result = frame::decode_frame(&rest[..end], self.max_body);
                    self.pos += end + 1;
                    self.compact();
                    return Some(result);
                }
                None if rest.len() > limit => {
                    // Skip the oversize run; resynchronise at the next marker.
                    self.synced = false;
                    self.pos = self.buf.len();
                    return Some(Err(FrameError::Oversize {
                        len: rest.len(),
                        limit: self.max_body,
                    }));
                }
                None => {
                    self.compact();
                    return None;
                }
            }
        }
    }

    /// Bytes held waiting for the end of a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn compact(&mut self) {
        if self.pos > 4096 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FrameHeader, encode_frame};

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
    }

    #[test]
    fn garbage_and_oversize() {
        let mut d = StreamDecoder::new(16);
        d.push(b"xx\0");
        assert_eq!(d.next_frame(), Some(Err(FrameError::GarbageBeforeMarker)));
        d.push(&[7u8; 40]);
        assert!(matches!(
            d.next_frame(),
            Some(Err(FrameError::Oversize { .. }))
        ));
        let mut wire = Vec::new();
        encode_frame(&FrameHeader::Padding, b"", &mut wire).unwrap();
        d.push(&wire);
        assert!(matches!(
            d.next_frame(),
            Some(Err(FrameError::GarbageBeforeMarker)) | Some(Ok(_))
        ));
    }
}
