//! Typed sequence numbers (RFC 9293 §3.4), one type per sequence space.
//!
//! A connection has two spaces: ours (from ISS, [`Snd`]) and the peer's (from IRS, [`Rcv`]).
//! Each has a 32-bit wire form, [`Seq`], with modular comparisons (RFC 1982 serial number
//! arithmetic), and an unwrapped form, [`Pos`], the distance from the initial sequence number
//! (0 = the ISN, which the SYN occupies; data byte `d` of the stream is at `d + 1`), which
//! compares as plain integers. Connections keep positions and meet the wire's 32 bits only in
//! [`Seq::unwrap`] and [`Pos::wire`]. A value of one space cannot be compared with, added to
//! or unwrapped against one of the other.
//!
//! The wire header ([`crate::wire::Segment`]) keeps raw `u32`: a parsed segment does not know
//! whose space its fields are in until a connection reads it (SEG.SEQ is in the sender's).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::ops::{Add, AddAssign, Sub};

/// A sequence space: [`Snd`] or [`Rcv`].
pub(crate) trait Space: 'static {
    const NAME: &'static str;
}

/// Our send sequence space (SND.*, ISS; RFC 9293 §3.3.1).
#[derive(Debug)]
pub(crate) enum Snd {}
/// The peer's sequence space, which we receive (RCV.*, IRS).
#[derive(Debug)]
pub(crate) enum Rcv {}

impl Space for Snd {
    const NAME: &'static str = "snd";
}
impl Space for Rcv {
    const NAME: &'static str = "rcv";
}

/// A 32-bit sequence number as on the wire, in space `S`. Arithmetic wraps modulo 2^32;
/// comparisons are RFC 1982's: `a < b` when `b - a` (mod 2^32) is in `1..2^31`. At exactly
/// 2^31 apart RFC 1982 leaves the order undefined; here the later of the two by `a - b` as a
/// signed 32-bit number is "less" (as TCP implementations do: `(a - b) as i32 < 0`).
pub(crate) struct Seq<S: Space>(u32, PhantomData<S>);

// The modular order is for checks on wire values where no position is at hand; connections
// unwrap first and compare positions.
#[cfg_attr(not(test), allow(dead_code))]
impl<S: Space> Seq<S> {
    pub(crate) const fn new(v: u32) -> Self {
        Seq(v, PhantomData)
    }

    pub(crate) const fn get(self) -> u32 {
        self.0
    }

    /// Signed distance `self - other` (RFC 1982 §3.2).
    fn diff(self, other: Self) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// Modular order (RFC 1982 §3.2, RFC 9293 §3.4).
    pub(crate) fn wrapping_cmp(self, other: Self) -> Ordering {
        self.diff(other).cmp(&0)
    }
    pub(crate) fn lt(self, other: Self) -> bool {
        self.diff(other) < 0
    }
    pub(crate) fn le(self, other: Self) -> bool {
        self.diff(other) <= 0
    }
    pub(crate) fn gt(self, other: Self) -> bool {
        self.diff(other) > 0
    }
    pub(crate) fn ge(self, other: Self) -> bool {
        self.diff(other) >= 0
    }

    /// `start <= self < start + len` modulo 2^32 (RFC 9293 §3.4 acceptability test), for
    /// `len` below 2^32.
    pub(crate) fn in_window(self, start: Self, len: u32) -> bool {
        self.0.wrapping_sub(start.0) < len
    }

    /// The position closest to `reference` (within 2^31 either way) in the space whose
    /// position 0 is `base` (the ISN). Positions before the ISN come out negative.
    pub(crate) fn unwrap(self, base: Self, reference: Pos<S>) -> Pos<S> {
        let rel = self.0.wrapping_sub(base.0);
        let diff = rel.wrapping_sub(reference.0 as u32) as i32;
        Pos::signed(reference.0 + i64::from(diff))
    }
}

impl<S: Space> Add<u32> for Seq<S> {
    type Output = Self;
    fn add(self, n: u32) -> Self {
        Seq::new(self.0.wrapping_add(n))
    }
}

impl<S: Space> Sub<u32> for Seq<S> {
    type Output = Self;
    fn sub(self, n: u32) -> Self {
        Seq::new(self.0.wrapping_sub(n))
    }
}

/// `a - b`: how far `a` is ahead of `b`, modulo 2^32.
impl<S: Space> Sub for Seq<S> {
    type Output = u32;
    fn sub(self, other: Self) -> u32 {
        self.0.wrapping_sub(other.0)
    }
}

/// A position in space `S`: the unwrapped distance from the ISN (RFC 9293's sequence numbers
/// without the modulus). Negative only transiently, for a segment from before the ISN being
/// checked; stored positions are never negative.
pub(crate) struct Pos<S: Space>(i64, PhantomData<S>);

impl<S: Space> Pos<S> {
    /// The ISN's own position (the SYN).
    pub(crate) const ZERO: Self = Pos(0, PhantomData);
    /// Just after the SYN: where the data starts (stream offset 0).
    pub(crate) const AFTER_SYN: Self = Pos(1, PhantomData);

    pub(crate) const fn new(v: u64) -> Self {
        Pos(v as i64, PhantomData)
    }

    pub(crate) const fn signed(v: i64) -> Self {
        Pos(v, PhantomData)
    }

    /// The position of data byte `offset` of the stream (the SYN occupies position 0).
    pub(crate) const fn of_offset(offset: u64) -> Self {
        Pos::new(offset + 1)
    }

    /// The position as a number (not negative).
    pub(crate) fn get(self) -> u64 {
        debug_assert!(self.0 >= 0, "{self:?} before the ISN");
        self.0 as u64
    }

    /// The stream offset of the data byte at this position (which is after the SYN).
    pub(crate) fn offset(self) -> u64 {
        debug_assert!(self.0 >= 1, "{self:?} is not a data position");
        (self.0 - 1) as u64
    }

    /// Whether the position is before the ISN.
    pub(crate) fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The wire sequence number of this position, `base` being the ISN (RFC 9293 §3.4:
    /// modulo 2^32).
    pub(crate) fn wire(self, base: Seq<S>) -> Seq<S> {
        base + self.0 as u32
    }

    /// `self - earlier`, 0 when `self` is not after it.
    pub(crate) fn saturating_sub(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0).max(0) as u64
    }

    /// `self - n`, not below position 0.
    pub(crate) fn saturating_back(self, n: u64) -> Self {
        Pos(self.0.saturating_sub(n as i64).max(0), PhantomData)
    }
}

impl<S: Space> Default for Pos<S> {
    fn default() -> Self {
        Pos::ZERO
    }
}

impl<S: Space> Add<u64> for Pos<S> {
    type Output = Self;
    fn add(self, n: u64) -> Self {
        Pos(self.0 + n as i64, PhantomData)
    }
}

impl<S: Space> Add<usize> for Pos<S> {
    type Output = Self;
    fn add(self, n: usize) -> Self {
        Pos(self.0 + n as i64, PhantomData)
    }
}

impl<S: Space> AddAssign<u64> for Pos<S> {
    fn add_assign(&mut self, n: u64) {
        self.0 += n as i64;
    }
}

impl<S: Space> Sub<u64> for Pos<S> {
    type Output = Self;
    fn sub(self, n: u64) -> Self {
        Pos(self.0 - n as i64, PhantomData)
    }
}

/// `a - b`: the bytes from `b` up to `a`, which must not be before `b`.
impl<S: Space> Sub for Pos<S> {
    type Output = u64;
    fn sub(self, earlier: Self) -> u64 {
        debug_assert!(self.0 >= earlier.0, "{self:?} - {earlier:?}");
        (self.0 - earlier.0) as u64
    }
}

// The derives would ask the marker types for the traits; these ask nothing of `S`.
macro_rules! plain_traits {
    ($t:ident) => {
        impl<S: Space> Clone for $t<S> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<S: Space> Copy for $t<S> {}
        impl<S: Space> PartialEq for $t<S> {
            fn eq(&self, other: &Self) -> bool {
                self.0 == other.0
            }
        }
        impl<S: Space> Eq for $t<S> {}
        impl<S: Space> Hash for $t<S> {
            fn hash<H: Hasher>(&self, h: &mut H) {
                self.0.hash(h)
            }
        }
        impl<S: Space> fmt::Debug for $t<S> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}:{}", S::NAME, self.0)
            }
        }
    };
}
plain_traits!(Seq);
plain_traits!(Pos);

// Positions are unwrapped: their order is the integers'. `Seq` has no `Ord` on purpose (its
// order is not transitive); it has `lt`/`le`/`gt`/`ge`/`wrapping_cmp`.
impl<S: Space> PartialOrd for Pos<S> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<S: Space> Ord for Pos<S> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

pub(crate) type SndSeq = Seq<Snd>;
pub(crate) type RcvSeq = Seq<Rcv>;
pub(crate) type SndPos = Pos<Snd>;
pub(crate) type RcvPos = Pos<Rcv>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(v: u32) -> SndSeq {
        Seq::new(v)
    }

    #[test]
    fn comparisons_wrap_at_2_32() {
        assert!(s(u32::MAX).lt(s(0)));
        assert!(s(0).gt(s(u32::MAX)));
        assert!(s(u32::MAX - 10).lt(s(5)));
        assert!(s(5).ge(s(u32::MAX - 10)));
        assert!(s(7).le(s(7)) && s(7).ge(s(7)) && !s(7).lt(s(7)));
        assert_eq!(s(u32::MAX).wrapping_cmp(s(1)), Ordering::Less);
        assert_eq!(s(3) + 0, s(3));
    }

    #[test]
    fn comparisons_across_2_31() {
        // Less than 2^31 apart: the nearer way round wins.
        assert!(s(0).lt(s(0x7fff_ffff)));
        assert!(s(0x7fff_ffff).gt(s(0)));
        assert!(s(0x8000_0001).lt(s(0)));
        // Exactly 2^31 apart: undefined in RFC 1982; both read as "less" here.
        assert!(s(0).lt(s(0x8000_0000)) && s(0x8000_0000).lt(s(0)));
        assert!(s(1 << 31).gt(s(0)) == s(0).gt(s(1 << 31)));
    }

    #[test]
    fn offsets_and_distances() {
        assert_eq!(s(u32::MAX) + 1, s(0));
        assert_eq!(s(u32::MAX - 1) + 5, s(3));
        assert_eq!(s(3) - 5u32, s(u32::MAX - 1));
        assert_eq!(s(3) - s(u32::MAX - 1), 5);
        assert_eq!(s(u32::MAX - 1) - s(3), u32::MAX - 4);
    }

    #[test]
    fn window_wraps() {
        let start = s(u32::MAX - 9);
        assert!(s(u32::MAX - 9).in_window(start, 20));
        assert!(s(0).in_window(start, 20));
        assert!(s(9).in_window(start, 20));
        assert!(!s(10).in_window(start, 20));
        assert!(!s(u32::MAX - 10).in_window(start, 20));
        assert!(!start.in_window(start, 0));
    }

    #[test]
    fn positions() {
        let iss = s(u32::MAX - 1);
        let p = SndPos::ZERO + 3u64;
        assert_eq!(p.wire(iss), s(1));
        assert_eq!(SndPos::of_offset(0), SndPos::AFTER_SYN);
        assert_eq!(SndPos::new(10).offset(), 9);
        assert_eq!(SndPos::new(10) - SndPos::new(4), 6);
        assert_eq!(SndPos::new(4).saturating_sub(SndPos::new(10)), 0);
        assert_eq!(SndPos::new(4).saturating_back(10), SndPos::ZERO);
        assert!(SndPos::new(1) < SndPos::new(2));
        // Past 2^32 bytes the wire value wraps, the position does not.
        let far = SndPos::new((1 << 32) + 5);
        assert_eq!(far.wire(iss), s(3));
        assert_eq!(s(3).unwrap(iss, SndPos::new(1 << 32)), far);
        // Before the ISN: negative.
        assert_eq!((iss - 2).unwrap(iss, SndPos::ZERO), SndPos::signed(-2));
        assert!((iss - 2).unwrap(iss, SndPos::ZERO).is_negative());
    }

    proptest! {
        #[test]
        fn order_is_distance_sign(a: u32, d in 1u32..(1 << 31)) {
            let a = s(a);
            prop_assert!(a.lt(a + d));
            prop_assert!((a + d).gt(a));
            prop_assert!(a.le(a + d) && !a.ge(a + d));
            prop_assert_eq!((a + d) - a, d);
            prop_assert_eq!((a + d) - d, a);
            prop_assert!((a + d - 1).in_window(a, d) && !(a + d).in_window(a, d));
        }

        #[test]
        fn unwrap_inverts_wire(base: u32, reference in 0u64..(1 << 40), delta in -(1i64 << 31) + 1..(1i64 << 31)) {
            let base = s(base);
            let p = SndPos::signed(reference as i64 + delta);
            let reference = SndPos::new(reference);
            prop_assert_eq!(p.wire(base).unwrap(base, reference), p);
        }
    }
}
