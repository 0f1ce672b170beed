//! Runs of plain MESSAGE frames handed on whole: a [`MessageRun`].
//!
//! Why: over an in-order plain stream most frames of a read are small messages, and moving
//! each one as a [`Frame`] through the decoder's queue, the session's and the application's
//! cost a few hundred instructions a message (moves of ~80-byte records, a reference count
//! per payload at each stage). A run keeps the frames as they were read, checked once, and
//! a message is cut out of it (its payload a slice) only where it is delivered.

use bytes::{Buf, Bytes};

use crate::header::{FrameKind, VERSION};
use crate::{Frame, FrameHeader, varint};

/// The first byte of a MESSAGE frame's header (version and kind; docs/wire.md §1.1).
const MESSAGE_TYPE: u8 = (VERSION << 4) | FrameKind::Message as u8;

/// Consecutive plain MESSAGE frames (`varint(body length) ‖ header ‖ payload` each, docs/wire.md
/// §3), every one checked when the run was made: its header is a MESSAGE header with no
/// flags whose two varints lie within its body. Built only by the plain decoder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageRun {
    bytes: Bytes,
    count: usize,
    /// The first message's number.
    first_number: u64,
    /// Every message's number is the one before it plus one (the usual case on an
    /// in-order connection: one check of the receiver's duplicate window for the whole run).
    consecutive: bool,
    /// Payload bytes of all its messages.
    payload_len: usize,
}

/// A run's figures, gathered frame by frame as the decoder checks them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunSummary {
    pub(crate) count: usize,
    first_number: u64,
    last_number: u64,
    consecutive: bool,
    payload_len: usize,
}

impl RunSummary {
    /// Counts `m`, the run's next message.
    pub(crate) fn add(&mut self, m: &RunMessage) {
        if self.count == 0 {
            self.first_number = m.number;
            self.consecutive = true;
        } else {
            self.consecutive &= self.last_number.checked_add(1) == Some(m.number);
        }
        self.last_number = m.number;
        self.count += 1;
        self.payload_len += m.len;
    }
}

/// What an in-order reader hands out next ([`crate::FrameReader::next_decoded`]).
#[derive(Debug)]
pub enum Decoded {
    /// A frame, or an error for bytes that cannot be one.
    Frame(Result<Frame, crate::FrameError>),
    /// Consecutive MESSAGE frames (plain frames only).
    Messages(MessageRun),
}

/// One message of a run, not yet cut out: its header fields and where its payload lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunMessage {
    pub substream: u64,
    pub number: u64,
    /// Payload bytes.
    pub len: usize,
    payload_start: usize,
    end: usize,
}

/// Parses the MESSAGE frame at the front of `buf`: `None` unless it is a whole, well-formed
/// plain MESSAGE frame (the check a run's frames passed).
#[inline]
pub(crate) fn parse_message(buf: &[u8]) -> Option<RunMessage> {
    // The usual frame — a length of one or two bytes, then the header — has everything but
    // its payload in its first 16 bytes: read from one load, with no bounds check per
    // field (this runs twice for every message received). Anything else, or any check
    // failing here, takes the general path, which decides.
    if let Some(head) = buf.first_chunk::<16>() {
        let len_len = 1usize << (head[0] >> 6);
        if len_len <= 2 {
            let body_len = if len_len == 1 {
                usize::from(head[0] & 0x3f)
            } else {
                usize::from(head[0] & 0x3f) << 8 | usize::from(head[1])
            };
            let end = len_len + body_len;
            if end <= buf.len() && head[len_len] == MESSAGE_TYPE && head[len_len + 1] == 0 {
                let at = len_len + 2;
                let (substream, n) = varint_in_word(head[at..at + 8].try_into().ok()?);
                let at = at + n;
                if at + 8 <= 16 {
                    let (number, m) = varint_in_word(head[at..at + 8].try_into().ok()?);
                    let payload_start = at + m;
                    if payload_start <= end {
                        return Some(RunMessage {
                            substream,
                            number,
                            len: end - payload_start,
                            payload_start,
                            end,
                        });
                    }
                }
            }
        }
    }
    parse_message_general(buf)
}

/// The varint at the front of `word` (eight bytes, those after it ignored): value and length.
#[inline]
fn varint_in_word(word: [u8; 8]) -> (u64, usize) {
    let word = u64::from_be_bytes(word);
    let n = 1usize << (word >> 62);
    ((word << 2 >> 2) >> (64 - 8 * n), n)
}

/// [`parse_message`] for any input.
fn parse_message_general(buf: &[u8]) -> Option<RunMessage> {
    let (body_len, len_len) = varint::decode(buf).ok()?;
    let body = buf.get(len_len..len_len.checked_add(usize::try_from(body_len).ok()?)?)?;
    let [MESSAGE_TYPE, 0, ..] = *body else {
        return None;
    };
    let (substream, n) = varint::decode(&body[2..]).ok()?;
    let (number, m) = varint::decode(&body[2 + n..]).ok()?;
    let head = 2 + n + m;
    Some(RunMessage {
        substream,
        number,
        len: body.len() - head,
        payload_start: len_len + head,
        end: len_len + body.len(),
    })
}

impl RunMessage {
    /// The frame's end, from the start of the bytes it was parsed from.
    pub(crate) fn end(&self) -> usize {
        self.end
    }
}

impl MessageRun {
    /// A run of the frames that make up `bytes` exactly (the decoder checked each with
    /// [`parse_message`] and summed them up in `summary`).
    pub(crate) fn new(bytes: Bytes, summary: RunSummary) -> Self {
        let run = Self {
            bytes,
            count: summary.count,
            first_number: summary.first_number,
            consecutive: summary.consecutive,
            payload_len: summary.payload_len,
        };
        debug_assert_eq!(run.summarize(), summary, "a run's summary is its frames'");
        run
    }

    /// Its figures, from its frames.
    fn summarize(&self) -> RunSummary {
        let mut summary = RunSummary::default();
        for m in self.iter() {
            summary.add(&m);
        }
        summary
    }

    /// The first message's number (meaningless for an empty run).
    pub fn first_number(&self) -> u64 {
        self.first_number
    }

    /// Whether its messages are numbered consecutively from [`MessageRun::first_number`]
    /// (false may also be said of a run whose non-consecutive messages were taken).
    pub fn is_consecutive(&self) -> bool {
        self.consecutive
    }

    /// Payload bytes of its messages.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// Messages in it.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds no message.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Its encoded bytes.
    pub fn encoded_len(&self) -> usize {
        self.bytes.len()
    }

    /// Its messages in order, not cut out.
    pub fn iter(&self) -> impl Iterator<Item = RunMessage> + '_ {
        let mut pos = 0;
        std::iter::from_fn(move || {
            let mut m = parse_message(self.bytes.get(pos..)?)?;
            m.payload_start += pos;
            m.end += pos;
            pos = m.end;
            Some(m)
        })
    }

    /// Takes the first message out: (sub-stream, number, payload).
    pub fn pop_front(&mut self) -> Option<(u64, u64, Bytes)> {
        let m = parse_message(&self.bytes)?;
        let payload = self.bytes.slice(m.payload_start..m.end);
        self.bytes.advance(m.end);
        self.count -= 1;
        self.payload_len -= m.len;
        self.first_number = if self.consecutive {
            m.number.wrapping_add(1)
        } else {
            parse_message(&self.bytes).map_or(0, |next| next.number)
        };
        Some((m.substream, m.number, payload))
    }

    /// Takes the first message out as a [`Frame`].
    pub fn pop_frame(&mut self) -> Option<Frame> {
        let (substream, number, payload) = self.pop_front()?;
        Some(Frame {
            header: FrameHeader::Message { substream, number },
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FrameReader, encode_plain_frame};
    use proptest::prelude::*;

    /// A frame of the test stream.
    #[derive(Clone, Debug)]
    enum Item {
        /// A MESSAGE frame; `wide`: its three varints in a longer form than needed (which a
        /// decoder must accept, RFC 9000 §16).
        Message {
            substream: u64,
            number: u64,
            len: usize,
            wide: bool,
        },
        /// A frame of another kind.
        Chunk(usize),
        /// A body with a MESSAGE type byte that is no MESSAGE frame: flags set, or too
        /// short for its varints.
        Bad(u8),
    }

    fn item() -> impl Strategy<Value = Item> {
        prop_oneof![
            8 => (0u64..3, prop_oneof![0u64..100, 16_000u64..17_000], 0usize..300, any::<bool>())
                .prop_map(|(substream, number, len, wide)| Item::Message { substream, number, len, wide }),
            1 => (0usize..200).prop_map(Item::Chunk),
            1 => (0u8..4).prop_map(Item::Bad),
        ]
    }

    fn encode(items: &[Item]) -> Vec<u8> {
        let mut wire = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let payload: Vec<u8> = (0..300).map(|k| (k + i) as u8).collect();
            match *it {
                Item::Message {
                    substream,
                    number,
                    len,
                    wide: false,
                } => {
                    let h = FrameHeader::Message { substream, number };
                    encode_plain_frame(&h, &payload[..len], &mut wire).unwrap();
                }
                Item::Message {
                    substream,
                    number,
                    len,
                    wide: true,
                } => {
                    // Every varint in its 4-byte form.
                    let v4 = |v: u64| ((0b10u32 << 30) | v as u32).to_be_bytes();
                    let mut body = vec![MESSAGE_TYPE, 0];
                    body.extend_from_slice(&v4(substream));
                    body.extend_from_slice(&v4(number));
                    body.extend_from_slice(&payload[..len]);
                    wire.extend_from_slice(&v4(body.len() as u64));
                    wire.extend_from_slice(&body);
                }
                Item::Chunk(len) => {
                    let h = FrameHeader::StreamChunk {
                        stream: 4,
                        offset: i as u64,
                        fin: false,
                    };
                    encode_plain_frame(&h, &payload[..len], &mut wire).unwrap();
                }
                Item::Bad(kind) => {
                    let body: &[u8] = match kind {
                        0 => &[MESSAGE_TYPE, 1, 0, 0, 9],
                        1 => &[MESSAGE_TYPE, 0],
                        2 => &[MESSAGE_TYPE, 0, 0x40],
                        _ => &[MESSAGE_TYPE, 0, 5, 0x80, 1],
                    };
                    wire.push(body.len() as u8);
                    wire.extend_from_slice(body);
                }
            }
        }
        wire
    }

    proptest! {
        /// The 16-byte fast path of `parse_message` says exactly what the general parser
        /// says, for any bytes (mostly near-MESSAGE frames: the type byte, short lengths).
        #[test]
        fn the_fast_parse_equals_the_general_one(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..40),
            len in 0u8..0x7f,
            typed in any::<bool>(),
        ) {
            if bytes.len() >= 3 && typed {
                bytes[0] = len;
                bytes[1] = MESSAGE_TYPE;
                bytes[2] = 0;
            }
            prop_assert_eq!(parse_message(&bytes), parse_message_general(&bytes));
        }

        /// Whatever the frames, the cuts and the buffer sizes (shared chunks or copies), the
        /// plain reader hands out exactly what decoding each frame on its own gives: through
        /// `next_frame`, and through `next_decoded` with each run taken apart message by
        /// message (its figures checked against its frames before each take).
        #[test]
        fn runs_decode_as_single_frames(
            items in proptest::collection::vec(item(), 0..80),
            cut in 1usize..3000,
            read_size in prop_oneof![Just(1024usize), Just(64 * 1024)],
            pinned in prop_oneof![Just(0usize), Just(1usize << 20)],
            mode in 0u8..2,
        ) {
            let wire = encode(&items);
            let expected = crate::plain::reference::decode_stream(&wire, 1 << 16);
            let mut r = FrameReader::with_buffers(1 << 16, read_size, pinned);
            r.start_plain();
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                r.push(piece);
                match mode {
                    0 => while let Some(f) = r.next_frame() {
                        got.push(f);
                    },
                    _ => while let Some(d) = r.next_decoded() {
                        match d {
                            Decoded::Frame(f) => got.push(f),
                            Decoded::Messages(mut run) => {
                                prop_assert!(!run.is_empty());
                                let n = run.len();
                                let walked: Vec<RunMessage> = run.iter().collect();
                                prop_assert_eq!(walked.len(), n);
                                for w in &walked {
                                    // The run's figures are its frames', before each take.
                                    let summary = run.summarize();
                                    prop_assert_eq!(run.len(), summary.count);
                                    prop_assert_eq!(run.first_number(), summary.first_number);
                                    // (A run that was not consecutive may have become so.)
                                    prop_assert!(!run.is_consecutive() || summary.consecutive);
                                    prop_assert_eq!(run.payload_len(), summary.payload_len);
                                    let (substream, number, payload) = run.pop_front().unwrap();
                                    prop_assert_eq!((substream, number, payload.len()), (w.substream, w.number, w.len));
                                    got.push(Ok(Frame { header: FrameHeader::Message { substream, number }, payload }));
                                }
                                prop_assert!(run.is_empty());
                                prop_assert!(run.pop_front().is_none());
                            }
                        }
                    },
                }
            }
            prop_assert_eq!(r.offset(), wire.len() as u64);
            prop_assert_eq!(got, expected);
        }
    }
}
