//! Pieces of the out-of-order receive path (Minion §6): numbered-record prefixes, the replay
//! window, and the store of ciphertext fragments that arrived ahead of the in-order stream.
//! [`crate::Tls::push_segment`] puts them together.
//!
//! # Numbered records (docs/wire.md §5)
//!
//! Between squarepeg peers, once the receiver has announced (under encryption) that it reads
//! them and the sender has sent the switch marker (an empty application-data record, legal
//! TLS 1.3), every record the sender seals begins with a 5-byte prefix:
//!
//! ```text
//! prefix = big-endian 40 bits: (sequence number mod 2^37) << 3 | flags
//! flags  = CONTROL (4): not application data | STARTS_INSIDE (2) | ENDS_INSIDE (1)
//! ```
//!
//! The sequence number is the record's own nonce number (RFC 8446 §5.3), so it is what the
//! AEAD authenticates; it only travels inside the encryption. A receiver handed a record out
//! of order recovers its number by trying candidates: one keystream block per candidate
//! ([`crate::record::RecordKeys::keystream_prefix`]) decrypts the prefix, and only a
//! candidate whose prefix names itself costs a full AEAD open. The flags say whether the
//! record's content is a whole unit (a squarepeg record carries whole frames unless a frame
//! is longer than a record): only whole application-data records are delivered out of order;
//! the rest wait for the in-order stream. Because numbers come from the record, the sender
//! may put records on the wire in another order than it sealed them (priorities, Minion §4.2)
//! and a replacement carries records with numbers of their own.

use std::collections::BTreeMap;

/// Length of a numbered record's prefix.
pub const NUMBER_PREFIX_LEN: usize = 5;

/// Flags in a numbered record's prefix.
pub mod number_flag {
    /// The content continues a unit begun in the record before.
    pub const STARTS_INSIDE: u8 = 0b001 << 1;
    /// The content's last unit continues in the next record.
    pub const ENDS_INSIDE: u8 = 0b001;
    /// The record is not application data (an alert or a KeyUpdate).
    pub const CONTROL: u8 = 0b100;
    /// All flags.
    pub const ALL: u8 = 0b111;
}

/// Bits of the sequence number the prefix carries.
const NUMBER_BITS: u32 = 37;
const NUMBER_MASK: u64 = (1 << NUMBER_BITS) - 1;

/// The prefix of record `number` with `flags`.
pub fn encode_prefix(number: u64, flags: u8) -> [u8; NUMBER_PREFIX_LEN] {
    let value = ((number & NUMBER_MASK) << 3) | u64::from(flags & number_flag::ALL);
    let bytes = value.to_be_bytes();
    bytes[3..].try_into().expect("5 bytes")
}

/// If the decrypted `prefix` names `number`, its flags.
pub fn prefix_flags(prefix: [u8; NUMBER_PREFIX_LEN], number: u64) -> Option<u8> {
    let mut bytes = [0u8; 8];
    bytes[3..].copy_from_slice(&prefix);
    let value = u64::from_be_bytes(bytes);
    (value >> 3 == number & NUMBER_MASK).then_some((value & 0b111) as u8)
}

/// Record numbers at most this far apart are told apart by the replay window: a record whose
/// number is older than the newest opened by more than this is refused. It must exceed the
/// records a sender may hold unsent while later ones overtake them (its tagged queue), which
/// a 256 KiB send buffer of the smallest records (about 40 bytes) stays below.
pub const REPLAY_WINDOW: u64 = 16 * 1024;

/// Numbers tried above the newest number opened (records sealed later that arrive first).
pub const LOOKAHEAD: u64 = 4 * 1024;

/// Most candidate numbers tried for one record before giving up (one keystream block each).
pub const MAX_NUMBER_TRIES: u32 = (REPLAY_WINDOW + LOOKAHEAD) as u32;

/// Which record numbers of one key were opened: each number is delivered at most once (a
/// replayed or duplicated record is refused), and numbers below the window count as seen.
#[derive(Clone, Debug)]
pub struct ReplayWindow {
    /// Lowest number not known to be seen.
    base: u64,
    /// Highest number seen, if any.
    top: Option<u64>,
    /// Bit `n % REPLAY_WINDOW` for each number `n` in `base..base + REPLAY_WINDOW`.
    bits: Box<[u64]>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::starting_at(0)
    }
}

impl ReplayWindow {
    /// A window whose numbers below `base` count as seen.
    pub fn starting_at(base: u64) -> Self {
        Self {
            base,
            top: None,
            bits: vec![0u64; (REPLAY_WINDOW / 64) as usize].into_boxed_slice(),
        }
    }

    fn bit(n: u64) -> (usize, u64) {
        let i = n % REPLAY_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether `n` was seen (or is below the window).
    pub fn seen(&self, n: u64) -> bool {
        if n < self.base {
            return true;
        }
        if n >= self.base + REPLAY_WINDOW {
            return false;
        }
        let (word, mask) = Self::bit(n);
        self.bits[word] & mask != 0
    }

    /// Marks `n` seen; false if it already was.
    pub fn insert(&mut self, n: u64) -> bool {
        if self.seen(n) {
            return false;
        }
        if n >= self.base + REPLAY_WINDOW {
            let new_base = n - REPLAY_WINDOW + 1;
            if new_base - self.base >= REPLAY_WINDOW {
                self.bits.fill(0);
            } else {
                for old in self.base..new_base {
                    let (word, mask) = Self::bit(old);
                    self.bits[word] &= !mask;
                }
            }
            self.base = new_base;
        }
        let (word, mask) = Self::bit(n);
        self.bits[word] |= mask;
        self.top = Some(self.top.map_or(n, |t| t.max(n)));
        // Slide past the run of seen numbers at the bottom, so that `base` stays the lowest
        // unseen one (searches start there) and their bits are free for numbers to come.
        loop {
            let (word, mask) = Self::bit(self.base);
            if self.bits[word] & mask == 0 {
                break;
            }
            self.bits[word] &= !mask;
            self.base += 1;
        }
        true
    }

    /// The highest number seen.
    pub fn top(&self) -> Option<u64> {
        self.top
    }

    /// Lowest number not seen.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Numbers seen (or below the base) within [`REPLAY_WINDOW`] of the newest, newest first:
    /// the candidates for a duplicate.
    pub fn seen_numbers(&self) -> impl Iterator<Item = u64> + '_ {
        let top = self.top.unwrap_or(0);
        let low = top.saturating_sub(REPLAY_WINDOW);
        let any = self.top.is_some();
        (low..=top).rev().filter(move |&n| any && self.seen(n))
    }

    /// Unseen candidate numbers, nearest to `hint` first (alternating above and below),
    /// between the window's base and [`LOOKAHEAD`] above the newest seen (or the hint).
    pub fn candidates(&self, hint: u64) -> impl Iterator<Item = u64> + '_ {
        let lo = self.base;
        let hi = self
            .top
            .map_or(hint, |t| t.max(hint))
            .saturating_add(LOOKAHEAD)
            .min(lo.saturating_add(REPLAY_WINDOW + LOOKAHEAD));
        let hint = hint.clamp(lo, hi);
        let mut up = hint;
        let mut down = hint;
        let mut next_up = true;
        std::iter::from_fn(move || {
            loop {
                let can_up = up <= hi;
                let can_down = down > lo;
                if !can_up && !can_down {
                    return None;
                }
                let n = if (next_up && can_up) || !can_down {
                    let n = up;
                    up += 1;
                    n
                } else {
                    down -= 1;
                    down
                };
                next_up = !next_up;
                if !self.seen(n) {
                    return Some(n);
                }
            }
        })
        .take(MAX_NUMBER_TRIES as usize)
    }
}

/// A run of contiguous ciphertext beyond the in-order stream.
#[derive(Debug)]
pub(crate) struct Fragment {
    pub(crate) bytes: Vec<u8>,
    /// Where scanning resumes, relative to the fragment's start.
    pub(crate) cursor: usize,
    /// What is known of `cursor`.
    pub(crate) at: CursorAt,
}

/// What is known of a fragment's scan position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CursorAt {
    /// A pattern-scan position: a record may start at any byte from here.
    Scan,
    /// Right after a record whose prefix named its number, not opened: a record boundary,
    /// `next` (the number after it) the first number tried there.
    AfterNamed { next: u64 },
    /// Right after a record that authenticated, opened here or delivered out of order
    /// before: a record boundary that the in-order stream, should it get here, reads a
    /// record at too (it passes a record delivered out of order by its extent). `next` is
    /// the first number tried there.
    AfterOpened { next: u64 },
}

impl CursorAt {
    /// The number to try first at the cursor, if it is a record boundary.
    pub(crate) fn hint(self) -> Option<u64> {
        match self {
            CursorAt::Scan => None,
            CursorAt::AfterNamed { next } | CursorAt::AfterOpened { next } => Some(next),
        }
    }
}

/// Ciphertext fragments ahead of the in-order stream, by stream offset: non-overlapping and
/// non-adjacent (adjacent ones are merged). Where two copies of a range differ, the first to
/// arrive is kept. Holds at most `limit` bytes.
///
/// Bytes that continue a fragment are appended to it (the common case: segments arriving in
/// order behind a hole); an emptied buffer handed back ([`SegmentStore::recycle`]) starts the
/// next fragment. The fragments' buffers hold at most twice `limit` plus what their growth
/// (doubling) adds: a recycled buffer starts a fragment only within that bound.
#[derive(Debug)]
pub(crate) struct SegmentStore {
    pub(crate) fragments: BTreeMap<u64, Fragment>,
    bytes: usize,
    limit: usize,
    /// Capacity of the fragments' buffers.
    capacity: usize,
    /// An empty buffer for the next fragment.
    spare: Vec<u8>,
}

/// Largest buffer kept for reuse.
pub(crate) const MAX_SPARE: usize = 64 * 1024;

impl SegmentStore {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            fragments: BTreeMap::new(),
            bytes: 0,
            limit,
            capacity: 0,
            spare: Vec::new(),
        }
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> usize {
        self.bytes
    }

    /// Keeps `buffer` (emptied) for a fragment to come, if it is larger than the one kept and
    /// not larger than [`MAX_SPARE`] nor than a fragment may ever take ([`Self::buffer_for`]:
    /// twice the limit; a larger one would be kept and never used).
    pub(crate) fn recycle(&mut self, mut buffer: Vec<u8>) {
        let most = MAX_SPARE.min(self.limit.saturating_mul(2));
        if buffer.capacity() > self.spare.capacity() && buffer.capacity() <= most {
            buffer.clear();
            self.spare = buffer;
        }
    }

    /// A buffer holding `piece`: the spare one if the fragments' buffers stay within twice
    /// the limit with it.
    fn buffer_for(&mut self, piece: &[u8]) -> Vec<u8> {
        let spare = self.spare.capacity();
        let mut buffer = if spare >= piece.len()
            && self.capacity.saturating_add(spare) <= self.limit.saturating_mul(2)
        {
            std::mem::take(&mut self.spare)
        } else {
            Vec::with_capacity(piece.len())
        };
        buffer.extend_from_slice(piece);
        buffer
    }

    /// Adds `data` at stream `offset`, ignoring what lies below `floor` (already in order)
    /// and what is already held. Returns the bytes refused for lack of room.
    pub(crate) fn insert(&mut self, floor: u64, offset: u64, data: &[u8]) -> usize {
        let end = offset.saturating_add(data.len() as u64);
        let start = offset.max(floor);
        if start >= end {
            return 0;
        }
        let mut refused = 0;
        let mut pos = start;
        while pos < end {
            // The fragment that holds `pos`, or the one that ends exactly there, and the next
            // one; at or past the end of the last one (bytes arriving in order behind a
            // hole) without a search.
            let last_end = self
                .fragments
                .last_key_value()
                .map(|(&s, f)| s + f.bytes.len() as u64);
            let (appending, following) = if last_end.is_none_or(|e| pos >= e) {
                (last_end == Some(pos), None)
            } else {
                let appending = match self.fragments.range(..=pos).next_back() {
                    Some((&s, f)) if s + f.bytes.len() as u64 > pos => {
                        pos = s + f.bytes.len() as u64;
                        continue;
                    }
                    Some((&s, f)) => s + f.bytes.len() as u64 == pos,
                    None => false,
                };
                let following = self.fragments.range(pos + 1..).next().map(|(&s, _)| s);
                (appending, following)
            };
            let next = following.map_or(end, |s| s.min(end));
            let piece = &data[(pos - offset) as usize..(next - offset) as usize];
            let room = self.limit.saturating_sub(self.bytes);
            if piece.len() > room {
                refused += piece.len() - room;
                if room == 0 {
                    pos = next;
                    continue;
                }
            }
            let piece = &piece[..piece.len().min(room)];
            self.bytes += piece.len();
            let at = if appending {
                let (s, f) = if following.is_none() {
                    let last = self.fragments.last_entry().expect("present");
                    (*last.key(), last.into_mut())
                } else {
                    let (&s, f) = self
                        .fragments
                        .range_mut(..pos)
                        .next_back()
                        .expect("present");
                    (s, f)
                };
                let before = f.bytes.capacity();
                f.bytes.extend_from_slice(piece);
                self.capacity = self.capacity - before + f.bytes.capacity();
                s
            } else {
                let bytes = self.buffer_for(piece);
                self.capacity += bytes.capacity();
                self.fragments.insert(
                    pos,
                    Fragment {
                        bytes,
                        cursor: 0,
                        at: CursorAt::Scan,
                    },
                );
                pos
            };
            if following == Some(pos + piece.len() as u64) {
                self.merge(at, pos + piece.len() as u64);
            }
            pos = next;
        }
        refused
    }

    /// Appends the fragment at `next` to the one at `at`, which ends there.
    fn merge(&mut self, at: u64, next: u64) {
        let Some(b) = self.fragments.remove(&next) else {
            return;
        };
        let a = self.fragments.get_mut(&at).expect("present");
        let a_len = a.bytes.len();
        debug_assert_eq!(at + a_len as u64, next);
        if a.cursor >= a_len {
            // Everything of `a` was scanned: go on where `b` was.
            a.cursor = a_len + b.cursor;
            if !(a.at != CursorAt::Scan && b.cursor == 0) {
                a.at = b.at;
            }
        }
        let before = a.bytes.capacity();
        a.bytes.extend_from_slice(&b.bytes);
        self.capacity = self.capacity - before + a.bytes.capacity() - b.bytes.capacity();
        self.recycle(b.bytes);
    }

    /// Removes and returns the fragment that starts exactly at `offset`.
    pub(crate) fn take_at(&mut self, offset: u64) -> Option<Vec<u8>> {
        // Called at the in-order offset, below which nothing is held: the first fragment.
        let f = match self.fragments.first_key_value() {
            Some((&first, _)) if first == offset => self.fragments.pop_first()?.1,
            Some((&first, _)) if first < offset => self.fragments.remove(&offset)?,
            _ => return None,
        };
        self.bytes -= f.bytes.len();
        self.capacity -= f.bytes.capacity();
        Some(f.bytes)
    }

    /// Drops what lies below `floor`.
    pub(crate) fn drop_below(&mut self, floor: u64) {
        while let Some((&s, f)) = self.fragments.first_key_value() {
            let end = s + f.bytes.len() as u64;
            if s >= floor {
                return;
            }
            let mut f = self.fragments.remove(&s).expect("present");
            self.bytes -= f.bytes.len();
            if end > floor {
                let cut = (floor - s) as usize;
                f.bytes.drain(..cut);
                f.cursor = f.cursor.saturating_sub(cut);
                if f.cursor == 0 {
                    f.at = CursorAt::Scan;
                }
                self.bytes += f.bytes.len();
                self.fragments.insert(floor, f);
                return;
            }
            self.capacity -= f.bytes.capacity();
            self.recycle(f.bytes);
        }
    }
}

/// A record opened out of order, before the bytes ahead of it arrived.
#[derive(Debug)]
pub struct OutOfOrderRecord<'a> {
    /// Stream offset of the record's header.
    pub offset: u64,
    /// Its length on the wire, header included.
    pub wire_len: usize,
    /// Its sequence number (under its key epoch).
    pub number: u64,
    /// The application data it carries (prefix and padding removed).
    pub content: &'a [u8],
}

/// How the out-of-order receive path works (see [`crate::Tls::enable_out_of_order`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutOfOrderConfig {
    /// Bytes of ciphertext held ahead of the in-order stream (the transport's receive
    /// window; more is refused and arrives again in order).
    pub window: usize,
    /// Records of a stock sender (numbers implied by position): sequence numbers tried per
    /// out-of-order candidate, each costing one AEAD open (Minion §6.1 prediction); 0: such
    /// records wait for the in-order stream.
    pub predictions: u32,
}

impl OutOfOrderConfig {
    /// Holds `window` bytes ahead; 4 predictions per candidate.
    pub fn new(window: usize) -> Self {
        Self {
            window,
            predictions: 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_round_trip() {
        for n in [0, 1, 77, NUMBER_MASK, NUMBER_MASK + 5, u64::MAX - 1] {
            for flags in 0..8 {
                let p = encode_prefix(n, flags);
                assert_eq!(prefix_flags(p, n), Some(flags));
                assert_eq!(prefix_flags(p, n + 1), None);
            }
        }
    }

    #[test]
    fn prefix_matches_the_wire_md_example() {
        // docs/wire.md §5.
        assert_eq!(encode_prefix(5, 0), [0, 0, 0, 0, 0x28]);
        assert_eq!(
            encode_prefix((1 << 37) + 1, number_flag::CONTROL),
            [0, 0, 0, 0, 0x0c]
        );
    }

    #[test]
    fn store_merges_a_segment_that_just_touches_its_neighbours() {
        let mut s = SegmentStore::new(100);
        s.insert(0, 0, &[1; 10]);
        s.insert(0, 20, &[3; 10]);
        s.insert(0, 10, &[2; 10]);
        assert_eq!(s.fragments.len(), 1);
        assert_eq!(s.fragments[&0].bytes.len(), 30);
    }

    impl SegmentStore {
        /// The bookkeeping matches the fragments.
        fn check(&self) {
            let bytes: usize = self.fragments.values().map(|f| f.bytes.len()).sum();
            let capacity: usize = self.fragments.values().map(|f| f.bytes.capacity()).sum();
            assert_eq!((self.bytes, self.capacity), (bytes, capacity));
            let mut end = None;
            for (&s, f) in &self.fragments {
                assert!(!f.bytes.is_empty());
                assert!(end.is_none_or(|e| e < s), "overlapping or adjacent");
                end = Some(s + f.bytes.len() as u64);
            }
        }
    }

    #[test]
    fn store_appends_behind_a_hole_keeping_the_scan_state() {
        let mut s = SegmentStore::new(10_000);
        s.insert(0, 100, &[1; 10]);
        {
            let f = s.fragments.get_mut(&100).unwrap();
            f.cursor = 4;
            f.at = CursorAt::AfterNamed { next: 7 };
        }
        for (i, at) in [110u64, 120, 130].into_iter().enumerate() {
            assert_eq!(s.insert(0, at, &[2 + i as u8; 10]), 0);
            s.check();
        }
        // Overlapping the end: only the new bytes are appended.
        assert_eq!(s.insert(0, 135, &[9; 10]), 0);
        s.check();
        assert_eq!(s.fragments.len(), 1);
        let f = &s.fragments[&100];
        assert_eq!(f.bytes.len(), 45);
        assert_eq!(&f.bytes[30..35], &[4; 5]);
        assert_eq!(&f.bytes[40..], &[9; 5]);
        assert_eq!((f.cursor, f.at), (4, CursorAt::AfterNamed { next: 7 }));
        // Filling a gap before it merges the two, keeping the bytes held first.
        assert_eq!(s.insert(0, 80, &[5; 25]), 0);
        s.check();
        assert_eq!(s.fragments.len(), 1);
        assert_eq!(s.fragments[&80].bytes.len(), 65);
        assert_eq!(&s.fragments[&80].bytes[..20], &[5; 20]);
        assert_eq!(&s.fragments[&80].bytes[20..30], &[1; 10]);
        assert_eq!(s.take_at(80).map(|b| b.len()), Some(65));
        s.check();
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn store_appends_up_to_its_limit() {
        let mut s = SegmentStore::new(25);
        assert_eq!(s.insert(0, 0, &[1; 10]), 0);
        assert_eq!(s.insert(0, 10, &[2; 10]), 0);
        assert_eq!(s.insert(0, 20, &[3; 10]), 5);
        s.check();
        assert_eq!(s.len(), 25);
        assert_eq!(s.fragments[&0].bytes.len(), 25);
        assert_eq!(s.insert(0, 25, &[4; 10]), 10);
        s.check();
    }

    #[test]
    fn store_reuses_a_recycled_buffer_within_its_bound() {
        let mut s = SegmentStore::new(10_000);
        let buffer = vec![7u8; 4096];
        let ptr = buffer.as_ptr();
        s.recycle(buffer);
        s.insert(0, 50, &[1; 100]);
        s.check();
        let f = &s.fragments[&50];
        assert_eq!(
            f.bytes.as_ptr(),
            ptr,
            "the recycled buffer holds the fragment"
        );
        assert_eq!(f.bytes, vec![1; 100], "and nothing that was in it before");
        assert_eq!(s.spare.capacity(), 0);
        // The next fragment gets a buffer of its own.
        s.insert(0, 500, &[2; 10]);
        s.check();
        assert_eq!(s.fragments[&500].bytes.capacity(), 10);
        // A taken fragment's buffer comes back; one larger than MAX_SPARE does not stay.
        let taken = s.take_at(50).unwrap();
        s.recycle(taken);
        assert_eq!(s.spare.capacity(), 4096);
        s.recycle(Vec::with_capacity(MAX_SPARE + 1));
        assert_eq!(s.spare.capacity(), 4096);
        // Dropped fragments' buffers are kept too (the largest one).
        s.drop_below(1000);
        s.check();
        assert_eq!(s.len(), 0);
        assert_eq!(s.spare.capacity(), 4096);
    }

    #[test]
    fn store_does_not_reuse_a_buffer_beyond_twice_its_limit() {
        // Many small fragments each in a large recycled buffer would hold far more memory
        // than the bytes they keep.
        let mut s = SegmentStore::new(1000);
        s.recycle(Vec::with_capacity(4096));
        s.insert(0, 0, &[1; 10]);
        s.check();
        assert_eq!(s.fragments[&0].bytes.capacity(), 10);
        // Nor kept: it could never be used.
        assert_eq!(s.spare.capacity(), 0);
        let mut s = SegmentStore::new(3000);
        s.recycle(Vec::with_capacity(4096));
        s.insert(0, 0, &[1; 10]);
        s.check();
        assert_eq!(s.fragments[&0].bytes.capacity(), 4096);
    }

    #[test]
    fn store_takes_only_a_fragment_that_starts_there() {
        let mut s = SegmentStore::new(1000);
        s.insert(0, 10, &[1; 10]);
        s.insert(0, 30, &[2; 10]);
        assert_eq!(s.take_at(5), None);
        assert_eq!(s.take_at(15), None);
        assert_eq!(s.take_at(30), Some(vec![2; 10]));
        assert_eq!(s.take_at(10), Some(vec![1; 10]));
        s.check();
    }

    #[test]
    fn replay_window_refuses_repeats_and_old_numbers() {
        let mut w = ReplayWindow::default();
        assert!(w.insert(5));
        assert!(!w.insert(5));
        assert!(w.insert(0));
        assert_eq!(w.base(), 1);
        assert!(w.insert(1));
        assert_eq!(w.base(), 2);
        assert!(w.insert(REPLAY_WINDOW * 3));
        assert!(w.seen(REPLAY_WINDOW * 2), "below the window counts as seen");
        assert!(!w.seen(REPLAY_WINDOW * 3 - 1));
        assert!(w.insert(REPLAY_WINDOW * 3 - 1));
        assert!(!w.insert(REPLAY_WINDOW * 3 - 1));
    }

    #[test]
    fn candidates_start_at_the_hint_and_skip_seen() {
        let mut w = ReplayWindow::default();
        for n in 0..10 {
            w.insert(n);
        }
        w.insert(12);
        let c: Vec<u64> = w.candidates(11).take(5).collect();
        assert_eq!(c, vec![11, 10, 13, 14, 15]);
        assert!(w.candidates(0).all(|n| n >= 10 && n != 12));
        assert!(w.candidates(0).count() <= MAX_NUMBER_TRIES as usize);
    }

    #[test]
    fn store_keeps_first_copy_merges_and_bounds() {
        let mut s = SegmentStore::new(100);
        assert_eq!(s.insert(0, 10, &[1; 10]), 0);
        assert_eq!(s.insert(0, 30, &[3; 10]), 0);
        // Overlaps both and the gap between: only the gap is taken, then all merge.
        assert_eq!(s.insert(0, 15, &[2; 20]), 0);
        assert_eq!(s.fragments.len(), 1);
        let f = &s.fragments[&10];
        assert_eq!(f.bytes.len(), 30);
        assert_eq!(&f.bytes[..10], &[1; 10]);
        assert_eq!(&f.bytes[10..20], &[2; 10]);
        assert_eq!(&f.bytes[20..], &[3; 10]);
        // Below the floor is ignored; over the limit is refused.
        assert_eq!(s.insert(50, 45, &[9; 10]), 0);
        assert_eq!(s.len(), 35);
        assert_eq!(s.insert(0, 200, &[7; 80]), 15);
        assert_eq!(s.len(), 100);
        s.drop_below(20);
        assert_eq!(s.len(), 90);
        assert_eq!(s.take_at(20).map(|b| b.len()), Some(20));
    }
}
