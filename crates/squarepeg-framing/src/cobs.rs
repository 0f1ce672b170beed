//! Consistent Overhead Byte Stuffing (Cheshire & Baker, SIGCOMM 1997), the
//! zero-free encoding uCOBS frames use (Minion §5.2).
//!
//! Each block is a code byte `c` (1..=255) followed by `c - 1` non-zero data
//! bytes; a block with `c < 255` that is not the last one stands for its data
//! followed by one zero byte. A block of code 255 carries 254 bytes and no
//! zero. The encoder never emits a trailing empty block after a final
//! 255-block (the form of the Wikipedia examples); the decoder accepts it.
//! Expansion is at most one byte per 254 bytes, plus one.
//!
//! This is the plain, obviously-correct codec; it is the reference the tests
//! compare faster versions against.

use crate::CobsError;

/// The largest encoding of `n` input bytes.
pub fn max_encoded_len(n: usize) -> usize {
    n + n / 254 + 1
}

/// COBS-encodes the concatenation of `parts` and appends it to `out`.
pub fn encode_parts(parts: &[&[u8]], out: &mut Vec<u8>) {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(max_encoded_len(total));
    let mut code_pos = out.len();
    out.push(0);
    let mut code: u8 = 1;
    // Whether a 255-block just closed and no byte has followed yet.
    let mut block_full = false;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        if block_full {
            code_pos = out.len();
            out.push(0);
            code = 1;
            block_full = false;
        }
        if b == 0 {
            out[code_pos] = code;
            code_pos = out.len();
            out.push(0);
            code = 1;
        } else {
            out.push(b);
            code += 1;
            if code == 0xff {
                out[code_pos] = 0xff;
                block_full = true;
            }
        }
    }
    if !block_full {
        out[code_pos] = code;
    }
}

/// COBS-encodes `input` and appends it to `out`.
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    encode_parts(&[input], out);
}

/// Decodes `input` (which must contain no zero byte) and appends the result
/// to `out`. On error `out` may hold partial output.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), CobsError> {
    let mut i = 0;
    while i < input.len() {
        let code = input[i];
        if code == 0 {
            return Err(CobsError::ZeroByte { at: i });
        }
        let end = i + code as usize;
        let data = input.get(i + 1..end).ok_or(CobsError::Truncated)?;
        if let Some(z) = data.iter().position(|&b| b == 0) {
            return Err(CobsError::ZeroByte { at: i + 1 + z });
        }
        out.extend_from_slice(data);
        i = end;
        if code != 0xff && i < input.len() {
            out.push(0);
        }
    }
    if input.is_empty() {
        return Err(CobsError::Empty);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Examples from the COBS paper and the Wikipedia article.
    #[test]
    fn known_vectors() {
        let run: Vec<u8> = (1..=254).collect();
        let mut run_enc = vec![0xff];
        run_enc.extend_from_slice(&run);
        let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (vec![], vec![0x01]),
            (vec![0x00], vec![0x01, 0x01]),
            (vec![0x00, 0x00], vec![0x01, 0x01, 0x01]),
            (
                vec![0x11, 0x22, 0x00, 0x33],
                vec![0x03, 0x11, 0x22, 0x02, 0x33],
            ),
            (
                vec![0x11, 0x00, 0x00, 0x00],
                vec![0x02, 0x11, 0x01, 0x01, 0x01],
            ),
            (run.clone(), run_enc.clone()),
            (
                [run.clone(), vec![0xff]].concat(),
                [run_enc.clone(), vec![0x02, 0xff]].concat(),
            ),
            (
                [vec![0x00], run.clone()].concat(),
                [vec![0x01], run_enc.clone()].concat(),
            ),
        ];
        for (raw, enc) in cases {
            let mut out = Vec::new();
            encode(&raw, &mut out);
            assert_eq!(out, enc, "encode {raw:02x?}");
            let mut back = Vec::new();
            decode(&enc, &mut back).unwrap();
            assert_eq!(back, raw, "decode {enc:02x?}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        let mut out = Vec::new();
        assert_eq!(decode(&[], &mut out), Err(CobsError::Empty));
        assert_eq!(decode(&[0x05, 1, 2], &mut out), Err(CobsError::Truncated));
        assert_eq!(
            decode(&[0x03, 1, 0], &mut out),
            Err(CobsError::ZeroByte { at: 2 })
        );
        assert_eq!(
            decode(&[0x00], &mut out),
            Err(CobsError::ZeroByte { at: 0 })
        );
    }
}
