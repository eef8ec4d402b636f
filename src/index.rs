//! The prefix index: block hash -> physical block, sharded so that lookups
//! (`match_prefix`) run in parallel with each other and with the manager.
//!
//! Writers hold the manager's state lock and then one shard's write lock
//! (lock order: state, then shard). Readers take only shard read locks, one
//! at a time, so a lookup never blocks on the manager.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::hash::BlockHash;
use crate::sync::RwLock;
use crate::{BlockId, TokenId};

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

type Shard = HashMap<BlockHash, Entry, BuildHasherDefault<PassThrough>>;

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

    fn shard(&self, hash: BlockHash) -> &RwLock<Shard> {
        &self.shards[(hash.0 >> 64) as usize % SHARDS]
    }

    /// The block cached under `hash`; with `tokens`, only if it holds them.
    pub(crate) fn get(&self, hash: BlockHash, tokens: Option<&[TokenId]>) -> Option<BlockId> {
        let shard = self.shard(hash).read();
        let entry = shard.get(&hash)?;
        match (tokens, &entry.tokens) {
            (Some(want), Some(have)) if **have != *want => None,
            _ => Some(entry.block),
        }
    }

    /// Indexes `block` under `hash` unless another block already is; returns
    /// whether it was inserted.
    pub(crate) fn insert(
        &self,
        hash: BlockHash,
        block: BlockId,
        tokens: Option<&[TokenId]>,
    ) -> bool {
        let mut shard = self.shard(hash).write();
        if shard.contains_key(&hash) {
            return false;
        }
        shard.insert(
            hash,
            Entry {
                block,
                tokens: tokens.map(Box::from),
            },
        );
        true
    }

    /// Drops the entry of `hash`.
    pub(crate) fn remove(&self, hash: BlockHash) {
        self.shard(hash).write().remove(&hash);
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
