//! A multiply-rotate hash over 8-byte words (the idea of rustc's FxHash), for maps keyed by
//! bytes kvaudit made itself: reply steps in the parent's reader, dumps in a runner's parse
//! memo. Such keys are a hundred bytes to a few kilobytes, and SipHash, the default, cost more
//! than decoding them. The input is kvaudit's own (a worker's frames, a target's dumps), not an
//! attacker's: hash flooding is no concern here.

/// Builds [`WordHasher`]s: the `S` of a `HashMap<K, V, S>`.
#[derive(Default, Clone, Copy)]
pub struct BuildWordHasher;

impl std::hash::BuildHasher for BuildWordHasher {
    type Hasher = WordHasher;
    fn build_hasher(&self) -> WordHasher {
        WordHasher(0)
    }
}

/// The hasher: each 8-byte word rotated in and multiplied.
pub struct WordHasher(u64);

impl WordHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// Bytes from which [`WordHasher::write`] hashes in four lanes.
const LANES_FROM: usize = 64;

impl std::hash::Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        // A long input goes through four independent lanes, folded in at the end: one lane's
        // multiply waits for the one before it, so a kilobyte took as long as a trial's
        // bookkeeping; four keep the multiplier busy.
        let mut bytes = bytes;
        if bytes.len() >= LANES_FROM {
            let mut lanes = [self.0, 1, 2, 3].map(WordHasher);
            let mut blocks = bytes.chunks_exact(32);
            for b in &mut blocks {
                for (lane, w) in lanes.iter_mut().zip(b.chunks_exact(8)) {
                    lane.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
                }
            }
            self.0 = lanes[0].0;
            for lane in &lanes[1..] {
                self.add(lane.0);
            }
            bytes = blocks.remainder();
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let mut last = [0u8; 8];
        let rest = words.remainder();
        last[..rest.len()].copy_from_slice(rest);
        self.add(u64::from_le_bytes(last) ^ (rest.len() as u64) << 59);
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hasher};

    use super::*;

    #[test]
    fn equal_bytes_hash_alike_and_a_changed_byte_or_length_hashes_otherwise() {
        let h = |b: &[u8]| {
            let mut s = BuildWordHasher.build_hasher();
            s.write(b);
            s.finish()
        };
        let a: Vec<u8> = (0..37).collect();
        assert_eq!(h(&a), h(&a.clone()));
        let mut b = a.clone();
        b[36] ^= 1;
        assert_ne!(h(&a), h(&b));
        assert_ne!(h(&a[..36]), h(&a));
        // Trailing zero bytes are not lost in the last, padded word.
        assert_ne!(h(&[1, 0]), h(&[1]));
        // Long inputs (four lanes): a changed byte in any lane, or words swapped between
        // lanes, hash otherwise.
        let long: Vec<u8> = (0..200u8).collect();
        assert_eq!(h(&long), h(&long.clone()));
        for at in [0, 8, 16, 24, 31, 100, 199] {
            let mut c = long.clone();
            c[at] ^= 1;
            assert_ne!(h(&long), h(&c), "byte {at}");
        }
        let mut swapped = long.clone();
        swapped[..16].rotate_left(8);
        assert_ne!(h(&long), h(&swapped));
    }
}
