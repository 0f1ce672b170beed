//! Congestion control behind a trait: NewReno (RFC 5681, RFC 6582) and CUBIC (RFC 9438).
//!
//! Windows are counted in bytes, and ACKs by the bytes they newly acknowledge (appropriate
//! byte counting, RFC 3465), never by buffers or ACK count (Minion §8.1 lost throughput to that).
//! Loss *detection* and the recovery episode itself (RFC 6675 / RFC 6582) live in the
//! connection; a controller only decides the window.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use crate::config::CongestionAlgorithm;

/// What a congestion controller learns from one ACK outside loss recovery.
#[derive(Clone, Copy, Debug)]
pub struct AckEvent {
    pub now: Instant,
    /// Bytes newly acknowledged (cumulatively or by SACK).
    pub acked: u64,
    /// Whether the sender was limited by cwnd (not by the application or rwnd) when these bytes
    /// were sent; windows grow only then (RFC 7661 §4.3 spirit, as Linux does).
    pub cwnd_limited: bool,
    /// Smoothed and minimum RTT at this point.
    pub srtt: Option<Duration>,
    pub min_rtt: Option<Duration>,
}

/// A congestion controller. Implementations must be deterministic (no clock reads).
pub trait CongestionControl: Debug + Send {
    fn name(&self) -> &'static str;
    /// Congestion window in bytes.
    fn cwnd(&self) -> u64;
    /// Slow-start threshold in bytes (`u64::MAX` until the first congestion event).
    fn ssthresh(&self) -> u64;
    /// New data acknowledged outside loss recovery.
    fn on_ack(&mut self, ack: &AckEvent);
    /// Loss detected by duplicate ACKs / SACK: the start of a recovery episode. `flight` is
    /// FlightSize when loss was detected.
    fn on_congestion_event(&mut self, now: Instant, flight: u64);
    /// Recovery episode over (cumulative ACK passed the recovery point).
    fn on_recovery_exit(&mut self, now: Instant);
    /// Retransmission timeout.
    fn on_rto(&mut self, now: Instant, flight: u64);
    /// Restart after an idle period longer than the RTO (RFC 5681 §4.1).
    fn on_idle_restart(&mut self, now: Instant);
    /// The sender MSS changed.
    fn set_mss(&mut self, mss: u64);
    /// A copy of the whole state, to restore when a retransmission timeout turns out to have
    /// been spurious (RFC 4015 §3: the response restores the window the timeout took away).
    /// `None` (the default): such timeouts are not undone.
    fn snapshot(&self) -> Option<Box<dyn CongestionControl>> {
        None
    }
    /// Raises cwnd and ssthresh to at least `floor` bytes (never lowers them): the floor of a
    /// loss response in the non-validated phase of an application-limited flow (RFC 7661,
    /// see `Connection::congestion_event`). The default keeps the controller's own response.
    fn keep_at_least(&mut self, floor: u64) {
        let _ = floor;
    }
    /// Sets cwnd and ssthresh outright: Careful Resume's jump, its reset to the flight size
    /// and its Safe Retreat (RFC 9959, see `crate::resume`). The controller starts a new
    /// epoch from there. The default ignores it (no resume with such a controller).
    fn set_window(&mut self, cwnd: u64, ssthresh: u64) {
        let _ = (cwnd, ssthresh);
    }
}

/// Builds the configured controller.
pub fn new_controller(
    algorithm: CongestionAlgorithm,
    mss: u64,
    initial_window: u32,
) -> Box<dyn CongestionControl> {
    match algorithm {
        CongestionAlgorithm::Cubic => Box::new(Cubic::new(mss, initial_window)),
        CongestionAlgorithm::NewReno => Box::new(NewReno::new(mss, initial_window)),
    }
}

/// Initial window in bytes: `iw` segments (RFC 6928; IW10 by default).
fn initial_window_bytes(mss: u64, iw: u32) -> u64 {
    mss * iw.max(1) as u64
}

/// Slow start with appropriate byte counting, L = 2*SMSS (RFC 3465 §2.2, RFC 5681 §3.1).
fn slow_start(cwnd: &mut u64, ssthresh: u64, acked: u64, mss: u64) -> u64 {
    let inc = acked.min(2 * mss);
    let room = ssthresh.saturating_sub(*cwnd);
    let used = inc.min(room);
    *cwnd += used;
    acked.saturating_sub(used)
}

/// NewReno window arithmetic (RFC 5681 §3.1; the recovery episode follows RFC 6582/6675).
#[derive(Clone, Debug)]
pub struct NewReno {
    mss: u64,
    iw: u32,
    cwnd: u64,
    ssthresh: u64,
    /// Bytes acknowledged in congestion avoidance since the last increase (RFC 3465 §2.1).
    bytes_acked: u64,
}

impl NewReno {
    pub fn new(mss: u64, iw: u32) -> Self {
        NewReno {
            mss,
            iw,
            cwnd: initial_window_bytes(mss, iw),
            ssthresh: u64::MAX,
            bytes_acked: 0,
        }
    }
}

impl CongestionControl for NewReno {
    fn name(&self) -> &'static str {
        "newreno"
    }
    fn cwnd(&self) -> u64 {
        self.cwnd
    }
    fn ssthresh(&self) -> u64 {
        self.ssthresh
    }
    fn on_ack(&mut self, ack: &AckEvent) {
        if !ack.cwnd_limited {
            return;
        }
        let mut acked = ack.acked;
        if self.cwnd < self.ssthresh {
            acked = slow_start(&mut self.cwnd, self.ssthresh, acked, self.mss);
            if acked == 0 {
                return;
            }
        }
        // Congestion avoidance: one SMSS per cwnd of acknowledged bytes (RFC 3465 §2.1).
        self.bytes_acked += acked;
        if self.bytes_acked >= self.cwnd {
            self.bytes_acked -= self.cwnd;
            self.cwnd += self.mss;
        }
    }
    fn on_congestion_event(&mut self, _now: Instant, flight: u64) {
        // RFC 5681 §3.2 eq. (4): ssthresh = max(FlightSize / 2, 2*SMSS).
        self.ssthresh = (flight / 2).max(2 * self.mss);
        self.cwnd = self.ssthresh;
        self.bytes_acked = 0;
    }
    fn on_recovery_exit(&mut self, _now: Instant) {
        // RFC 6582 §3.2 step 3, option (2): cwnd = ssthresh.
        self.cwnd = self.ssthresh;
    }
    fn on_rto(&mut self, _now: Instant, flight: u64) {
        // RFC 5681 §3.1 eq. (4) and loss window LW = 1 SMSS.
        self.ssthresh = (flight / 2).max(2 * self.mss);
        self.cwnd = self.mss;
        self.bytes_acked = 0;
    }
    fn on_idle_restart(&mut self, _now: Instant) {
        // RFC 5681 §4.1: cwnd = min(RW, cwnd), RW = IW.
        self.cwnd = self.cwnd.min(initial_window_bytes(self.mss, self.iw));
    }
    fn set_mss(&mut self, mss: u64) {
        if self.cwnd == initial_window_bytes(self.mss, self.iw) {
            self.cwnd = initial_window_bytes(mss, self.iw);
        }
        self.mss = mss.max(1);
    }
    fn snapshot(&self) -> Option<Box<dyn CongestionControl>> {
        Some(Box::new(self.clone()))
    }
    fn keep_at_least(&mut self, floor: u64) {
        self.cwnd = self.cwnd.max(floor);
        self.ssthresh = self.ssthresh.max(floor);
    }
    fn set_window(&mut self, cwnd: u64, ssthresh: u64) {
        self.cwnd = cwnd.max(self.mss);
        self.ssthresh = ssthresh;
        self.bytes_acked = 0;
    }
}

/// CUBIC (RFC 9438), with the Reno-friendly region and fast convergence.
#[derive(Clone, Debug)]
pub struct Cubic {
    mss: u64,
    iw: u32,
    cwnd: u64,
    ssthresh: u64,
    /// W_max in segments (RFC 9438 §4.6).
    w_max: f64,
    /// K in seconds (RFC 9438 eq. 2).
    k: f64,
    /// Start of the current congestion-avoidance epoch (RFC 9438 §4.2).
    epoch_start: Option<Instant>,
    /// cwnd (segments) at the start of the epoch.
    cwnd_epoch: f64,
    /// W_est of the Reno-friendly region in segments (RFC 9438 §4.3).
    w_est: f64,
}

/// RFC 9438 §5: C = 0.4, beta_cubic = 0.7.
const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;

impl Cubic {
    pub fn new(mss: u64, iw: u32) -> Self {
        Cubic {
            mss,
            iw,
            cwnd: initial_window_bytes(mss, iw),
            ssthresh: u64::MAX,
            w_max: 0.0,
            k: 0.0,
            epoch_start: None,
            cwnd_epoch: 0.0,
            w_est: 0.0,
        }
    }

    fn segments(&self) -> f64 {
        self.cwnd as f64 / self.mss as f64
    }

    /// W_cubic(t) = C*(t-K)^3 + W_max (RFC 9438 eq. 1), in segments.
    fn w_cubic(&self, t: f64) -> f64 {
        CUBIC_C * (t - self.k).powi(3) + self.w_max
    }

    fn reduce(&mut self) {
        let cwnd = self.segments();
        // Fast convergence (RFC 9438 §4.7).
        self.w_max = if cwnd < self.w_max {
            cwnd * (1.0 + CUBIC_BETA) / 2.0
        } else {
            cwnd
        };
        // RFC 9438 §4.6: ssthresh = cwnd * beta_cubic, at least 2 segments.
        let ss = ((cwnd * CUBIC_BETA) * self.mss as f64) as u64;
        self.ssthresh = ss.max(2 * self.mss);
        self.epoch_start = None;
    }
}

impl CongestionControl for Cubic {
    fn name(&self) -> &'static str {
        "cubic"
    }
    fn cwnd(&self) -> u64 {
        self.cwnd
    }
    fn ssthresh(&self) -> u64 {
        self.ssthresh
    }
    fn on_ack(&mut self, ack: &AckEvent) {
        if !ack.cwnd_limited {
            return;
        }
        let mut acked = ack.acked;
        if self.cwnd < self.ssthresh {
            acked = slow_start(&mut self.cwnd, self.ssthresh, acked, self.mss);
            if acked == 0 {
                return;
            }
        }
        let mss = self.mss as f64;
        let cwnd = self.segments();
        let epoch_start = match self.epoch_start {
            Some(s) => s,
            None => {
                // New epoch (RFC 9438 §4.2): K from W_max and the current window (eq. 2 with
                // cwnd_epoch; K = 0 when cwnd already exceeds W_max).
                self.epoch_start = Some(ack.now);
                self.cwnd_epoch = cwnd;
                self.w_est = cwnd;
                self.k = if self.w_max > cwnd {
                    ((self.w_max - cwnd) / CUBIC_C).cbrt()
                } else {
                    self.w_max = cwnd;
                    0.0
                };
                ack.now
            }
        };
        let t = ack.now.saturating_duration_since(epoch_start).as_secs_f64();
        let rtt = ack.srtt.unwrap_or(Duration::from_millis(100)).as_secs_f64();
        // Reno-friendly estimate (RFC 9438 §4.3, eq. 4): alpha = 3(1-beta)/(1+beta).
        let alpha = 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);
        self.w_est += alpha * (acked as f64 / mss) / cwnd;
        let w_cubic_t = self.w_cubic(t);
        let new_cwnd = if w_cubic_t < self.w_est {
            // Reno-friendly region (§4.3).
            self.w_est
        } else {
            // Concave/convex regions (§4.4, §4.5): target = W_cubic(t + RTT), bounded to
            // [cwnd, 1.5 cwnd]; grow by (target - cwnd)/cwnd per acknowledged segment.
            let target = self.w_cubic(t + rtt).clamp(cwnd, 1.5 * cwnd);
            cwnd + (target - cwnd) / cwnd * (acked as f64 / mss)
        };
        let bytes = (new_cwnd * mss) as u64;
        if bytes > self.cwnd {
            self.cwnd = bytes;
        }
    }
    fn on_congestion_event(&mut self, _now: Instant, _flight: u64) {
        self.reduce();
        self.cwnd = self.ssthresh;
    }
    fn on_recovery_exit(&mut self, _now: Instant) {
        self.cwnd = self.ssthresh;
    }
    fn on_rto(&mut self, _now: Instant, _flight: u64) {
        // RFC 9438 §4.8: ssthresh via beta_cubic, cwnd to the loss window (RFC 5681).
        self.reduce();
        self.cwnd = self.mss;
    }
    fn on_idle_restart(&mut self, _now: Instant) {
        self.cwnd = self.cwnd.min(initial_window_bytes(self.mss, self.iw));
        self.epoch_start = None;
    }
    fn set_mss(&mut self, mss: u64) {
        if self.cwnd == initial_window_bytes(self.mss, self.iw) {
            self.cwnd = initial_window_bytes(mss, self.iw);
        }
        self.mss = mss.max(1);
    }
    fn snapshot(&self) -> Option<Box<dyn CongestionControl>> {
        Some(Box::new(self.clone()))
    }
    fn keep_at_least(&mut self, floor: u64) {
        self.cwnd = self.cwnd.max(floor);
        self.ssthresh = self.ssthresh.max(floor);
    }
    fn set_window(&mut self, cwnd: u64, ssthresh: u64) {
        self.cwnd = cwnd.max(self.mss);
        self.ssthresh = ssthresh;
        // A W_max from before a retreat describes a window the path did not carry: growth
        // starts afresh from here (RFC 9438 §4.2, a new epoch).
        if self.w_max > self.segments() {
            self.w_max = self.segments();
        }
        self.epoch_start = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(now: Instant, acked: u64) -> AckEvent {
        AckEvent {
            now,
            acked,
            cwnd_limited: true,
            srtt: Some(Duration::from_millis(100)),
            min_rtt: Some(Duration::from_millis(100)),
        }
    }

    #[test]
    fn newreno_slow_start_and_halving() {
        let now = Instant::now();
        let mut c = NewReno::new(1000, 10);
        assert_eq!(c.cwnd(), 10_000);
        // Five ACKs of two segments each double IW10 to 20 segments in one RTT.
        for _ in 0..5 {
            c.on_ack(&ack(now, 2000));
        }
        assert_eq!(c.cwnd(), 20_000);
        // ABC caps one ACK at 2 SMSS.
        c.on_ack(&ack(now, 10_000));
        assert_eq!(c.cwnd(), 22_000);
        c.on_congestion_event(now, 22_000);
        assert_eq!((c.cwnd(), c.ssthresh()), (11_000, 11_000));
        // Congestion avoidance: +1 SMSS per cwnd of bytes.
        c.on_ack(&ack(now, 10_999));
        assert_eq!(c.cwnd(), 11_000);
        c.on_ack(&ack(now, 1));
        assert_eq!(c.cwnd(), 12_000);
        c.on_rto(now, 12_000);
        assert_eq!((c.cwnd(), c.ssthresh()), (1000, 6000));
        // Not cwnd-limited: no growth.
        let mut a = ack(now, 1000);
        a.cwnd_limited = false;
        c.on_ack(&a);
        assert_eq!(c.cwnd(), 1000);
    }

    #[test]
    fn cubic_reduces_by_beta_and_regrows_towards_wmax() {
        let t0 = Instant::now();
        let mut c = Cubic::new(1000, 10);
        for _ in 0..45 {
            c.on_ack(&ack(t0, 2000));
        }
        assert_eq!(c.cwnd(), 100_000);
        c.on_congestion_event(t0, 100_000);
        assert_eq!(c.cwnd(), 70_000);
        assert_eq!(c.ssthresh(), 70_000);
        // K = cbrt(100*0.3/0.4) = cbrt(75) ~ 4.217 s. After K seconds of ACKs cwnd ~ W_max.
        let mut now = t0;
        // Concave region: at t = K the window is back near W_max (plateau).
        for _ in 0..843 {
            now += Duration::from_millis(5);
            c.on_ack(&ack(now, 1000));
        }
        let w = c.cwnd() as f64 / 1000.0;
        assert!(w > 95.0 && w < 106.0, "cwnd {w} segments at t = K");
        // Convex region: W_cubic(10 s) = 0.4 (10 - 4.217)^3 + 100 = 177 segments.
        for _ in 843..2000 {
            now += Duration::from_millis(5);
            c.on_ack(&ack(now, 1000));
        }
        let w = c.cwnd() as f64 / 1000.0;
        assert!(w > 150.0 && w < 190.0, "cwnd {w} segments at t = 10 s");
        // A second loss below W_max triggers fast convergence.
        c.on_congestion_event(now, c.cwnd());
        assert!(c.cwnd() < (w * 1000.0) as u64);
    }

    #[test]
    fn snapshot_restores_and_floor_only_raises() {
        let now = Instant::now();
        for mut c in [
            Box::new(Cubic::new(1000, 10)) as Box<dyn CongestionControl>,
            Box::new(NewReno::new(1000, 10)),
        ] {
            let before = c.snapshot().expect("a snapshot");
            c.on_rto(now, 10_000);
            assert_eq!(c.cwnd(), 1000);
            let c = before;
            assert_eq!((c.cwnd(), c.ssthresh()), (10_000, u64::MAX), "{}", c.name());
            let mut c = c;
            c.on_congestion_event(now, 10_000);
            let (cwnd, ssthresh) = (c.cwnd(), c.ssthresh());
            assert!(cwnd < 10_000);
            c.keep_at_least(cwnd - 1);
            assert_eq!((c.cwnd(), c.ssthresh()), (cwnd, ssthresh), "never lowers");
            c.keep_at_least(10_000);
            assert_eq!((c.cwnd(), c.ssthresh()), (10_000, 10_000));
        }
    }
}
