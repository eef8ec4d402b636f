//! The prefix index: block hash -> physical block, sharded so that lookups
//! (`match_prefix`) run in parallel with each other and with the manager.
//!
//! Writers hold the manager's state lock and then one shard's write lock at a
//! time (lock order: state, then shard). Readers take only shard read locks:
//! a lookup read-locks each shard it needs once and holds it to the end, so
//! it never blocks on the manager, and since only one writer (the state
//! lock's holder) ever waits, and for one shard, no cycle can form.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Deref, DerefMut};

use crate::hash::BlockHash;
use crate::ids::{BlockId, TokenId};
use crate::sync::{RwLock, WriteGuard};

#[cfg(not(loom))]
const SHARDS: usize = 16;
#[cfg(loom)]
const SHARDS: usize = 2;

/// Block hashes are already uniform: use their low bits as the map's hash.
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

    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

#[derive(Debug)]
struct Entry {
    block: BlockId,
    /// The block's tokens, kept when the manager verifies tokens on hits.
    tokens: Option<Box<[TokenId]>>,
}

type Map = HashMap<BlockHash, Entry, BuildHasherDefault<PassThrough>>;

/// One shard's map, aligned so that inside `RwLock<Shard>` it starts on a
/// cache line after the lock word: readers' updates of the lock word then do
/// not evict the map's header from other cores (measured: two threads reading
/// one shard ran 1.8x slower per lookup without it).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Map);

impl Deref for Shard {
    type Target = Map;

    fn deref(&self) -> &Map {
        &self.0
    }
}

impl DerefMut for Shard {
    fn deref_mut(&mut self) -> &mut Map {
        &mut self.0
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
    pub(crate) fn leading_run<'t>(
        &self,
        keys: impl Iterator<Item = (BlockHash, Option<&'t [TokenId]>)>,
    ) -> Vec<BlockId> {
        let mut keys = keys.peekable();
        let Some(&(root, _)) = keys.peek() else {
            return Vec::new();
        };
        let shard = self.shards[Self::shard_of_chain(root) as usize].read();
        let mut run = Vec::with_capacity(keys.size_hint().0);
        for (hash, tokens) in keys {
            match (shard.get(&hash), tokens) {
                (
                    Some(Entry {
                        tokens: Some(have), ..
                    }),
                    Some(want),
                ) if **have != *want => break,
                (Some(entry), _) => run.push(entry.block),
                (None, _) => break,
            }
        }
        run
    }

    /// The block indexed under `hash` in `shard`, if any, and whether it
    /// holds `tokens` (true when no tokens are given or kept).
    pub(crate) fn get(
        &self,
        shard: u8,
        hash: BlockHash,
        tokens: Option<&[TokenId]>,
    ) -> Option<(BlockId, bool)> {
        let shard = self.shards[shard as usize].read();
        let entry = shard.get(&hash)?;
        let same = match (&entry.tokens, tokens) {
            (Some(have), Some(want)) => **have == *want,
            _ => true,
        };
        Some((entry.block, same))
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
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Every (hash, block) pair, for invariant checks.
    pub(crate) fn entries(&self) -> Vec<(BlockHash, BlockId)> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.read()
                    .iter()
                    .map(|(h, e)| (*h, e.block))
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
    /// The map of `shard`, write-locked (the lock of another shard held
    /// before is released first: one shard at a time).
    fn shard(&mut self, shard: u8) -> &mut Map {
        if self.held.as_ref().is_some_and(|(s, _)| *s != shard) {
            self.held = None;
        }
        let (_, guard) = self
            .held
            .get_or_insert_with(|| (shard, self.index.shards[shard as usize].write()));
        &mut guard.0
    }

    /// Indexes `block` under `hash` unless another block already is; returns
    /// whether it was inserted.
    pub(crate) fn insert(
        &mut self,
        shard: u8,
        hash: BlockHash,
        block: BlockId,
        tokens: Option<&[TokenId]>,
    ) -> bool {
        let map = self.shard(shard);
        if map.contains_key(&hash) {
            return false;
        }
        map.insert(
            hash,
            Entry {
                block,
                tokens: tokens.map(Box::from),
            },
        );
        true
    }

    /// Drops the entry of `hash` from `shard`.
    pub(crate) fn remove(&mut self, shard: u8, hash: BlockHash) {
        self.shard(shard).remove(&hash);
    }
}
