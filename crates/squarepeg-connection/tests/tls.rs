//! Two TLS connection cores joined by in-memory byte streams: the handshake, messages and
//! streams inside records, key updates, close_notify, and the failures an application must be
//! able to tell apart (refused certificate, corrupted record) — with nothing unauthenticated
//! ever delivered.

use std::time::{Duration, Instant};

use squarepeg_connection::{
    Config, Connection, ConnectionError, Protection, Role, Substrate, TlsSetup, TransportError,
};
use squarepeg_session::{MessageProps, ReadOutcome, TlsFailure};
use squarepeg_tls::config::{self, Trust};

/// A server set-up with a fresh self-signed certificate, and a client set-up that pins it
/// (or, with `pin_other`, pins a different certificate).
fn setups(pin_other: bool) -> (TlsSetup, TlsSetup) {
    let cert = config::self_signed(&["peg.test".into()]).unwrap();
    let other = config::self_signed(&["peg.test".into()]).unwrap();
    let pin = if pin_other {
        other.fingerprint
    } else {
        cert.fingerprint
    };
    let server = TlsSetup::Server {
        config: config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap(),
    };
    let client = TlsSetup::Client {
        config: config::client_config(Trust::PinnedSha256(pin)).unwrap(),
        server_name: "peg.test".into(),
    };
    (client, server)
}

fn connection(role: Role, tls: TlsSetup) -> Connection {
    let mut config = Config::default();
    config.tls = Some(tls);
    Connection::new(role, config, Substrate::byte_stream()).unwrap()
}

/// Both ends and what crossed the wire in each direction.
struct Pair {
    client: Connection,
    server: Connection,
    now: Instant,
    /// Every byte the client sent, and the server sent.
    wire_up: Vec<u8>,
    wire_down: Vec<u8>,
    /// Flips one bit of the next bytes going up at this offset of `wire_up`.
    corrupt_up_at: Option<usize>,
    fin_up: bool,
    fin_down: bool,
}

impl Pair {
    fn new(client: TlsSetup, server: TlsSetup) -> Self {
        Self {
            client: connection(Role::Client, client),
            server: connection(Role::Server, server),
            now: Instant::now(),
            wire_up: Vec::new(),
            wire_down: Vec::new(),
            corrupt_up_at: None,
            fin_up: false,
            fin_down: false,
        }
    }

    /// Moves bytes both ways until nothing moves.
    fn pump(&mut self) {
        for _ in 0..10_000 {
            self.now += Duration::from_millis(1);
            let mut moved = false;
            let mut up = Vec::new();
            self.client.poll_transmit(self.now, &mut up, 64 * 1024);
            if let Some(at) = self.corrupt_up_at
                && at >= self.wire_up.len()
                && at < self.wire_up.len() + up.len()
            {
                up[at - self.wire_up.len()] ^= 0x10;
                self.corrupt_up_at = None;
            }
            if !up.is_empty() {
                moved = true;
                self.wire_up.extend_from_slice(&up);
                self.server.handle_bytes(self.now, &up);
            }
            let mut down = Vec::new();
            self.server.poll_transmit(self.now, &mut down, 64 * 1024);
            if !down.is_empty() {
                moved = true;
                self.wire_down.extend_from_slice(&down);
                self.client.handle_bytes(self.now, &down);
            }
            if !self.fin_up && self.client.poll_shutdown() {
                self.fin_up = true;
                moved = true;
                self.server
                    .handle_transport_closed(self.now, TransportError::PeerClosed);
            }
            if !self.fin_down && self.server.poll_shutdown() {
                self.fin_down = true;
                moved = true;
                self.client
                    .handle_transport_closed(self.now, TransportError::PeerClosed);
            }
            for c in [&mut self.client, &mut self.server] {
                c.handle_timeout(self.now);
                while c.poll_event().is_some() {}
            }
            if !moved {
                return;
            }
        }
        panic!("the pair never settled");
    }
}

fn messages(c: &mut Connection) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| c.session_mut().poll_message())
        .map(|m| m.payload.to_vec())
        .collect()
}

/// Offsets of the records in `wire`: (content type, offset, length) per record, checking that
/// the records tile the stream exactly.
fn records(wire: &[u8]) -> Vec<(u8, usize, usize)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < wire.len() {
        assert!(at + 5 <= wire.len(), "a partial record header at {at}");
        let len = u16::from_be_bytes([wire[at + 3], wire[at + 4]]) as usize;
        out.push((wire[at], at, len));
        at += 5 + len;
    }
    assert_eq!(at, wire.len(), "the last record is cut");
    out
}

#[test]
fn messages_and_streams_go_through_tls_records() {
    let (c, s) = setups(false);
    let mut p = Pair::new(c, s);
    assert_eq!(p.client.protection(), Protection::Tls);
    // Queued before the handshake is done: it waits in the session.
    p.client
        .session_mut()
        .send_message(p.now, b"early".to_vec(), MessageProps::default())
        .unwrap();
    assert!(!p.client.is_established());
    p.pump();
    assert!(p.client.is_established() && p.server.is_established());
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let stream = p.client.session_mut().open_stream().unwrap();
    let mut written = 0;
    for i in 0..50u8 {
        p.client
            .session_mut()
            .send_message(p.now, vec![i; i as usize * 10], MessageProps::default())
            .unwrap();
        if written < big.len() {
            written += p
                .client
                .session_mut()
                .stream_write(stream, &big[written..])
                .unwrap();
        }
        p.server
            .session_mut()
            .send_message(p.now, vec![i; 3], MessageProps::default())
            .unwrap();
        p.pump();
    }
    let mut got = messages(&mut p.server);
    assert_eq!(got.remove(0), b"early");
    assert_eq!(got.len(), 50);
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m, &vec![i as u8; i * 10]);
    }
    assert_eq!(messages(&mut p.client).len(), 50);
    let incoming = p.server.session_mut().accept_stream().unwrap();
    let mut read = Vec::new();
    let mut buf = vec![0; 65536];
    while let Ok(ReadOutcome::Data(n)) = p.server.session_mut().stream_read(incoming, &mut buf) {
        read.extend_from_slice(&buf[..n]);
    }
    assert_eq!(read, big[..written]);

    // On the wire: the ClientHello, then only records; after the handshake, application
    // data records (0x17 0x03 0x03), none larger than 16 KiB of plaintext plus overhead.
    assert_eq!(&p.wire_up[..3], &[0x16, 0x03, 0x01]);
    let up = records(&p.wire_up);
    assert!(up.iter().all(|&(_, _, len)| len <= 16384 + 256));
    assert!(up.iter().filter(|r| r.0 == 0x17).count() > 10);
    assert!(
        up.iter()
            .all(|&(t, at, _)| t != 0x17 || p.wire_up[at + 1..at + 3] == [3, 3])
    );
    // No plaintext leaks: the message bytes never appear in the clear.
    assert!(
        !p.wire_up.windows(5).any(|w| w == b"early"),
        "plaintext on the wire"
    );
    let stats = p.client.stats().tls.unwrap();
    assert!(stats.records_sealed > 10 && stats.bytes_sealed > written as u64);

    // A graceful close: the session's CLOSE, close_notify, FIN, both ways.
    p.client.session_mut().close(0, b"done");
    for _ in 0..30 {
        p.pump();
        if p.client.is_drained() && p.server.is_drained() {
            break;
        }
        // The drain timer.
        p.now += Duration::from_millis(500);
    }
    assert!(
        p.client.is_drained() && p.server.is_drained(),
        "fin up {} down {}; client {:?} {:?}; server {:?} {:?}",
        p.fin_up,
        p.fin_down,
        p.client.session().error(),
        p.client.session().is_send_finished(),
        p.server.session().error(),
        p.server.session().is_send_finished(),
    );
    assert!(p.server.tls().unwrap().peer_closed());
    assert!(p.client.tls().unwrap().peer_closed());
    assert_eq!(
        p.client.session().error(),
        Some(&ConnectionError::LocallyClosed)
    );
    assert!(matches!(
        p.server.session().error(),
        Some(ConnectionError::ApplicationClosed { code: 0, .. })
    ));
}

#[test]
fn key_updates_in_both_directions_keep_data_flowing() {
    let (c, s) = setups(false);
    let mut p = Pair::new(c, s);
    p.pump();
    for round in 0..6u8 {
        match round % 3 {
            0 => p.client.tls_mut().unwrap().initiate_key_update(true),
            1 => p.server.tls_mut().unwrap().initiate_key_update(false),
            _ => {}
        }
        p.client
            .session_mut()
            .send_message(p.now, vec![round; 1000], MessageProps::default())
            .unwrap();
        p.server
            .session_mut()
            .send_message(p.now, vec![round; 500], MessageProps::default())
            .unwrap();
        p.pump();
        assert_eq!(messages(&mut p.server), vec![vec![round; 1000]]);
        assert_eq!(messages(&mut p.client), vec![vec![round; 500]]);
    }
    let c = p.client.stats().tls.unwrap();
    let s = p.server.stats().tls.unwrap();
    assert!(
        c.key_updates_sent >= 2 && s.key_updates_received >= 2,
        "{c:?} {s:?}"
    );
    assert!(s.key_updates_sent >= 4, "{s:?}");
}

#[test]
fn a_refused_certificate_ends_both_sides_with_typed_errors() {
    let (c, s) = setups(true);
    let mut p = Pair::new(c, s);
    p.client
        .session_mut()
        .send_message(p.now, b"secret".to_vec(), MessageProps::default())
        .unwrap();
    p.pump();
    assert_eq!(
        p.client.session().error(),
        Some(&ConnectionError::Transport(TransportError::Tls(
            TlsFailure::Certificate
        )))
    );
    match p.server.session().error() {
        Some(ConnectionError::Transport(TransportError::Tls(TlsFailure::AlertReceived(_)))) => {}
        other => panic!("server: {other:?}"),
    }
    assert!(messages(&mut p.server).is_empty());
    assert!(!p.wire_up.windows(6).any(|w| w == b"secret"));
}

#[test]
fn a_corrupted_record_is_never_delivered() {
    let (c, s) = setups(false);
    let mut p = Pair::new(c, s);
    p.pump();
    p.client
        .session_mut()
        .send_message(p.now, vec![1; 100], MessageProps::default())
        .unwrap();
    p.pump();
    assert_eq!(messages(&mut p.server), vec![vec![1; 100]]);
    // Flip a bit inside the next record's ciphertext.
    p.corrupt_up_at = Some(p.wire_up.len() + 40);
    p.client
        .session_mut()
        .send_message(p.now, vec![2; 100], MessageProps::default())
        .unwrap();
    p.client
        .session_mut()
        .send_message(p.now, vec![3; 100], MessageProps::default())
        .unwrap();
    p.pump();
    assert!(messages(&mut p.server).is_empty());
    assert_eq!(
        p.server.session().error(),
        Some(&ConnectionError::Transport(TransportError::Tls(
            TlsFailure::Decrypt
        )))
    );
    // The server told the client why (bad_record_mac, 20).
    assert_eq!(
        p.client.session().error(),
        Some(&ConnectionError::Transport(TransportError::Tls(
            TlsFailure::AlertReceived(20)
        )))
    );
}

#[test]
fn a_handshake_that_stalls_times_out_and_a_finished_one_never_does() {
    // A server that never answers (or bytes the handshake waits on for ever): the client
    // fails at the handshake timeout with a typed error, and ends its stream.
    let (c, _) = setups(false);
    let mut config = Config::default();
    config.tls = Some(c);
    // The handshake's timer alone (not the idle release's).
    config.release_idle_after = None;
    let mut client = Connection::new(Role::Client, config, Substrate::byte_stream()).unwrap();
    let t0 = Instant::now();
    let mut out = Vec::new();
    client.poll_transmit(t0, &mut out, 64 * 1024);
    assert!(!out.is_empty(), "the ClientHello");
    let timeout = Config::default().handshake_timeout;
    assert_eq!(client.poll_timeout(), Some(t0 + timeout));
    client.handle_timeout(t0 + timeout - Duration::from_millis(1));
    assert!(client.session().error().is_none());
    client.handle_timeout(t0 + timeout);
    assert_eq!(
        client.session().error(),
        Some(&ConnectionError::Transport(TransportError::Tls(
            TlsFailure::HandshakeTimedOut
        )))
    );
    assert!(client.poll_shutdown(), "the FIN follows");
    // A timeout too long to reach sets none (and does not overflow).
    let (c, _) = setups(false);
    let mut config = Config::default();
    config.tls = Some(c);
    config.handshake_timeout = Duration::MAX;
    let mut patient = Connection::new(Role::Client, config, Substrate::byte_stream()).unwrap();
    patient.poll_transmit(t0, &mut Vec::new(), 64 * 1024);
    patient.handle_timeout(t0 + timeout * 100);
    assert!(patient.session().error().is_none());
    // A handshake that finished is never timed out, however long the connection lives.
    let (c, s) = setups(false);
    let mut p = Pair::new(c, s);
    p.pump();
    assert!(p.client.is_established() && p.server.is_established());
    for c in [&mut p.client, &mut p.server] {
        c.handle_timeout(p.now + timeout * 3);
        assert!(c.session().error().is_none());
    }
}

#[test]
fn a_tls_side_that_does_not_match_the_role_is_refused() {
    let (c, _) = setups(false);
    let mut config = Config::default();
    config.tls = Some(c);
    assert!(Connection::new(Role::Server, config.clone(), Substrate::byte_stream()).is_err());
    // On the uTCP interface too (tests/utls.rs): the role is what is checked.
    assert!(Connection::new(Role::Client, config, Substrate::utcp(65536)).is_ok());
}

#[test]
fn frames_of_any_size_are_sealed_where_they_are_written() {
    // Records are filled in place, stream chunks cut to each record's room, frames longer
    // than the room left carried into the next record: messages of every size around and
    // beyond a record's 16 KiB, and a stream, arrive intact and in order.
    let (c, s) = setups(false);
    let mut p = Pair::new(c, s);
    p.pump();
    assert!(p.client.is_established() && p.server.is_established());
    let handshake_up = p.wire_up.len();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let stream = p.client.session_mut().open_stream().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut written = 0;
    let mut sent = Vec::new();
    for round in 0..400 {
        match next(4) {
            0 | 1 => {
                let len = match next(4) {
                    0 => next(64) as usize,
                    1 => 16_300 + next(200) as usize,
                    2 => next(70_000) as usize,
                    _ => next(2_000) as usize,
                };
                let m: Vec<u8> = (0..len).map(|i| (i as u64 + round) as u8).collect();
                if p.client
                    .session_mut()
                    .send_message(p.now, m.clone(), MessageProps::default())
                    .is_ok()
                {
                    sent.push(m);
                }
            }
            2 if written < data.len() => {
                let end = (written + next(100_000) as usize).min(data.len());
                written += p
                    .client
                    .session_mut()
                    .stream_write(stream, &data[written..end])
                    .unwrap();
            }
            _ => p.pump(),
        }
    }
    p.pump();
    assert_eq!(messages(&mut p.server), sent);
    let incoming = p.server.session_mut().accept_stream().unwrap();
    let mut read = Vec::new();
    let mut buf = vec![0; 65536];
    // Reading frees flow-control credit for the rest.
    for _ in 0..100 {
        while let Ok(ReadOutcome::Data(n)) = p.server.session_mut().stream_read(incoming, &mut buf)
        {
            read.extend_from_slice(&buf[..n]);
        }
        if read.len() == written {
            break;
        }
        p.pump();
    }
    assert_eq!(read.len(), written);
    assert!(read == data[..written], "the stream's bytes differ");

    // Every record within TLS 1.3's limit; most of the bulk in full ones.
    let up = records(&p.wire_up[handshake_up..]);
    assert!(up.iter().all(|&(_, _, len)| len <= 16384 + 256));
    let stats = p.client.stats().tls.unwrap();
    let full = up.iter().filter(|&&(_, _, len)| len >= 16384).count();
    assert!(
        full as u64 * 16384 * 10 >= stats.bytes_sealed * 8,
        "{full} full records of {} for {} bytes",
        up.len(),
        stats.bytes_sealed
    );
}
