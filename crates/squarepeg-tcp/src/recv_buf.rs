//! The receive side: in-order bytes awaiting the application, and a bounded range structure of
//! out-of-order data.
//!
//! Offsets are stream offsets (0 = first data byte). Every accepted data segment passes through
//! [`RecvBuffer::insert`], the single place where a later mode can also hand the segment to the
//! upper layer at once with its offset (Minion §4.1) while acknowledgment state and window stay
//! exactly as here.

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

#[derive(Debug)]
pub struct RecvBuffer {
    /// In-order bytes not yet read; the first is at offset `read_offset`.
    ready: VecDeque<u8>,
    read_offset: u64,
    /// Out-of-order data keyed by start offset, non-overlapping and all above `next()`.
    ooo: BTreeMap<u64, Vec<u8>>,
    ooo_bytes: usize,
    max_ranges: usize,
}

impl RecvBuffer {
    pub fn new(max_ranges: usize) -> Self {
        RecvBuffer {
            ready: VecDeque::new(),
            read_offset: 0,
            ooo: BTreeMap::new(),
            ooo_bytes: 0,
            max_ranges: max_ranges.max(1),
        }
    }

    /// Next in-order offset expected (RCV.NXT as a stream offset, before any FIN).
    pub fn next(&self) -> u64 {
        self.read_offset + self.ready.len() as u64
    }

    /// Offset of the next byte the application will read.
    pub fn read_offset(&self) -> u64 {
        self.read_offset
    }

    /// In-order bytes waiting to be read.
    pub fn readable(&self) -> usize {
        self.ready.len()
    }

    /// Out-of-order bytes held.
    pub fn ooo_bytes(&self) -> usize {
        self.ooo_bytes
    }

    /// Bytes of buffer in use (counted against the receive window).
    pub fn used(&self) -> usize {
        self.ready.len() + self.ooo_bytes
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
            self.ready.extend(data.iter());
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
        // Collect the uncovered pieces of [start, end).
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        let mut cursor = start;
        // The range that starts at or before `start` may cover its beginning.
        if let Some((&s, v)) = self.ooo.range(..=start).next_back() {
            let e = s + v.len() as u64;
            if e > cursor {
                cursor = e;
            }
        }
        for (&s, v) in self.ooo.range(start..end) {
            if s > cursor {
                pieces.push((cursor, s));
            }
            cursor = cursor.max(s + v.len() as u64);
        }
        if cursor < end {
            pieces.push((cursor, end));
        }
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
        for (s, e) in pieces {
            let a = (s - start) as usize;
            let b = (e - start) as usize;
            self.ooo_bytes += b - a;
            // Extend the range ending at `s`, or start a new one.
            let key = match self.ooo.range_mut(..s).next_back() {
                Some((&ls, lv)) if ls + lv.len() as u64 == s => {
                    lv.extend_from_slice(&data[a..b]);
                    ls
                }
                _ => {
                    self.ooo.insert(s, data[a..b].to_vec());
                    s
                }
            };
            // Absorb the range starting at `e`.
            if let Some(next) = self.ooo.remove(&e)
                && let Some(v) = self.ooo.get_mut(&key)
            {
                v.extend_from_slice(&next);
            }
        }
        true
    }

    /// Whether an out-of-order range ends exactly at `s`.
    fn touches_left(&self, s: u64) -> bool {
        self.ooo
            .range(..s)
            .next_back()
            .is_some_and(|(&ls, v)| ls + v.len() as u64 == s)
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
            let v = entry.remove();
            self.ooo_bytes -= v.len();
            let e = s + v.len() as u64;
            if e > next {
                let skip = (next - s) as usize;
                self.ready.extend(v[skip..].iter());
                moved += v.len() - skip;
            }
        }
        moved
    }

    /// Reads in-order bytes into `buf`.
    pub fn read(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.ready.len());
        let (a, b) = self.ready.as_slices();
        let from_a = n.min(a.len());
        buf[..from_a].copy_from_slice(&a[..from_a]);
        buf[from_a..n].copy_from_slice(&b[..n - from_a]);
        self.ready.drain(..n);
        self.read_offset += n as u64;
        n
    }

    /// Contiguous out-of-order ranges `[start, end)` in ascending order (for SACK blocks).
    pub fn ooo_ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (&s, v) in &self.ooo {
            let e = s + v.len() as u64;
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        out
    }

    /// The contiguous out-of-order range containing `offset`, if any.
    pub fn ooo_range_containing(&self, offset: u64) -> Option<(u64, u64)> {
        self.ooo_ranges()
            .into_iter()
            .find(|&(s, e)| s <= offset && offset < e)
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
}
