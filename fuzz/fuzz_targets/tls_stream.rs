//! squarepeg-tls's in-order byte-stream paths: records sealed where their plaintext was
//! written (`Tls::begin_record` / `finish_record`, what the connection core does over kernel
//! TCP) and opened where a read lies (`Tls::process_buffer`, what the kernel driver does),
//! driven by a fuzz-generated stream.
//!
//! A client and a server finish their handshake in process. The client seals the input's
//! pieces, each into records of at most `Tls::record_room` bytes written in place (with
//! KeyUpdates on the way when asked), or, for some, with `Tls::seal`; the server reads the
//! bytes in reads of the input's sizes, each into whatever buffer the previous call left,
//! after the input's changes (XORed bytes, a cut, inserted bytes).
//!
//! Always: no panic; the plaintext delivered is a prefix of what was sealed (nothing that
//! did not authenticate is ever delivered). Unchanged: no error, and all of it.
#![no_main]

#[path = "common/tls.rs"]
mod tls_setup;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use squarepeg_tls::Tls;
use tls_setup::{SERVER_NAME, configs};

#[derive(Arbitrary, Debug)]
struct Input {
    key_update_every: u8,
    /// Piece lengths; a length with the top bit set goes through `Tls::seal` instead.
    pieces: Vec<u16>,
    reads: Vec<u16>,
    flips: Vec<(u32, u8)>,
    cut: Option<u32>,
    insert: Option<(u32, Vec<u8>)>,
}

/// Moves handshake bytes until neither side has anything to say.
fn handshake(client: &mut Tls, server: &mut Tls) {
    for _ in 0..10 {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        client.poll_output(&mut c);
        server.poll_output(&mut s);
        if c.is_empty() && s.is_empty() {
            return;
        }
        let mut sink = Vec::new();
        server.push_ciphertext(&c);
        server.process(&mut sink).unwrap();
        client.push_ciphertext(&s);
        client.process(&mut sink).unwrap();
    }
}

fuzz_target!(|input: Input| {
    let (client_config, server_config) = configs();
    let mut client = Tls::client(client_config.clone(), SERVER_NAME).unwrap();
    let mut server = Tls::server(server_config.clone()).unwrap();
    handshake(&mut client, &mut server);
    if client.is_handshaking() || server.is_handshaking() {
        return;
    }
    if input.key_update_every > 0 {
        client.set_key_update_threshold(u64::from(input.key_update_every).max(2));
    }
    // The client's stream after the handshake.
    let mut wire = Vec::new();
    let mut sent = Vec::new();
    let mut byte = 0u8;
    for &piece in input.pieces.iter().take(64) {
        let len = usize::from(piece & 0x7fff);
        let data: Vec<u8> = (0..len)
            .map(|_| {
                byte = byte.wrapping_mul(31).wrapping_add(7);
                byte
            })
            .collect();
        if piece & 0x8000 != 0 {
            client.seal(&data, &mut wire).unwrap();
        } else {
            for chunk in data.chunks(client.record_room()) {
                let slot = client.begin_record(&mut wire).unwrap();
                wire.extend_from_slice(chunk);
                client.finish_record(&mut wire, slot, false, false);
            }
        }
        sent.extend_from_slice(&data);
    }
    let intact = input.flips.is_empty() && input.cut.is_none() && input.insert.is_none();
    for &(at, x) in input.flips.iter().take(8) {
        if !wire.is_empty() {
            let at = at as usize % wire.len();
            wire[at] ^= x | 1;
        }
    }
    if let Some(cut) = input.cut {
        wire.truncate(cut as usize % (wire.len() + 1));
    }
    if let Some((at, bytes)) = &input.insert {
        let at = *at as usize % (wire.len() + 1);
        wire.splice(at..at, bytes.iter().copied());
    }
    // The server reads it.
    let reads: Vec<usize> = input
        .reads
        .iter()
        .map(|&r| usize::from(r).max(1))
        .take(32)
        .collect();
    let reads = if reads.is_empty() {
        vec![65_536]
    } else {
        reads
    };
    let mut got = Vec::new();
    let mut buf = vec![0u8; 256];
    let (mut at, mut result) = (0, Ok(()));
    for &size in reads.iter().cycle() {
        if at == wire.len() || result.is_err() {
            break;
        }
        let n = size.min(wire.len() - at);
        if buf.len() < n {
            buf.resize(n, 0);
        }
        buf[..n].copy_from_slice(&wire[at..at + n]);
        at += n;
        let before = buf.len();
        result = server.process_buffer(&mut buf, n, &mut |p| got.extend_from_slice(p));
        assert!(buf.len() >= before, "the next read's buffer shrank");
    }
    assert!(
        got.len() <= sent.len() && got[..] == sent[..got.len()],
        "delivered bytes that were not sent there"
    );
    if intact {
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(got.len(), sent.len(), "not everything delivered");
    }
});
