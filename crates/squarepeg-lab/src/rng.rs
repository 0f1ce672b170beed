//! Seeded, portable randomness.
//!
//! Everything random in the lab draws from ChaCha8 streams and turns the raw 64-bit words into
//! decisions with integer comparisons and correctly rounded IEEE arithmetic only (no `ln`,
//! `cos`, ...), so a seed gives the same results on every machine and every Rust version.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// One independent random stream.
#[derive(Clone, Debug)]
pub(crate) struct Stream(ChaCha8Rng);

impl Stream {
    /// Stream number `stream` of the generator seeded with `seed`. Different stream numbers of
    /// one seed are independent, so enabling one impairment does not shift another's draws.
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Self(rng)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// True with the given chance. Always consumes one draw, so the stream stays aligned
    /// whatever the probability.
    pub(crate) fn chance(&mut self, chance: Chance) -> bool {
        let draw = self.next_u64();
        chance.always || draw < chance.threshold
    }

    /// Uniform integer in `0..n` (`n > 0`), by the widening-multiply method.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A probability compiled to an integer threshold on a 64-bit draw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Chance {
    threshold: u64,
    always: bool,
}

impl Chance {
    /// `probability` is clamped to `[0, 1]` (configs validate it before this).
    pub(crate) fn new(probability: f64) -> Self {
        if probability >= 1.0 {
            Self {
                threshold: u64::MAX,
                always: true,
            }
        } else if probability > 0.0 {
            // p·2^64, exact up to f64 precision; `as` saturates.
            Self {
                threshold: (probability * 18_446_744_073_709_551_616.0) as u64,
                always: false,
            }
        } else {
            Self::default()
        }
    }
}

/// Derives an independent 64-bit seed for a component (`label`) from a master seed
/// (SplitMix64 finaliser over the pair).
pub fn derive_seed(seed: u64, label: u64) -> u64 {
    let mut z = seed ^ label.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chance_extremes() {
        let mut s = Stream::new(1, 0);
        assert!((0..1000).all(|_| !s.chance(Chance::new(0.0))));
        assert!((0..1000).all(|_| s.chance(Chance::new(1.0))));
        assert_eq!(Chance::new(-1.0), Chance::default());
        assert_ne!(Chance::new(1e-12), Chance::default());
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut s = Stream::new(7, 3);
                move |_| s.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut s = Stream::new(7, 3);
                move |_| s.next_u64()
            })
            .collect();
        let c: Vec<u64> = (0..4)
            .map({
                let mut s = Stream::new(7, 4);
                move |_| s.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(derive_seed(1, 1), derive_seed(1, 2));
        assert_ne!(derive_seed(1, 1), derive_seed(2, 1));
    }

    #[test]
    fn below_and_unit_ranges() {
        let mut s = Stream::new(9, 0);
        for _ in 0..10_000 {
            assert!(s.below(7) < 7);
            let u = s.unit_f64();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
