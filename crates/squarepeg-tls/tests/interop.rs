//! squarepeg's endpoints against stock rustls (the ordinary buffered `ClientConnection` and
//! `ServerConnection`), both roles, every suite: bytes identical both ways, key updates
//! initiated by each side mid-transfer, close_notify both ways, session resumption.

mod common;

use common::*;
use squarepeg_tls::Tls;
use squarepeg_tls::config::TLS13_SUITES;
use squarepeg_tls::rustls::{self, HandshakeKind, pki_types::ServerName};

const CHUNK: usize = 7000;
const CHUNKS: usize = 40;

/// Moves `CHUNKS` chunks each way; squarepeg initiates a key update (with request) a third of
/// the way, the stock side (`refresh_traffic_keys`, which requests one back) two thirds of
/// the way; ends with close_notify both ways.
fn transfer<D>(ours: &mut Tls, stock: &mut rustls::ConnectionCommon<D>) {
    let mut sent_by_us = Vec::new();
    let mut sent_by_stock = Vec::new();
    let mut got_by_us = Vec::new();
    let mut got_by_stock = Vec::new();
    for i in 0..CHUNKS {
        if i == CHUNKS / 3 {
            ours.initiate_key_update(true);
        }
        if i == 2 * CHUNKS / 3 {
            stock.refresh_traffic_keys().unwrap();
        }
        let up = data(CHUNK + i, i as u8);
        let mut wire = Vec::new();
        ours.poll_output(&mut wire);
        ours.seal(&up, &mut wire).unwrap();
        sent_by_us.extend_from_slice(&up);
        let (plain, _) = stock_input(stock, &wire).unwrap();
        got_by_stock.extend(plain);

        let down = data(CHUNK - i, 0x40 ^ i as u8);
        stock_write(stock, &down);
        sent_by_stock.extend_from_slice(&down);
        let wire = stock_output(stock);
        got_by_us.extend(feed(ours, &wire, 4096).unwrap());
    }
    let rest = pump_stock(ours, stock).unwrap();
    got_by_stock.extend(rest.to_stock);
    got_by_us.extend(rest.to_squarepeg);
    assert_eq!(got_by_stock, sent_by_us);
    assert_eq!(got_by_us, sent_by_stock);
    // Ours, the answer to stock's request; stock's, the answer to ours.
    assert_eq!(ours.stats().key_updates_sent, 2);
    assert_eq!(ours.stats().key_updates_received, 2);

    ours.send_close_notify();
    let closing = pump_stock(ours, stock).unwrap();
    assert!(closing.stock_saw_close);
    stock.send_close_notify();
    let closing = pump_stock(ours, stock).unwrap();
    assert!(closing.to_squarepeg.is_empty());
    assert!(ours.peer_closed());
}

/// The handshake each round must make: full first, then resumed with a ticket the first
/// connection received after its handshake.
fn kind_of_round(round: usize) -> HandshakeKind {
    if round == 0 {
        HandshakeKind::Full
    } else {
        HandshakeKind::Resumed
    }
}

#[test]
fn squarepeg_client_with_stock_server() {
    for suite in TLS13_SUITES {
        let setup = setup(&[suite]);
        for round in 0..2 {
            let mut stock = rustls::ServerConnection::new(setup.server.clone()).unwrap();
            let mut ours = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
            ours.set_padding_granularity(if round == 0 { 0 } else { 256 });
            // The stock server sends data as soon as it can (after its Finished, before the
            // client's): it arrives in the same read as the handshake's end.
            let early = data(3000, 0xaa);
            stock_write(&mut stock, &early);
            let delivered = pump_stock(&mut ours, &mut stock).unwrap();
            assert!(!ours.is_handshaking() && !stock.is_handshaking());
            assert_eq!(delivered.to_squarepeg, early);
            assert_eq!(ours.negotiated_suite(), Some(suite));
            assert_eq!(stock.negotiated_cipher_suite(), Some(suite));
            // The second connection resumes with a ticket the first received after its
            // handshake, through squarepeg's record layer.
            let kind = kind_of_round(round);
            assert_eq!(
                stock.handshake_kind(),
                Some(kind),
                "{suite:?} round {round}"
            );
            assert_eq!(ours.handshake_kind(), Some(kind));
            transfer(&mut ours, &mut stock);
        }
    }
}

#[test]
fn stock_client_with_squarepeg_server() {
    for suite in TLS13_SUITES {
        let setup = setup(&[suite]);
        for round in 0..2 {
            let name = ServerName::try_from(SERVER_NAME).unwrap();
            let mut stock = rustls::ClientConnection::new(setup.client.clone(), name).unwrap();
            let mut ours = Tls::server(setup.server.clone()).unwrap();
            ours.set_padding_granularity(if round == 0 { 0 } else { 100 });
            // The stock client sends its first data right after its Finished, in one write.
            let early = data(5000, 0xbb);
            stock_write(&mut stock, &early);
            let delivered = pump_stock(&mut ours, &mut stock).unwrap();
            assert!(!ours.is_handshaking() && !stock.is_handshaking());
            assert_eq!(delivered.to_squarepeg, early);
            assert!(delivered.to_stock.is_empty());
            assert_eq!(ours.negotiated_suite(), Some(suite));
            let kind = kind_of_round(round);
            assert_eq!(
                stock.handshake_kind(),
                Some(kind),
                "{suite:?} round {round}"
            );
            assert_eq!(ours.handshake_kind(), Some(kind));
            assert_eq!(ours.stats().bytes_opened, early.len() as u64);
            transfer(&mut ours, &mut stock);
        }
    }
}
