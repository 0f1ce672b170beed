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
    /// `cursor` is a known record boundary (right after a record that authenticated, or
    /// after one whose prefix named it); otherwise it is a pattern-scan position.
    pub(crate) at_boundary: bool,
    /// The record number expected at `cursor` when it is a boundary (the one before, plus
    /// one): the first candidate tried.
    pub(crate) hint: Option<u64>,
}

/// Ciphertext fragments ahead of the in-order stream, by stream offset: non-overlapping and
/// non-adjacent (adjacent ones are merged). Where two copies of a range differ, the first to
/// arrive is kept. Holds at most `limit` bytes.
#[derive(Debug)]
pub(crate) struct SegmentStore {
    pub(crate) fragments: BTreeMap<u64, Fragment>,
    bytes: usize,
    limit: usize,
}

impl SegmentStore {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            fragments: BTreeMap::new(),
            bytes: 0,
            limit,
        }
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> usize {
        self.bytes
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
            if let Some((&s, f)) = self.fragments.range(..=pos).next_back()
                && s + f.bytes.len() as u64 > pos
            {
                pos = s + f.bytes.len() as u64;
                continue;
            }
            let next = self
                .fragments
                .range(pos + 1..)
                .next()
                .map_or(end, |(&s, _)| s)
                .min(end);
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
            self.fragments.insert(
                pos,
                Fragment {
                    bytes: piece.to_vec(),
                    cursor: 0,
                    at_boundary: false,
                    hint: None,
                },
            );
            pos = next;
        }
        self.merge_around(start, end);
        refused
    }

    /// Merges contiguous fragments from the one at or before `from` up to `to`.
    fn merge_around(&mut self, from: u64, to: u64) {
        // The fragment ending at or after `from` that starts before it, else the first
        // starting at or after it.
        let before = self
            .fragments
            .range(..from)
            .next_back()
            .filter(|(s, f)| **s + f.bytes.len() as u64 >= from);
        let first = before.or_else(|| self.fragments.range(from..).next());
        let Some((&first, _)) = first else {
            return;
        };
        let mut at = first;
        loop {
            let next = at + self.fragments[&at].bytes.len() as u64;
            if next > to {
                return;
            }
            let Some(b) = self.fragments.remove(&next) else {
                match self.fragments.range(next..).next() {
                    Some((&s, _)) if s <= to => {
                        at = s;
                        continue;
                    }
                    _ => return,
                }
            };
            let a = self.fragments.get_mut(&at).expect("present");
            let a_len = a.bytes.len();
            if a.cursor >= a_len {
                // Everything of `a` was scanned: go on where `b` was.
                a.cursor = a_len + b.cursor;
                if !(a.at_boundary && b.cursor == 0) {
                    a.at_boundary = b.at_boundary;
                    a.hint = b.hint;
                }
            }
            a.bytes.extend_from_slice(&b.bytes);
        }
    }

    /// Removes and returns the fragment that starts exactly at `offset`.
    pub(crate) fn take_at(&mut self, offset: u64) -> Option<Vec<u8>> {
        let f = self.fragments.remove(&offset)?;
        self.bytes -= f.bytes.len();
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
                    f.at_boundary = false;
                    f.hint = None;
                }
                self.bytes += f.bytes.len();
                self.fragments.insert(floor, f);
                return;
            }
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
