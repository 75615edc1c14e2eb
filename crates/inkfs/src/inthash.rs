//! A hasher for the engine's own integer keys (block and inode numbers):
//! splitmix64's finalizer, so that every input bit reaches the low bits a
//! table indexes by (keys that a shard picked by their low bits, or runs of
//! blocks far apart, would crowd a plain multiply's buckets). std's
//! SipHash guards against keys an attacker chooses; these are the engine's
//! own, and SipHash cost a few percent of a cached device read and of a
//! client's durable write (its lease table, looked up at every write).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

/// A map keyed by an engine integer.
pub type IntMap<V> = HashMap<u64, V, BuildHasherDefault<IntHasher>>;
/// A set of engine integers.
pub type IntSet = HashSet<u64, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_a_shard_shares_spread_over_the_low_bits() {
        // Inode numbers of one of 16 shards (equal modulo 16): their
        // hashes' low 4 bits must not all be equal.
        let low: IntSet = (0..64u64)
            .map(|i| {
                let mut h = IntHasher::default();
                h.write_u64(i * 16 + 3);
                h.finish() & 15
            })
            .collect();
        assert!(low.len() > 8, "{low:?}");
    }
}
