//! TLS 1.3 early data (0-RTT) and 0.5-RTT data: a returning client's request rides with its
//! ClientHello, the server answers in its first flight, a replayed flight is not delivered
//! twice, and rejected early data is reported so that it can be sent again.

mod common;

use common::*;
use squarepeg_tls::config::{self};
use squarepeg_tls::rustls::HandshakeKind;
use squarepeg_tls::{EarlyData, Tls};

const MAX_EARLY: u32 = 16 * 1024;

/// A setup whose server accepts early data and whose client offers it, with one finished
/// connection behind it, so that the client holds tickets.
fn returning_setup() -> Setup {
    let mut s = default_setup();
    s.server = config::server_accepting_early_data(&s.server, MAX_EARLY).unwrap();
    s.client = config::client_offering_early_data(&s.client);
    let (mut client, mut server) = connected(&s);
    // The tickets travel with the server's first records after the handshake.
    let wire = sealed(&mut server, b"hello");
    assert_eq!(feed(&mut client, &wire, usize::MAX).unwrap(), b"hello");
    assert_eq!(client.early_data(), EarlyData::None);
    s
}

/// The client's first flight, with `request` offered as early data.
fn first_flight(s: &Setup, request: &[u8]) -> (Tls, usize, Vec<u8>) {
    let (mut client, sent) =
        Tls::client_with_early_data(s.client.clone(), SERVER_NAME, request).unwrap();
    let mut flight = Vec::new();
    client.poll_output(&mut flight);
    (client, sent, flight)
}

#[test]
fn returning_client_request_and_answer_in_one_round_trip() {
    let s = returning_setup();
    let request = data(3000, 1);
    let (mut client, sent, flight) = first_flight(&s, &request);
    assert_eq!(sent, request.len());
    assert_eq!(client.early_data(), EarlyData::Offered(request.len()));

    // The server has the request before the client's Finished...
    let mut server = Tls::server(s.server.clone()).unwrap();
    assert_eq!(feed(&mut server, &flight, usize::MAX).unwrap(), request);
    assert!(server.is_handshaking());
    assert_eq!(
        server.early_data(),
        EarlyData::Received(request.len() as u64)
    );
    // ...and answers in its first flight (0.5-RTT).
    assert!(server.may_seal_half_rtt());
    let answer = data(5000, 2);
    let mut reply = Vec::new();
    server.poll_output(&mut reply);
    assert!(server.seal_half_rtt(&answer, &mut reply).unwrap());
    assert_eq!(server.stats().half_rtt_sealed, answer.len() as u64);

    // The client gets the answer with the server's flight: one round trip.
    assert_eq!(feed(&mut client, &reply, usize::MAX).unwrap(), answer);
    assert!(!client.is_handshaking());
    assert_eq!(client.handshake_kind(), Some(HandshakeKind::Resumed));
    assert_eq!(client.early_data(), EarlyData::Accepted(request.len()));
    assert_eq!(client.stats().early_data_sent, request.len() as u64);

    // The handshake ends (EndOfEarlyData, Finished) and traffic carries on both ways under
    // the record layer, its sequence numbers following rustls's.
    let up = data(20_000, 3);
    let wire = sealed(&mut client, &up);
    assert_eq!(feed(&mut server, &wire, usize::MAX).unwrap(), up);
    assert!(!server.is_handshaking());
    assert!(!server.may_seal_half_rtt());
    assert_eq!(
        server.early_data(),
        EarlyData::Received(request.len() as u64)
    );
    let down = data(20_000, 4);
    let wire = sealed(&mut server, &down);
    assert_eq!(feed(&mut client, &wire, usize::MAX).unwrap(), down);
}

/// RFC 8446 §8: a copy of the client's first flight sent to the server again must not have
/// its early data processed again. The ticket was single use: the copy gets a full
/// handshake, which the replayer cannot finish, and its early data is skipped.
#[test]
fn replayed_first_flight_is_not_delivered_again() {
    let s = returning_setup();
    let request = data(500, 5);
    let (_client, sent, flight) = first_flight(&s, &request);
    assert_eq!(sent, request.len());
    let mut server = Tls::server(s.server.clone()).unwrap();
    assert_eq!(feed(&mut server, &flight, usize::MAX).unwrap(), request);

    for piece in [usize::MAX, 1, 100] {
        let mut replay = Tls::server(s.server.clone()).unwrap();
        assert!(feed(&mut replay, &flight, piece).unwrap().is_empty());
        assert_eq!(replay.early_data(), EarlyData::None);
        assert!(replay.is_handshaking());
        assert!(!replay.may_seal_half_rtt() || replay.stats().early_data_received == 0);
        let mut out = Vec::new();
        replay.poll_output(&mut out);
        assert!(!out.is_empty(), "a full handshake answers the copy");
    }
}

#[test]
fn rejected_early_data_is_reported_for_sending_again() {
    let s = returning_setup();
    // The same ticket store, but the server no longer takes early data.
    let mut refusing = (*s.server).clone();
    refusing.max_early_data_size = 0;
    let refusing = std::sync::Arc::new(refusing);
    let request = data(800, 6);
    let (mut client, sent, flight) = first_flight(&s, &request);
    assert_eq!(sent, request.len());
    let mut server = Tls::server(refusing).unwrap();
    assert!(feed(&mut server, &flight, usize::MAX).unwrap().is_empty());
    assert_eq!(server.early_data(), EarlyData::None);
    let mut reply = Vec::new();
    server.poll_output(&mut reply);
    assert!(feed(&mut client, &reply, usize::MAX).unwrap().is_empty());
    assert!(!client.is_handshaking());
    assert_eq!(client.handshake_kind(), Some(HandshakeKind::Resumed));
    assert_eq!(client.early_data(), EarlyData::Rejected(request.len()));
    // Sent again as ordinary data, it arrives once.
    let wire = sealed(&mut client, &request);
    assert_eq!(feed(&mut server, &wire, usize::MAX).unwrap(), request);
}

#[test]
fn no_ticket_no_early_data_and_limits_hold() {
    let mut s = default_setup();
    s.server = config::server_accepting_early_data(&s.server, 1000).unwrap();
    s.client = config::client_offering_early_data(&s.client);
    // First contact: nothing to resume, nothing sent early.
    let (mut client, sent, flight) = first_flight(&s, b"request");
    assert_eq!(sent, 0);
    assert_eq!(client.early_data(), EarlyData::None);
    let mut server = Tls::server(s.server.clone()).unwrap();
    assert!(feed(&mut server, &flight, usize::MAX).unwrap().is_empty());
    assert!(!server.may_seal_half_rtt() || server.early_data() == EarlyData::None);
    let mut reply = Vec::new();
    server.poll_output(&mut reply);
    feed(&mut client, &reply, usize::MAX).unwrap();
    let wire = sealed(&mut client, b"x");
    feed(&mut server, &wire, usize::MAX).unwrap();
    let wire = sealed(&mut server, b"y");
    feed(&mut client, &wire, usize::MAX).unwrap();

    // Returning with more than the ticket allows: only a prefix goes early.
    let request = data(5000, 7);
    let (_client, sent, flight) = first_flight(&s, &request);
    assert_eq!(sent, 1000);
    let mut server = Tls::server(s.server.clone()).unwrap();
    assert_eq!(
        feed(&mut server, &flight, usize::MAX).unwrap(),
        &request[..1000]
    );
}

#[test]
fn a_ticketer_with_early_data_is_refused() {
    let s = default_setup();
    let mut with_ticketer = (*s.server).clone();
    with_ticketer.ticketer = squarepeg_tls::rustls::crypto::ring::Ticketer::new().unwrap();
    assert!(config::server_accepting_early_data(&with_ticketer, 1000).is_err());
    with_ticketer.max_early_data_size = 1000;
    assert!(Tls::server(std::sync::Arc::new(with_ticketer)).is_err());
}
