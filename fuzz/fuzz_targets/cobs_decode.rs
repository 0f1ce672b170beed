//! COBS codec, differentially: the fast decoder against the byte-at-a-time
//! reference on arbitrary input (same result, error included), the three
//! decoding entry points against each other, and encode/decode round trips
//! of the input taken as raw data, on every code path the CPU runs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use squarepeg_framing::cobs;

fuzz_target!(|data: &[u8]| {
    let mut fast = Vec::new();
    let mut slow = Vec::new();
    let rf = cobs::decode(data, &mut fast);
    let rs = cobs::reference::decode(data, &mut slow);
    assert_eq!(rf, rs);
    if rs.is_ok() {
        assert_eq!(fast, slow);
        // Never longer than the input minus one.
        assert!(fast.len() < data.len());
    } else {
        assert!(fast.is_empty(), "decode leaves `out` as it was on error");
    }
    assert_eq!(cobs::decoded_len(data), rs.map(|()| slow.len()));
    let mut buf = vec![0u8; data.len()];
    match cobs::decode_into(data, &mut buf) {
        Ok(n) => assert_eq!(&buf[..n], &slow[..]),
        Err(e) => assert_eq!(Err(e), rs),
    }
    // The unchecked decoder must terminate without panicking on anything,
    // and agree with the checked one on zero-free input.
    let mut small = vec![0u8; data.len() / 2];
    let _ = cobs::decode_run_into(data, &mut small);
    if !data.contains(&0) {
        let n = cobs::decode_run_into(data, &mut buf);
        assert_eq!(n.map(|n| buf[..n].to_vec()), rs.map(|()| slow.clone()));
    }

    // The input as raw data: both encoders agree and decoding returns it.
    let mut enc = Vec::new();
    cobs::encode(data, &mut enc);
    let mut enc_ref = Vec::new();
    cobs::reference::encode(data, &mut enc_ref);
    assert_eq!(enc, enc_ref);
    assert!(enc.len() <= cobs::max_encoded_len(data.len()));
    let mut back = Vec::new();
    cobs::decode(&enc, &mut back).unwrap();
    assert_eq!(back, data);
    // In two pieces, split where the first byte says.
    let cut = data
        .first()
        .map_or(0, |&b| usize::from(b) % (data.len() + 1));
    let mut parts = Vec::new();
    cobs::encode_parts(&[&data[..cut], &data[cut..]], &mut parts);
    assert_eq!(parts, enc);

    // Every code path this CPU runs (AVX-512, AVX2, portable) gives the same bytes and
    // results.
    for level in cobs::at_level::available() {
        let mut parts = Vec::new();
        cobs::at_level::encode_parts(level, &[&data[..cut], &data[cut..]], &mut parts);
        assert_eq!(parts, enc, "{level:?}");
        match cobs::at_level::decode_into(level, data, &mut buf) {
            Ok(n) => assert_eq!(
                Ok(buf[..n].to_vec()),
                rs.map(|()| slow.clone()),
                "{level:?}"
            ),
            Err(e) => assert_eq!(Err(e), rs, "{level:?}"),
        }
        let _ = cobs::at_level::decode_run_into(level, data, &mut small);
        let mut back = vec![0u8; data.len() + 1];
        let n = cobs::at_level::decode_run_into(level, &enc, &mut back).unwrap();
        assert_eq!(&back[..n], data, "{level:?}");
    }
});
