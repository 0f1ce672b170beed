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
//! The codec is written for speed, with three code paths ([`Level`]), the
//! best the CPU has chosen once at run time (with the CRC's, the crate's
//! only `unsafe` code). On x86-64 with AVX2 the encoder moves 64 bytes per step: it
//! stores them unchanged (the COBS output is the input with each zero turned
//! into the next block's code byte) and finds the first zero with one vector
//! compare. With AVX-512 (BW, VBMI2), stretches where zeros are dense, short
//! inputs and the last bytes go through branch-free 64-byte chunks instead
//! (module `avx512`: the codes of all the blocks inside a chunk come from one
//! compress, subtract and expand of the zeros' lane numbers), which is 8×
//! faster on zero-heavy data; where zeros are sparse the AVX2 loop stays,
//! because there its branches predict well and a branch-free step would wait
//! on its own dependency chain. Without AVX2, and where zeros are dense
//! without AVX-512, the encoder looks at eight bytes at a time. Where a word holds no zero, `memchr` finds the end of the run,
//! which is copied with one `extend_from_slice` per 254-byte block. Where zeros are dense, words are copied whole and every byte
//! position updates the current block's code with a conditional move, so
//! the loop has no branch on the data (at random zero positions a branch
//! per zero would mispredict half the time). The decoder copies a large
//! block with one `copy_from_slice`; small blocks it decodes 64 bytes at a
//! time: one fixed-size copy of the window, then a walk along the code
//! bytes inside it, writing the zero each one stands for. [`decode`] and
//! [`decode_into`] first check the input for zero bytes (one `memchr`
//! pass); [`decode_run_into`], for runs the marker scan has already found
//! free of zeros, does not. The plain byte-at-a-time codec this replaced
//! lives on in `reference` (tests and the `reference` feature) as the
//! oracle the tests and fuzz targets compare against; `at_level` (same
//! feature) runs a chosen code path, so that they check every path the CPU
//! runs, not only the fastest.

use crate::CobsError;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// The most data bytes one block carries.
const MAX_BLOCK_DATA: usize = 254;

/// The largest encoding of `n` input bytes (saturating at `usize::MAX`).
pub fn max_encoded_len(n: usize) -> usize {
    n.saturating_add(n / MAX_BLOCK_DATA).saturating_add(1)
}

/// The high bit of each byte of `w` (little-endian) that is zero is set in
/// the result; bits above the lowest set one may be false positives (the
/// classic "has zero byte" trick), so only the lowest is exact.
#[inline(always)]
fn zero_flags(w: u64) -> u64 {
    w.wrapping_sub(0x0101_0101_0101_0101) & !w & 0x8080_8080_8080_8080
}

/// An incremental COBS encoder appending to a `Vec`: feed the input in any
/// number of pieces with [`Encoder::push`], then call [`Encoder::finish`].
/// The result is the encoding of the concatenated pieces, so a frame's
/// header, payload and checksum are encoded without first being copied
/// into one buffer.
#[derive(Debug)]
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    /// Index in `out` of the current block's code byte (a placeholder until
    /// the block closes); the block's data so far follows it to the end of
    /// `out` (0..=253 bytes).
    code_pos: usize,
    /// Whether the previous block closed full (code 255) and nothing has
    /// followed it yet: the current block is then only a placeholder, which
    /// [`Encoder::finish`] removes if the input ends here.
    after_full: bool,
    start: usize,
    /// The code path this encoder runs (the best the CPU has, except in tests).
    level: Level,
}

impl<'a> Encoder<'a> {
    /// Starts an encoding at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Self::with_level(out, Level::best())
    }

    fn with_level(out: &'a mut Vec<u8>, level: Level) -> Self {
        let start = out.len();
        out.push(0);
        Self {
            out,
            code_pos: start,
            after_full: false,
            start,
            level,
        }
    }

    /// Encodes `bytes` as the continuation of the input so far.
    pub fn push(&mut self, bytes: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if self.level == Level::Avx512 {
            // Sparse zeros: the AVX2 loop, whose branches predict well there; dense
            // stretches, short inputs and the last bytes: branch-free AVX-512 chunks.
            let mut rest = bytes;
            while !rest.is_empty() {
                if rest.len() >= avx512::SPARSE_MIN {
                    rest = &rest[self.push_vector(rest)..];
                }
                // SAFETY: `Level::Avx512` is only ever chosen where `avx512::available()`
                // says the CPU has what it needs.
                rest = &rest[unsafe { avx512::encode_chunks(self, rest) }..];
            }
            return;
        }
        // The vector loop stores a whole vector past the end of what it has encoded.
        self.out
            .reserve(max_encoded_len(bytes.len()) + vector::STORE_SLACK);
        let vector = self.level == Level::Avx2;
        let mut rest = bytes;
        while rest.len() >= 8 {
            if vector && rest.len() >= vector::MIN_INPUT {
                rest = &rest[self.push_vector(rest)..];
                if rest.len() < 8 {
                    break;
                }
                // Zeros are dense here (or the rest is short): one step of the word loop.
            }
            self.push_word_step(&mut rest);
        }
        // The last few bytes.
        while let Some(z) = rest.iter().position(|&b| b == 0) {
            self.push_run(&rest[..z]);
            self.close_at_zero();
            rest = &rest[z + 1..];
        }
        self.push_run(rest);
    }

    /// One step of the portable loop at the start of `rest` (at least 8 bytes): a zero-free
    /// run found by `memchr`, a stretch of dense zeros, or a block that fills up before a
    /// zero.
    #[inline(always)]
    fn push_word_step(&mut self, rest: &mut &[u8]) {
        {
            let mut word = [0u8; 8];
            word.copy_from_slice(&rest[..8]);
            let zeros = zero_flags(u64::from_le_bytes(word));
            if zeros == 0 {
                // A run of at least 8 bytes: find its end with memchr.
                match memchr::memchr(0, &rest[8..]) {
                    Some(z) => {
                        self.push_run(&rest[..8 + z]);
                        self.close_at_zero();
                        *rest = &rest[8 + z + 1..];
                    }
                    None => {
                        self.push_run(rest);
                        *rest = &[];
                    }
                }
                return;
            }
            let done = self.push_dense(rest);
            if done > 0 {
                *rest = &rest[done..];
                return;
            }
            // The block fills up before this zero (rare): the slow way.
            let run = zeros.trailing_zeros() as usize / 8;
            self.push_run(&rest[..run]);
            self.close_at_zero();
            *rest = &rest[run + 1..];
        }
    }

    /// Encodes from the start of `input` with 32-byte vectors while zeros are sparse; returns
    /// the number of bytes consumed (0 where no vector unit is available).
    #[inline(always)]
    fn push_vector(&mut self, input: &[u8]) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            // The loop's stores end at most `STORE_SLACK` bytes past its encoding so far,
            // which is at most one byte longer than `max_encoded_len` of what it consumed
            // (its last block's placeholder). Usually a no-op: `push` reserved already.
            self.out
                .reserve(max_encoded_len(input.len()) + vector::STORE_SLACK + 1);
            // SAFETY: `vector::available()` (checked by the caller, and again here in debug
            // builds) says the CPU has AVX2; the capacity was reserved just above.
            debug_assert!(vector::available());
            unsafe { self.push_avx2(input) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = input;
            0
        }
    }

    /// The AVX2 loop: each step loads 64 input bytes, stores them unchanged at the output
    /// cursor (COBS output is the input with each zero replaced by the next block's code
    /// byte, plus a code byte before every 254-byte block), and finds the first zero with
    /// two compares. A zero's slot becomes the next block's code placeholder; a block that
    /// fills gets code 255 and a fresh placeholder. Either way the next step starts right
    /// after, so the stores overlap and may run up to 64 bytes past the encoded end; the
    /// next store or the caller overwrites that. Stops where fewer than 64 bytes are left
    /// or a step sees more than two zeros (the branch-free word loop is faster on dense
    /// zeros: here each zero costs a step and a likely mispredicted branch).
    ///
    /// # Safety
    /// The CPU supports AVX2, and `self.out` has spare capacity for
    /// `max_encoded_len(input.len()) + STORE_SLACK + 1` bytes.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn push_avx2(&mut self, input: &[u8]) -> usize {
        use std::arch::x86_64::{
            __m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8,
            _mm256_setzero_si256, _mm256_storeu_si256,
        };
        const STEP: usize = 64;
        let n = input.len();
        let mut o = self.out.len();
        debug_assert!(self.out.capacity() - o > max_encoded_len(n) + vector::STORE_SLACK);
        let base = self.out.as_mut_ptr();
        let mut code_pos = self.code_pos;
        let mut after_full = self.after_full;
        let mut i = 0;
        let zero = _mm256_setzero_si256();
        while i + STEP <= n {
            let block_len = o - code_pos - 1;
            // SAFETY: `i + 64 <= n`, so the loads stay inside `input`. The stores end at
            // `o + 64`; `o` is at most the start length plus the encoding of `input[..i]`
            // plus one placeholder, so `o + 64` is at most the start length plus
            // `max_encoded_len(n) + 1`: within the capacity the caller reserved.
            let mask = unsafe {
                let p = input.as_ptr().add(i).cast::<__m256i>();
                let a = _mm256_loadu_si256(p);
                let b = _mm256_loadu_si256(p.add(1));
                _mm256_storeu_si256(base.add(o).cast::<__m256i>(), a);
                _mm256_storeu_si256(base.add(o + 32).cast::<__m256i>(), b);
                let lo = _mm256_movemask_epi8(_mm256_cmpeq_epi8(a, zero)) as u32;
                let hi = _mm256_movemask_epi8(_mm256_cmpeq_epi8(b, zero)) as u32;
                u64::from(lo) | u64::from(hi) << 32
            };
            // Only the bytes that still fit into the current block count.
            let room = MAX_BLOCK_DATA - block_len;
            let zeros = if room >= STEP {
                mask
            } else {
                mask & ((1u64 << room) - 1)
            };
            if zeros == 0 {
                if room > STEP {
                    o += STEP;
                    i += STEP;
                    after_full = false;
                } else {
                    // The block fills with `room` more bytes.
                    o += room;
                    i += room;
                    // SAFETY: `code_pos < o` and `o < o + 64`, within the capacity; the
                    // placeholder is written so every byte below the new length is
                    // initialised.
                    unsafe {
                        *base.add(code_pos) = 0xff;
                        *base.add(o) = 0;
                    }
                    code_pos = o;
                    o += 1;
                    after_full = true;
                }
                continue;
            }
            // More than two zeros in this step (clearing the lowest set bit twice leaves
            // some): leave the dense stretch to the word loop.
            let once = zeros & (zeros - 1);
            if once & once.wrapping_sub(1) != 0 {
                break;
            }
            let z = zeros.trailing_zeros() as usize;
            // SAFETY: `code_pos < o`, inside the initialised length.
            unsafe { *base.add(code_pos) = (block_len + z + 1) as u8 };
            // The zero was stored at `o + z`: it is the next block's placeholder.
            code_pos = o + z;
            o += z + 1;
            i += z + 1;
            after_full = false;
        }
        // SAFETY: every byte below `o` was written (by a store, a code or a placeholder) and
        // `o` is within the capacity.
        unsafe { self.out.set_len(o) };
        self.code_pos = code_pos;
        self.after_full = after_full;
        i
    }

    /// Encodes a stretch of `bytes` where zeros are dense, a word of 8
    /// bytes at a time, without branching on the data: the word is copied
    /// as is (each zero lands where the next block's code byte goes), then
    /// each byte position in turn writes the current block's code as if the
    /// block ended there, and a zero moves the block start (a conditional
    /// move). The last write before a block's end is its true code. Stops
    /// at a word without a zero (a run, better left to `memchr`), before a
    /// block could fill up, or after a few words; returns the number of
    /// bytes consumed, a multiple of 8.
    fn push_dense(&mut self, bytes: &[u8]) -> usize {
        const CHUNK: usize = 128;
        let chunk = &bytes[..bytes.len().min(CHUNK)];
        // Work in a slice with the cursors in registers: writes through a
        // `Vec` would reload its length after every byte store. This
        // stretch's encoding is exactly as long as its input.
        let base = self.out.len();
        self.out.resize(base + chunk.len(), 0);
        let buf = &mut self.out[..];
        let mut code_pos = self.code_pos;
        let mut o = base;
        for word in chunk.chunks_exact(8) {
            let w = u64::from_le_bytes([
                word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
            ]);
            // Exact: the high bit of each zero byte, and only those.
            let zeros = !((w & 0x7f7f_7f7f_7f7f_7f7f).wrapping_add(0x7f7f_7f7f_7f7f_7f7f) | w)
                & 0x8080_8080_8080_8080;
            if zeros == 0 || o - code_pos - 1 + 8 >= MAX_BLOCK_DATA {
                break;
            }
            buf[o..o + 8].copy_from_slice(word);
            for k in 0..8 {
                let pos = o + k;
                buf[code_pos] = (pos - code_pos) as u8;
                if zeros >> (8 * k + 7) & 1 != 0 {
                    code_pos = pos;
                }
            }
            o += 8;
        }
        self.out.truncate(o);
        self.code_pos = code_pos;
        let done = o - base;
        if done > 0 {
            self.after_full = false;
        }
        done
    }

    /// Ends the current block at an input zero byte, which its code byte
    /// stands for, and opens the next.
    #[inline(always)]
    fn close_at_zero(&mut self) {
        let block_len = self.out.len() - self.code_pos - 1;
        self.out[self.code_pos] = block_len as u8 + 1;
        self.open_block();
        self.after_full = false;
    }

    /// Appends a zero-free run, closing a full block every 254 bytes.
    #[inline]
    fn push_run(&mut self, mut run: &[u8]) {
        while !run.is_empty() {
            let block_len = self.out.len() - self.code_pos - 1;
            let take = run.len().min(MAX_BLOCK_DATA - block_len);
            self.out.extend_from_slice(&run[..take]);
            self.after_full = false;
            run = &run[take..];
            if block_len + take == MAX_BLOCK_DATA {
                self.out[self.code_pos] = 0xff;
                self.open_block();
                self.after_full = true;
            }
        }
    }

    /// Encodes `n` zero bytes: each closes a block, so this is the current
    /// block's code followed by `n - 1` empty blocks (code 1). Padding
    /// payloads are all zeros and go through here in one `resize`.
    pub(crate) fn push_zeros(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.close_at_zero();
        // Each further zero closes an empty block (code 1); the last slot
        // is the open block's placeholder.
        let first = self.code_pos;
        self.out.truncate(first);
        self.out.resize(first + n - 1, 1);
        self.open_block();
    }

    #[inline(always)]
    fn open_block(&mut self) {
        self.code_pos = self.out.len();
        self.out.push(0);
    }

    /// Closes the encoding; returns the number of bytes it appended.
    pub fn finish(self) -> usize {
        if self.after_full {
            // Input ended right after a full block: no trailing empty block.
            self.out.pop();
        } else {
            let block_len = self.out.len() - self.code_pos - 1;
            self.out[self.code_pos] = block_len as u8 + 1;
        }
        self.out.len() - self.start
    }
}

/// The codec's code paths, fastest first: AVX-512 (BW, VBMI, VBMI2; see `avx512`), AVX2
/// (the encoder's 64-byte steps and the decoder's inline copies), and portable code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Avx512 = 0,
    Avx2 = 1,
    Portable = 2,
}

impl Level {
    /// Every level, fastest first.
    pub const ALL: [Level; 3] = [Level::Avx512, Level::Avx2, Level::Portable];

    /// The fastest level this CPU runs: detected once, then one relaxed load (a frame of
    /// 64 bytes encodes in about 15 ns, so seven feature checks per call would show).
    #[inline]
    pub fn best() -> Level {
        use std::sync::atomic::{AtomicU8, Ordering};
        const UNKNOWN: u8 = u8::MAX;
        static BEST: AtomicU8 = AtomicU8::new(UNKNOWN);
        let levels = [Level::Avx512, Level::Avx2, Level::Portable];
        match BEST.load(Ordering::Relaxed) {
            UNKNOWN => {
                let best = Self::detect();
                BEST.store(best as u8, Ordering::Relaxed);
                best
            }
            k => levels[usize::from(k).min(2)],
        }
    }

    fn detect() -> Level {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            return Level::Avx512;
        }
        if vector::available() {
            Level::Avx2
        } else {
            Level::Portable
        }
    }

    /// Whether this CPU runs this level (every CPU with AVX-512 has AVX2).
    pub fn available(self) -> bool {
        self as u8 >= Self::best() as u8
    }
}

/// Whether the encoder's AVX2 loop can run on this CPU.
mod vector {
    /// Bytes the vector loop may store past the end of the encoding.
    pub(super) const STORE_SLACK: usize = 64;
    /// Input below this length goes through the word loop only.
    pub(super) const MIN_INPUT: usize = 64;

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) fn available() -> bool {
        // Cached by std after the first call (one relaxed atomic load).
        std::is_x86_feature_detected!("avx2")
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub(super) fn available() -> bool {
        false
    }
}

/// COBS-encodes the concatenation of `parts` and appends it to `out`.
pub fn encode_parts(parts: &[&[u8]], out: &mut Vec<u8>) {
    let mut enc = Encoder::new(out);
    for part in parts {
        enc.push(part);
    }
    enc.finish();
}

/// COBS-encodes `input` and appends it to `out`.
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if input.len() <= avx512::SHORT_ENCODE && Level::best() == Level::Avx512 {
        // SAFETY: `Level::Avx512` is only chosen where the CPU has what it needs.
        unsafe { avx512::encode_short(input, out) };
        return;
    }
    let mut enc = Encoder::new(out);
    enc.push(input);
    enc.finish();
}

/// The error the block-by-block reference decoder reports for an input
/// whose first zero byte is at `zero`: whichever it meets first, a block
/// running past the end or the zero itself. Only block headers are read.
fn zero_byte_error(input: &[u8], zero: usize) -> CobsError {
    let mut i = 0;
    loop {
        if i >= zero {
            return CobsError::ZeroByte { at: zero };
        }
        let end = i + usize::from(input[i]);
        if end >= input.len() {
            // Either the block runs past the end, or it ends exactly at the
            // end and so must contain the zero.
            return if end > input.len() {
                CobsError::Truncated
            } else {
                CobsError::ZeroByte { at: zero }
            };
        }
        if zero < end {
            return CobsError::ZeroByte { at: zero };
        }
        i = end;
    }
}

/// Checks that `input` is a valid encoding and returns the length of its
/// decoding, reading only the block headers (and one `memchr` pass).
pub fn decoded_len(input: &[u8]) -> Result<usize, CobsError> {
    if input.is_empty() {
        return Err(CobsError::Empty);
    }
    if let Some(z) = memchr::memchr(0, input) {
        return Err(zero_byte_error(input, z));
    }
    blocks_len(input)
}

/// The decoded length of a zero-free `input` (possibly empty).
fn blocks_len(input: &[u8]) -> Result<usize, CobsError> {
    let mut i = 0;
    let mut len = 0;
    while i < input.len() {
        let code = usize::from(input[i]);
        let end = i + code;
        if end > input.len() {
            return Err(CobsError::Truncated);
        }
        len += code - 1 + usize::from(code != 0xff && end < input.len());
        i = end;
    }
    Ok(len)
}

/// Decodes `input` (which must contain no zero byte) and appends the result
/// to `out`. On error `out` is left as it was.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), CobsError> {
    if input.is_empty() {
        return Err(CobsError::Empty);
    }
    if let Some(z) = memchr::memchr(0, input) {
        return Err(zero_byte_error(input, z));
    }
    decode_zero_free(input, out)
}

/// Decodes `input` into the front of `out` and returns the decoded length.
/// The decoding is never longer than `input.len() - 1` bytes, so an `out`
/// that long always suffices. Bytes of `out` past the returned length may
/// have been overwritten. On error `out` holds partial output.
pub fn decode_into(input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
    if input.is_empty() {
        return Err(CobsError::Empty);
    }
    if let Some(z) = memchr::memchr(0, input) {
        return Err(zero_byte_error(input, z));
    }
    decode_blocks(input, out)
}

/// Decodes an encoding found between two markers, which therefore holds no
/// zero byte, into the front of `out`: [`decode_into`] without its check
/// for zero bytes. A zero byte in `input` is not detected; it decodes to
/// some bytes (never a panic), which a frame's CRC then rejects.
pub fn decode_run_into(input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
    if input.is_empty() {
        return Err(CobsError::Empty);
    }
    decode_blocks(input, out)
}

/// Small blocks (at most this many bytes with their code) are decoded in
/// windows of this size: one fixed-size copy for all the blocks inside,
/// then a zero written where each code byte stood.
pub const WINDOW: usize = 64;

/// Large blocks are copied as this many bytes where both buffers have room (a block holds
/// at most 254): a fixed-size copy the compiler turns into inline vector moves where the CPU
/// has AVX2, rather than a `memcpy` call that dispatches on the length.
const LARGE_WINDOW: usize = 256;

/// The decoding loop, for an input without zero bytes.
fn decode_blocks(input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
    decode_blocks_at(Level::best(), input, out)
}

/// [`decode_blocks`] on the given code path.
fn decode_blocks_at(level: Level, input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is only chosen where the CPU supports it. (Short inputs are
        // told apart here, so that they do not pay for the block loop's prologue.)
        Level::Avx512 => unsafe {
            if input.len() <= avx512::SHORT_INPUT && out.len() >= avx512::SHORT_INPUT - 1 {
                avx512::decode_short(input, out)
            } else {
                decode_blocks_avx512(input, out)
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Level::Avx2 => unsafe { decode_blocks_avx2(input, out) },
        _ => decode_blocks_portable(input, out, |src, dst| dst.copy_from_slice(src)),
    }
}

/// [`decode_blocks_portable`] compiled for AVX-512: fixed-size copies become inline 64-byte
/// moves, and blocks near the end of the buffers are copied with masked moves instead of a
/// `memcpy` call. (Inputs of up to 65 bytes take `avx512::decode_short` instead.)
///
/// # Safety
/// The CPU supports what `avx512::available` checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,bmi1,bmi2,lzcnt")]
unsafe fn decode_blocks_avx512(input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
    // SAFETY: this function's own contract.
    decode_blocks_portable(input, out, |src, dst| unsafe {
        avx512::copy_short(src, dst)
    })
}

/// [`decode_blocks_portable`] compiled for AVX2, where its fixed-size copies become inline
/// 32-byte moves.
///
/// # Safety
/// The CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_blocks_avx2(input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
    decode_blocks_portable(input, out, |src, dst| dst.copy_from_slice(src))
}

/// The decoding loop; `copy` copies a block's data (the whole of its first argument) to the
/// front of its second argument where a fixed-size copy would run past a buffer's end.
#[inline(always)]
fn decode_blocks_portable(
    input: &[u8],
    out: &mut [u8],
    copy: impl Fn(&[u8], &mut [u8]),
) -> Result<usize, CobsError> {
    let n = input.len();
    let too_small = CobsError::OutputTooSmall {
        capacity: out.len(),
    };
    let mut i = 0;
    let mut o = 0;
    while i < n {
        let code = usize::from(input[i]);
        let end = i + code;
        if code > WINDOW {
            // A large block (long runs, text, random data): one copy, of fixed size where
            // both buffers have room (the bytes past the block are overwritten by what
            // follows, or lie beyond the decoded length, as with the small-block windows).
            if end <= n
                && let Some(src) = input
                    .get(i + 1..)
                    .and_then(|r| r.first_chunk::<LARGE_WINDOW>())
                && let Some(dst) = out
                    .get_mut(o..)
                    .and_then(|r| r.first_chunk_mut::<LARGE_WINDOW>())
            {
                *dst = *src;
                o += code - 1;
                i = end;
                if code != 0xff && i < n {
                    *out.get_mut(o).ok_or(too_small)? = 0;
                    o += 1;
                }
                continue;
            }
            let data = input.get(i + 1..end).ok_or(CobsError::Truncated)?;
            copy(data, out.get_mut(o..o + data.len()).ok_or(too_small)?);
            o += data.len();
            i = end;
            // A full block (code 255) stands for no zero.
            if code != 0xff && i < n {
                *out.get_mut(o).ok_or(too_small)? = 0;
                o += 1;
            }
            continue;
        }
        if code == 0 {
            // Only `decode_run_into` gets here, with input that broke its
            // contract.
            return Err(CobsError::ZeroByte { at: i });
        }
        if let Some(src) = input.get(i + 1..i + 1 + WINDOW)
            && let Some(dst) = out.get_mut(o..o + WINDOW)
        {
            // Copy the window, then walk the blocks that lie inside it.
            // Decoded, block data and the zeros between blocks are the
            // input shifted by one, with each code byte replaced by zero.
            dst.copy_from_slice(src);
            let limit = i + 1 + WINDOW;
            let mut j = end;
            loop {
                if j >= n {
                    if j > n {
                        return Err(CobsError::Truncated);
                    }
                    // The last block: no zero after it.
                    o += j - i - 1;
                    i = j;
                    break;
                }
                dst[j - i - 1] = 0;
                let c = input[j];
                let next = j + usize::from(c);
                if c == 0xff || c == 0 || next >= limit {
                    // The next block does not fit the window (or stands
                    // for no zero, or is invalid): start afresh from it.
                    o += j - i;
                    i = j;
                    break;
                }
                j = next;
            }
            continue;
        }
        // A small block near the end of either buffer.
        let data = input.get(i + 1..end).ok_or(CobsError::Truncated)?;
        copy(data, out.get_mut(o..o + data.len()).ok_or(too_small)?);
        o += data.len();
        i = end;
        if i < n {
            *out.get_mut(o).ok_or(too_small)? = 0;
            o += 1;
        }
    }
    Ok(o)
}

/// Decodes a zero-free encoding, appending to `out`; on error `out` is
/// restored to its original length.
pub(crate) fn decode_zero_free(input: &[u8], out: &mut Vec<u8>) -> Result<(), CobsError> {
    let start = out.len();
    // The decoding is at most `input.len()` bytes; the slack lets the
    // window copies run to the end.
    out.resize(start + input.len() + WINDOW, 0);
    match decode_blocks(input, &mut out[start..]) {
        Ok(n) => {
            out.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// A reader of decoded bytes from a zero-free encoding, used to take a
/// frame header off the front without decoding the whole body twice.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    input: &'a [u8],
    /// Next unread byte of `input`.
    pos: usize,
    /// Data bytes left in the current block.
    left: usize,
    /// Whether the current block stands for a zero after its data.
    zero_after: bool,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(input: &'a [u8]) -> Self {
        Self {
            input,
            pos: 0,
            left: 0,
            zero_after: false,
        }
    }

    /// The next decoded byte, `None` at the end of the body.
    pub(crate) fn next_byte(&mut self) -> Result<Option<u8>, CobsError> {
        loop {
            if self.left > 0 {
                let b = self.input[self.pos];
                self.pos += 1;
                self.left -= 1;
                return Ok(Some(b));
            }
            if self.zero_after {
                self.zero_after = false;
                return Ok(Some(0));
            }
            let Some(&code) = self.input.get(self.pos) else {
                return Ok(None);
            };
            let end = self.pos + usize::from(code);
            if end > self.input.len() {
                return Err(CobsError::Truncated);
            }
            self.pos += 1;
            self.left = usize::from(code) - 1;
            self.zero_after = code != 0xff && end < self.input.len();
        }
    }

    /// Decodes everything not yet read and appends it to `out`.
    pub(crate) fn read_rest(self, out: &mut Vec<u8>) -> Result<(), CobsError> {
        // One allocation for everything, window slack included.
        out.reserve(self.left + 1 + (self.input.len() - self.pos) + WINDOW);
        out.extend_from_slice(&self.input[self.pos..self.pos + self.left]);
        if self.zero_after {
            out.push(0);
        }
        decode_zero_free(&self.input[self.pos + self.left..], out)
    }

    /// The decoded length of everything not yet read, checking that the
    /// rest is well formed.
    pub(crate) fn rest_len(&self) -> Result<usize, CobsError> {
        let tail = blocks_len(&self.input[self.pos + self.left..])?;
        Ok(self.left + usize::from(self.zero_after) + tail)
    }
}

/// The codec on a chosen code path, so that tests and fuzz targets check every path this
/// CPU runs, not only the fastest.
#[cfg(any(test, feature = "reference"))]
pub mod at_level {
    use super::{Encoder, Level, decode_blocks_at, zero_byte_error};
    use crate::CobsError;

    /// The levels this CPU runs.
    pub fn available() -> impl Iterator<Item = Level> {
        Level::ALL.into_iter().filter(|l| l.available())
    }

    /// [`super::encode_parts`] on `level` (which must be available).
    pub fn encode_parts(level: Level, parts: &[&[u8]], out: &mut Vec<u8>) {
        assert!(level.available());
        let mut enc = Encoder::with_level(out, level);
        for part in parts {
            enc.push(part);
        }
        enc.finish();
    }

    /// An [`Encoder`] on `level` (which must be available).
    pub fn encoder(level: Level, out: &mut Vec<u8>) -> Encoder<'_> {
        assert!(level.available());
        Encoder::with_level(out, level)
    }

    /// [`super::decode_into`] on `level` (which must be available).
    pub fn decode_into(level: Level, input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
        assert!(level.available());
        if input.is_empty() {
            return Err(CobsError::Empty);
        }
        if let Some(z) = memchr::memchr(0, input) {
            return Err(zero_byte_error(input, z));
        }
        decode_blocks_at(level, input, out)
    }

    /// [`super::decode_run_into`] on `level` (which must be available).
    pub fn decode_run_into(level: Level, input: &[u8], out: &mut [u8]) -> Result<usize, CobsError> {
        assert!(level.available());
        if input.is_empty() {
            return Err(CobsError::Empty);
        }
        decode_blocks_at(level, input, out)
    }
}

/// The plain byte-at-a-time codec, kept as the oracle the fast one is
/// checked against (unit tests, proptests, differential fuzzing).
#[cfg(any(test, feature = "reference"))]
pub mod reference {
    use crate::CobsError;

    /// COBS-encodes the concatenation of `parts` and appends it to `out`.
    pub fn encode_parts(parts: &[&[u8]], out: &mut Vec<u8>) {
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

    /// Decodes `input` and appends the result to `out`.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            (
                [run.clone(), vec![0x00]].concat(),
                [run_enc.clone(), vec![0x01, 0x01]].concat(),
            ),
        ];
        for (raw, enc) in cases {
            let mut out = Vec::new();
            encode(&raw, &mut out);
            assert_eq!(out, enc, "encode {raw:02x?}");
            let mut back = Vec::new();
            decode(&enc, &mut back).unwrap();
            assert_eq!(back, raw, "decode {enc:02x?}");
            let mut buf = vec![0xee; enc.len()];
            let n = decode_into(&enc, &mut buf).unwrap();
            assert_eq!(&buf[..n], &raw[..], "decode_into {enc:02x?}");
            assert_eq!(decoded_len(&enc), Ok(raw.len()));
        }
        // The trailing empty block after a final 255-block is accepted.
        let mut back = Vec::new();
        decode(&[run_enc.clone(), vec![0x01]].concat(), &mut back).unwrap();
        assert_eq!(back, run);
    }

    /// Zero-free runs of every length around the 254-byte block size and the vector width,
    /// ended by one or two zeros, at every alignment, in one piece and in two: the vector
    /// loop's block-filling and zero cases against the reference encoder.
    #[test]
    fn runs_around_block_and_vector_boundaries() {
        let mut checked = 0;
        for lead in [0usize, 1, 31, 32, 33, 200, 253, 254, 255] {
            for run in (0..80).chain(220..300).chain(490..530) {
                for zeros in 0..3 {
                    let mut raw: Vec<u8> = (0..lead).map(|k| (k % 255 + 1) as u8).collect();
                    raw.extend((0..run).map(|k| (k * 7 % 255 + 1) as u8));
                    raw.extend(std::iter::repeat_n(0u8, zeros));
                    raw.extend((0..70).map(|k| (k % 200 + 3) as u8));
                    let mut slow = Vec::new();
                    reference::encode(&raw, &mut slow);
                    let mut fast = Vec::new();
                    encode(&raw, &mut fast);
                    assert_eq!(fast, slow, "lead {lead} run {run} zeros {zeros}");
                    let cut = lead + run / 2;
                    for level in at_level::available() {
                        let mut fast = Vec::new();
                        at_level::encode_parts(level, &[&raw], &mut fast);
                        assert_eq!(fast, slow, "{level:?} lead {lead} run {run} zeros {zeros}");
                        let mut parts = Vec::new();
                        at_level::encode_parts(level, &[&raw[..cut], &raw[cut..]], &mut parts);
                        assert_eq!(
                            parts, slow,
                            "{level:?} two parts, lead {lead} run {run} zeros {zeros}"
                        );
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 4000);
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
        // A truncated block before the zero is reported first, as the
        // block-by-block reference does.
        assert_eq!(decode(&[0x09, 1, 0], &mut out), Err(CobsError::Truncated));
        let mut small = [0u8; 2];
        assert_eq!(
            decode_into(&[0x04, 1, 2, 3], &mut small),
            Err(CobsError::OutputTooSmall { capacity: 2 })
        );
    }

    /// Inputs of every flavour the benchmarks use: random, text-like (few
    /// zeros, long runs), zero-heavy, and byte patterns around the 254-byte
    /// block boundary.
    fn raw_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..1200),
            proptest::collection::vec(prop_oneof![9 => 1u8..=255, 1 => Just(0u8)], 0..1200),
            proptest::collection::vec(prop_oneof![1 => 1u8..=255, 3 => Just(0u8)], 0..600),
            (0usize..4, 250usize..260, 0usize..4).prop_map(|(a, run, b)| {
                let mut v = vec![0u8; a];
                v.extend(std::iter::repeat_n(0x41, run));
                v.extend(std::iter::repeat_n(0, b));
                v
            }),
            (1usize..4, 0usize..3).prop_map(|(runs, tail)| {
                let mut v: Vec<u8> = std::iter::repeat_n(7u8, 254 * runs).collect();
                v.extend(std::iter::repeat_n(0, tail));
                v
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The fast codec agrees byte for byte with the reference, and
        /// round-trips.
        #[test]
        fn matches_reference(raw in raw_bytes(), split in any::<proptest::sample::Index>()) {
            let mut fast = vec![0xaa];
            encode(&raw, &mut fast);
            let mut slow = vec![0xaa];
            reference::encode(&raw, &mut slow);
            prop_assert_eq!(&fast, &slow);
            prop_assert!(fast.len() - 1 <= max_encoded_len(raw.len()));
            prop_assert!(!fast[1..].contains(&0));

            // Every code path, in one piece and in two, gives the same bytes.
            let cut = split.index(raw.len() + 1);
            for level in at_level::available() {
                let mut whole = vec![0xaa];
                at_level::encode_parts(level, &[&raw], &mut whole);
                prop_assert_eq!(&whole, &slow, "{:?}", level);
                let mut parts = vec![0xaa];
                at_level::encode_parts(level, &[&raw[..cut], &raw[cut..]], &mut parts);
                prop_assert_eq!(&parts, &slow, "{:?} in two parts", level);
            }

            let enc = &fast[1..];
            let mut back = vec![0xbb];
            decode(enc, &mut back).unwrap();
            prop_assert_eq!(&back[1..], &raw[..]);
            for level in at_level::available() {
                let mut buf = vec![0u8; enc.len()];
                let n = at_level::decode_into(level, enc, &mut buf).unwrap();
                prop_assert_eq!(&buf[..n], &raw[..], "{:?}", level);
            }
            prop_assert_eq!(decoded_len(enc), Ok(raw.len()));
        }

        /// On arbitrary (mostly invalid) input, decode gives exactly the
        /// reference's result, and decode_into and decoded_len agree.
        #[test]
        fn decode_matches_reference(input in proptest::collection::vec(
            prop_oneof![8 => 1u8..=255, 1 => Just(0u8), 1 => 250u8..=255], 0..600)) {
            let mut fast = Vec::new();
            let mut slow = Vec::new();
            let rf = decode(&input, &mut fast);
            let rs = reference::decode(&input, &mut slow);
            prop_assert_eq!(rf, rs);
            if rs.is_ok() {
                prop_assert_eq!(&fast, &slow);
            }
            for level in at_level::available() {
                let mut buf = vec![0u8; input.len()];
                let ri = at_level::decode_into(level, &input, &mut buf);
                prop_assert_eq!(
                    ri.map(|n| buf[..n].to_vec()),
                    rs.map(|()| slow.clone()),
                    "{:?}", level
                );
            }
            prop_assert_eq!(decoded_len(&input), rs.map(|()| slow.len()));
        }

        /// The incremental encoder, fed in any pieces (including runs of
        /// zeros through `push_zeros`), gives the reference encoding of the
        /// concatenation.
        #[test]
        fn encoder_pieces(pieces in proptest::collection::vec(prop_oneof![
            raw_bytes().prop_map(Ok),
            (0usize..600).prop_map(Err),
        ], 0..5)) {
            let mut whole = Vec::new();
            for p in &pieces {
                match p {
                    Ok(bytes) => whole.extend_from_slice(bytes),
                    Err(zeros) => whole.resize(whole.len() + zeros, 0),
                }
            }
            let mut slow = vec![0x55];
            reference::encode(&whole, &mut slow);
            for level in at_level::available() {
                let mut fast = vec![0x55];
                let mut enc = at_level::encoder(level, &mut fast);
                for p in &pieces {
                    match p {
                        Ok(bytes) => enc.push(bytes),
                        Err(zeros) => enc.push_zeros(*zeros),
                    }
                }
                let n = enc.finish();
                prop_assert_eq!(n, slow.len() - 1, "{:?}", level);
                prop_assert_eq!(&fast, &slow, "{:?}", level);
            }
        }

        /// Decoding into a buffer of exactly the decoded length works; a
        /// shorter one is refused, never overrun.
        #[test]
        fn decode_into_tight_buffers(raw in raw_bytes(), short in 1usize..8) {
            let mut enc = Vec::new();
            encode(&raw, &mut enc);
            for level in at_level::available() {
                let mut exact = vec![0u8; raw.len()];
                prop_assert_eq!(at_level::decode_into(level, &enc, &mut exact), Ok(raw.len()));
                prop_assert_eq!(&exact, &raw);
                exact.fill(0);
                prop_assert_eq!(at_level::decode_run_into(level, &enc, &mut exact), Ok(raw.len()));
                prop_assert_eq!(&exact, &raw);
                if raw.len() >= short {
                    let mut small = vec![0u8; raw.len() - short];
                    prop_assert_eq!(
                        at_level::decode_into(level, &enc, &mut small),
                        Err(CobsError::OutputTooSmall { capacity: raw.len() - short })
                    );
                }
            }
        }

        /// `decode_run_into` trusts its input to hold no zero byte; when it
        /// does not, it still terminates without panicking.
        #[test]
        fn decode_run_into_survives_zeros(input in proptest::collection::vec(
            prop_oneof![4 => 1u8..=255, 1 => Just(0u8), 1 => 1u8..4], 0..400)) {
            for level in at_level::available() {
                let mut out = vec![0u8; input.len() + 70];
                let _ = at_level::decode_run_into(level, &input, &mut out);
                let mut small = vec![0u8; input.len() / 2];
                let _ = at_level::decode_run_into(level, &input, &mut small);
            }
        }

        /// The header reader yields the decoding byte by byte, and hands
        /// over the rest at any point.
        #[test]
        fn reader_matches(raw in raw_bytes(), take in 0usize..40) {
            let mut enc = Vec::new();
            encode(&raw, &mut enc);
            let mut r = Reader::new(&enc);
            let mut got = Vec::new();
            for _ in 0..take {
                match r.next_byte().unwrap() {
                    Some(b) => got.push(b),
                    None => break,
                }
            }
            prop_assert_eq!(r.rest_len(), Ok(raw.len() - got.len()));
            r.read_rest(&mut got).unwrap();
            prop_assert_eq!(got, raw);
        }
    }
}
