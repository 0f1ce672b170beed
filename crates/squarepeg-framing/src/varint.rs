//! Variable-length integers, as QUIC encodes them (RFC 9000 §16).
//!
//! The two most significant bits of the first byte give the length (1, 2, 4
//! or 8 bytes); the remaining bits hold the value in network byte order.
//! Values up to 2^62 - 1 fit. Decoders accept non-minimal encodings, as
//! RFC 9000 §16 allows; encoders always write the shortest form.

use crate::HeaderError;

/// The largest value a varint can carry: 2^62 - 1.
pub const MAX: u64 = (1 << 62) - 1;

/// Number of bytes [`encode`] writes for `value`, or `None` if it is too large.
#[inline]
pub fn len(value: u64) -> Option<usize> {
    match value {
        0..=0x3f => Some(1),
        0x40..=0x3fff => Some(2),
        0x4000..=0x3fff_ffff => Some(4),
        0x4000_0000..=MAX => Some(8),
        _ => None,
    }
}

/// Appends the shortest encoding of `value` to `out`.
pub fn encode(value: u64, out: &mut Vec<u8>) -> Result<(), HeaderError> {
    let (bytes, n) = to_bytes(value)?;
    out.extend_from_slice(&bytes[..n]);
    Ok(())
}

/// The shortest encoding of `value`: the first `n` bytes of the array.
#[inline]
pub fn to_bytes(value: u64) -> Result<([u8; 8], usize), HeaderError> {
    let n = len(value).ok_or(HeaderError::VarintTooLarge(value))?;
    // The length code (0..=3, for 1, 2, 4, 8 bytes) goes in the top two
    // bits of the first byte (RFC 9000 §16).
    let code = n.trailing_zeros() as u64;
    let tagged = value | (code << (8 * n - 2));
    let wide = tagged << (8 * (8 - n));
    Ok((wide.to_be_bytes(), n))
}

/// Decodes one varint from the front of `buf`; returns it and the bytes used.
#[inline]
pub fn decode(buf: &[u8]) -> Result<(u64, usize), HeaderError> {
    if let Some(word) = buf.first_chunk::<8>() {
        // Eight bytes at hand (a frame body's header is followed by at
        // least its 4-byte CRC): one load and a shift instead of a loop.
        let word = u64::from_be_bytes(*word);
        let n = 1usize << (word >> 62);
        let value = (word << 2 >> 2) >> (64 - 8 * n);
        return Ok((value, n));
    }
    let first = *buf.first().ok_or(HeaderError::Truncated)?;
    let n = 1usize << (first >> 6);
    let bytes = buf.get(..n).ok_or(HeaderError::Truncated)?;
    let mut value = u64::from(first & 0x3f);
    for &b in &bytes[1..] {
        value = (value << 8) | u64::from(b);
    }
    Ok((value, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of RFC 9000 Appendix A.1.
    #[test]
    fn rfc9000_examples() {
        let cases: [(&[u8], u64); 4] = [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, value) in cases {
            assert_eq!(decode(bytes).unwrap(), (value, bytes.len()));
            let mut out = Vec::new();
            encode(value, &mut out).unwrap();
            assert_eq!(out, bytes);
        }
        // A non-minimal encoding of 37 is accepted.
        assert_eq!(decode(&[0x40, 0x25]).unwrap(), (37, 2));
    }

    /// The eight-byte path and the byte loop agree, whatever follows the
    /// varint.
    #[test]
    fn wide_and_short_inputs_agree() {
        for value in [
            0,
            1,
            37,
            63,
            64,
            15_293,
            16_383,
            16_384,
            494_878_333,
            1 << 30,
            MAX,
        ] {
            let mut out = Vec::new();
            encode(value, &mut out).unwrap();
            let n = out.len();
            for fill in [0x00, 0xff, 0x5a] {
                let mut wide = out.clone();
                wide.resize(n + 8, fill);
                assert_eq!(decode(&wide).unwrap(), (value, n));
                assert_eq!(decode(&wide[..n]).unwrap(), (value, n));
            }
        }
    }

    #[test]
    fn limits() {
        let mut out = Vec::new();
        assert!(encode(MAX, &mut out).is_ok());
        assert_eq!(decode(&out).unwrap(), (MAX, 8));
        assert!(matches!(
            encode(MAX + 1, &mut out),
            Err(HeaderError::VarintTooLarge(_))
        ));
        assert!(matches!(decode(&[]), Err(HeaderError::Truncated)));
        assert!(matches!(decode(&[0x80, 1, 2]), Err(HeaderError::Truncated)));
    }
}
