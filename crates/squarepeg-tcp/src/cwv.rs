//! Congestion window validation for rate-limited traffic (RFC 7661): the pipeACK measurement
//! of what the flow actually gets acknowledged per round trip, and the non-validated phase in
//! which the congestion window is larger than the flow uses.
//!
//! A rate-limited flow (a voice call: a small message every 20 ms) never fills its window, so
//! its window never grows (windows grow only when the sender was cwnd-limited, `cc.rs`);
//! every loss event then cuts it further (CUBIC's β, NewReno's half)
//! until it sits at the 2·SMSS floor. That window does not limit the flow's rate — the
//! application does — but it does limit how long the sender can keep sending at that rate
//! while no ACK returns: a burst of lost ACKs then stalls the sender and its queued messages
//! expire unsent (issue 14). RFC 7661 §4.3 lets a sender in the non-validated phase keep its
//! cwnd; the connection uses this module to decide when a loss response may stop at the
//! initial window (see `Connection::congestion_event`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// RFC 7661 §4.2: the pipeACK sampling period is at least max(3·SRTT, 1 s).
const MIN_PERIOD: Duration = Duration::from_secs(1);
/// Samples kept over one sampling period (each covers at least a period / `SAMPLES`).
const SAMPLES: u32 = 8;

/// The pipeACK variable of RFC 7661 §4.2: the largest number of bytes acknowledged in one
/// round trip over the last sampling period.
#[derive(Clone, Debug, Default)]
pub(crate) struct PipeAck {
    /// Bytes acknowledged (cumulatively or by SACK) in the sample under way, and its start.
    current: u64,
    current_start: Option<Instant>,
    /// Completed samples: end time and bytes, oldest first.
    samples: VecDeque<(Instant, u64)>,
}

impl PipeAck {
    /// The sampling period for a smoothed RTT (RFC 7661 §4.2).
    fn period(srtt: Duration) -> Duration {
        srtt.saturating_mul(3).max(MIN_PERIOD)
    }

    /// Records `acked` bytes newly acknowledged at `now`.
    pub fn on_ack(&mut self, now: Instant, acked: u64, srtt: Option<Duration>) {
        let Some(srtt) = srtt else { return };
        let start = *self.current_start.get_or_insert(now);
        self.current = self.current.saturating_add(acked);
        // One sample per round trip (the volume acknowledged in one RTT, §4.2), but no more
        // than `SAMPLES` per period, so a sub-millisecond RTT keeps the queue short.
        let sample_len = srtt.max(Self::period(srtt) / SAMPLES);
        if now.saturating_duration_since(start) >= sample_len {
            self.samples.push_back((now, self.current));
            self.current = 0;
            self.current_start = Some(now);
        }
        let horizon = Self::period(srtt);
        while self
            .samples
            .front()
            .is_some_and(|&(end, _)| now.saturating_duration_since(end) > horizon)
        {
            self.samples.pop_front();
        }
        // Bounded whatever the clock does (samples are at least a period / SAMPLES long).
        while self.samples.len() > 2 * SAMPLES as usize {
            self.samples.pop_front();
        }
    }

    /// pipeACK: the largest sample within the sampling period, the one under way included;
    /// `None` before the first complete sample (RFC 7661 §4.2: undefined until measured).
    pub fn value(&self, now: Instant, srtt: Option<Duration>) -> Option<u64> {
        let srtt = srtt?;
        let horizon = Self::period(srtt);
        self.samples
            .iter()
            .filter(|&&(end, _)| now.saturating_duration_since(end) <= horizon)
            .map(|&(_, bytes)| bytes)
            .max()
            .map(|m| m.max(self.current))
    }

    /// Whether the sender is in the non-validated phase (RFC 7661 §3, §4.3): pipeACK is
    /// measured and below half the congestion window.
    pub fn non_validated(&self, now: Instant, srtt: Option<Duration>, cwnd: u64) -> bool {
        self.value(now, srtt)
            .is_some_and(|p| p.saturating_mul(2) < cwnd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT: Duration = Duration::from_millis(70);

    #[test]
    fn undefined_until_a_round_trip_is_measured() {
        let t0 = Instant::now();
        let mut p = PipeAck::default();
        assert_eq!(p.value(t0, Some(RTT)), None);
        p.on_ack(t0, 344, Some(RTT));
        assert_eq!(p.value(t0, Some(RTT)), None);
        assert!(!p.non_validated(t0, Some(RTT), 14_480));
        // No RTT estimate: nothing is measured.
        p.on_ack(t0, 344, None);
        assert_eq!(p.value(t0, None), None);
    }

    #[test]
    fn a_voice_flow_is_in_the_non_validated_phase() {
        // 172-byte segments every 20 ms, ACKed in pairs every 40 ms: about 688 bytes per RTT.
        let t0 = Instant::now();
        let mut p = PipeAck::default();
        let mut now = t0;
        for _ in 0..100 {
            now += Duration::from_millis(40);
            p.on_ack(now, 344, Some(RTT));
        }
        let v = p.value(now, Some(RTT)).expect("measured");
        // Samples are at least 1 s / 8 = 125 ms long (four ACKs, 160 ms): at most 1376.
        assert!((344..=1376).contains(&v), "pipeACK {v}");
        assert!(p.non_validated(now, Some(RTT), 14_480), "IW10 is not used");
        assert!(
            !p.non_validated(now, Some(RTT), 2 * v),
            "a window it fills half of"
        );
    }

    #[test]
    fn a_burst_of_acks_is_remembered_for_the_sampling_period_only() {
        let t0 = Instant::now();
        let mut p = PipeAck::default();
        let mut now = t0;
        for _ in 0..10 {
            now += Duration::from_millis(200);
            p.on_ack(now, 10_000, Some(RTT));
        }
        assert!(p.value(now, Some(RTT)).expect("measured") >= 10_000);
        assert!(!p.non_validated(now, Some(RTT), 14_480));
        // Then a trickle for longer than max(3 SRTT, 1 s): the burst ages out.
        for _ in 0..20 {
            now += Duration::from_millis(100);
            p.on_ack(now, 100, Some(RTT));
        }
        assert!(p.value(now, Some(RTT)).expect("measured") < 1000);
        assert!(p.non_validated(now, Some(RTT), 14_480));
    }

    #[test]
    fn sub_millisecond_rtts_keep_few_samples() {
        let t0 = Instant::now();
        let mut p = PipeAck::default();
        let mut now = t0;
        let rtt = Some(Duration::from_micros(50));
        for _ in 0..100_000 {
            now += Duration::from_micros(25);
            p.on_ack(now, 1448, rtt);
        }
        assert!(p.samples.len() <= 2 * SAMPLES as usize);
    }
}
