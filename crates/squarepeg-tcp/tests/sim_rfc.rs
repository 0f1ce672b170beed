//! RFC behaviour in the simulator, read from the connection trace: slow start from IW10
//! (RFC 6928, RFC 5681 §3.1) and McTiny appendix A's round trips, RTO back-off (RFC 6298
//! §5.5) across an outage, fast retransmit (RFC 5681 §3.2) and SACK recovery of several holes
//! in one round trip (RFC 6675), CUBIC's window growth (RFC 9438 §4) against NewReno's, the
//! persist timer (RFC 9293 §3.8.6.1), and no spurious retransmission on a clean path.

mod simnet;

use std::time::Duration;

use simnet::*;
use squarepeg_lab::Direction;
use squarepeg_lab::Side;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_tcp::{
    CongestionAlgorithm, ConnectionConfig, TraceEvent, TraceRecord, wire::Segment,
};

const MIB: u64 = 1 << 20;
/// Payload per segment with timestamps on an Ethernet MTU.
const MSS: u64 = 1448;

/// A path with a fixed one-way delay each way, no loss, and (if given) a rate limit with a
/// queue too deep to overflow.
fn clean(one_way: Duration, rate: Option<u64>) -> Bottleneck {
    let mut l = LinkConfig::new().with_delay(one_way);
    if let Some(r) = rate {
        l = l.with_rate(r).with_queue(None, Some(100_000));
    }
    Bottleneck::symmetric(l)
}

fn limits(seconds: u64) -> Limits {
    Limits {
        deadline: Duration::from_secs(seconds),
        watchdog: Duration::from_secs(seconds),
    }
}

/// Runs to completion and checks the data and the close.
fn finish(w: &mut World, seconds: u64) {
    w.run(&limits(seconds))
        .unwrap_or_else(|e| panic!("{e}\n{}", w.describe()));
    w.check_connections()
        .unwrap_or_else(|e| panic!("{e}\n{}", w.describe()));
}

/// Bursts of first transmissions, split where the sender was silent for more than `gap`.
fn rounds(trace: &[TraceRecord], gap: Duration) -> Vec<Vec<TraceRecord>> {
    let mut out: Vec<Vec<TraceRecord>> = Vec::new();
    let mut last = None;
    for r in trace {
        if let TraceEvent::Sent {
            retransmission: false,
            len,
            ..
        } = r.event
            && len > 0
        {
            if last.is_none_or(|t| r.time - t > gap) {
                out.push(Vec::new());
            }
            out.last_mut().expect("a round").push(*r);
            last = Some(r.time);
        }
    }
    out
}

#[test]
fn slow_start_from_iw10_doubles_cwnd_every_round_trip() {
    // McTiny appendix A: a server sends 1 MiB over a 100 Mbit/s path with a 117 ms RTT.
    let rtt = Duration::from_millis(117);
    let mut w = World::pair(
        1,
        clean(rtt / 2, Some(100_000_000)),
        ConnectionConfig::default(),
        ConnectionConfig::default(),
        Plan::new(0, 1, MIB, 2),
        Plan::new(MIB, 2, 0, 1),
        1 << 20,
    );
    finish(&mut w, 60);
    let trace = w.trace_of(false);
    let rounds = rounds(&trace, rtt / 2);
    let sizes: Vec<usize> = rounds.iter().map(Vec::len).collect();
    // IW10 (RFC 6928), then cwnd doubles per round trip: the receiver acknowledges every
    // second segment and each ACK grows cwnd by 2 SMSS (RFC 5681 §3.1, RFC 3465 L = 2).
    // 1 MiB is 725 segments: 10 + 20 + 40 + 80 + 160 + 320 + the last 95.
    assert_eq!(sizes, vec![10, 20, 40, 80, 160, 320, 95]);
    for (k, round) in rounds.iter().enumerate().take(6) {
        let last = round.last().expect("round");
        assert_eq!(
            last.cwnd,
            (10 << k) * MSS,
            "cwnd at the end of round {}",
            k + 1
        );
        assert_eq!(last.ssthresh, u64::MAX, "still in slow start");
    }
    // The rounds are one RTT apart, the first one after the handshake's RTT plus the ACK's
    // half (McTiny: "at least two round trips"; here seven data rounds).
    for pair in rounds.windows(2) {
        let gap = pair[1][0].time - pair[0][0].time;
        assert!(
            gap >= rtt && gap < rtt + Duration::from_millis(5),
            "{gap:?}"
        );
    }
    let client = &w.client().conns[0];
    let done = client.eof_at.expect("EOF") - w.start;
    let connected = client.connected_at.expect("connected") - w.start;
    assert!(connected >= rtt && connected < rtt + Duration::from_millis(1));
    // SYN, SYN-ACK, then the ACK's half RTT, six RTTs of rounds, the last round's half RTT
    // and its serialisation (95 segments at 100 Mbit/s, 11.4 ms): 8 RTTs and a bit.
    let eight = rtt * 8;
    eprintln!("1 MiB over 100 Mbit/s, RTT 117 ms: connected {connected:?}, done {done:?}");
    assert!(
        done > eight && done < eight + Duration::from_millis(20),
        "1 MiB took {done:?} (McTiny measured 1.066 s on Linux)"
    );
    assert_eq!(w.stats_of(false).packets_retransmitted, 0);
}

#[test]
fn rto_backs_off_once_per_timeout_while_the_path_is_down() {
    let rtt = Duration::from_millis(40);
    let mut w = World::pair(
        2,
        clean(rtt / 2, None),
        ConnectionConfig::default(),
        ConnectionConfig::default(),
        Plan::new(2 * MIB, 3, 0, 4),
        Plan::new(0, 4, 2 * MIB, 3),
        1 << 20,
    );
    // Let the transfer start, then take the path down for half a minute.
    let server = w.server;
    w.sim
        .run_while(move |sim| {
            sim.host::<TcpHost>(server)
                .is_some_and(|s| s.conns[0].received < 200_000)
        })
        .expect("run");
    let down_at = w.sim.now();
    for dir in [Direction::LeftToRight, Direction::RightToLeft] {
        w.sim.link_mut(dir).set_up(false);
    }
    w.sim.run_for(Duration::from_secs(30)).expect("run");
    for dir in [Direction::LeftToRight, Direction::RightToLeft] {
        w.sim.link_mut(dir).set_up(true);
    }
    finish(&mut w, 120);
    let trace = w.trace_of(true);
    let timeouts: Vec<&TraceRecord> = trace
        .iter()
        .filter(|r| matches!(r.event, TraceEvent::Rto { .. }) && r.time > down_at)
        .collect();
    // 30 s: the first RTO (~200 ms after the loss probe), then 0.4, 0.8, ... 12.8 s, and the
    // one that finds the path up again.
    assert!(timeouts.len() >= 7, "{} timeouts", timeouts.len());
    for (k, r) in timeouts.iter().enumerate() {
        let TraceEvent::Rto { backoff } = r.event else {
            unreachable!()
        };
        assert_eq!(backoff as usize, k + 1, "consecutive timeouts are counted");
    }
    // RFC 6298 §5.5: each timeout doubles the next interval, exactly.
    let intervals: Vec<Duration> = timeouts.windows(2).map(|p| p[1].time - p[0].time).collect();
    eprintln!("RTO intervals during the outage: {intervals:?}");
    for pair in intervals.windows(2) {
        assert_eq!(pair[1], pair[0] * 2, "{intervals:?}");
    }
    // The back-off is the timer's: the RTO the records report doubles with each timeout.
    for pair in timeouts.windows(2) {
        assert_eq!(pair[1].rto, pair[0].rto * 2);
    }
    let st = w.stats_of(true);
    assert_eq!(st.rto_timeouts as usize, timeouts.len());
    // After the outage a fresh RTT sample collapses the back-off (RFC 6298 §5 note).
    assert!(st.rto < Duration::from_secs(1), "{:?}", st.rto);
}

/// Drops the `nth` client data segments (1-based) on their way to the server.
fn drop_data_segments(nth: &'static [u64]) -> Script {
    let mut count = 0u64;
    Script::new(move |dir, _, seg: &Segment<'_>| {
        if dir != Direction::LeftToRight || seg.payload.is_empty() {
            return false;
        }
        count += 1;
        nth.contains(&count)
    })
}

#[test]
fn fast_retransmit_after_three_duplicate_acks() {
    // RFC 5681 §3.2 without SACK: NewReno, one lost segment.
    let mut config = ConnectionConfig::default();
    config.sack = false;
    config.congestion = CongestionAlgorithm::NewReno;
    let mut w = World::pair(
        3,
        clean(Duration::from_millis(20), None),
        config.clone(),
        config,
        Plan::new(MIB, 5, 0, 6),
        Plan::new(0, 6, MIB, 5),
        1 << 20,
    );
    w.sim.add_middlebox(Side::Left, drop_data_segments(&[50]));
    finish(&mut w, 60);
    let trace = w.trace_of(true);
    let retransmission = trace
        .iter()
        .position(|r| {
            matches!(
                r.event,
                TraceEvent::Sent {
                    retransmission: true,
                    ..
                }
            )
        })
        .expect("a retransmission");
    // The ACKs just before it: exactly three duplicates after the last new acknowledgment.
    let dupacks = trace[..retransmission]
        .iter()
        .rev()
        .filter(|r| matches!(r.event, TraceEvent::Ack { .. }))
        .take_while(|r| {
            matches!(
                r.event,
                TraceEvent::Ack {
                    duplicate: true,
                    ..
                }
            )
        })
        .count();
    assert_eq!(dupacks, 3, "fast retransmit on the third duplicate ACK");
    let st = w.stats_of(true);
    assert_eq!(
        (
            st.fast_retransmits,
            st.rto_timeouts,
            st.packets_retransmitted
        ),
        (1, 0, 1)
    );
}

#[test]
fn sack_recovery_repairs_several_holes_in_one_round_trip() {
    // RFC 6675 (with RACK, RFC 8985): four holes in one window.
    let rtt = Duration::from_millis(40);
    let mut w = World::pair(
        4,
        clean(rtt / 2, None),
        ConnectionConfig::default(),
        ConnectionConfig::default(),
        Plan::new(MIB, 7, 0, 8),
        Plan::new(0, 8, MIB, 7),
        1 << 20,
    );
    w.sim
        .add_middlebox(Side::Left, drop_data_segments(&[50, 53, 56, 59]));
    finish(&mut w, 60);
    let trace = w.trace_of(true);
    let start = trace
        .iter()
        .find(|r| r.event == TraceEvent::RecoveryStart)
        .expect("a recovery")
        .time;
    let retransmissions: Vec<&TraceRecord> = trace
        .iter()
        .filter(|r| {
            matches!(
                r.event,
                TraceEvent::Sent {
                    retransmission: true,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(retransmissions.len(), 4);
    for r in &retransmissions {
        assert!(
            r.time - start < rtt,
            "hole repaired {:?} after recovery began",
            r.time - start
        );
    }
    let st = w.stats_of(true);
    assert_eq!(
        (st.fast_retransmits, st.rto_timeouts),
        (1, 0),
        "one episode"
    );
}

/// One loss in slow start, then congestion avoidance until the transfer ends; returns the
/// sender's trace from the end of that recovery, and W_max in segments.
fn growth_after_one_loss(congestion: CongestionAlgorithm) -> (Vec<TraceRecord>, f64) {
    let mut config = ConnectionConfig::default();
    config.congestion = congestion;
    let mut w = World::pair(
        5,
        clean(Duration::from_millis(50), None),
        config.clone(),
        config,
        Plan::new(120 * MIB, 9, 0, 10),
        Plan::new(0, 10, 120 * MIB, 9),
        1 << 20,
    );
    // Segment 700 is in the seventh round of slow start (cwnd 640 segments).
    w.sim.add_middlebox(Side::Left, drop_data_segments(&[700]));
    finish(&mut w, 600);
    let st = w.stats_of(true);
    assert_eq!(
        (st.fast_retransmits, st.rto_timeouts),
        (1, 0),
        "one loss event"
    );
    let trace = w.trace_of(true);
    let start = trace
        .iter()
        .position(|r| r.event == TraceEvent::RecoveryStart)
        .expect("recovery");
    // cwnd when the loss was found: the last record before the reduction.
    let w_max = trace[start - 1].cwnd as f64 / MSS as f64;
    let end = trace
        .iter()
        .position(|r| r.event == TraceEvent::RecoveryEnd)
        .expect("recovery end");
    (trace[end..].to_vec(), w_max)
}

/// cwnd in segments `t` after the first record.
fn cwnd_at(trace: &[TraceRecord], t: Duration) -> f64 {
    let at = trace[0].time + t;
    let r = trace
        .iter()
        .take_while(|r| r.time <= at)
        .last()
        .expect("record");
    r.cwnd as f64 / MSS as f64
}

#[test]
fn cubic_grows_as_a_cubic_between_losses_and_newreno_linearly() {
    let rtt = 0.1;
    // CUBIC (RFC 9438 §4): cwnd drops to beta * W_max, then follows
    // W_cubic(t) = C (t - K)^3 + W_max with K = cbrt(W_max (1 - beta) / C): concave up to
    // W_max at t = K, convex beyond.
    let (cubic, w_max) = growth_after_one_loss(CongestionAlgorithm::Cubic);
    let k = (w_max * (1.0 - 0.7) / 0.4).cbrt();
    let w_cubic = |t: f64| 0.4 * (t - k).powi(3) + w_max;
    let at = |t: f64| cwnd_at(&cubic, Duration::from_secs_f64(t));
    assert!((at(0.0) - 0.7 * w_max).abs() < 0.02 * w_max, "beta = 0.7");
    for t in [1.0, 2.0, 4.0, k, k + 2.0, k + 4.0] {
        // The implementation aims one RTT ahead (§4.4: target W_cubic(t + RTT)).
        let expected = w_cubic(t + rtt);
        assert!(
            (at(t) - expected).abs() < 0.04 * w_max,
            "t = {t:.2}: cwnd {:.1} segments, W_cubic {expected:.1} (W_max {w_max:.1}, K {k:.2})",
            at(t)
        );
    }
    // Concave, then a plateau around W_max, then convex.
    let first_half = at(k / 2.0) - at(0.0);
    let second_half = at(k) - at(k / 2.0);
    assert!(
        first_half > 2.0 * second_half,
        "{first_half} vs {second_half}"
    );
    let after = at(k + 4.0) - at(k + 2.0);
    assert!(after > 2.0 * (at(k + 2.0) - at(k)), "convex beyond K");

    // NewReno (RFC 5681 §3.1): half the window, then one SMSS per round trip.
    let (reno, reno_w_max) = growth_after_one_loss(CongestionAlgorithm::NewReno);
    let at = |t: f64| cwnd_at(&reno, Duration::from_secs_f64(t));
    assert!(
        (at(0.0) - 0.5 * reno_w_max).abs() < 0.02 * reno_w_max,
        "half"
    );
    for t in [2.0, 4.0, 6.0, 8.0] {
        let per_rtt = (at(t) - at(0.0)) / (t / rtt);
        assert!(
            (0.9..=1.1).contains(&per_rtt),
            "t = {t}: {per_rtt:.3} SMSS per RTT"
        );
    }
    // CUBIC is back at its old window after K; NewReno is far from it.
    assert!(cwnd_at(&cubic, Duration::from_secs_f64(k)) > 0.97 * w_max);
    assert!(at(k) < 0.75 * reno_w_max);
    eprintln!(
        "W_max {w_max:.0} segments, K {k:.2} s: at K CUBIC {:.0}, NewReno {:.0} segments",
        cwnd_at(&cubic, Duration::from_secs_f64(k)),
        at(k)
    );
}

#[test]
fn persist_timer_probes_a_zero_window_with_back_off() {
    // A reader that reads nothing for 10 s behind a 16 KiB receive buffer (RFC 9293
    // §3.8.6.1): the window closes, the sender probes it with exponential back-off, and no
    // retransmission timeout fires.
    let rtt = Duration::from_millis(50);
    let mut reader = Plan::new(0, 12, 300_000, 11);
    reader.reader = Reader::Paused {
        after: Duration::from_secs(10),
    };
    let mut w = World::pair(
        6,
        clean(rtt / 2, None),
        ConnectionConfig::default(),
        {
            let mut config = ConnectionConfig::default();
            config.recv_buffer = 16 << 10;
            config
        },
        Plan::new(300_000, 11, 0, 12),
        reader,
        1 << 20,
    );
    finish(&mut w, 60);
    let trace = w.trace_of(true);
    let probes: Vec<&TraceRecord> = trace
        .iter()
        .filter(|r| r.event == TraceEvent::WindowProbe)
        .collect();
    assert!(probes.len() >= 4, "{} probes", probes.len());
    let intervals: Vec<Duration> = probes.windows(2).map(|p| p[1].time - p[0].time).collect();
    for pair in intervals.windows(2) {
        assert_eq!(pair[1], pair[0] * 2, "{intervals:?}");
    }
    assert!(probes.iter().all(|r| r.send_window == 0));
    let st = w.stats_of(true);
    assert_eq!(st.rto_timeouts, 0);
    assert_eq!(st.zero_window_probes as usize, probes.len());
    // The probes are about the window, not loss: nothing was retransmitted but the probe
    // byte, which the receiver dropped while its window was zero, once the window opened.
    assert!(st.packets_retransmitted <= 1, "{st:#?}");
    let closed = trace
        .iter()
        .find(|r| r.send_window == 0)
        .expect("window closed")
        .time;
    // The first probe one RTO after the window closed, then twice that each time.
    assert_eq!(probes[0].time - closed, probes[0].rto);
    assert_eq!(intervals[0], probes[0].rto * 2);
    eprintln!(
        "window closed at {:?}, first probe {:?} later, then intervals {intervals:?}",
        closed - trace[0].time,
        probes[0].time - closed,
    );
}

#[test]
fn clean_paths_see_no_spurious_retransmission() {
    let paths = [
        (
            "30 ms, no rate limit",
            clean(Duration::from_millis(15), None),
        ),
        (
            "10 Mbit/s, 60 ms, deep queue",
            clean(Duration::from_millis(30), Some(10_000_000)),
        ),
        (
            "1 Gbit/s, 1 ms",
            clean(Duration::from_micros(500), Some(1_000_000_000)),
        ),
    ];
    let mut runs = 0;
    for (name, path) in &paths {
        for (sack, timestamps) in [(true, true), (true, false), (false, true), (false, false)] {
            for congestion in [CongestionAlgorithm::Cubic, CongestionAlgorithm::NewReno] {
                for (up, down) in [(10_000, 0), (3 * MIB, 200_000), (0, 2 * MIB)] {
                    let mut config = ConnectionConfig::default();
                    config.sack = sack;
                    config.timestamps = timestamps;
                    config.congestion = congestion;
                    let mut w = World::pair(
                        7,
                        path.clone(),
                        config.clone(),
                        config,
                        Plan::new(up, 13, down, 14),
                        Plan::new(down, 14, up, 13),
                        0,
                    );
                    finish(&mut w, 120);
                    for client in [true, false] {
                        let st = w.stats_of(client);
                        assert_eq!(
                            (
                                st.packets_retransmitted,
                                st.tail_loss_probes,
                                st.rto_timeouts,
                                st.dsacks_received
                            ),
                            (0, 0, 0, 0),
                            "{name}, sack {sack}, timestamps {timestamps}, {congestion:?}, \
                             {up}/{down}: {st:#?}"
                        );
                    }
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 72);
}
