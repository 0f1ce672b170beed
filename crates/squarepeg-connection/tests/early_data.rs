//! Transactions over TLS 1.3 early data at the connection core: a returning client's
//! replayable request goes with its ClientHello, the server's answer comes in its first
//! flight (one round trip), messages not marked replayable wait for the handshake, a
//! replayed first flight is not delivered again, and early data the server refuses is sent
//! again after the handshake and delivered once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use squarepeg_connection::{Config, Connection, EarlyData, Role, Substrate, TlsSetup};
use squarepeg_session::MessageProps;
use squarepeg_tls::config::{self, Trust};
use squarepeg_tls::rustls::{ClientConfig, ServerConfig};

struct Setup {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

fn setup() -> Setup {
    let cert = config::self_signed(&["peg.test".into()]).unwrap();
    let server = config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap();
    let client = config::client_config(Trust::PinnedSha256(cert.fingerprint)).unwrap();
    Setup {
        client: config::client_offering_early_data(&client),
        server: config::server_accepting_early_data(&server, 16 * 1024).unwrap(),
    }
}

fn client(s: &Setup) -> Connection {
    let mut config = Config::default();
    config.tls = Some(TlsSetup::Client {
        config: s.client.clone(),
        server_name: "peg.test".into(),
    });
    Connection::new(Role::Client, config, Substrate::byte_stream()).unwrap()
}

fn server(s: &Arc<ServerConfig>) -> Connection {
    let mut config = Config::default();
    config.tls = Some(TlsSetup::Server { config: s.clone() });
    Connection::new(Role::Server, config, Substrate::byte_stream()).unwrap()
}

fn replayable() -> MessageProps {
    MessageProps {
        safely_replayable: true,
        ..MessageProps::default()
    }
}

fn flight(c: &mut Connection, now: Instant) -> Vec<u8> {
    let mut out = Vec::new();
    c.poll_transmit(now, &mut out, 64 * 1024);
    out
}

fn messages(c: &mut Connection) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| c.session_mut().poll_message())
        .map(|m| m.payload.to_vec())
        .collect()
}

/// Runs one exchange to completion so that the client holds tickets from the server.
fn first_contact(s: &Setup, now: Instant) {
    let mut c = client(s);
    let mut srv = server(&s.server);
    c.session_mut()
        .send_message(now, b"first".to_vec(), replayable())
        .unwrap();
    for _ in 0..10 {
        let up = flight(&mut c, now);
        srv.handle_bytes(now, &up);
        let down = flight(&mut srv, now);
        c.handle_bytes(now, &down);
    }
    assert_eq!(messages(&mut srv), [b"first".to_vec()]);
    // First contact: nothing went early.
    assert_eq!(c.tls().unwrap().early_data(), EarlyData::None);
}

#[test]
fn returning_request_and_answer_take_one_round_trip() {
    let s = setup();
    let now = Instant::now();
    first_contact(&s, now);

    let mut c = client(&s);
    let request = b"GET /balance".to_vec();
    c.session_mut()
        .send_message(now, request.clone(), replayable())
        .unwrap();
    // Not replayable: waits for the handshake.
    c.session_mut()
        .send_message(now, b"transfer 100".to_vec(), MessageProps::default())
        .unwrap();

    // Flight 1, client -> server: ClientHello + early data.
    let up1 = flight(&mut c, now);
    let mut srv = server(&s.server);
    srv.handle_bytes(now, &up1);
    assert_eq!(
        messages(&mut srv),
        std::slice::from_ref(&request),
        "request before the handshake's end"
    );
    assert!(!srv.is_established());

    // Flight 2, server -> client: its handshake flight and the answer.
    srv.session_mut()
        .send_message(now, b"42".to_vec(), MessageProps::default())
        .unwrap();
    let down1 = flight(&mut srv, now);
    c.handle_bytes(now, &down1);
    assert!(c.is_established());
    assert_eq!(
        messages(&mut c),
        [b"42".to_vec()],
        "the answer after one round trip"
    );
    assert_eq!(
        c.tls().unwrap().early_data(),
        EarlyData::Accepted(c.tls().unwrap().stats().early_data_sent as usize)
    );

    // The rest: Finished, then the message that was not replayable, once.
    let up2 = flight(&mut c, now + Duration::from_millis(1));
    srv.handle_bytes(now, &up2);
    assert!(srv.is_established());
    assert_eq!(messages(&mut srv), [b"transfer 100".to_vec()]);
    let down2 = flight(&mut srv, now);
    c.handle_bytes(now, &down2);
    assert!(messages(&mut c).is_empty());
    assert!(matches!(srv.tls().unwrap().early_data(), EarlyData::Received(n) if n > 0));

    // A copy of flight 1 sent to the server again delivers nothing: the ticket was single
    // use, so it gets a full handshake the copier cannot finish.
    let mut replayed = server(&s.server);
    replayed.handle_bytes(now, &up1);
    assert!(messages(&mut replayed).is_empty());
    assert_eq!(replayed.tls().unwrap().early_data(), EarlyData::None);
    let answer = flight(&mut replayed, now);
    assert!(!answer.is_empty());
    assert!(!replayed.is_established());
}

#[test]
fn refused_early_data_is_sent_again_and_delivered_once() {
    let s = setup();
    let now = Instant::now();
    first_contact(&s, now);
    // The same ticket store, but early data refused now.
    let mut refusing = (*s.server).clone();
    refusing.max_early_data_size = 0;
    let refusing = Arc::new(refusing);

    let mut c = client(&s);
    for i in 0..3u8 {
        c.session_mut()
            .send_message(now, vec![i; 100], replayable())
            .unwrap();
    }
    let mut srv = server(&refusing);
    for _ in 0..10 {
        let up = flight(&mut c, now);
        srv.handle_bytes(now, &up);
        let down = flight(&mut srv, now);
        c.handle_bytes(now, &down);
    }
    assert!(matches!(c.tls().unwrap().early_data(), EarlyData::Rejected(n) if n > 0));
    assert_eq!(
        messages(&mut srv),
        [vec![0u8; 100], vec![1u8; 100], vec![2u8; 100]]
    );
}

#[test]
fn clients_without_early_data_are_unchanged() {
    // A client config without early data makes its ClientHello at once, as before.
    let s = setup();
    let plain = config::client_config(Trust::Insecure).unwrap();
    let mut config = Config::default();
    config.tls = Some(TlsSetup::Client {
        config: plain,
        server_name: "peg.test".into(),
    });
    let mut c = Connection::new(Role::Client, config, Substrate::byte_stream()).unwrap();
    assert!(!c.tls().unwrap().is_hello_pending());
    let now = Instant::now();
    c.session_mut()
        .send_message(now, b"x".to_vec(), replayable())
        .unwrap();
    let mut srv = server(&s.server);
    let up = flight(&mut c, now);
    srv.handle_bytes(now, &up);
    assert!(messages(&mut srv).is_empty());
}
