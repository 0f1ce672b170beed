//! Helpers shared by the integration tests: in-memory pairs of endpoints, squarepeg's and
//! stock rustls's, and byte pumps between them.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::sync::Arc;

use squarepeg_tls::config::{self, SelfSigned, Trust};
use squarepeg_tls::rustls::{self, ClientConfig, ServerConfig, SupportedCipherSuite};
use squarepeg_tls::{Tls, TlsError};

pub const SERVER_NAME: &str = "peg.test";

/// A self-signed certificate for [`SERVER_NAME`] and configurations that trust it by pin.
pub struct Setup {
    pub cert: SelfSigned,
    pub client: Arc<ClientConfig>,
    pub server: Arc<ServerConfig>,
}

pub fn setup(suites: &[SupportedCipherSuite]) -> Setup {
    let cert = config::self_signed(&[SERVER_NAME.to_string()]).unwrap();
    let client =
        config::client_config_with_suites(Trust::PinnedSha256(cert.fingerprint), suites).unwrap();
    let server = config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap();
    Setup {
        cert,
        client,
        server,
    }
}

pub fn default_setup() -> Setup {
    setup(&config::TLS13_SUITES)
}

/// Pushes all of `bytes` into `tls` in pieces of at most `piece` bytes, processing between
/// pushes, and returns the plaintext.
pub fn feed(tls: &mut Tls, mut bytes: &[u8], piece: usize) -> Result<Vec<u8>, TlsError> {
    let mut plaintext = Vec::new();
    while !bytes.is_empty() {
        let n = tls.push_ciphertext(&bytes[..piece.min(bytes.len())]);
        bytes = &bytes[n..];
        tls.process(&mut plaintext)?;
    }
    tls.process(&mut plaintext)?;
    Ok(plaintext)
}

/// Feeds `bytes` to `tls` through [`Tls::process_buffer`] in reads of the sizes `reads`
/// cycles through (each at least 1), each into the buffer the previous call left, until
/// the first error. Returns the plaintext delivered and the last result. Panics if a call
/// leaves a shorter buffer; the buffer past each read holds filler the record layer must not
/// take for data.
pub fn read_in_place(
    tls: &mut Tls,
    bytes: &[u8],
    reads: &[usize],
) -> (Vec<u8>, Result<(), TlsError>) {
    let mut plaintext = Vec::new();
    let mut buf = vec![0u8; 1024];
    let (mut at, mut result) = (0, Ok(()));
    for &size in reads.iter().cycle() {
        if at == bytes.len() || result.is_err() {
            break;
        }
        let n = size.max(1).min(bytes.len() - at);
        if buf.len() < n {
            buf.resize(n, 0);
        }
        buf[..n].copy_from_slice(&bytes[at..at + n]);
        buf[n..].fill(0xa5);
        at += n;
        let before = buf.len();
        result = tls.process_buffer(&mut buf, n, &mut |p| plaintext.extend_from_slice(p));
        assert!(
            buf.len() >= before,
            "the buffer left for the next read shrank"
        );
    }
    (plaintext, result)
}

/// Moves bytes between two squarepeg endpoints until neither has anything to say; each
/// read is delivered whole. Returns the plaintext each received.
pub fn pump(client: &mut Tls, server: &mut Tls) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let mut to_client = Vec::new();
    let mut to_server = Vec::new();
    for _ in 0..100 {
        let mut c = Vec::new();
        client.poll_output(&mut c);
        let mut s = Vec::new();
        server.poll_output(&mut s);
        if c.is_empty() && s.is_empty() {
            return Ok((to_client, to_server));
        }
        to_server.extend(feed(server, &c, usize::MAX)?);
        to_client.extend(feed(client, &s, usize::MAX)?);
    }
    panic!("endpoints kept talking");
}

/// The server's first flight, after it took the client's ClientHello whole.
pub fn server_flight(client: &mut Tls, server: &mut Tls) -> Vec<u8> {
    let mut hello = Vec::new();
    client.poll_output(&mut hello);
    feed(server, &hello, usize::MAX).unwrap();
    let mut flight = Vec::new();
    server.poll_output(&mut flight);
    flight
}

/// A squarepeg client and server with a finished handshake.
pub fn connected(setup: &Setup) -> (Tls, Tls) {
    let mut client = Tls::client(setup.client.clone(), SERVER_NAME).unwrap();
    let mut server = Tls::server(setup.server.clone()).unwrap();
    let (a, b) = pump(&mut client, &mut server).unwrap();
    assert!(a.is_empty() && b.is_empty());
    assert!(!client.is_handshaking() && !server.is_handshaking());
    (client, server)
}

/// Seals `data` on `from` and returns the bytes on the wire (with any pending output first).
pub fn sealed(from: &mut Tls, data: &[u8]) -> Vec<u8> {
    let mut wire = Vec::new();
    from.poll_output(&mut wire);
    from.seal(data, &mut wire).unwrap();
    wire
}

/// Deterministic test data.
pub fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(7) as u8 ^ seed)
        .collect()
}

/// Everything a stock rustls connection has to write.
pub fn stock_output<D>(conn: &mut rustls::ConnectionCommon<D>) -> Vec<u8> {
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Feeds bytes to a stock rustls connection and returns the plaintext it yields and whether
/// the peer has closed.
pub fn stock_input<D>(
    conn: &mut rustls::ConnectionCommon<D>,
    mut bytes: &[u8],
) -> Result<(Vec<u8>, bool), rustls::Error> {
    let mut plaintext = Vec::new();
    let mut closed = false;
    loop {
        if !bytes.is_empty() {
            conn.read_tls(&mut bytes).unwrap();
        }
        let state = conn.process_new_packets()?;
        closed |= state.peer_has_closed();
        let mut buf = vec![0u8; state.plaintext_bytes_to_read()];
        if !buf.is_empty() {
            conn.reader().read_exact(&mut buf).unwrap();
            plaintext.extend_from_slice(&buf);
        }
        if bytes.is_empty() {
            return Ok((plaintext, closed));
        }
    }
}

/// Writes plaintext into a stock rustls connection.
pub fn stock_write<D>(conn: &mut rustls::ConnectionCommon<D>, data: &[u8]) {
    conn.writer().write_all(data).unwrap();
}

/// What a pump between squarepeg and stock rustls delivered.
#[derive(Default, Debug)]
pub struct Delivered {
    pub to_squarepeg: Vec<u8>,
    pub to_stock: Vec<u8>,
    pub stock_saw_close: bool,
}

/// Moves bytes between a squarepeg endpoint and a stock rustls one until both are quiet.
pub fn pump_stock<D>(
    ours: &mut Tls,
    stock: &mut rustls::ConnectionCommon<D>,
) -> Result<Delivered, String> {
    let mut delivered = Delivered::default();
    for _ in 0..100 {
        let mut mine = Vec::new();
        ours.poll_output(&mut mine);
        let theirs = stock_output(stock);
        if mine.is_empty() && theirs.is_empty() {
            return Ok(delivered);
        }
        let (plain, closed) = stock_input(stock, &mine).map_err(|e| format!("stock: {e}"))?;
        delivered.to_stock.extend(plain);
        delivered.stock_saw_close |= closed;
        delivered
            .to_squarepeg
            .extend(feed(ours, &theirs, usize::MAX).map_err(|e| format!("squarepeg: {e}"))?);
    }
    panic!("endpoints kept talking");
}
