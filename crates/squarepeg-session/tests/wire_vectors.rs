//! Checks the control-frame test vectors of docs/wire.md §2 against the
//! encoder and decoder. Each vector line in the §2 "Test vectors" block is
//! `NAME  HEX`: NAME names a frame below, HEX is its control body (or, for
//! names starting with `frame:`, the whole uCOBS frame on the wire).

use squarepeg_framing::{DEFAULT_MAX_BODY, FrameHeader, decode_frame, encode_frame};
use squarepeg_session::control::{ControlFrame, Params};

fn expected() -> Vec<(&'static str, ControlFrame)> {
    vec![
        (
            "PARAMS initial_max_data=16777216 initial_max_stream_data=1048576 initial_max_streams=100",
            ControlFrame::Params(Params {
                initial_max_data: Some(16_777_216),
                initial_max_stream_data: Some(1_048_576),
                initial_max_streams: Some(100),
                receive_formats: None,
                record_numbers: None,
            }),
        ),
        ("PARAMS (empty)", ControlFrame::Params(Params::default())),
        (
            "PARAMS receive_formats=0b11",
            ControlFrame::Params(Params {
                receive_formats: Some(0b11),
                ..Params::default()
            }),
        ),
        (
            "PARAMS record_numbers=0b11",
            ControlFrame::Params(Params {
                record_numbers: Some(0b11),
                ..Params::default()
            }),
        ),
        (
            "PARAMS record_numbers=0b111",
            ControlFrame::Params(Params {
                record_numbers: Some(0b111),
                ..Params::default()
            }),
        ),
        ("MAX_DATA 1048576", ControlFrame::MaxData(1_048_576)),
        (
            "MAX_STREAM_DATA stream=5 max=70000",
            ControlFrame::MaxStreamData {
                stream: 5,
                max: 70_000,
            },
        ),
        ("MAX_STREAMS 101", ControlFrame::MaxStreams(101)),
        (
            "RESET_STREAM stream=4 code=9 final_size=1000",
            ControlFrame::ResetStream {
                stream: 4,
                code: 9,
                final_size: 1000,
            },
        ),
        (
            "STOP_SENDING stream=1 code=2",
            ControlFrame::StopSending { stream: 1, code: 2 },
        ),
        (
            "CLOSE code=0x03 reason=\"flow\"",
            ControlFrame::Close {
                code: 3,
                reason: b"flow".to_vec(),
            },
        ),
        (
            "APPLICATION_CLOSE code=0 reason=\"\"",
            ControlFrame::ApplicationClose {
                code: 0,
                reason: vec![],
            },
        ),
        (
            "RECORDS_REPLACED start=70000 len=254",
            ControlFrame::RecordsReplaced {
                start: 70_000,
                len: 254,
            },
        ),
        (
            "PATH_ACK received=70000",
            ControlFrame::PathAck { received: 70_000 },
        ),
        ("PATH_PROBE", ControlFrame::PathProbe),
        (
            "ADD_ADDRESS id=1 192.0.2.7:443",
            ControlFrame::AddAddress {
                id: 1,
                addr: "192.0.2.7:443".parse().unwrap(),
            },
        ),
        (
            "ADD_ADDRESS id=2 [2001:db8::1]:8443",
            ControlFrame::AddAddress {
                id: 2,
                addr: "[2001:db8::1]:8443".parse().unwrap(),
            },
        ),
        ("REMOVE_ADDRESS id=1", ControlFrame::RemoveAddress { id: 1 }),
        ("frame: MAX_DATA 1048576", ControlFrame::MaxData(1_048_576)),
        (
            "frame: APPLICATION_CLOSE code=0 reason=\"\"",
            ControlFrame::ApplicationClose {
                code: 0,
                reason: vec![],
            },
        ),
    ]
}

fn encode(name: &str, f: &ControlFrame) -> Vec<u8> {
    let mut body = Vec::new();
    f.encode(&mut body).unwrap();
    if name.starts_with("frame:") {
        let mut wire = Vec::new();
        encode_frame(&FrameHeader::Control, &body, &mut wire).unwrap();
        wire
    } else {
        body
    }
}

/// The vector lines of §2: between "## 2." and the next "## " heading, in
/// the first ```text block after a "Test vectors" heading.
fn doc_vectors() -> Vec<(String, Vec<u8>)> {
    let doc = include_str!("../../../docs/wire.md");
    let start = doc.find("\n## 2.").expect("wire.md has a §2");
    let rest = &doc[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    let section = &rest[..end];
    let tv = section.find("Test vectors").expect("§2 has test vectors");
    let block = &section[tv..];
    let open = block.find("```text\n").expect("vector block") + 8;
    let close = block[open..].find("```").expect("vector block end") + open;
    block[open..close]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let split = l.find("  ").expect("NAME  HEX");
            let name = l[..split].trim().to_string();
            let hex: String = l[split..].split_whitespace().collect();
            (name, hex::decode(hex).expect("hex"))
        })
        .collect()
}

#[test]
fn wire_md_section_2_vectors() {
    let doc = doc_vectors();
    let exp = expected();
    let names: Vec<&str> = doc.iter().map(|(n, _)| n.as_str()).collect();
    let exp_names: Vec<&str> = exp.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, exp_names, "vector names in docs/wire.md §2");
    for ((name, bytes), (_, frame)) in doc.iter().zip(&exp) {
        assert_eq!(&encode(name, frame), bytes, "encoding of {name}");
        let body = if name.starts_with("frame:") {
            let f = decode_frame(&bytes[1..bytes.len() - 1], DEFAULT_MAX_BODY).unwrap();
            assert_eq!(f.header, FrameHeader::Control);
            f.payload.to_vec()
        } else {
            bytes.clone()
        };
        assert_eq!(
            &ControlFrame::decode(&body).unwrap(),
            frame,
            "decoding of {name}"
        );
    }
}

/// Prints the vectors in the doc's format (run with --nocapture --ignored
/// to regenerate the block).
#[test]
#[ignore]
fn print_vectors() {
    for (name, f) in expected() {
        let hex: Vec<String> = encode(name, &f)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!("{name:<44}  {}", hex.join(" "));
    }
}
