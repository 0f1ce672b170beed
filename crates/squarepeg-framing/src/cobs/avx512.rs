//! The AVX-512 codec (x86-64 with AVX-512 BW, VBMI and VBMI2: Ice Lake and later, Zen 4
//! and later).
//!
//! **Encoding** works on fixed 64-byte chunks of the input, with no branch on where zeros
//! fall. COBS output is the input shifted by one, with each zero replaced by the code of
//! the block after it, and one more byte inserted wherever a block fills up with 254
//! bytes and no zero (Cheshire & Baker §3). Per chunk:
//! - a zero mask from one compare; the chunk is stored unchanged at the output cursor;
//! - the *first event* is whichever comes first: the first zero, which ends the current
//!   block, or the lane where the block fills (its room runs out) — a *split*: the chunk's
//!   bytes from there on are stored a second time, one byte further on (a masked store),
//!   and the byte left behind becomes the next block's code placeholder;
//! - the current block's code is then known (the distance to the first event) and written
//!   at its placeholder; after a split, the new block's code is the distance to the first
//!   zero, written at the split's placeholder;
//! - where the chunk holds two or more zeros (zero-heavy data), the codes of the blocks
//!   between them are distances from one zero to the next: the zeros' lane numbers are
//!   compressed into consecutive lanes (`vpcompressb`), subtracted from their neighbours,
//!   and expanded back into the zeros' lanes (`vpexpandb`), all in registers;
//! - the last zero (or split) becomes the new placeholder, whose code a later chunk
//!   writes.
//!
//! Writes whose target turns out not to be needed (no event in the chunk) go to the
//! current placeholder, which the event that eventually closes its block overwrites. The
//! last chunk is loaded with a mask, so nothing is read past the input; stores may run up
//! to [`STORE_SLACK`] bytes past the encoding into reserved capacity.
//!
//! **Decoding** runs the portable decoding loop compiled for AVX-512 (its fixed-size copies
//! become 64-byte moves), with [`copy_short`] for blocks near the end of either buffer.

use std::arch::x86_64::{
    __m512i, _mm512_cmpeq_epi8_mask, _mm512_loadu_si512, _mm512_mask_expand_epi8,
    _mm512_mask_mov_epi8, _mm512_mask_storeu_epi8, _mm512_maskz_compress_epi8,
    _mm512_maskz_loadu_epi8, _mm512_permutexvar_epi8, _mm512_setzero_si512, _mm512_storeu_si512,
    _mm512_sub_epi8,
};

use std::arch::x86_64::_bzhi_u64;
use std::hint::select_unpredictable;

use super::{Encoder, MAX_BLOCK_DATA, max_encoded_len};
use crate::CobsError;

/// Bytes the encoder's stores may reach past the end of the encoding: a 64-byte store at
/// the cursor and the split store one byte further on.
const STORE_SLACK: usize = 66;

/// Where a chunk holds fewer than two zeros and at least this many bytes are left, the
/// chunk loop hands over to the AVX2 loop.
pub(super) const SPARSE_MIN: usize = 128;

/// Lane numbers 0..64.
static LANES: [u8; 64] = {
    let mut l = [0u8; 64];
    let mut k = 0;
    while k < 64 {
        l[k] = k as u8;
        k += 1;
    }
    l
};

/// Lane numbers shifted down by one (lane k holds k + 1; the last wraps, unused).
static NEXT_LANES: [u8; 64] = {
    let mut l = [0u8; 64];
    let mut k = 0;
    while k < 64 {
        l[k] = ((k + 1) % 64) as u8;
        k += 1;
    }
    l
};

/// Whether this CPU runs the AVX-512 codec (cached by std after the first call).
#[inline]
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vbmi")
        && std::is_x86_feature_detected!("avx512vbmi2")
        && std::is_x86_feature_detected!("bmi1")
        && std::is_x86_feature_detected!("bmi2")
        && std::is_x86_feature_detected!("lzcnt")
}

/// The mask of the first `len` lanes (`len` ≤ 64).
#[inline(always)]
fn first_lanes(len: usize) -> u64 {
    if len >= 64 {
        u64::MAX
    } else {
        (1u64 << len) - 1
    }
}

/// Encodes the start of `input` as the continuation of `enc`'s encoding, 64-byte chunk by
/// chunk (see the module docs), while chunks hold two or more zeros and through the last
/// chunk: after a chunk with fewer zeros, with 64 bytes or more left, it returns the number
/// of bytes consumed (at least one chunk's), leaving sparse stretches to the AVX2 loop,
/// whose branches are cheaper where they predict well.
///
/// # Safety
/// The CPU supports the features [`available`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vbmi2,bmi1,bmi2,lzcnt")]
pub(super) unsafe fn encode_chunks(enc: &mut Encoder<'_>, input: &[u8]) -> usize {
    let n = input.len();
    if n == 0 {
        return 0;
    }
    enc.out.reserve(max_encoded_len(n) + STORE_SLACK);
    let base = enc.out.as_mut_ptr();
    let mut o = enc.out.len();
    let mut last = enc.code_pos;
    // Data bytes the current block can still take before it fills (1..=254 between
    // chunks: a block that fills at a chunk's end is split there).
    let mut room = MAX_BLOCK_DATA - (o - last - 1);
    let mut after_full = enc.after_full;
    let mut i = 0;
    while i < n {
        let len = (n - i).min(64);
        let valid = _bzhi_u64(u64::MAX, len as u32);
        // SAFETY: the masked load reads only `input[i..i + len]`.
        let x = unsafe { _mm512_maskz_loadu_epi8(valid, input.as_ptr().add(i).cast::<i8>()) };
        let zeros = _mm512_cmpeq_epi8_mask(x, _mm512_setzero_si512()) & valid;
        // The first zero's lane (`len` if none).
        let z = (zeros | !valid).trailing_zeros() as usize;
        let y = inner_codes(x, zeros);
        // Where zeros fall is random: every choice below is a select, not a branch (a
        // mispredicted branch costs as much as moving a few hundred bytes).
        // The block fills at lane `room` unless a zero comes first; a split at lane `len`
        // (the block fills exactly at the chunk's end) puts the placeholder just after it.
        let split = room <= z;
        let s = select_unpredictable(split, room, 64);
        let shifted = valid & !_bzhi_u64(u64::MAX, s as u32);
        // After a split, the new block's code goes at the split; without one, that write
        // goes to the current placeholder and is overwritten just below.
        let new_block = select_unpredictable(split, o + s, last);
        // SAFETY: `o + 1 + 64 <= o + STORE_SLACK`, and `o` is at most the start length
        // plus the encoding of `input[..i]` plus one placeholder, within the capacity
        // reserved above. `last < o` and `o + s <= o + len` are written positions.
        unsafe {
            _mm512_storeu_si512(base.add(o).cast::<__m512i>(), y);
            _mm512_mask_storeu_epi8(base.add(o + 1).cast::<i8>(), shifted, y);
            // The new block's code: the distance to the first zero, shifted one on.
            *base.add(new_block) = (z + 1).wrapping_sub(s) as u8;
            // The current block's code: the distance to the first event (without an event
            // this is a placeholder value, overwritten by a later chunk).
            *base.add(last) = (o + z.min(room) - last) as u8;
        }
        // The last zero's lane (meaningless without a zero).
        let zl = 63usize.wrapping_sub(zeros.leading_zeros() as usize);
        let has_zero = zeros != 0;
        last = select_unpredictable(
            has_zero,
            (o + usize::from(split)).wrapping_add(zl),
            select_unpredictable(split, o + s, last),
        );
        room = select_unpredictable(
            has_zero,
            (MAX_BLOCK_DATA + 1).wrapping_add(zl).wrapping_sub(len),
            select_unpredictable(split, MAX_BLOCK_DATA + s - len, room.wrapping_sub(len)),
        );
        after_full = split && s == len;
        o += len + usize::from(split);
        i += len;
        if zeros & zeros.wrapping_sub(1) == 0 && n - i >= SPARSE_MIN {
            break;
        }
    }
    // SAFETY: every byte below `o` was written (by a store, a code or a placeholder), and
    // `o` is within the capacity.
    unsafe { enc.out.set_len(o) };
    enc.code_pos = last;
    enc.after_full = after_full;
    i
}

/// Copies `src` to the front of `dst` (at least as long) with masked 64-byte moves that
/// touch nothing outside either slice: the decoder's copy for blocks near the end of its
/// buffers, where a fixed-size copy would not fit and a `memcpy` call would cost more than
/// the copy.
///
/// # Safety
/// The CPU supports the features [`available`] checks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn copy_short(src: &[u8], dst: &mut [u8]) {
    assert!(dst.len() >= src.len());
    let mut k = 0;
    while k < src.len() {
        let m = first_lanes(src.len() - k);
        // SAFETY: the mask limits both moves to `src.len() - k` lanes from `k`, inside
        // both slices.
        unsafe {
            let v = _mm512_maskz_loadu_epi8(m, src.as_ptr().add(k).cast::<i8>());
            _mm512_mask_storeu_epi8(dst.as_mut_ptr().add(k).cast::<i8>(), m, v);
        }
        k += 64;
    }
}

/// Inputs up to this long decode in one vector ([`decode_short`]).
pub(super) const SHORT_INPUT: usize = 65;

/// Decodes an `input` of at most [`SHORT_INPUT`] bytes into an `out` of at least 64 bytes
/// with one masked load and store: no block can be full (254 bytes) at this length, so
/// the decoding is the input after its first byte with each later code byte turned into
/// a zero. The walk along the code bytes finds them (and the same errors as the block
/// loop: a code of zero, a block running past the end).
///
/// # Safety
/// The CPU supports the features [`available`] checks.
#[target_feature(enable = "avx512f,avx512bw,bmi1,bmi2,lzcnt")]
pub(super) unsafe fn decode_short(input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
    let n = input.len();
    assert!(n <= SHORT_INPUT && out.len() >= SHORT_INPUT - 1);
    if n == 0 {
        return Ok(0);
    }
    let mut zeros = 0u64;
    let mut j = 0;
    loop {
        let code = usize::from(input[j]);
        if code == 0 {
            return Err(CobsError::ZeroByte { at: j });
        }
        j += code;
        if j >= n {
            if j > n {
                return Err(CobsError::Truncated);
            }
            break;
        }
        // A code byte after the first: a zero in the decoding, one lane down.
        zeros |= 1 << (j - 1);
    }
    let lanes = _bzhi_u64(u64::MAX, (n - 1) as u32);
    // SAFETY: the masked load reads `input[1..n]`; the masked store writes `out[..n - 1]`,
    // inside `out` (at least 64 bytes).
    unsafe {
        let v = _mm512_maskz_loadu_epi8(lanes, input.as_ptr().add(1).cast::<i8>());
        let v = _mm512_mask_mov_epi8(v, zeros, _mm512_setzero_si512());
        _mm512_mask_storeu_epi8(out.as_mut_ptr().cast::<i8>(), lanes, v);
    }
    Ok(n - 1)
}

/// Inputs up to this long encode in two vectors ([`encode_short`]).
pub(super) const SHORT_ENCODE: usize = 128;

/// The codes of the blocks inside a chunk with two zeros or more: each zero but the last
/// becomes the distance to the next (their lane numbers compressed into consecutive lanes,
/// subtracted from their neighbours, expanded back).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vbmi2")]
fn inner_codes(x: __m512i, zeros: u64) -> __m512i {
    if zeros & zeros.wrapping_sub(1) == 0 {
        return x;
    }
    // SAFETY: both tables are 64 bytes.
    let (lanes, next_lanes) = unsafe {
        (
            _mm512_loadu_si512(LANES.as_ptr().cast::<__m512i>()),
            _mm512_loadu_si512(NEXT_LANES.as_ptr().cast::<__m512i>()),
        )
    };
    let at = _mm512_maskz_compress_epi8(zeros, lanes);
    let next = _mm512_permutexvar_epi8(next_lanes, at);
    _mm512_mask_expand_epi8(x, zeros, _mm512_sub_epi8(next, at))
}

/// COBS-encodes an `input` of at most [`SHORT_ENCODE`] bytes and appends it to `out`: a
/// whole small frame body in two masked loads and two stores. No block can fill up at
/// this length, so the encoding is a first code byte, then the input with each zero
/// turned into the distance to the next zero (or to the end).
///
/// # Safety
/// The CPU supports the features [`available`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vbmi2,bmi1,bmi2,lzcnt")]
pub(super) unsafe fn encode_short(input: &[u8], out: &mut Vec<u8>) {
    let n = input.len();
    assert!(n <= SHORT_ENCODE);
    let start = out.len();
    out.reserve(1 + SHORT_ENCODE);
    let src = input.as_ptr();
    let valid = [
        _bzhi_u64(u64::MAX, n.min(64) as u32),
        _bzhi_u64(u64::MAX, n.saturating_sub(64) as u32),
    ];
    // SAFETY: the masked loads read only `input[..n]`; the stores write `out[start..start
    // + 129]`, within the capacity reserved above.
    let (m0, m1) = unsafe {
        let base = out.as_mut_ptr().add(start);
        let x0 = _mm512_maskz_loadu_epi8(valid[0], src.cast::<i8>());
        let x1 = _mm512_maskz_loadu_epi8(valid[1], src.add(64).cast::<i8>());
        let m0 = _mm512_cmpeq_epi8_mask(x0, _mm512_setzero_si512()) & valid[0];
        let m1 = _mm512_cmpeq_epi8_mask(x1, _mm512_setzero_si512()) & valid[1];
        _mm512_storeu_si512(base.add(1).cast::<__m512i>(), inner_codes(x0, m0));
        _mm512_storeu_si512(base.add(65).cast::<__m512i>(), inner_codes(x1, m1));
        (m0, m1)
    };
    let zeros = u128::from(m0) | u128::from(m1) << 64;
    // SAFETY: every position written is below `start + 1 + n`, inside the capacity; the
    // stores above initialised all of them.
    unsafe {
        let base = out.as_mut_ptr().add(start);
        if zeros == 0 {
            *base = (n + 1) as u8;
        } else {
            *base = (zeros.trailing_zeros() + 1) as u8;
            // The last zero's block runs to the end.
            let last = 127 - zeros.leading_zeros() as usize;
            *base.add(1 + last) = (n - last) as u8;
            if m0 != 0 && m1 != 0 {
                // The first chunk's last zero: the distance to the second chunk's first.
                let last0 = 63 - m0.leading_zeros() as usize;
                *base.add(1 + last0) = (64 + m1.trailing_zeros() as usize - last0) as u8;
            }
        }
        out.set_len(start + 1 + n);
    }
}
