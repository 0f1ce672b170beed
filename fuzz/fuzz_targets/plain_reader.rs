//! The plain-frame reader (docs/wire.md §3), differentially: arbitrary bytes, fed in
//! arbitrary cuts, come out of `FrameReader::next_decoded` — message runs taken apart
//! message by message — exactly as decoding each frame on its own gives them (same frames,
//! same errors, nothing after an oversize length), and every run's figures match its
//! frames. The run parser's fast path (16-byte loads) meets whatever a peer sends here.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use squarepeg_framing::{
    Decoded, Frame, FrameError, FrameHeader, FrameReader, HeaderError, varint,
};

/// Each frame decoded on its own from the whole input.
fn reference(wire: &[u8], max_body: usize) -> Vec<Result<Frame, FrameError>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < wire.len() {
        let Ok((len, n)) = varint::decode(&wire[pos..]) else {
            break; // the length itself is incomplete
        };
        if len > max_body as u64 {
            out.push(Err(FrameError::Oversize {
                len: Some(usize::try_from(len).unwrap_or(usize::MAX)),
                limit: max_body,
            }));
            break;
        }
        let Some(body) = wire.get(pos + n..pos + n + len as usize) else {
            break; // incomplete
        };
        out.push(match FrameHeader::decode(body) {
            Ok((header, head)) => Ok(Frame {
                header,
                payload: Bytes::copy_from_slice(&body[head..]),
            }),
            Err(HeaderError::Truncated) => Err(FrameError::TooShort),
            Err(e) => Err(e.into()),
        });
        pos += n + len as usize;
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, wire)) = data.split_first() else {
        return;
    };
    let max_body = 1 << 12;
    let cut = usize::from(cut.max(1));
    let mut reader = FrameReader::with_buffers(max_body, 1024, 1 << 16);
    reader.start_plain();
    let mut got = Vec::new();
    for piece in wire.chunks(cut) {
        reader.push(piece);
        while let Some(d) = reader.next_decoded() {
            match d {
                Decoded::Frame(f) => got.push(f),
                Decoded::Messages(mut run) => {
                    assert!(!run.is_empty());
                    let walked: Vec<_> = run.iter().collect();
                    assert_eq!(walked.len(), run.len());
                    assert_eq!(walked.iter().map(|m| m.len).sum::<usize>(), run.payload_len());
                    assert_eq!(walked[0].number, run.first_number());
                    if run.is_consecutive() {
                        assert!(walked.windows(2).all(|w| w[1].number == w[0].number + 1));
                    }
                    while let Some(f) = run.pop_frame() {
                        got.push(Ok(f));
                    }
                }
            }
        }
    }
    assert_eq!(got, reference(wire, max_body));
});
