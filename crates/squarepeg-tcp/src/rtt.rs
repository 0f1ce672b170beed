//! Round-trip time estimation and the retransmission timeout (RFC 6298).

use std::time::Duration;

/// Clock granularity G of RFC 6298 §2: our clock is the caller's `Instant`, effectively
/// microseconds; timestamp samples are milliseconds.
const CLOCK_GRANULARITY: Duration = Duration::from_millis(1);

/// SRTT/RTTVAR/RTO state of one connection.
#[derive(Clone, Debug)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    min_rtt: Option<Duration>,
    latest: Option<Duration>,
    /// RTO before back-off.
    base_rto: Duration,
    /// Consecutive back-offs (RFC 6298 §5.5).
    backoff: u32,
    min_rto: Duration,
    max_rto: Duration,
}

impl RttEstimator {
    pub fn new(initial_rto: Duration, min_rto: Duration, max_rto: Duration) -> Self {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            min_rtt: None,
            latest: None,
            // RFC 6298 §2.1: RTO = 1 s until a sample is taken.
            base_rto: initial_rto.clamp(min_rto, max_rto),
            backoff: 0,
            min_rto,
            max_rto,
        }
    }

    /// Feeds one RTT measurement (RFC 6298 §2.2, §2.3). The caller applies Karn's rule
    /// (RFC 6298 §3): no samples from retransmitted segments unless timestamps disambiguate.
    pub fn on_sample(&mut self, r: Duration) {
        self.min_rtt = Some(self.min_rtt.map_or(r, |m| m.min(r)));
        self.on_coarse_sample(r);
    }

    /// Feeds a measurement of coarse resolution (a millisecond timestamp echo, RFC 7323
    /// §4.2): good for SRTT and the RTO, whose formula allows for the clock granularity, but
    /// not for the minimum RTT, which it could put at zero on a sub-millisecond path.
    pub fn on_coarse_sample(&mut self, r: Duration) {
        self.latest = Some(r);
        match self.srtt {
            None => {
                // (2.2) first measurement.
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                // (2.3) beta = 1/4, alpha = 1/8, RTTVAR updated before SRTT.
                let delta = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        // RTO = SRTT + max(G, K*RTTVAR), K = 4, then bounded (2.4, 2.5).
        self.base_rto =
            (srtt + CLOCK_GRANULARITY.max(self.rttvar * 4)).clamp(self.min_rto, self.max_rto);
        // A valid sample ends the back-off (Karn's algorithm, RFC 6298 §5 note after 5.7).
        self.backoff = 0;
    }

    /// Doubles the RTO after a retransmission timeout (RFC 6298 §5.5).
    pub fn back_off(&mut self) {
        if self.current_rto() < self.max_rto {
            self.backoff += 1;
        }
    }

    /// The RTO to arm now, including back-off.
    pub fn current_rto(&self) -> Duration {
        let factor = 1u32.checked_shl(self.backoff.min(20)).unwrap_or(u32::MAX);
        self.base_rto.saturating_mul(factor).min(self.max_rto)
    }

    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
    pub fn rttvar(&self) -> Duration {
        self.rttvar
    }
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }
    pub fn latest(&self) -> Option<Duration> {
        self.latest
    }
    pub fn backoff_count(&self) -> u32 {
        self.backoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc6298_arithmetic_and_backoff() {
        let mut e = RttEstimator::new(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(120),
        );
        assert_eq!(e.current_rto(), Duration::from_secs(1));
        e.on_sample(Duration::from_millis(100));
        assert_eq!(e.srtt(), Some(Duration::from_millis(100)));
        assert_eq!(e.rttvar(), Duration::from_millis(50));
        // 100 + 4*50 = 300 ms
        assert_eq!(e.current_rto(), Duration::from_millis(300));
        e.on_sample(Duration::from_millis(200));
        // rttvar = (3*50 + 100)/4 = 62.5, srtt = (700 + 200)/8 = 112.5
        assert_eq!(e.rttvar(), Duration::from_micros(62_500));
        assert_eq!(e.srtt(), Some(Duration::from_micros(112_500)));
        e.back_off();
        e.back_off();
        assert_eq!(e.current_rto(), Duration::from_micros(362_500 * 4));
        e.on_sample(Duration::from_millis(112));
        assert_eq!(e.backoff_count(), 0);
        for _ in 0..40 {
            e.back_off();
        }
        assert_eq!(e.current_rto(), Duration::from_secs(120));
    }
}
