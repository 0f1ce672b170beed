//! Frame decoder, differentially: the single-pass decoder against the
//! decode-then-parse reference, on arbitrary bytes and body limits (same
//! frame or same error). Valid frames re-encode to their input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use squarepeg_framing::frame::{self, decode_frame, decode_frame_into};
use squarepeg_framing::{StreamDecoder, encode_frame};

fuzz_target!(|data: &[u8]| {
    let Some((&limit, encoded)) = data.split_first() else {
        return;
    };
    // Body limits around the interesting sizes: tiny, mid, default.
    let max_body = match limit {
        0..=63 => usize::from(limit),
        64..=191 => usize::from(limit) * 8,
        _ => squarepeg_framing::DEFAULT_MAX_BODY,
    };
    let fast = decode_frame(encoded, max_body);
    let slow = frame::reference::decode_frame(encoded, max_body);
    assert_eq!(fast, slow);
    let mut payload = vec![7u8; 3];
    let header = decode_frame_into(encoded, max_body, &mut payload);
    assert_eq!(header, slow.as_ref().map(|f| f.header).map_err(|e| *e));
    if let Ok(f) = slow {
        assert_eq!(payload, f.payload);
        // A frame that decodes re-encodes to a frame that decodes equal;
        // fed to the stream decoder with markers, it comes out whole.
        let mut wire = Vec::new();
        encode_frame(&f.header, &f.payload, &mut wire).unwrap();
        assert_eq!(
            decode_frame(&wire[1..wire.len() - 1], max_body),
            Ok(f.clone())
        );
        let mut d = StreamDecoder::new(max_body);
        d.push(&wire);
        assert_eq!(d.next_frame(), Some(Ok(f)));
        assert_eq!(d.next_frame(), None);
    }
    // The stream decoder on the raw bytes: never panics, bounded, and
    // agrees with the reassembler fed the same bytes (oversize reports
    // compared by kind: their length depends on where reads end). Small
    // reads and a small pinning limit exercise both output paths.
    let mut d = StreamDecoder::with_buffers(max_body, 1024, 4096);
    let mut r = squarepeg_framing::Reassembler::new(
        max_body,
        squarepeg_framing::Reassembler::min_limit(max_body),
    )
    .unwrap();
    let norm = |f: Result<squarepeg_framing::Frame, squarepeg_framing::FrameError>| match f {
        Err(squarepeg_framing::FrameError::Oversize { limit, .. }) => {
            Err(squarepeg_framing::FrameError::Oversize { len: None, limit })
        }
        other => other,
    };
    let mut offset = 0u64;
    for piece in data.chunks(7) {
        d.push(piece);
        r.insert(offset, piece).unwrap();
        offset += piece.len() as u64;
        while let Some(f) = d.next_frame() {
            let g = r.next_frame().expect("the reassembler found the frame too");
            assert_eq!(norm(f), norm(g.map(|g| g.frame).map_err(|e| e.error)));
        }
        assert!(r.next_frame().is_none());
        assert!(d.buffered() <= squarepeg_framing::cobs::max_encoded_len(max_body));
    }
});
