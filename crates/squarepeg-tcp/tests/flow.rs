//! Flow control, window scaling, persist timer, delayed ACKs, SACK generation, Nagle and
//! keepalive, as packet scripts.

mod common;

use std::time::Duration;

use common::*;
use squarepeg_tcp::{
    CloseReason, ConnectionConfig, ConnectionHandle, DropReason, Event, KeepaliveConfig,
};

const IRS: u32 = 7_000_000;

/// Client connection without timestamps (exact segment sizes = MSS); the peer's SYN-ACK
/// carries `peer_ws` if given.
fn open(
    cfg: ConnectionConfig,
    peer_mss: u16,
    peer_ws: Option<u8>,
    win: u16,
) -> (Harness, ConnectionHandle, u32) {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = cfg;
        config.timestamps = false;
        config
    });
    let iss = h.out1().seq;
    let mut p = h
        .pkt(SYN | ACK, IRS, iss + 1)
        .win(win)
        .opt(Opt::Mss(peer_mss));
    if let Some(ws) = peer_ws {
        p = p.opt(Opt::Ws(ws));
    }
    h.inject(&p).unwrap();
    h.out();
    h.events();
    (h, c, iss)
}

#[test]
fn window_scaling_arithmetic() {
    // The peer's shift is 3: a window field of 1000 means 8000 bytes.
    let (mut h, c, iss) = open(ConnectionConfig::default(), 1000, Some(3), 65535);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1).win(1000)).unwrap();
    assert_eq!(h.ep.stats_of(c).unwrap().send_window, 8000);
    h.ep.write(c, &[0u8; 20_000]).unwrap();
    let segs = h.out();
    let total: usize = segs.iter().map(|p| p.payload.len()).sum();
    assert_eq!(total, 8000);
    assert_eq!(segs.len(), 8);
    // Our own shift: 4 MiB buffer needs 7; the field is the free space >> 7.
    assert_eq!(segs[0].win, ((4u32 << 20) >> 7) as u16 - 1 + 1);
    // Max shift 14 (RFC 7323 §2.3): a larger offered shift is treated as 14.
    let (h2, c2, _) = open(ConnectionConfig::default(), 1000, Some(20), 65535);
    assert_eq!(
        h2.ep.connection(c2).unwrap().negotiated().send_window_scale,
        Some(14)
    );
}

#[test]
fn receive_window_shrinks_with_buffered_data_and_reopens_on_read() {
    let mut cfg = ConnectionConfig::default();
    cfg.recv_buffer = 4000;
    cfg.delayed_ack = None;
    let (mut h, c, iss) = open(cfg, 1000, None, 65535);
    let mut seq = IRS + 1;
    let mut wins = Vec::new();
    for _ in 0..4 {
        h.inject(&h.pkt(ACK, seq, iss + 1).data(&[1u8; 1000]))
            .unwrap();
        seq += 1000;
        wins.push(h.out1().win);
    }
    assert_eq!(wins, vec![3000, 2000, 1000, 0]);
    // Beyond the window: dropped, ACK with window 0.
    assert!(
        h.inject(&h.pkt(ACK, seq, iss + 1).data(&[1u8; 10]))
            .is_err()
    );
    assert_eq!(h.out1().win, 0);
    // Reading a little does not open a silly window (RFC 9293 §3.8.6.2.2)...
    let mut buf = [0u8; 500];
    assert_eq!(h.ep.read(c, &mut buf).unwrap(), 500);
    h.none();
    // ...reading it all sends a window update.
    assert_eq!(h.read_all(c).len(), 3500);
    let upd = h.out1();
    assert_eq!((upd.ack, upd.win), (seq, 4000));
}

#[test]
fn zero_window_persist_probes_back_off() {
    let (mut h, c, iss) = open(ConnectionConfig::default(), 1000, None, 2000);
    h.ep.write(c, &[9u8; 5000]).unwrap();
    let segs = h.out();
    assert_eq!(segs.len(), 2);
    // The peer acknowledges both with a zero window.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(0)).unwrap();
    h.none();
    // Probes: one byte of new data beyond the window (RFC 9293 §3.8.6.1), at RTO then doubling.
    let mut gaps = Vec::new();
    for i in 0..4 {
        gaps.push(h.fire_next_timer().as_millis());
        let probe = h.out1();
        assert_eq!(probe.seq, iss + 2001, "probe {i}");
        assert_eq!(probe.payload.len(), 1);
        // The receiver drops the byte and answers with a zero window.
        h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(0)).unwrap();
        h.none();
    }
    // First probe after one RTO (the minimum, 200 ms, as the handshake RTT was 0), then
    // exponential back-off.
    assert_eq!(gaps, vec![200, 400, 800, 1600]);
    assert_eq!(h.ep.stats_of(c).unwrap().zero_window_probes, 4);
    assert_eq!(h.ep.stats_of(c).unwrap().rto_timeouts, 0);
    // The window opens: the rest flows.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(10_000))
        .unwrap();
    let rest = h.out();
    // The dropped probe byte first, then the rest.
    assert_eq!((rest[0].seq, rest[0].payload.len()), (iss + 2001, 1));
    assert_eq!(rest.iter().map(|p| p.payload.len()).sum::<usize>(), 3000);
}

/// The steady-state ACK policy, after the quick ACKs of a connection's start.
fn delayed_acks_from_the_start() -> ConnectionConfig {
    let mut cfg = ConnectionConfig::default();
    cfg.quick_acks = 0;
    cfg
}

#[test]
fn delayed_ack_every_second_segment_and_timer() {
    let (mut h, c, iss) = open(delayed_acks_from_the_start(), 1000, None, 65535);
    let mss = 1460u32; // our advertised MSS; the peer sends full segments of it
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1).data(&[1u8; 1460]))
        .unwrap();
    h.none();
    h.inject(&h.pkt(ACK, IRS + 1 + mss, iss + 1).data(&[1u8; 1460]))
        .unwrap();
    assert_eq!(h.out1().ack, IRS + 1 + 2 * mss);
    // A single segment is acknowledged by the 40 ms timer.
    h.inject(&h.pkt(ACK, IRS + 1 + 2 * mss, iss + 1).data(&[1u8; 100]))
        .unwrap();
    h.none();
    assert_eq!(h.fire_next_timer(), Duration::from_millis(40));
    assert_eq!(h.out1().ack, IRS + 1 + 2 * mss + 100);
    assert_eq!(h.read_all(c).len(), 3020);
}

#[test]
fn out_of_order_data_gets_immediate_ack_with_sack_blocks() {
    let (h, c, iss) = open(ConnectionConfig::default(), 1000, None, 65535);
    // Peer SYN-ACK had no SACK-permitted: no SACK blocks; reopen with SACK.
    let _ = (h.ep.connection(c).unwrap().negotiated().sack, iss);
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config
    });
    let iss = h.out1().seq;
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss + 1)
            .opt(Opt::Mss(1000))
            .opt(Opt::SackOk),
    )
    .unwrap();
    h.out();
    let base = IRS + 1;
    // Segments 1000..2000 and 3000..4000 arrive; 0..1000 and 2000..3000 are missing.
    h.inject(&h.pkt(ACK, base + 1000, iss + 1).data(&[2u8; 1000]))
        .unwrap();
    let a1 = h.out1();
    assert_eq!(a1.ack, base);
    assert_eq!(a1.sack(), vec![(base + 1000, base + 2000)]);
    h.inject(&h.pkt(ACK, base + 3000, iss + 1).data(&[4u8; 1000]))
        .unwrap();
    let a2 = h.out1();
    // Most recent block first (RFC 2018 §4).
    assert_eq!(
        a2.sack(),
        vec![(base + 3000, base + 4000), (base + 1000, base + 2000)]
    );
    assert_eq!(h.ep.stats_of(c).unwrap().ooo_bytes, 2000);
    // Filling the first hole: immediate ACK, the remaining block reported.
    h.inject(&h.pkt(ACK, base, iss + 1).data(&[1u8; 1000]))
        .unwrap();
    let a3 = h.out1();
    assert_eq!(a3.ack, base + 2000);
    assert_eq!(a3.sack(), vec![(base + 3000, base + 4000)]);
    h.inject(&h.pkt(ACK, base + 2000, iss + 1).data(&[3u8; 1000]))
        .unwrap();
    let a4 = h.out1();
    assert_eq!(a4.ack, base + 4000);
    assert!(a4.sack().is_empty());
    let data = h.read_all(c);
    assert_eq!(data.len(), 4000);
    assert!(data[..1000].iter().all(|&b| b == 1) && data[3000..].iter().all(|&b| b == 4));
}

#[test]
fn nagle_holds_small_segments_while_data_is_unacknowledged() {
    let (mut h, c, iss) = open(
        {
            let mut config = ConnectionConfig::default();
            config.nagle = true;
            config
        },
        1000,
        None,
        65535,
    );
    h.ep.write(c, b"a").unwrap();
    assert_eq!(h.out1().payload, b"a");
    h.ep.write(c, b"b").unwrap();
    h.ep.write(c, b"c").unwrap();
    h.none();
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2)).unwrap();
    assert_eq!(h.out1().payload, b"bc");
    // Without Nagle (the default), small writes go at once.
    let (mut h, c, _) = open(ConnectionConfig::default(), 1000, None, 65535);
    h.ep.write(c, b"a").unwrap();
    h.out1();
    h.ep.write(c, b"b").unwrap();
    assert_eq!(h.out1().payload, b"b");
}

#[test]
fn keepalive_probes_then_reset() {
    let mut cfg = ConnectionConfig::default();
    cfg.keepalive = Some(KeepaliveConfig::new(
        Duration::from_secs(10),
        Duration::from_secs(1),
        3,
    ));
    let (mut h, c, iss) = open(cfg, 1000, None, 65535);
    assert_eq!(h.fire_next_timer(), Duration::from_secs(10));
    let probe = h.out1();
    // RFC 9293 §3.8.4: SEG.SEQ = SND.NXT - 1, no data.
    assert_eq!((probe.seq, probe.payload.len()), (iss, 0));
    // The peer answers: the idle period starts again.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1)).unwrap();
    assert_eq!(h.fire_next_timer(), Duration::from_secs(10));
    h.out1();
    for _ in 0..2 {
        assert_eq!(h.fire_next_timer(), Duration::from_secs(1));
        h.out1();
    }
    assert_eq!(h.fire_next_timer(), Duration::from_secs(1));
    assert_eq!(h.out1().flag_str(), "R.");
    assert_eq!(h.events(), vec![Event::Closed(c, CloseReason::TimedOut)]);
    // One answered probe, then three unanswered ones.
    assert_eq!(h.ep.stats_of(c).unwrap().keepalive_probes, 4);
}

#[test]
fn keepalive_is_off_by_default() {
    let (h, _c, _) = open(ConnectionConfig::default(), 1000, None, 65535);
    assert_eq!(h.ep.poll_timeout(), None);
}

#[test]
fn sender_sws_avoidance_waits_for_a_useful_window() {
    let (mut h, c, iss) = open(ConnectionConfig::default(), 1000, None, 10_000);
    h.ep.write(c, &[5u8; 12_000]).unwrap();
    let n: usize = h.out().iter().map(|p| p.payload.len()).sum();
    assert_eq!(n, 10_000);
    // The peer acknowledges everything but offers only 300 bytes: less than an MSS and less
    // than half its largest window, so nothing is sent (RFC 9293 §3.8.6.2.1)...
    h.inject(&h.pkt(ACK, IRS + 1, iss + 10_001).win(300))
        .unwrap();
    h.none();
    // ...until the override timer fires.
    h.fire_next_timer();
    assert_eq!(h.out1().payload.len(), 300);
}

#[test]
fn user_timeout_aborts() {
    let mut cfg = ConnectionConfig::default();
    cfg.user_timeout = Some(Duration::from_secs(5));
    let (mut h, c, _) = open(cfg, 1000, None, 65535);
    h.ep.write(c, b"hello").unwrap();
    h.out1();
    let mut t = Duration::ZERO;
    while h.events().is_empty() && t < Duration::from_secs(60) {
        t += h.fire_next_timer();
        h.out();
    }
    assert_eq!(t, Duration::from_secs(5));
    assert_eq!(
        h.ep.connection(c).unwrap().close_reason(),
        Some(CloseReason::TimedOut)
    );
}

#[test]
fn duplicate_data_gets_dsack() {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config.delayed_ack = None;
        config
    });
    let iss = h.out1().seq;
    h.inject(&h.pkt(SYN | ACK, IRS, iss + 1).opt(Opt::SackOk))
        .unwrap();
    h.out();
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1).data(&[1u8; 500]))
        .unwrap();
    assert_eq!(h.out1().ack, IRS + 501);
    // The same segment again (a spurious retransmission): immediate ACK with a D-SACK block
    // for it (RFC 2883 §4), every time (data segments are not rate-limited).
    for _ in 0..2 {
        let _ = h.inject(&h.pkt(ACK, IRS + 1, iss + 1).data(&[1u8; 500]));
        let a = h.out1();
        assert_eq!(a.ack, IRS + 501);
        assert_eq!(a.sack(), vec![(IRS + 1, IRS + 501)]);
    }
    // The next ACK carries no D-SACK.
    h.inject(&h.pkt(ACK, IRS + 501, iss + 1).data(&[1u8; 10]))
        .unwrap();
    assert!(h.out1().sack().is_empty());
    assert_eq!(h.read_all(c).len(), 510);
}

#[test]
fn writable_is_reported_once_a_third_of_the_send_buffer_is_free() {
    // Found by the simulator (seed 1064): a writer woken for every few acknowledged bytes wrote
    // them at once and, without Nagle, sent them as tiny segments.
    let mut cfg = ConnectionConfig::default();
    cfg.send_buffer = 30_000;
    let (mut h, c, iss) = open(cfg, 1000, None, 65535);
    assert_eq!(h.ep.write(c, &[7u8; 40_000]).unwrap(), 30_000);
    assert_eq!(
        h.ep.write(c, &[7u8; 10]),
        Err(squarepeg_tcp::Error::WouldBlock)
    );
    let sent = h.out().len();
    assert_eq!(sent, 10, "IW10");
    // 5000 bytes acknowledged: free space below a third of the buffer, no wake-up.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1 + 5000)).unwrap();
    h.out();
    assert!(!h.events().contains(&Event::Writable(c)));
    // 10 000 bytes acknowledged: a third of the buffer is free.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1 + 10_000)).unwrap();
    h.out();
    assert_eq!(h.events(), vec![Event::Writable(c)]);
    assert_eq!(h.ep.connection(c).unwrap().writable(), 10_000);
}

#[test]
fn a_run_of_small_segments_is_acknowledged_every_second_segment() {
    // Found by the simulator (seed 22357): a peer sending 8-byte messages, a few per window,
    // got one ACK per 40 ms delayed-ACK timeout, because only full-sized segments counted.
    // After two segments of the same size the receiver takes it as the peer's segment size
    // (as Linux's tcp_measure_rcv_mss does).
    let (mut h, _c, iss) = open(delayed_acks_from_the_start(), 1000, None, 65535);
    let mut seq = IRS + 1;
    let mut send = |h: &mut Harness, len: usize| {
        h.inject(&h.pkt(ACK, seq, iss + 1).data(&vec![3u8; len]))
            .unwrap();
        seq += len as u32;
        h.out()
    };
    // The first small segment waits for the timer or a second one of its size...
    assert!(send(&mut h, 100).is_empty());
    // ...which makes 100 bytes the peer's segment size: every second one is acknowledged at
    // once.
    assert_eq!(send(&mut h, 100)[0].ack, IRS + 1 + 200);
    assert!(send(&mut h, 100).is_empty());
    assert_eq!(send(&mut h, 100)[0].ack, IRS + 1 + 400);
    assert!(send(&mut h, 100).is_empty());
    assert_eq!(send(&mut h, 100)[0].ack, IRS + 1 + 600);
}

#[test]
fn the_first_segments_of_a_connection_are_acknowledged_at_once() {
    // Linux's quick-ACK mode: the peer's slow start grows on every segment, and an odd first
    // flight is not acknowledged a delayed-ACK timeout late.
    let mut cfg = ConnectionConfig::default();
    cfg.quick_acks = 3;
    let (mut h, c, iss) = open(cfg, 1000, None, 65535);
    let mut seq = IRS + 1;
    for i in 1..=3u32 {
        h.inject(&h.pkt(ACK, seq, iss + 1).data(&[1u8; 1000]))
            .unwrap();
        seq += 1000;
        assert_eq!(h.out1().ack, IRS + 1 + i * 1000, "quick ACK {i}");
    }
    // Then every second segment, or the timer.
    h.inject(&h.pkt(ACK, seq, iss + 1).data(&[1u8; 1000]))
        .unwrap();
    h.none();
    seq += 1000;
    h.inject(&h.pkt(ACK, seq, iss + 1).data(&[1u8; 1000]))
        .unwrap();
    assert_eq!(h.out1().ack, IRS + 1 + 5000);
    assert_eq!(h.read_all(c).len(), 5000);
}

#[test]
fn a_small_first_segment_keeps_the_delayed_ack() {
    // An answer smaller than a segment: its ACK may ride on the reply or the FIN.
    let (mut h, _c, iss) = open(ConnectionConfig::default(), 1000, None, 65535);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1).data(&[1u8; 100]))
        .unwrap();
    h.none();
    assert_eq!(h.fire_next_timer(), Duration::from_millis(40));
    assert_eq!(h.out1().ack, IRS + 1 + 100);
}

/// A window that cannot be expressed in units of the window scale is rounded up so that its
/// right edge never moves left; that rounding must not let a peer push the buffer past its
/// limit one unit at a time (it sends all but a sliver of each window, the sliver is rounded
/// up to a whole unit, and so on).
#[test]
fn window_rounding_does_not_grow_the_receive_buffer() {
    let mut cfg = ConnectionConfig::default();
    cfg.recv_buffer = 4000;
    cfg.window_scale = Some(7);
    cfg.delayed_ack = None;
    let (mut h, c, iss) = open(cfg, 1000, Some(0), 65535);
    let unit = 1u32 << 7;
    let mut seq = IRS + 1;
    // The window of the SYN is unscaled: start from an ACK that carries a scaled one.
    h.inject(&h.pkt(ACK, seq, iss + 1).data(&[1])).unwrap();
    seq += 1;
    let mut window = u32::from(h.out1().win) * unit;
    for _ in 0..200 {
        if window == 0 {
            break;
        }
        let n = (window - 1).max(1) as usize;
        let _ = h.inject(&h.pkt(ACK, seq, iss + 1).data(&vec![1u8; n]));
        let acks = h.out();
        let Some(last) = acks.last() else { break };
        // What the receiver took in is all it acknowledged.
        seq = last.ack;
        window = u32::from(last.win) * unit;
        let held = h.ep.stats_of(c).unwrap().recv_buffered;
        assert!(
            held <= 4000,
            "{held} bytes held with a receive buffer of 4000"
        );
    }
    assert_eq!(window, 0, "the window stays open without reads");
}

/// A client with a 2 s user timeout whose peer took 2000 bytes and closed its window, with
/// 3000 bytes waiting: the persist timer probes.
fn zero_window_with_user_timeout() -> (Harness, ConnectionHandle, u32) {
    let mut cfg = ConnectionConfig::default();
    cfg.user_timeout = Some(Duration::from_secs(2));
    let (mut h, c, iss) = open(cfg, 1000, None, 2000);
    h.ep.write(c, &[9u8; 5000]).unwrap();
    assert_eq!(h.out().len(), 2);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(0)).unwrap();
    h.none();
    (h, c, iss)
}

#[test]
fn a_zero_window_peer_that_answers_its_probes_outlives_the_user_timeout() {
    let (mut h, c, iss) = zero_window_with_user_timeout();
    // Ten user timeouts with the window closed, every probe answered.
    let mut t = Duration::ZERO;
    let mut gaps = Vec::new();
    while t < Duration::from_secs(20) {
        let gap = h.fire_next_timer();
        t += gap;
        gaps.push(gap);
        let probe = h.out1();
        assert_eq!((probe.seq, probe.payload.len()), (iss + 2001, 1));
        h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(0)).unwrap();
        assert_eq!(h.events(), vec![], "after {t:?}");
    }
    // The back-off stops at a quarter of the user timeout.
    assert!(
        gaps.iter().all(|&g| g <= Duration::from_millis(500)),
        "{gaps:?}"
    );
    assert!(gaps.ends_with(&[Duration::from_millis(500); 4]), "{gaps:?}");
    assert!(h.ep.connection(c).unwrap().close_reason().is_none());
    // The window opens: everything waiting flows.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(10_000))
        .unwrap();
    let rest = h.out();
    assert_eq!(rest.iter().map(|p| p.payload.len()).sum::<usize>(), 3000);
}

#[test]
fn a_zero_window_peer_that_stops_answering_its_probes_times_out() {
    let (mut h, c, iss) = zero_window_with_user_timeout();
    // Three probes answered...
    for _ in 0..3 {
        h.fire_next_timer();
        h.out1();
        h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(0)).unwrap();
    }
    // ...then none.
    let mut since_first_unanswered = None::<Duration>;
    while h.events().is_empty() {
        let gap = h.fire_next_timer();
        if let Some(t) = since_first_unanswered.as_mut() {
            *t += gap;
        }
        if !h.out().is_empty() && since_first_unanswered.is_none() {
            since_first_unanswered = Some(Duration::ZERO);
        }
        assert!(
            since_first_unanswered.unwrap_or_default() < Duration::from_secs(10),
            "no timeout"
        );
    }
    let silent = since_first_unanswered.expect("a probe went out");
    // One user timeout after the first unanswered probe, within a probe interval.
    assert!(
        silent >= Duration::from_secs(2) && silent <= Duration::from_millis(2500),
        "{silent:?}"
    );
    assert_eq!(
        h.ep.connection(c).unwrap().close_reason(),
        Some(CloseReason::TimedOut)
    );
}

/// While a zero-window probe's byte is outstanding, a segment without data is numbered at
/// that byte (the peer's RCV.NXT), not after it: a closed window accepts nothing else, and a
/// Linux peer drops it unread (its keepalive then counts our answers as missing).
#[test]
fn acks_behind_a_zero_window_probe_are_numbered_at_the_probe() {
    let (mut h, _c, iss) = zero_window_with_user_timeout();
    h.fire_next_timer();
    let probe = h.out1();
    assert_eq!((probe.seq, probe.payload.len()), (iss + 2001, 1));
    // The peer drops the byte; it sends data of its own, which we acknowledge.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2001).win(0).data(b"ping"))
        .unwrap();
    let mut out = h.out();
    if out.is_empty() {
        // A delayed ACK.
        assert!(h.fire_next_timer() < Duration::from_millis(500));
        out = h.out();
    }
    assert_eq!(out.len(), 1, "{out:?}");
    let ack = &out[0];
    assert_eq!((ack.ack, ack.payload.len()), (IRS + 5, 0));
    assert_eq!(ack.seq, iss + 2001);
    // The same for a keepalive probe of the peer's (SEG.SEQ = its SND.NXT - 1).
    // Below the window: refused, and answered with an ACK (RFC 9293 §3.10.7.4).
    assert!(h.inject(&h.pkt(ACK, IRS + 4, iss + 2001).win(0)).is_err());
    let answer = h.out1();
    assert_eq!((answer.seq, answer.ack), (iss + 2001, IRS + 5));
}

// ------------------------------------------------------------ path MTU (RFC 1191, RFC 8201)

/// A client whose peer offered MSS 1460 (no timestamps) with 10 000 bytes in flight in
/// full-sized segments (1460 bytes over IPv4, 1440 over IPv6: our own MTU, 1500, allows no
/// more); returns them.
fn in_flight(local: &str, remote: &str) -> (Harness, ConnectionHandle, u32, Vec<Pkt>) {
    let mut h = Harness::new(local, remote);
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config
    });
    let iss = h.out1().seq;
    h.inject(&h.pkt(SYN | ACK, IRS, iss + 1).opt(Opt::Mss(1460)))
        .unwrap();
    h.out();
    h.events();
    h.ep.write(c, &[7u8; 10_000]).unwrap();
    let sent = h.out();
    let (ranges, _) = coverage(&sent, iss);
    assert_eq!(ranges, [(0, 10_000)]);
    (h, c, iss, sent)
}

/// The stream ranges `packets` cover, merged, and their largest payload.
fn coverage(packets: &[Pkt], iss: u32) -> (Vec<(u32, u32)>, usize) {
    let mut ranges: Vec<(u32, u32)> = packets
        .iter()
        .filter(|p| !p.payload.is_empty())
        .map(|p| (p.seq - iss - 1, p.seq - iss - 1 + p.payload.len() as u32))
        .collect();
    ranges.sort();
    let mut merged: Vec<(u32, u32)> = Vec::new();
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let largest = packets.iter().map(|p| p.payload.len()).max().unwrap_or(0);
    (merged, largest)
}

#[test]
fn a_packet_too_big_cuts_the_segments_in_flight_to_the_path_mtu() {
    let (mut h, c, iss, sent) = in_flight("192.0.2.1:40000", "198.51.100.7:80");
    // A router before a 1400-byte link dropped the first segment (and, as they are as
    // large, all the others).
    let icmp = icmp_too_big("203.0.113.9".parse().unwrap(), 1400, &sent[0].build());
    h.ep.handle_packet(h.now, &icmp).unwrap();
    let again = h.out();
    // The six 1460-byte segments again, at once, in pieces of at most 1400 - 40 bytes (not
    // a congestion event: the window that sent them sends them again); the last, 1240
    // bytes, passed the link.
    let (ranges, largest) = coverage(&again, iss);
    assert_eq!(ranges, [(0, 6 * 1460)], "{again:#?}");
    assert_eq!(largest, 1360);
    assert_eq!(h.ep.stats_of(c).unwrap().path_mtu_reductions, 1);
    assert_eq!(h.ep.stats().packet_too_big_believed, 1);
    // New data too.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 10_001)).unwrap();
    h.ep.write(c, &[8u8; 5000]).unwrap();
    let (_, largest) = coverage(&h.out(), iss);
    assert_eq!(largest, 1360);
}

#[test]
fn a_packet_too_big_over_ipv6_and_its_floor() {
    let (mut h, c, iss, sent) = in_flight("[2001:db8::1]:40000", "[2001:db8::7]:80");
    // Below the IPv6 minimum MTU: 1280 (RFC 8201 §4), so 1280 - 60 bytes of payload.
    let icmp = icmp_too_big("2001:db8::99".parse().unwrap(), 1000, &sent[2].build());
    h.ep.handle_packet(h.now, &icmp).unwrap();
    // Every segment was larger: all of them again.
    let (ranges, largest) = coverage(&h.out(), iss);
    assert_eq!(ranges, [(0, 10_000)]);
    assert_eq!(largest, 1220);
    assert_eq!(h.ep.stats_of(c).unwrap().path_mtu_reductions, 1);
    // A larger MTU later changes nothing (no increase without probing).
    let icmp = icmp_too_big("2001:db8::99".parse().unwrap(), 1500, &sent[2].build());
    h.ep.handle_packet(h.now, &icmp).unwrap();
    h.none();
}

#[test]
fn an_ipv4_packet_too_big_below_the_floor_is_clamped() {
    let (mut h, _c, iss, sent) = in_flight("192.0.2.1:40000", "198.51.100.7:80");
    // A forged tiny MTU cannot make the connection send 28-byte segments: 552 at least.
    let icmp = icmp_too_big("203.0.113.9".parse().unwrap(), 68, &sent[0].build());
    h.ep.handle_packet(h.now, &icmp).unwrap();
    // From the first byte on, in segments of 552 - 40 bytes (as many as the window, now
    // counted in these segments, allows).
    let again = h.out();
    let (ranges, largest) = coverage(&again, iss);
    assert_eq!(ranges[0].0, 0, "{ranges:?}");
    assert_eq!(largest, 512);
}

#[test]
fn a_packet_too_big_that_quotes_nothing_in_flight_is_not_believed() {
    let (mut h, c, iss, sent) = in_flight("192.0.2.1:40000", "198.51.100.7:80");
    let router = "203.0.113.9".parse().unwrap();
    // Quoting a sequence number beyond what was sent (RFC 5927 §4.1)...
    let mut forged = sent[0].clone();
    forged.seq = iss + 1 + 50_000;
    let icmp = icmp_too_big(router, 1400, &forged.build());
    assert_eq!(
        h.ep.handle_packet(h.now, &icmp),
        Err(DropReason::IcmpIgnored)
    );
    // ...or one already acknowledged...
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1 + 2920)).unwrap();
    h.out();
    let icmp = icmp_too_big(router, 1400, &sent[0].build());
    assert_eq!(
        h.ep.handle_packet(h.now, &icmp),
        Err(DropReason::IcmpIgnored)
    );
    // ...or another connection's ports.
    let mut other = sent[3].clone();
    other.src = "192.0.2.1:40001".parse().unwrap();
    let icmp = icmp_too_big(router, 1400, &other.build());
    assert_eq!(
        h.ep.handle_packet(h.now, &icmp),
        Err(DropReason::IcmpIgnored)
    );
    // A damaged one is not even parsed as one.
    let mut icmp = icmp_too_big(router, 1400, &sent[3].build());
    icmp[30] ^= 0x40;
    assert_eq!(h.ep.handle_packet(h.now, &icmp), Err(DropReason::NotTcp));
    h.none();
    assert_eq!(h.ep.stats_of(c).unwrap().path_mtu_reductions, 0);
    assert_eq!(h.ep.stats().dropped(DropReason::IcmpIgnored), 3);
    assert_eq!(h.ep.stats().packet_too_big_believed, 0);
}

/// Full-sized segments that only time out (a link drops them and its ICMP errors are
/// filtered): the third timeout in a row cuts the segments to the base MSS.
#[test]
fn the_third_timeout_in_a_row_suspects_a_path_mtu_black_hole() {
    let (mut h, c, iss, _) = in_flight("192.0.2.1:40000", "198.51.100.7:80");
    let mut sizes = Vec::new();
    for _ in 0..4 {
        h.fire_next_timer();
        let resent = h.out();
        assert_eq!(resent[0].seq, iss + 1);
        sizes.push(resent[0].payload.len());
    }
    // Two timeouts resend 1460 bytes; from the third on, 1024.
    assert_eq!(sizes, [1460, 1460, 1024, 1024]);
    assert_eq!(h.ep.stats_of(c).unwrap().path_mtu_black_holes, 1);
    // Acknowledged at last: the rest goes in 1024-byte segments.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1 + 1024)).unwrap();
    let rest = h.out();
    assert!(rest.iter().all(|p| p.payload.len() <= 1024), "{rest:#?}");
    assert!(!rest.is_empty());
}

#[test]
fn black_hole_detection_can_be_switched_off() {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config.base_mss = None;
        config
    });
    let iss = h.out1().seq;
    h.inject(&h.pkt(SYN | ACK, IRS, iss + 1).opt(Opt::Mss(1460)))
        .unwrap();
    h.out();
    h.ep.write(c, &[7u8; 5000]).unwrap();
    h.out();
    for _ in 0..4 {
        h.fire_next_timer();
        assert_eq!(h.out()[0].payload.len(), 1460);
    }
    assert_eq!(h.ep.stats_of(c).unwrap().path_mtu_black_holes, 0);
}
