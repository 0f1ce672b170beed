//! The uTCP application interface (Minion §4): every segment at once on the receive side,
//! tagged message writes and their reports on the send side.
//!
//! # Receive: every segment at once (Minion §4.1, Hollywood §4.3)
//!
//! With [`ConnectionConfig::unordered_receive`](crate::ConnectionConfig::unordered_receive)
//! (or [`Endpoint::enable_unordered_receive`](crate::Endpoint::enable_unordered_receive), one
//! way, at any time — Minion's `SO_UNORDERED`) the connection hands the bytes of every data
//! segment it accepts to the application as it arrives, in arrival order, with the segment's
//! stream offset (its sequence number minus the ISN, minus one for the SYN): in-order
//! segments, out-of-order ones, and retransmissions of data received before. The application
//! reads them with [`Endpoint::read_segment`](crate::Endpoint::read_segment), or with `read`
//! as records (below).
//!
//! What is delivered when:
//! - each accepted segment's payload (trimmed to the receive window, as TCP trims it) is
//!   delivered once, when it arrives, including the bytes of it that arrived before;
//! - bytes that arrived out of order are *not* delivered again when the gap below them fills;
//! - a segment TCP does not accept (outside the window, rejected by PAWS, beyond the
//!   out-of-order range limit) is not delivered; it will be retransmitted;
//! - so every byte of the stream is delivered at least once, and some more than once.
//!
//! Why at least once rather than only never-delivered bytes: a retransmission may carry
//! different bytes than the original (an inconsistent retransmission, Hollywood §4.2), and
//! when the original arrived too — a spurious retransmission — the replacement messages exist
//! only in the retransmission; delivering only new bytes would lose them although they
//! arrived. Middleboxes make this worse: a retransmission cache or a re-segmenter can put the
//! original and the replacement on the wire in any mix (Hollywood §4.5). The upper layer
//! already has to cope with all of this: its frames carry a checksum (so a mix of two
//! transmissions is rejected), its reassembler keeps the first bytes at each offset and also
//! scans a conflicting segment on its own, and its session drops duplicate messages by
//! number. Duplicates cost a little work up there; losing replacements would cost messages.
//!
//! Acknowledgments, SACK blocks and the advertised window are exactly those of the standard
//! behaviour: the connection keeps the in-order point and the out-of-order ranges as always
//! (without their bytes), and counts in-order bytes against the window until the
//! application has *consumed* them — that is, until it has read every segment that carried
//! bytes at or below them. An application that reads every segment promptly thus sees the
//! window of one that reads the in-order stream promptly (a test compares every ACK of both).
//!
//! Memory: the bytes of segments not yet read. New bytes are bounded by the receive window
//! (they hold it closed until consumed). Bytes that arrived before (duplicates) are queued
//! whole while the duplicates queued total at most a quarter of the receive buffer; beyond
//! that only the new parts of a segment are queued and pure duplicates are dropped (counted
//! in [`ConnectionStats`](crate::ConnectionStats)). So at most 1.25 × the receive buffer.
//! These bytes count against the endpoint's memory budget ([`crate::mem`]); when it is
//! short, duplicates are not queued at all.
//!
//! # Send: message writes (Minion §4.2, Hollywood §4.2)
//!
//! [`Endpoint::write_message`](crate::Endpoint::write_message) queues a whole message with a
//! [`WriteTag`]; see [`crate::SendQueue`] for priority insertion, squash,
//! expiry, dependencies, consistent segmentation and inconsistent retransmissions, and
//! [`MessageReport`] for what the connection tells the application.
//!
//! # Records through `read` and `write` (Minion's socket options)
//!
//! Minion's uTCP passes the metadata through the ordinary `read()` and `write()` calls, each
//! with a short header. The same is available here, so that a driver offering only a byte
//! stream (such as `squarepeg-io`'s `TcpStream`) carries the whole uTCP interface:
//!
//! - with `unordered_receive`, each `read` returns whole records only, one after another:
//!   [`record::REPORT`] records (pending message reports) first, then [`record::SEGMENT`]
//!   records (a segment's offset and bytes; a segment larger than the buffer is returned in
//!   pieces, each a record with its own offset). `Ok(0)` is the end of the stream (peer FIN,
//!   everything read). The buffer must hold at least [`MIN_READ_BUFFER`] bytes.
//! - with [`ConnectionConfig::message_writes`](crate::ConnectionConfig::message_writes)
//!   (`SO_UNORDEREDSEND`), each `write` must hold one or more whole [`record::MESSAGE`]
//!   records; the connection takes the longest prefix of whole records that fits and returns
//!   its length (`WouldBlock` if not even the first fits). A message's lifetime is carried
//!   relative to the write (the core reads no clock): its deadline counts from the next time
//!   the connection is given the time, which a driver does right after a write.
//!
//! [`record`] has the exact layouts and the codec both sides use.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::send_queue::{MessageReport, WriteTag};

/// Smallest buffer a `read` in unordered mode accepts: one segment record header and a byte.
pub const MIN_READ_BUFFER: usize = record::SEGMENT_HEADER + 1;

/// A piece of a received segment, as [`Endpoint::read_segment`](crate::Endpoint::read_segment)
/// returns it: `len` bytes from stream offset `offset` were written to the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceivedSegment {
    pub offset: u64,
    pub len: usize,
}

/// Counters of the unordered receive path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnorderedStats {
    /// Segments (or pieces of them) queued for the application.
    pub segments_delivered: u64,
    /// Bytes queued for the application.
    pub bytes_delivered: u64,
    /// Of those, bytes that had arrived before.
    pub duplicate_bytes_delivered: u64,
    /// Bytes of already-received data not queued because the duplicate limit was reached.
    pub duplicate_bytes_dropped: u64,
}

#[derive(Debug)]
struct Delivery {
    offset: u64,
    data: Vec<u8>,
    /// Bytes already read from the front.
    pos: usize,
    serial: u64,
    /// Bytes of it that had arrived before (counted until it is read entirely).
    old: usize,
}

/// The queue of segments handed to the application on arrival (Minion §4.1).
#[derive(Debug)]
pub(crate) struct Unordered {
    records: VecDeque<Delivery>,
    /// Unread records by (current start offset, serial), with their end offsets: what keeps
    /// in-order bytes from counting as consumed.
    starts: BTreeMap<(u64, u64), u64>,
    next_serial: u64,
    bytes: usize,
    old_bytes: usize,
    old_limit: usize,
    stats: UnorderedStats,
}

impl Unordered {
    pub(crate) fn new(old_limit: usize) -> Self {
        Unordered {
            records: VecDeque::new(),
            starts: BTreeMap::new(),
            next_serial: 0,
            bytes: 0,
            old_bytes: 0,
            old_limit,
            stats: UnorderedStats::default(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Unread bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn stats(&self) -> UnorderedStats {
        self.stats
    }

    fn push(&mut self, offset: u64, data: Vec<u8>, old: usize) {
        if data.is_empty() {
            return;
        }
        self.next_serial += 1;
        let serial = self.next_serial;
        let end = offset + data.len() as u64;
        self.starts.insert((offset, serial), end);
        self.bytes += data.len();
        self.old_bytes += old;
        self.stats.segments_delivered += 1;
        self.stats.bytes_delivered += data.len() as u64;
        self.stats.duplicate_bytes_delivered += old as u64;
        self.records.push_back(Delivery {
            offset,
            data,
            pos: 0,
            serial,
            old,
        });
    }

    /// Queues a segment's bytes at `offset`, of which `new` (ascending, disjoint ranges) had
    /// not arrived before. Returns whether anything was queued.
    /// `old_ok` false (the endpoint's memory budget, [`crate::mem`]) queues only the new parts.
    pub(crate) fn deliver(
        &mut self,
        offset: u64,
        data: &[u8],
        new: &[(u64, u64)],
        old_ok: bool,
    ) -> bool {
        if data.is_empty() {
            return false;
        }
        let fresh: usize = new.iter().map(|&(s, e)| (e - s) as usize).sum();
        let old = data.len() - fresh.min(data.len());
        if old == 0 || (old_ok && self.old_bytes + old <= self.old_limit) {
            self.push(offset, data.to_vec(), old);
            return true;
        }
        // Over the duplicate limit: only the new parts.
        self.stats.duplicate_bytes_dropped += old as u64;
        let mut any = false;
        for &(s, e) in new {
            let a = (s - offset) as usize;
            let b = ((e - offset) as usize).min(data.len());
            if a < b {
                self.push(s, data[a..b].to_vec(), 0);
                any = true;
            }
        }
        any
    }

    /// Copies the next record (or as much of it as fits) into `buf`.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> Option<ReceivedSegment> {
        let front = self.records.front_mut()?;
        let offset = front.offset + front.pos as u64;
        let n = (front.data.len() - front.pos).min(buf.len());
        buf[..n].copy_from_slice(&front.data[front.pos..front.pos + n]);
        let end = front.offset + front.data.len() as u64;
        self.starts.remove(&(offset, front.serial));
        front.pos += n;
        self.bytes -= n;
        if front.pos == front.data.len() {
            self.old_bytes -= front.old;
            self.records.pop_front();
        } else {
            self.starts.insert((offset + n as u64, front.serial), end);
        }
        Some(ReceivedSegment { offset, len: n })
    }

    /// The offset up to which in-order bytes count as consumed: `next` (the in-order point),
    /// or the start of the lowest unread record that reaches above `read_offset`.
    pub(crate) fn consumed_to(&self, read_offset: u64, next: u64) -> u64 {
        for (&(start, _), &end) in &self.starts {
            if end > read_offset {
                return start.max(read_offset).min(next);
            }
        }
        next
    }
}

/// The record formats of `read` and `write` in uTCP mode (module docs). All integers are
/// big-endian.
///
/// | record | layout |
/// |---|---|
/// | segment | `1` · offset u64 · length u32 · bytes |
/// | report | `2` · kind u8 (1 sent, 2 sent as a replacement, 3 acknowledged, 4 expired, 5 squashed, 6 replaced) · message id u64 |
/// | message | `3` · flags u8 (1 squash key, 2 lifetime, 4 depends on, 8 message id) · priority i32 · squash key u64 · lifetime µs u64 · depends on u64 · message id u64 · length u32 · bytes |
///
/// Fields whose flag is clear are zero and ignored.
pub mod record {
    use super::*;

    pub const SEGMENT: u8 = 1;
    pub const REPORT: u8 = 2;
    pub const MESSAGE: u8 = 3;
    pub const SEGMENT_HEADER: usize = 1 + 8 + 4;
    pub const REPORT_LEN: usize = 1 + 1 + 8;
    pub const MESSAGE_HEADER: usize = 1 + 1 + 4 + 8 + 8 + 8 + 8 + 4;

    const HAS_SQUASH: u8 = 1;
    const HAS_LIFETIME: u8 = 2;
    const HAS_DEPENDS: u8 = 4;
    const HAS_ID: u8 = 8;

    /// A record `read` returned.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ReadRecord<'a> {
        Segment { offset: u64, data: &'a [u8] },
        Report(MessageReport),
    }

    /// Bytes `read` returned that are not a record.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
    #[error("malformed uTCP read record at byte {at}: {what}")]
    pub struct RecordError {
        pub at: usize,
        pub what: &'static str,
    }

    /// A message's metadata as a `write` record carries it: the [`WriteTag`] with a lifetime
    /// instead of a deadline.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct MessageMeta {
        pub priority: i32,
        pub squash_key: Option<u64>,
        /// How long after the write the message must have arrived.
        pub lifetime: Option<Duration>,
        pub depends_on: Option<u64>,
        pub message_id: Option<u64>,
    }

    impl MessageMeta {
        /// The tag for the send queue (without deadline: the lifetime becomes one later).
        pub(crate) fn tag(&self) -> WriteTag {
            WriteTag {
                priority: self.priority,
                squash_key: self.squash_key,
                deadline: None,
                depends_on: self.depends_on,
                message_id: self.message_id,
            }
        }
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(a)
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(&b[at..at + 4]);
        u32::from_be_bytes(a)
    }

    /// Appends a message record (for `write` with `message_writes`).
    pub fn encode_message(meta: &MessageMeta, data: &[u8], out: &mut Vec<u8>) {
        let mut flags = 0;
        let mut field = |v: Option<u64>, bit: u8| {
            flags |= if v.is_some() { bit } else { 0 };
            v.unwrap_or(0).to_be_bytes()
        };
        let squash = field(meta.squash_key, HAS_SQUASH);
        let lifetime = field(
            meta.lifetime
                .map(|l| u64::try_from(l.as_micros()).unwrap_or(u64::MAX)),
            HAS_LIFETIME,
        );
        let depends = field(meta.depends_on, HAS_DEPENDS);
        let id = field(meta.message_id, HAS_ID);
        out.reserve(MESSAGE_HEADER + data.len());
        out.push(MESSAGE);
        out.push(flags);
        out.extend_from_slice(&meta.priority.to_be_bytes());
        for f in [squash, lifetime, depends, id] {
            out.extend_from_slice(&f);
        }
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    }

    /// A parsed message record: its metadata, its bytes and the record's length.
    pub type DecodedMessage<'a> = (MessageMeta, &'a [u8], usize);

    /// Parses the message record at the start of `buf`: its metadata, its bytes and the
    /// record's length. `Ok(None)` if `buf` ends before the record does.
    pub fn decode_message(buf: &[u8]) -> Result<Option<DecodedMessage<'_>>, RecordError> {
        let Some(&kind) = buf.first() else {
            return Ok(None);
        };
        if kind != MESSAGE {
            return Err(RecordError {
                at: 0,
                what: "not a message record",
            });
        }
        if buf.len() < MESSAGE_HEADER {
            return Ok(None);
        }
        let flags = buf[1];
        if flags & !(HAS_SQUASH | HAS_LIFETIME | HAS_DEPENDS | HAS_ID) != 0 {
            return Err(RecordError {
                at: 1,
                what: "unknown flags",
            });
        }
        let opt = |bit: u8, at: usize| (flags & bit != 0).then(|| u64_at(buf, at));
        let meta = MessageMeta {
            priority: u32_at(buf, 2) as i32,
            squash_key: opt(HAS_SQUASH, 6),
            lifetime: opt(HAS_LIFETIME, 14).map(Duration::from_micros),
            depends_on: opt(HAS_DEPENDS, 22),
            message_id: opt(HAS_ID, 30),
        };
        let len = u32_at(buf, 38) as usize;
        if len == 0 {
            return Err(RecordError {
                at: 38,
                what: "empty message",
            });
        }
        let total = MESSAGE_HEADER + len;
        if buf.len() < total {
            return Ok(None);
        }
        Ok(Some((meta, &buf[MESSAGE_HEADER..total], total)))
    }

    /// Writes a segment record header for `len` bytes at `offset` into `out`.
    pub(crate) fn segment_header(offset: u64, len: usize, out: &mut [u8]) {
        out[0] = SEGMENT;
        out[1..9].copy_from_slice(&offset.to_be_bytes());
        out[9..13].copy_from_slice(&(len as u32).to_be_bytes());
    }

    /// Writes a report record into `out` (at least [`REPORT_LEN`] bytes).
    pub(crate) fn encode_report(r: &MessageReport, out: &mut [u8]) {
        out[0] = REPORT;
        out[1] = match r {
            MessageReport::Sent {
                replacement: false, ..
            } => 1,
            MessageReport::Sent {
                replacement: true, ..
            } => 2,
            MessageReport::Acked { .. } => 3,
            MessageReport::Expired { .. } => 4,
            MessageReport::Squashed { .. } => 5,
            MessageReport::Replaced { .. } => 6,
        };
        out[2..10].copy_from_slice(&r.id().to_be_bytes());
    }

    /// The records in what one `read` returned.
    pub fn decode_read(buf: &[u8]) -> ReadRecords<'_> {
        ReadRecords { buf, at: 0 }
    }

    /// Iterator of [`decode_read`].
    #[derive(Debug)]
    pub struct ReadRecords<'a> {
        buf: &'a [u8],
        at: usize,
    }

    impl<'a> Iterator for ReadRecords<'a> {
        type Item = Result<ReadRecord<'a>, RecordError>;

        fn next(&mut self) -> Option<Self::Item> {
            let rest = &self.buf[self.at..];
            let &kind = rest.first()?;
            let at = self.at;
            let err = |what| Some(Err(RecordError { at, what }));
            match kind {
                SEGMENT => {
                    if rest.len() < SEGMENT_HEADER {
                        self.at = self.buf.len();
                        return err("truncated segment header");
                    }
                    let offset = u64_at(rest, 1);
                    let len = u32_at(rest, 9) as usize;
                    let Some(data) = rest.get(SEGMENT_HEADER..SEGMENT_HEADER + len) else {
                        self.at = self.buf.len();
                        return err("truncated segment");
                    };
                    self.at += SEGMENT_HEADER + len;
                    Some(Ok(ReadRecord::Segment { offset, data }))
                }
                REPORT => {
                    if rest.len() < REPORT_LEN {
                        self.at = self.buf.len();
                        return err("truncated report");
                    }
                    let id = u64_at(rest, 2);
                    let report = match rest[1] {
                        1 => MessageReport::Sent {
                            id,
                            replacement: false,
                        },
                        2 => MessageReport::Sent {
                            id,
                            replacement: true,
                        },
                        3 => MessageReport::Acked { id },
                        4 => MessageReport::Expired { id },
                        5 => MessageReport::Squashed { id },
                        6 => MessageReport::Replaced { id },
                        _ => {
                            self.at = self.buf.len();
                            return err("unknown report kind");
                        }
                    };
                    self.at += REPORT_LEN;
                    Some(Ok(ReadRecord::Report(report)))
                }
                _ => {
                    self.at = self.buf.len();
                    err("unknown record type")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::record::*;
    use super::*;

    #[test]
    fn message_records_round_trip() {
        let meta = MessageMeta {
            priority: -3,
            squash_key: Some(7),
            lifetime: Some(Duration::from_micros(1_500)),
            depends_on: None,
            message_id: Some(u64::MAX),
        };
        let mut out = Vec::new();
        encode_message(&meta, b"hello", &mut out);
        encode_message(&MessageMeta::default(), b"x", &mut out);
        assert_eq!(out.len(), 2 * MESSAGE_HEADER + 6);
        let (m, data, n) = decode_message(&out).unwrap().unwrap();
        assert_eq!((m, data, n), (meta, &b"hello"[..], MESSAGE_HEADER + 5));
        let (m, data, _) = decode_message(&out[n..]).unwrap().unwrap();
        assert_eq!((m, data), (MessageMeta::default(), &b"x"[..]));
        assert_eq!(decode_message(&out[..n - 1]).unwrap(), None);
        assert_eq!(decode_message(&out[..3]).unwrap(), None);
        assert!(decode_message(b"\x01abc").is_err());
        let mut bad = out.clone();
        bad[1] = 0x80;
        assert!(decode_message(&bad).is_err());
    }

    #[test]
    fn read_records_round_trip() {
        let mut buf = vec![0u8; REPORT_LEN + SEGMENT_HEADER + 3];
        encode_report(&MessageReport::Replaced { id: 9 }, &mut buf);
        segment_header(1 << 40, 3, &mut buf[REPORT_LEN..]);
        buf[REPORT_LEN + SEGMENT_HEADER..].copy_from_slice(b"abc");
        let recs: Vec<_> = decode_read(&buf).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            recs,
            vec![
                ReadRecord::Report(MessageReport::Replaced { id: 9 }),
                ReadRecord::Segment {
                    offset: 1 << 40,
                    data: b"abc"
                }
            ]
        );
        assert!(decode_read(&buf[..buf.len() - 1]).any(|r| r.is_err()));
        assert!(decode_read(&[9]).next().unwrap().is_err());
    }

    #[test]
    fn delivery_queue_reads_in_arrival_order_and_tracks_consumption() {
        let mut u = Unordered::new(3);
        // Out of order first, then the gap filler, then a duplicate of both.
        assert!(u.deliver(10, b"klmno", &[(10, 15)], true));
        assert!(u.deliver(0, b"0123456789", &[(0, 10)], true));
        assert_eq!(u.consumed_to(0, 15), 0);
        let mut buf = [0u8; 4];
        assert_eq!(
            u.read(&mut buf),
            Some(ReceivedSegment { offset: 10, len: 4 })
        );
        assert_eq!(u.consumed_to(0, 15), 0, "the filler is unread");
        let mut big = [0u8; 32];
        assert_eq!(
            u.read(&mut big),
            Some(ReceivedSegment { offset: 14, len: 1 })
        );
        assert_eq!(
            u.read(&mut big),
            Some(ReceivedSegment { offset: 0, len: 10 })
        );
        assert_eq!(u.consumed_to(0, 15), 15);
        // A duplicate within the limit is queued whole; beyond it only new bytes are.
        assert!(u.deliver(12, b"mn", &[], true));
        assert!(!u.deliver(0, b"01234", &[], true));
        assert!(u.deliver(13, b"nopq", &[(15, 17)], true));
        assert_eq!(u.stats().duplicate_bytes_dropped, 5 + 2);
        assert_eq!(
            u.read(&mut big),
            Some(ReceivedSegment { offset: 12, len: 2 })
        );
        assert_eq!(
            u.read(&mut big),
            Some(ReceivedSegment { offset: 15, len: 2 })
        );
        assert_eq!(u.read(&mut big), None);
        assert!(u.is_empty());
        assert_eq!(u.bytes(), 0);
    }
}
