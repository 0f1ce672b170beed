//! The send queue: an ordered list of *writes* (records), each with a tag.
//!
//! Minion §4.2 and Hollywood §4.2 need a send queue that knows the application's write
//! boundaries: writes whose first byte has been transmitted are *committed* (their stream
//! offsets are fixed, and nothing may be inserted ahead of or inside them); writes not yet
//! touched are *pending* and may still be reordered by priority or squashed. Bytes of a committed
//! range may be replaced by different bytes of exactly the same length (Hollywood's inconsistent
//! retransmissions). Standard TCP behaviour is plain appends with MSS-packing across writes.
//!
//! Offsets here are stream offsets: 0 is the first data byte after the SYN.

use std::collections::VecDeque;
use std::time::Instant;

use crate::error::Error;

/// Per-write metadata. None of it goes on the wire; later layers use it to reorder, squash and
/// replace writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteTag {
    /// Higher values are more urgent (Minion §4.2 priority tags). 0 is the default.
    pub priority: i32,
    /// Writes with the same key supersede each other while untransmitted (Minion §4.2 squash).
    pub squash_key: Option<u64>,
    /// Message deadline (Hollywood §4.2 lifetime).
    pub deadline: Option<Instant>,
    /// Message this one depends on (Hollywood §4.2).
    pub depends_on: Option<u64>,
    /// Opaque message identifier for the upper layer.
    pub message_id: Option<u64>,
}

impl WriteTag {
    fn is_plain(&self) -> bool {
        *self == WriteTag::default()
    }
}

/// Plain writes are merged into one record up to this size, so that many small writes do not
/// cost one allocation each.
const MERGE_LIMIT: usize = 64 * 1024;

#[derive(Debug)]
struct Record {
    /// Stream offset of `data[0]`; meaningful once committed.
    start: u64,
    data: Vec<u8>,
    tag: WriteTag,
}

impl Record {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

/// A committed write as seen by the upper layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommittedWrite {
    pub start: u64,
    pub len: usize,
    pub tag: WriteTag,
}

/// The send queue of one connection. The upper layer reaches it through
/// [`Endpoint::send_queue`](crate::Endpoint::send_queue) to inspect writes, squash pending ones
/// and replace committed bytes; appends and transmission bookkeeping stay with the connection.
#[derive(Debug)]
pub struct SendQueue {
    committed: VecDeque<Record>,
    pending: VecDeque<Record>,
    /// First unacknowledged stream offset.
    una: u64,
    /// Offset just after the last committed byte (= start of the first pending write).
    committed_end: u64,
    pending_bytes: usize,
    limit: usize,
    merge_plain: bool,
}

impl SendQueue {
    pub(crate) fn new(limit: usize, merge_plain: bool) -> Self {
        SendQueue {
            committed: VecDeque::new(),
            pending: VecDeque::new(),
            una: 0,
            committed_end: 0,
            pending_bytes: 0,
            limit,
            merge_plain,
        }
    }

    /// Bytes held (unacknowledged plus unsent).
    pub fn len(&self) -> usize {
        (self.committed_end - self.una) as usize + self.pending_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Free space under the limit.
    pub fn free(&self) -> usize {
        self.limit.saturating_sub(self.len())
    }

    /// Stream offset just after the last byte queued.
    pub fn end(&self) -> u64 {
        self.committed_end + self.pending_bytes as u64
    }

    /// First unacknowledged offset.
    pub fn una(&self) -> u64 {
        self.una
    }

    /// Offset just after the last committed byte.
    pub fn committed_end(&self) -> u64 {
        self.committed_end
    }

    /// Appends as much of `data` as fits (standard TCP `send`). Returns the bytes accepted.
    pub(crate) fn push(&mut self, data: &[u8], tag: WriteTag) -> usize {
        let n = data.len().min(self.free());
        if n == 0 {
            return 0;
        }
        let data = &data[..n];
        if self.merge_plain
            && tag.is_plain()
            && let Some(last) = self.pending.back_mut()
            && last.tag.is_plain()
            && last.data.len() + n <= MERGE_LIMIT
        {
            last.data.extend_from_slice(data);
        } else {
            self.pending.push_back(Record {
                start: 0,
                data: data.to_vec(),
                tag,
            });
        }
        self.pending_bytes += n;
        n
    }

    /// Inserts a whole write ahead of every pending write of lower priority, never ahead of or
    /// inside a committed write (Minion §4.2). All or nothing: fails if it does not fit.
    pub(crate) fn insert_by_priority(&mut self, data: &[u8], tag: WriteTag) -> Result<(), Error> {
        if data.len() > self.free() {
            return Err(Error::WouldBlock);
        }
        if data.is_empty() {
            return Ok(());
        }
        let at = self
            .pending
            .iter()
            .position(|r| r.tag.priority < tag.priority)
            .unwrap_or(self.pending.len());
        self.pending.insert(
            at,
            Record {
                start: 0,
                data: data.to_vec(),
                tag,
            },
        );
        self.pending_bytes += data.len();
        Ok(())
    }

    /// Removes every pending (wholly untransmitted) write with this squash key (Minion §4.2).
    /// Returns the bytes removed.
    pub fn squash(&mut self, key: u64) -> usize {
        let before = self.pending_bytes;
        self.pending.retain(|r| r.tag.squash_key != Some(key));
        self.pending_bytes = self.pending.iter().map(|r| r.data.len()).sum();
        before - self.pending_bytes
    }

    /// Length of the next segment starting at `from` (which must lie in
    /// `[una, end)`), at most `max` bytes. With `consistent`, a segment never crosses a write
    /// boundary, so each write starts a new segment (Hollywood §4.2).
    pub(crate) fn segment_len(&self, from: u64, max: usize, consistent: bool) -> usize {
        if from < self.una || from >= self.end() {
            return 0;
        }
        let avail = (self.end() - from) as usize;
        let mut n = avail.min(max);
        if consistent {
            n = n.min((self.write_end_after(from) - from) as usize);
        }
        n
    }

    /// End offset of the write containing `from`.
    fn write_end_after(&self, from: u64) -> u64 {
        if from < self.committed_end {
            let i = self.committed.partition_point(|r| r.end() <= from);
            return self
                .committed
                .get(i)
                .map_or(self.committed_end, |r| r.end());
        }
        let mut start = self.committed_end;
        for r in &self.pending {
            let end = start + r.data.len() as u64;
            if from < end {
                return end;
            }
            start = end;
        }
        self.end()
    }

    /// Copies bytes starting at `from` into `out`, committing the pending writes this reaches
    /// (their first byte is being transmitted, so their offsets become fixed).
    pub(crate) fn copy_out(&mut self, from: u64, out: &mut [u8]) {
        let to = from + out.len() as u64;
        while self.committed_end < to {
            let Some(mut r) = self.pending.pop_front() else {
                break;
            };
            r.start = self.committed_end;
            self.committed_end = r.end();
            self.pending_bytes -= r.data.len();
            self.committed.push_back(r);
        }
        let mut i = self.committed.partition_point(|r| r.end() <= from);
        let mut pos = from;
        let mut written = 0;
        while written < out.len() {
            let Some(r) = self.committed.get(i) else {
                break;
            };
            let off = (pos - r.start) as usize;
            let n = (r.data.len() - off).min(out.len() - written);
            out[written..written + n].copy_from_slice(&r.data[off..off + n]);
            written += n;
            pos += n as u64;
            i += 1;
        }
    }

    /// Drops everything below `upto` (cumulative acknowledgment).
    pub(crate) fn ack(&mut self, upto: u64) {
        let upto = upto.min(self.committed_end);
        if upto <= self.una {
            return;
        }
        self.una = upto;
        while let Some(front) = self.committed.front() {
            if front.end() <= upto {
                self.committed.pop_front();
            } else {
                break;
            }
        }
    }

    /// Replaces committed, unacknowledged bytes at `from` with `bytes` of exactly the same
    /// length (Hollywood §4.2 inconsistent retransmission). The next (re)transmission of that
    /// range carries the new bytes.
    pub fn replace(&mut self, from: u64, bytes: &[u8]) -> Result<(), Error> {
        let to = from + bytes.len() as u64;
        if from < self.una || to > self.committed_end {
            return Err(Error::InvalidRange);
        }
        let mut i = self.committed.partition_point(|r| r.end() <= from);
        let mut pos = from;
        let mut done = 0;
        while done < bytes.len() {
            let Some(r) = self.committed.get_mut(i) else {
                return Err(Error::InvalidRange);
            };
            let off = (pos - r.start) as usize;
            let n = (r.data.len() - off).min(bytes.len() - done);
            r.data[off..off + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
            pos += n as u64;
            i += 1;
        }
        Ok(())
    }

    /// Committed writes overlapping `[from, to)`, for an upper layer choosing what to replace.
    pub fn committed_writes(&self, from: u64, to: u64) -> Vec<CommittedWrite> {
        let i = self.committed.partition_point(|r| r.end() <= from);
        self.committed
            .range(i..)
            .take_while(|r| r.start < to)
            .map(|r| CommittedWrite {
                start: r.start,
                len: r.data.len(),
                tag: r.tag,
            })
            .collect()
    }

    /// Tags of the pending writes in queue order, with their lengths.
    pub fn pending_writes(&self) -> impl Iterator<Item = (usize, &WriteTag)> {
        self.pending.iter().map(|r| (r.data.len(), &r.tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(q: &mut SendQueue) -> Vec<u8> {
        let mut out = vec![0; (q.end() - q.una()) as usize];
        let una = q.una();
        q.copy_out(una, &mut out);
        out
    }

    #[test]
    fn plain_appends_pack_across_writes() {
        let mut q = SendQueue::new(1000, true);
        assert_eq!(q.push(b"hello ", WriteTag::default()), 6);
        assert_eq!(q.push(b"world", WriteTag::default()), 5);
        assert_eq!(q.segment_len(0, 100, false), 11);
        let mut seg = [0u8; 8];
        q.copy_out(0, &mut seg);
        assert_eq!(&seg, b"hello wo");
        assert_eq!(q.committed_end(), 11);
        q.ack(8);
        assert_eq!(q.len(), 3);
        assert_eq!(read_all(&mut q), b"rld");
    }

    #[test]
    fn limit_and_partial_push() {
        let mut q = SendQueue::new(4, true);
        assert_eq!(q.push(b"abcdef", WriteTag::default()), 4);
        assert_eq!(q.push(b"x", WriteTag::default()), 0);
        assert_eq!(q.free(), 0);
    }

    #[test]
    fn consistent_segmentation_stops_at_write_boundaries() {
        let mut q = SendQueue::new(1000, false);
        q.push(b"aaa", WriteTag::default());
        q.push(b"bbbbb", WriteTag::default());
        assert_eq!(q.segment_len(0, 100, true), 3);
        assert_eq!(q.segment_len(3, 100, true), 5);
        assert_eq!(q.segment_len(4, 2, true), 2);
        assert_eq!(q.segment_len(0, 100, false), 8);
    }

    #[test]
    fn priority_insert_never_passes_committed_data() {
        let mut q = SendQueue::new(1000, false);
        let low = WriteTag::default();
        let high = WriteTag {
            priority: 5,
            ..Default::default()
        };
        q.push(b"LOW1", low);
        q.push(b"LOW2", low);
        // Transmit one byte of LOW1: it becomes committed.
        let mut one = [0u8; 1];
        q.copy_out(0, &mut one);
        q.insert_by_priority(b"HI", high).unwrap();
        assert_eq!(read_all(&mut q), b"LOW1HILOW2");
    }

    #[test]
    fn squash_removes_only_untransmitted_writes() {
        let mut q = SendQueue::new(1000, false);
        let tag = WriteTag {
            squash_key: Some(7),
            ..Default::default()
        };
        q.push(b"old1", tag);
        let mut one = [0u8; 1];
        q.copy_out(0, &mut one);
        q.push(b"old2", tag);
        q.push(b"other", WriteTag::default());
        assert_eq!(q.squash(7), 4);
        assert_eq!(read_all(&mut q), b"old1other");
    }

    #[test]
    fn replace_same_length_across_records() {
        let mut q = SendQueue::new(1000, false);
        q.push(b"abcd", WriteTag::default());
        q.push(b"efgh", WriteTag::default());
        let mut all = [0u8; 8];
        q.copy_out(0, &mut all);
        q.replace(2, b"XYZW").unwrap();
        assert_eq!(read_all(&mut q), b"abXYZWgh");
        assert_eq!(q.replace(6, b"123"), Err(Error::InvalidRange));
        q.ack(4);
        assert_eq!(q.replace(3, b"1"), Err(Error::InvalidRange));
        assert_eq!(q.committed_writes(0, 8).len(), 1);
    }
}
