//! The prefix index: block hash -> physical block, sharded so that lookups
//! (`match_prefix`) run in parallel with each other and with the manager.
//!
//! Writers hold the manager's state lock and then one shard's write lock at a
//! time (lock order: state, then shard). Readers take only shard read locks:
//! a lookup read-locks each shard it needs once and holds it to the end, so
//! it never blocks on the manager, and since only one writer (the state
//! lock's holder) ever waits, and for one shard, no cycle can form.

mod table;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub(crate) use self::table::prefetch_line;
use self::table::Table;
use crate::hash::BlockHash;
use crate::ids::{BlockId, TokenId};
use crate::sync::{RwLock, WriteGuard};

#[cfg(not(loom))]
const SHARDS: usize = 16;
#[cfg(loom)]
const SHARDS: usize = 2;

/// Block hashes are already uniform: the tokens' map hashes a key (a
/// hash's low 64 bits) to itself.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type Map<V> = HashMap<u64, V, BuildHasherDefault<PassThrough>>;

/// The table's key and the entry's `high` of a hash: the table keeps the
/// high 64 bits beside the block and compares them on every lookup, so a
/// block is only found by its full 128-bit hash.
fn split(hash: BlockHash) -> (u64, u64) {
    (hash.0 as u64, (hash.0 >> 64) as u64)
}

/// One shard, aligned so that inside `RwLock<Shard>` it starts on a cache
/// line after the lock word: readers' updates of the lock word then do not
/// evict the maps' headers from other cores (measured: two threads reading
/// one shard ran 1.8x slower per lookup without it).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    map: Table,
    /// The blocks' tokens, by the same key, kept when the manager verifies
    /// tokens on hits (empty otherwise).
    tokens: Map<Box<[TokenId]>>,
}

impl Shard {
    /// The block indexed under `hash`'s key, if any, and whether it is the
    /// block of `hash`: the full hash matches and, when `tokens` are given
    /// and kept, so do its tokens. Another block under the same low 64 bits
    /// is a collision, as a token mismatch is.
    fn get(&self, hash: BlockHash, tokens: Option<&[TokenId]>) -> Option<(BlockId, bool)> {
        let (key, high) = split(hash);
        let (have, block) = self.map.get(key)?;
        let same = have == high
            && match (self.tokens.get(&key), tokens) {
                (Some(have), Some(want)) => **have == *want,
                _ => true,
            };
        Some((block, same))
    }
}

/// Sharded map from block hash to the one block cached under it.
#[derive(Debug)]
pub(crate) struct PrefixIndex {
    shards: Vec<RwLock<Shard>>,
}

impl PrefixIndex {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
        }
    }

    /// The shard of every block of the chain whose first block is `root`.
    pub(crate) fn shard_of_chain(root: BlockHash) -> u8 {
        ((root.0 >> 64) as usize % SHARDS) as u8
    }

    /// Blocks of the leading run of `keys` (a chain, from its root) found in
    /// the index; a key with tokens matches only a block holding them.
    /// The buckets of `ahead` (hashes of the same chain, usually the whole
    /// of it) are prefetched first, so their misses overlap: the lookups
    /// and the inserts that follow a short hit find them in cache.
    pub(crate) fn leading_run<'t>(
        &self,
        keys: impl Iterator<Item = (BlockHash, Option<&'t [TokenId]>)>,
        ahead: &[BlockHash],
    ) -> Vec<BlockId> {
        let mut keys = keys.peekable();
        let Some(&(root, _)) = keys.peek() else {
            return Vec::new();
        };
        let shard = self.shards[Self::shard_of_chain(root) as usize].read();
        for &hash in ahead {
            shard.map.prefetch(split(hash).0);
        }
        let mut run = Vec::with_capacity(keys.size_hint().0);
        for (hash, tokens) in keys {
            match shard.get(hash, tokens) {
                Some((block, true)) => run.push(block),
                _ => break,
            }
        }
        run
    }

    /// The block indexed under `hash` in `shard`, if any, and whether it
    /// holds `tokens` (true when no tokens are given or kept); a block under
    /// another hash with the same low 64 bits counts as not holding them.
    pub(crate) fn get(
        &self,
        shard: u8,
        hash: BlockHash,
        tokens: Option<&[TokenId]>,
    ) -> Option<(BlockId, bool)> {
        self.shards[shard as usize].read().get(hash, tokens)
    }

    /// Write access for a batch of inserts and removals: it holds one
    /// shard's write lock at a time, from the first call on that shard to
    /// the first call on another (or its drop), so a chain's blocks cost one
    /// lock round trip, not one each.
    pub(crate) fn writer(&self) -> IndexWriter<'_> {
        IndexWriter {
            index: self,
            held: None,
        }
    }

    /// Number of indexed blocks.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().map.len()).sum()
    }

    /// Every (hash, block) pair, for invariant checks.
    pub(crate) fn entries(&self) -> Vec<(BlockHash, BlockId)> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.read()
                    .map
                    .iter()
                    .map(|(key, high, block)| {
                        (BlockHash(u128::from(high) << 64 | u128::from(key)), block)
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// Batched write access to a [`PrefixIndex`] ([`PrefixIndex::writer`]).
pub(crate) struct IndexWriter<'a> {
    index: &'a PrefixIndex,
    held: Option<(u8, WriteGuard<'a, Shard>)>,
}

impl IndexWriter<'_> {
    /// `shard`, write-locked (the lock of another shard held before is
    /// released first: one shard at a time).
    fn shard(&mut self, shard: u8) -> &mut Shard {
        if self.held.as_ref().is_some_and(|(s, _)| *s != shard) {
            self.held = None;
        }
        let (_, guard) = self
            .held
            .get_or_insert_with(|| (shard, self.index.shards[shard as usize].write()));
        guard
    }

    /// Prefetches the bucket of `hash` in `shard` when that shard is the
    /// one held, or none is (then it is locked): a hint ahead of an
    /// `insert` or `remove`, never a lock switch of its own.
    pub(crate) fn prefetch(&mut self, shard: u8, hash: BlockHash) {
        if self.held.as_ref().is_none_or(|(s, _)| *s == shard) {
            self.shard(shard).map.prefetch(split(hash).0);
        }
    }

    /// Indexes `block` under `hash` unless another block already is (or
    /// another hash with the same low 64 bits: the table holds one entry
    /// per key); returns whether it was inserted.
    pub(crate) fn insert(
        &mut self,
        shard: u8,
        hash: BlockHash,
        block: BlockId,
        tokens: Option<&[TokenId]>,
    ) -> bool {
        let (key, high) = split(hash);
        let shard = self.shard(shard);
        if !shard.map.insert(key, high, block) {
            return false;
        }
        if let Some(tokens) = tokens {
            shard.tokens.insert(key, Box::from(tokens));
        }
        true
    }

    /// The block indexed under `hash` in `shard`, if any.
    pub(crate) fn block_of(&mut self, shard: u8, hash: BlockHash) -> Option<BlockId> {
        let (key, high) = split(hash);
        let (h, block) = self.shard(shard).map.get(key)?;
        (h == high).then_some(block)
    }

    /// Drops the entry of `hash`, which is indexed, from `shard`.
    pub(crate) fn remove(&mut self, shard: u8, hash: BlockHash) {
        let (key, high) = split(hash);
        let shard = self.shard(shard);
        let removed = shard.map.remove(key);
        debug_assert!(
            removed.is_some_and(|(h, _)| h == high),
            "{hash:?} is indexed"
        );
        if !shard.tokens.is_empty() {
            shard.tokens.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_sharing_their_low_64_bits_are_never_confused() {
        let index = PrefixIndex::new();
        let a = BlockHash(7 << 64 | 42);
        let b = BlockHash(9 << 64 | 42);
        let shard = PrefixIndex::shard_of_chain(a);
        let mut w = index.writer();
        assert!(w.insert(shard, a, 3, None));
        assert!(!w.insert(shard, b, 4, None), "one entry per low 64 bits");
        drop(w);
        assert_eq!(index.get(shard, a, None), Some((3, true)));
        assert_eq!(index.get(shard, b, None), Some((3, false)), "a collision");
        assert!(index.leading_run([(b, None)].into_iter(), &[b]).is_empty());
        assert_eq!(index.entries(), [(a, 3)]);
        index.writer().remove(shard, a);
        assert_eq!((index.len(), index.get(shard, a, None)), (0, None));
    }

    #[test]
    fn kept_tokens_must_match_and_leave_with_their_entry() {
        let index = PrefixIndex::new();
        let h = BlockHash(1 << 64 | 5);
        let shard = PrefixIndex::shard_of_chain(h);
        assert!(index.writer().insert(shard, h, 2, Some(&[1, 2])));
        assert_eq!(index.get(shard, h, Some(&[1, 2])), Some((2, true)));
        assert_eq!(index.get(shard, h, Some(&[1, 3])), Some((2, false)));
        assert!(index
            .leading_run([(h, Some(&[1, 3][..]))].into_iter(), &[])
            .is_empty());
        index.writer().remove(shard, h);
        assert!(index.writer().insert(shard, h, 4, None));
        assert_eq!(
            index.get(shard, h, Some(&[9, 9])),
            Some((4, true)),
            "no stale tokens"
        );
    }
}
