//! The prefix index's hash table: open addressing with linear probing,
//! keyed by a block hash's low 64 bits, that can prefetch a key's bucket
//! ahead of the probe (a chain's buckets are known before they are read,
//! but reached at random: one cache miss each, overlapped when prefetched).
//!
//! Keys are already uniform (block hashes), so a key's home bucket is one
//! multiply-shift of it (Fibonacci hashing: still spreads keys that a
//! caller chose with structure, `BlockHash(k << 40)` say). Deletion shifts
//! the following run back instead of leaving tombstones, so probes never
//! grow with churn. At most half the buckets are full.

use crate::ids::BlockId;

/// Marks a free bucket (no block has this id: `num_blocks < u32::MAX`).
const EMPTY: BlockId = BlockId::MAX;

/// One bucket: a key, the rest of its entry's hash and its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    key: u64,
    high: u64,
    block: BlockId,
}

const FREE: Bucket = Bucket {
    key: 0,
    high: 0,
    block: EMPTY,
};

/// Map from a 64-bit key to `(high, block)`: one entry per key.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    buckets: Box<[Bucket]>,
    /// `64 - log2(buckets.len())`: a key's home is its product's top bits.
    shift: u32,
    len: usize,
}

impl Default for Table {
    fn default() -> Self {
        Self::with_buckets(MIN_BUCKETS)
    }
}

const MIN_BUCKETS: usize = 16;

impl Table {
    fn with_buckets(n: usize) -> Self {
        debug_assert!(n.is_power_of_two() && n >= 2);
        Self {
            buckets: vec![FREE; n].into_boxed_slice(),
            shift: 64 - n.trailing_zeros(),
            len: 0,
        }
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// The bucket holding `key`, or the free one ending its probe.
    fn find(&self, key: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let b = &self.buckets[i];
            if b.block == EMPTY {
                return (i, false);
            }
            if b.key == key {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The entry under `key`: `(high, block)`.
    pub(crate) fn get(&self, key: u64) -> Option<(u64, BlockId)> {
        match self.find(key) {
            (i, true) => Some((self.buckets[i].high, self.buckets[i].block)),
            _ => None,
        }
    }

    /// Inserts `(high, block)` under `key` unless an entry is there;
    /// returns whether it was inserted.
    pub(crate) fn insert(&mut self, key: u64, high: u64, block: BlockId) -> bool {
        debug_assert_ne!(block, EMPTY);
        if (self.len + 1) * 2 > self.buckets.len() {
            self.grow();
        }
        let (i, found) = self.find(key);
        if found {
            return false;
        }
        self.buckets[i] = Bucket { key, high, block };
        self.len += 1;
        true
    }

    /// Removes the entry under `key`, returning its `(high, block)`.
    pub(crate) fn remove(&mut self, key: u64) -> Option<(u64, BlockId)> {
        let (mut hole, true) = self.find(key) else {
            return None;
        };
        let removed = self.buckets[hole];
        let mask = self.mask();
        // Backward shift: an entry further along the run moves into the
        // hole unless its home lies after the hole (cyclically), where a
        // probe from its home would no longer pass the hole.
        let mut j = (hole + 1) & mask;
        while self.buckets[j].block != EMPTY {
            let home = self.home(self.buckets[j].key);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.buckets[hole] = self.buckets[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.buckets[hole] = FREE;
        self.len -= 1;
        Some((removed.high, removed.block))
    }

    /// Asks the processor to bring `key`'s home bucket and the one after
    /// it (where a probe or a removal's shift reads next) into cache: a
    /// hint, with no effect on the table's contents. A 24-byte bucket may
    /// straddle two cache lines, so both ends are fetched.
    pub(crate) fn prefetch(&self, key: u64) {
        let home = self.home(key);
        let first: *const Bucket = &self.buckets[home];
        let next: *const Bucket = &self.buckets[(home + 1) & self.mask()];
        prefetch_line(first.cast());
        prefetch_line(next.wrapping_add(1).cast::<i8>().wrapping_sub(1));
    }

    /// Every entry: `(key, high, block)`.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64, BlockId)> + '_ {
        self.buckets
            .iter()
            .filter(|b| b.block != EMPTY)
            .map(|b| (b.key, b.high, b.block))
    }

    /// Doubles the buckets, reinserting every entry.
    fn grow(&mut self) {
        let old = std::mem::replace(self, Self::with_buckets(self.buckets.len() * 2));
        for b in old.buckets.iter().filter(|b| b.block != EMPTY) {
            let (i, _) = self.find(b.key);
            self.buckets[i] = *b;
        }
        self.len = old.len;
    }
}

/// A prefetch of the cache line at `p` into every cache level, where the
/// target has an instruction for it; nothing elsewhere.
#[inline(always)]
pub(crate) fn prefetch_line(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing into the program;
    // SSE is part of the x86_64 baseline.
    #[allow(unused_unsafe)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64, BlockId),
        Remove(u64),
        Get(u64),
    }

    /// Keys from a small range (so that operations meet), some spread over
    /// all 64 bits and some sharing their low or high bits (long runs).
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![
            0..64u64,
            (0..64u64).prop_map(|k| k << 40),
            (0..64u64).prop_map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (key(), any::<u64>(), 0..1000u32).prop_map(|(k, h, b)| Op::Insert(k, h, b)),
            2 => key().prop_map(Op::Remove),
            1 => key().prop_map(Op::Get),
        ]
    }

    proptest! {
        /// Any sequence of inserts, removes and lookups answers as a
        /// `HashMap` does, and every entry stays reachable from its home.
        #[test]
        fn behaves_as_a_hash_map(ops in prop::collection::vec(op(), 1..400)) {
            let mut table = Table::default();
            let mut model: HashMap<u64, (u64, BlockId)> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, h, b) => {
                        let vacant = !model.contains_key(&k);
                        if vacant {
                            model.insert(k, (h, b));
                        }
                        prop_assert_eq!(table.insert(k, h, b), vacant);
                    }
                    Op::Remove(k) => prop_assert_eq!(table.remove(k), model.remove(&k)),
                    Op::Get(k) => prop_assert_eq!(table.get(k), model.get(&k).copied()),
                }
                prop_assert_eq!(table.len(), model.len());
                prop_assert!(table.len() * 2 <= table.buckets.len());
            }
            let mut entries: Vec<_> = table.iter().collect();
            entries.sort_unstable();
            let mut want: Vec<_> = model.iter().map(|(&k, &(h, b))| (k, h, b)).collect();
            want.sort_unstable();
            prop_assert_eq!(entries, want);
            for (k, v) in &model {
                table.prefetch(*k);
                prop_assert_eq!(table.get(*k), Some(*v));
            }
        }
    }

    #[test]
    fn removal_in_a_run_that_wraps_keeps_every_key_reachable() {
        // Keys whose homes are the last bucket: their run wraps to the start.
        let mut table = Table::with_buckets(16);
        let last: Vec<u64> = (0..u64::MAX / 7)
            .step_by(1 << 20)
            .map(|k| k.wrapping_mul(7))
            .filter(|&k| table.home(k) == 15)
            .take(4)
            .collect();
        assert_eq!(last.len(), 4);
        for (b, &k) in last.iter().enumerate() {
            assert!(table.insert(k, 0, b as BlockId));
        }
        assert_eq!(table.remove(last[0]), Some((0, 0)));
        for (b, &k) in last.iter().enumerate().skip(1) {
            assert_eq!(table.get(k), Some((0, b as BlockId)), "key {b}");
        }
        assert_eq!(table.remove(last[0]), None);
    }
}
