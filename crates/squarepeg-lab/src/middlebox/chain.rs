//! Middleboxes in series.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use super::{Emit, Middlebox};
use crate::Direction;

/// How many stage visits one call may make before the chain gives up on a packet: only boxes
/// that keep answering each other back and forth reach it.
const MAX_VISITS_PER_CALL: usize = 100_000;

/// Middleboxes in series, ordered left to right: a packet travelling left to right visits
/// stage 0 first, one travelling right to left visits the last stage first. A stage's output
/// continues to the next stage in *its* direction (so a box may answer back through the stages
/// it came through). Outputs a stage releases later than `now` wait in the chain and reach the
/// next stage at their time. The chain is itself a [`Middlebox`].
pub struct MiddleboxChain {
    stages: Vec<Box<dyn Middlebox>>,
    pending: BinaryHeap<Pending>,
    next_order: u64,
    dropped_loops: u64,
}

struct Pending {
    at: Instant,
    order: u64,
    stage: usize,
    dir: Direction,
    packet: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// Reversed: the heap pops the earliest, then the first queued.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

impl Default for MiddleboxChain {
    fn default() -> Self {
        Self::new()
    }
}

impl MiddleboxChain {
    /// An empty chain (passes everything through at once).
    pub fn new() -> Self {
        Self {
            stages: Vec::new(),
            pending: BinaryHeap::new(),
            next_order: 0,
            dropped_loops: 0,
        }
    }

    /// Appends a stage at the right end.
    pub fn push(&mut self, middlebox: Box<dyn Middlebox>) {
        self.stages.push(middlebox);
    }

    /// Number of stages.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// True without stages.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The stages, left to right.
    pub fn stages(&self) -> &[Box<dyn Middlebox>] {
        &self.stages
    }

    /// The stage after `stage` for a packet travelling in `dir`, or `None` at the chain's end.
    fn next_stage(&self, stage: usize, dir: Direction) -> Option<usize> {
        match dir {
            Direction::LeftToRight => (stage + 1 < self.stages.len()).then_some(stage + 1),
            Direction::RightToLeft => stage.checked_sub(1),
        }
    }

    fn first_stage(&self, dir: Direction) -> Option<usize> {
        match dir {
            Direction::LeftToRight => (!self.stages.is_empty()).then_some(0),
            Direction::RightToLeft => self.stages.len().checked_sub(1),
        }
    }

    fn route(
        &mut self,
        now: Instant,
        from_stage: usize,
        emit: Emit,
        work: &mut VecDeque<(usize, Direction, Vec<u8>)>,
        out: &mut Vec<Emit>,
    ) {
        let at = emit.at.max(now);
        match self.next_stage(from_stage, emit.dir) {
            None => out.push(Emit { at, ..emit }),
            Some(stage) if at <= now => work.push_back((stage, emit.dir, emit.packet)),
            Some(stage) => {
                self.pending.push(Pending {
                    at,
                    order: self.next_order,
                    stage,
                    dir: emit.dir,
                    packet: emit.packet,
                });
                self.next_order += 1;
            }
        }
    }

    fn run(
        &mut self,
        now: Instant,
        mut work: VecDeque<(usize, Direction, Vec<u8>)>,
        out: &mut Vec<Emit>,
    ) {
        let mut visits = 0;
        let mut emitted = Vec::new();
        while let Some((stage, dir, packet)) = work.pop_front() {
            visits += 1;
            if visits > MAX_VISITS_PER_CALL {
                self.dropped_loops += 1 + work.len() as u64;
                return;
            }
            self.stages[stage].process(now, dir, packet, &mut emitted);
            for emit in emitted.drain(..) {
                self.route(now, stage, emit, &mut work, out);
            }
        }
    }
}

impl Middlebox for MiddleboxChain {
    fn name(&self) -> &'static str {
        "chain"
    }

    fn process(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>) {
        match self.first_stage(dir) {
            None => out.push(Emit {
                at: now,
                dir,
                packet,
            }),
            Some(stage) => self.run(now, VecDeque::from([(stage, dir, packet)]), out),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let stages = self.stages.iter().filter_map(|s| s.poll_timeout());
        stages.chain(self.pending.peek().map(|p| p.at)).min()
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Vec<Emit>) {
        let mut work = VecDeque::new();
        while self.pending.peek().is_some_and(|p| p.at <= now) {
            if let Some(p) = self.pending.pop() {
                work.push_back((p.stage, p.dir, p.packet));
            }
        }
        let mut emitted = Vec::new();
        for stage in 0..self.stages.len() {
            if self.stages[stage].poll_timeout().is_some_and(|t| t <= now) {
                self.stages[stage].handle_timeout(now, &mut emitted);
                for emit in emitted.drain(..) {
                    self.route(now, stage, emit, &mut work, out);
                }
            }
        }
        self.run(now, work, out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut counters: Vec<_> = self.stages.iter().flat_map(|s| s.counters()).collect();
        counters.push(("chain_dropped_loops", self.dropped_loops));
        counters
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Appends its tag to the packet and delays it.
    struct Tagger {
        tag: u8,
        delay: Duration,
    }

    impl Middlebox for Tagger {
        fn name(&self) -> &'static str {
            "tagger"
        }
        fn process(
            &mut self,
            now: Instant,
            dir: Direction,
            mut packet: Vec<u8>,
            out: &mut Vec<Emit>,
        ) {
            packet.push(self.tag);
            out.push(Emit {
                at: now + self.delay,
                dir,
                packet,
            });
        }
    }

    /// Sends packets travelling in `only` (or every packet) back the way they came.
    struct Reflector {
        only: Option<Direction>,
    }

    impl Middlebox for Reflector {
        fn name(&self) -> &'static str {
            "reflector"
        }
        fn process(
            &mut self,
            now: Instant,
            dir: Direction,
            mut packet: Vec<u8>,
            out: &mut Vec<Emit>,
        ) {
            let reflect = self.only.is_none_or(|only| only == dir);
            if reflect {
                packet.push(b'R');
            }
            out.push(Emit {
                at: now,
                dir: if reflect { dir.reverse() } else { dir },
                packet,
            });
        }
    }

    #[test]
    fn order_and_timing_both_ways() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut chain = MiddleboxChain::new();
        chain.push(Box::new(Tagger {
            tag: b'a',
            delay: ms,
        }));
        chain.push(Box::new(Tagger {
            tag: b'b',
            delay: Duration::ZERO,
        }));
        let mut out = Vec::new();
        chain.process(t0, Direction::LeftToRight, vec![b'>'], &mut out);
        // Stage a holds it for 1 ms.
        assert!(out.is_empty());
        assert_eq!(chain.poll_timeout(), Some(t0 + ms));
        chain.handle_timeout(t0 + ms, &mut out);
        assert_eq!(
            out,
            vec![Emit {
                at: t0 + ms,
                dir: Direction::LeftToRight,
                packet: b">ab".to_vec()
            }]
        );
        out.clear();
        chain.process(t0 + ms, Direction::RightToLeft, vec![b'<'], &mut out);
        // Stage b first (no delay), then a holds it for 1 ms: a's output leaves the chain with
        // its release time.
        assert_eq!(
            out,
            vec![Emit {
                at: t0 + 2 * ms,
                dir: Direction::RightToLeft,
                packet: b"<ba".to_vec()
            }]
        );
        assert_eq!(chain.poll_timeout(), None);
    }

    #[test]
    fn answers_travel_back_through_earlier_stages() {
        let t0 = Instant::now();
        let mut chain = MiddleboxChain::new();
        chain.push(Box::new(Tagger {
            tag: b'a',
            delay: Duration::ZERO,
        }));
        chain.push(Box::new(Reflector { only: None }));
        let mut out = Vec::new();
        chain.process(t0, Direction::LeftToRight, vec![], &mut out);
        assert_eq!(
            out,
            vec![Emit {
                at: t0,
                dir: Direction::RightToLeft,
                packet: b"aRa".to_vec()
            }]
        );
    }

    #[test]
    fn ping_pong_is_bounded() {
        let t0 = Instant::now();
        let mut chain = MiddleboxChain::new();
        chain.push(Box::new(Reflector {
            only: Some(Direction::RightToLeft),
        }));
        chain.push(Box::new(Reflector { only: None }));
        let mut out = Vec::new();
        // Stage 1 reflects to stage 0, which reflects back to stage 1, and so on: the visit
        // bound ends it and counts the lost packet.
        chain.process(t0, Direction::LeftToRight, vec![], &mut out);
        assert!(out.is_empty());
        assert_eq!(chain.counters().last(), Some(&("chain_dropped_loops", 1)));
    }

    #[test]
    fn empty_chain_passes_through() {
        let t0 = Instant::now();
        let mut chain = MiddleboxChain::new();
        let mut out = Vec::new();
        chain.process(t0, Direction::RightToLeft, vec![1, 2], &mut out);
        assert_eq!(
            out,
            vec![Emit {
                at: t0,
                dir: Direction::RightToLeft,
                packet: vec![1, 2]
            }]
        );
    }
}
