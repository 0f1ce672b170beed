//! A bound on the queue a connection builds in the network
//! ([`ConnectionConfig::queue_delay_limit`](crate::ConnectionConfig::queue_delay_limit)).
//!
//! A loss-based controller (CUBIC, NewReno) grows its window until a queue overflows; behind a
//! deep buffer (an ADSL modem's, seconds long) that queue is the delay every packet of the
//! connection then sees, its own ACKs for the other direction included. Here delay is a
//! congestion signal too: when *every* sample of a round trip shows a queue above the limit —
//! a standing queue, not a burst — the window is reduced as for a loss (the controller's own
//! response, once per round trip, as for an ECN mark, RFC 3168 §6.1.2), and keeps being
//! reduced each round trip until the queue is back under the limit. The minimum over a round
//! trip is the standing-queue estimate Copa and BBR use. The reduction goes at least down to
//! what the path carries in its round trip without the queue plus half the limit (the rate
//! acknowledged during the round times that), so a queue far above the limit drains in one
//! round trip rather than one 30 % step per (long) round trip.
//!
//! **Which queue.** The RTT also holds the queue in front of the ACKs: a tunnel's outer
//! connection, or any two-way transfer, sees its peer's upload in every sample, and would
//! shrink its window for a queue it does not build. So where both ends send TCP timestamps
//! (RFC 7323) the queue is measured one way, as LEDBAT does (RFC 6817 §3.4.1): an ACK's TSval
//! (the peer's clock when it acknowledged) minus its TSecr (this end's clock when it sent what
//! is acknowledged) is the forward delay plus the clocks' offset, and its excess over the
//! smallest such value (RFC 6817 §4.2's base delay) is the forward queue. That needs the
//! peer's clock to tick in milliseconds, as this end's does (squarepeg's TCP and Linux both
//! do, Linux's optional microsecond timestamps aside). It is assumed from the first sample —
//! slow start needs the right measure at once — and checked three ways: a one-way queue longer
//! than the sample's whole round trip is impossible (a faster clock shows one at once); the
//! peer's ticks against this end's time after [`PROVISIONAL`] (within a factor of five: the
//! ACKs' own queueing skews so short a look) and after [`CALIBRATION`] (within a factor of
//! two). That tells milliseconds from the other clocks in use (10 ms, microseconds) however
//! the ACKs queue. For a peer whose clock runs otherwise, and without timestamps, the RTT's
//! excess over the smallest RTT is the measure. Duplicate ACKs echo an older TSval (RFC 7323 §4.3): their samples measure
//! by RTT.
//!
//! Slow start doubles the window each round trip, so waiting for the end of a round lets the
//! queue grow four times past the limit before the first reduction. In slow start the verdict
//! comes as soon as [`SLOW_START_SAMPLES`] samples of the round are all above the limit (as
//! HyStart++ decides on its first samples of a round, RFC 9406 §4.2).
//!
//! A queue this sender cannot drain — another, loss-based flow keeps it full, or the route
//! changed and the path's delay grew — would push the window to its floor for good (the known
//! weakness of delay-based control, TCP Vegas against Reno). So the base is taken to have
//! moved by the round's queue when a reduction did not shorten the queue (the round after the
//! next one — the next carries what was sent before the reduction — still has at least three
//! quarters of what was queued when the reduction took effect; the reduction is then undone,
//! unless a loss came since or it ended slow start), or when a congested round ends with the
//! window already at its floor. A loss response restarts the rounds the same way as a
//! reduction, so that one congestion episode is not answered twice. The sender then competes from there instead of starving.
//! Against a loss-based flow that keeps filling a shared buffer it still gets a small share: a
//! bound on the queue is for paths whose queue is the sender's own (an access link, a
//! tunnel's outer connection).

use std::time::{Duration, Instant};

use crate::seq::SndPos;

/// Samples of a round that decide in slow start (RFC 9406's N_RTT_SAMPLE).
pub const SLOW_START_SAMPLES: u32 = 8;

/// How long the peer's timestamp clock is watched before one-way delays are used (if it
/// ticks at a fifth to five times this end's rate).
pub const PROVISIONAL: Duration = Duration::from_millis(200);

/// How long the peer's timestamp clock is watched to confirm it ticks in milliseconds (at
/// half to twice this end's rate).
pub const CALIBRATION: Duration = Duration::from_secs(2);

/// The sender's state at an ACK, for [`DelayBound::on_ack`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct SenderState {
    /// SND.UNA and SND.NXT.
    pub(crate) una: SndPos,
    pub(crate) nxt: SndPos,
    /// The window cannot be reduced further.
    pub(crate) at_floor: bool,
    /// The window is in slow start.
    pub(crate) slow_start: bool,
    /// Not in loss recovery (which has had its response): a verdict may act.
    pub(crate) may_reduce: bool,
}

/// One delay sample: an RTT, and the ACK's timestamps when it had usable ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DelaySample {
    pub(crate) rtt: Duration,
    /// When the ACK arrived (and this end's timestamp clock then, in milliseconds), its TSval
    /// (the peer's clock) and its TSecr (this end's clock when it sent what the ACK answers).
    pub(crate) stamps: Option<Stamps>,
}

/// An ACK's timestamps, with the time it arrived.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamps {
    pub(crate) now: Instant,
    pub(crate) local: u32,
    pub(crate) tsval: u32,
    pub(crate) tsecr: u32,
}

/// Whether the peer's timestamps tick in milliseconds, as this end's do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerClock {
    /// Taken to, and watched since (local time, its TSval then).
    Learning { since: Instant, first: u32 },
    /// Confirmed.
    Milliseconds,
    /// Another rate: one-way delays are not measured.
    Unusable,
}

/// The queue bound's state for one connection.
#[derive(Clone, Debug)]
pub(crate) struct DelayBound {
    limit: Duration,
    /// The smallest RTT, moved up by rebases while RTTs measure the queue.
    base_rtt: Option<Duration>,
    peer_clock: Option<PeerClock>,
    /// The smallest TSval − TSecr (wrapping, milliseconds), moved up by rebases.
    base_one_way: Option<u32>,
    /// The round trip now measured ends when SND.UNA reaches this (SND.NXT when it began).
    round_end: Option<SndPos>,
    /// The smallest queue of that round trip's samples, its smallest RTT, and how many
    /// samples there were.
    round_queue: Option<Duration>,
    round_rtt: Option<Duration>,
    round_samples: u32,
    /// When the round began, and the bytes acknowledged since: the path's rate.
    round_started: Option<Instant>,
    round_acked: u64,
    /// The round now measured carries what was sent before a reduction: no verdict.
    skip_round: bool,
    /// The round queue that led to the last reduction, until a round shows its effect.
    reduced_at: Option<Duration>,
}

/// What the end of a round trip calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RoundVerdict {
    /// The queue stayed under the limit at some point of the round (or no samples).
    Clear,
    /// A standing queue above the limit: reduce the window, at least to `drained` bytes (what
    /// the round's rate carries in its round trip without the queue plus half the limit;
    /// `u64::MAX` when the round said nothing of the rate).
    Reduce { drained: u64 },
    /// A standing queue above the limit that the last reduction did not shorten (`undo`: give
    /// the reduction back), or with the window at its floor: the base moved.
    Rebased { undo: bool },
}

impl DelayBound {
    pub(crate) fn new(limit: Duration) -> Self {
        DelayBound {
            limit,
            base_rtt: None,
            peer_clock: None,
            base_one_way: None,
            round_end: None,
            round_queue: None,
            round_rtt: None,
            round_samples: 0,
            round_started: None,
            round_acked: 0,
            skip_round: false,
            reduced_at: None,
        }
    }

    /// Whether the queue is measured one way now.
    fn one_way(&self) -> bool {
        matches!(
            self.peer_clock,
            Some(PeerClock::Learning { .. } | PeerClock::Milliseconds)
        )
    }

    /// The window that leaves half the limit queued: what the round's acknowledgements
    /// carried per second, times the round trip without the queue plus half the limit.
    fn drained_window(&self, now: Instant, queue: Duration) -> u64 {
        let (Some(started), Some(rtt)) = (self.round_started, self.round_rtt) else {
            return u64::MAX;
        };
        let elapsed = now.saturating_duration_since(started);
        if elapsed < Duration::from_millis(1) || self.round_acked == 0 {
            return u64::MAX;
        }
        let target = rtt.saturating_sub(queue) + self.limit / 2;
        (u128::from(self.round_acked) * target.as_nanos() / elapsed.as_nanos())
            .min(u128::from(u64::MAX)) as u64
    }

    /// A delay sample.
    pub(crate) fn on_sample(&mut self, sample: DelaySample) {
        let rtt = sample.rtt;
        let base_rtt = *self.base_rtt.get_or_insert(rtt);
        if rtt < base_rtt {
            self.base_rtt = Some(rtt);
        }
        if let Some(st) = sample.stamps {
            self.learn_peer_clock(st.now, st.tsval);
        }
        let queue = match sample.stamps {
            Some(st) if self.one_way() => {
                let d = st.tsval.wrapping_sub(st.tsecr);
                let base = *self.base_one_way.get_or_insert(d);
                let above = d.wrapping_sub(base) as i32;
                if above < 0 {
                    self.base_one_way = Some(d);
                }
                let queue = Duration::from_millis(above.max(0) as u64);
                // The round trip the TSecr measures (from the oldest segment the ACK covers).
                let round_trip = u64::from(st.local.wrapping_sub(st.tsecr));
                if queue > Duration::from_millis(round_trip + 2) {
                    // Longer one way than the round trip: not a millisecond clock (2 ms for
                    // the two clocks' ticks).
                    self.clock_unusable();
                    rtt.saturating_sub(self.base_rtt.unwrap_or(rtt))
                } else {
                    queue
                }
            }
            // One-way delays are measured but this ACK had none: no queue estimate.
            _ if self.one_way() => return,
            _ => rtt.saturating_sub(self.base_rtt.unwrap_or(rtt)),
        };
        self.round_queue = Some(self.round_queue.map_or(queue, |q| q.min(queue)));
        self.round_rtt = Some(self.round_rtt.map_or(rtt, |r| r.min(rtt)));
        self.round_samples += 1;
    }

    /// Watches the peer's TSvals against this end's clock for [`CALIBRATION`].
    fn learn_peer_clock(&mut self, now: Instant, tsval: u32) {
        let Some(PeerClock::Learning { since, first, .. }) = self.peer_clock else {
            if self.peer_clock.is_none() {
                self.peer_clock = Some(PeerClock::Learning {
                    since: now,
                    first: tsval,
                });
            }
            return;
        };
        let elapsed = now.saturating_duration_since(since);
        if elapsed < PROVISIONAL {
            return;
        }
        let ticks = f64::from(tsval.wrapping_sub(first));
        let rate = ticks / (elapsed.as_secs_f64() * 1000.0);
        // Within a factor of five after PROVISIONAL, of two after CALIBRATION.
        let (low, high) = if elapsed >= CALIBRATION {
            (0.5, 2.0)
        } else {
            (0.2, 5.0)
        };
        if !(low..=high).contains(&rate) {
            self.clock_unusable();
        } else if elapsed >= CALIBRATION {
            self.peer_clock = Some(PeerClock::Milliseconds);
        }
    }

    /// The peer's clock is not one of milliseconds: RTTs measure the queue from now on, and
    /// the round so far, measured in the other unit, starts afresh.
    fn clock_unusable(&mut self) {
        self.peer_clock = Some(PeerClock::Unusable);
        self.round_queue = None;
        self.round_rtt = None;
        self.round_samples = 0;
        self.reduced_at = None;
    }

    /// After an ACK at `now` that acknowledged `acked` new bytes, the sender as `sender` says.
    /// At the end of a round trip (in slow start: once [`SLOW_START_SAMPLES`] samples are all
    /// above the limit), says whether its samples all showed a queue above the limit, and
    /// starts the next round.
    pub(crate) fn on_ack(&mut self, now: Instant, acked: u64, sender: SenderState) -> RoundVerdict {
        let SenderState {
            una,
            nxt,
            at_floor,
            slow_start,
            may_reduce,
        } = sender;
        let Some(end) = self.round_end else {
            self.start_round(now, nxt);
            return RoundVerdict::Clear;
        };
        self.round_acked += acked;
        let queued = self.round_queue.filter(|&q| q > self.limit);
        let early = slow_start && self.round_samples >= SLOW_START_SAMPLES && queued.is_some();
        if una < end && !early {
            return RoundVerdict::Clear;
        }
        let drained = queued.map_or(u64::MAX, |q| self.drained_window(now, q));
        let had_samples = self.round_samples > 0;
        self.start_round(now, nxt);
        if std::mem::take(&mut self.skip_round) {
            // What was queued when the reduction took effect: the next round must show less.
            if let (Some(before), Some(q)) = (self.reduced_at, queued) {
                self.reduced_at = Some(before.max(q));
            }
            return RoundVerdict::Clear;
        }
        let Some(queue) = queued else {
            // A round with samples under the limit: any reduction worked. (One without samples
            // says nothing.)
            if had_samples {
                self.reduced_at = None;
            }
            return RoundVerdict::Clear;
        };
        if !may_reduce {
            return RoundVerdict::Clear;
        }
        let ineffective = self
            .reduced_at
            .take()
            .is_some_and(|before| queue * 4 > before * 3);
        if ineffective || at_floor {
            self.rebase(queue);
            return RoundVerdict::Rebased { undo: ineffective };
        }
        self.reduced_at = Some(queue);
        self.skip_round = true;
        RoundVerdict::Reduce { drained }
    }

    /// The base moves up by `queue`, the round's: what it saw is the path's delay now.
    fn rebase(&mut self, queue: Duration) {
        if self.one_way() {
            let ms = queue.as_millis().min(u128::from(u32::MAX)) as u32;
            self.base_one_way = self.base_one_way.map(|b| b.wrapping_add(ms));
        } else {
            self.base_rtt = self.base_rtt.map(|b| b + queue);
        }
    }

    /// The controller answered a loss (fast recovery, or a repair by a loss probe): the round
    /// now running, and the next, carry what was sent before it; no reduction is pending a
    /// verdict. (A timeout needs none of this: no verdict acts until its recovery is over.)
    pub(crate) fn after_loss_response(&mut self, nxt: SndPos) {
        self.new_round(None, nxt);
        self.skip_round = true;
        self.reduced_at = None;
    }

    fn start_round(&mut self, now: Instant, nxt: SndPos) {
        self.new_round(Some(now), nxt);
    }

    /// A round that ends at `nxt`, begun at `started` (`None`: its rate is not measured).
    fn new_round(&mut self, started: Option<Instant>, nxt: SndPos) {
        self.round_end = Some(nxt);
        self.round_queue = None;
        self.round_rtt = None;
        self.round_samples = 0;
        self.round_started = started;
        self.round_acked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seq::Pos;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn pos(n: u64) -> SndPos {
        Pos::ZERO + n
    }

    fn st(una: SndPos, nxt: SndPos, at_floor: bool, slow_start: bool) -> SenderState {
        SenderState {
            una,
            nxt,
            at_floor,
            slow_start,
            may_reduce: true,
        }
    }

    fn rtt(rtt: Duration) -> DelaySample {
        DelaySample { rtt, stamps: None }
    }

    static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

    #[test]
    fn only_a_whole_round_above_the_limit_reduces() {
        let mut d = DelayBound::new(ms(30));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(0), pos(1000), false, false)),
            RoundVerdict::Clear
        );
        d.on_sample(rtt(ms(70)));
        d.on_sample(rtt(ms(120)));
        // One sample under base + limit in the round: a burst, not a standing queue.
        assert_eq!(
            d.on_ack(*START, 0, st(pos(1000), pos(2000), false, false)),
            RoundVerdict::Clear
        );
        d.on_sample(rtt(ms(101)));
        d.on_sample(rtt(ms(140)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(1500), pos(2500), false, false)),
            RoundVerdict::Clear,
            "mid-round"
        );
        assert_eq!(
            d.on_ack(*START, 0, st(pos(2000), pos(3000), false, false)),
            RoundVerdict::Reduce { drained: u64::MAX }
        );
        // The next round carries what was sent before the reduction: no verdict.
        d.on_sample(rtt(ms(160)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(3000), pos(4000), false, false)),
            RoundVerdict::Clear
        );
        // A round without samples says nothing.
        assert_eq!(
            d.on_ack(*START, 0, st(pos(4000), pos(5000), false, false)),
            RoundVerdict::Clear
        );
        d.on_sample(rtt(ms(100)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(5000), pos(6000), false, false)),
            RoundVerdict::Clear
        );
    }

    #[test]
    fn slow_start_decides_on_the_first_samples_of_a_round() {
        let mut d = DelayBound::new(ms(30));
        d.on_ack(*START, 0, st(pos(0), pos(1000), false, true));
        d.on_sample(rtt(ms(70)));
        d.on_ack(*START, 0, st(pos(1000), pos(100_000), false, true));
        for _ in 0..SLOW_START_SAMPLES - 1 {
            d.on_sample(rtt(ms(150)));
        }
        assert_eq!(
            d.on_ack(*START, 0, st(pos(2000), pos(100_000), false, true)),
            RoundVerdict::Clear
        );
        d.on_sample(rtt(ms(150)));
        // Not in slow start: the round must end.
        assert_eq!(
            d.on_ack(*START, 0, st(pos(3000), pos(100_000), false, false)),
            RoundVerdict::Clear
        );
        let verdict = d.on_ack(*START, 0, st(pos(4000), pos(100_000), false, true));
        assert_eq!(verdict, RoundVerdict::Reduce { drained: u64::MAX });
        // A new round began at the verdict (and it carries what was sent before).
        d.on_sample(rtt(ms(150)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(100_000), pos(200_000), false, true)),
            RoundVerdict::Clear
        );
    }

    #[test]
    fn the_reduction_drains_to_the_rounds_rate_times_the_base_plus_half_the_limit() {
        let t0 = *START;
        let mut d = DelayBound::new(ms(30));
        d.on_ack(t0, 0, st(pos(0), pos(1000), false, false));
        d.on_sample(rtt(ms(70)));
        d.on_ack(t0, 1000, st(pos(1000), pos(200_000), false, false));
        // 100 kB acknowledged in the 200 ms the round lasted: 500 kB/s, all samples queued.
        d.on_sample(rtt(ms(200)));
        d.on_ack(
            t0 + ms(100),
            50_000,
            st(pos(51_000), pos(300_000), false, false),
        );
        let verdict = d.on_ack(
            t0 + ms(200),
            50_000,
            st(pos(200_000), pos(300_000), false, false),
        );
        // 500 kB/s × (70 + 15) ms.
        assert_eq!(verdict, RoundVerdict::Reduce { drained: 42_500 });
    }

    #[test]
    fn a_queue_the_floor_cannot_drain_moves_the_base() {
        let mut d = DelayBound::new(ms(30));
        d.on_ack(*START, 0, st(pos(0), pos(1000), false, false));
        d.on_sample(rtt(ms(70)));
        d.on_ack(*START, 0, st(pos(1000), pos(2000), false, false));
        d.on_sample(rtt(ms(200)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(2000), pos(3000), true, false)),
            RoundVerdict::Rebased { undo: false }
        );
        // From the new base, 200 + 30 ms is the limit.
        d.on_sample(rtt(ms(220)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(3000), pos(4000), false, false)),
            RoundVerdict::Clear
        );
        d.on_sample(rtt(ms(231)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(4000), pos(5000), false, false)),
            RoundVerdict::Reduce { drained: u64::MAX }
        );
    }

    #[test]
    fn a_reduction_that_left_the_queue_moves_the_base_and_is_undone() {
        let mut d = DelayBound::new(ms(30));
        d.on_ack(*START, 0, st(pos(0), pos(1000), false, false));
        d.on_sample(rtt(ms(70)));
        d.on_ack(*START, 0, st(pos(1000), pos(2000), false, false));
        // The route changed: 300 ms from now on, whatever the window.
        d.on_sample(rtt(ms(300)));
        assert!(matches!(
            d.on_ack(*START, 0, st(pos(2000), pos(3000), false, false)),
            RoundVerdict::Reduce { .. }
        ));
        d.on_sample(rtt(ms(300)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(3000), pos(4000), false, false)),
            RoundVerdict::Clear
        );
        d.on_sample(rtt(ms(290)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(4000), pos(5000), false, false)),
            RoundVerdict::Rebased { undo: true }
        );
        // A reduction that worked is no reason: the queue went from 230 to 60 ms.
        let mut d = DelayBound::new(ms(30));
        d.on_ack(*START, 0, st(pos(0), pos(1000), false, false));
        d.on_sample(rtt(ms(70)));
        d.on_ack(*START, 0, st(pos(1000), pos(2000), false, false));
        d.on_sample(rtt(ms(300)));
        d.on_ack(*START, 0, st(pos(2000), pos(3000), false, false));
        d.on_ack(*START, 0, st(pos(3000), pos(4000), false, false));
        d.on_sample(rtt(ms(130)));
        assert!(matches!(
            d.on_ack(*START, 0, st(pos(4000), pos(5000), false, false)),
            RoundVerdict::Reduce { .. }
        ));
    }

    #[test]
    fn with_millisecond_timestamps_only_the_forward_queue_counts() {
        let t0 = *START;
        let mut d = DelayBound::new(ms(30));
        // The peer's clock: 1 tick per ms, an arbitrary offset (and wrapping).
        let peer = |at: Duration| (u32::MAX - 500).wrapping_add(at.as_millis() as u32);
        let ours = |at: Duration| 7_000u32.wrapping_add(at.as_millis() as u32);
        // A sample for data sent at `sent` that took `forward` one way and `rtt` round trip.
        let sample = |sent: Duration, forward: u64, rtt: u64| DelaySample {
            rtt: ms(rtt),
            stamps: Some(Stamps {
                now: t0 + sent + ms(rtt),
                local: ours(sent + ms(rtt)),
                tsval: peer(sent + ms(forward)),
                tsecr: ours(sent),
            }),
        };
        let mut una = 0;
        let mut round = |d: &mut DelayBound, at: Duration, s: DelaySample| {
            d.on_sample(s);
            una += 1000;
            d.on_ack(t0 + at, 1000, st(pos(una), pos(una + 1000), false, false))
        };
        d.on_ack(t0, 0, st(pos(0), pos(1000), false, false));
        // Calibration: 35 ms each way, then the reverse path's queue grows to 100 ms.
        for i in 0..30 {
            let at = ms(100 * i);
            assert_eq!(round(&mut d, at, sample(at, 35, 70)), RoundVerdict::Clear);
        }
        assert_eq!(
            d.peer_clock,
            Some(PeerClock::Milliseconds),
            "the peer's clock ticks in milliseconds"
        );
        for i in 30..40 {
            let at = ms(100 * i);
            assert_eq!(
                round(&mut d, at, sample(at, 35, 170)),
                RoundVerdict::Clear,
                "a queue in front of the ACKs is not this sender's"
            );
        }
        // A forward queue of 40 ms is.
        let at = ms(4000);
        assert!(matches!(
            round(&mut d, at, sample(at, 75, 210)),
            RoundVerdict::Reduce { .. }
        ));
    }

    #[test]
    fn a_peer_clock_of_another_rate_leaves_the_rtt_as_the_measure() {
        let t0 = *START;
        let mut d = DelayBound::new(ms(30));
        d.on_ack(t0, 0, st(pos(0), pos(1000), false, false));
        for i in 0..30u32 {
            let at = ms(100 * u64::from(i));
            // 10 ms ticks.
            d.on_sample(DelaySample {
                rtt: ms(70),
                stamps: Some(Stamps {
                    now: t0 + at,
                    local: 79 + 100 * i,
                    tsval: 50 + 10 * i,
                    tsecr: 9 + 100 * i,
                }),
            });
        }
        assert_eq!(d.peer_clock, Some(PeerClock::Unusable));
        d.on_ack(t0, 0, st(pos(1000), pos(2000), false, false));
        d.on_sample(rtt(ms(170)));
        assert!(matches!(
            d.on_ack(t0, 0, st(pos(2000), pos(3000), false, false)),
            RoundVerdict::Reduce { .. }
        ));
    }

    #[test]
    fn a_microsecond_peer_clock_is_found_out_before_it_counts() {
        let t0 = *START;
        let mut d = DelayBound::new(ms(30));
        d.on_ack(t0, 0, st(pos(0), pos(1000), false, true));
        let mut una = 0;
        for i in 0..40u32 {
            let at = ms(10 * u64::from(i));
            // The peer's clock ticks 1000 times per ms; the path's RTT stays 70 ms.
            d.on_sample(DelaySample {
                rtt: ms(70),
                stamps: Some(Stamps {
                    now: t0 + at,
                    local: 75 + 10 * i,
                    tsval: 1_000 * 10 * i,
                    tsecr: 5 + 10 * i,
                }),
            });
            una += 1000;
            assert_eq!(
                d.on_ack(t0 + at, 1000, st(pos(una), pos(una + 1000), false, true)),
                RoundVerdict::Clear,
                "sample {i}: no queue on this path"
            );
        }
        assert_eq!(d.peer_clock, Some(PeerClock::Unusable));
    }

    #[test]
    fn no_verdict_acts_in_loss_recovery_and_a_loss_restarts_the_rounds() {
        let mut d = DelayBound::new(ms(30));
        d.on_ack(*START, 0, st(pos(0), pos(1000), false, false));
        d.on_sample(rtt(ms(70)));
        d.on_ack(*START, 0, st(pos(1000), pos(2000), false, false));
        d.on_sample(rtt(ms(150)));
        let mut recovering = st(pos(2000), pos(3000), false, false);
        recovering.may_reduce = false;
        assert_eq!(d.on_ack(*START, 0, recovering), RoundVerdict::Clear);
        // A loss response: the round now running carries what was sent before it.
        d.after_loss_response(pos(4000));
        d.on_sample(rtt(ms(150)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(4000), pos(5000), false, false)),
            RoundVerdict::Clear,
            "the episode was answered"
        );
        d.on_sample(rtt(ms(150)));
        assert!(matches!(
            d.on_ack(*START, 0, st(pos(5000), pos(6000), false, false)),
            RoundVerdict::Reduce { .. }
        ));
        // After the skipped round, an empty round keeps the verdict pending: a queue as long
        // as before is then an ineffective reduction.
        d.on_sample(rtt(ms(150)));
        d.on_ack(*START, 0, st(pos(6000), pos(7000), false, false));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(7000), pos(8000), false, false)),
            RoundVerdict::Clear
        );
        d.on_sample(rtt(ms(150)));
        assert_eq!(
            d.on_ack(*START, 0, st(pos(8000), pos(9000), false, false)),
            RoundVerdict::Rebased { undo: true }
        );
    }
}
