//! RST generation and processing (RFC 9293 §3.10.7, RFC 5961), PAWS (RFC 7323 §5).

mod common;

use std::time::Duration;

use common::*;
use squarepeg_tcp::{CloseReason, ConnectionConfig, DropReason, Error, Event, State};

const IRS: u32 = 0xffff_fff0; // close to wrap-around on purpose

fn server() -> Harness {
    Harness::new("192.0.2.1:80", "198.51.100.7:50000")
}

/// Client connection with timestamps (our TS clock is the handshake's TSval echo).
fn established_ts() -> (Harness, squarepeg_tcp::ConnectionHandle, u32, u32) {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect(ConnectionConfig::default());
    let syn = h.out1();
    let iss = syn.seq;
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss.wrapping_add(1))
            .opt(Opt::Mss(1460))
            .opt(Opt::SackOk)
            .opt(Opt::Ts(1000, syn.ts().unwrap().0))
            .opt(Opt::Nop)
            .opt(Opt::Ws(0)),
    )
    .unwrap();
    h.out1();
    h.events();
    (h, c, iss, syn.ts().unwrap().0)
}

fn established() -> (Harness, squarepeg_tcp::ConnectionHandle, u32) {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config
    });
    let iss = h.out1().seq;
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss.wrapping_add(1))
            .opt(Opt::Mss(1460)),
    )
    .unwrap();
    h.out1();
    h.events();
    (h, c, iss)
}

#[test]
fn closed_port_syn_gets_rst_ack() {
    let mut h = server();
    assert_eq!(
        h.inject(&h.pkt(SYN, 5000, 0).data(b"xy")),
        Err(DropReason::NoConnection)
    );
    let rst = h.out1();
    // <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>: SYN counts one, data two.
    assert_eq!((rst.flag_str().as_str(), rst.seq, rst.ack), ("R.", 0, 5003));
    assert_eq!(h.ep.stats().dropped(DropReason::NoConnection), 1);
}

#[test]
fn closed_port_ack_gets_rst_with_seq_of_ack() {
    let mut h = server();
    let _ = h.inject(&h.pkt(ACK, 5000, 777));
    let rst = h.out1();
    assert_eq!((rst.flag_str().as_str(), rst.seq), ("R", 777));
}

#[test]
fn rst_is_never_answered() {
    let mut h = server();
    assert_eq!(
        h.inject(&h.pkt(RST | ACK, 5000, 777)),
        Err(DropReason::NoConnection)
    );
    h.none();
}

#[test]
fn non_unicast_is_never_answered() {
    let mut h = Harness::new("192.0.2.1:80", "224.0.0.1:5000");
    assert_eq!(h.inject(&h.pkt(SYN, 1, 0)), Err(DropReason::BadAddress));
    h.none();
    let mut h = Harness::new("255.255.255.255:80", "192.0.2.9:5000");
    assert_eq!(h.inject(&h.pkt(SYN, 1, 0)), Err(DropReason::BadAddress));
    h.none();
}

#[test]
fn listener_ignores_rst_and_resets_stray_ack() {
    let mut h = server();
    h.listen(4, ConnectionConfig::default());
    assert_eq!(
        h.inject(&h.pkt(RST, 1, 0)),
        Err(DropReason::ListenerRejected)
    );
    h.none();
    // An ACK that is not a valid cookie: <SEQ=SEG.ACK><CTL=RST>.
    assert!(h.inject(&h.pkt(ACK, 1, 4242)).is_err());
    let rst = h.out1();
    assert_eq!((rst.flag_str().as_str(), rst.seq), ("R", 4242));
    // Neither SYN, ACK nor RST: dropped.
    assert_eq!(
        h.inject(&h.pkt(PSH, 1, 0).data(b"x")),
        Err(DropReason::ListenerRejected)
    );
    h.none();
}

#[test]
fn syn_sent_unacceptable_ack_gets_rst() {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect(ConnectionConfig::default());
    let iss = h.out1().seq;
    assert_eq!(
        h.inject(&h.pkt(SYN | ACK, IRS, iss.wrapping_add(5))),
        Err(DropReason::BadAck)
    );
    let rst = h.out1();
    assert_eq!(
        (rst.flag_str().as_str(), rst.seq),
        ("R", iss.wrapping_add(5))
    );
    assert_eq!(h.ep.connection(c).unwrap().state(), State::SynSent);
    // The same with RST set: silently dropped.
    assert!(
        h.inject(&h.pkt(RST | ACK, IRS, iss.wrapping_add(5)))
            .is_err()
    );
    h.none();
    // RST without ACK: ignored.
    assert_eq!(h.inject(&h.pkt(RST, IRS, 0)), Err(DropReason::RstIgnored));
    assert_eq!(h.ep.connection(c).unwrap().state(), State::SynSent);
    // RST with an acceptable ACK: connection refused.
    h.inject(&h.pkt(RST | ACK, 0, iss.wrapping_add(1))).unwrap();
    assert_eq!(h.events(), vec![Event::Closed(c, CloseReason::Refused)]);
    assert_eq!(h.ep.read(c, &mut [0; 4]), Err(Error::ConnectionRefused));
    h.none();
}

#[test]
fn syn_received_unacceptable_ack_gets_rst_and_rst_returns_to_listen() {
    let mut h = server();
    let l = h.listen(4, ConnectionConfig::default());
    h.inject(&h.pkt(SYN, IRS, 0)).unwrap();
    let iss = h.out1().seq;
    assert_eq!(
        h.inject(&h.pkt(ACK, IRS.wrapping_add(1), iss.wrapping_add(9))),
        Err(DropReason::BadAck)
    );
    let rst = h.out1();
    assert_eq!(
        (rst.flag_str().as_str(), rst.seq),
        ("R", iss.wrapping_add(9))
    );
    assert_eq!(h.ep.connection_count(), 1);
    // An acceptable RST removes the half-open connection silently (back to LISTEN).
    h.inject(&h.pkt(RST, IRS.wrapping_add(1), 0)).unwrap();
    assert_eq!(h.ep.connection_count(), 0);
    assert!(h.events().is_empty());
    assert!(h.ep.accept(l).is_none());
    h.none();
}

#[test]
fn exact_rst_resets_established_connection() {
    let (mut h, c, _iss) = established();
    h.inject(&h.pkt(RST, IRS.wrapping_add(1), 0)).unwrap();
    assert_eq!(h.events(), vec![Event::Closed(c, CloseReason::Reset)]);
    assert_eq!(h.ep.read(c, &mut [0; 4]), Err(Error::ConnectionReset));
    assert_eq!(h.ep.write(c, b"x"), Err(Error::ConnectionReset));
    h.none();
    h.ep.close(h.now, c).unwrap();
    assert_eq!(h.ep.connection_count(), 0);
}

#[test]
fn in_window_rst_gets_challenge_ack() {
    let (mut h, c, iss) = established();
    assert_eq!(
        h.inject(&h.pkt(RST, IRS.wrapping_add(100), 0)),
        Err(DropReason::RstChallenged)
    );
    let ack = h.out1();
    assert_eq!(
        (ack.flag_str().as_str(), ack.seq, ack.ack),
        (".", iss.wrapping_add(1), IRS.wrapping_add(1))
    );
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
    assert_eq!(h.ep.stats_of(c).unwrap().challenge_acks, 1);
    // Out of window: silently dropped.
    assert_eq!(
        h.inject(&h.pkt(RST, IRS.wrapping_sub(100), 0)),
        Err(DropReason::RstIgnored)
    );
    h.none();
}

#[test]
fn syn_in_established_gets_challenge_ack() {
    let (mut h, c, iss) = established();
    // Any sequence number, even the exact one (RFC 5961 §4.2).
    for seq in [IRS.wrapping_add(1), IRS.wrapping_add(1000), 12345] {
        assert_eq!(
            h.inject(&h.pkt(SYN, seq, 0)),
            Err(DropReason::SynChallenged)
        );
        let ack = h.out1();
        assert_eq!(ack.ack, IRS.wrapping_add(1));
    }
    let acks = h.out();
    assert!(acks.is_empty());
    assert!(
        acks.iter()
            .all(|a| a.flag_str() == "." && a.seq == iss.wrapping_add(1))
    );
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
}

#[test]
fn challenge_acks_are_rate_limited() {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config.challenge_ack_limit = 2;
        config
    });
    let iss = h.out1().seq;
    h.inject(&h.pkt(SYN | ACK, IRS, iss.wrapping_add(1)))
        .unwrap();
    h.out1();
    let mut sent = 0;
    for i in 0..5 {
        let _ = h.inject(&h.pkt(RST, IRS.wrapping_add(10 + i), 0));
        sent += h.out().len();
    }
    assert_eq!(sent, 2);
    h.now += Duration::from_secs(1);
    let _ = h.inject(&h.pkt(RST, IRS.wrapping_add(10), 0));
    assert_eq!(h.out().len(), 1);
    assert_eq!(h.ep.stats_of(c).unwrap().challenge_acks, 3);
}

#[test]
fn ack_of_unsent_data_is_answered_and_dropped() {
    let (mut h, c, iss) = established();
    assert_eq!(
        h.inject(
            &h.pkt(ACK, IRS.wrapping_add(1), iss.wrapping_add(1000))
                .data(b"abc")
        ),
        Err(DropReason::BadAck)
    );
    let ack = h.out1();
    assert_eq!(ack.ack, IRS.wrapping_add(1));
    // The data was not accepted.
    assert_eq!(h.ep.read(c, &mut [0; 8]), Err(Error::WouldBlock));
}

#[test]
fn blind_data_injection_with_old_ack_is_challenged() {
    // RFC 5961 §5.2: SEG.ACK below SND.UNA - MAX.SND.WND.
    let (mut h, c, iss) = established();
    assert_eq!(
        h.inject(
            &h.pkt(ACK, IRS.wrapping_add(1), iss.wrapping_sub(200_000))
                .data(b"evil")
        ),
        Err(DropReason::BadAck)
    );
    assert_eq!(h.out1().flag_str(), ".");
    assert_eq!(h.ep.read(c, &mut [0; 8]), Err(Error::WouldBlock));
}

#[test]
fn out_of_window_data_gets_duplicate_ack() {
    let (mut h, _c, iss) = established();
    assert_eq!(
        h.inject(
            &h.pkt(ACK, IRS.wrapping_sub(5000), iss.wrapping_add(1))
                .data(b"old")
        ),
        Err(DropReason::OutOfWindow)
    );
    let ack = h.out1();
    assert_eq!(
        (ack.seq, ack.ack),
        (iss.wrapping_add(1), IRS.wrapping_add(1))
    );
    // Data segments are always answered (they cannot form an ACK loop)...
    let _ = h.inject(
        &h.pkt(ACK, IRS.wrapping_sub(5000), iss.wrapping_add(1))
            .data(b"old"),
    );
    h.out1();
    // ...out-of-window pure ACKs are rate-limited: one answer per 500 ms (as Linux does).
    let beyond = IRS.wrapping_add(10_000_000);
    let _ = h.inject(&h.pkt(ACK, beyond, iss.wrapping_add(1)));
    h.out1();
    let _ = h.inject(&h.pkt(ACK, beyond, iss.wrapping_add(1)));
    h.none();
    h.now += Duration::from_millis(500);
    let _ = h.inject(&h.pkt(ACK, beyond, iss.wrapping_add(1)));
    h.out1();
}

#[test]
fn paws_rejects_old_timestamps() {
    let (mut h, c, iss, _) = established_ts();
    let ack = iss.wrapping_add(1);
    h.inject(
        &h.pkt(ACK, IRS.wrapping_add(1), ack)
            .opt(Opt::Ts(2000, 0))
            .data(b"new"),
    )
    .unwrap();
    h.advance(Duration::from_millis(100));
    h.out();
    // TS.Recent is 2000 now; a TSval older by more than one tick is rejected even with a
    // good sequence number.
    assert_eq!(
        h.inject(
            &h.pkt(ACK, IRS.wrapping_add(4), ack)
                .opt(Opt::Ts(1998, 0))
                .data(b"old")
        ),
        Err(DropReason::Paws)
    );
    let dup = h.out1();
    assert_eq!(dup.ack, IRS.wrapping_add(4));
    assert_eq!(dup.ts().unwrap().1, 2000);
    assert_eq!(h.read_all(c), b"new");
    assert_eq!(h.ep.stats_of(c).unwrap().paws_rejected, 1);
    // One tick older is reordering within the clock's granularity (Linux TCP_PAWS_WINDOW):
    // accepted.
    h.inject(
        &h.pkt(ACK, IRS.wrapping_add(4), ack)
            .opt(Opt::Ts(1999, 0))
            .data(b"late"),
    )
    .unwrap();
    h.out();
    assert_eq!(h.read_all(c), b"late");
    assert_eq!(h.ep.stats_of(c).unwrap().paws_rejected, 1);
    // RST is exempt from PAWS (RFC 7323 §5.3): an exact RST with an old TS resets.
    h.inject(&h.pkt(RST, IRS.wrapping_add(8), 0).opt(Opt::Ts(5, 0)))
        .unwrap();
    assert_eq!(
        h.ep.connection(c).unwrap().state(),
        State::Closed(CloseReason::Reset)
    );
}

#[test]
fn missing_timestamp_is_dropped_when_negotiated() {
    let (mut h, c, iss, _) = established_ts();
    assert_eq!(
        h.inject(
            &h.pkt(ACK, IRS.wrapping_add(1), iss.wrapping_add(1))
                .data(b"x")
        ),
        Err(DropReason::MissingTimestamp)
    );
    assert_eq!(h.ep.read(c, &mut [0; 8]), Err(Error::WouldBlock));
}

#[test]
fn time_wait_syn_with_newer_timestamp_reopens() {
    let mut h = server();
    let l = h.listen(4, {
        let mut config = ConnectionConfig::default();
        config.time_wait = Duration::from_secs(60);
        config
    });
    h.inject(&h.pkt(SYN, IRS, 0).opt(Opt::Ts(100, 0))).unwrap();
    let synack = h.out1();
    let iss = synack.seq;
    let ts = synack.ts().unwrap().0;
    h.inject(
        &h.pkt(ACK, IRS.wrapping_add(1), iss.wrapping_add(1))
            .opt(Opt::Ts(101, ts)),
    )
    .unwrap();
    let c = h.ep.accept(l).unwrap();
    // We close first: FIN-WAIT-1 -> (peer FIN+ACK) -> TIME-WAIT.
    h.ep.close(h.now, c).unwrap();
    h.out1();
    h.inject(
        &h.pkt(FIN | ACK, IRS.wrapping_add(1), iss.wrapping_add(2))
            .opt(Opt::Ts(102, ts)),
    )
    .unwrap();
    h.out1();
    assert_eq!(h.ep.connection_count(), 1);
    // A SYN with an older timestamp is not a new incarnation: challenge ACK from TIME-WAIT.
    let _ = h.inject(&h.pkt(SYN, IRS.wrapping_add(50_000), 0).opt(Opt::Ts(50, 0)));
    let reply = h.out1();
    assert_eq!(reply.flag_str(), ".");
    // A newer timestamp reopens the 4-tuple (RFC 6191).
    h.inject(&h.pkt(SYN, IRS.wrapping_add(50_000), 0).opt(Opt::Ts(500, 0)))
        .unwrap();
    let synack2 = h.out1();
    assert_eq!(synack2.flag_str(), "S.");
    assert_eq!(synack2.ack, IRS.wrapping_add(50_001));
}

#[test]
fn packets_for_other_addresses_are_dropped_silently() {
    let mut h = Harness::with_config("192.0.2.99:80", "198.51.100.7:50000", {
        let mut config = squarepeg_tcp::EndpointConfig::default();
        config.local_addresses = vec!["192.0.2.1".parse().unwrap()];
        config
    });
    assert_eq!(h.inject(&h.pkt(SYN, 1, 0)), Err(DropReason::NotLocal));
    h.none();
    assert_eq!(h.ep.stats().dropped(DropReason::NotLocal), 1);
}

#[test]
fn new_syn_in_passive_syn_received_returns_to_listen() {
    let mut h = server();
    let l = h.listen(4, ConnectionConfig::default());
    h.inject(&h.pkt(SYN, IRS, 0)).unwrap();
    h.out1();
    assert_eq!(h.ep.connection_count(), 1);
    // The client restarted with a new ISN: the half-open connection is dropped silently.
    assert!(
        h.inject(&h.pkt(SYN, IRS.wrapping_add(1_000_000), 0))
            .is_err()
    );
    assert_eq!(h.ep.connection_count(), 0);
    h.none();
    // Its next SYN is served afresh.
    h.inject(&h.pkt(SYN, IRS.wrapping_add(1_000_000), 0))
        .unwrap();
    assert_eq!(h.out1().ack, IRS.wrapping_add(1_000_001));
    let _ = l;
}

#[test]
fn paws_lets_a_reordered_duplicate_ack_through() {
    // Found by the simulator (seed 27749): with jitter, PAWS dropped duplicate ACKs that an
    // ACK sent a few milliseconds later had overtaken; a pure duplicate ACK stamped within an
    // RTO of TS.Recent is not an old duplicate of data (Linux tcp_disordered_ack).
    let (mut h, c, iss, _) = established_ts();
    let una = iss.wrapping_add(1);
    h.ep.write(c, &[5u8; 3000]).unwrap();
    h.out();
    h.inject(&h.pkt(ACK, IRS.wrapping_add(1), una).opt(Opt::Ts(2000, 0)))
        .unwrap();
    // Ten ticks older, same ACK, no window change: a disordered duplicate ACK.
    h.inject(&h.pkt(ACK, IRS.wrapping_add(1), una).opt(Opt::Ts(1990, 0)))
        .unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!((st.paws_rejected, st.dup_acks_received), (0, 2));
    // Data with that stamp is still rejected.
    assert_eq!(
        h.inject(
            &h.pkt(ACK, IRS.wrapping_add(1), una)
                .opt(Opt::Ts(1990, 0))
                .data(b"old")
        ),
        Err(DropReason::Paws)
    );
}
