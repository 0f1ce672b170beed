//! CRC32C (Castagnoli polynomial, the iSCSI CRC), the frame checksum of
//! docs/wire.md §1 (Hollywood §4.5: a per-message checksum catches bytes
//! mixed from two transmissions).
//!
//! The checksum is a pass over every payload byte on both ends, so it shows
//! directly in message throughput. Where the CPU has AVX-512 with
//! VPCLMULQDQ, [`avx512`] folds 64-byte blocks with carry-less
//! multiplication, four blocks at a time, down to the last 64 bytes.
//! Elsewhere `crc-fast` does the same with whatever the CPU offers. (On
//! AVX-512 machines `crc-fast` folds only 384-byte multiples and checksums
//! the rest one 8-byte word at a time, a serial chain of 3-cycle
//! instructions: for a 1 KiB frame body that tail took two thirds of its
//! time.)

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC32C of the concatenation of `parts`.
pub(crate) fn crc32c(parts: &[&[u8]]) -> u32 {
    if let Some(crc) = folded(parts) {
        return crc;
    }
    let mut digest = Digest::new(CrcAlgorithm::Crc32Iscsi);
    for part in parts {
        digest.update(part);
    }
    // CRC-32/ISCSI is a 32-bit CRC; the crate returns it in a u64.
    digest.finalize() as u32
}

/// [`crc32c`] by [`avx512`], if the CPU has what it needs.
#[cfg(target_arch = "x86_64")]
fn folded(parts: &[&[u8]]) -> Option<u32> {
    if !avx512::available() {
        return None;
    }
    // The CRC register starts as all ones and is inverted at the end
    // (RFC 3720 §B.4).
    let mut state = !0;
    for part in parts {
        // SAFETY: the CPU has the features `update` is compiled for
        // (checked just above).
        state = unsafe { avx512::update(state, part) };
    }
    Some(!state)
}

#[cfg(not(target_arch = "x86_64"))]
fn folded(_parts: &[&[u8]]) -> Option<u32> {
    None
}

/// CRC32C by folding: each 64-byte block is four 128-bit lanes; a lane is
/// carried forward over `d` bytes by multiplying its two 64-bit halves by
/// x^(8d+31) and x^(8d−33) mod P and adding (XOR) the products to the lane
/// `d` bytes on, which keeps the remainder mod P unchanged (the scheme of
/// Gopal et al., "Fast CRC Computation Using PCLMULQDQ", Intel 2009, in the
/// bit-reflected form whose last 128 bits the CRC32 instruction finishes).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// The CRC32C polynomial, bit-reflected.
    const POLY: u32 = 0x82f6_3b78;

    /// x^n mod P, bit-reflected (as the CRC register holds it).
    const fn xn_mod_p(n: u32) -> i64 {
        let mut acc: u32 = 0x8000_0000;
        let mut i = 0;
        while i < n {
            acc = (acc >> 1) ^ if acc & 1 != 0 { POLY } else { 0 };
            i += 1;
        }
        acc as i64
    }

    /// The multipliers that carry a 128-bit lane `bytes` forward: for its
    /// low half, then for its high half.
    const fn fold_by(bytes: u32) -> (i64, i64) {
        (xn_mod_p(8 * bytes + 31), xn_mod_p(8 * bytes - 33))
    }

    const BY_256: (i64, i64) = fold_by(256);
    const BY_192: (i64, i64) = fold_by(192);
    const BY_128: (i64, i64) = fold_by(128);
    const BY_64: (i64, i64) = fold_by(64);
    const BY_48: (i64, i64) = fold_by(48);
    const BY_32: (i64, i64) = fold_by(32);
    const BY_16: (i64, i64) = fold_by(16);

    pub(super) fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("vpclmulqdq")
                && is_x86_feature_detected!("pclmulqdq")
                && is_x86_feature_detected!("sse4.2")
        })
    }

    /// The same multipliers in every lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,sse4.2,pclmulqdq")]
    fn splat((lo, hi): (i64, i64)) -> __m512i {
        _mm512_broadcast_i32x4(_mm_set_epi64x(hi, lo))
    }

    /// `x` carried forward by the distance `k` was made for, plus `next`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,sse4.2,pclmulqdq")]
    fn fold(x: __m512i, k: __m512i, next: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(x, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(x, k, 0x11);
        // 0x96: three-way XOR.
        _mm512_ternarylogic_epi64(lo, hi, next, 0x96)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,sse4.2,pclmulqdq")]
    fn load(block: &[u8; 64]) -> __m512i {
        // SAFETY: an unaligned load of exactly the 64 bytes of `block`.
        unsafe { _mm512_loadu_si512(block.as_ptr().cast()) }
    }

    /// Runs the CRC register `state` (not inverted) over `data`.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512VL, VPCLMULQDQ, PCLMULQDQ and SSE4.2
    /// ([`available`]).
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,sse4.2,pclmulqdq")]
    pub(super) unsafe fn update(mut state: u32, data: &[u8]) -> u32 {
        let (blocks, rest) = data.as_chunks::<64>();
        if let Some((first, mut blocks)) = blocks.split_first() {
            // The register's 32 bits are added to the first 32 data bits.
            let seed = _mm512_zextsi128_si512(_mm_cvtsi32_si128(state as i32));
            let mut x0 = _mm512_xor_si512(load(first), seed);
            if blocks.len() >= 3 {
                // Four lanes of blocks in flight: the multiplications of one
                // step do not wait for each other.
                let mut x1 = load(&blocks[0]);
                let mut x2 = load(&blocks[1]);
                let mut x3 = load(&blocks[2]);
                blocks = &blocks[3..];
                let k = splat(BY_256);
                while let [b0, b1, b2, b3, more @ ..] = blocks {
                    x0 = fold(x0, k, load(b0));
                    x1 = fold(x1, k, load(b1));
                    x2 = fold(x2, k, load(b2));
                    x3 = fold(x3, k, load(b3));
                    blocks = more;
                }
                let t = fold(x0, splat(BY_192), x3);
                let t = fold(x1, splat(BY_128), t);
                x0 = fold(x2, splat(BY_64), t);
            }
            let k = splat(BY_64);
            for b in blocks {
                x0 = fold(x0, k, load(b));
            }
            // Carry the three low lanes onto the top one, then let the CRC
            // instruction reduce those 128 bits to the 32-bit remainder.
            let k = _mm512_set_epi64(0, 0, BY_16.1, BY_16.0, BY_32.1, BY_32.0, BY_48.1, BY_48.0);
            let lo = _mm512_clmulepi64_epi128(x0, k, 0x00);
            let hi = _mm512_clmulepi64_epi128(x0, k, 0x11);
            let y = _mm512_xor_si512(lo, hi);
            let top = _mm512_extracti32x4_epi32::<3>(x0);
            let z = _mm_ternarylogic_epi64(
                _mm512_castsi512_si128(y),
                _mm512_extracti32x4_epi32::<1>(y),
                _mm512_extracti32x4_epi32::<2>(y),
                0x96,
            );
            let z = _mm_xor_si128(z, top);
            state = _mm_crc32_u64(0, _mm_cvtsi128_si64(z) as u64) as u32;
            state = _mm_crc32_u64(u64::from(state), _mm_extract_epi64::<1>(z) as u64) as u32;
        }
        let (words, mut bytes) = rest.as_chunks::<8>();
        for w in words {
            state = _mm_crc32_u64(u64::from(state), u64::from_le_bytes(*w)) as u32;
        }
        // The last 0-7 bytes in at most three steps (a header is 4-6
        // bytes, and so is often the tail of a small frame's body).
        if let Some((w, rest)) = bytes.split_first_chunk::<4>() {
            state = _mm_crc32_u32(state, u32::from_le_bytes(*w));
            bytes = rest;
        }
        if let Some((w, rest)) = bytes.split_first_chunk::<2>() {
            state = _mm_crc32_u16(state, u16::from_le_bytes(*w));
            bytes = rest;
        }
        if let Some(&b) = bytes.first() {
            state = _mm_crc32_u8(state, b);
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_crc32c_crate() {
        // The standard check value (RFC 3720 B.4 polynomial) and a split
        // input at lengths around the fold widths.
        assert_eq!(crc32c(&[b"123456789"]), 0xe306_9283);
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 131 % 251) as u8).collect();
        for len in [0, 1, 15, 16, 63, 64, 255, 256, 1023, 1024, 4999] {
            for cut in [0, len / 3, len] {
                let (a, b) = data[..len].split_at(cut);
                assert_eq!(crc32c(&[a, b]), crc32c::crc32c(&data[..len]), "{len} {cut}");
            }
        }
    }

    /// Every length up to a few fold steps, at every alignment of a 64-byte
    /// line, split in two anywhere: the folding paths (one block, four
    /// lanes, four lanes and single blocks, the word and byte tails) all
    /// agree with the `crc32c` crate's byte-wise definition.
    #[test]
    fn every_length_alignment_and_split() {
        let data: Vec<u8> = (0..3000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..1400 {
            for at in [0, 1, 7, 33] {
                let d = &data[at..at + len];
                let expected = crc32c::crc32c(d);
                assert_eq!(crc32c(&[d]), expected, "len {len} at {at}");
                let cut = (len * 7 + at) % (len + 1);
                let (a, b) = d.split_at(cut);
                assert_eq!(crc32c(&[a, b]), expected, "len {len} at {at} cut {cut}");
            }
        }
    }
}
