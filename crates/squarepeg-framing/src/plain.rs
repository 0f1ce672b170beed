//! Plain frames (docs/wire.md §3): `varint(body length) ‖ header ‖ payload`.
//!
//! uCOBS pays for its markers and checksum on every byte: they are what lets a receiver find
//! frames in segments handed over out of order (Minion §5.3) and reject frames a middlebox
//! assembled from two different transmissions (Hollywood §4.5). A receiver that reads the
//! stream in order from a sender that never replaces retransmitted bytes needs neither, and a
//! length prefix costs one varint per frame with no pass over the payload. A connection
//! starts in uCOBS and each direction switches to plain frames only when its receiver has
//! announced it can read them (PARAMS, docs/wire.md §2.2), with a uCOBS Switch frame after
//! which every byte is plain.
//!
//! The body is the same header as in uCOBS ([`FrameHeader`]) and the payload; the body length
//! counts both. There is no checksum: TCP's checksum covers corruption on the path as it does
//! for any TCP application, and TLS's AEAD will authenticate (the record layer).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use crate::decoder::{ChunkPool, Fill};
use crate::run::{MessageRun, RunSummary, parse_message};
use crate::{Decoded, Frame, FrameError, FrameHeader, HeaderError, MAX_HEADER_LEN, varint};

/// The frame formats a direction of a connection can be in (the `format` of a Switch frame,
/// and bits of the PARAMS receive-formats parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FrameFormat {
    /// uCOBS frames (docs/wire.md §1): every connection starts in it.
    #[default]
    Ucobs,
    /// Length-prefixed frames (docs/wire.md §3).
    Plain,
}

impl FrameFormat {
    /// The format's id on the wire.
    pub const fn id(self) -> u64 {
        match self {
            Self::Ucobs => 0,
            Self::Plain => 1,
        }
    }

    /// The format with wire id `id`, if this build knows it.
    pub const fn from_id(id: u64) -> Option<Self> {
        match id {
            0 => Some(Self::Ucobs),
            1 => Some(Self::Plain),
            _ => None,
        }
    }

    /// Appends one frame in this format to `out`; returns the bytes appended. `out` is
    /// unchanged on error.
    #[inline]
    pub fn encode(
        self,
        header: &FrameHeader,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, FrameError> {
        match self {
            Self::Ucobs => crate::encode_frame(header, payload, out),
            Self::Plain => encode_plain_frame(header, payload, out),
        }
    }

    /// [`Self::encode`] of a MESSAGE frame (the plain format's without the general header
    /// encoder, [`encode_plain_message`]).
    #[inline]
    pub fn encode_message(
        self,
        substream: u64,
        number: u64,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, FrameError> {
        match self {
            Self::Ucobs => {
                crate::encode_frame(&FrameHeader::Message { substream, number }, payload, out)
            }
            Self::Plain => encode_plain_message(substream, number, payload, out),
        }
    }

    /// The length of the frame [`Self::encode`] makes of `header` and `payload_len` payload
    /// bytes, where known without encoding (plain frames; `None` for uCOBS, whose length
    /// depends on the bytes, or for a frame that does not encode).
    pub fn frame_len(self, header: &FrameHeader, payload_len: usize) -> Option<usize> {
        match self {
            Self::Ucobs => None,
            Self::Plain => {
                let body = header.encoded_len().ok()? + payload_len;
                Some(varint::len(body as u64)? + body)
            }
        }
    }

    /// The most payload bytes a frame with `header` can carry in `room` bytes (`None`: not
    /// even the header fits, or uCOBS, whose length depends on the bytes).
    pub fn payload_room(self, header: &FrameHeader, room: usize) -> Option<usize> {
        match self {
            Self::Ucobs => None,
            Self::Plain => {
                let head = header.encoded_len().ok()?;
                // The length prefix counts header and payload: its shortest form that fits.
                [1, 2, 4, 8].into_iter().find_map(|len_len| {
                    let body = room.checked_sub(len_len)?;
                    let payload = body.checked_sub(head)?;
                    (varint::len(body as u64)? <= len_len).then_some(payload)
                })
            }
        }
    }
}

/// [`encode_plain_frame`] of a MESSAGE frame (`FrameHeader::Message { substream, number }`),
/// written directly: the same bytes, without the general header's match and loop (this
/// runs once per message sent, ~40 % fewer instructions than the general encoder for a
/// 64-byte message).
#[inline]
pub fn encode_plain_message(
    substream: u64,
    number: u64,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<usize, FrameError> {
    let (sub, sub_len) = varint::to_bytes(substream)?;
    let (num, num_len) = varint::to_bytes(number)?;
    let body = 2 + sub_len + num_len + payload.len();
    // Each varint is copied as all eight of its bytes (fixed-size moves): the next field
    // overwrites the excess. At most 8 + 2 + 8 + 8 bytes are written.
    let mut prefix = [0u8; 8 + 2 + 8 + 8];
    // The length in its one- or two-byte form for any body under 16 KiB (RFC 9000 §16),
    // written directly; the general encoder beyond.
    let mut at = if body < 1 << 6 {
        prefix[0] = body as u8;
        1
    } else if body < 1 << 14 {
        prefix[..2].copy_from_slice(&(0x4000 | body as u16).to_be_bytes());
        2
    } else {
        let (len, len_len) = varint::to_bytes(body as u64)?;
        prefix[..8].copy_from_slice(&len);
        len_len
    };
    prefix[at] = (crate::header::VERSION << 4) | crate::header::FrameKind::Message as u8;
    prefix[at + 1] = 0;
    at += 2;
    prefix[at..at + 8].copy_from_slice(&sub);
    at += sub_len;
    prefix[at..at + 8].copy_from_slice(&num);
    at += num_len;
    out.reserve(at + payload.len());
    out.extend_from_slice(&prefix[..at]);
    out.extend_from_slice(payload);
    Ok(at + payload.len())
}

/// Appends `varint(len) ‖ header ‖ payload` to `out` (`len` = header and payload bytes) and
/// returns the bytes appended. `out` is unchanged on error.
#[inline]
pub fn encode_plain_frame(
    header: &FrameHeader,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<usize, FrameError> {
    let (head, head_len) = header.to_bytes()?;
    crate::frame::check_stream_end(header, payload.len())?;
    let body = (head_len + payload.len()) as u64;
    let (len, len_len) = varint::to_bytes(body)?;
    // Length and header are put together first: one copy of the prefix into `out` rather
    // than two (this runs for every frame sent).
    let mut prefix = [0u8; 8 + MAX_HEADER_LEN];
    prefix[..8].copy_from_slice(&len);
    prefix[len_len..len_len + MAX_HEADER_LEN].copy_from_slice(&head);
    let prefix_len = len_len + head_len;
    out.reserve(prefix_len + payload.len());
    out.extend_from_slice(&prefix[..prefix_len]);
    out.extend_from_slice(payload);
    Ok(prefix_len + payload.len())
}

/// Splits an in-order stream of plain frames into frames, reading straight into pooled chunks
/// whose slices become the payloads (no copy per frame, no allocation per read in a steady
/// stream). The memory rules are the uCOBS decoder's ([`crate::StreamDecoder`]): while the
/// chunks that payloads keep alive would exceed the pinning limit, or for reads too small to
/// be worth a chunk, payloads are copied out instead.
#[derive(Debug)]
pub(crate) struct PlainDecoder {
    max_body: usize,
    read_size: usize,
    /// The current chunk: `buf[start..filled]` is not yet cut into frames.
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    pool: Arc<ChunkPool>,
    pinned_limit: usize,
    ready: VecDeque<Decoded>,
    /// A length over the limit was read: frame boundaries are lost, so every later byte is
    /// dropped (on a reliable stream the error ends the connection anyway).
    failed: bool,
}

impl PlainDecoder {
    pub(crate) fn new(
        max_body: usize,
        read_size: usize,
        pool: Arc<ChunkPool>,
        pinned_limit: usize,
    ) -> Self {
        Self {
            max_body,
            read_size,
            buf: Vec::new(),
            start: 0,
            filled: 0,
            pool,
            pinned_limit,
            ready: VecDeque::new(),
            failed: false,
        }
    }

    pub(crate) fn unfilled(&mut self) -> &mut [u8] {
        if self.buf.len() - self.filled < self.read_size {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.start = 0;
            }
            let want = self.filled + self.read_size;
            if self.buf.len() < want {
                if self.buf.is_empty() {
                    self.buf = self.pool.get(want);
                } else {
                    self.buf.resize(want, 0);
                }
            }
        }
        &mut self.buf[self.filled..]
    }

    pub(crate) fn filled(&mut self, n: usize) {
        if self.failed {
            return; // dropped: see `failed`
        }
        self.filled += n.min(self.buf.len() - self.filled);
        self.cut();
    }

    pub(crate) fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        match self.ready.front_mut()? {
            Decoded::Messages(run) => {
                let frame = run.pop_frame();
                if run.is_empty() {
                    self.ready.pop_front();
                }
                frame.map(Ok)
            }
            Decoded::Frame(_) => match self.ready.pop_front()? {
                Decoded::Frame(f) => Some(f),
                Decoded::Messages(_) => None,
            },
        }
    }

    pub(crate) fn next_decoded(&mut self) -> Option<Decoded> {
        self.ready.pop_front()
    }

    /// Frames (and errors) waiting.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready
            .iter()
            .map(|d| match d {
                Decoded::Messages(run) => run.len(),
                Decoded::Frame(_) => 1,
            })
            .sum()
    }

    /// Bytes held waiting for the end of a frame.
    pub(crate) fn buffered(&self) -> usize {
        self.filled - self.start
    }

    /// Its read buffer's capacity (the pool's is counted by the reader).
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// [`crate::StreamDecoder::release_idle`] for the plain decoder: the read buffer goes
    /// (the bytes of a frame in progress, at most [`crate::decoder::IDLE_KEEP`], move to one
    /// of their size), and the pool's idle chunks.
    pub(crate) fn release_idle(&mut self) {
        if self.filled - self.start <= crate::decoder::IDLE_KEEP {
            self.buf = self.buf[self.start..self.filled].to_vec();
            self.filled -= self.start;
            self.start = 0;
        }
        if self.ready.is_empty() {
            self.ready = VecDeque::new();
        }
        self.pool.trim();
    }

    /// Cuts the complete frames out of `buf[start..filled]`: a first pass finds their extent
    /// from the lengths alone (which decides whether the chunk is shared), a second decodes
    /// the headers and queues the frames (no list of spans in between: this runs for every
    /// frame received).
    fn cut(&mut self) {
        let mut pos = self.start;
        let mut oversize = None;
        while pos < self.filled {
            let Ok((len, len_len)) = varint::decode(&self.buf[pos..self.filled]) else {
                break; // the length itself is incomplete
            };
            if len > self.max_body as u64 {
                oversize = Some(len);
                break;
            }
            let end = pos + len_len + len as usize;
            if end > self.filled {
                break;
            }
            pos = end;
        }
        let from = self.start;
        let consumed = pos - from;
        if consumed > 0 {
            let worth_a_chunk = consumed >= self.pool.chunk_size / 8;
            if worth_a_chunk && self.pool.live() + self.buf.len() <= self.pinned_limit {
                // The frames' bytes stay where they were read: the chunk is shared and the
                // payloads are slices of it; the partial frame after them moves to a new
                // chunk.
                let tail = self.filled - pos;
                let mut next = self.pool.get(tail + self.read_size);
                next[..tail].copy_from_slice(&self.buf[pos..self.filled]);
                let chunk = self.pool.share(std::mem::replace(&mut self.buf, next));
                queue_frames(&mut self.ready, &chunk[from..pos], from, |r| chunk.slice(r));
                self.start = 0;
                self.filled = tail;
            } else {
                let buf = &self.buf;
                queue_frames(&mut self.ready, &buf[from..pos], from, |r| {
                    Bytes::copy_from_slice(&buf[r])
                });
                self.start = pos;
            }
        }
        if let Some(len) = oversize {
            self.ready
                .push_back(Decoded::Frame(Err(FrameError::Oversize {
                    len: Some(usize::try_from(len).unwrap_or(usize::MAX)),
                    limit: self.max_body,
                })));
            self.failed = true;
            self.start = 0;
            self.filled = 0;
        }
    }
}

/// A run ends after this many bytes (the receiver's inbox takes whole runs: this bounds how
/// far past its limit one run takes it).
const RUN_MAX_BYTES: usize = 16 * 1024;

/// Queues the frames of `bytes` (whole frames, their lengths checked by the caller), which
/// start at offset `base` of the buffer `payload` takes ranges of: consecutive well-formed
/// MESSAGE frames as one [`MessageRun`], every other frame (or error) on its own.
fn queue_frames(
    ready: &mut VecDeque<Decoded>,
    bytes: &[u8],
    base: usize,
    payload: impl Fn(Range<usize>) -> Bytes,
) {
    let mut pos = 0;
    // The run being gathered: where it starts, and its figures.
    let mut run_start = 0;
    let mut run = RunSummary::default();
    let flush = |ready: &mut VecDeque<Decoded>, start: usize, end: usize, run: &mut RunSummary| {
        if run.count > 0 {
            let bytes = payload(base + start..base + end);
            ready.push_back(Decoded::Messages(MessageRun::new(bytes, *run)));
            *run = RunSummary::default();
        }
    };
    while pos < bytes.len() {
        if let Some(m) = parse_message(&bytes[pos..]) {
            if run.count == 0 {
                run_start = pos;
            }
            run.add(&m);
            pos += m.end();
            if pos - run_start >= RUN_MAX_BYTES {
                flush(ready, run_start, pos, &mut run);
            }
            continue;
        }
        flush(ready, run_start, pos, &mut run);
        let Ok((len, len_len)) = varint::decode(&bytes[pos..]) else {
            debug_assert!(false, "lengths were checked");
            return;
        };
        let body = pos + len_len..pos + len_len + len as usize;
        ready.push_back(Decoded::Frame(
            match FrameHeader::decode(&bytes[body.clone()]) {
                Ok((header, head_len)) => Ok(Frame {
                    header,
                    payload: payload(base + body.start + head_len..base + body.end),
                }),
                // A body too short for its header.
                Err(HeaderError::Truncated) => Err(FrameError::TooShort),
                Err(other) => Err(other.into()),
            },
        ));
        pos = body.end;
    }
    flush(ready, run_start, pos, &mut run);
}

/// Plain frames decoded one at a time from a whole stream, as the plain decoder did before
/// message runs: kept as the oracle for tests and differential fuzzing.
#[cfg(any(test, feature = "reference"))]
pub mod reference {
    use bytes::Bytes;

    use crate::{Frame, FrameError, FrameHeader, HeaderError, varint};

    /// Every whole frame of `wire`, each decoded on its own; an oversize length ends the
    /// stream with its error, an incomplete frame at the end is left out.
    pub fn decode_stream(wire: &[u8], max_body: usize) -> Vec<Result<Frame, FrameError>> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < wire.len() {
            let Ok((len, n)) = varint::decode(&wire[pos..]) else {
                break; // the length itself is incomplete
            };
            if len > max_body as u64 {
                out.push(Err(FrameError::Oversize {
                    len: Some(usize::try_from(len).unwrap_or(usize::MAX)),
                    limit: max_body,
                }));
                break;
            }
            let Some(body) = wire.get(pos + n..pos + n + len as usize) else {
                break; // incomplete
            };
            out.push(match FrameHeader::decode(body) {
                Ok((header, head)) => Ok(Frame {
                    header,
                    payload: Bytes::copy_from_slice(&body[head..]),
                }),
                Err(HeaderError::Truncated) => Err(FrameError::TooShort),
                Err(e) => Err(e.into()),
            });
            pos += n + len as usize;
        }
        out
    }
}

impl Fill for PlainDecoder {
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
    use proptest::prelude::*;

    proptest! {
        /// The MESSAGE fast path writes exactly what the general encoder writes, and fails
        /// (leaving `out` as it was) exactly where it fails.
        #[test]
        fn encode_plain_message_equals_the_general_encoder(
            substream in prop_oneof![0u64..70_000, any::<u64>()],
            number in prop_oneof![0u64..70_000, any::<u64>()],
            len in prop_oneof![0usize..300, 16_000usize..17_000],
            before in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut general = before.clone();
            let mut fast = before.clone();
            let a = encode_plain_frame(&FrameHeader::Message { substream, number }, &payload, &mut general);
            let b = encode_plain_message(substream, number, &payload, &mut fast);
            prop_assert_eq!(a, b);
            prop_assert_eq!(general, fast);
        }
    }

    #[test]
    fn frame_len_and_payload_room_match_what_encode_writes() {
        let headers = [
            FrameHeader::StreamChunk {
                stream: 3,
                offset: 0,
                fin: false,
            },
            FrameHeader::StreamChunk {
                stream: 1 << 40,
                offset: (1 << 40) + 5,
                fin: true,
            },
            FrameHeader::Message {
                substream: 0,
                number: 70_000,
            },
        ];
        let payload = vec![7u8; 20_000];
        let mut out = Vec::new();
        for header in &headers {
            for len in [0, 1, 40, 63, 64, 16_300, 16_383, 16_384, 20_000] {
                out.clear();
                let n = FrameFormat::Plain
                    .encode(header, &payload[..len], &mut out)
                    .unwrap();
                assert_eq!(FrameFormat::Plain.frame_len(header, len), Some(n));
            }
            // The room's largest payload fits, one byte more does not.
            for room in (0..17_000).step_by(7) {
                match FrameFormat::Plain.payload_room(header, room) {
                    Some(p) => {
                        let len = FrameFormat::Plain.frame_len(header, p).unwrap();
                        assert!(len <= room, "room {room}: {p} bytes make {len}");
                        let more = FrameFormat::Plain.frame_len(header, p + 1).unwrap();
                        assert!(more > room, "room {room}: {} bytes fit too", p + 1);
                    }
                    None => assert!(
                        FrameFormat::Plain.frame_len(header, 0).unwrap() > room,
                        "room {room}: the header fits"
                    ),
                }
            }
        }
        assert_eq!(FrameFormat::Ucobs.frame_len(&headers[0], 10), None);
        assert_eq!(FrameFormat::Ucobs.payload_room(&headers[0], 100), None);
    }
}
