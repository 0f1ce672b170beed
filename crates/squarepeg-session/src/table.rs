//! The queued messages, by number.
//!
//! Message numbers are assigned in order and most messages leave in about
//! the order they came, so the table keeps the recent numbers in a deque
//! indexed by `number - base`: no hashing, and neighbouring messages in
//! neighbouring memory (a full send queue holds thousands of messages, and
//! a hash map spreads them over the cache). Messages left behind for long
//! (a low urgency class starved by a busy higher one) would leave holes;
//! once the holes outnumber the live slots, the oldest slots move to a hash
//! map, so memory stays proportional to the messages queued.

use std::collections::VecDeque;

use crate::MessageNumber;
use crate::hash::IntMap;

/// Slots the deque may have beyond twice its live entries.
const SLACK: usize = 64;

#[derive(Debug)]
pub(crate) struct MessageTable<V> {
    /// Number of `slots[0]`.
    base: MessageNumber,
    slots: VecDeque<Option<V>>,
    /// Occupied slots.
    live: usize,
    /// Messages older than `base`.
    overflow: IntMap<MessageNumber, V>,
}

impl<V> Default for MessageTable<V> {
    fn default() -> Self {
        Self {
            base: 0,
            slots: VecDeque::new(),
            live: 0,
            overflow: IntMap::default(),
        }
    }
}

impl<V> MessageTable<V> {
    fn slot(&self, n: MessageNumber) -> Option<usize> {
        let i = n.checked_sub(self.base)?;
        (i < self.slots.len() as u64).then_some(i as usize)
    }

    /// Inserts message `n`, which is above every number inserted before.
    pub(crate) fn insert(&mut self, n: MessageNumber, v: V) {
        let end = self.base + self.slots.len() as u64;
        debug_assert!(n >= end, "numbers are inserted in increasing order");
        if self.slots.is_empty() {
            self.base = n;
        } else if n.saturating_sub(end) > self.slots.len() as u64 + SLACK as u64 {
            // A long run of numbers never queued (dropped on arrival):
            // start afresh rather than fill the gap with holes.
            self.evict(self.slots.len());
            self.base = n;
        }
        while self.base + (self.slots.len() as u64) < n {
            self.slots.push_back(None);
        }
        self.slots.push_back(Some(v));
        self.live += 1;
        self.compact();
    }

    /// Moves the oldest slots to the overflow map while holes outnumber
    /// the live slots (each step shortens the deque, so this ends).
    fn compact(&mut self) {
        while self.slots.len() > 2 * self.live + SLACK {
            self.evict(1);
        }
    }

    /// Moves the `k` oldest slots out of the deque.
    fn evict(&mut self, k: usize) {
        for _ in 0..k {
            let Some(slot) = self.slots.pop_front() else {
                break;
            };
            if let Some(v) = slot {
                self.live -= 1;
                self.overflow.insert(self.base, v);
            }
            self.base += 1;
        }
        self.trim();
    }

    /// Drops empty slots at the front.
    fn trim(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base += 1;
        }
    }

    pub(crate) fn get(&self, n: MessageNumber) -> Option<&V> {
        match self.slot(n) {
            Some(i) => self.slots[i].as_ref(),
            None => self.overflow.get(&n),
        }
    }

    pub(crate) fn get_mut(&mut self, n: MessageNumber) -> Option<&mut V> {
        match self.slot(n) {
            Some(i) => self.slots[i].as_mut(),
            None => self.overflow.get_mut(&n),
        }
    }

    pub(crate) fn contains(&self, n: MessageNumber) -> bool {
        self.get(n).is_some()
    }

    pub(crate) fn remove(&mut self, n: MessageNumber) -> Option<V> {
        match self.slot(n) {
            Some(0) if self.slots.front().is_some_and(Option::is_some) => {
                // The oldest, as messages mostly leave: one move out of the deque instead of
                // a `take` and then popping the hole it leaves.
                let v = self.slots.pop_front()??;
                self.base += 1;
                self.live -= 1;
                self.trim();
                self.compact();
                Some(v)
            }
            Some(i) => {
                let v = self.slots[i].take()?;
                self.live -= 1;
                self.trim();
                self.compact();
                Some(v)
            }
            None => self.overflow.remove(&n),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0 && self.overflow.is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.live + self.overflow.len()
    }

    /// Every number in the table, ascending.
    #[cfg(test)]
    fn numbers(&self) -> Vec<MessageNumber> {
        let mut out: Vec<MessageNumber> = self.overflow.keys().copied().collect();
        out.sort_unstable();
        out.extend(
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_some())
                .map(|(i, _)| self.base + i as u64),
        );
        out
    }

    /// Slots held, occupied or not (for the memory bound's test).
    #[cfg(test)]
    fn slots_held(&self) -> usize {
        self.slots.len() + self.overflow.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Behaves as an ordered map under any mix of in-order inserts
        /// (with gaps), removals and lookups, and never holds more than
        /// about twice the live entries.
        #[test]
        fn like_a_map(ops in proptest::collection::vec((0u8..4, 0u64..3000), 0..2000)) {
            let mut t = MessageTable::default();
            let mut m = BTreeMap::new();
            let mut next = 0u64;
            for (op, x) in ops {
                match op {
                    0 | 1 => {
                        // Mostly consecutive numbers, sometimes a gap.
                        next += if x % 50 == 0 { x.max(1) } else { 1 };
                        t.insert(next, next * 3);
                        m.insert(next, next * 3);
                    }
                    2 => {
                        // Remove an old one or a recent one.
                        let n = if x % 2 == 0 { next.saturating_sub(x % 40) } else { x };
                        prop_assert_eq!(t.remove(n), m.remove(&n));
                    }
                    _ => {
                        prop_assert_eq!(t.get(x), m.get(&x));
                        if let Some(v) = t.get_mut(x) {
                            *v += 1;
                            *m.get_mut(&x).unwrap() += 1;
                        }
                    }
                }
                prop_assert_eq!(t.len(), m.len());
                prop_assert_eq!(t.is_empty(), m.is_empty());
                prop_assert!(t.slots_held() <= 2 * m.len() + SLACK);
            }
            prop_assert_eq!(t.numbers(), m.keys().copied().collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_starved_message_does_not_grow_the_deque() {
        let mut t = MessageTable::default();
        t.insert(0, ());
        for n in 1..100_000u64 {
            t.insert(n, ());
            t.remove(n);
        }
        assert!(t.contains(0));
        assert!(t.slots_held() <= SLACK + 3);
    }
}
