//! The plain-frame reader (docs/wire.md §3), differentially: arbitrary bytes, fed in
//! arbitrary cuts, come out of `FrameReader::next_decoded` — message runs taken apart
//! message by message — exactly as decoding each frame on its own gives them (same frames,
//! same errors, nothing after an oversize length), and every run's figures match its
//! frames. The run parser's fast path (16-byte loads) meets whatever a peer sends here.
#![no_main]

use libfuzzer_sys::fuzz_target;
use squarepeg_framing::{Decoded, FrameReader, plain};

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
                    assert_eq!(
                        walked.iter().map(|m| m.len).sum::<usize>(),
                        run.payload_len()
                    );
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
    assert_eq!(got, plain::reference::decode_stream(wire, max_body));
});
