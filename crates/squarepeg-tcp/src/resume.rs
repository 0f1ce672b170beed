//! Cached path state and Careful Resume (RFC 9040 temporal sharing; RFC 9959, formerly
//! draft-ietf-tsvwg-careful-resume, "Convergence of Congestion Control from Retained State").
//!
//! A short transfer spends most of its life in slow start: 1 MB over a path of 100 Mbit/s and
//! 117 ms needs about seven round trips from an initial window of ten segments (McTiny,
//! appendix A), although the path could carry it in one. A sender that talked to the same host
//! a moment ago already knows what the path carried. RFC 9040 §4 (temporal sharing) lets a new
//! connection start from the RTT and window an earlier one to the same host ended with; Careful
//! Resume says how to do that without harming anyone if the path changed since:
//!
//! * **Observe** (in any earlier connection): the capacity the connection used, measured as the
//!   most bytes acknowledged within one round trip (`Observer`), and its minimum RTT, are
//!   kept per remote host in the endpoint's [`PathCache`] when the connection ends.
//! * **Reconnaissance**: the new connection starts with the ordinary initial window and the
//!   ordinary controller. Once its initial window is acknowledged without congestion, its RTT
//!   confirms the path (within [saved_rtt / 2, 10 · saved_rtt]) and it has more to send than
//!   its window allows, it jumps.
//! * **Unvalidated**: cwnd = jump_cwnd = saved_cwnd / 2, sent *paced* at jump_cwnd per current
//!   RTT, which is never faster than the rate observed before (the RTT is at least half the
//!   saved one). PipeSize, starting at the cwnd before the jump, counts what gets acknowledged.
//! * **Validating**: once the first unvalidated segment is acknowledged, cwnd falls to the
//!   flight size and the controller's ordinary rules run again; the phase ends when the last
//!   unvalidated segment is acknowledged (Normal).
//! * **Safe Retreat**: a loss of unvalidated data sets cwnd to PipeSize / 2 (what was
//!   validated, halved) and holds it there until the last unvalidated segment is
//!   acknowledged; then ssthresh = PipeSize and the ordinary controller continues.
//!
//! Sans-IO like the rest of the crate: the cache is keyed by IP address, its entries carry the
//! `Instant` they were saved at, and the connection's pacing deadline is a timer in the
//! connection's timer table (`conn::Timer::Pacing`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Path state kept for one remote host (RFC 9040 §4: RTT and window; Careful Resume's
/// saved_rtt and saved_cwnd).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathRecord {
    /// saved_rtt: the minimum RTT the earlier connection measured.
    pub rtt: Duration,
    /// saved_cwnd in bytes: the most bytes acknowledged within one round trip.
    pub cwnd: u64,
    /// When it was saved (entries expire [`PathCacheConfig::lifetime`] later).
    pub saved_at: Instant,
}

/// An entry of the cache as a tool may keep it between processes: the age replaces the
/// `Instant`, which means nothing outside this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedPath {
    pub remote: IpAddr,
    pub rtt: Duration,
    pub cwnd: u64,
    /// How long ago the state was observed.
    pub age: Duration,
}

/// Bounds of the per-endpoint path cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathCacheConfig {
    /// Most hosts kept; when full, the oldest entry goes. 0 keeps nothing.
    pub capacity: usize,
    /// How long an entry may be used. RFC 9959 leaves the lifetime open and points at RFC 7661,
    /// whose non-validated period SHOULD NOT exceed five minutes; we take that.
    pub lifetime: Duration,
}

impl PathCacheConfig {
    pub fn new(capacity: usize, lifetime: Duration) -> Self {
        PathCacheConfig { capacity, lifetime }
    }
}

impl Default for PathCacheConfig {
    fn default() -> Self {
        PathCacheConfig {
            capacity: 1024,
            lifetime: Duration::from_secs(300),
        }
    }
}

/// The endpoint's cache of path state per remote host (RFC 9040 temporal sharing). Bounded in
/// entries; entries expire. Only one connection may use an entry at a time (RFC 9959,
/// Reconnaissance: "only one connection can use a specific set of saved CC parameters"), so a
/// connection takes it ([`PathCache::take`]) and the state it ends with is saved anew.
#[derive(Clone, Debug)]
pub struct PathCache {
    config: PathCacheConfig,
    entries: HashMap<IpAddr, PathRecord>,
}

impl PathCache {
    pub fn new(config: PathCacheConfig) -> Self {
        PathCache {
            config,
            entries: HashMap::new(),
        }
    }

    pub fn config(&self) -> PathCacheConfig {
        self.config
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn fresh(&self, r: &PathRecord, now: Instant) -> bool {
        now.saturating_duration_since(r.saved_at) <= self.config.lifetime
    }

    /// The unexpired entry for `remote`, if any.
    pub fn get(&self, remote: IpAddr, now: Instant) -> Option<PathRecord> {
        self.entries
            .get(&remote)
            .copied()
            .filter(|r| self.fresh(r, now))
    }

    /// Removes and returns the unexpired entry for `remote` (an expired one is dropped).
    pub fn take(&mut self, remote: IpAddr, now: Instant) -> Option<PathRecord> {
        let r = self.entries.remove(&remote)?;
        self.fresh(&r, now).then_some(r)
    }

    /// Saves (or replaces) the entry for `remote`, evicting expired entries and then the
    /// oldest one when full.
    pub fn insert(&mut self, remote: IpAddr, record: PathRecord) {
        if self.config.capacity == 0 {
            return;
        }
        if !self.entries.contains_key(&remote) && self.entries.len() >= self.config.capacity {
            let now = record.saved_at;
            let lifetime = self.config.lifetime;
            self.entries
                .retain(|_, r| now.saturating_duration_since(r.saved_at) <= lifetime);
            while self.entries.len() >= self.config.capacity {
                let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, r)| r.saved_at)
                    .map(|(ip, _)| *ip)
                else {
                    break;
                };
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(remote, record);
    }

    /// Forgets `remote` (Safe Retreat deletes the state that proved wrong).
    pub fn remove(&mut self, remote: IpAddr) {
        self.entries.remove(&remote);
    }

    /// Every unexpired entry, with its age, for a tool to keep.
    pub fn export(&self, now: Instant) -> Vec<SavedPath> {
        let mut v: Vec<SavedPath> = self
            .entries
            .iter()
            .filter(|(_, r)| self.fresh(r, now))
            .map(|(ip, r)| SavedPath {
                remote: *ip,
                rtt: r.rtt,
                cwnd: r.cwnd,
                age: now.saturating_duration_since(r.saved_at),
            })
            .collect();
        v.sort_by_key(|s| s.age);
        v
    }

    /// Loads exported entries (expired ones are skipped; the bound holds).
    pub fn import(&mut self, now: Instant, saved: &[SavedPath]) {
        for s in saved {
            if s.age > self.config.lifetime || s.cwnd == 0 || s.rtt.is_zero() {
                continue;
            }
            let saved_at = now.checked_sub(s.age).unwrap_or(now);
            self.insert(
                s.remote,
                PathRecord {
                    rtt: s.rtt,
                    cwnd: s.cwnd,
                    saved_at,
                },
            );
        }
    }
}

/// The phase of Careful Resume a connection is in (RFC 9959 Figure 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResumePhase {
    /// Ordinary congestion control: no saved state, the path was not confirmed, or resume is
    /// over.
    #[default]
    Normal,
    Reconnaissance,
    Unvalidated,
    Validating,
    SafeRetreat,
}

/// What Careful Resume did on one connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResumeStats {
    pub phase: ResumePhase,
    /// The saved state the connection started from (zero / `None` without).
    pub saved_cwnd: u64,
    pub saved_rtt: Option<Duration>,
    /// Phases entered.
    pub reconnaissance: u64,
    pub unvalidated: u64,
    pub validating: u64,
    pub safe_retreats: u64,
    /// Reconnaissance ended without a jump: RTT outside the bounds, congestion, or a jump no
    /// larger than the window the connection already had.
    pub not_confirmed: u64,
    /// The window jumped to (bytes), 0 without a jump.
    pub jump_cwnd: u64,
    /// PipeSize when resume ended (bytes validated).
    pub pipe_size: u64,
}

/// Measures the capacity a connection used (RFC 9959 Observe phase: "the number of bytes
/// sent over a RTT ... computed by measuring the volume of data acknowledged in one RTT").
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Observer {
    round_start: Option<Instant>,
    round_acked: u64,
    /// The most bytes acknowledged within one round.
    best: u64,
}

impl Observer {
    pub(crate) fn on_ack(&mut self, now: Instant, acked: u64, srtt: Option<Duration>) {
        let Some(srtt) = srtt else { return };
        let start = *self.round_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= srtt {
            self.round_start = Some(now);
            self.round_acked = 0;
        }
        self.round_acked = self.round_acked.saturating_add(acked);
        self.best = self.best.max(self.round_acked);
    }

    pub(crate) fn best(&self) -> u64 {
        self.best
    }
}

/// What the connection must do after Careful Resume saw an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    None,
    /// Set cwnd to this (the jump); pacing starts.
    Jump(u64),
    /// Set cwnd to the flight size (entry to Validating).
    CwndToFlight,
    /// Set cwnd (and ssthresh) to at most this: Safe Retreat.
    Retreat(u64),
    /// Resume is over: ssthresh at most this (PipeSize), or untouched with `None`.
    Normal(Option<u64>),
}

/// RFC 9959 on one connection (the sender side).
#[derive(Clone, Debug)]
pub(crate) struct CarefulResume {
    saved: PathRecord,
    /// Sequence number of the first data byte: Reconnaissance ends once the initial data
    /// after it is acknowledged.
    data_start: u64,
    /// The end of the initial data: the initial window's worth, or what had gone out when
    /// the first ACK came if that was less (set then).
    initial_end: Option<u64>,
    pipe_size: u64,
    jump_cwnd: u64,
    /// Sequence number of the first byte sent in the Unvalidated phase.
    first_unvalidated: Option<u64>,
    /// SND.NXT after the last segment sent in the Unvalidated phase.
    last_unvalidated: u64,
    retreat_cwnd: u64,
    /// Pacing: the earliest time the next unvalidated segment may leave.
    next_send: Option<Instant>,
    stats: ResumeStats,
}

/// How early a paced segment may leave (see [`CarefulResume::pacing_wait`]).
pub(crate) const PACING_SLACK: Duration = Duration::from_millis(2);

/// RFC 9959, confirming the RTT: a current RTT below half the saved one, or above ten times
/// it, means a different path.
pub(crate) fn rtt_confirms(saved: Duration, current: Duration) -> bool {
    current >= saved / 2 && current <= saved.saturating_mul(10)
}

impl CarefulResume {
    /// Starts Reconnaissance from saved state; `data_start` is the sequence number of the
    /// first data byte.
    pub(crate) fn new(saved: PathRecord, data_start: u64) -> Self {
        CarefulResume {
            saved,
            data_start,
            initial_end: None,
            pipe_size: 0,
            jump_cwnd: 0,
            first_unvalidated: None,
            last_unvalidated: 0,
            retreat_cwnd: 0,
            next_send: None,
            stats: ResumeStats {
                phase: ResumePhase::Reconnaissance,
                saved_cwnd: saved.cwnd,
                saved_rtt: Some(saved.rtt),
                reconnaissance: 1,
                ..Default::default()
            },
        }
    }

    pub(crate) fn phase(&self) -> ResumePhase {
        self.stats.phase
    }

    pub(crate) fn stats(&self) -> ResumeStats {
        ResumeStats {
            pipe_size: self.pipe_size,
            ..self.stats
        }
    }

    fn enter_normal(&mut self, ssthresh: Option<u64>) -> Action {
        self.stats.phase = ResumePhase::Normal;
        self.next_send = None;
        Action::Normal(ssthresh)
    }

    /// An ACK that newly acknowledged `acked` bytes, cumulative ACK now `una`. `iw` is the
    /// initial window in bytes (with the MSS negotiated by now), `cwnd` the controller's
    /// window, `min_rtt` the current minimum RTT, `wants_more`: the sender has more data than
    /// its window lets out (RFC 9959: a data-limited sender stays in Reconnaissance).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_ack(
        &mut self,
        iw: u64,
        una: u64,
        acked: u64,
        cwnd: u64,
        min_rtt: Option<Duration>,
        wants_more: bool,
        snd_nxt: u64,
    ) -> Action {
        match self.stats.phase {
            ResumePhase::Normal => Action::None,
            ResumePhase::Reconnaissance => {
                let Some(rtt) = min_rtt else {
                    return Action::None;
                };
                if !rtt_confirms(self.saved.rtt, rtt) {
                    // A path change: the saved state says nothing about this path.
                    self.stats.not_confirmed += 1;
                    return self.enter_normal(None);
                }
                // "When a sender confirms the path and it receives an acknowledgement for the
                // initial data without reported congestion, it MAY then enter the Unvalidated
                // Phase ... when a sender has more data than permitted by the current CWND."
                // The initial data is the initial window's worth, or what had gone out when
                // the first ACK came if that was less (a Fast Open server's first flight
                // shares its initial window with the SYN-ACK, RFC 7413 §4.2.2; ACKs of it make
                // room for more, which is no longer initial data): acknowledged whole, it
                // confirms the path as a full window would.
                let end = *self
                    .initial_end
                    .get_or_insert(snd_nxt.min(self.data_start + iw));
                if una < end || una <= self.data_start || !wants_more {
                    return Action::None;
                }
                // jump_cwnd is at most half the saved window (RFC 9959 Unvalidated phase).
                let jump = self.saved.cwnd / 2;
                if jump <= cwnd {
                    // Slow start already got there: nothing to gain.
                    self.stats.not_confirmed += 1;
                    return self.enter_normal(None);
                }
                self.stats.phase = ResumePhase::Unvalidated;
                self.stats.unvalidated += 1;
                self.stats.jump_cwnd = jump;
                self.jump_cwnd = jump;
                // PipeSize starts at the window before the jump.
                self.pipe_size = cwnd;
                self.last_unvalidated = snd_nxt;
                Action::Jump(jump)
            }
            ResumePhase::Unvalidated => {
                self.pipe_size = self.pipe_size.saturating_add(acked);
                match self.first_unvalidated {
                    // "The sender enters the Validating Phase when an acknowledgement is
                    // received for the first packet number (or higher) that was sent in the
                    // Unvalidated Phase" — the first unvalidated segment ends at
                    // first_unvalidated + 1 or later, so any ACK past its first byte.
                    Some(first) if una > first => {
                        self.stats.phase = ResumePhase::Validating;
                        self.stats.validating += 1;
                        self.next_send = None;
                        if una >= self.last_unvalidated {
                            return self.enter_normal(None);
                        }
                        Action::CwndToFlight
                    }
                    _ => Action::None,
                }
            }
            ResumePhase::Validating => {
                self.pipe_size = self.pipe_size.saturating_add(acked);
                if una >= self.last_unvalidated {
                    return self.enter_normal(None);
                }
                Action::None
            }
            ResumePhase::SafeRetreat => {
                // PipeSize keeps counting; it sets ssthresh on exit, never cwnd.
                self.pipe_size = self.pipe_size.saturating_add(acked);
                if una >= self.last_unvalidated {
                    return self.enter_normal(Some(self.pipe_size.max(self.retreat_cwnd)));
                }
                Action::Retreat(self.retreat_cwnd)
            }
        }
    }

    /// A loss (or ECN) was detected. `floor` is the least window the sender may hold (two
    /// segments).
    pub(crate) fn on_congestion(&mut self, floor: u64) -> Action {
        match self.stats.phase {
            ResumePhase::Normal => Action::None,
            // "If the sender detects congestion ... MUST enter the Normal Phase."
            ResumePhase::Reconnaissance => {
                self.stats.not_confirmed += 1;
                self.enter_normal(None)
            }
            ResumePhase::Unvalidated | ResumePhase::Validating => {
                // Safe Retreat: "the CWND MUST be reduced to no more than the (PipeSize/2)".
                self.stats.phase = ResumePhase::SafeRetreat;
                self.stats.safe_retreats += 1;
                self.next_send = None;
                self.retreat_cwnd = (self.pipe_size / 2).max(floor);
                Action::Retreat(self.retreat_cwnd)
            }
            ResumePhase::SafeRetreat => Action::Retreat(self.retreat_cwnd),
        }
    }

    /// A retransmission timeout: "A sender that experiences a Retransmission Time Out (RTO)
    /// expiry ceases to use Careful Resume." After a jump, what was validated (PipeSize) also
    /// bounds ssthresh, so that slow start after the timeout does not climb back to the stale
    /// window.
    pub(crate) fn on_rto(&mut self) -> Action {
        match self.stats.phase {
            ResumePhase::Normal => Action::None,
            ResumePhase::Reconnaissance => {
                self.stats.not_confirmed += 1;
                self.enter_normal(None)
            }
            ResumePhase::Unvalidated | ResumePhase::Validating => {
                self.stats.safe_retreats += 1;
                let p = self.pipe_size;
                self.enter_normal(Some(p))
            }
            ResumePhase::SafeRetreat => {
                let p = self.pipe_size.max(self.retreat_cwnd);
                self.enter_normal(Some(p))
            }
        }
    }

    /// Whether the phase holds the window where the controller must not move it: the jump
    /// (Unvalidated: CWND = jump_cwnd) and Safe Retreat ("MUST NOT be increased").
    pub(crate) fn window_cap(&self) -> Option<u64> {
        match self.stats.phase {
            ResumePhase::Unvalidated => Some(self.jump_cwnd),
            ResumePhase::SafeRetreat => Some(self.retreat_cwnd),
            _ => None,
        }
    }

    /// Whether a new segment may go now (Unvalidated phase pacing); `None`: yes, `Some(t)`:
    /// not before `t`. A segment may leave up to [`PACING_SLACK`] before its slot: drivers
    /// wake on timers of about a millisecond (tokio's), and a pacer that waits for every
    /// slot exactly sends at most one segment per wake-up, far below the rate it was given
    /// (seen on the real lab: 81 instead of 171 segments in the jump's round trip). Slots
    /// still advance from the previous slot, so the average rate stays jump_cwnd per RTT;
    /// the slack only allows bursts of a couple of milliseconds' worth.
    pub(crate) fn pacing_wait(&self, now: Instant) -> Option<Instant> {
        if self.stats.phase != ResumePhase::Unvalidated {
            return None;
        }
        let t = self.next_send?;
        (t > now + PACING_SLACK).then(|| t - PACING_SLACK)
    }

    /// A new segment of `len` bytes (sequence numbers `start..end`) went out. In the
    /// Unvalidated phase the next one waits the inter-packet time of RFC 9959's pacing example,
    /// ITT = current_RTT · MSS / jump_cwnd, scaled to this segment's length.
    pub(crate) fn on_send(&mut self, now: Instant, start: u64, end: u64, rtt: Option<Duration>) {
        if self.stats.phase != ResumePhase::Unvalidated {
            return;
        }
        self.first_unvalidated.get_or_insert(start);
        self.last_unvalidated = self.last_unvalidated.max(end);
        let (Some(rtt), true) = (rtt, self.jump_cwnd > 0) else {
            return;
        };
        let len = end.saturating_sub(start);
        let gap = rtt.mul_f64(len as f64 / self.jump_cwnd as f64);
        let base = self.next_send.map_or(now, |t| t.max(now));
        self.next_send = Some(base + gap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn rec(at: Instant, cwnd: u64) -> PathRecord {
        PathRecord {
            rtt: 100 * MS,
            cwnd,
            saved_at: at,
        }
    }

    #[test]
    fn rtt_bounds() {
        let s = 100 * MS;
        assert!(rtt_confirms(s, 50 * MS));
        assert!(!rtt_confirms(s, 49 * MS));
        assert!(rtt_confirms(s, 1000 * MS));
        assert!(!rtt_confirms(s, 1001 * MS));
    }

    #[test]
    fn cache_is_bounded_and_expires() {
        let t0 = Instant::now();
        let mut c = PathCache::new(PathCacheConfig::new(3, Duration::from_secs(10)));
        for i in 0..10u8 {
            let ip = IpAddr::from([10, 0, 0, i]);
            c.insert(ip, rec(t0 + Duration::from_secs(i as u64), 1000 + i as u64));
        }
        assert_eq!(c.len(), 3, "bounded");
        // The newest three stay.
        let later = t0 + Duration::from_secs(12);
        assert!(c.get(IpAddr::from([10, 0, 0, 9]), later).is_some());
        assert!(c.get(IpAddr::from([10, 0, 0, 0]), later).is_none());
        // Expired at 8 + 10 s.
        let much_later = t0 + Duration::from_secs(19);
        assert!(c.get(IpAddr::from([10, 0, 0, 8]), much_later).is_none());
        assert!(c.get(IpAddr::from([10, 0, 0, 9]), much_later).is_some());
        assert!(c.take(IpAddr::from([10, 0, 0, 8]), much_later).is_none());
        // Export / import keeps what is fresh.
        let out = c.export(much_later);
        assert_eq!(out.len(), 1);
        let mut d = PathCache::new(PathCacheConfig::default());
        d.import(much_later, &out);
        assert_eq!(
            d.get(IpAddr::from([10, 0, 0, 9]), much_later).unwrap().cwnd,
            1009
        );
        let mut none = PathCache::new(PathCacheConfig::new(0, Duration::from_secs(1)));
        none.insert(IpAddr::from([1, 1, 1, 1]), rec(t0, 1));
        assert!(none.is_empty());
    }

    #[test]
    fn initial_data_smaller_than_the_window_confirms_the_path() {
        // A Fast Open server's first flight: 9 segments of 1448 (the SYN-ACK took the
        // window's tenth), out before the first ACK; ACKs of it let slow start send more,
        // which is not initial data.
        let t0 = Instant::now();
        let mut r = CarefulResume::new(rec(t0, 1_000_000), 1);
        let flight_end = 1 + 9 * 1448;
        assert_eq!(
            r.on_ack(14_480, 2897, 2896, 16_000, Some(100 * MS), true, flight_end),
            Action::None
        );
        // More went out meanwhile; the flight's last ACK confirms the path.
        assert_eq!(
            r.on_ack(
                14_480,
                flight_end,
                2896,
                26_000,
                Some(100 * MS),
                true,
                flight_end + 8000
            ),
            Action::Jump(500_000)
        );
    }

    #[test]
    fn phases_jump_validate_and_end() {
        let t0 = Instant::now();
        let mut r = CarefulResume::new(rec(t0, 1_000_000), 1);
        // IW not yet acknowledged.
        assert_eq!(
            r.on_ack(14_480, 5000, 5000, 20_000, Some(100 * MS), true, 14_481),
            Action::None
        );
        // IW acknowledged, path confirmed, more to send: jump to half the saved window.
        assert_eq!(
            r.on_ack(14_480, 14_481, 9481, 30_000, Some(100 * MS), true, 30_000),
            Action::Jump(500_000)
        );
        assert_eq!(r.phase(), ResumePhase::Unvalidated);
        assert_eq!(r.window_cap(), Some(500_000));
        // Paced: 100 ms · 1000 / 500 000 = 200 µs per 1000 bytes, so 1000 bytes may go at
        // once (within the slack), 69 000 more wait 13.8 ms (less the slack).
        r.on_send(t0, 30_000, 31_000, Some(100 * MS));
        assert_eq!(r.pacing_wait(t0), None);
        r.on_send(t0, 31_000, 100_000, Some(100 * MS));
        assert_eq!(
            r.pacing_wait(t0),
            Some(t0 + Duration::from_micros(14_000) - PACING_SLACK)
        );
        assert_eq!(
            r.on_ack(14_480, 30_000, 1000, 0, None, true, 0),
            Action::None
        );
        assert_eq!(
            r.on_ack(14_480, 31_000, 1000, 0, None, true, 0),
            Action::CwndToFlight
        );
        assert_eq!(r.phase(), ResumePhase::Validating);
        assert_eq!(
            r.on_ack(14_480, 100_000, 69_000, 0, None, true, 0),
            Action::Normal(None)
        );
        assert_eq!(r.stats().validating, 1);
    }

    #[test]
    fn changed_rtt_or_loss_in_reconnaissance_means_no_jump() {
        let t0 = Instant::now();
        let mut r = CarefulResume::new(rec(t0, 1_000_000), 1);
        assert_eq!(
            r.on_ack(14_480, 20_000, 20_000, 30_000, Some(20 * MS), true, 30_000),
            Action::Normal(None)
        );
        assert_eq!(r.stats().not_confirmed, 1);
        let mut r = CarefulResume::new(rec(t0, 1_000_000), 1);
        assert_eq!(r.on_congestion(2896), Action::Normal(None));
        assert_eq!(r.stats().unvalidated, 0);
    }

    #[test]
    fn loss_after_the_jump_retreats_to_half_the_pipe() {
        let t0 = Instant::now();
        let mut r = CarefulResume::new(rec(t0, 1_000_000), 1);
        r.on_ack(14_480, 14_481, 14_480, 30_000, Some(100 * MS), true, 30_000);
        r.on_send(t0, 30_000, 200_000, Some(100 * MS));
        r.on_ack(14_480, 40_000, 10_000, 0, None, true, 0);
        // PipeSize = 30 000 + 10 000.
        assert_eq!(r.on_congestion(2896), Action::Retreat(20_000));
        assert_eq!(r.window_cap(), Some(20_000));
        assert_eq!(
            r.on_ack(14_480, 100_000, 60_000, 0, None, true, 0),
            Action::Retreat(20_000)
        );
        assert_eq!(
            r.on_ack(14_480, 200_000, 100_000, 0, None, true, 0),
            Action::Normal(Some(200_000))
        );
        assert_eq!(r.stats().safe_retreats, 1);
    }
}
