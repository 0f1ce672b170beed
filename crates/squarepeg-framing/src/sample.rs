//! Deterministic sample payloads, the inputs of the COBS benchmarks
//! (`benches/cobs.rs`, `peg bench framing`) and of some tests: the same
//! bytes everywhere for a given kind, length and seed.

use std::fmt;

/// The shapes of payload the benchmarks report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PayloadKind {
    /// Uniformly random bytes (compressed or encrypted data): a zero every
    /// 256 bytes on average.
    Random,
    /// Printable ASCII with a zero about every 2 KiB (text, JSON): long
    /// zero-free runs, so mostly full 254-byte blocks.
    Text,
    /// Half the bytes zero, the rest small values (sparse binary records,
    /// small integers): many blocks of one or two bytes, COBS's worst case
    /// for per-block work.
    ZeroHeavy,
}

impl PayloadKind {
    /// Every kind, in report order.
    pub const ALL: [PayloadKind; 3] = [Self::Random, Self::Text, Self::ZeroHeavy];

    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Text => "text",
            Self::ZeroHeavy => "zero-heavy",
        }
    }
}

impl fmt::Display for PayloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `len` bytes of `kind`, determined by `seed`.
pub fn payload(kind: PayloadKind, len: usize, seed: u64) -> Vec<u8> {
    // SplitMix64: tiny, fast and good enough for benchmark inputs.
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..len)
        .map(|_| {
            let r = next();
            match kind {
                PayloadKind::Random => r as u8,
                PayloadKind::Text if r % 2048 == 0 => 0,
                PayloadKind::Text => b' ' + ((r >> 16) % 95) as u8,
                PayloadKind::ZeroHeavy if r % 2 == 0 => 0,
                PayloadKind::ZeroHeavy => 1 + ((r >> 8) % 16) as u8,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let n = 1 << 16;
        let zeros = |k| payload(k, n, 1).iter().filter(|&&b| b == 0).count();
        assert!((150..400).contains(&zeros(PayloadKind::Random)));
        assert!((10..80).contains(&zeros(PayloadKind::Text)));
        assert!((n * 2 / 5..n * 3 / 5).contains(&zeros(PayloadKind::ZeroHeavy)));
        assert_eq!(
            payload(PayloadKind::Text, 100, 7),
            payload(PayloadKind::Text, 100, 7)
        );
        assert_ne!(
            payload(PayloadKind::Text, 100, 7),
            payload(PayloadKind::Text, 100, 8)
        );
    }
}
