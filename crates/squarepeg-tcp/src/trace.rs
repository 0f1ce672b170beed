//! Per-connection trace: a bounded log of what the sender did and the congestion state after
//! each step, for plots and for tests that check RFC behaviour over time (slow start, back-off,
//! recovery). Off by default ([`ConnectionConfig::trace_capacity`] = 0); when on, the oldest
//! records are dropped once the log is full and counted in
//! [`ConnectionStats::trace_dropped`](crate::ConnectionStats::trace_dropped). The driver drains
//! it with [`Endpoint::take_trace`](crate::Endpoint::take_trace).
//!
//! [`ConnectionConfig::trace_capacity`]: crate::ConnectionConfig::trace_capacity

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::conn::State;

/// What happened. Offsets are stream offsets (0 = the first data byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// A data or FIN segment went out.
    Sent {
        offset: u64,
        len: u32,
        fin: bool,
        retransmission: bool,
    },
    /// An acknowledgment arrived: the cumulative ACK (as the stream offset of the first
    /// unacknowledged byte), bytes newly acknowledged cumulatively and newly SACKed, and
    /// whether it counted as a duplicate ACK.
    Ack {
        acked_offset: u64,
        newly_acked: u64,
        newly_sacked: u64,
        duplicate: bool,
    },
    /// The connection changed state (RFC 9293 §3.3.2).
    State { from: State, to: State },
    /// Loss recovery began (fast retransmit, RFC 5681 §3.2 / RFC 6675 §5, or RACK, RFC 8985).
    RecoveryStart,
    /// Loss recovery ended (the cumulative ACK passed the recovery point).
    RecoveryEnd,
    /// A retransmission timeout fired; `backoff` counts consecutive timeouts (RFC 6298 §5.5).
    Rto { backoff: u32 },
    /// A tail loss probe went out (RFC 8985 §7.3): new data, or the last segment again.
    TailLossProbe { retransmission: bool },
    /// A tail loss probe repaired a loss, with a congestion response (RFC 8985 §7.4).
    TailLossRepaired,
    /// A round trip's delay samples all showed a queue above
    /// [`ConnectionConfig::queue_delay_limit`](crate::ConnectionConfig::queue_delay_limit)
    /// (in slow start, its first eight): the window was reduced as for a loss.
    QueueDelayReduction,
    /// A retransmission timeout proved spurious and was undone (RFC 3522 / RFC 3708
    /// detection, RFC 4015 response).
    SpuriousRtoUndone,
    /// A zero-window probe went out (RFC 9293 §3.8.6.1).
    WindowProbe,
}

/// One trace record: the event and the sender's state right after it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRecord {
    pub time: Instant,
    pub event: TraceEvent,
    pub state: State,
    /// Congestion window and slow-start threshold in bytes (`u64::MAX` before any loss).
    pub cwnd: u64,
    pub ssthresh: u64,
    pub srtt: Option<Duration>,
    pub rttvar: Duration,
    /// Retransmission timeout in force, back-off included.
    pub rto: Duration,
    /// Bytes sent and not cumulatively acknowledged (FlightSize) and the RFC 6675 pipe.
    pub bytes_in_flight: u64,
    pub pipe: u64,
    /// Stream offsets of the first unacknowledged byte and of the next new byte.
    pub snd_una: u64,
    pub snd_nxt: u64,
    /// The peer's receive window.
    pub send_window: u64,
    /// Segments retransmitted so far (all causes).
    pub retransmissions: u64,
    pub in_recovery: bool,
}

/// The bounded log.
#[derive(Debug)]
pub(crate) struct TraceLog {
    records: VecDeque<TraceRecord>,
    capacity: usize,
    pub dropped: u64,
}

impl TraceLog {
    pub fn new(capacity: usize) -> TraceLog {
        TraceLog {
            records: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
            dropped: 0,
        }
    }

    pub fn push(&mut self, record: TraceRecord) {
        if self.records.len() >= self.capacity {
            self.records.pop_front();
            self.dropped += 1;
        }
        self.records.push_back(record);
    }

    pub fn take(&mut self) -> Vec<TraceRecord> {
        self.records.drain(..).collect()
    }
}
