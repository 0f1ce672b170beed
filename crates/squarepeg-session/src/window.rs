//! A bounded set of recent message numbers, as a ring bitmap.

/// Remembers which numbers of the last `width` (counted back from the
/// highest number inserted) are in the set. Memory is about `width / 8`
/// bytes: the ring has a power-of-two number of bits, at least `width`, so
/// that finding a number's bit is a mask, not a division (it runs for every
/// message received).
#[derive(Clone, Debug)]
pub(crate) struct NumberWindow {
    bits: Vec<u64>,
    width: u64,
    /// Ring size in bits, minus one.
    mask: u64,
    /// One past the highest number inserted.
    end: u64,
}

impl NumberWindow {
    pub(crate) fn new(width: u64) -> Self {
        let width = width.max(64).next_multiple_of(64);
        let ring = width.next_power_of_two();
        Self {
            bits: vec![0; (ring / 64) as usize],
            width,
            mask: ring - 1,
            end: 0,
        }
    }

    fn slot(&self, n: u64) -> (usize, u64) {
        let i = n & self.mask;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Lowest number the window still covers.
    pub(crate) fn floor(&self) -> u64 {
        self.end.saturating_sub(self.width)
    }

    /// `Some(true)` if `n` is in the set, `Some(false)` if not, `None` if it
    /// is older than the window.
    pub(crate) fn contains(&self, n: u64) -> Option<bool> {
        if n < self.floor() {
            return None;
        }
        if n >= self.end {
            return Some(false);
        }
        let (w, b) = self.slot(n);
        Some(self.bits[w] & b != 0)
    }

    /// Inserts `n`. Returns false if it was already present or is older
    /// than the window (the caller treats both as seen).
    pub(crate) fn insert(&mut self, n: u64) -> bool {
        if n == self.end {
            // The next number, as on an in-order stream: the window moves by one, and the
            // slot it moves over (that of `n - ring`, long outside it) becomes `n`'s.
            let (w, b) = self.slot(n);
            self.bits[w] |= b;
            self.end = n + 1;
            return true;
        }
        match self.contains(n) {
            None | Some(true) => return false,
            Some(false) => {}
        }
        if n >= self.end {
            // Clear the slots of the numbers the window now moves over.
            let span = (n + 1 - self.end).min(self.width);
            if span == self.width {
                self.bits.iter_mut().for_each(|w| *w = 0);
            } else {
                for k in n + 1 - span..=n {
                    let (w, b) = self.slot(k);
                    self.bits[w] &= !b;
                }
            }
            self.end = n + 1;
        }
        let (w, b) = self.slot(n);
        self.bits[w] |= b;
        true
    }
}

impl NumberWindow {
    /// Inserts `first`, `first + 1`, … (`count` numbers) if they all follow the highest
    /// number inserted (`first` is the window's end: the run of an in-order stream), as
    /// that many [`NumberWindow::insert`] calls would; returns false, inserting none, if
    /// they do not (the caller then inserts them one by one).
    pub(crate) fn insert_run(&mut self, first: u64, count: u64) -> bool {
        if first != self.end {
            return false;
        }
        for n in first..first + count.min(self.mask + 1) {
            let (w, b) = self.slot(n);
            self.bits[w] |= b;
        }
        self.end = first + count;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn basics() {
        let mut w = NumberWindow::new(64);
        assert!(w.insert(0));
        assert!(!w.insert(0));
        assert!(w.insert(5));
        assert!(w.insert(3));
        assert_eq!(w.contains(4), Some(false));
        assert!(w.insert(200));
        assert_eq!(w.contains(5), None);
        assert!(!w.insert(5));
        assert_eq!(w.contains(199), Some(false));
        assert!(w.insert(199));
        assert!(!w.insert(199));
    }

    proptest! {
        /// `insert_run` inserts exactly what one `insert` per number would, where it takes
        /// the run, and changes nothing where it does not.
        #[test]
        fn insert_run_equals_inserts(
            ops in proptest::collection::vec((0u64..600, 0u64..300, any::<bool>()), 1..100),
            width in prop_oneof![Just(64u64), Just(192)],
        ) {
            let mut runs = NumberWindow::new(width);
            let mut singles = NumberWindow::new(width);
            for (n, count, from_end) in ops {
                let first = if from_end { runs.end } else { n };
                let before = runs.clone();
                if runs.insert_run(first, count) {
                    prop_assert_eq!(first, before.end);
                    for k in first..first + count {
                        prop_assert!(singles.insert(k));
                    }
                } else {
                    prop_assert_ne!(first, before.end);
                    prop_assert_eq!(&runs.bits, &before.bits);
                    prop_assert_eq!(runs.end, before.end);
                    prop_assert!(runs.insert(first) == singles.insert(first));
                }
                prop_assert_eq!(runs.end, singles.end);
                for k in runs.floor()..runs.end {
                    prop_assert_eq!(runs.contains(k), singles.contains(k), "k={}", k);
                }
            }
        }

        /// Within the window the bitmap agrees with an exact set.
        #[test]
        fn matches_a_set(
            ops in proptest::collection::vec(0u64..1000, 1..300),
            width in prop_oneof![Just(64u64), Just(192)],
        ) {
            let mut w = NumberWindow::new(width);
            let mut set = BTreeSet::new();
            for n in ops {
                let fresh = !set.contains(&n) && n >= w.floor();
                prop_assert_eq!(w.insert(n), fresh, "n={}", n);
                set.insert(n);
                for k in w.floor()..w.floor() + width {
                    prop_assert_eq!(w.contains(k), Some(set.contains(&k)), "k={}", k);
                }
            }
        }
    }
}
