//! A cheap hasher for the session's integer keys.
//!
//! The keys are message numbers this side assigned, stream ids below the
//! stream limit we grant, and sub-stream ids our own application chose, so
//! no peer can steer them into collisions; SipHash's protection is not
//! needed and its cost showed in message-rate profiles.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-rotate hashing of integers (the scheme of rustc's FxHasher).
#[derive(Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.wrapping_add(i)).wrapping_mul(K);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;
pub(crate) type IntSet<K> = HashSet<K, BuildHasherDefault<IntHasher>>;
