//! The in-order receive side with the format switch (docs/wire.md §3): uCOBS from the start
//! of the stream, plain frames after a Switch frame, if this side announced it reads them.

use crate::decoder::{DEFAULT_PINNED_LIMIT, DEFAULT_READ_SIZE, Fill};
use crate::plain::PlainDecoder;
use crate::{Frame, FrameError, FrameFormat, StreamDecoder};

/// Splits an in-order byte stream into frames, following the sender's format switch.
///
/// Every stream starts in uCOBS ([`StreamDecoder`]). With [`FrameReader::accept_plain`] on,
/// a Switch frame to plain frames ends the uCOBS part at its closing marker; the reader hands
/// out the frames before it and the Switch frame itself (the session checks that the switch
/// was allowed), and reads every later byte as plain frames. Off, a Switch frame is only a
/// frame, which the session rejects. The API is [`StreamDecoder`]'s: read into
/// [`FrameReader::unfilled`], call [`FrameReader::filled`], drain
/// [`FrameReader::next_frame`].
#[derive(Debug)]
pub struct FrameReader {
    ucobs: StreamDecoder,
    /// Present once the peer switched to plain frames.
    plain: Option<PlainDecoder>,
    max_body: usize,
    read_size: usize,
    pinned_limit: usize,
    offset: u64,
}

impl FrameReader {
    /// A reader that rejects frames whose body exceeds `max_body` bytes, with the default read
    /// size and pinning limit.
    pub fn new(max_body: usize) -> Self {
        Self::with_buffers(max_body, DEFAULT_READ_SIZE, DEFAULT_PINNED_LIMIT)
    }

    /// A reader offering `read_size` bytes per read and keeping at most about `pinned_limit`
    /// bytes of chunks alive through payloads (as [`StreamDecoder::with_buffers`]).
    pub fn with_buffers(max_body: usize, read_size: usize, pinned_limit: usize) -> Self {
        Self {
            ucobs: StreamDecoder::with_buffers(max_body, read_size, pinned_limit),
            plain: None,
            max_body,
            read_size: read_size.max(1024),
            pinned_limit,
            offset: 0,
        }
    }

    /// Whether a Switch to plain frames is followed (this side announced it reads them).
    pub fn accept_plain(&mut self, on: bool) {
        self.ucobs.stop_at_switch(on);
    }

    /// Reads the whole stream as plain frames, from its first byte: for a stream whose
    /// framing was fixed before it began (frames inside TLS records, docs/wire.md §4).
    /// Call before any byte is received; later calls change nothing.
    pub fn start_plain(&mut self) {
        if self.offset == 0 && self.plain.is_none() && self.ucobs.buffered() == 0 {
            self.plain = Some(PlainDecoder::new(
                self.max_body,
                self.read_size,
                self.ucobs.pool(),
                self.pinned_limit,
            ));
        }
    }

    /// The format the next bytes are read in.
    pub fn format(&self) -> FrameFormat {
        if self.plain.is_some() {
            FrameFormat::Plain
        } else {
            FrameFormat::Ucobs
        }
    }

    /// Room to read into: at least the read size.
    pub fn unfilled(&mut self) -> &mut [u8] {
        match self.plain.as_mut() {
            Some(p) => p.unfilled(),
            None => self.ucobs.unfilled(),
        }
    }

    /// Takes `n` bytes written at the front of [`FrameReader::unfilled`] as the stream's next
    /// bytes, and decodes the frames they complete.
    pub fn filled(&mut self, n: usize) {
        let before = self.ucobs.offset();
        match self.plain.as_mut() {
            Some(p) => {
                self.offset += n as u64;
                p.filled(n);
            }
            None => {
                self.ucobs.filled(n);
                self.offset += self.ucobs.offset() - before;
                self.follow_switch();
            }
        }
    }

    /// Appends received bytes (a copy; see [`FrameReader::unfilled`] to read into the reader
    /// directly).
    pub fn push(&mut self, data: &[u8]) {
        Fill::push_bytes(self, data);
    }

    /// The next complete frame (or an error for bytes that cannot be one), in stream order.
    pub fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        // The uCOBS frames before the switch come first.
        if let Some(f) = self.ucobs.next_frame() {
            return Some(f);
        }
        self.plain.as_mut()?.next_frame()
    }

    /// [`FrameReader::next_frame`], with consecutive plain MESSAGE frames as one
    /// [`crate::MessageRun`] (uCOBS frames one by one).
    pub fn next_decoded(&mut self) -> Option<crate::Decoded> {
        if let Some(f) = self.ucobs.next_frame() {
            return Some(crate::Decoded::Frame(f));
        }
        self.plain.as_mut()?.next_decoded()
    }

    /// Frames (and errors) decoded and waiting for [`FrameReader::next_frame`].
    pub fn ready_len(&self) -> usize {
        self.ucobs.ready_len() + self.plain.as_ref().map_or(0, PlainDecoder::ready_len)
    }

    /// Bytes held waiting for the end of a frame.
    pub fn buffered(&self) -> usize {
        match &self.plain {
            Some(p) => p.buffered(),
            None => self.ucobs.buffered(),
        }
    }

    /// Stream offset of the next byte (the bytes received so far).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of chunks kept alive by payloads the caller still holds (the pool is shared by
    /// both formats).
    pub fn pinned_bytes(&self) -> usize {
        self.ucobs.pinned_bytes()
    }

    /// Bytes of memory the reader holds for its next reads (see
    /// [`StreamDecoder::buffer_capacity`]; both formats share the pool).
    pub fn buffer_capacity(&self) -> usize {
        self.ucobs.buffer_capacity() + self.plain.as_ref().map_or(0, PlainDecoder::buffer_capacity)
    }

    /// Gives back the memory an idle connection need not hold (see
    /// [`StreamDecoder::release_idle`]): nothing received is lost, the next read allocates.
    pub fn release_idle(&mut self) {
        self.ucobs.release_idle();
        if let Some(p) = &mut self.plain {
            p.release_idle();
        }
    }

    /// After the uCOBS decoder stopped at a Switch frame: reads the rest in plain frames.
    fn follow_switch(&mut self) {
        if !self.ucobs.is_stopped() {
            return;
        }
        let rest = self.ucobs.take_rest();
        // The chunk pool is shared, so the pinning limit covers both formats.
        let mut plain = PlainDecoder::new(
            self.max_body,
            self.read_size,
            self.ucobs.pool(),
            self.pinned_limit,
        );
        plain.push_bytes(&rest);
        self.plain = Some(plain);
        // Its buffers are not read into again.
        self.ucobs.release_idle();
    }
}

impl Fill for FrameReader {
    fn room(&mut self) -> &mut [u8] {
        self.unfilled()
    }
    fn take(&mut self, n: usize) {
        self.filled(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FrameHeader, encode_frame, encode_plain_frame};
    use proptest::prelude::*;

    fn frame(i: u64, len: usize) -> Frame {
        let header = match i % 3 {
            0 => FrameHeader::Message {
                substream: i % 5,
                number: i,
            },
            1 => FrameHeader::StreamChunk {
                stream: 4,
                offset: i * 1000,
                fin: false,
            },
            _ => FrameHeader::Control,
        };
        Frame {
            header,
            payload: (0..len)
                .map(|k| (k as u8).wrapping_mul(i as u8 | 1))
                .collect(),
        }
    }

    /// `before` frames in uCOBS, a Switch to plain, then `after` frames plain.
    fn stream(before: &[Frame], after: &[Frame]) -> Vec<u8> {
        let mut wire = Vec::new();
        for f in before {
            encode_frame(&f.header, &f.payload, &mut wire).unwrap();
        }
        let switch = FrameHeader::Switch {
            format: FrameFormat::Plain.id(),
        };
        encode_frame(&switch, &[], &mut wire).unwrap();
        for f in after {
            encode_plain_frame(&f.header, &f.payload, &mut wire).unwrap();
        }
        wire
    }

    proptest! {
        /// Whatever the cut of the stream and whatever the buffer sizes (which choose between
        /// shared chunks and copies), the reader yields the frames sent, the Switch in its
        /// place, and holds at most one partial frame — also when it gives its idle memory
        /// back between any two pieces; once the frames are dropped, it holds none.
        #[test]
        fn follows_the_switch_at_any_cut(
            before in proptest::collection::vec(0usize..700, 0..6),
            after in proptest::collection::vec(0usize..3000, 0..40),
            cut in 1usize..5000,
            read_size in prop_oneof![Just(1024usize), Just(64 * 1024)],
            pinned in prop_oneof![Just(0usize), Just(1usize << 20)],
            hold in any::<bool>(),
            release_every in 0usize..4,
        ) {
            let before: Vec<Frame> = before.iter().enumerate().map(|(i, &l)| frame(i as u64, l)).collect();
            let after: Vec<Frame> = after.iter().enumerate().map(|(i, &l)| frame(100 + i as u64, l)).collect();
            let wire = stream(&before, &after);
            let mut expected = before.clone();
            expected.push(Frame { header: FrameHeader::Switch { format: 1 }, payload: Bytes::new() });
            expected.extend(after.iter().cloned());
            let mut r = FrameReader::with_buffers(1 << 16, read_size, pinned);
            r.accept_plain(true);
            let mut got = Vec::new();
            for (i, piece) in wire.chunks(cut).enumerate() {
                if release_every > 0 && i % release_every == 0 {
                    r.release_idle();
                }
                r.push(piece);
                while let Some(f) = r.next_frame() {
                    got.push(f.unwrap());
                }
                prop_assert!(r.buffered() <= crate::cobs::max_encoded_len(1 << 16) + 8);
                if !hold {
                    got.clear();
                }
            }
            prop_assert_eq!(r.offset(), wire.len() as u64);
            if hold {
                prop_assert_eq!(&got, &expected);
            }
            prop_assert_eq!(r.format(), FrameFormat::Plain);
            // The payloads' chunks come back to the pool as they are dropped; an idle reader
            // then gives everything back (the stream ended on a frame's end).
            drop(got);
            r.release_idle();
            prop_assert_eq!(r.buffer_capacity(), 0);
        }
    }

    /// An idle reader keeps the bytes of a frame in progress: up to `IDLE_KEEP` of them in a
    /// buffer of their own size, more where they are; the frame completes as if nothing had
    /// happened.
    #[test]
    fn release_idle_keeps_a_frame_in_progress() {
        for plain in [false, true] {
            for len in [100usize, 3000, 20_000] {
                let f = frame(3, len);
                let mut wire = Vec::new();
                if plain {
                    encode_plain_frame(&f.header, &f.payload, &mut wire).unwrap();
                } else {
                    encode_frame(&f.header, &f.payload, &mut wire).unwrap();
                }
                let mut r = FrameReader::new(1 << 16);
                if plain {
                    r.start_plain();
                }
                let half = wire.len() / 2;
                r.push(&wire[..half]);
                assert!(r.buffer_capacity() >= 64 * 1024, "a whole read's buffer");
                r.release_idle();
                if half <= crate::decoder::IDLE_KEEP {
                    assert_eq!(r.buffer_capacity(), half, "plain {plain}, {len} B");
                } else {
                    assert!(r.buffer_capacity() >= half, "plain {plain}, {len} B");
                }
                r.push(&wire[half..]);
                assert_eq!(r.next_frame(), Some(Ok(f)));
                assert_eq!(r.next_frame(), None);
            }
        }
    }

    use bytes::Bytes;

    #[test]
    fn start_plain_reads_plain_frames_from_the_first_byte() {
        let frames: Vec<Frame> = (0..20).map(|i| frame(i, (i as usize * 37) % 300)).collect();
        let mut wire = Vec::new();
        for f in &frames {
            encode_plain_frame(&f.header, &f.payload, &mut wire).unwrap();
        }
        let mut r = FrameReader::new(4096);
        r.start_plain();
        assert_eq!(r.format(), FrameFormat::Plain);
        for piece in wire.chunks(7) {
            r.push(piece);
        }
        let got: Vec<Frame> = std::iter::from_fn(|| r.next_frame())
            .map(|f| f.unwrap())
            .collect();
        assert_eq!(got, frames);
        assert_eq!(r.offset(), wire.len() as u64);
        // Too late once bytes arrived: the format stays what it was.
        let mut late = FrameReader::new(4096);
        late.push(&[0]);
        late.start_plain();
        assert_eq!(late.format(), FrameFormat::Ucobs);
    }

    #[test]
    fn without_accept_plain_a_switch_is_just_a_frame() {
        let wire = stream(&[frame(0, 10)], &[]);
        let mut r = FrameReader::new(1 << 16);
        r.push(&wire);
        assert_eq!(r.next_frame(), Some(Ok(frame(0, 10))));
        assert!(matches!(
            r.next_frame(),
            Some(Ok(Frame {
                header: FrameHeader::Switch { format: 1 },
                ..
            }))
        ));
        assert_eq!(r.format(), FrameFormat::Ucobs);
    }

    #[test]
    fn a_switch_to_an_unknown_format_is_left_to_the_session() {
        let mut wire = Vec::new();
        encode_frame(&FrameHeader::Switch { format: 9 }, &[], &mut wire).unwrap();
        let mut r = FrameReader::new(1 << 16);
        r.accept_plain(true);
        r.push(&wire);
        assert!(matches!(
            r.next_frame(),
            Some(Ok(Frame {
                header: FrameHeader::Switch { format: 9 },
                ..
            }))
        ));
        assert_eq!(r.format(), FrameFormat::Ucobs);
    }

    #[test]
    fn an_oversize_plain_frame_ends_the_stream() {
        let mut wire = stream(&[], &[frame(1, 10)]);
        crate::varint::encode(1 << 20, &mut wire).unwrap();
        wire.extend_from_slice(&[0x11; 64]);
        let mut r = FrameReader::new(1000);
        r.accept_plain(true);
        r.push(&wire);
        let got: Vec<_> = std::iter::from_fn(|| r.next_frame()).collect();
        assert_eq!(got.len(), 3);
        // A plain frame declares its length: the error gives it.
        let e = got[2].clone().unwrap_err();
        assert_eq!(
            e,
            FrameError::Oversize {
                len: Some(1 << 20),
                limit: 1000
            }
        );
        assert_eq!(
            e.to_string(),
            "frame of 1048576 bytes exceeds the limit of 1000 bytes"
        );
        // Nothing after the lost boundary is held or decoded.
        r.push(&[0x05; 10_000]);
        assert_eq!(r.next_frame(), None);
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn plain_payloads_share_the_read_chunk() {
        let after: Vec<Frame> = (0..200).map(|i| frame(3 * i, 500)).collect();
        let wire = stream(&[], &after);
        let mut r = FrameReader::with_buffers(1 << 16, 64 * 1024, 16 << 20);
        r.accept_plain(true);
        r.push(&wire);
        let got: Vec<Frame> = std::iter::from_fn(|| r.next_frame())
            .map(Result::unwrap)
            .collect();
        assert_eq!(got.len(), 201);
        assert!(r.pinned_bytes() > 0, "payloads are slices of shared chunks");
        drop(got);
        assert_eq!(r.pinned_bytes(), 0);
    }
}
