//! SYN cookies (RFC 4987 §3.6) when the SYN backlog is full, and connection limits.

mod common;

use common::*;
use squarepeg_tcp::{
    ConnectionConfig, DropReason, EndpointConfig, Error, Event, State, SynCookies,
};

fn server(cfg: EndpointConfig) -> Harness {
    Harness::with_config("192.0.2.1:80", "198.51.100.7:50000", cfg)
}

#[test]
fn cookies_when_backlog_full_carry_mss_wscale_and_sack() {
    let mut h = server(EndpointConfig::default());
    let l = h.listen(1, ConnectionConfig::default());
    // First SYN takes the only backlog slot.
    h.inject(&h.pkt(SYN, 100, 0)).unwrap();
    assert_eq!(h.out1().flag_str(), "S.");
    assert_eq!(h.ep.connection_count(), 1);
    // Second SYN, from another port: answered with a cookie, no state kept.
    let other = addr("198.51.100.7:50001");
    let syn = Pkt::new(other, h.local, SYN, 5000, 0)
        .opt(Opt::Mss(1400))
        .opt(Opt::SackOk)
        .opt(Opt::Ts(777, 0))
        .opt(Opt::Nop)
        .opt(Opt::Ws(6));
    h.inject(&syn).unwrap();
    let synack = h.out1();
    assert_eq!(synack.flag_str(), "S.");
    assert_eq!(synack.ack, 5001);
    // MSS table entry not above the peer's 1400 (ours is 1460 on the wire).
    assert_eq!(synack.mss(), Some(1460));
    assert!(synack.sack_ok());
    assert_eq!(synack.ws(), Some(7));
    let (tsval, tsecr) = synack.ts().unwrap();
    assert_eq!(tsecr, 777);
    // The peer's window scale (6) and SACK bit are in the low bits of our TSval.
    assert_eq!(tsval & 0x1f, 0x10 | 6);
    assert_eq!(h.ep.connection_count(), 1);
    assert_eq!(h.ep.stats().syn_cookies_sent, 1);
    // A forged ACK (wrong cookie) is reset.
    let forged =
        Pkt::new(other, h.local, ACK, 5001, synack.seq.wrapping_add(2)).opt(Opt::Ts(778, tsval));
    assert_eq!(h.inject(&forged), Err(DropReason::BadSynCookie));
    assert_eq!(h.out1().flag_str(), "R");
    // The genuine ACK, with data, completes the handshake from the cookie alone.
    let ack = Pkt::new(other, h.local, ACK | PSH, 5001, synack.seq.wrapping_add(1))
        .win(500)
        .opt(Opt::Nop)
        .opt(Opt::Nop)
        .opt(Opt::Ts(778, tsval))
        .data(b"hello");
    h.inject(&ack).unwrap();
    assert_eq!(h.ep.stats().syn_cookies_accepted, 1);
    assert!(h.events().contains(&Event::Incoming(l)));
    let c = h.ep.accept(l).unwrap();
    let conn = h.ep.connection(c).unwrap();
    assert_eq!(conn.state(), State::Established);
    assert_eq!(conn.remote_addr(), other);
    let n = conn.negotiated();
    assert_eq!(n.send_mss, 1400 - 12);
    assert_eq!(n.send_window_scale, Some(6));
    assert!(n.sack && n.timestamps);
    assert_eq!(conn.stats().send_window, 500 << 6);
    assert_eq!(h.read_all(c), b"hello");
}

#[test]
fn cookie_without_timestamps_loses_wscale_and_sack() {
    let mut h = server({
        let mut config = EndpointConfig::default();
        config.syn_cookies = SynCookies::Always;
        config
    });
    let l = h.listen(16, ConnectionConfig::default());
    h.inject(
        &h.pkt(SYN, 100, 0)
            .opt(Opt::Mss(536))
            .opt(Opt::SackOk)
            .opt(Opt::Ws(2)),
    )
    .unwrap();
    let synack = h.out1();
    assert_eq!(synack.opts, vec![Opt::Mss(1460)]);
    assert_eq!(h.ep.connection_count(), 0);
    h.inject(&h.pkt(ACK, 101, synack.seq.wrapping_add(1)).win(1000))
        .unwrap();
    let c = h.ep.accept(l).unwrap();
    let n = h.ep.connection(c).unwrap().negotiated();
    assert_eq!(n.send_mss, 536);
    assert_eq!(n.send_window_scale, None);
    assert!(!n.sack && !n.timestamps);
}

#[test]
fn backlog_full_without_cookies_drops_syns() {
    let mut h = server({
        let mut config = EndpointConfig::default();
        config.syn_cookies = SynCookies::Never;
        config
    });
    h.listen(1, ConnectionConfig::default());
    h.inject(&h.pkt(SYN, 100, 0)).unwrap();
    h.out1();
    let other = addr("198.51.100.7:50001");
    assert_eq!(
        h.inject(&Pkt::new(other, h.local, SYN, 5000, 0)),
        Err(DropReason::BacklogFull)
    );
    h.none();
    assert_eq!(h.ep.stats().dropped(DropReason::BacklogFull), 1);
}

#[test]
fn connection_limit_is_enforced() {
    let mut h = server({
        let mut config = EndpointConfig::default();
        config.max_connections = 1;
        config.syn_cookies = SynCookies::Never;
        config
    });
    h.listen(8, ConnectionConfig::default());
    h.inject(&h.pkt(SYN, 100, 0)).unwrap();
    h.out1();
    let other = addr("198.51.100.7:50001");
    assert_eq!(
        h.inject(&Pkt::new(other, h.local, SYN, 5000, 0)),
        Err(DropReason::TooManyConnections)
    );
    assert_eq!(
        h.ep.connect(
            h.now,
            addr("192.0.2.1:0"),
            addr("203.0.113.1:80"),
            ConnectionConfig::default()
        ),
        Err(Error::TooManyConnections)
    );
}

#[test]
fn ephemeral_ports_and_address_validation() {
    let mut h = server(EndpointConfig::default());
    let a =
        h.ep.connect(
            h.now,
            addr("192.0.2.1:0"),
            addr("203.0.113.1:80"),
            ConnectionConfig::default(),
        )
        .unwrap();
    let b =
        h.ep.connect(
            h.now,
            addr("192.0.2.1:0"),
            addr("203.0.113.1:80"),
            ConnectionConfig::default(),
        )
        .unwrap();
    let pa = h.ep.connection(a).unwrap().local_addr().port();
    let pb = h.ep.connection(b).unwrap().local_addr().port();
    assert_ne!(pa, pb);
    assert!((32768..=60999).contains(&pa));
    assert_eq!(
        h.ep.connect(
            h.now,
            addr("192.0.2.1:1"),
            addr("[fd00::1]:80"),
            ConnectionConfig::default()
        ),
        Err(Error::InvalidAddress("address families differ"))
    );
    let la = h.ep.connection(a).unwrap().local_addr();
    assert_eq!(
        h.ep.connect(
            h.now,
            la,
            addr("203.0.113.1:80"),
            ConnectionConfig::default()
        ),
        Err(Error::AddressInUse)
    );
}
