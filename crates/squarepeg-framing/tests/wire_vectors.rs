//! Checks every test vector in docs/wire.md §1.4 and §3.1 against the code,
//! encoding and decoding, so that the document and the implementation cannot
//! drift.

use std::collections::BTreeMap;
use std::path::Path;

use squarepeg_framing::{
    Frame, FrameError, FrameHeader, FrameReader, HeaderError, Reassembler, StreamDecoder, cobs,
    decode_frame, encode_frame, encode_padding, encode_plain_frame,
};

/// The `vector` blocks of the document, as key/value maps.
fn vectors() -> Vec<BTreeMap<String, String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/wire.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    let mut block: Option<Vec<&str>> = None;
    for line in doc.lines() {
        match (&mut block, line.trim_end()) {
            (None, "```vector") => block = Some(Vec::new()),
            (Some(lines), "```") => {
                out.push(parse_block(lines));
                block = None;
            }
            (Some(lines), l) => lines.push(l),
            (None, _) => {}
        }
    }
    assert!(block.is_none(), "unterminated vector block");
    out
}

fn parse_block(lines: &[&str]) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in lines {
        if line.starts_with(' ') {
            let key = last.as_ref().expect("continuation line before any field");
            let value: &mut String = fields.get_mut(key).unwrap();
            value.push(' ');
            value.push_str(line.trim());
        } else {
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let key = key.trim().to_string();
            fields.insert(key.clone(), value.trim().to_string());
            last = Some(key);
        }
    }
    fields
}

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|t| u8::from_str_radix(t, 16).unwrap_or_else(|_| panic!("bad hex byte {t:?}")))
        .collect()
}

fn header(spec: &str) -> FrameHeader {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let num = |i: usize| -> u64 { words[i].parse().unwrap() };
    match words[0] {
        "message" => FrameHeader::Message {
            substream: num(1),
            number: num(2),
        },
        "stream-chunk" => FrameHeader::StreamChunk {
            stream: num(1),
            offset: num(2),
            fin: words.get(3) == Some(&"fin"),
        },
        "padding" => FrameHeader::Padding,
        "control" => FrameHeader::Control,
        "switch" => FrameHeader::Switch { format: num(1) },
        other => panic!("unknown header kind {other:?}"),
    }
}

fn error_name(e: &FrameError) -> &'static str {
    match e {
        FrameError::ChecksumMismatch { .. } => "checksum-mismatch",
        FrameError::Header(HeaderError::UnsupportedVersion(_)) => "unsupported-version",
        FrameError::Header(HeaderError::UnknownKind(_)) => "unknown-kind",
        FrameError::Header(HeaderError::ReservedFlags(_)) => "reserved-flags",
        FrameError::Header(_) => "bad-header",
        FrameError::Cobs(_) => "bad-encoding",
        FrameError::TooShort => "too-short",
        FrameError::Oversize { .. } => "oversize",
        FrameError::OffsetOverflow => "offset-overflow",
        FrameError::GarbageBeforeMarker => "garbage-before-marker",
        FrameError::TlsRecord => "tls-record",
    }
}

/// What a decoder yields: frames, or errors.
type Found = Vec<Result<Frame, FrameError>>;

/// The frames an in-order decoder and a reassembler find in `wire`.
fn found(wire: &[u8]) -> (Found, Found) {
    let mut d = StreamDecoder::new(1 << 16);
    d.push(wire);
    let in_order = std::iter::from_fn(|| d.next_frame()).collect();
    let mut r = Reassembler::new(1 << 16, 1 << 20).unwrap();
    r.insert(0, wire).unwrap();
    let any_order = std::iter::from_fn(|| r.next_frame())
        .map(|x| x.map(|f| f.frame).map_err(|e| e.error))
        .collect();
    (in_order, any_order)
}

/// Everything a reader that accepts plain frames finds in `wire`, fed `cut` bytes at a time.
fn read_all(wire: &[u8], cut: usize) -> Found {
    let mut r = FrameReader::with_buffers(1 << 16, 1024, 1 << 20);
    r.accept_plain(true);
    let mut out = Vec::new();
    for piece in wire.chunks(cut) {
        r.push(piece);
        out.extend(std::iter::from_fn(|| r.next_frame()));
    }
    out
}

#[test]
fn wire_md_vectors_match_the_code() {
    let vectors = vectors();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for v in &vectors {
        let ty = v["type"].as_str();
        *counts.entry(ty.to_string()).or_default() += 1;
        match ty {
            "header" => {
                let h = header(&v["header"]);
                let bytes = hex(&v["hex"]);
                let mut enc = Vec::new();
                h.encode(&mut enc).unwrap();
                assert_eq!(enc, bytes, "{v:?}");
                assert_eq!(FrameHeader::decode(&bytes), Ok((h, bytes.len())), "{v:?}");
            }
            "cobs" => {
                let raw = hex(&v["raw"]);
                let encoded = hex(&v["encoded"]);
                let mut enc = Vec::new();
                cobs::encode(&raw, &mut enc);
                assert_eq!(enc, encoded, "{v:?}");
                let mut dec = Vec::new();
                cobs::decode(&encoded, &mut dec).unwrap();
                assert_eq!(dec, raw, "{v:?}");
            }
            "frame" => {
                let h = header(&v["header"]);
                let payload = hex(&v["payload"]);
                let wire = hex(&v["wire"]);
                let mut body = Vec::new();
                h.encode(&mut body).unwrap();
                body.extend_from_slice(&payload);
                let crc = u32::from_str_radix(&v["crc"], 16).unwrap();
                assert_eq!(crc32c::crc32c(&body), crc, "{v:?}");
                let mut enc = Vec::new();
                assert_eq!(encode_frame(&h, &payload, &mut enc), Ok(wire.len()));
                assert_eq!(enc, wire, "{v:?}");
                let frame = Frame {
                    header: h,
                    payload: payload.into(),
                };
                assert_eq!(
                    decode_frame(&wire[1..wire.len() - 1], 1 << 16),
                    Ok(frame.clone())
                );
                let (a, b) = found(&wire);
                assert_eq!(a, [Ok(frame.clone())]);
                assert_eq!(b, [Ok(frame)]);
            }
            "padding" => {
                let len: usize = v["length"].parse().unwrap();
                let wire = hex(&v["wire"]);
                let mut enc = Vec::new();
                encode_padding(len, &mut enc);
                assert_eq!(enc, wire, "{v:?}");
                let (a, b) = found(&wire);
                assert_eq!(a, b);
                assert!(a.iter().all(|f| matches!(
                    f,
                    Ok(Frame {
                        header: FrameHeader::Padding,
                        ..
                    })
                )));
            }
            "reject" => {
                let wire = hex(&v["wire"]);
                let err = decode_frame(&wire[1..wire.len() - 1], 1 << 16).unwrap_err();
                assert_eq!(error_name(&err), v["error"], "{v:?}");
                let (a, b) = found(&wire);
                assert_eq!(a, [Err(err)]);
                assert_eq!(b, [Err(err)]);
            }
            "plain" => {
                let h = header(&v["header"]);
                let payload = hex(&v["payload"]);
                let wire = hex(&v["wire"]);
                let mut enc = Vec::new();
                assert_eq!(encode_plain_frame(&h, &payload, &mut enc), Ok(wire.len()));
                assert_eq!(enc, wire, "{v:?}");
                // Decoded after a switch, cut at every byte.
                let mut stream = Vec::new();
                encode_frame(&FrameHeader::Switch { format: 1 }, &[], &mut stream).unwrap();
                let switch_len = stream.len();
                stream.extend_from_slice(&wire);
                for cut in [1, 2, 3, stream.len()] {
                    let got = read_all(&stream, cut);
                    assert_eq!(got.len(), 2, "{v:?}");
                    assert_eq!(
                        got[1],
                        Ok(Frame {
                            header: h,
                            payload: payload.clone().into()
                        }),
                        "cut {cut}: {v:?}"
                    );
                }
                assert!(switch_len > 0);
            }
            "switch" => {
                let wire = hex(&v["wire"]);
                let expected: Vec<Frame> = v["frames"]
                    .split(';')
                    .map(|f| {
                        let (h, p) = f.split_once(':').expect("header : payload");
                        Frame {
                            header: header(h),
                            payload: hex(p).into(),
                        }
                    })
                    .collect();
                for cut in 1..=wire.len() {
                    let got: Vec<Frame> = read_all(&wire, cut)
                        .into_iter()
                        .map(|f| f.unwrap_or_else(|e| panic!("cut {cut}: {e}")))
                        .collect();
                    assert_eq!(got, expected, "cut {cut}");
                }
            }
            // Frames inside TLS records (§4): checked by squarepeg-connection's tests, which
            // have the record layer.
            "tls-record" => {}
            other => panic!("unknown vector type {other:?}"),
        }
    }
    // The document must keep vectors of every kind.
    for (ty, min) in [
        ("header", 6),
        ("cobs", 3),
        ("frame", 4),
        ("padding", 3),
        ("reject", 2),
        ("plain", 3),
        ("switch", 1),
    ] {
        assert!(
            counts.get(ty).copied().unwrap_or(0) >= min,
            "too few {ty} vectors: {counts:?}"
        );
    }
}
