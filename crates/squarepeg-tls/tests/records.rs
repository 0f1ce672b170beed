//! The record layer: the keystream prefix against real seals, nonce uniqueness across key
//! updates, corruption of every bit, truncated and oversized records, records no squarepeg
//! sender makes (crafted with a stock rustls client's extracted keys and ring directly), and
//! garbage (proptest).

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use proptest::prelude::*;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use squarepeg_tls::config::TLS13_SUITES;
use squarepeg_tls::record::{self, RecordKeys, content_type};
use squarepeg_tls::rustls::{self, ConnectionTrafficSecrets, pki_types::ServerName};
use squarepeg_tls::{Tls, TlsError, alert};

/// The client side of a connection whose handshake stock rustls made: its extracted traffic
/// secrets drive a record sealer written here with ring (RFC 8446 §5.2–5.3), so the test can
/// send records no squarepeg sender would.
struct RawClient {
    tx: LessSafeKey,
    tx_iv: [u8; 12],
    tx_seq: u64,
    rx: RecordKeys,
    rx_seq: u64,
}

impl RawClient {
    /// Seals `inner` (content ‖ type ‖ padding, as given) as the next record.
    fn seal_inner(&mut self, inner: &[u8]) -> Vec<u8> {
        let len = (inner.len() + 16) as u16;
        let header = [23, 3, 3, (len >> 8) as u8, len as u8];
        let mut nonce = self.tx_iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.tx_seq.to_be_bytes()) {
            *n ^= s;
        }
        self.tx_seq += 1;
        let mut body = inner.to_vec();
        self.tx
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(header),
                &mut body,
            )
            .unwrap();
        [&header[..], &body].concat()
    }

    fn seal(&mut self, kind: u8, content: &[u8]) -> Vec<u8> {
        self.seal_inner(&[content, &[kind]].concat())
    }

    /// Opens the records the server sent; returns (type, content) of each.
    fn open_all(&mut self, mut wire: Vec<u8>) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let len = record::protected_record_len(&wire[at..]).unwrap();
            let (kind, content) = self
                .rx
                .open_in_place(self.rx_seq, &mut wire[at..at + len])
                .unwrap();
            out.push((kind, content.to_vec()));
            self.rx_seq += 1;
            at += len;
        }
        out
    }
}

fn key_and_iv(secrets: &ConnectionTrafficSecrets) -> (LessSafeKey, [u8; 12]) {
    let (alg, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (&aead::CHACHA20_POLY1305, key, iv)
        }
        _ => unreachable!("TLS 1.3 suites only"),
    };
    let key = LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).unwrap());
    (key, iv.as_ref().try_into().unwrap())
}

/// A squarepeg server connected to a stock rustls client, and that client as a [`RawClient`].
fn raw_client_and_server(setup: &Setup) -> (RawClient, Tls) {
    let name = ServerName::try_from(SERVER_NAME).unwrap();
    let mut stock = rustls::ClientConnection::new(setup.client.clone(), name).unwrap();
    let mut server = Tls::server(setup.server.clone()).unwrap();
    pump_stock(&mut server, &mut stock).unwrap();
    assert!(!server.is_handshaking() && !stock.is_handshaking());
    let secrets = stock.dangerous_extract_secrets().unwrap();
    let (tx, tx_iv) = key_and_iv(&secrets.tx.1);
    let raw = RawClient {
        tx,
        tx_iv,
        tx_seq: secrets.tx.0,
        rx: RecordKeys::from_secrets(&secrets.rx.1).unwrap(),
        rx_seq: secrets.rx.0,
    };
    (raw, server)
}

/// Pushes and processes `wire`; returns the plaintext and the result.
fn deliver(tls: &mut Tls, wire: &[u8]) -> (Vec<u8>, Result<(), TlsError>) {
    let mut plaintext = Vec::new();
    let mut rest = wire;
    loop {
        let n = tls.push_ciphertext(rest);
        rest = &rest[n..];
        if let Err(e) = tls.process(&mut plaintext) {
            return (plaintext, Err(e));
        }
        if rest.is_empty() {
            return (plaintext, Ok(()));
        }
    }
}

/// Checks that `server` failed with `expected`, queued exactly the alert that error names, and
/// that the alert is a fatal one the client can open.
fn assert_failed_with(
    raw: &mut RawClient,
    server: &mut Tls,
    result: Result<(), TlsError>,
    expected: TlsError,
) {
    assert_eq!(result, Err(expected.clone()));
    assert_eq!(server.process(&mut Vec::new()), Err(expected.clone()));
    let mut out = Vec::new();
    server.poll_output(&mut out);
    match expected.alert() {
        Some(description) => {
            assert_eq!(
                raw.open_all(out),
                vec![(content_type::ALERT, vec![2, description])]
            );
        }
        None => assert!(out.is_empty()),
    }
    assert_eq!(server.seal(b"x", &mut Vec::new()), Err(TlsError::Closed));
}

#[test]
fn keystream_prefix_matches_real_seals() {
    for suite in TLS13_SUITES {
        let setup = setup(&[suite]);
        let (raw, _server) = raw_client_and_server(&setup);
        // The server's keys as rustls derived them, through squarepeg's RecordKeys.
        let keys = raw.rx;
        for seq in [0, 1, 2, 255, 256, 1 << 32, u64::MAX - 1] {
            for content in [&b"hello, keystream"[..], b"ab", b""] {
                let mut sealed = Vec::new();
                keys.seal(seq, content_type::APPLICATION_DATA, content, &mut sealed);
                let inner = [content, &[content_type::APPLICATION_DATA]].concat();
                let stream = keys.keystream_prefix(seq);
                let known = inner.len().min(5);
                for i in 0..known {
                    assert_eq!(sealed[5 + i] ^ stream[i], inner[i], "{suite:?} seq {seq}");
                }
                let (kind, opened) = keys.open_in_place(seq, &mut sealed).unwrap();
                assert_eq!((kind, opened), (content_type::APPLICATION_DATA, content));
            }
        }
    }
}

#[test]
fn record_keys_reject_every_flipped_bit() {
    for suite in TLS13_SUITES {
        let setup = setup(&[suite]);
        let (raw, _server) = raw_client_and_server(&setup);
        let keys = raw.rx;
        let mut sealed = Vec::new();
        keys.seal(7, content_type::APPLICATION_DATA, &data(40, 1), &mut sealed);
        for bit in 0..sealed.len() * 8 {
            let mut flipped = sealed.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let err = keys.open_in_place(7, &mut flipped).unwrap_err();
            let expected = match bit / 8 {
                0 => TlsError::UnexpectedMessage, // outer type (RFC 8446 §5)
                3 if bit % 8 == 7 => TlsError::RecordOverflow,
                3 | 4 => TlsError::BadRecord, // length does not match the record
                _ => TlsError::Decrypt,       // version (in the AAD), body, tag
            };
            assert_eq!(err, expected, "bit {bit}");
        }
        // The wrong sequence number does not open either.
        assert_eq!(
            keys.open_in_place(8, &mut sealed.clone()),
            Err(TlsError::Decrypt)
        );
    }
}

/// Every single-bit flip of a record on a live connection ends it with an error and the
/// matching alert, and never yields plaintext.
#[test]
fn every_flipped_bit_fails_the_connection() {
    let setup = default_setup();
    let mut counts: HashMap<String, usize> = HashMap::new();
    let record_len = record::sealed_record_len(3, 0);
    for bit in 0..record_len * 8 {
        let (mut raw, mut server) = raw_client_and_server(&setup);
        let mut wire = raw.seal(content_type::APPLICATION_DATA, b"abc");
        wire[bit / 8] ^= 1 << (bit % 8);
        // Following records, so that a lengthened header reaches into them.
        for _ in 0..3 {
            wire.extend(raw.seal(content_type::APPLICATION_DATA, &data(16_000, 2)));
        }
        let (plaintext, result) = deliver(&mut server, &wire);
        assert!(plaintext.is_empty(), "bit {bit} gave plaintext");
        let expected = match bit / 8 {
            0 => TlsError::UnexpectedMessage,
            3 if bit % 8 == 7 => TlsError::RecordOverflow,
            _ => TlsError::Decrypt,
        };
        *counts.entry(format!("{expected:?}")).or_default() += 1;
        assert_failed_with(&mut raw, &mut server, result, expected);
    }
    assert_eq!(counts["UnexpectedMessage"], 8);
    assert_eq!(counts["RecordOverflow"], 1);
    assert_eq!(counts["Decrypt"], (record_len - 1) * 8 - 1);
}

#[test]
fn truncated_and_oversized_records() {
    let setup = default_setup();
    let (mut client, mut server) = connected(&setup);
    let wire = sealed(&mut client, &data(500, 3));
    // A record cut short waits for the rest.
    let (plaintext, result) = deliver(&mut server, &wire[..wire.len() - 1]);
    assert!(plaintext.is_empty() && result.is_ok());
    let (plaintext, result) = deliver(&mut server, &wire[wire.len() - 1..]);
    assert_eq!((plaintext, result), (data(500, 3), Ok(())));
    // A header of exactly the longest allowed length is accepted as a header (its body then
    // fails to open); one byte more is record_overflow at once.
    let (mut raw, mut server) = raw_client_and_server(&setup);
    let max = record::MAX_CIPHERTEXT_LEN as u16;
    let (_, result) = deliver(&mut server, &[23, 3, 3, (max >> 8) as u8, max as u8]);
    assert!(result.is_ok());
    let (_, result) = deliver(&mut server, &vec![0u8; max as usize]);
    assert_failed_with(&mut raw, &mut server, result, TlsError::Decrypt);
    let (mut raw, mut server) = raw_client_and_server(&setup);
    let (_, result) = deliver(
        &mut server,
        &[23, 3, 3, ((max + 1) >> 8) as u8, (max + 1) as u8],
    );
    assert_failed_with(&mut raw, &mut server, result, TlsError::RecordOverflow);
    // A record too short to hold a tag.
    let (mut raw, mut server) = raw_client_and_server(&setup);
    let (_, result) = deliver(
        &mut server,
        &[
            23, 3, 3, 0, 15, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
        ],
    );
    assert_failed_with(&mut raw, &mut server, result, TlsError::Decrypt);
}

type Case = (
    &'static str,
    fn(&mut RawClient) -> Vec<u8>,
    Option<TlsError>,
    &'static [u8],
);

fn case(
    name: &'static str,
    make: fn(&mut RawClient) -> Vec<u8>,
    error: Option<TlsError>,
    plaintext: &'static [u8],
) -> Case {
    (name, make, error, plaintext)
}

#[test]
fn records_a_squarepeg_sender_never_makes() {
    let setup = default_setup();
    let fresh = || raw_client_and_server(&setup);
    let cases = [
        case(
            "zero-length application data",
            |r| [r.seal(23, b""), r.seal(23, b"after")].concat(),
            None,
            b"after",
        ),
        case(
            "padding",
            |r| r.seal_inner(&[&b"hello"[..], &[23], &[0; 1000]].concat()),
            None,
            b"hello",
        ),
        case(
            "all padding up to the limit",
            |r| {
                [
                    r.seal_inner(&[&[23u8][..], &[0; record::MAX_PLAINTEXT_LEN]].concat()),
                    r.seal(23, b"x"),
                ]
                .concat()
            },
            None,
            b"x",
        ),
        case(
            "longest content",
            |r| r.seal(23, &[7; record::MAX_PLAINTEXT_LEN]),
            None,
            &[7; record::MAX_PLAINTEXT_LEN],
        ),
        case(
            "inner plaintext over 2^14 + 1",
            |r| r.seal_inner(&[&[7u8; record::MAX_PLAINTEXT_LEN][..], &[23, 0]].concat()),
            Some(TlsError::RecordOverflow),
            b"",
        ),
        case(
            "content over 2^14",
            |r| r.seal(23, &[7; record::MAX_PLAINTEXT_LEN + 1]),
            Some(TlsError::RecordOverflow),
            b"",
        ),
        case(
            "only zeros",
            |r| r.seal_inner(&[0, 0, 0]),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "change_cipher_spec after the handshake",
            |r| r.seal(20, &[1]),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "unknown content type",
            |r| r.seal(99, b"x"),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "outer type handshake",
            |r| {
                let mut w = r.seal(23, b"x");
                w[0] = 22;
                w
            },
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "replayed record",
            |r| {
                let w = r.seal(23, b"once");
                [w.clone(), w].concat()
            },
            Some(TlsError::Decrypt),
            b"once",
        ),
        case(
            "alert of three bytes",
            |r| r.seal(21, &[2, 40, 0]),
            Some(TlsError::BadRecord),
            b"",
        ),
        case(
            "fatal alert",
            |r| r.seal(21, &[2, 40]),
            Some(TlsError::Alert { description: 40 }),
            b"",
        ),
        case(
            "warning-level alert other than closure",
            |r| r.seal(21, &[1, 42]),
            Some(TlsError::Alert { description: 42 }),
            b"",
        ),
        case(
            "too many user_canceled",
            |r| {
                (0..5)
                    .flat_map(|_| r.seal(21, &[1, alert::USER_CANCELED]))
                    .collect()
            },
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "empty handshake record",
            |r| r.seal(22, b""),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "KeyUpdate with request_update 2",
            |r| r.seal(22, &[24, 0, 0, 1, 2]),
            Some(TlsError::IllegalParameter),
            b"",
        ),
        case(
            "KeyUpdate of two bytes",
            |r| r.seal(22, &[24, 0, 0, 2, 0, 0]),
            Some(TlsError::BadRecord),
            b"",
        ),
        case(
            "KeyUpdate not at the end of its record",
            |r| r.seal(22, &[24, 0, 0, 1, 0, 24, 0]),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "NewSessionTicket to a server",
            |r| r.seal(22, &[4, 0, 0, 1, 0]),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "CertificateRequest after the handshake",
            |r| r.seal(22, &[13, 0, 0, 1, 0]),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "handshake fragment, then application data",
            |r| [r.seal(22, &[24, 0]), r.seal(23, b"x")].concat(),
            Some(TlsError::UnexpectedMessage),
            b"",
        ),
        case(
            "handshake message too long",
            |r| r.seal(22, &[4, 0xff, 0xff, 0xff]),
            Some(TlsError::BadRecord),
            b"",
        ),
    ];
    for (name, make, error, plaintext) in cases {
        let (mut raw, mut server) = fresh();
        let wire = make(&mut raw);
        let (got, result) = deliver(&mut server, &wire);
        assert_eq!(got, plaintext, "{name}");
        match error {
            None => assert_eq!(result, Ok(()), "{name}"),
            Some(e) => assert_failed_with(&mut raw, &mut server, result, e),
        }
    }
}

#[test]
fn closure_alerts_and_fragmented_key_update() {
    let setup = default_setup();
    // user_canceled, then close_notify: a clean close (RFC 8446 §6.1).
    let (mut raw, mut server) = raw_client_and_server(&setup);
    let wire = [
        raw.seal(23, b"bye"),
        raw.seal(21, &[1, alert::USER_CANCELED]),
        raw.seal(21, &[1, 0]),
    ]
    .concat();
    assert_eq!(deliver(&mut server, &wire), (b"bye".to_vec(), Ok(())));
    assert!(server.peer_closed());

    // A KeyUpdate in two records (RFC 8446 §5.1 allows fragments; it ends the second): the
    // server moves to the next key, so the old one no longer opens.
    let (mut raw, mut server) = raw_client_and_server(&setup);
    let wire = [raw.seal(22, &[24, 0]), raw.seal(22, &[0, 1, 1])].concat();
    assert_eq!(deliver(&mut server, &wire), (Vec::new(), Ok(())));
    assert_eq!(server.stats().key_updates_received, 1);
    assert_eq!(server.key_epochs(), Some((0, 1)));
    // update_requested: the server answers with its own KeyUpdate before its next data.
    let mut out = Vec::new();
    server.seal(b"data", &mut out).unwrap();
    let first = record::protected_record_len(&out).unwrap();
    let records = raw.open_all(out[..first].to_vec());
    assert_eq!(
        records,
        vec![(content_type::HANDSHAKE, vec![24, 0, 0, 1, 0])]
    );
    assert_eq!(server.stats().key_updates_sent, 1);
    let (_, result) = deliver(&mut server, &raw.seal(23, b"old key"));
    assert_eq!(result, Err(TlsError::Decrypt));
}

/// Every (key epoch, nonce) sealed, across many records, requested and unrequested key
/// updates from both sides, and the automatic ones at a lowered limit, is unique.
#[test]
fn nonces_never_repeat() {
    const THRESHOLD: u64 = 10;
    let setup = default_setup();
    let (mut client, mut server) = connected(&setup);
    for tls in [&mut client, &mut server] {
        tls.record_nonces(true);
        tls.set_key_update_threshold(THRESHOLD);
        tls.set_max_record_plaintext(500);
    }
    for round in 0..60usize {
        let (a, b) = if round % 2 == 0 {
            (&mut client, &mut server)
        } else {
            (&mut server, &mut client)
        };
        if round % 7 == 3 {
            a.initiate_key_update(round % 3 == 0);
        }
        let msg = data((round * 397) % 4000, round as u8);
        let wire = sealed(a, &msg);
        assert_eq!(feed(b, &wire, 1500).unwrap(), msg);
        if round % 11 == 5 {
            let wire = sealed(b, b"");
            assert!(feed(a, &wire, usize::MAX).unwrap().is_empty());
        }
    }
    pump(&mut client, &mut server).unwrap();
    for tls in [&client, &server] {
        let nonces = tls.sealed_nonces();
        assert_eq!(nonces.len() as u64, tls.stats().records_sealed);
        let unique: HashSet<_> = nonces.iter().collect();
        assert_eq!(unique.len(), nonces.len(), "a (key, nonce) pair repeated");
        // No key sealed more records than the limit allows.
        let mut per_epoch: HashMap<u64, u64> = HashMap::new();
        for (epoch, _) in &nonces {
            *per_epoch.entry(*epoch).or_default() += 1;
        }
        assert!(per_epoch.values().all(|&n| n <= THRESHOLD), "{per_epoch:?}");
        assert!(per_epoch.len() as u64 >= tls.stats().key_updates_sent);
        // Most updates were the automatic ones at the limit.
        assert!(tls.stats().key_updates_sent >= 10, "{:?}", tls.stats());
    }
    assert_eq!(
        client.stats().key_updates_sent,
        server.stats().key_updates_received
    );
    assert_eq!(
        server.stats().key_updates_sent,
        client.stats().key_updates_received
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Garbage to a server in its handshake: errors, never a panic.
    #[test]
    fn garbage_during_the_handshake(garbage in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let setup = default_setup();
        let mut server = Tls::server(setup.server.clone()).unwrap();
        let (plaintext, _) = deliver(&mut server, &garbage);
        prop_assert!(plaintext.is_empty());
        server.poll_output(&mut Vec::new());
    }

    /// A client's view of the server's flight with random bytes changed.
    #[test]
    fn mangled_server_flight(changes in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let setup = default_setup();
        let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
        let mut server = Tls::server(setup.server.clone()).unwrap();
        let mut flight = server_flight(&mut client, &mut server);
        for (at, byte) in changes {
            let at = at % flight.len();
            flight[at] ^= byte | 1;
        }
        let (plaintext, _) = deliver(&mut client, &flight);
        prop_assert!(plaintext.is_empty());
        client.poll_output(&mut Vec::new());
    }

    /// Garbage, and records with valid headers and random bodies, after the handshake: no
    /// plaintext, no panic.
    #[test]
    fn garbage_after_the_handshake(
        garbage in proptest::collection::vec(any::<u8>(), 0..2000),
        lengths in proptest::collection::vec(0u16..=17000, 0..4),
    ) {
        let setup = default_setup();
        let (_client, mut server) = connected(&setup);
        let mut wire = Vec::new();
        for len in lengths {
            wire.extend_from_slice(&[23, 3, 3, (len >> 8) as u8, len as u8]);
            wire.extend(garbage.iter().cycle().take(usize::from(len)));
        }
        wire.extend_from_slice(&garbage);
        let (plaintext, _) = deliver(&mut server, &wire);
        prop_assert!(plaintext.is_empty());
        server.poll_output(&mut Vec::new());
    }

    /// Reads opened where they lie (`Tls::process_buffer`): whatever the read sizes, and with
    /// bytes changed or cut anywhere after the handshake, what is delivered is a prefix of
    /// what was sent (authenticated records only); unchanged, all of it.
    #[test]
    fn reads_opened_in_place_deliver_only_a_prefix_of_what_was_sent(
        pieces in proptest::collection::vec(0usize..40_000, 1..12),
        reads in proptest::collection::vec(1usize..70_000, 1..8),
        changes in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let setup = default_setup();
        let (mut client, mut server) = connected(&setup);
        let mut sent = Vec::new();
        let mut wire = Vec::new();
        for (i, len) in pieces.iter().enumerate() {
            let piece = data(*len, i as u8);
            client.seal(&piece, &mut wire).unwrap();
            sent.extend_from_slice(&piece);
        }
        let intact = changes.is_empty() && cut.is_none();
        for (at, byte) in &changes {
            let at = at % wire.len().max(1);
            if let Some(b) = wire.get_mut(at) {
                *b ^= byte | 1;
            }
        }
        if let Some(cut) = cut {
            wire.truncate(cut % (wire.len() + 1));
        }
        let (got, result) = read_in_place(&mut server, &wire, &reads);
        prop_assert!(got.len() <= sent.len() && got[..] == sent[..got.len()]);
        if intact {
            prop_assert!(result.is_ok());
            prop_assert_eq!(got.len(), sent.len());
        }
    }
}
