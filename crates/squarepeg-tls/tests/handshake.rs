//! squarepeg client ↔ squarepeg server: handshake and data both ways in every suite, data in the
//! same read as the handshake's end, odd read sizes, close_notify, key updates.

mod common;

use common::*;
use squarepeg_tls::config::TLS13_SUITES;
use squarepeg_tls::record::{self, MAX_RECORD_LEN};
use squarepeg_tls::rustls::HandshakeKind;
use squarepeg_tls::{Tls, TlsError};

const SIZES: [usize; 7] = [0, 1, 100, 16383, 16384, 16385, 100_000];

#[test]
fn every_suite_handshakes_and_carries_data_both_ways() {
    for suite in TLS13_SUITES {
        let setup = setup(&[suite]);
        let (mut client, mut server) = connected(&setup);
        assert_eq!(client.negotiated_suite(), Some(suite));
        assert_eq!(server.negotiated_suite(), Some(suite));
        let chain = client.peer_certificates().expect("server chain");
        assert_eq!(
            squarepeg_tls::config::certificate_fingerprint(&chain[0]),
            setup.cert.fingerprint
        );
        assert!(server.peer_certificates().is_none());
        for (i, len) in SIZES.into_iter().enumerate() {
            let up = data(len, i as u8);
            let wire = sealed(&mut client, &up);
            assert_eq!(
                feed(&mut server, &wire, usize::MAX).unwrap(),
                up,
                "{suite:?} up {len}"
            );
            let down = data(len, 0x80 | i as u8);
            let wire = sealed(&mut server, &down);
            assert_eq!(feed(&mut client, &wire, usize::MAX).unwrap(), down);
        }
        let stats = client.stats();
        assert_eq!(stats.bytes_sealed, SIZES.iter().sum::<usize>() as u64);
        assert_eq!(stats.bytes_opened, SIZES.iter().sum::<usize>() as u64);
    }
}

#[test]
fn sealed_len_is_exact() {
    let setup = default_setup();
    let (mut client, mut server) = connected(&setup);
    client.set_padding_granularity(64);
    client.set_max_record_plaintext(1000);
    for len in [0, 1, 62, 63, 64, 999, 1000, 1001, 5000, 70_000] {
        let expected = client.sealed_len(len);
        let mut wire = Vec::new();
        client.seal(&data(len, 1), &mut wire).unwrap();
        assert_eq!(wire.len(), expected, "len {len}");
        assert_eq!(feed(&mut server, &wire, 777).unwrap(), data(len, 1));
    }
    // With a KeyUpdate pending, and one inserted at the (lowered) key limit.
    client.set_key_update_threshold(3);
    client.initiate_key_update(false);
    for len in [10, 2000, 9000] {
        let expected = client.sealed_len(len);
        let mut wire = Vec::new();
        client.seal(&data(len, 2), &mut wire).unwrap();
        assert_eq!(wire.len(), expected, "len {len}");
        assert_eq!(feed(&mut server, &wire, usize::MAX).unwrap(), data(len, 2));
    }
    assert!(client.stats().key_updates_sent >= 5);
    assert_eq!(
        server.stats().key_updates_received,
        client.stats().key_updates_sent
    );
}

/// The client's Finished and its first records arrive in one read, and so do the server's
/// NewSessionTickets and its first records: nothing may be lost across the hand-over from
/// rustls to the record layer; the tickets must reach rustls (the next connection resumes).
#[test]
fn data_in_the_same_read_as_the_handshake_end_is_kept() {
    for (suite, piece) in TLS13_SUITES
        .into_iter()
        .flat_map(|suite| [usize::MAX, 1, 7, 300].map(|piece| (suite, piece)))
    {
        let setup = setup(&[suite]);
        let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
        let mut server = Tls::server(setup.server.clone()).unwrap();
        let mut hello = Vec::new();
        client.poll_output(&mut hello);
        assert!(feed(&mut server, &hello, piece).unwrap().is_empty());
        let mut flight = Vec::new();
        server.poll_output(&mut flight);
        assert!(feed(&mut client, &flight, piece).unwrap().is_empty());
        assert!(!client.is_handshaking());

        // Finished, then application data at once (seal takes the pending Finished first).
        let up = data(40_000, 3);
        let mut wire = Vec::new();
        client.seal(&up, &mut wire).unwrap();
        client.initiate_key_update(true);
        let up2 = data(10, 4);
        client.seal(&up2, &mut wire).unwrap();
        let got = feed(&mut server, &wire, piece).unwrap();
        assert!(!server.is_handshaking());
        assert_eq!(server.negotiated_suite(), Some(suite));
        assert_eq!(got, [up, up2].concat());

        // NewSessionTickets, the KeyUpdate answer and data in one read.
        let down = data(20_000, 5);
        let mut wire = Vec::new();
        server.seal(&down, &mut wire).unwrap();
        assert_eq!(feed(&mut client, &wire, piece).unwrap(), down);
        assert_eq!(client.stats().key_updates_received, 1);

        // The tickets reached rustls: a new connection resumes.
        let mut client2 = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
        let mut server2 = Tls::server(setup.server.clone()).unwrap();
        pump(&mut client2, &mut server2).unwrap();
        assert_eq!(client2.handshake_kind(), Some(HandshakeKind::Resumed));
        assert_eq!(server2.handshake_kind(), Some(HandshakeKind::Resumed));
        assert_eq!(client.handshake_kind(), Some(HandshakeKind::Full));
    }
}

#[test]
fn push_is_bounded_and_always_progresses() {
    let setup = default_setup();
    let (mut client, mut server) = connected(&setup);
    let up = data(200_000, 6);
    let wire = sealed(&mut client, &up);
    // Without processing, at most one maximal record is taken.
    let taken = server.push_ciphertext(&wire);
    assert_eq!(taken, MAX_RECORD_LEN);
    assert_eq!(server.push_ciphertext(&wire[taken..]), 0);
    let mut got = Vec::new();
    server.process(&mut got).unwrap();
    let mut rest = &wire[taken..];
    while !rest.is_empty() {
        let n = server.push_ciphertext(rest);
        assert!(n > 0);
        rest = &rest[n..];
        server.process(&mut got).unwrap();
    }
    assert_eq!(got, up);
}

#[test]
fn close_notify_both_ways() {
    let setup = default_setup();
    let (mut client, mut server) = connected(&setup);
    let up = data(1000, 7);
    let mut wire = sealed(&mut client, &up);
    client.send_close_notify();
    assert_eq!(client.seal(b"late", &mut Vec::new()), Err(TlsError::Closed));
    client.poll_output(&mut wire);
    // Anything after close_notify is ignored (RFC 8446 §6.1).
    wire.extend_from_slice(&[23, 3, 3, 0, 20]);
    wire.extend_from_slice(&[0xee; 20]);
    assert_eq!(feed(&mut server, &wire, usize::MAX).unwrap(), up);
    assert!(server.peer_closed());
    // Half-closed: the server may still send, then closes too.
    let down = data(500, 8);
    let mut wire = sealed(&mut server, &down);
    server.send_close_notify();
    server.poll_output(&mut wire);
    assert_eq!(feed(&mut client, &wire, usize::MAX).unwrap(), down);
    assert!(client.peer_closed());
    let mut nothing = Vec::new();
    server.poll_output(&mut nothing);
    assert!(nothing.is_empty());
}

#[test]
fn key_updates_each_way_with_and_without_request() {
    let setup = default_setup();
    let (mut client, mut server) = connected(&setup);
    for round in 0..4u8 {
        let requester_is_client = round % 2 == 0;
        let request = round < 2;
        let (a, b) = if requester_is_client {
            (&mut client, &mut server)
        } else {
            (&mut server, &mut client)
        };
        a.initiate_key_update(request);
        let msg = data(3000, round);
        let wire = sealed(a, &msg);
        assert_eq!(feed(b, &wire, 1000).unwrap(), msg);
        // b answers a request before its next data; a reads it.
        let reply = data(100, round ^ 0xff);
        let wire = sealed(b, &reply);
        assert_eq!(feed(a, &wire, usize::MAX).unwrap(), reply);
    }
    // Requests in rounds 0 and 1 were answered: 4 initiated + 2 answers.
    let sent = client.stats().key_updates_sent + server.stats().key_updates_sent;
    assert_eq!(sent, 6);
    assert_eq!(
        client.stats().key_updates_received,
        server.stats().key_updates_sent
    );
    assert_eq!(client.key_epochs(), Some((3, 3)));
    assert_eq!(server.key_epochs(), Some((3, 3)));
}

#[test]
fn seal_before_the_handshake_is_not_ready() {
    let setup = default_setup();
    let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
    assert!(client.is_handshaking());
    assert_eq!(client.seal(b"x", &mut Vec::new()), Err(TlsError::NotReady));
    assert_eq!(client.sealed_len(1), record::sealed_record_len(1, 0));
}

#[test]
fn a_handshake_failure_sends_rustls_alert() {
    // The client pins a different certificate: it rejects the server's and says so.
    let setup = default_setup();
    let other = default_setup();
    let mut client = Tls::client(other.client.clone(), SERVER_NAME).unwrap();
    let mut server = Tls::server(setup.server.clone()).unwrap();
    let flight = server_flight(&mut client, &mut server);
    let err = feed(&mut client, &flight, usize::MAX).unwrap_err();
    assert!(matches!(err, TlsError::Handshake(_)), "{err:?}");
    assert_eq!(client.process(&mut Vec::new()), Err(err));
    let mut alert = Vec::new();
    client.poll_output(&mut alert);
    assert!(!alert.is_empty());
    let err = feed(&mut server, &alert, usize::MAX).unwrap_err();
    // access_denied (49) for a certificate the application refused.
    assert_eq!(err, TlsError::Alert { description: 49 });
}

#[test]
fn a_peer_that_does_not_speak_tls_fails_at_its_first_bytes() {
    // A squarepeg session's first bytes in the clear (a uCOBS frame marker, then PARAMS), an
    // HTTP request, and a record of a type no first flight has: each fails at once — byte by
    // byte, as soon as one byte rules TLS out — and an unexpected_message alert goes back in
    // the clear. A real first flight is not mistaken for one.
    let setup = default_setup();
    for (bytes, fails_after) in [
        (&[0x00, 0x02, 0x14, 0x04, 0x01, 0x81][..], 1),
        (&b"GET / HTTP/1.1\r\n"[..], 1),
        (&[0x16, 0x02, 0x00][..], 2),
        (&[0x17, 0x03, 0x03, 0x00, 0x10][..], 1),
    ] {
        for server_side in [true, false] {
            let mut tls = if server_side {
                Tls::server(setup.server.clone()).unwrap()
            } else {
                let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
                client.poll_output(&mut Vec::new());
                client
            };
            for i in 0..bytes.len() {
                let result = feed(&mut tls, &bytes[i..i + 1], 1);
                if i + 1 < fails_after {
                    result.unwrap();
                } else {
                    assert_eq!(result, Err(TlsError::NotTls), "{bytes:?} at {i}");
                    break;
                }
            }
            let mut alert = Vec::new();
            tls.poll_output(&mut alert);
            assert_eq!(alert, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 10]);
        }
    }
    let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
    let mut server = Tls::server(setup.server.clone()).unwrap();
    let mut hello = Vec::new();
    client.poll_output(&mut hello);
    feed(&mut server, &hello, 1).unwrap();
    pump(&mut client, &mut server).unwrap();
    assert!(!client.is_handshaking() && !server.is_handshaking());
}

/// A key update or a close asked for during the handshake goes out once it completes.
#[test]
fn key_update_and_close_asked_for_during_the_handshake() {
    let setup = default_setup();
    let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
    let mut server = Tls::server(setup.server.clone()).unwrap();
    client.initiate_key_update(true);
    server.send_close_notify();
    pump(&mut client, &mut server).unwrap();
    assert!(!client.is_handshaking() && !server.is_handshaking());
    assert_eq!(client.stats().key_updates_sent, 1);
    assert_eq!(server.stats().key_updates_received, 1);
    // A closing server sends no more application data, so it does not answer
    // update_requested (RFC 8446 §4.6.3 asks for the answer before the next data).
    assert_eq!(server.stats().key_updates_sent, 0);
    assert!(client.peer_closed());
    assert_eq!(server.seal(b"x", &mut Vec::new()), Err(TlsError::Closed));
    let up = data(100, 9);
    let wire = sealed(&mut client, &up);
    assert_eq!(feed(&mut server, &wire, usize::MAX).unwrap(), up);
}

/// The plaintext of `wire` read in place in reads of `sizes` ([`read_in_place`]).
fn feed_reads(tls: &mut Tls, wire: &[u8], sizes: &[usize]) -> Result<Vec<u8>, TlsError> {
    let (plaintext, result) = read_in_place(tls, wire, sizes);
    result.map(|()| plaintext)
}

#[test]
fn reads_opened_where_they_lie_deliver_the_same_plaintext() {
    // The handshake and the records after it, in reads of every size: records whole in a
    // read are opened in the read's buffer (which becomes the record layer's), records cut
    // by a read's end are completed from the next.
    let setup = default_setup();
    for sizes in [
        &[1usize][..],
        &[5, 16_389, 7],
        &[65_536],
        &[100, 40_000, 3],
        &[16_405],
    ] {
        let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
        let mut server = Tls::server(setup.server.clone()).unwrap();
        let mut hello = Vec::new();
        client.poll_output(&mut hello);
        assert!(feed_reads(&mut server, &hello, sizes).unwrap().is_empty());
        let mut flight = Vec::new();
        server.poll_output(&mut flight);
        assert!(feed_reads(&mut client, &flight, sizes).unwrap().is_empty());
        // The server reads the client's Finished and its first records together.
        let mut finished = Vec::new();
        client.poll_output(&mut finished);
        let up = data(300_000, 9);
        for piece in up.chunks(33_333) {
            client.seal(piece, &mut finished).unwrap();
        }
        assert_eq!(feed_reads(&mut server, &finished, sizes).unwrap(), up);
        assert!(!client.is_handshaking() && !server.is_handshaking());
        let down = data(150_000, 3);
        let wire = sealed(&mut server, &down);
        assert_eq!(feed_reads(&mut client, &wire, sizes).unwrap(), down);
    }
}
