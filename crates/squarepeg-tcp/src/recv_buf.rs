//! The receive side: in-order bytes awaiting the application, and a bounded range structure of
//! out-of-order data.
//!
//! Offsets are stream offsets (0 = first data byte). Every accepted data segment passes through
//! [`RecvBuffer::insert`]; acknowledgments, SACK blocks and the window are computed from what
//! this structure holds, whichever way the application reads.
//!
//! In the uTCP "every segment at once" mode (Minion §4.1) the connection hands each segment's
//! bytes to the application on arrival, so the buffer keeps no content
//! ([`RecvBuffer::drop_content`]): only the in-order point, the count of in-order bytes the
//! application has not yet consumed, and the out-of-order ranges. Those counts are what the
//! window is computed from, so the wire sees exactly the standard behaviour.

use std::collections::{BTreeMap, VecDeque};

/// Outcome of inserting a segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    /// Bytes that became readable in order.
    pub delivered: usize,
    /// Whether the segment was (partly) above the in-order point.
    pub out_of_order: bool,
    /// Whether the segment filled (part of) a gap below out-of-order data.
    pub filled_gap: bool,
    /// Whether the segment was dropped because the out-of-order range limit was reached.
    pub dropped: bool,
}

/// One out-of-order range: its end, and its bytes unless content is not kept.
#[derive(Debug)]
struct Range {
    end: u64,
    data: Vec<u8>,
}

#[derive(Debug)]
pub struct RecvBuffer {
    /// In-order bytes not yet read; the first is at offset `read_offset` (empty when content
    /// is not kept).
    ready: VecDeque<u8>,
    /// In-order bytes not yet consumed (= `ready.len()` when content is kept).
    ready_len: usize,
    read_offset: u64,
    /// Out-of-order ranges keyed by start offset, non-overlapping, coalesced and all above
    /// `next()`.
    ooo: BTreeMap<u64, Range>,
    ooo_bytes: usize,
    max_ranges: usize,
    keep_content: bool,
}

impl RecvBuffer {
    pub fn new(max_ranges: usize) -> Self {
        RecvBuffer {
            ready: VecDeque::new(),
            ready_len: 0,
            read_offset: 0,
            ooo: BTreeMap::new(),
            ooo_bytes: 0,
            max_ranges: max_ranges.max(1),
            keep_content: true,
        }
    }

    /// Next in-order offset expected (RCV.NXT as a stream offset, before any FIN).
    pub fn next(&self) -> u64 {
        self.read_offset + self.ready_len as u64
    }

    /// Offset of the next byte the application will read (or consume).
    pub fn read_offset(&self) -> u64 {
        self.read_offset
    }

    /// In-order bytes waiting to be read (or consumed).
    pub fn readable(&self) -> usize {
        self.ready_len
    }

    /// Out-of-order bytes held.
    pub fn ooo_bytes(&self) -> usize {
        self.ooo_bytes
    }

    /// Bytes of buffer in use (counted against the receive window).
    pub fn used(&self) -> usize {
        self.ready_len + self.ooo_bytes
    }

    /// Stops keeping content (the application receives every segment on arrival). Returns
    /// the content held so far, as (offset, bytes) pieces to hand over: the unread in-order
    /// bytes, then each out-of-order range. Counts and ranges stay.
    pub fn drop_content(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        if !self.keep_content {
            return out;
        }
        self.keep_content = false;
        if !self.ready.is_empty() {
            out.push((self.read_offset, self.ready.drain(..).collect()));
        }
        for (&s, r) in self.ooo.iter_mut() {
            out.push((s, std::mem::take(&mut r.data)));
        }
        out
    }

    /// The parts of `[start, end)` that are neither below the in-order point nor held out of
    /// order: what a segment with these bounds would add.
    pub fn uncovered(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut pieces = Vec::new();
        let mut cursor = start.max(self.next());
        if let Some((_, r)) = self.ooo.range(..=cursor).next_back()
            && r.end > cursor
        {
            cursor = r.end;
        }
        if cursor >= end {
            return pieces;
        }
        for (&s, r) in self.ooo.range(cursor..end) {
            if s > cursor {
                pieces.push((cursor, s));
            }
            cursor = cursor.max(r.end);
        }
        if cursor < end {
            pieces.push((cursor, end));
        }
        pieces
    }

    /// Inserts the payload of a segment at stream offset `start`. The caller has trimmed it to
    /// the receive window; bytes below `next()` are ignored here.
    pub fn insert(&mut self, mut start: u64, mut data: &[u8]) -> InsertOutcome {
        let mut outcome = InsertOutcome::default();
        let next = self.next();
        if start < next {
            let skip = (next - start).min(data.len() as u64) as usize;
            data = &data[skip..];
            start += skip as u64;
        }
        if data.is_empty() {
            return outcome;
        }
        if start == next {
            if self.keep_content {
                self.ready.extend(data.iter());
            }
            self.ready_len += data.len();
            outcome.delivered = data.len();
            if !self.ooo.is_empty() {
                outcome.filled_gap = true;
                outcome.delivered += self.pull_contiguous();
            }
            return outcome;
        }
        outcome.out_of_order = true;
        if !self.insert_ooo(start, data) {
            outcome.dropped = true;
        }
        outcome
    }

    /// Stores an out-of-order range, keeping existing bytes where ranges overlap.
    fn insert_ooo(&mut self, start: u64, data: &[u8]) -> bool {
        let end = start + data.len() as u64;
        let pieces = self.uncovered(start, end);
        if pieces.is_empty() {
            return true;
        }
        // Entries are kept coalesced, so the bound counts discontiguous ranges: a piece
        // touching an existing range extends it instead of adding one.
        let new_ranges = pieces
            .iter()
            .filter(|&&(s, e)| !self.touches_left(s) && !self.ooo.contains_key(&e))
            .count();
        if self.ooo.len() + new_ranges > self.max_ranges {
            return false;
        }
        let keep = self.keep_content;
        for (s, e) in pieces {
            let a = (s - start) as usize;
            let b = (e - start) as usize;
            self.ooo_bytes += b - a;
            // Extend the range ending at `s`, or start a new one.
            let key = match self.ooo.range_mut(..s).next_back() {
                Some((&ls, lr)) if lr.end == s => {
                    if keep {
                        lr.data.extend_from_slice(&data[a..b]);
                    }
                    lr.end = e;
                    ls
                }
                _ => {
                    let bytes = if keep {
                        data[a..b].to_vec()
                    } else {
                        Vec::new()
                    };
                    self.ooo.insert(
                        s,
                        Range {
                            end: e,
                            data: bytes,
                        },
                    );
                    s
                }
            };
            // Absorb the range starting at `e`.
            if let Some(next) = self.ooo.remove(&e)
                && let Some(r) = self.ooo.get_mut(&key)
            {
                if keep {
                    r.data.extend_from_slice(&next.data);
                }
                r.end = next.end;
            }
        }
        true
    }

    /// Whether an out-of-order range ends exactly at `s`.
    fn touches_left(&self, s: u64) -> bool {
        self.ooo
            .range(..s)
            .next_back()
            .is_some_and(|(_, r)| r.end == s)
    }

    /// Moves out-of-order data that now continues the in-order stream into `ready`.
    fn pull_contiguous(&mut self) -> usize {
        let mut moved = 0;
        loop {
            let next = self.next();
            let Some(entry) = self.ooo.first_entry() else {
                break;
            };
            let s = *entry.key();
            if s > next {
                break;
            }
            let r = entry.remove();
            self.ooo_bytes -= (r.end - s) as usize;
            if r.end > next {
                let skip = (next - s) as usize;
                if self.keep_content {
                    self.ready.extend(r.data[skip..].iter());
                }
                let n = (r.end - next) as usize;
                self.ready_len += n;
                moved += n;
            }
        }
        moved
    }

    /// Reads in-order bytes into `buf` (content mode).
    pub fn read(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.ready.len());
        let (a, b) = self.ready.as_slices();
        let from_a = n.min(a.len());
        buf[..from_a].copy_from_slice(&a[..from_a]);
        buf[from_a..n].copy_from_slice(&b[..n - from_a]);
        self.ready.drain(..n);
        self.read_offset += n as u64;
        self.ready_len -= n;
        n
    }

    /// Consumes in-order bytes up to `offset` without reading them (the application had them
    /// on arrival); `offset` is clamped to `[read_offset, next()]`. Returns the bytes consumed.
    pub fn consume_to(&mut self, offset: u64) -> usize {
        let to = offset.clamp(self.read_offset, self.next());
        let n = (to - self.read_offset) as usize;
        if self.keep_content {
            self.ready.drain(..n);
        }
        self.read_offset = to;
        self.ready_len -= n;
        n
    }

    /// Drops the highest out-of-order range (memory pressure, as Linux's
    /// `tcp_prune_ofo_queue`). Returns the bytes freed.
    pub fn prune_last_ooo(&mut self) -> usize {
        let Some((s, r)) = self.ooo.pop_last() else {
            return 0;
        };
        let n = (r.end - s) as usize;
        self.ooo_bytes -= n;
        n
    }

    /// Contiguous out-of-order ranges `[start, end)` in ascending order (for SACK blocks).
    pub fn ooo_ranges(&self) -> Vec<(u64, u64)> {
        self.ooo.iter().map(|(&s, r)| (s, r.end)).collect()
    }

    /// Panics if the structure is inconsistent: counts match the content, out-of-order ranges
    /// are non-empty, disjoint, not touching (coalesced), above the in-order point and within
    /// the range bound.
    pub(crate) fn check_invariants(&self) {
        if self.keep_content {
            assert_eq!(self.ready.len(), self.ready_len, "ready bytes miscounted");
        } else {
            assert!(self.ready.is_empty(), "content kept after drop_content");
        }
        assert!(
            self.ooo.len() <= self.max_ranges,
            "more ranges than the bound"
        );
        let mut bytes = 0usize;
        let mut prev_end = self.next();
        for (i, (&s, r)) in self.ooo.iter().enumerate() {
            assert!(s < r.end, "empty out-of-order range at {s}");
            if i == 0 {
                assert!(
                    s > prev_end,
                    "out-of-order range {s}.. at or below the in-order point"
                );
            } else {
                assert!(s > prev_end, "out-of-order ranges overlap or touch at {s}");
            }
            if self.keep_content {
                assert_eq!(r.data.len() as u64, r.end - s, "range {s}.. content length");
            }
            bytes += (r.end - s) as usize;
            prev_end = r.end;
        }
        assert_eq!(bytes, self.ooo_bytes, "out-of-order bytes miscounted");
    }

    /// The contiguous out-of-order range containing `offset`, if any.
    pub fn ooo_range_containing(&self, offset: u64) -> Option<(u64, u64)> {
        self.ooo
            .range(..=offset)
            .next_back()
            .filter(|(_, r)| offset < r.end)
            .map(|(&s, r)| (s, r.end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_then_gap_fill() {
        let mut r = RecvBuffer::new(16);
        assert_eq!(r.insert(0, b"abc").delivered, 3);
        let o = r.insert(6, b"ghi");
        assert!(o.out_of_order);
        assert_eq!(r.ooo_ranges(), vec![(6, 9)]);
        let o = r.insert(3, b"def");
        assert!(o.filled_gap);
        assert_eq!(o.delivered, 6);
        let mut buf = [0u8; 20];
        assert_eq!(r.read(&mut buf), 9);
        assert_eq!(&buf[..9], b"abcdefghi");
        assert_eq!(r.ooo_bytes(), 0);
    }

    #[test]
    fn overlapping_ooo_keeps_first_bytes_and_merges_ranges() {
        let mut r = RecvBuffer::new(16);
        r.insert(10, b"KLMN");
        r.insert(8, b"xxYYYYzz"); // covers 8..16, existing 10..14 kept
        assert_eq!(r.ooo_ranges(), vec![(8, 16)]);
        assert_eq!(r.ooo_bytes(), 8);
        r.insert(0, b"01234567");
        let mut buf = [0u8; 32];
        let n = r.read(&mut buf);
        assert_eq!(&buf[..n], b"01234567xxKLMNzz");
    }

    #[test]
    fn adjacent_segments_coalesce_into_one_range() {
        let mut r = RecvBuffer::new(1);
        for i in 1..100u64 {
            assert!(!r.insert(i * 10, &[i as u8; 10]).dropped, "segment {i}");
        }
        assert_eq!(r.ooo_ranges(), vec![(10, 1000)]);
        // Filling the gap between two ranges joins them.
        let mut r = RecvBuffer::new(2);
        r.insert(30, b"cc");
        r.insert(10, b"aa");
        assert_eq!(r.ooo_ranges(), vec![(10, 12), (30, 32)]);
        r.insert(12, &[b'b'; 18]);
        assert_eq!(r.ooo_ranges(), vec![(10, 32)]);
        r.insert(0, &[b'0'; 10]);
        let mut buf = [0u8; 64];
        let n = r.read(&mut buf);
        assert_eq!(n, 32);
        assert_eq!(&buf[10..12], b"aa");
        assert_eq!(&buf[30..32], b"cc");
    }

    #[test]
    fn range_limit_drops_new_ranges() {
        let mut r = RecvBuffer::new(2);
        assert!(!r.insert(10, b"a").dropped);
        assert!(!r.insert(20, b"b").dropped);
        assert!(r.insert(30, b"c").dropped);
        assert_eq!(r.ooo_bytes(), 2);
        // Duplicate of held data is not a drop.
        assert!(!r.insert(10, b"a").dropped);
    }

    #[test]
    fn uncovered_pieces_skip_held_and_in_order_bytes() {
        let mut r = RecvBuffer::new(16);
        r.insert(0, b"0123");
        r.insert(8, b"89");
        r.insert(12, b"cd");
        assert_eq!(r.uncovered(0, 4), vec![]);
        assert_eq!(r.uncovered(2, 16), vec![(4, 8), (10, 12), (14, 16)]);
        assert_eq!(r.uncovered(9, 11), vec![(10, 11)]);
        assert_eq!(r.uncovered(8, 9), vec![]);
        assert_eq!(r.uncovered(1, 3), vec![]);
        assert_eq!(r.ooo_range_containing(9), Some((8, 10)));
        assert_eq!(r.ooo_range_containing(10), None);
    }

    #[test]
    fn without_content_the_counts_and_ranges_are_the_same() {
        let segments: [(u64, &[u8]); 6] = [
            (0, b"abc"),
            (6, b"ghi"),
            (12, b"mn"),
            (3, b"de"),
            (5, b"fghijk"),
            (1, b"bcd"),
        ];
        let mut with = RecvBuffer::new(16);
        let mut without = RecvBuffer::new(16);
        assert!(without.drop_content().is_empty());
        for (s, d) in segments {
            assert_eq!(with.insert(s, d), without.insert(s, d));
            assert_eq!(with.ooo_ranges(), without.ooo_ranges());
            assert_eq!(with.used(), without.used());
            assert_eq!(with.next(), without.next());
        }
        assert_eq!(without.ooo_ranges(), vec![(12, 14)]);
        assert_eq!(without.consume_to(100), 11);
        assert_eq!(without.used(), 2);
        assert_eq!(without.read_offset(), 11);
    }

    #[test]
    fn dropping_content_hands_over_what_was_held() {
        let mut r = RecvBuffer::new(16);
        r.insert(0, b"abc");
        let mut one = [0u8; 1];
        r.read(&mut one);
        r.insert(6, b"gh");
        let held = r.drop_content();
        assert_eq!(held, vec![(1, b"bc".to_vec()), (6, b"gh".to_vec())]);
        assert_eq!(r.used(), 4);
        assert_eq!(r.consume_to(3), 2);
        r.insert(3, b"def");
        assert_eq!(r.next(), 8);
    }
}
