//! Reassembler driven by a fuzz-generated sequence of inserts.
//!
//! A stream of frames is built from the input and cut into (offset, bytes)
//! inserts in the order the input gives, with duplicates and overlaps; some
//! inserts carry corrupted or arbitrary bytes. Always: no panic, memory
//! within the limit, only typed errors. With only clean stream bytes:
//! every yielded frame is a sent frame at its offset, none twice, no error;
//! and after a final in-order pass every sent frame has been yielded.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use squarepeg_framing::{
    Frame, FrameHeader, Reassembler, ReassemblyError, encode_frame, encode_padding,
};

#[derive(Arbitrary, Debug)]
struct Input {
    max_body_sel: u8,
    extra_limit: u16,
    frames: Vec<FrameSpec>,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
struct FrameSpec {
    kind: u8,
    number: u16,
    payload: Vec<u8>,
    zeros_after: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Stream bytes `from..from + len` (clamped to the stream).
    Clean { from: u16, len: u16 },
    /// Stream bytes with one byte XORed.
    Flipped {
        from: u16,
        len: u16,
        at: u16,
        xor: u8,
    },
    /// Arbitrary bytes at an arbitrary offset.
    Raw { offset: u32, bytes: Vec<u8> },
}

fuzz_target!(|input: Input| {
    let max_body = match input.max_body_sel % 3 {
        0 => 64,
        1 => 1000,
        _ => 70_000,
    };
    let limit = Reassembler::min_limit(max_body) + usize::from(input.extra_limit);
    let mut r = Reassembler::new(max_body, limit).unwrap();

    let mut wire = Vec::new();
    let mut sent = BTreeMap::new();
    for spec in input.frames.iter().take(64) {
        let header = match spec.kind % 4 {
            0 => FrameHeader::Message {
                substream: u64::from(spec.kind),
                number: u64::from(spec.number),
            },
            1 => FrameHeader::StreamChunk {
                stream: 1,
                offset: u64::from(spec.number),
                fin: false,
            },
            2 => FrameHeader::Control,
            _ => FrameHeader::Padding,
        };
        let at = wire.len() as u64;
        if header == FrameHeader::Padding {
            encode_padding(spec.payload.len() % 3000, &mut wire);
            // Padding may be several frames or bare zeros: decode it to
            // learn what was sent.
            let mut p = Reassembler::new(1 << 20, Reassembler::min_limit(1 << 20)).unwrap();
            p.insert(0, &wire[at as usize..]).unwrap();
            while let Some(f) = p.next_frame() {
                let f = f.unwrap();
                sent.insert(at + f.offset, f.frame);
            }
        } else {
            encode_frame(&header, &spec.payload, &mut wire).unwrap();
            sent.insert(
                at,
                Frame {
                    header,
                    payload: spec.payload.clone().into(),
                },
            );
        }
        wire.resize(wire.len() + usize::from(spec.zeros_after % 4), 0);
    }
    // Frames over the body limit are reported (Oversize, at their offset),
    // not yielded.
    let oversize: Vec<u64> = sent
        .iter()
        .filter(|(_, f)| f.header.encoded_len().unwrap() + f.payload.len() + 4 > max_body)
        .map(|(&o, _)| o)
        .collect();

    let mut clean = true;
    let mut yielded: BTreeMap<u64, Vec<Frame>> = BTreeMap::new();
    let mut check = |r: &mut Reassembler, clean: bool| {
        assert!(
            r.held_bytes() <= r.limit(),
            "held {} > limit {}",
            r.held_bytes(),
            r.limit()
        );
        while let Some(item) = r.next_frame() {
            match item {
                Ok(f) => {
                    if clean {
                        assert_eq!(sent.get(&f.offset), Some(&f.frame), "unsent frame");
                    }
                    let seen = yielded.entry(f.offset).or_default();
                    if clean {
                        assert!(seen.is_empty(), "frame at {} yielded twice", f.offset);
                    }
                    seen.push(f.frame);
                }
                Err(e) => {
                    if clean {
                        assert!(
                            oversize.contains(&e.offset)
                                && matches!(
                                    e.error,
                                    squarepeg_framing::FrameError::Oversize { .. }
                                ),
                            "clean stream rejected: {e}"
                        );
                    }
                }
            }
        }
    };
    for op in input.ops.iter().take(400) {
        let (offset, bytes): (u64, Vec<u8>) = match op {
            Op::Clean { from, len } | Op::Flipped { from, len, .. } => {
                if wire.is_empty() {
                    continue;
                }
                let a = usize::from(*from) % wire.len();
                let b = (a + usize::from(*len)).min(wire.len());
                let mut bytes = wire[a..b].to_vec();
                if let Op::Flipped { at, xor, .. } = op
                    && !bytes.is_empty()
                    && *xor != 0
                {
                    let i = usize::from(*at) % bytes.len();
                    bytes[i] ^= xor;
                    clean = false;
                }
                (a as u64, bytes)
            }
            Op::Raw { offset, bytes } => {
                clean = false;
                (u64::from(*offset), bytes.clone())
            }
        };
        match r.insert(offset, &bytes) {
            Ok(())
            | Err(ReassemblyError::LimitExceeded { .. })
            | Err(ReassemblyError::TooFarAhead { .. }) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
        check(&mut r, clean);
    }
    // The whole stream once more, in order: always accepted (but for a frame
    // found only in conflicting bytes, which may not fit the limit).
    match r.insert(0, &wire) {
        Ok(()) => {}
        Err(ReassemblyError::LimitExceeded { .. }) if !clean => {}
        Err(e) => panic!("in-order insert refused: {e}"),
    }
    check(&mut r, clean);
    if clean {
        for (offset, frame) in &sent {
            if oversize.contains(offset) {
                continue;
            }
            assert_eq!(
                yielded.get(offset).map(|v| &v[..]),
                Some(std::slice::from_ref(frame)),
                "frame at {offset} missing"
            );
        }
    }
});
