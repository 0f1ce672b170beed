//! Packet-level handshake and teardown scripts (packetdrill style): exact packets in, exact
//! packets out.

mod common;

use std::time::Duration;

use common::*;
use squarepeg_tcp::{CloseReason, ConnectionConfig, Event, State};

const IRS: u32 = 1_000_000;

fn client() -> Harness {
    Harness::new("192.0.2.1:40000", "198.51.100.7:80")
}

#[test]
fn active_open_negotiates_all_options() {
    let mut h = client();
    let c = h.connect(ConnectionConfig::default());
    let syn = h.out1();
    assert_eq!(syn.flag_str(), "S");
    // Linux-like initial window: 65535 rounded down to a multiple of the MSS.
    assert_eq!(syn.win, 64240);
    // Linux option layout: MSS, SACK_PERM, TS, NOP, WS.
    assert_eq!(
        syn.options_bytes()[..8],
        [2, 4, 0x05, 0xb4, 4, 2, 8, 10],
        "{syn:?}"
    );
    assert_eq!(syn.mss(), Some(1460));
    assert!(syn.sack_ok());
    assert_eq!(syn.ws(), Some(7));
    let (tsval, tsecr) = syn.ts().unwrap();
    assert_eq!(tsecr, 0);
    let iss = syn.seq;

    h.now += Duration::from_millis(50);
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss + 1)
            .win(65535)
            .opt(Opt::Mss(1400))
            .opt(Opt::SackOk)
            .opt(Opt::Ts(777, tsval))
            .opt(Opt::Nop)
            .opt(Opt::Ws(8)),
    )
    .unwrap();
    let ack = h.out1();
    assert_eq!(ack.flag_str(), ".");
    assert_eq!((ack.seq, ack.ack), (iss + 1, IRS + 1));
    // 4 MiB buffer with shift 7.
    assert_eq!(ack.win, 32768);
    assert_eq!(ack.ts().unwrap().1, 777);
    assert_eq!(h.events(), vec![Event::Connected(c), Event::Writable(c)]);
    // The SYN-ACK's window is never scaled (RFC 7323 §2.2).
    assert_eq!(h.ep.stats_of(c).unwrap().send_window, 65535);
    let conn = h.ep.connection(c).unwrap();
    assert_eq!(conn.state(), State::Established);
    let n = conn.negotiated();
    assert_eq!(n.send_mss, 1400 - 12);
    assert_eq!(n.send_window_scale, Some(8));
    assert_eq!(n.recv_window_scale, Some(7));
    assert!(n.timestamps && n.sack);
    // The first RTT sample comes from the handshake.
    assert_eq!(conn.srtt(), Some(Duration::from_millis(50)));

    // Data is cut at the negotiated MSS; PSH on the segment that empties the queue.
    assert_eq!(h.ep.write(c, &[7u8; 3000]).unwrap(), 3000);
    let segs = h.out();
    let lens: Vec<usize> = segs.iter().map(|p| p.payload.len()).collect();
    assert_eq!(lens, vec![1388, 1388, 224]);
    assert_eq!(segs[2].flag_str(), "P.");
    assert_eq!(segs[1].seq, iss + 1 + 1388);
}

#[test]
fn active_open_peer_without_options() {
    let mut h = client();
    let c = h.connect(ConnectionConfig::default());
    let iss = h.out1().seq;
    h.inject(&h.pkt(SYN | ACK, IRS, iss + 1).win(8192)).unwrap();
    let ack = h.out1();
    assert!(ack.opts.is_empty(), "{ack:?}");
    // Without window scaling the field is the plain window, capped at 65535.
    assert_eq!(ack.win, 65535);
    let n = h.ep.connection(c).unwrap().negotiated();
    // RFC 9293 §3.7.1: no MSS option means 536.
    assert_eq!(n.send_mss, 536);
    assert_eq!(n.send_window_scale, None);
    assert!(!n.timestamps && !n.sack);
    h.ep.write(c, &[1u8; 1000]).unwrap();
    let segs = h.out();
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].payload.len(), 536);
    assert!(segs[0].opts.is_empty());
}

#[test]
fn each_option_can_be_switched_off() {
    let mut h = client();
    let mut cfg = ConnectionConfig::default();
    cfg.sack = false;
    cfg.timestamps = false;
    cfg.window_scaling = false;
    cfg.mss = Some(1000);
    h.connect(cfg);
    let syn = h.out1();
    assert_eq!(syn.opts, vec![Opt::Mss(1000)]);
    let mut h = client();
    h.connect({
        let mut config = ConnectionConfig::default();
        config.sack = false;
        config
    });
    let syn = h.out1();
    // Timestamps without SACK: NOP NOP TS.
    assert_eq!(&syn.options_bytes()[4..8], &[1, 1, 8, 10]);
    assert!(!syn.sack_ok());
    let mut h = client();
    h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config
    });
    let syn = h.out1();
    // SACK without timestamps: NOP NOP SACK_PERM.
    assert_eq!(&syn.options_bytes()[4..8], &[1, 1, 4, 2]);
}

fn server() -> Harness {
    Harness::new("192.0.2.1:80", "198.51.100.7:50000")
}

#[test]
fn passive_open_with_options_then_accept() {
    let mut h = server();
    let l = h.listen(8, ConnectionConfig::default());
    h.inject(
        &h.pkt(SYN, IRS, 0)
            .opt(Opt::Mss(1460))
            .opt(Opt::SackOk)
            .opt(Opt::Ts(5000, 0))
            .opt(Opt::Nop)
            .opt(Opt::Ws(9)),
    )
    .unwrap();
    let synack = h.out1();
    assert_eq!(synack.flag_str(), "S.");
    assert_eq!(synack.ack, IRS + 1);
    assert_eq!(synack.win, 64240);
    assert_eq!(synack.mss(), Some(1460));
    assert!(synack.sack_ok());
    assert_eq!(synack.ws(), Some(7));
    let (our_ts, ecr) = synack.ts().unwrap();
    assert_eq!(ecr, 5000);
    assert!(h.ep.accept(l).is_none());
    let iss = synack.seq;
    h.inject(
        &h.pkt(ACK, IRS + 1, iss + 1)
            .win(100)
            .opt(Opt::Nop)
            .opt(Opt::Nop)
            .opt(Opt::Ts(5001, our_ts)),
    )
    .unwrap();
    h.none();
    assert_eq!(h.events(), vec![Event::Incoming(l)]);
    let c = h.ep.accept(l).unwrap();
    let conn = h.ep.connection(c).unwrap();
    assert_eq!(conn.state(), State::Established);
    // Window 100 << 9.
    assert_eq!(conn.stats().send_window, 100 << 9);
    assert!(h.ep.accept(l).is_none());
}

#[test]
fn passive_open_without_options_answers_with_mss_only() {
    let mut h = server();
    h.listen(8, ConnectionConfig::default());
    h.inject(&h.pkt(SYN, IRS, 0)).unwrap();
    let synack = h.out1();
    assert_eq!(synack.opts, vec![Opt::Mss(1460)]);
}

#[test]
fn syn_ack_retransmitted_on_duplicate_syn_and_timer() {
    let mut h = server();
    h.listen(8, ConnectionConfig::default());
    let syn = h.pkt(SYN, IRS, 0).opt(Opt::Mss(1460));
    h.inject(&syn).unwrap();
    let first = h.out1();
    // Duplicate SYN: the SYN-ACK is sent again.
    h.inject(&syn).unwrap();
    let again = h.out1();
    assert_eq!(
        (again.seq, again.ack, again.flag_str()),
        (first.seq, first.ack, "S.".into())
    );
    // Timer: 1 s, then 2 s.
    assert_eq!(h.fire_next_timer(), Duration::from_secs(1));
    assert_eq!(h.out1().flag_str(), "S.");
    assert_eq!(h.fire_next_timer(), Duration::from_secs(2));
    assert_eq!(h.out1().flag_str(), "S.");
}

#[test]
fn syn_retries_back_off_then_time_out() {
    let mut h = client();
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.syn_retries = 3;
        config
    });
    assert_eq!(h.out1().flag_str(), "S");
    let mut gaps = Vec::new();
    for _ in 0..3 {
        gaps.push(h.fire_next_timer().as_secs());
        assert_eq!(h.out1().flag_str(), "S");
    }
    assert_eq!(gaps, vec![1, 2, 4]);
    assert_eq!(h.fire_next_timer(), Duration::from_secs(8));
    h.none();
    assert_eq!(h.events(), vec![Event::Closed(c, CloseReason::TimedOut)]);
    assert_eq!(
        h.ep.read(c, &mut [0u8; 4]),
        Err(squarepeg_tcp::Error::TimedOut)
    );
}

#[test]
fn simultaneous_open() {
    let mut h = Harness::new("192.0.2.1:5000", "198.51.100.7:6000");
    let c = h.connect(ConnectionConfig::default());
    let syn = h.out1();
    let iss = syn.seq;
    // The peer's SYN crosses ours.
    h.inject(
        &h.pkt(SYN, IRS, 0)
            .opt(Opt::Mss(1460))
            .opt(Opt::SackOk)
            .opt(Opt::Ts(10, 0))
            .opt(Opt::Nop)
            .opt(Opt::Ws(7)),
    )
    .unwrap();
    let synack = h.out1();
    assert_eq!(synack.flag_str(), "S.");
    // Same ISS as our SYN (RFC 9293 figure 8).
    assert_eq!((synack.seq, synack.ack), (iss, IRS + 1));
    assert_eq!(synack.ts().unwrap().1, 10);
    assert_eq!(h.ep.connection(c).unwrap().state(), State::SynReceived);
    // The peer's SYN-ACK (answering our SYN) completes the open.
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss + 1)
            .opt(Opt::Mss(1460))
            .opt(Opt::SackOk)
            .opt(Opt::Ts(11, synack.ts().unwrap().0))
            .opt(Opt::Nop)
            .opt(Opt::Ws(7)),
    )
    .unwrap();
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
    let ack = h.out1();
    assert_eq!(
        (ack.flag_str().as_str(), ack.seq, ack.ack),
        (".", iss + 1, IRS + 1)
    );
    assert!(h.events().contains(&Event::Connected(c)));
}

/// Establishes a connection with timestamps off for simpler scripts; returns (harness, handle,
/// iss).
pub fn established(cfg: ConnectionConfig) -> (Harness, squarepeg_tcp::ConnectionHandle, u32) {
    let mut h = client();
    let c = h.connect(cfg);
    let iss = h.out1().seq;
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss + 1)
            .win(65535)
            .opt(Opt::Mss(1000)),
    )
    .unwrap();
    h.out1();
    h.events();
    (h, c, iss)
}

#[test]
fn active_close_fin_wait_time_wait() {
    let (mut h, c, iss) = established({
        let mut config = ConnectionConfig::default();
        config.time_wait = Duration::from_secs(30);
        config
    });
    h.ep.shutdown(h.now, c).unwrap();
    let fin = h.out1();
    assert_eq!(fin.flag_str(), "F.");
    assert_eq!((fin.seq, fin.ack), (iss + 1, IRS + 1));
    assert_eq!(h.ep.connection(c).unwrap().state(), State::FinWait1);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2)).unwrap();
    assert_eq!(h.ep.connection(c).unwrap().state(), State::FinWait2);
    // Half-close: the peer can still send data to us.
    h.inject(&h.pkt(ACK | PSH, IRS + 1, iss + 2).data(b"late"))
        .unwrap();
    assert_eq!(h.read_all(c), b"late");
    h.inject(&h.pkt(FIN | ACK, IRS + 5, iss + 2)).unwrap();
    let ack = h.out1();
    assert_eq!(
        (ack.flag_str().as_str(), ack.seq, ack.ack),
        (".", iss + 2, IRS + 6)
    );
    assert_eq!(h.ep.connection(c).unwrap().state(), State::TimeWait);
    assert!(h.events().contains(&Event::Closed(c, CloseReason::Normal)));
    // A retransmitted FIN in TIME-WAIT is acknowledged again and restarts the timer.
    h.now += Duration::from_secs(20);
    h.inject(&h.pkt(FIN | ACK, IRS + 5, iss + 2)).unwrap();
    assert_eq!(h.out1().ack, IRS + 6);
    assert_eq!(h.fire_next_timer(), Duration::from_secs(30));
    assert_eq!(
        h.ep.connection(c).unwrap().state(),
        State::Closed(CloseReason::Normal)
    );
    h.ep.close(h.now, c).unwrap();
    assert_eq!(h.ep.connection_count(), 0);
}

#[test]
fn time_wait_zero_closes_at_once() {
    let (mut h, c, iss) = established({
        let mut config = ConnectionConfig::default();
        config.time_wait = Duration::ZERO;
        config
    });
    h.ep.close(h.now, c).unwrap();
    h.out1();
    h.inject(&h.pkt(FIN | ACK, IRS + 1, iss + 2)).unwrap();
    assert_eq!(h.out1().ack, IRS + 2);
    h.advance(Duration::ZERO);
    assert_eq!(h.ep.connection_count(), 0);
}

#[test]
fn passive_close_close_wait_last_ack() {
    let (mut h, c, iss) = established(ConnectionConfig::default());
    h.inject(&h.pkt(FIN | ACK, IRS + 1, iss + 1)).unwrap();
    let ack = h.out1();
    assert_eq!(ack.ack, IRS + 2);
    assert_eq!(h.ep.connection(c).unwrap().state(), State::CloseWait);
    assert_eq!(h.events(), vec![Event::PeerFin(c)]);
    assert_eq!(h.ep.read(c, &mut [0u8; 8]), Ok(0));
    // We can still send after the peer's FIN.
    h.ep.write(c, b"bye").unwrap();
    h.ep.shutdown(h.now, c).unwrap();
    let segs = h.out();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].flag_str(), "FP.");
    assert_eq!(segs[0].payload, b"bye");
    assert_eq!(h.ep.connection(c).unwrap().state(), State::LastAck);
    h.inject(&h.pkt(ACK, IRS + 2, iss + 5)).unwrap();
    assert_eq!(
        h.ep.connection(c).unwrap().state(),
        State::Closed(CloseReason::Normal)
    );
    assert_eq!(h.events(), vec![Event::Closed(c, CloseReason::Normal)]);
}

#[test]
fn simultaneous_close() {
    let (mut h, c, iss) = established(ConnectionConfig::default());
    h.ep.shutdown(h.now, c).unwrap();
    assert_eq!(h.out1().flag_str(), "F.");
    // The peer's FIN crosses ours: it does not acknowledge our FIN.
    h.inject(&h.pkt(FIN | ACK, IRS + 1, iss + 1)).unwrap();
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Closing);
    let ack = h.out1();
    assert_eq!((ack.seq, ack.ack), (iss + 2, IRS + 2));
    h.inject(&h.pkt(ACK, IRS + 2, iss + 2)).unwrap();
    assert_eq!(h.ep.connection(c).unwrap().state(), State::TimeWait);
}

#[test]
fn close_with_unread_data_sends_rst() {
    let (mut h, c, iss) = established(ConnectionConfig::default());
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1).data(b"unread"))
        .unwrap();
    h.out();
    h.ep.close(h.now, c).unwrap();
    let rst = h.out1();
    assert_eq!(rst.flag_str(), "R.");
    assert_eq!(rst.seq, iss + 1);
    assert_eq!(h.ep.connection_count(), 0);
}

#[test]
fn data_after_close_is_answered_with_rst() {
    let (mut h, c, iss) = established(ConnectionConfig::default());
    h.ep.close(h.now, c).unwrap();
    assert_eq!(h.out1().flag_str(), "F.");
    h.inject(&h.pkt(ACK, IRS + 1, iss + 2).data(b"nobody reads this"))
        .unwrap();
    assert_eq!(h.out1().flag_str(), "R.");
    assert_eq!(h.ep.connection_count(), 0);
}

#[test]
fn abort_sends_rst() {
    let (mut h, c, iss) = established(ConnectionConfig::default());
    h.ep.abort(h.now, c).unwrap();
    let rst = h.out1();
    assert_eq!(
        (rst.flag_str().as_str(), rst.seq, rst.ack),
        ("R.", iss + 1, IRS + 1)
    );
    assert_eq!(
        h.ep.read(c, &mut [0u8; 4]),
        Err(squarepeg_tcp::Error::UnknownConnection)
    );
}

#[test]
fn lost_handshake_ack_retransmitted_syn_ack_is_acknowledged_again() {
    let mut h = client();
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config
    });
    let iss = h.out1().seq;
    let synack = h.pkt(SYN | ACK, IRS, iss + 1).opt(Opt::Mss(1460));
    h.inject(&synack).unwrap();
    h.out1(); // this ACK is lost
    // The server retransmits its SYN-ACK; we are ESTABLISHED and answer with an ACK.
    let _ = h.inject(&synack);
    let ack = h.out1();
    assert_eq!(
        (ack.flag_str().as_str(), ack.seq, ack.ack),
        (".", iss + 1, IRS + 1)
    );
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
}

#[test]
fn data_completes_passive_handshake_when_ack_was_lost() {
    let mut h = server();
    let l = h.listen(8, ConnectionConfig::default());
    h.inject(&h.pkt(SYN, IRS, 0)).unwrap();
    let iss = h.out1().seq;
    // The client's pure ACK is lost; its first data segment carries the same ACK.
    h.inject(&h.pkt(ACK | PSH, IRS + 1, iss + 1).data(b"GET /"))
        .unwrap();
    let c = h.ep.accept(l).unwrap();
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
    assert_eq!(h.read_all(c), b"GET /");
    assert!(h.events().contains(&Event::Readable(c)));
}

#[test]
fn ipv6_handshake_and_mss() {
    let mut h = Harness::new("[2001:db8::1]:40000", "[2001:db8::2]:443");
    let c = h.connect(ConnectionConfig::default());
    let syn = h.out1();
    // 1500 - 40 (IPv6) - 20 (TCP).
    assert_eq!(syn.mss(), Some(1440));
    h.inject(
        &h.pkt(SYN | ACK, IRS, syn.seq + 1)
            .opt(Opt::Mss(1440))
            .opt(Opt::SackOk)
            .opt(Opt::Ts(1, syn.ts().unwrap().0))
            .opt(Opt::Nop)
            .opt(Opt::Ws(7)),
    )
    .unwrap();
    h.out1();
    h.ep.write(c, &[3u8; 5000]).unwrap();
    let segs = h.out();
    assert_eq!(segs[0].payload.len(), 1440 - 12);
    assert!(segs.iter().all(|p| p.src == h.local && p.dst == h.remote));
}

#[test]
fn millisecond_timestamps_do_not_set_the_minimum_rtt() {
    // Found by the simulator (seed 1179): on a path with a sub-millisecond RTT the timestamp
    // echo reads 0 ms; taken as a sample it put min_RTT, and RACK's reordering window
    // (min_RTT / 4), at zero, and every reordered segment was retransmitted.
    let mut h = client();
    let c = h.connect(ConnectionConfig::default());
    let syn = h.out1();
    let (tsval, _) = syn.ts().unwrap();
    h.now += Duration::from_micros(300);
    h.inject(
        &h.pkt(SYN | ACK, IRS, syn.seq + 1)
            .opt(Opt::Mss(1400))
            .opt(Opt::SackOk)
            .opt(Opt::Ts(777, tsval))
            .opt(Opt::Ws(8)),
    )
    .unwrap();
    h.out();
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.min_rtt, Some(Duration::from_micros(300)));
    assert_eq!(st.srtt, Some(Duration::from_micros(300)));
}
