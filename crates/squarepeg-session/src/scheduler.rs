//! The send scheduler: strict priority between urgency classes, deficit
//! round robin (fair by bytes) between the flows of one class.
//!
//! A flow is one sub-stream's messages of one urgency, or one stream. The
//! scheduler only orders flows; the session owns their data and tells the
//! scheduler what each turn sent. Decisions are made one frame at a time, as
//! late as the transport allows (Minion §4.2): nothing is committed to the
//! transport before it asks for the next frame.

use std::collections::VecDeque;

use crate::hash::IntSet;

use crate::Priority;

/// What the scheduler rotates between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Flow {
    Messages { substream: u64 },
    Stream(u64),
}

#[derive(Debug)]
pub(crate) struct Scheduler {
    /// The active flows of each class with their deficits (bytes), in turn
    /// order. The deficit lives with the flow in its ring, so choosing and
    /// charging the flow at the front hashes nothing.
    rings: [VecDeque<(Flow, i64)>; Priority::LEVELS],
    /// The (class, flow) pairs in the rings, to activate each only once.
    active: IntSet<(u8, Flow)>,
    quantum: i64,
}

impl Scheduler {
    /// `quantum`: bytes a flow may send per turn; the stream chunk size, so
    /// a turn is about one chunk.
    pub(crate) fn new(quantum: usize) -> Self {
        Self {
            rings: Default::default(),
            active: IntSet::default(),
            quantum: quantum.max(1) as i64,
        }
    }

    /// Puts `flow` in the ring of `urgency` if it is not there.
    pub(crate) fn activate(&mut self, urgency: Priority, flow: Flow) {
        if self.active.insert((urgency.0, flow)) {
            self.rings[urgency.index()].push_back((flow, 0));
        }
    }

    /// Takes `flow` out of the ring of `urgency`.
    pub(crate) fn deactivate(&mut self, urgency: Priority, flow: Flow) {
        if self.active.remove(&(urgency.0, flow)) {
            self.rings[urgency.index()].retain(|(f, _)| *f != flow);
        }
    }

    /// The flow whose turn it is: the most urgent non-empty class, and in it
    /// the first flow with a positive deficit (flows out of deficit get one
    /// quantum and go to the back). The flow returned is at the front of
    /// its ring.
    pub(crate) fn peek(&mut self) -> Option<(Priority, Flow)> {
        for (u, ring) in self.rings.iter_mut().enumerate() {
            // Each pass adds a quantum to some flow, so this ends within
            // ring.len() rotations.
            while let Some((flow, deficit)) = ring.front_mut() {
                if *deficit > 0 {
                    return Some((Priority(u as u8), *flow));
                }
                *deficit += self.quantum;
                ring.rotate_left(1);
            }
        }
        None
    }

    /// Whether [`Scheduler::peek`] would return `flow` of class `urgency`
    /// again without changing anything: it is at the front of its ring,
    /// which is the first with flows, and its deficit is not spent. True
    /// right after `peek` chose it and `charge` left it credit.
    pub(crate) fn would_pick_again(&self, urgency: Priority, flow: Flow) -> bool {
        self.credit_if_next(urgency, flow).is_some()
    }

    /// The bytes `flow` may still send before [`Scheduler::peek`] moves on, if it
    /// [would pick it again](Scheduler::would_pick_again).
    pub(crate) fn credit_if_next(&self, urgency: Priority, flow: Flow) -> Option<usize> {
        let u = urgency.index();
        if !self.rings[..u].iter().all(VecDeque::is_empty) {
            return None;
        }
        match self.rings[u].front() {
            Some(&(f, deficit)) if f == flow && deficit > 0 => Some(deficit as usize),
            _ => None,
        }
    }

    /// Charges the flow `peek` returned for `bytes` sent.
    pub(crate) fn charge(&mut self, urgency: Priority, flow: Flow, bytes: usize) {
        let ring = &mut self.rings[urgency.index()];
        // `peek` left it at the front; look further only if the caller
        // charges some other flow.
        if let Some((_, d)) = ring.iter_mut().find(|(f, _)| *f == flow) {
            *d -= bytes as i64;
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.active.is_empty() && self.rings.iter().all(VecDeque::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Serves flows whose items have the given sizes until all are empty;
    /// returns the order of (flow index, size).
    fn run(queues: &mut [(Priority, VecDeque<usize>)], quantum: usize) -> Vec<(usize, usize)> {
        let mut s = Scheduler::new(quantum);
        for (i, (u, _)) in queues.iter().enumerate() {
            s.activate(*u, Flow::Stream(i as u64));
        }
        let mut out = Vec::new();
        while let Some((u, flow)) = s.peek() {
            let Flow::Stream(i) = flow else {
                unreachable!()
            };
            match queues[i as usize].1.pop_front() {
                Some(size) => {
                    s.charge(u, flow, size);
                    out.push((i as usize, size));
                }
                None => s.deactivate(u, flow),
            }
        }
        assert!(s.is_empty());
        out
    }

    #[test]
    fn strict_priority_between_classes() {
        let mut q = vec![
            (Priority(5), VecDeque::from(vec![100; 10])),
            (Priority(1), VecDeque::from(vec![100; 10])),
        ];
        let order = run(&mut q, 1000);
        let first: Vec<usize> = order.iter().map(|&(i, _)| i).collect();
        assert_eq!(&first[..10], &[1; 10]);
        assert_eq!(&first[10..], &[0; 10]);
    }

    proptest! {
        /// Within one class, while every flow is backlogged, the bytes sent
        /// by any two flows differ by at most one quantum plus one item.
        #[test]
        fn fair_by_bytes(
            sizes in proptest::collection::vec(
                proptest::collection::vec(1usize..5000, 50..100), 2..5),
            quantum in 500usize..5000,
        ) {
            let max_item = 5000;
            let mut q: Vec<(Priority, VecDeque<usize>)> = sizes
                .iter()
                .map(|v| (Priority(3), v.iter().copied().collect()))
                .collect();
            let order = run(&mut q, quantum);
            let total: usize = sizes.iter().map(|v| v.iter().sum::<usize>()).sum();
            prop_assert_eq!(order.iter().map(|&(_, s)| s).sum::<usize>(), total);
            // Check the bound over the prefix where every flow still had data.
            let mut sent = vec![0usize; sizes.len()];
            let mut left: Vec<usize> = sizes.iter().map(|v| v.len()).collect();
            for &(i, size) in &order {
                sent[i] += size;
                left[i] -= 1;
                if left.contains(&0) {
                    break;
                }
                let max = *sent.iter().max().unwrap();
                let min = *sent.iter().min().unwrap();
                prop_assert!(max - min <= quantum + 2 * max_item,
                    "unfair: {:?} quantum {}", sent, quantum);
            }
        }
    }
}
