//! Sender-side record of segments in flight: SACK scoreboard, loss marking and `pipe`
//! (RFC 6675 §4), Karn-safe RTT sampling (RFC 6298 §3).
//!
//! Positions are in the connection's unwrapped send sequence space (0 = ISS). One entry per
//! transmitted segment, so that retransmissions keep the original boundaries (what Hollywood's
//! inconsistent retransmissions need) and each segment's send time is known.

use std::collections::VecDeque;
use std::time::Instant;

#[derive(Clone, Debug)]
pub(crate) struct SentSegment {
    pub start: u64,
    /// Exclusive end, including the FIN's sequence number if `fin`.
    pub end: u64,
    pub fin: bool,
    pub sent_at: Instant,
    pub retransmits: u32,
    pub sacked: bool,
    pub lost: bool,
    /// Retransmitted since last marked lost, and that retransmission is presumed in flight.
    pub retrans_out: bool,
}

impl SentSegment {
    fn len(&self) -> u64 {
        self.end - self.start
    }
}

/// Result of a cumulative acknowledgment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AckResult {
    /// Send time of the newest fully acknowledged segment, if it was never retransmitted
    /// (Karn's rule, RFC 6298 §3).
    pub rtt_sent_at: Option<Instant>,
    /// Bytes acknowledged that had not been SACKed before (for byte counting).
    pub newly_acked: u64,
    /// Earliest (latest-transmission) send time among the segments newly acknowledged.
    pub earliest_sent_at: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct Scoreboard {
    segs: VecDeque<SentSegment>,
    sacked_bytes: u64,
    lost_bytes: u64,
    retrans_out_bytes: u64,
}

impl Scoreboard {
    #[cfg(test)]
    pub fn lost_bytes(&self) -> u64 {
        self.lost_bytes
    }

    /// RFC 6675 §4 SetPipe, kept incrementally: in flight = not SACKed and not lost, plus
    /// retransmissions of lost segments.
    pub fn pipe(&self, flight: u64) -> u64 {
        (flight + self.retrans_out_bytes).saturating_sub(self.sacked_bytes + self.lost_bytes)
    }

    pub fn on_send(&mut self, start: u64, end: u64, fin: bool, now: Instant) {
        self.segs.push_back(SentSegment {
            start,
            end,
            fin,
            sent_at: now,
            retransmits: 0,
            sacked: false,
            lost: false,
            retrans_out: false,
        });
    }

    /// Records that the segment containing `pos` went out again (a repeated probe).
    pub fn on_resend_at(&mut self, pos: u64, now: Instant) {
        if let Some(i) = self.index_of(pos) {
            self.on_retransmit(i, now);
        }
    }

    fn index_of(&self, pos: u64) -> Option<usize> {
        let i = self.segs.partition_point(|s| s.end <= pos);
        (i < self.segs.len() && self.segs[i].start <= pos).then_some(i)
    }

    /// Splits the segment containing `at` so that a segment starts exactly at `at`.
    fn split_at(&mut self, at: u64) {
        let Some(i) = self.index_of(at) else { return };
        let seg = &mut self.segs[i];
        if seg.start == at {
            return;
        }
        let mut tail = seg.clone();
        seg.end = at;
        seg.fin = false;
        tail.start = at;
        self.segs.insert(i + 1, tail);
    }

    /// Splits the segment at `index` so that it is at most `max` long; returns its bounds.
    pub fn limit_segment(&mut self, index: usize, max: u64) -> Option<(u64, u64, bool)> {
        let seg = self.segs.get(index)?;
        let payload = seg.len() - seg.fin as u64;
        if payload > max && max > 0 {
            let at = seg.start + max;
            self.split_at(at);
        }
        self.segs.get(index).map(|s| (s.start, s.end, s.fin))
    }

    /// Removes everything below `upto`.
    pub fn ack(&mut self, upto: u64) -> AckResult {
        let mut res = AckResult::default();
        let mut newest: Option<(Instant, bool)> = None;
        let mut latest_retransmission: Option<Instant> = None;
        self.split_at(upto);
        while let Some(front) = self.segs.front() {
            if front.end > upto {
                break;
            }
            let Some(seg) = self.segs.pop_front() else {
                break;
            };
            let len = seg.len();
            if seg.sacked {
                self.sacked_bytes -= len;
            } else {
                res.newly_acked += len;
                if seg.retransmits > 0 {
                    latest_retransmission = latest_retransmission.max(Some(seg.sent_at));
                }
                newest = Some((seg.sent_at, seg.retransmits > 0));
                res.earliest_sent_at = Some(
                    res.earliest_sent_at
                        .map_or(seg.sent_at, |t| t.min(seg.sent_at)),
                );
                if seg.lost {
                    self.lost_bytes -= len;
                }
                if seg.retrans_out {
                    self.retrans_out_bytes -= len;
                }
            }
        }
        // Karn's rule (RFC 6298 §3): sample only from the newest segment this ACK covers, if it
        // was never retransmitted and was sent after every retransmission the ACK also covers
        // (otherwise it may have waited at the receiver for the hole to be filled, and the
        // sample would measure that wait).
        res.rtt_sent_at = match newest {
            Some((sent, false)) if latest_retransmission.is_none_or(|r| sent >= r) => Some(sent),
            _ => None,
        };
        res
    }

    /// Marks `[left, right)` as SACKed; returns bytes newly SACKed.
    pub fn sack(&mut self, left: u64, right: u64) -> u64 {
        if left >= right {
            return 0;
        }
        self.split_at(left);
        self.split_at(right);
        let mut newly = 0;
        let mut i = self.segs.partition_point(|s| s.end <= left);
        while let Some(seg) = self.segs.get_mut(i) {
            if seg.start >= right {
                break;
            }
            if !seg.sacked && seg.start >= left && seg.end <= right {
                let len = seg.end - seg.start;
                seg.sacked = true;
                newly += len;
                self.sacked_bytes += len;
                if seg.lost {
                    self.lost_bytes -= len;
                }
                if seg.retrans_out {
                    seg.retrans_out = false;
                    self.retrans_out_bytes -= len;
                }
            }
            i += 1;
        }
        newly
    }

    /// RFC 6675 §4 IsLost, applied to every segment: a segment is lost when at least
    /// `dupthresh` SACKed segments, or more than `(dupthresh - 1) * mss` SACKed bytes, lie
    /// above it. Returns whether any segment was newly marked.
    pub fn mark_lost(&mut self, dupthresh: u32, mss: u64) -> bool {
        let mut sacked_above_segs = 0u32;
        let mut sacked_above_bytes = 0u64;
        let mut newly = false;
        for seg in self.segs.iter_mut().rev() {
            if seg.sacked {
                sacked_above_segs += 1;
                sacked_above_bytes += seg.len();
                continue;
            }
            if sacked_above_segs >= dupthresh
                || sacked_above_bytes > (dupthresh.saturating_sub(1) as u64) * mss
            {
                if !seg.lost {
                    seg.lost = true;
                    newly = true;
                    self.lost_bytes += seg.len();
                    if seg.retrans_out {
                        // Marked lost again: its retransmission is no longer presumed in flight.
                        seg.retrans_out = false;
                        self.retrans_out_bytes -= seg.len();
                    }
                } else if seg.retrans_out {
                    // Already retransmitted; leave it to the RTO (RFC 6675 §5 uses HighRxt).
                }
            }
        }
        newly
    }

    /// Whether the first unacknowledged segment is marked lost.
    pub fn head_lost(&self) -> bool {
        self.segs.front().is_some_and(|s| s.lost && !s.sacked)
    }

    /// Marks the first unacknowledged segment lost (NewReno fast retransmit and partial ACKs,
    /// RFC 6582 §3.2), so that it is retransmitted next.
    pub fn mark_head_lost(&mut self) {
        if let Some(seg) = self.segs.front_mut()
            && !seg.sacked
        {
            let len = seg.end - seg.start;
            if !seg.lost {
                seg.lost = true;
                self.lost_bytes += len;
            }
            if seg.retrans_out {
                seg.retrans_out = false;
                self.retrans_out_bytes -= len;
            }
        }
    }

    /// After a retransmission timeout everything outstanding is presumed lost, and SACK
    /// information is discarded (RFC 2018 §8: the receiver may have reneged).
    pub fn mark_all_lost(&mut self) {
        self.sacked_bytes = 0;
        self.retrans_out_bytes = 0;
        self.lost_bytes = 0;
        for seg in &mut self.segs {
            seg.sacked = false;
            seg.retrans_out = false;
            seg.lost = true;
            self.lost_bytes += seg.end - seg.start;
        }
    }

    /// First segment that is lost and not yet retransmitted (RFC 6675 NextSeg rule 1).
    pub fn next_lost(&self) -> Option<usize> {
        if self.lost_bytes == 0 {
            return None;
        }
        self.segs
            .iter()
            .position(|s| s.lost && !s.sacked && !s.retrans_out)
    }

    /// Records a retransmission of the segment at `index`.
    pub fn on_retransmit(&mut self, index: usize, now: Instant) {
        if let Some(seg) = self.segs.get_mut(index) {
            seg.retransmits += 1;
            seg.sent_at = now;
            if seg.lost && !seg.retrans_out {
                seg.retrans_out = true;
                self.retrans_out_bytes += seg.end - seg.start;
            }
        }
    }

    /// Number of holes: runs of un-SACKed segments below the highest SACKed one.
    pub fn holes(&self) -> usize {
        let mut holes = 0;
        let mut in_hole = false;
        let Some(last_sacked) = self.segs.iter().rposition(|s| s.sacked) else {
            return 0;
        };
        for seg in self.segs.range(..last_sacked) {
            if !seg.sacked && !in_hole {
                holes += 1;
            }
            in_hole = !seg.sacked;
        }
        holes
    }

    #[cfg(test)]
    pub fn check_invariants(&self) {
        let mut sacked = 0;
        let mut lost = 0;
        let mut rout = 0;
        for s in &self.segs {
            if s.sacked {
                sacked += s.len();
            } else {
                if s.lost {
                    lost += s.len();
                }
                if s.retrans_out {
                    rout += s.len();
                }
            }
        }
        assert_eq!(
            (sacked, lost, rout),
            (self.sacked_bytes, self.lost_bytes, self.retrans_out_bytes)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sack_marks_holes_lost_after_three_segments() {
        let now = Instant::now();
        let mut sb = Scoreboard::default();
        for i in 0..6u64 {
            sb.on_send(1 + i * 100, 1 + (i + 1) * 100, false, now);
        }
        // Segment 0 lost; 1..=3 SACKed.
        sb.sack(101, 401);
        assert!(sb.mark_lost(3, 100));
        assert!(sb.head_lost());
        assert_eq!(sb.next_lost(), Some(0));
        // flight 600, sacked 300, lost 100 -> pipe 200 (segments 4 and 5).
        assert_eq!(sb.pipe(600), 200);
        sb.on_retransmit(0, now);
        assert_eq!(sb.pipe(600), 300);
        assert_eq!(sb.holes(), 1);
        sb.check_invariants();
        let r = sb.ack(401);
        assert_eq!(r.newly_acked, 100);
        assert!(r.rtt_sent_at.is_none());
        sb.check_invariants();
        assert_eq!(sb.pipe(200), 200);
    }

    #[test]
    fn partial_sack_and_ack_split_segments() {
        let now = Instant::now();
        let mut sb = Scoreboard::default();
        sb.on_send(1, 1001, false, now);
        assert_eq!(sb.sack(501, 1001), 500);
        let r = sb.ack(301);
        assert_eq!(r.newly_acked, 300);
        sb.check_invariants();
        sb.mark_all_lost();
        assert_eq!(sb.lost_bytes(), 700);
        sb.check_invariants();
    }
}
