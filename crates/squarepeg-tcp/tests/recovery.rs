//! Loss recovery and congestion control scripts: slow start from IW10, fast retransmit
//! (RFC 5681, RFC 6582), SACK recovery (RFC 6675), RTO back-off with Karn's rule (RFC 6298),
//! CUBIC and NewReno reactions.

mod common;

use std::time::Duration;

use common::*;
use squarepeg_tcp::{CongestionAlgorithm, ConnectionConfig, ConnectionHandle};

const IRS: u32 = 3_000_000;
const MSS: u32 = 1000;

/// Client connection, no timestamps, peer MSS 1000, handshake RTT `rtt`.
fn open(cfg: ConnectionConfig, sack: bool, rtt: Duration) -> (Harness, ConnectionHandle, u32) {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = cfg;
        config.timestamps = false;
        config
    });
    let iss = h.out1().seq;
    h.now += rtt;
    let mut p = h
        .pkt(SYN | ACK, IRS, iss + 1)
        .win(65535)
        .opt(Opt::Mss(MSS as u16))
        .opt(Opt::Ws(4));
    if sack {
        p = p.opt(Opt::SackOk);
    }
    h.inject(&p).unwrap();
    h.out();
    h.events();
    (h, c, iss)
}

/// Data sequence number of segment `i` (0-based, MSS-sized).
fn seg(iss: u32, i: u32) -> u32 {
    iss + 1 + i * MSS
}

fn ack(h: &Harness, iss: u32, upto_seg: u32) -> Pkt {
    h.pkt(ACK, IRS + 1, seg(iss, upto_seg)).win(4096)
}

#[test]
fn slow_start_doubles_cwnd_in_one_rtt_from_iw10() {
    for cc in [CongestionAlgorithm::Cubic, CongestionAlgorithm::NewReno] {
        let (mut h, c, iss) = open(
            {
                let mut config = ConnectionConfig::default();
                config.congestion = cc;
                config
            },
            true,
            Duration::from_millis(100),
        );
        h.ep.write(c, &[0u8; 200_000]).unwrap();
        let first = h.out();
        assert_eq!(first.len(), 10, "IW10 (RFC 6928)");
        assert_eq!(h.ep.stats_of(c).unwrap().cwnd, 10 * MSS as u64);
        h.now += Duration::from_millis(100);
        // The receiver acknowledges every second segment: five ACKs.
        let mut second = Vec::new();
        for k in 1..=5 {
            h.inject(&ack(&h, iss, 2 * k)).unwrap();
            second.extend(h.out());
        }
        // Each ACK of 2 segments grows cwnd by 2 segments (byte counting, L = 2 SMSS).
        assert_eq!(h.ep.stats_of(c).unwrap().cwnd, 20 * MSS as u64, "{cc:?}");
        assert_eq!(second.len(), 20, "{cc:?}");
        assert_eq!(second[0].seq, seg(iss, 10));
        assert_eq!(h.ep.stats_of(c).unwrap().bytes_in_flight, 20 * MSS as u64);
    }
}

#[test]
fn newreno_fast_retransmit_limited_transmit_and_partial_ack() {
    let (mut h, c, iss) = open(
        {
            let mut config = ConnectionConfig::default();
            config.congestion = CongestionAlgorithm::NewReno;
            config
        },
        false,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 100_000]).unwrap();
    assert_eq!(h.out().len(), 10);
    h.now += Duration::from_millis(100);
    // Segment 1 is lost; segment 0 acknowledged, then duplicate ACKs.
    h.inject(&ack(&h, iss, 1)).unwrap();
    let after_ack = h.out();
    assert_eq!(after_ack.len(), 2, "slow start: 1 acked, cwnd +1");
    // Dupacks 1 and 2: limited transmit, one new segment each (RFC 3042).
    for i in 0..2 {
        h.inject(&ack(&h, iss, 1)).unwrap();
        let o = h.out1();
        assert_eq!(o.seq, seg(iss, 12 + i), "limited transmit {i}");
    }
    // Dupack 3: fast retransmit of segment 1.
    h.inject(&ack(&h, iss, 1)).unwrap();
    let rtx = h.out1();
    assert_eq!(rtx.seq, seg(iss, 1));
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.fast_retransmits, 1);
    assert!(st.in_recovery);
    // FlightSize was 13 segments, 2 of them sent by limited transmit, which RFC 5681 §3.2
    // step 2 leaves out: ssthresh = 11 / 2 = 5.5 segments (eq. 4).
    assert_eq!(st.ssthresh, 5500);
    assert_eq!(st.cwnd, 5500);
    // Partial ACK up to segment 5 (segment 5 also lost): retransmit it at once (RFC 6582).
    h.inject(&ack(&h, iss, 5)).unwrap();
    let o = h.out();
    assert_eq!(o[0].seq, seg(iss, 5), "{o:?}");
    assert!(h.ep.stats_of(c).unwrap().in_recovery);
    // Full ACK (everything sent before recovery): recovery ends, cwnd = ssthresh.
    let high = h.ep.stats_of(c).unwrap().bytes_in_flight as u32 / MSS + 5;
    h.inject(&ack(&h, iss, high)).unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert!(!st.in_recovery);
    assert_eq!(st.cwnd, 5500);
    assert_eq!(st.packets_retransmitted, 2);
    assert_eq!(st.rto_timeouts, 0);
}

#[test]
fn sack_recovery_retransmits_only_the_holes() {
    let (mut h, c, iss) = open(
        ConnectionConfig::default(),
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 100_000]).unwrap();
    assert_eq!(h.out().len(), 10);
    h.now += Duration::from_millis(100);
    let b = |i: u32| seg(iss, i);
    // Segments 1 and 4 are lost. Arrival of 0, then 2, 3, 5, 6, 7, 8, 9 with SACKs.
    h.inject(&ack(&h, iss, 1)).unwrap();
    let mut sent = h.out();
    let sack_acks: Vec<Vec<(u32, u32)>> = vec![
        vec![(b(2), b(3))],
        vec![(b(2), b(4))],
        vec![(b(5), b(6)), (b(2), b(4))],
        vec![(b(5), b(7)), (b(2), b(4))],
        vec![(b(5), b(8)), (b(2), b(4))],
        vec![(b(5), b(9)), (b(2), b(4))],
        vec![(b(5), b(10)), (b(2), b(4))],
    ];
    for blocks in sack_acks {
        h.inject(&ack(&h, iss, 1).opt(Opt::Sack(blocks))).unwrap();
        sent.extend(h.out());
    }
    let retransmitted: Vec<u32> = sent
        .iter()
        .filter(|p| p.seq < b(10))
        .map(|p| (p.seq - iss - 1) / MSS)
        .collect();
    assert_eq!(
        retransmitted,
        vec![1, 4],
        "only the holes are retransmitted"
    );
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.fast_retransmits, 1);
    assert_eq!(st.sack_holes, 2);
    // New data was sent during recovery as the pipe allowed (RFC 6675 NextSeg rule 2).
    assert!(sent.iter().any(|p| p.seq >= b(12)));
    // A D-SACK (RFC 2883) is tolerated and counted.
    h.inject(&ack(&h, iss, 1).opt(Opt::Sack(vec![(b(2), b(3)), (b(2), b(4))])))
        .unwrap();
    assert_eq!(h.ep.stats_of(c).unwrap().dsacks_received, 1);
}

#[test]
fn rto_backs_off_and_karn_ignores_retransmitted_samples() {
    let (mut h, c, iss) = open(
        ConnectionConfig::default(),
        false,
        Duration::from_millis(100),
    );
    let st = h.ep.stats_of(c).unwrap();
    // SRTT 100 ms, RTTVAR 50 ms: RTO = 300 ms.
    assert_eq!(st.srtt, Some(Duration::from_millis(100)));
    assert_eq!(st.rto, Duration::from_millis(300));
    h.ep.write(c, &[1u8; 500]).unwrap();
    h.out1();
    let mut gaps = Vec::new();
    for _ in 0..3 {
        gaps.push(h.fire_next_timer().as_millis());
        let r = h.out1();
        assert_eq!((r.seq, r.payload.len()), (iss + 1, 500));
    }
    assert_eq!(gaps, vec![300, 600, 1200]);
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.rto_timeouts, 3);
    assert_eq!(st.cwnd, MSS as u64, "loss window after RTO");
    // The ACK of the retransmitted segment gives no RTT sample (Karn): SRTT unchanged, RTO
    // stays backed off.
    h.now += Duration::from_millis(50);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 501)).unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.srtt, Some(Duration::from_millis(100)));
    assert_eq!(st.rto, Duration::from_millis(2400));
    // A fresh segment acknowledged after 100 ms is a valid sample: back-off cleared.
    h.ep.write(c, &[1u8; 500]).unwrap();
    h.out1();
    h.now += Duration::from_millis(100);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1001)).unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.srtt, Some(Duration::from_millis(100)));
    // RTTVAR = 3/4 * 50 = 37.5 ms -> RTO 250 ms.
    assert_eq!(st.rto, Duration::from_millis(250));
}

#[test]
fn rto_retransmits_everything_in_slow_start() {
    let (mut h, c, iss) = open(
        ConnectionConfig::default(),
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 10_000]).unwrap();
    assert_eq!(h.out().len(), 10);
    // The tail loss probe (RFC 8985 §7.3) comes first, after 2 SRTT: the last segment again.
    assert_eq!(
        h.fire_next_timer(),
        Duration::from_millis(200) + Duration::from_millis(2)
    );
    assert_eq!(h.out1().seq, seg(iss, 9));
    // No answer: the RTO, restarted when the probe went out (RFC 8985 §7.3), fires.
    assert_eq!(h.fire_next_timer(), Duration::from_millis(300));
    // cwnd = 1 SMSS: one segment.
    assert_eq!(h.out1().seq, seg(iss, 0));
    h.inject(&ack(&h, iss, 1)).unwrap();
    // Slow start: 2 more (the lost ones, in order).
    let o = h.out();
    assert_eq!(
        o.iter()
            .map(|p| (p.seq - iss - 1) / MSS)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn cubic_and_newreno_reduce_differently() {
    let mut got = Vec::new();
    for cc in [CongestionAlgorithm::Cubic, CongestionAlgorithm::NewReno] {
        let (mut h, c, iss) = open(
            {
                let mut config = ConnectionConfig::default();
                config.congestion = cc;
                config
            },
            true,
            Duration::from_millis(100),
        );
        h.ep.write(c, &[0u8; 100_000]).unwrap();
        h.out();
        // 3 SACKed segments above the lost segment 0.
        for k in 1..=3 {
            h.inject(&ack(&h, iss, 0).opt(Opt::Sack(vec![(seg(iss, 1), seg(iss, 1 + k))])))
                .unwrap();
            h.out();
        }
        let st = h.ep.stats_of(c).unwrap();
        assert!(st.in_recovery);
        got.push((st.cwnd, st.ssthresh));
    }
    // CUBIC: beta 0.7 of cwnd (10 segments). NewReno: half of FlightSize (12 segments, less
    // the two sent by limited transmit, RFC 5681 §3.2 step 2).
    assert_eq!(got[0], (7000, 7000));
    assert_eq!(got[1], (5000, 5000));
}

#[test]
fn custom_congestion_controller_can_be_plugged_in() {
    use squarepeg_tcp::cc::{AckEvent, CongestionControl};
    #[derive(Debug)]
    struct Fixed(u64);
    impl CongestionControl for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn cwnd(&self) -> u64 {
            self.0
        }
        fn ssthresh(&self) -> u64 {
            u64::MAX
        }
        fn on_ack(&mut self, _: &AckEvent) {}
        fn on_congestion_event(&mut self, _: std::time::Instant, _: u64) {}
        fn on_recovery_exit(&mut self, _: std::time::Instant) {}
        fn on_rto(&mut self, _: std::time::Instant, _: u64) {}
        fn on_idle_restart(&mut self, _: std::time::Instant) {}
        fn set_mss(&mut self, _: u64) {}
    }
    let (mut h, c, _) = open(ConnectionConfig::default(), true, Duration::from_millis(10));
    h.ep.set_congestion_control(c, Box::new(Fixed(3 * MSS as u64)))
        .unwrap();
    h.ep.write(c, &[0u8; 50_000]).unwrap();
    assert_eq!(h.out().len(), 3);
    assert_eq!(h.ep.stats_of(c).unwrap().congestion, "fixed");
}

/// Segment numbers of the data segments among `pkts`.
fn segs(iss: u32, pkts: &[Pkt]) -> Vec<u32> {
    pkts.iter()
        .filter(|p| !p.payload.is_empty())
        .map(|p| (p.seq - iss - 1) / MSS)
        .collect()
}

#[test]
fn tail_loss_probe_and_rack_repair_a_lost_tail_without_rto() {
    // RFC 8985 §7: the last three segments of a flight are lost; no ACK would ever reveal
    // that but the probe's.
    let (mut h, c, iss) = open(
        ConnectionConfig::default(),
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 10_000]).unwrap();
    assert_eq!(h.out().len(), 10);
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 7)).unwrap();
    assert!(h.out().is_empty());
    // PTO = 2 SRTT + 2 ms from that ACK (RFC 8985 §7.2), well before the 300 ms RTO.
    assert_eq!(h.fire_next_timer(), Duration::from_millis(202));
    let probe = h.out1();
    assert_eq!(
        segs(iss, std::slice::from_ref(&probe)),
        vec![9],
        "the last segment again"
    );
    // The probe's ACK SACKs it: RACK finds segments 7 and 8, sent before it and an RTT old,
    // lost, and recovery retransmits them at once.
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 7).opt(Opt::Sack(vec![(seg(iss, 9), seg(iss, 10))])))
        .unwrap();
    assert_eq!(segs(iss, &h.out()), vec![7, 8]);
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(
        (st.tail_loss_probes, st.fast_retransmits, st.rto_timeouts),
        (1, 1, 0)
    );
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 10)).unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert!(!st.in_recovery);
    assert_eq!(st.bytes_in_flight, 0);
    // Without RACK-TLP the same tail waits for the RTO.
    let (mut h, c, iss) = open(
        {
            let mut config = ConnectionConfig::default();
            config.rack_tlp = false;
            config
        },
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 10_000]).unwrap();
    h.out();
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 7)).unwrap();
    // RTO = 100 ms + 4 * 37.5 ms after the ACK's sample.
    assert_eq!(h.fire_next_timer(), Duration::from_millis(250));
    assert_eq!(segs(iss, &h.out()), vec![7]);
    assert_eq!(h.ep.stats_of(c).unwrap().rto_timeouts, 1);
}

#[test]
fn tail_loss_probe_repair_and_duplicate_are_told_apart() {
    // RFC 8985 §7.4: a retransmitted probe that delivered the last segment repaired a loss and
    // costs a congestion response; one the receiver already had (D-SACK) costs nothing.
    for original_arrived in [false, true] {
        let (mut h, c, iss) = open(
            ConnectionConfig::default(),
            true,
            Duration::from_millis(100),
        );
        h.ep.write(c, &[0u8; 10_000]).unwrap();
        h.out();
        h.now += Duration::from_millis(100);
        h.inject(&ack(&h, iss, 9)).unwrap();
        let cwnd = h.ep.stats_of(c).unwrap().cwnd;
        // One segment out: PTO = 2 SRTT + the worst-case delayed ACK (200 ms), but never later
        // than the RTO (250 ms).
        assert_eq!(h.fire_next_timer(), Duration::from_millis(250));
        assert_eq!(segs(iss, &h.out()), vec![9]);
        h.now += Duration::from_millis(100);
        h.inject(&ack(&h, iss, 10)).unwrap();
        if original_arrived {
            // The second copy draws a D-SACK.
            h.inject(&ack(&h, iss, 10).opt(Opt::Sack(vec![(seg(iss, 9), seg(iss, 10))])))
                .unwrap();
        }
        // More data: its ACK passes TLP.end_seq and closes the episode.
        h.ep.write(c, &[0u8; 1000]).unwrap();
        h.out();
        h.now += Duration::from_millis(100);
        h.inject(&ack(&h, iss, 11)).unwrap();
        let st = h.ep.stats_of(c).unwrap();
        if original_arrived {
            assert_eq!(st.tail_loss_repairs, 0);
            assert!(st.cwnd >= cwnd, "{st:#?}");
        } else {
            assert_eq!(st.tail_loss_repairs, 1);
            assert_eq!(st.ssthresh, cwnd * 7 / 10, "CUBIC beta (RFC 9438 §4.6)");
        }
    }
}

#[test]
fn rack_waits_out_reordering_it_has_seen_before() {
    // Found by the simulator (seed 443): three duplicate ACKs with SACK started a recovery
    // although RACK knew the path reorders; now RACK alone decides (RFC 8985 §6.2).
    let (mut h, c, iss) = open(
        ConnectionConfig::default(),
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 100_000]).unwrap();
    assert_eq!(h.out().len(), 10);
    h.now += Duration::from_millis(100);
    // Segment 1 arrives after segment 2: a never-retransmitted segment delivered below the
    // highest SACKed one shows reordering.
    h.inject(&ack(&h, iss, 1)).unwrap();
    h.inject(&ack(&h, iss, 1).opt(Opt::Sack(vec![(seg(iss, 2), seg(iss, 3))])))
        .unwrap();
    h.inject(&ack(&h, iss, 3)).unwrap();
    let mut sent = h.out();
    // Segment 3 is late: 4, 5, 6 and 7 arrive first (four duplicate ACKs with SACK).
    for k in 5..=8 {
        h.inject(&ack(&h, iss, 3).opt(Opt::Sack(vec![(seg(iss, 4), seg(iss, k))])))
            .unwrap();
        sent.extend(h.out());
    }
    assert!(
        !segs(iss, &sent).contains(&3),
        "no retransmission within reo_wnd"
    );
    // It arrives within min_RTT/4 (25 ms), before the reordering timer.
    h.advance(Duration::from_millis(10));
    h.inject(&ack(&h, iss, 8)).unwrap();
    sent.extend(h.out());
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.packets_retransmitted, 0, "{:?}", segs(iss, &sent));
    assert_eq!(st.fast_retransmits, 0);
}

#[test]
fn rack_reordering_timer_marks_the_late_segment_lost() {
    let (mut h, c, iss) = open(
        ConnectionConfig::default(),
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 100_000]).unwrap();
    h.out();
    h.now += Duration::from_millis(100);
    // Two segments SACKed above a hole: not yet DupThresh, so RACK allows min_RTT/4.
    h.inject(&ack(&h, iss, 0).opt(Opt::Sack(vec![(seg(iss, 1), seg(iss, 3))])))
        .unwrap();
    assert!(segs(iss, &h.out()).iter().all(|&s| s >= 10));
    let waited = h.fire_next_timer();
    assert_eq!(
        waited,
        Duration::from_millis(25),
        "RACK.reo_wnd = min_RTT / 4"
    );
    assert_eq!(segs(iss, &h.out())[0], 0);
    assert_eq!(h.ep.stats_of(c).unwrap().fast_retransmits, 1);
}

#[test]
fn small_segments_count_in_bytes_with_a_floor() {
    // Minion §8.1: the window counts bytes, not buffers, so that small messages, each in its
    // own segment (consistent segmentation), get the byte rate of full-sized segments.
    let mut cfg = ConnectionConfig::default();
    cfg.consistent_segmentation = true;
    let (mut h, c, iss) = open(cfg.clone(), true, Duration::from_millis(100));
    for _ in 0..200 {
        h.ep.write(c, &[7u8; 100]).unwrap();
    }
    let first = h.out();
    assert_eq!(
        first.len(),
        100,
        "IW10 (RFC 6928) is 10 000 bytes of 100-byte segments"
    );
    assert!(first.iter().all(|p| p.payload.len() == 100));
    // Slow start grows the window by the bytes acknowledged (RFC 3465).
    h.now += Duration::from_millis(100);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1 + 2000).win(4096))
        .unwrap();
    assert_eq!(h.out().len(), 40, "20 freed, 20 from growth");
    assert_eq!(h.ep.stats_of(c).unwrap().cwnd, 12 * MSS as u64);
    // Found by the simulator (seed 1179): in bytes alone, IW10 let 3-byte writes out as a
    // burst of thousands of packets. Each segment counts at least SMSS/16 (62 bytes here).
    let (mut h, c, _) = open(cfg, true, Duration::from_millis(100));
    for _ in 0..400 {
        h.ep.write(c, &[7u8; 10]).unwrap();
    }
    assert_eq!(
        h.out().len(),
        162,
        "10 000 / 62, and one more while 10 bytes fit"
    );
}

#[test]
fn sacked_original_segments_are_rtt_samples_and_end_back_off() {
    // Found by the simulator (seed 550): without timestamps, an RTO back-off lasted as long
    // as no cumulative ACK covered a never-retransmitted segment.
    let (mut h, c, iss) = open(
        {
            let mut config = ConnectionConfig::default();
            config.rack_tlp = false;
            config
        },
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 10_000]).unwrap();
    h.out();
    assert_eq!(h.fire_next_timer(), Duration::from_millis(300));
    h.out();
    assert_eq!(h.ep.stats_of(c).unwrap().rto, Duration::from_millis(600));
    // Segment 5 (sent once, 400 ms ago) is SACKed: a valid sample (Karn's rule holds).
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 0).opt(Opt::Sack(vec![(seg(iss, 5), seg(iss, 6))])))
        .unwrap();
    let st = h.ep.stats_of(c).unwrap();
    // SRTT = 7/8 100 + 1/8 400 = 137.5 ms; RTTVAR = 3/4 50 + 1/4 300 = 112.5 ms.
    assert_eq!(st.srtt, Some(Duration::from_micros(137_500)));
    assert_eq!(st.rto, Duration::from_micros(137_500 + 4 * 112_500));
}

#[test]
fn no_second_recovery_right_after_an_rto() {
    // Found by the simulator (seed 883): after an RTO, SACKed duplicate ACKs started a fast
    // recovery whose ssthresh came from the stale FlightSize of the timed-out window; RFC 6675
    // §5.1 allows no new recovery before everything outstanding at the RTO is acknowledged.
    for rack_tlp in [false, true] {
        let (mut h, c, iss) = open(
            {
                let mut config = ConnectionConfig::default();
                config.rack_tlp = rack_tlp;
                config.congestion = CongestionAlgorithm::NewReno;
                config
            },
            true,
            Duration::from_millis(100),
        );
        h.ep.write(c, &[0u8; 20_000]).unwrap();
        h.out();
        let mut flight = 0;
        while h.ep.stats_of(c).unwrap().rto_timeouts == 0 {
            flight = h.ep.stats_of(c).unwrap().bytes_in_flight;
            h.fire_next_timer();
            h.out();
        }
        // With RACK-TLP a probe of new data went out first.
        assert_eq!(flight, if rack_tlp { 11_000 } else { 10_000 });
        let after_rto = h.ep.stats_of(c).unwrap();
        assert_eq!((after_rto.cwnd, after_rto.ssthresh), (1000, flight / 2));
        // The retransmitted head arrives; the receiver already held 2..=6.
        h.now += Duration::from_millis(100);
        for k in 0..4 {
            h.inject(&ack(&h, iss, 1).opt(Opt::Sack(vec![(seg(iss, 2), seg(iss, 4 + k))])))
                .unwrap();
            h.out();
        }
        let st = h.ep.stats_of(c).unwrap();
        assert!(!st.in_recovery, "rack_tlp {rack_tlp}");
        assert_eq!(st.fast_retransmits, 0);
        assert_eq!(st.ssthresh, flight / 2);
    }
}

#[test]
fn newreno_restarts_the_rto_only_on_the_first_partial_ack() {
    // RFC 6582 §3.2 step 5 ("Impatient", §4.3). Found by the simulator (seeds 1775, 4079):
    // restarting it on every partial ACK let NewReno crawl through hundreds of holes at one
    // per round trip.
    let (mut h, c, iss) = open(
        {
            let mut config = ConnectionConfig::default();
            config.congestion = CongestionAlgorithm::NewReno;
            config
        },
        false,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 10_000]).unwrap();
    h.out();
    h.now += Duration::from_millis(100);
    // Segments 1, 3 and 5 are lost.
    h.inject(&ack(&h, iss, 1)).unwrap();
    for _ in 0..3 {
        h.inject(&ack(&h, iss, 1)).unwrap();
    }
    assert_eq!(segs(iss, &h.out()).first(), Some(&1));
    assert!(h.ep.stats_of(c).unwrap().in_recovery);
    // First partial ACK: the RTO restarts.
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 3)).unwrap();
    h.out();
    let restarted_at = h.now;
    let rto = h.ep.stats_of(c).unwrap().rto;
    assert_eq!(h.ep.poll_timeout(), Some(restarted_at + rto));
    // Second partial ACK: it does not.
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 5)).unwrap();
    h.out();
    assert_eq!(h.ep.poll_timeout(), Some(restarted_at + rto));
}

#[test]
fn retransmitting_the_first_unacknowledged_segment_restarts_the_rto() {
    // Found by the simulator (seed 866): armed at the last cumulative ACK, the RTO expired
    // before a retransmission sent later (after RACK's reordering wait) could be acknowledged.
    let (mut h, c, iss) = open(
        ConnectionConfig::default(),
        true,
        Duration::from_millis(100),
    );
    h.ep.write(c, &[0u8; 10_000]).unwrap();
    h.out();
    let sent_at = h.now;
    h.now += Duration::from_millis(100);
    h.inject(&ack(&h, iss, 0).opt(Opt::Sack(vec![(seg(iss, 1), seg(iss, 3))])))
        .unwrap();
    h.out();
    // RACK's reordering timer (min_RTT / 4), then segment 0 goes again.
    assert_eq!(h.fire_next_timer(), Duration::from_millis(25));
    assert_eq!(segs(iss, &h.out())[0], 0);
    let rto = h.ep.stats_of(c).unwrap().rto;
    assert_eq!(h.ep.poll_timeout(), Some(h.now + rto));
    assert!(h.now + rto > sent_at + rto);
}

/// Client connection with timestamps (RFC 7323) and SACK, peer MSS 1000, handshake RTT
/// `rtt`, RACK-TLP off (so that the retransmission timeout is the only timer in play).
/// Returns the peer's next TSval too.
fn open_ts(rtt: Duration) -> (Harness, ConnectionHandle, u32) {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.rack_tlp = false;
        config
    });
    let syn = h.out1();
    let iss = syn.seq;
    let (tsval, _) = syn.ts().expect("timestamps offered");
    h.now += rtt;
    let p = h
        .pkt(SYN | ACK, IRS, iss + 1)
        .win(65535)
        .opt(Opt::Mss(MSS as u16))
        .opt(Opt::Ws(4))
        .opt(Opt::SackOk)
        .opt(Opt::Ts(1, tsval));
    h.inject(&p).unwrap();
    h.out();
    h.events();
    (h, c, iss)
}

/// Payload per segment with timestamps: MSS 1000 less the 12-byte option.
const TS_PAYLOAD: u32 = MSS - 12;

/// Data sequence number of segment `i` with timestamps.
fn ts_seg(iss: u32, i: u32) -> u32 {
    iss + 1 + i * TS_PAYLOAD
}

/// ACK up to segment `upto` (timestamps), echoing `tsecr`.
fn ts_ack(h: &Harness, iss: u32, upto: u32, tsecr: u32) -> Pkt {
    h.pkt(ACK, IRS + 1, ts_seg(iss, upto))
        .win(4096)
        .opt(Opt::Ts(2, tsecr))
}

/// Three segments out, then silence until the retransmission timeout resends the first one;
/// returns the TSvals of the three originals and of the retransmission.
fn spurious_timeout_setup(h: &mut Harness, c: ConnectionHandle, iss: u32) -> (Vec<u32>, u32) {
    h.ep.write(c, &[0u8; 3 * TS_PAYLOAD as usize]).unwrap();
    let originals: Vec<u32> = h.out().iter().map(|p| p.ts().expect("TSval").0).collect();
    assert_eq!(originals.len(), 3);
    // No ACK comes back (they are lost on the way): the RTO fires, cwnd falls to one SMSS.
    h.fire_next_timer();
    let r = h.out1();
    assert_eq!(r.seq, ts_seg(iss, 0));
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.rto_timeouts, 1);
    assert!(st.cwnd <= MSS as u64, "{st:#?}");
    (originals, r.ts().expect("TSval").0)
}

#[test]
fn spurious_timeout_is_undone_when_the_timestamp_echo_shows_the_original_was_acked() {
    // Eifel detection (RFC 3522 §2) and response (RFC 4015 §3): the first ACK after the
    // timeout acknowledges the first segment and echoes the TSval of an original, sent before
    // the retransmission: the timeout was spurious. The window comes back, and the third
    // segment, which the timeout presumed lost, is not resent (no go-back-N).
    let (mut h, c, iss) = open_ts(Duration::from_millis(100));
    let cwnd = h.ep.stats_of(c).unwrap().cwnd;
    let (originals, _) = spurious_timeout_setup(&mut h, c, iss);
    h.now += Duration::from_millis(100);
    h.inject(&ts_ack(&h, iss, 2, originals[1])).unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.spurious_rtos_undone, 1);
    assert_eq!((st.cwnd, st.ssthresh), (cwnd, u64::MAX), "{st:#?}");
    h.none();
    // The original of the third segment is acknowledged in its own time.
    h.inject(&ts_ack(&h, iss, 3, originals[2])).unwrap();
    assert_eq!(h.ep.stats_of(c).unwrap().bytes_in_flight, 0);

    // A real loss: the ACK echoes the retransmission's TSval. The timeout stands, and the
    // rest is resent in slow start.
    let (mut h, c, iss) = open_ts(Duration::from_millis(100));
    let (_, retransmission) = spurious_timeout_setup(&mut h, c, iss);
    h.now += Duration::from_millis(100);
    h.inject(&ts_ack(&h, iss, 1, retransmission)).unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.spurious_rtos_undone, 0);
    assert!(st.cwnd <= 2 * MSS as u64, "{st:#?}");
    let resent: Vec<u32> = h.out().iter().map(|p| p.seq).collect();
    assert_eq!(resent, vec![ts_seg(iss, 1), ts_seg(iss, 2)]);
}

#[test]
fn spurious_timeout_is_undone_when_every_retransmission_is_dsacked() {
    // RFC 3708 §3: without a usable echo (a peer that took the retransmission's TSval), the
    // D-SACK for the only retransmission, with the cumulative ACK past everything that was
    // outstanding at the timeout, shows that the receiver had it all.
    for dsack in [true, false] {
        let (mut h, c, iss) = open_ts(Duration::from_millis(100));
        let cwnd = h.ep.stats_of(c).unwrap().cwnd;
        let (_, retransmission) = spurious_timeout_setup(&mut h, c, iss);
        h.now += Duration::from_millis(100);
        let mut a = ts_ack(&h, iss, 3, retransmission);
        if dsack {
            a = a.opt(Opt::Sack(vec![(ts_seg(iss, 0), ts_seg(iss, 1))]));
        }
        h.inject(&a).unwrap();
        let st = h.ep.stats_of(c).unwrap();
        if dsack {
            assert_eq!(st.spurious_rtos_undone, 1);
            assert_eq!(st.cwnd, cwnd);
        } else {
            assert_eq!(st.spurious_rtos_undone, 0);
            assert!(st.cwnd < cwnd);
        }
    }
}

/// A voice-like flow for 2 s (200 bytes every 50 ms, each acknowledged 100 ms later), then
/// one of four further segments is lost and three duplicate ACKs SACK the others.
fn loss_after_rate_limited_period(h: &mut Harness, c: ConnectionHandle) {
    let mut sent = std::collections::VecDeque::new();
    for _ in 0..40 {
        h.ep.write(c, &[0u8; 200]).unwrap();
        let p = h.out1();
        sent.push_back(p.seq + 200);
        h.now += Duration::from_millis(50);
        if sent.len() > 2 {
            let end = sent.pop_front().unwrap();
            h.inject(&h.pkt(ACK, IRS + 1, end).win(4096)).unwrap();
            h.out();
        }
    }
    while let Some(end) = sent.pop_front() {
        h.inject(&h.pkt(ACK, IRS + 1, end).win(4096)).unwrap();
    }
    let mut starts = Vec::new();
    for _ in 0..4 {
        h.ep.write(c, &[0u8; 200]).unwrap();
        starts.push(h.out1().seq);
    }
    h.now += Duration::from_millis(100);
    for k in 1..=3 {
        h.inject(
            &h.pkt(ACK, IRS + 1, starts[0])
                .win(4096)
                .opt(Opt::Sack(vec![(starts[1], starts[k] + 200)])),
        )
        .unwrap();
        h.out();
    }
}

#[test]
fn an_application_limited_flow_keeps_its_initial_window_through_a_loss() {
    // RFC 7661: the flow got about 400 bytes acknowledged per round trip, less than half its
    // 10-segment window (the non-validated phase). A loss then reduces the window to no less
    // than the initial window: what it sends is set by the application, and a window at the
    // 2-segment floor would only stall it when ACKs are lost. (A flow that fills its window
    // gets CUBIC's 0.7 and NewReno's half: `cubic_and_newreno_reduce_differently`.)
    for cc in [CongestionAlgorithm::Cubic, CongestionAlgorithm::NewReno] {
        let (mut h, c, _) = open(
            {
                let mut config = ConnectionConfig::default();
                config.congestion = cc;
                config.rack_tlp = false;
                config
            },
            true,
            Duration::from_millis(100),
        );
        let iw = h.ep.stats_of(c).unwrap().cwnd;
        loss_after_rate_limited_period(&mut h, c);
        let st = h.ep.stats_of(c).unwrap();
        assert!(st.in_recovery, "{cc:?}: {st:#?}");
        assert_eq!(st.fast_retransmits, 1);
        assert_eq!((st.cwnd, st.ssthresh), (iw, iw), "{cc:?}");
        assert_eq!(st.app_limited_floors, 1);
    }
}

#[test]
fn an_undone_timeout_keeps_the_response_to_a_tail_loss_probe_that_may_have_repaired() {
    // A retransmitted tail loss probe was out when the timeout fired. The Eifel verdict says
    // the timeout was spurious, but not whether the probe repaired a loss: that repair keeps
    // its congestion response (RFC 8985 §7.4). Only D-SACKs for every copy, the probe's too,
    // show that nothing was lost (RFC 3708): then the window comes back whole.
    for proof in ["eifel", "dsack"] {
        let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
        let c = h.connect(ConnectionConfig::default());
        let syn = h.out1();
        let iss = syn.seq;
        h.now += Duration::from_millis(100);
        h.inject(
            &h.pkt(SYN | ACK, IRS, iss + 1)
                .win(65535)
                .opt(Opt::Mss(MSS as u16))
                .opt(Opt::Ws(4))
                .opt(Opt::SackOk)
                .opt(Opt::Ts(1, syn.ts().expect("TSval").0)),
        )
        .unwrap();
        h.out();
        let cwnd = h.ep.stats_of(c).unwrap().cwnd;
        h.ep.write(c, &[0u8; 3 * TS_PAYLOAD as usize]).unwrap();
        let originals: Vec<u32> = h.out().iter().map(|p| p.ts().expect("TSval").0).collect();
        h.fire_next_timer();
        assert_eq!(
            h.out1().seq,
            ts_seg(iss, 2),
            "the probe: the last segment again"
        );
        h.fire_next_timer();
        let rto = h.out1();
        assert_eq!(rto.seq, ts_seg(iss, 0));
        assert_eq!(h.ep.stats_of(c).unwrap().rto_timeouts, 1);
        h.now += Duration::from_millis(100);
        if proof == "eifel" {
            h.inject(&ts_ack(&h, iss, 3, originals[2])).unwrap();
        } else {
            let echo = rto.ts().expect("TSval").0;
            h.inject(
                &ts_ack(&h, iss, 3, echo).opt(Opt::Sack(vec![(ts_seg(iss, 0), ts_seg(iss, 1))])),
            )
            .unwrap();
            assert_eq!(h.ep.stats_of(c).unwrap().spurious_rtos_undone, 0);
            h.inject(
                &ts_ack(&h, iss, 3, echo).opt(Opt::Sack(vec![(ts_seg(iss, 2), ts_seg(iss, 3))])),
            )
            .unwrap();
        }
        let st = h.ep.stats_of(c).unwrap();
        assert_eq!(st.spurious_rtos_undone, 1, "{proof}");
        if proof == "eifel" {
            assert_eq!(
                st.ssthresh,
                cwnd * 7 / 10,
                "CUBIC beta for the probe's repair"
            );
            assert_eq!(st.cwnd, st.ssthresh);
        } else {
            assert_eq!((st.cwnd, st.ssthresh), (cwnd, u64::MAX));
        }
    }
}
