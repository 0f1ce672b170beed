//! Frame header parser: never panics; whatever it accepts re-encodes to an
//! equal header of the same or shorter length (varints may be non-minimal
//! on input, never on output).
#![no_main]

use libfuzzer_sys::fuzz_target;
use squarepeg_framing::{FrameHeader, varint};

fuzz_target!(|data: &[u8]| {
    let _ = varint::decode(data);
    if let Ok((header, n)) = FrameHeader::decode(data) {
        assert!(n <= data.len());
        let mut out = Vec::new();
        header.encode(&mut out).unwrap();
        assert!(out.len() <= n);
        assert_eq!(out.len(), header.encoded_len().unwrap());
        assert_eq!(FrameHeader::decode(&out).unwrap(), (header, out.len()));
        let (bytes, len) = header.to_bytes().unwrap();
        assert_eq!(&bytes[..len], &out[..]);
    }
});
