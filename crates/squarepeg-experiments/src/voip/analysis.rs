//! From what a run observed to per-message records and the summary: transport delay, playout
//! time, buffered time, state, late losses, latency percentiles and burst losses.
//!
//! All times are integer nanoseconds from the run's start, so that a simulator run gives the
//! same records, bit for bit, on every machine.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::{Scenario, VoipConfig};

/// What an engine observed during one run of one transport.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    /// Per message number, when the application handed it to the transport (from the run's
    /// start); `None` if the transport refused it.
    pub sent: Vec<Option<Duration>>,
    /// Messages as the receiving application got them: number and arrival time (from the
    /// run's start), in arrival order. Repeated numbers count as duplicates; only the first
    /// arrival counts.
    pub arrivals: Vec<(u64, Duration)>,
    /// Messages whose first transmission the network dropped (see [`super::wire`]).
    pub lost_by_network: BTreeSet<u64>,
    /// Messages the sender accepted but dropped unsent (their deadline passed in its queue,
    /// Hollywood §4.2).
    pub dropped_by_sender: BTreeSet<u64>,
    /// Messages whose retransmission the sender filled with other, live messages
    /// (Hollywood §4.2 inconsistent retransmissions): such a message arrives only if its
    /// first transmission did, so when it missed its playout the sender chose so; it counts
    /// as dropped by the sender, not as lost by the network.
    pub replaced_by_sender: BTreeSet<u64>,
}

/// What became of a message at the receiver's playout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageState {
    /// Arrived at or before its playout time.
    OnTime,
    /// Arrived after its playout time (a late loss: the receiver has already skipped it).
    Late,
    /// Never arrived (within the run's drain time).
    Lost,
}

/// One message's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageRecord {
    /// The message number, from 0.
    pub number: u64,
    /// When it was handed to the transport, from the run's start (`None`: refused).
    pub send: Option<Duration>,
    /// When the receiving application got it (`None`: never).
    pub arrival: Option<Duration>,
    /// Its playout time (`send + one_way_delay + playout_delay`; for a refused message, the
    /// time it was due instead of its send time).
    pub playout: Duration,
    /// On time, late or lost.
    pub state: MessageState,
    /// The network dropped its first transmission (and the sender did not replace it).
    pub lost_by_network: bool,
    /// The sender dropped it unsent (deadline passed in its queue).
    pub dropped_by_sender: bool,
    /// The sender replaced its retransmission with other messages.
    pub replaced_by_sender: bool,
}

impl MessageRecord {
    /// Arrival minus send time.
    pub fn transport_delay(&self) -> Option<Duration> {
        Some(self.arrival?.saturating_sub(self.send?))
    }

    /// Playout minus arrival time in nanoseconds: how long the message waited in the
    /// playout buffer; negative when it arrived late.
    pub fn buffered_ns(&self) -> Option<i128> {
        Some(self.playout.as_nanos() as i128 - self.arrival?.as_nanos() as i128)
    }

    /// Whether it missed its playout (late or lost).
    pub fn missed(&self) -> bool {
        self.state != MessageState::OnTime
    }
}

/// Nearest-rank percentiles of the transport delay of delivered messages, in milliseconds
/// (`null` when nothing was delivered).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p99_9: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

/// The counts and distributions of one run (see the JSON schema in [`super::report`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Messages the application sent (offered to the transport).
    pub messages_sent: u64,
    /// Messages the transport refused or dropped before sending (e.g. expired in the
    /// sender's queue).
    pub refused_by_sender: u64,
    /// Messages whose first transmission the network dropped (also those whose
    /// retransmission the sender then replaced).
    pub lost_by_network: u64,
    /// Messages the sender accepted but dropped unsent because their deadline passed.
    pub dropped_by_sender: u64,
    /// Messages whose retransmission the sender replaced by live messages (Hollywood
    /// §4.2): a retransmission that would have arrived after the playout time.
    pub replaced_by_sender: u64,
    /// Messages that arrived at or before their playout time.
    pub delivered_on_time: u64,
    /// Messages that arrived after their playout time.
    pub delivered_late: u64,
    /// Messages that never arrived.
    pub never_delivered: u64,
    /// Late plus never delivered: every message that missed its playout.
    pub late_loss_count: u64,
    /// `late_loss_count / messages_sent`.
    pub late_loss_rate: f64,
    /// Messages that missed their playout although the network delivered their first
    /// transmission: head-of-line blocking and sender-side delay (squarepeg's goal: zero).
    /// Replaced messages are not counted (the network lost them first, or they arrived).
    pub missed_not_lost_by_network: u64,
    /// Messages the network lost that were recovered in time for their playout.
    pub lost_by_network_recovered: u64,
    /// Arrivals of a message that had already arrived.
    pub duplicate_arrivals: u64,
    /// Arrivals with a number the sender never used.
    pub unknown_arrivals: u64,
    /// Transport delay of delivered messages.
    pub latency_ms: Percentiles,
    /// Burst losses (Minion §8.2): runs of consecutive messages that missed their playout,
    /// as length → number of runs.
    pub burst_lengths: BTreeMap<u64, u64>,
    /// The longest burst (0 if none).
    pub longest_burst: u64,
}

/// The records and summary of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// One record per message, by number.
    pub records: Vec<MessageRecord>,
    /// The summary.
    pub summary: Summary,
}

/// Computes every message's fate and the summary.
pub fn analyse(config: &VoipConfig, scenario: &Scenario, obs: &Observations) -> Analysis {
    let count = usize::try_from(config.count).unwrap_or(usize::MAX);
    let mut first_arrival: Vec<Option<Duration>> = vec![None; count];
    let mut duplicate_arrivals = 0;
    let mut unknown_arrivals = 0;
    for &(number, at) in &obs.arrivals {
        match usize::try_from(number)
            .ok()
            .and_then(|i| first_arrival.get_mut(i))
        {
            Some(slot @ None) => *slot = Some(at),
            Some(Some(_)) => duplicate_arrivals += 1,
            None => unknown_arrivals += 1,
        }
    }
    let offset = scenario.playout_offset();
    let records: Vec<MessageRecord> = (0..config.count)
        .map(|number| {
            let i = number as usize;
            let send = obs.sent.get(i).copied().flatten();
            let arrival = first_arrival[i];
            let playout = send.unwrap_or_else(|| config.due(number)) + offset;
            let state = match arrival {
                None => MessageState::Lost,
                Some(at) if at <= playout => MessageState::OnTime,
                Some(_) => MessageState::Late,
            };
            let replaced_by_sender = obs.replaced_by_sender.contains(&number);
            MessageRecord {
                number,
                send,
                arrival,
                playout,
                state,
                lost_by_network: obs.lost_by_network.contains(&number),
                dropped_by_sender: obs.dropped_by_sender.contains(&number),
                replaced_by_sender,
            }
        })
        .collect();
    let summary = summarise(&records, duplicate_arrivals, unknown_arrivals);
    Analysis { records, summary }
}

fn summarise(records: &[MessageRecord], duplicate_arrivals: u64, unknown_arrivals: u64) -> Summary {
    let count = |f: &dyn Fn(&MessageRecord) -> bool| records.iter().filter(|r| f(r)).count() as u64;
    let messages_sent = records.len() as u64;
    let delivered_late = count(&|r| r.state == MessageState::Late);
    let never_delivered = count(&|r| r.state == MessageState::Lost);
    let late_loss_count = delivered_late + never_delivered;
    let mut delays: Vec<Duration> = records.iter().filter_map(|r| r.transport_delay()).collect();
    delays.sort_unstable();
    let mut burst_lengths = BTreeMap::new();
    let mut run = 0u64;
    for r in records.iter().map(Some).chain([None]) {
        if r.is_some_and(|r| r.missed()) {
            run += 1;
        } else if run > 0 {
            *burst_lengths.entry(run).or_insert(0) += 1;
            run = 0;
        }
    }
    Summary {
        messages_sent,
        refused_by_sender: count(&|r| r.send.is_none()),
        lost_by_network: count(&|r| r.lost_by_network),
        dropped_by_sender: count(&|r| r.dropped_by_sender),
        replaced_by_sender: count(&|r| r.replaced_by_sender),
        delivered_on_time: count(&|r| r.state == MessageState::OnTime),
        delivered_late,
        never_delivered,
        late_loss_count,
        late_loss_rate: if messages_sent == 0 {
            0.0
        } else {
            late_loss_count as f64 / messages_sent as f64
        },
        missed_not_lost_by_network: count(&|r| {
            r.missed() && !r.lost_by_network && !r.replaced_by_sender
        }),
        lost_by_network_recovered: count(&|r| !r.missed() && r.lost_by_network),
        duplicate_arrivals,
        unknown_arrivals,
        latency_ms: Percentiles {
            p50: percentile(&delays, 0.50),
            p90: percentile(&delays, 0.90),
            p99: percentile(&delays, 0.99),
            p99_9: percentile(&delays, 0.999),
            max: delays.last().map(|d| ms(*d)),
        },
        longest_burst: burst_lengths.keys().next_back().copied().unwrap_or(0),
        burst_lengths,
    }
}

/// Nearest-rank percentile of sorted values: the smallest value with at least `q` of the
/// values at or below it.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(ms(sorted[rank.clamp(1, sorted.len()) - 1]))
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::voip::config::hollywood_70ms;

    fn config(count: u64) -> VoipConfig {
        VoipConfig {
            count,
            ..VoipConfig::default()
        }
    }

    #[test]
    fn states_bursts_and_percentiles() {
        let scenario = hollywood_70ms(); // playout = send + 65 ms
        let c = config(6);
        let msd = Duration::from_millis;
        let sent: Vec<Option<Duration>> = (0..6).map(|i| Some(c.due(i))).collect();
        // 0 on time (40 ms), 1 exactly at playout, 2 late, 3 lost, 4 late, 5 on time.
        let arrivals = vec![
            (0, c.due(0) + msd(40)),
            (1, c.due(1) + msd(65)),
            (2, c.due(2) + msd(66)),
            (4, c.due(4) + msd(100)),
            (5, c.due(5) + msd(36)),
            (5, c.due(5) + msd(37)),
            (99, msd(1)),
        ];
        let obs = Observations {
            sent,
            arrivals,
            lost_by_network: [2, 3].into_iter().collect(),
            ..Observations::default()
        };
        let a = analyse(&c, &scenario, &obs);
        let states: Vec<MessageState> = a.records.iter().map(|r| r.state).collect();
        use MessageState::*;
        assert_eq!(states, [OnTime, OnTime, Late, Lost, Late, OnTime]);
        assert_eq!(a.records[2].buffered_ns(), Some(-1_000_000));
        assert_eq!(a.records[3].buffered_ns(), None);
        let s = &a.summary;
        assert_eq!(
            (s.delivered_on_time, s.delivered_late, s.never_delivered),
            (3, 2, 1)
        );
        assert_eq!((s.late_loss_count, s.lost_by_network), (3, 2));
        assert_eq!(s.missed_not_lost_by_network, 1); // message 4: a head-of-line victim
        assert_eq!(s.lost_by_network_recovered, 0);
        assert_eq!((s.duplicate_arrivals, s.unknown_arrivals), (1, 1));
        assert_eq!(s.burst_lengths, [(3, 1)].into_iter().collect());
        assert_eq!(s.longest_burst, 3);
        // Delays 36, 40, 65, 66, 100: nearest rank.
        assert_eq!(s.latency_ms.p50, Some(65.0));
        assert_eq!(s.latency_ms.p90, Some(100.0));
        assert_eq!(s.latency_ms.max, Some(100.0));
        assert!((s.late_loss_rate - 0.5).abs() < 1e-12);
    }

    #[test]
    fn percentile_edges() {
        assert_eq!(percentile(&[], 0.5), None);
        let one = [Duration::from_millis(7)];
        assert_eq!(percentile(&one, 0.999), Some(7.0));
        let hundred: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&hundred, 0.99), Some(99.0));
        assert_eq!(percentile(&hundred, 0.999), Some(100.0));
        assert_eq!(percentile(&hundred, 0.5), Some(50.0));
    }

    #[test]
    fn replaced_messages_count_as_lost_by_the_network_and_replaced_by_the_sender() {
        let scenario = hollywood_70ms();
        let c = config(4);
        let msd = Duration::from_millis;
        let obs = Observations {
            sent: (0..4).map(|i| Some(c.due(i))).collect(),
            // 1 replaced (its first transmission lost), 2 expired unsent, 3 lost.
            arrivals: vec![(0, c.due(0) + msd(40))],
            lost_by_network: [1, 3].into_iter().collect(),
            dropped_by_sender: [2].into_iter().collect(),
            replaced_by_sender: [1].into_iter().collect(),
        };
        let a = analyse(&c, &scenario, &obs);
        let s = &a.summary;
        assert_eq!(s.lost_by_network, 2);
        assert_eq!((s.replaced_by_sender, s.dropped_by_sender), (1, 1));
        assert_eq!(s.never_delivered, 3);
        assert!(a.records[1].lost_by_network && a.records[1].replaced_by_sender);
        // The expired message missed its playout for a sender-side reason.
        assert_eq!(s.missed_not_lost_by_network, 1);
    }
}
