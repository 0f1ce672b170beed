//! Sender-side record of segments in flight: SACK scoreboard, loss marking and `pipe`
//! (RFC 6675 §4), Karn-safe RTT sampling (RFC 6298 §3), and the per-segment send times that
//! RACK's time-based loss detection needs (RFC 8985 §6).
//!
//! Positions are in the connection's unwrapped send sequence space (0 = ISS). One entry per
//! transmitted segment, so that retransmissions keep the original boundaries (what Hollywood's
//! inconsistent retransmissions need) and each segment's send time is known.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::seq::SndPos;

#[derive(Clone, Debug)]
pub(crate) struct SentSegment {
    pub start: SndPos,
    /// Exclusive end, including the FIN's sequence number if `fin`.
    pub end: SndPos,
    pub fin: bool,
    pub sent_at: Instant,
    /// Transmission number of the latest transmission (increasing in send order, so that RACK
    /// orders transmissions exactly even when many share one clock reading).
    pub xmit: u64,
    pub retransmits: u32,
    /// The last piece of a transmission (pieces split off in front of it do not count, so that
    /// a receiver acknowledging a segment piecemeal cannot make it count more than once).
    pub whole: bool,
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
    /// Segments removed (acknowledged in full).
    pub segments: u64,
    /// Transmissions acknowledged in full and never SACKed before (each counted once).
    pub whole_segments: u64,
}

/// A transmission as RACK orders them: transmission number, then end (RFC 8985 §6.2
/// RACK_sent_after with exact ordering instead of timestamps), and its send time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Transmission {
    pub xmit: u64,
    pub end: SndPos,
    pub sent_at: Instant,
}

/// What the segments newly delivered (cumulatively acknowledged or SACKed) by one ACK tell
/// RACK (RFC 8985 §6.1, §6.2) and the RTT estimator.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Delivered {
    /// The most recently sent delivered segment that was never retransmitted.
    pub newest_original: Option<Transmission>,
    /// The most recently sent delivered segment that was retransmitted (its delivery may be
    /// that of an earlier transmission).
    pub newest_retransmitted: Option<Transmission>,
    /// Send time of the newest never-retransmitted segment newly SACKed (an RTT sample: the
    /// receiver acknowledges out-of-order data at once).
    pub sacked_sample_sent_at: Option<Instant>,
    /// A never-retransmitted segment was delivered below the highest end delivered before this
    /// ACK: the network reordered (RFC 8985 §6.2 step 2).
    pub reordering: bool,
}

impl Delivered {
    fn note(&mut self, seg: &SentSegment, fack_before: SndPos, sacked: bool) {
        let key = Transmission {
            xmit: seg.xmit,
            end: seg.end,
            sent_at: seg.sent_at,
        };
        if seg.retransmits == 0 {
            self.newest_original = self.newest_original.max(Some(key));
            if sacked {
                self.sacked_sample_sent_at = self.sacked_sample_sent_at.max(Some(seg.sent_at));
            }
            if seg.end < fack_before {
                self.reordering = true;
            }
        } else {
            self.newest_retransmitted = self.newest_retransmitted.max(Some(key));
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Scoreboard {
    segs: VecDeque<SentSegment>,
    sacked_bytes: u64,
    lost_bytes: u64,
    retrans_out_bytes: u64,
    /// Highest end of any segment delivered so far (RACK.fack).
    fack: SndPos,
    /// Next transmission number.
    next_xmit: u64,
    /// Segment counts matching the byte counters above (for the pipe in segments).
    sacked_segs: u64,
    lost_segs: u64,
    retrans_out_segs: u64,
}

impl Scoreboard {
    pub fn lost_bytes(&self) -> u64 {
        self.lost_bytes
    }

    pub fn sacked_bytes(&self) -> u64 {
        self.sacked_bytes
    }

    /// Highest end of any segment delivered so far (RACK.fack).
    pub fn fack(&self) -> SndPos {
        self.fack
    }

    /// RFC 6675 §4 SetPipe, kept incrementally: in flight = not SACKed and not lost, plus
    /// retransmissions of lost segments.
    pub fn pipe(&self, flight: u64) -> u64 {
        (flight + self.retrans_out_bytes).saturating_sub(self.sacked_bytes + self.lost_bytes)
    }

    /// The pipe counted in segments (each scoreboard entry once).
    pub fn pipe_segments(&self) -> u64 {
        (self.segs.len() as u64 + self.retrans_out_segs)
            .saturating_sub(self.sacked_segs + self.lost_segs)
    }

    pub fn on_send(&mut self, start: SndPos, end: SndPos, fin: bool, now: Instant) {
        self.next_xmit += 1;
        self.segs.push_back(SentSegment {
            start,
            end,
            fin,
            sent_at: now,
            xmit: self.next_xmit,
            retransmits: 0,
            whole: true,
            sacked: false,
            lost: false,
            retrans_out: false,
        });
    }

    /// Records that the segment containing `pos` went out again (a repeated probe).
    pub fn on_resend_at(&mut self, pos: SndPos, now: Instant) {
        if let Some(i) = self.index_of(pos) {
            self.on_retransmit(i, now);
        }
    }

    fn index_of(&self, pos: SndPos) -> Option<usize> {
        let i = self.segs.partition_point(|s| s.end <= pos);
        (i < self.segs.len() && self.segs[i].start <= pos).then_some(i)
    }

    /// Splits the segment containing `at` so that a segment starts exactly at `at`.
    fn split_at(&mut self, at: SndPos) {
        let Some(i) = self.index_of(at) else { return };
        let seg = &mut self.segs[i];
        if seg.start == at {
            return;
        }
        let mut tail = seg.clone();
        seg.end = at;
        seg.fin = false;
        seg.whole = false;
        tail.start = at;
        // The new piece has the flags of the old one: count it.
        if tail.sacked {
            self.sacked_segs += 1;
        } else {
            self.lost_segs += u64::from(tail.lost);
            self.retrans_out_segs += u64::from(tail.retrans_out);
        }
        self.segs.insert(i + 1, tail);
    }

    /// Payload bytes (FIN not counted) of the segment at `index`.
    pub fn payload_len(&self, index: usize) -> Option<u64> {
        self.segs.get(index).map(|s| s.len() - s.fin as u64)
    }

    /// Splits the segment at `index` so that it is at most `max` long; returns its bounds.
    pub fn limit_segment(&mut self, index: usize, max: u64) -> Option<(SndPos, SndPos, bool)> {
        let seg = self.segs.get(index)?;
        let payload = seg.len() - seg.fin as u64;
        if payload > max && max > 0 {
            let at = seg.start + max;
            self.split_at(at);
        }
        self.segs.get(index).map(|s| (s.start, s.end, s.fin))
    }

    /// Splits the segment at `index` so that at most its last `max` payload bytes (and its FIN)
    /// form a segment of their own; returns that segment's index and bounds.
    pub fn limit_segment_tail(
        &mut self,
        index: usize,
        max: u64,
    ) -> Option<(usize, SndPos, SndPos, bool)> {
        let seg = self.segs.get(index)?;
        let payload = seg.len() - seg.fin as u64;
        let mut index = index;
        if payload > max && max > 0 {
            let at = seg.start + (payload - max);
            self.split_at(at);
            index += 1;
        }
        self.segs.get(index).map(|s| (index, s.start, s.end, s.fin))
    }

    /// Removes everything below `upto`, noting newly delivered segments in `delivered`.
    pub fn ack(&mut self, upto: SndPos, delivered: &mut Delivered) -> AckResult {
        let fack_before = self.fack;
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
            res.segments += 1;
            let len = seg.len();
            if seg.sacked {
                self.sacked_bytes -= len;
                self.sacked_segs -= 1;
            } else {
                res.whole_segments += u64::from(seg.whole);
                delivered.note(&seg, fack_before, false);
                self.fack = self.fack.max(seg.end);
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
                    self.lost_segs -= 1;
                }
                if seg.retrans_out {
                    self.retrans_out_bytes -= len;
                    self.retrans_out_segs -= 1;
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

    /// Marks `[left, right)` as SACKed, noting newly delivered segments in `delivered`
    /// (`fack_before`: [`fack`](Scoreboard::fack) before this ACK); returns bytes newly SACKed.
    pub fn sack(
        &mut self,
        left: SndPos,
        right: SndPos,
        fack_before: SndPos,
        delivered: &mut Delivered,
    ) -> u64 {
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
                delivered.note(seg, fack_before, true);
                self.fack = self.fack.max(seg.end);
                seg.sacked = true;
                newly += len;
                self.sacked_bytes += len;
                self.sacked_segs += 1;
                if seg.lost {
                    self.lost_bytes -= len;
                    self.lost_segs -= 1;
                }
                if seg.retrans_out {
                    seg.retrans_out = false;
                    self.retrans_out_bytes -= len;
                    self.retrans_out_segs -= 1;
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
                    self.lost_segs += 1;
                    if seg.retrans_out {
                        // Marked lost again: its retransmission is no longer presumed in flight.
                        seg.retrans_out = false;
                        self.retrans_out_bytes -= seg.len();
                        self.retrans_out_segs -= 1;
                    }
                } else if seg.retrans_out {
                    // Already retransmitted; leave it to the RTO (RFC 6675 §5 uses HighRxt).
                }
            }
        }
        newly
    }

    /// RFC 8985 §6.2 step 5: every segment sent before the RACK segment and not delivered is lost once `rtt + reo_wnd` has passed since it was
    /// sent; a retransmission counts from its own send time, so a lost retransmission is found
    /// too. Returns whether any segment was newly marked, and the longest wait for those whose
    /// time has not come (the reordering timer).
    pub fn rack_detect(
        &mut self,
        rack: Transmission,
        rtt: Duration,
        reo_wnd: Duration,
        now: Instant,
    ) -> (bool, Option<Duration>) {
        let mut newly = false;
        let mut wait: Option<Duration> = None;
        for seg in self.segs.iter_mut() {
            if (seg.xmit, seg.end) >= (rack.xmit, rack.end) {
                // Sent after the RACK segment. Original transmissions go out in sequence
                // order, and a retransmission is later than its original, so every segment
                // after a never-retransmitted one was sent after it too.
                if seg.retransmits == 0 {
                    break;
                }
                continue;
            }
            // Delivered, or already lost and waiting for its retransmission.
            if seg.sacked || (seg.lost && !seg.retrans_out) {
                continue;
            }
            let deadline = seg.sent_at + rtt + reo_wnd;
            if deadline <= now {
                let len = seg.end - seg.start;
                if seg.lost {
                    // Its retransmission is lost too.
                    seg.retrans_out = false;
                    self.retrans_out_bytes -= len;
                    self.retrans_out_segs -= 1;
                } else {
                    seg.lost = true;
                    self.lost_bytes += len;
                    self.lost_segs += 1;
                }
                newly = true;
            } else {
                let left = deadline - now;
                wait = Some(wait.map_or(left, |w| w.max(left)));
            }
        }
        (newly, wait)
    }

    /// Index of the last segment sent, if it is not SACKed (the tail loss probe resends it).
    pub fn last_unsacked(&self) -> Option<usize> {
        let i = self.segs.len().checked_sub(1)?;
        (!self.segs[i].sacked).then_some(i)
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
                self.lost_segs += 1;
            }
            if seg.retrans_out {
                seg.retrans_out = false;
                self.retrans_out_bytes -= len;
                self.retrans_out_segs -= 1;
            }
        }
    }

    /// The largest payload outstanding.
    pub fn largest_payload(&self) -> u64 {
        self.segs
            .iter()
            .map(|s| s.len() - s.fin as u64)
            .max()
            .unwrap_or(0)
    }

    /// Marks lost every outstanding segment whose payload exceeds `max_payload` (a link on
    /// the path said it was too big: RFC 1191 §6.4, as Linux's `tcp_simple_retransmit`), so
    /// that it is retransmitted, cut to the new size. Returns how many were marked.
    pub fn mark_larger_lost(&mut self, max_payload: u64) -> u64 {
        let mut marked = 0;
        for seg in &mut self.segs {
            let len = seg.end - seg.start;
            if seg.sacked || len - seg.fin as u64 <= max_payload {
                continue;
            }
            if !seg.lost {
                seg.lost = true;
                self.lost_bytes += len;
                self.lost_segs += 1;
                marked += 1;
            }
            if seg.retrans_out {
                seg.retrans_out = false;
                self.retrans_out_bytes -= len;
                self.retrans_out_segs -= 1;
            }
        }
        marked
    }

    /// After a retransmission timeout everything outstanding is presumed lost, and SACK
    /// information is discarded (RFC 2018 §8: the receiver may have reneged).
    pub fn mark_all_lost(&mut self) {
        self.sacked_bytes = 0;
        self.retrans_out_bytes = 0;
        self.lost_bytes = 0;
        self.sacked_segs = 0;
        self.retrans_out_segs = 0;
        self.lost_segs = self.segs.len() as u64;
        for seg in &mut self.segs {
            seg.sacked = false;
            seg.retrans_out = false;
            seg.lost = true;
            self.lost_bytes += seg.end - seg.start;
        }
    }

    /// A timeout proved spurious: segments it presumed lost and that have not been resent yet
    /// are outstanding again (RFC 4015 §3: no go-back-N of data the receiver has).
    pub fn clear_unsent_lost(&mut self) {
        for seg in &mut self.segs {
            if seg.lost && !seg.retrans_out && !seg.sacked {
                seg.lost = false;
                self.lost_bytes -= seg.end - seg.start;
                self.lost_segs -= 1;
            }
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
        self.next_xmit += 1;
        if let Some(seg) = self.segs.get_mut(index) {
            seg.retransmits += 1;
            seg.sent_at = now;
            seg.xmit = self.next_xmit;
            if seg.lost && !seg.retrans_out {
                seg.retrans_out = true;
                self.retrans_out_bytes += seg.end - seg.start;
                self.retrans_out_segs += 1;
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

    /// Panics if the counters disagree with the segments.
    pub fn check_invariants(&self) {
        let (mut sacked, mut lost, mut rout) = (0, 0, 0);
        let (mut sacked_n, mut lost_n, mut rout_n) = (0, 0, 0);
        for s in &self.segs {
            if s.sacked {
                sacked += s.len();
                sacked_n += 1;
            } else {
                if s.lost {
                    lost += s.len();
                    lost_n += 1;
                }
                if s.retrans_out {
                    rout += s.len();
                    rout_n += 1;
                }
            }
        }
        assert_eq!(
            (sacked, lost, rout),
            (self.sacked_bytes, self.lost_bytes, self.retrans_out_bytes)
        );
        assert_eq!(
            (sacked_n, lost_n, rout_n),
            (self.sacked_segs, self.lost_segs, self.retrans_out_segs)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: u64) -> SndPos {
        SndPos::new(n)
    }

    #[test]
    fn a_spurious_timeout_clears_the_lost_marks_of_what_was_not_resent() {
        let now = Instant::now();
        let mut sb = Scoreboard::default();
        for i in 0..4u64 {
            sb.on_send(p(1 + i * 100), p(1 + (i + 1) * 100), false, now);
        }
        sb.mark_all_lost();
        assert_eq!(sb.lost_bytes(), 400);
        // The timeout resent segment 0; then it proved spurious (RFC 4015 §3).
        sb.on_retransmit(0, now);
        sb.clear_unsent_lost();
        sb.check_invariants();
        assert_eq!(
            sb.lost_bytes(),
            100,
            "the retransmitted one stays accounted as resent"
        );
        assert_eq!(sb.next_lost(), None, "nothing is resent again");
        assert_eq!(
            sb.pipe(400),
            400,
            "3 originals and 1 retransmission in flight"
        );
    }

    #[test]
    fn sack_marks_holes_lost_after_three_segments() {
        let now = Instant::now();
        let mut sb = Scoreboard::default();
        for i in 0..6u64 {
            sb.on_send(p(1 + i * 100), p(1 + (i + 1) * 100), false, now);
        }
        // Segment 0 lost; 1..=3 SACKed.
        let mut d = Delivered::default();
        sb.sack(p(101), p(401), p(0), &mut d);
        assert_eq!(d.sacked_sample_sent_at, Some(now));
        assert!(!d.reordering);
        assert!(sb.mark_lost(3, 100));
        assert!(sb.head_lost());
        assert_eq!(sb.next_lost(), Some(0));
        // flight 600, sacked 300, lost 100 -> pipe 200 (segments 4 and 5).
        assert_eq!(sb.pipe(600), 200);
        sb.on_retransmit(0, now);
        assert_eq!(sb.pipe(600), 300);
        assert_eq!(sb.holes(), 1);
        sb.check_invariants();
        let r = sb.ack(p(401), &mut d);
        assert_eq!(r.newly_acked, 100);
        assert!(r.rtt_sent_at.is_none());
        sb.check_invariants();
        assert_eq!(sb.pipe(200), 200);
    }

    #[test]
    fn segment_counts_follow_splits_and_pieces_count_once() {
        let now = Instant::now();
        let mut sb = Scoreboard::default();
        for i in 0..4u64 {
            sb.on_send(p(1 + i * 100), p(1 + (i + 1) * 100), false, now);
        }
        assert_eq!(sb.pipe_segments(), 4);
        let mut d = Delivered::default();
        // A SACK of half of segment 1 splits it: 5 entries, one SACKed.
        sb.sack(p(151), p(201), p(0), &mut d);
        sb.check_invariants();
        assert_eq!(sb.pipe_segments(), 4);
        sb.mark_lost(1, 100);
        sb.check_invariants();
        let i = sb.next_lost().expect("segment 0 is lost");
        sb.on_retransmit(i, now);
        sb.check_invariants();
        // A receiver acknowledging segment 2 byte by byte makes it count once.
        let mut whole = 0;
        for upto in 202..=301 {
            whole += sb.ack(p(upto), &mut d).whole_segments;
            sb.check_invariants();
        }
        // Segments 0 and 2 (and the SACKed tail of 1, already counted as delivered).
        assert_eq!(whole, 2);
        sb.mark_all_lost();
        sb.check_invariants();
        assert_eq!(sb.pipe_segments(), 0);
    }

    #[test]
    fn partial_sack_and_ack_split_segments() {
        let now = Instant::now();
        let mut sb = Scoreboard::default();
        sb.on_send(p(1), p(1001), false, now);
        let mut d = Delivered::default();
        assert_eq!(sb.sack(p(501), p(1001), p(0), &mut d), 500);
        let r = sb.ack(p(301), &mut d);
        assert_eq!(r.newly_acked, 300);
        sb.check_invariants();
        sb.mark_all_lost();
        assert_eq!(sb.lost_bytes(), 700);
        sb.check_invariants();
    }
}
