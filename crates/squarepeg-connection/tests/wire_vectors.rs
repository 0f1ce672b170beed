//! Checks the TLS record vectors of docs/wire.md §4 (squarepeg frames inside TLS 1.3 records)
//! against the frame encoder and the record layer, sealing and opening, so that the document
//! and the implementation cannot drift.

use std::collections::BTreeMap;
use std::path::Path;

use squarepeg_framing::{FrameHeader, FrameReader, encode_plain_frame};
use squarepeg_tls::record::RecordKeys;
use squarepeg_tls::rustls::ConnectionTrafficSecrets;
use squarepeg_tls::rustls::crypto::cipher::{AeadKey, Iv};

/// The `vector` blocks of type `tls-record`, as key/value maps.
fn vectors() -> Vec<BTreeMap<String, String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/wire.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    let mut block: Option<BTreeMap<String, String>> = None;
    let mut last = String::new();
    for line in doc.lines() {
        match (&mut block, line.trim_end()) {
            (None, "```vector") => block = Some(BTreeMap::new()),
            (Some(b), "```") => {
                if b.get("type").map(String::as_str) == Some("tls-record") {
                    out.push(std::mem::take(b));
                }
                block = None;
            }
            (Some(b), l) if l.starts_with(' ') => {
                let v = b.get_mut(&last).unwrap();
                v.push(' ');
                v.push_str(l.trim());
            }
            (Some(b), l) => {
                let (k, v) = l.split_once('=').unwrap();
                last = k.trim().to_string();
                b.insert(last.clone(), v.trim().to_string());
            }
            (None, _) => {}
        }
    }
    out
}

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|t| u8::from_str_radix(t, 16).unwrap())
        .collect()
}

fn keys(suite: &str, key: &[u8], iv: &[u8]) -> RecordKeys {
    let key: [u8; 32] = key.try_into().expect("32-byte keys in the vectors");
    let iv = Iv::from(<[u8; 12]>::try_from(iv).unwrap());
    let secrets = match suite {
        "chacha20-poly1305" => ConnectionTrafficSecrets::Chacha20Poly1305 {
            key: AeadKey::from(key),
            iv,
        },
        "aes-256-gcm" => ConnectionTrafficSecrets::Aes256Gcm {
            key: AeadKey::from(key),
            iv,
        },
        other => panic!("unknown suite {other:?}"),
    };
    RecordKeys::from_secrets(&secrets).unwrap()
}

/// The message of the vectors: sub-stream 2, number 0, `hello`.
const VECTOR_MESSAGE: FrameHeader = FrameHeader::Message {
    substream: 2,
    number: 0,
};

/// The plaintext of the vectors: PARAMS (empty) and the message, as plain frames (§3).
fn vector_plaintext() -> Vec<u8> {
    let mut plaintext = Vec::new();
    encode_plain_frame(&FrameHeader::Control, &[0x01], &mut plaintext).unwrap();
    encode_plain_frame(&VECTOR_MESSAGE, b"hello", &mut plaintext).unwrap();
    plaintext
}

#[test]
fn wire_md_tls_record_vectors_match_the_code() {
    let vectors = vectors();
    assert!(vectors.len() >= 2, "docs/wire.md §4 lost its vectors");
    for v in &vectors {
        let keys = keys(&v["suite"], &hex(&v["key"]), &hex(&v["iv"]));
        let seq: u64 = v["seq"].parse().unwrap();
        let plaintext = vector_plaintext();
        assert_eq!(plaintext, hex(&v["plaintext"]), "{v:?}");
        let mut record = Vec::new();
        keys.seal(seq, 23, &plaintext, &mut record);
        assert_eq!(record, hex(&v["record"]), "{v:?}");
        // Opening gives the frames back.
        let (content_type, opened) = keys.open_in_place(seq, &mut record).unwrap();
        assert_eq!(content_type, 23);
        let mut reader = FrameReader::new(1 << 16);
        reader.start_plain();
        reader.push(opened);
        let frames: Vec<_> = std::iter::from_fn(|| reader.next_frame())
            .map(Result::unwrap)
            .collect();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].header, VECTOR_MESSAGE);
        assert_eq!(&frames[1].payload[..], b"hello");
    }
}

/// Prints the vectors' records (to write them into docs/wire.md): `cargo test -p
/// squarepeg-connection --test wire_vectors -- --ignored --nocapture`.
#[test]
#[ignore = "prints vectors for docs/wire.md"]
fn print_vectors() {
    for suite in ["chacha20-poly1305", "aes-256-gcm"] {
        let key: Vec<u8> = (0..32).collect();
        let iv: Vec<u8> = (0xa0..0xac).collect();
        let keys = keys(suite, &key, &iv);
        let plaintext = vector_plaintext();
        let mut record = Vec::new();
        keys.seal(1, 23, &plaintext, &mut record);
        let h = |b: &[u8]| {
            b.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{suite}\nplaintext = {}\nrecord = {}",
            h(&plaintext),
            h(&record)
        );
    }
}
