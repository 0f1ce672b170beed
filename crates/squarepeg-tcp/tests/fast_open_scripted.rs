//! TCP Fast Open (RFC 7413) against a scripted peer: exact bytes of the option (checked by the
//! tests' own parser), partial acknowledgment of SYN data, the experimental option form, and
//! duplicate SYNs with data at a server.

mod common;

use common::*;
use squarepeg_tcp::{
    ConnectionConfig, EndpointConfig, Event, FastOpenCookie, FastOpenEntry, State,
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
