//! TCP Fast Open (RFC 7413) against a scripted peer: exact bytes of the option (checked by the
//! tests' own parser), partial acknowledgment of SYN data, the experimental option form, and
//! duplicate SYNs with data at a server.

mod common;

use common::*;
use squarepeg_tcp::{
    ConnectionConfig, ConnectionHandle, EndpointConfig, Event, FastOpenCookie, FastOpenEntry, State,
};

fn tfo() -> ConnectionConfig {
    let mut c = ConnectionConfig::default();
    c.fast_open = true;
    c
}

/// The Fast Open option of a crafted/parsed packet: kind 34's raw bytes.
fn tfo_option(p: &Pkt) -> Option<Vec<u8>> {
    p.opts.iter().find_map(|o| match o {
        Opt::Raw(b) if b[0] == 34 => Some(b.clone()),
        _ => None,
    })
}

const COOKIE: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

#[test]
fn client_sends_the_cookie_and_data_and_resends_what_the_syn_ack_left_out() {
    let mut h = Harness::new("198.51.100.7:0", "192.0.2.1:80");
    h.ep.import_fast_open_cache([FastOpenEntry {
        server: h.remote.ip(),
        cookie: FastOpenCookie::new(&COOKIE).unwrap(),
        mss: Some(1000),
    }]);
    let c = h.connect(tfo());
    h.ep.write(c, b"abcdef").unwrap();
    let syn = h.out1();
    assert_eq!(syn.flag_str(), "S");
    assert_eq!(syn.payload, b"abcdef");
    assert_eq!(
        tfo_option(&syn),
        Some([[34, 10].as_slice(), &COOKIE].concat())
    );
    // The server took three of the six bytes.
    let (tsval, _) = syn.ts().unwrap();
    let synack = Pkt::new(h.remote, syn.src, SYN | ACK, 9000, syn.seq.wrapping_add(4))
        .opt(Opt::Mss(1460))
        .opt(Opt::Ts(50, tsval));
    h.inject(&synack).unwrap();
    assert!(h.events().contains(&Event::Connected(c)));
    let out = h.out();
    let data: Vec<&Pkt> = out.iter().filter(|p| !p.payload.is_empty()).collect();
    assert_eq!(data.len(), 1, "{out:#?}");
    assert_eq!(data[0].seq, syn.seq.wrapping_add(4));
    assert_eq!(data[0].payload, b"def");
    let fo = h.ep.stats().fast_open.clone();
    assert_eq!((fo.syn_data_sent, fo.syn_data_not_acked), (1, 1));
    // Cookie and option missing from a SYN-ACK that did not take all the data: forgotten.
    assert_eq!(fo.cookies_forgotten, 1);
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
}

#[test]
fn syn_data_is_bounded_by_the_remembered_mss() {
    let mut h = Harness::new("198.51.100.7:0", "192.0.2.1:80");
    h.ep.import_fast_open_cache([FastOpenEntry {
        server: h.remote.ip(),
        cookie: FastOpenCookie::new(&COOKIE).unwrap(),
        mss: Some(600),
    }]);
    let c = h.connect(tfo());
    h.ep.write(c, &[7u8; 3000]).unwrap();
    let syn = h.out1();
    // MSS 600 less the SYN's options: MSS 4 + timestamps/SACK-permitted 12 + window scale 4
    // + the cookie option (10, aligned to 12) = 32.
    assert_eq!(syn.payload.len(), 600 - 32);
}

#[test]
fn server_answers_the_experimental_cookie_request_and_takes_data_once() {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:40000");
    let l = h.listen(8, tfo());
    // Cookie request in the experimental form (kind 254, magic 0xF989).
    let req = h
        .pkt(SYN, 100, 0)
        .opt(Opt::Mss(1460))
        .opt(Opt::Raw(vec![254, 4, 0xf9, 0x89]));
    h.inject(&req).unwrap();
    let synack = h.out1();
    assert_eq!(synack.ack, 101);
    let opt = tfo_option(&synack).expect("a cookie, in kind 34");
    assert_eq!(opt.len(), 10);
    let cookie = opt[2..].to_vec();
    assert_eq!(h.ep.stats().fast_open.cookie_requests_received, 1);
    // RST the half-open connection away; then a new SYN with the cookie and data, twice.
    h.inject(&h.pkt(RST, 101, 0)).unwrap();
    h.remote = addr("198.51.100.7:40001");
    let syn = h
        .pkt(SYN, 5000, 0)
        .opt(Opt::Mss(1460))
        .opt(Opt::Raw([[34u8, 10].as_slice(), &cookie].concat()))
        .data(b"hello");
    h.inject(&syn).unwrap();
    let synack = h.out1();
    assert_eq!(synack.ack, 5006, "the SYN-ACK acknowledges the data");
    assert_eq!(tfo_option(&synack), None);
    assert!(h.events().contains(&Event::Incoming(l)));
    let c = h.ep.accept(l).expect("queued at the SYN");
    assert_eq!(h.ep.connection(c).unwrap().state(), State::SynReceived);
    assert_eq!(h.read_all(c), b"hello");
    // The same SYN again (our SYN-ACK lost): the SYN-ACK again, the data not again.
    h.inject(&syn).unwrap();
    assert_eq!(h.out1().ack, 5006);
    assert!(h.read_all(c).is_empty());
    // The handshake completes.
    h.inject(&h.pkt(ACK, 5006, synack.seq.wrapping_add(1)))
        .unwrap();
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
    let fo = h.ep.stats().fast_open.clone();
    // The duplicate went to the connection, never to the listener.
    assert_eq!((fo.cookies_accepted, fo.syn_data_accepted), (1, 1));
    h.ep.check_invariants();
    // A SYN with a cookie of another client's address: refused, data dropped, new cookie.
    let mut other = h.pkt(SYN, 7000, 0).data(b"stolen");
    other.src = addr("198.51.100.8:40002");
    other = other.opt(Opt::Raw([[34u8, 10].as_slice(), &cookie].concat()));
    h.inject(&other).unwrap();
    let synack = h.out1();
    assert_eq!(synack.ack, 7001);
    assert!(tfo_option(&synack).is_some_and(|o| o[2..] != cookie[..]));
    assert_eq!(h.ep.stats().fast_open.cookies_refused, 1);
}

#[test]
fn fast_open_connection_reset_in_the_handshake_is_reported_to_the_application() {
    let mut h = Harness::with_config(
        "192.0.2.1:80",
        "198.51.100.7:40000",
        EndpointConfig::default(),
    );
    let l = h.listen(8, tfo());
    h.inject(&h.pkt(SYN, 100, 0).opt(Opt::Raw(vec![34, 2])))
        .unwrap();
    let cookie = tfo_option(&h.out1()).unwrap()[2..].to_vec();
    h.inject(&h.pkt(RST, 101, 0)).unwrap();
    h.remote = addr("198.51.100.7:40001");
    let syn = h
        .pkt(SYN, 300, 0)
        .opt(Opt::Raw([[34u8, 10].as_slice(), &cookie].concat()))
        .data(b"x");
    h.inject(&syn).unwrap();
    h.out1();
    let c = h.ep.accept(l).unwrap();
    h.inject(&h.pkt(RST, 302, 0)).unwrap();
    let events = h.events();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Closed(h2, _) if *h2 == c)),
        "{events:?}"
    );
    h.ep.check_invariants();
}

/// A Fast Open server's connection opened by a SYN with a valid cookie and `request` (from a
/// cookie learned first over another port): the SYN-ACK, the accepted handle and the
/// client's ISN. No timestamps, so the payload per segment is the whole MSS (1460).
fn fast_open_syn_received(h: &mut Harness, request: &[u8]) -> (Pkt, ConnectionHandle, u32) {
    let l = h.listen(8, tfo());
    h.inject(&h.pkt(SYN, 100, 0).opt(Opt::Raw(vec![34, 2])))
        .unwrap();
    let cookie = tfo_option(&h.out1()).unwrap()[2..].to_vec();
    h.inject(&h.pkt(RST, 101, 0)).unwrap();
    h.remote = addr("198.51.100.7:40001");
    let isn = 5000u32;
    let syn = h
        .pkt(SYN, isn, 0)
        .opt(Opt::Mss(1460))
        .opt(Opt::Raw([[34u8, 10].as_slice(), &cookie].concat()))
        .data(request);
    h.inject(&syn).unwrap();
    let synack = h.out1();
    assert_eq!(synack.flag_str(), "S.");
    assert!(synack.payload.is_empty());
    let c = h.ep.accept(l).expect("queued at the SYN");
    assert_eq!(h.read_all(c), request);
    (synack, c, isn)
}

#[test]
fn fast_open_server_answers_in_syn_received_up_to_the_initial_window() {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:40000");
    let (synack, c, isn) = fast_open_syn_received(&mut h, b"req");
    let rcv = isn.wrapping_add(4);
    let answer: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    assert_eq!(h.ep.write(c, &answer).unwrap(), answer.len());
    let out = h.out();
    // IW10 counting the SYN-ACK (RFC 7413 §4.2.2): nine full segments, from ISS + 1.
    assert_eq!(out.len(), 9, "{out:#?}");
    let mut seq = synack.seq.wrapping_add(1);
    for p in &out {
        assert_eq!(p.flag_str(), ".", "{p:?}");
        assert_eq!((p.seq, p.ack), (seq, rcv));
        assert_eq!(p.payload.len(), 1460);
        assert_eq!(
            p.payload[..],
            answer[(seq.wrapping_sub(synack.seq) - 1) as usize..][..1460]
        );
        seq = seq.wrapping_add(1460);
    }
    assert_eq!(h.ep.connection(c).unwrap().state(), State::SynReceived);
    // The client's ACK of the SYN-ACK acknowledges three segments too.
    h.inject(&h.pkt(ACK, rcv, synack.seq.wrapping_add(1 + 3 * 1460)))
        .unwrap();
    let conn = h.ep.connection(c).unwrap();
    assert_eq!(conn.state(), State::Established);
    assert_eq!(conn.acked_offset(), 3 * 1460);
    assert!(
        conn.srtt().is_some(),
        "the SYN-ACK was sent once: a clean sample"
    );
    // The window opened by the ACK lets more of the answer go.
    let more = h.out();
    assert!(!more.is_empty());
    assert_eq!(more[0].seq, seq);
    assert_eq!(h.ep.stats_of(c).unwrap().packets_retransmitted, 0);
    h.ep.check_invariants();
}

#[test]
fn fast_open_syn_ack_timeout_resends_it_alone_and_the_answer_after_the_handshake() {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:40000");
    let (synack, c, isn) = fast_open_syn_received(&mut h, b"req");
    let rcv = isn.wrapping_add(4);
    h.ep.write(c, &[9u8; 3000]).unwrap();
    let early = h.out();
    assert_eq!(
        early.iter().map(|p| p.payload.len()).collect::<Vec<_>>(),
        vec![1460, 1460, 80]
    );
    // Nothing comes back: the SYN-ACK goes again, without data.
    h.fire_next_timer();
    let again = h.out1();
    assert_eq!(again.flag_str(), "S.");
    assert_eq!((again.seq, again.ack), (synack.seq, rcv));
    assert!(again.payload.is_empty());
    // A later write does not go before the handshake either.
    h.ep.write(c, b"tail").unwrap();
    h.none();
    // The handshake completes (the client got only the SYN-ACK): the answer goes again from
    // ISS + 1, and no RTT sample is taken from the retransmitted SYN-ACK (Karn).
    h.inject(&h.pkt(ACK, rcv, synack.seq.wrapping_add(1)))
        .unwrap();
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
    assert!(h.ep.connection(c).unwrap().srtt().is_none());
    let out = h.out();
    assert!(!out.is_empty());
    assert_eq!(out[0].seq, synack.seq.wrapping_add(1));
    assert_eq!(out[0].payload.len(), 1460);
    // The answer acknowledged (the timeout left the window at one segment, RFC 5681 §3.1):
    // then the later write goes, and once it is acknowledged nothing is left.
    h.inject(&h.pkt(ACK, rcv, synack.seq.wrapping_add(1 + 3000)))
        .unwrap();
    assert_eq!(h.ep.connection(c).unwrap().acked_offset(), 3000);
    let tail = h.out();
    assert_eq!(tail.last().unwrap().payload, b"tail", "{tail:#?}");
    h.inject(&h.pkt(ACK, rcv, synack.seq.wrapping_add(1 + 3004)))
        .unwrap();
    assert_eq!(h.ep.connection(c).unwrap().acked_offset(), 3004);
    h.none();
    h.ep.check_invariants();
}

#[test]
fn fast_open_handshake_ack_covering_early_data_after_a_syn_ack_retransmission_takes_no_sample() {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:40000");
    let (synack, c, isn) = fast_open_syn_received(&mut h, b"req");
    let rcv = isn.wrapping_add(4);
    h.ep.write(c, b"answer").unwrap();
    assert_eq!(h.out1().payload, b"answer");
    h.fire_next_timer();
    assert!(h.out1().payload.is_empty());
    // The first SYN-ACK and the answer were only late: the ACK covers both.
    h.inject(&h.pkt(ACK, rcv, synack.seq.wrapping_add(7)))
        .unwrap();
    let conn = h.ep.connection(c).unwrap();
    assert_eq!(conn.state(), State::Established);
    assert_eq!(conn.acked_offset(), 6);
    assert!(conn.srtt().is_none(), "ambiguous: no RTT sample (Karn)");
    h.none();
    h.ep.check_invariants();
}

#[test]
fn fast_open_rst_in_syn_received_drops_the_early_answer() {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:40000");
    let (_, c, isn) = fast_open_syn_received(&mut h, b"req");
    h.ep.write(c, &[1u8; 5000]).unwrap();
    assert_eq!(h.out().len(), 4);
    h.events();
    h.inject(&h.pkt(RST, isn.wrapping_add(4), 0)).unwrap();
    assert!(
        h.events()
            .iter()
            .any(|e| matches!(e, Event::Closed(x, _) if *x == c))
    );
    h.none();
    assert!(h.ep.poll_timeout().is_none_or(|t| t > h.now));
    h.advance(std::time::Duration::from_secs(120));
    h.none();
    assert!(h.ep.write(c, b"more").is_err());
    h.ep.check_invariants();
}

#[test]
fn fast_open_duplicate_syn_makes_the_early_answer_wait_for_the_handshake() {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:40000");
    let (synack, c, isn) = fast_open_syn_received(&mut h, b"req");
    let rcv = isn.wrapping_add(4);
    h.ep.write(c, b"answer").unwrap();
    assert_eq!(h.out1().payload, b"answer");
    // The client's SYN again, without data (RFC 7413 §4.1.3): it did not get our SYN-ACK,
    // so it dropped the answer too.
    h.inject(&h.pkt(SYN, isn, 0).opt(Opt::Mss(1460))).unwrap();
    let again = h.out1();
    assert_eq!((again.flag_str().as_str(), again.ack), ("S.", rcv));
    h.inject(&h.pkt(ACK, rcv, synack.seq.wrapping_add(1)))
        .unwrap();
    // The answer goes again at once after the handshake, not after a timeout.
    let out = h.out1();
    assert_eq!(
        (out.seq, out.payload.as_slice()),
        (synack.seq.wrapping_add(1), &b"answer"[..])
    );
    h.ep.check_invariants();
}

#[test]
fn fast_open_handshake_ack_is_not_a_duplicate_ack_for_the_early_answer() {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:40000");
    // No SACK offered: the NewReno rule (three duplicate ACKs).
    let (synack, c, isn) = fast_open_syn_received(&mut h, b"req");
    let rcv = isn.wrapping_add(4);
    h.ep.write(c, &[3u8; 5 * 1460]).unwrap();
    assert_eq!(h.out().len(), 5);
    let una = synack.seq.wrapping_add(1);
    // The ACK of the SYN-ACK (none of the answer yet), then two duplicates: no retransmission.
    for _ in 0..3 {
        h.inject(&h.pkt(ACK, rcv, una)).unwrap();
        h.none();
    }
    assert_eq!(h.ep.connection(c).unwrap().state(), State::Established);
    // The third duplicate: fast retransmit of the first segment.
    h.inject(&h.pkt(ACK, rcv, una)).unwrap();
    let out = h.out();
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!((out[0].seq, out[0].payload.len()), (una, 1460));
    assert_eq!(h.ep.stats_of(c).unwrap().fast_retransmits, 1);
    h.ep.check_invariants();
}
