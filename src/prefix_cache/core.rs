//! The one implementation of the prefix cache's rules, shared by
//! [`PrefixCache`](super::PrefixCache) (caller-owned block ids) and
//! [`BlockManager`](crate::BlockManager) (which adds the pool on top).
//!
//! [`Prefixes`] is what never changes after construction and can be read
//! without the state lock: the hasher, the sharded index and the settings.
//! [`CacheState`] is what its owner keeps under its state lock: per block id
//! its hash and locks, the eviction policy (the evictable set: cached blocks
//! nobody locks), pins, counters, events and the eviction log.

use std::ops::Range;
use std::sync::Arc;

use crate::config::{BlockHashKind, CacheConfig};
use crate::engine_hash::DEFAULT_NONE_HASH_SEED;
use crate::error::{Error, Result};
use crate::events::CacheEvent;
use crate::hash::{BlockHash, Chain, Hasher, KeyDigest};
use crate::ids::{BlockId, TokenId};
use crate::index::{prefetch_line, IndexWriter, PrefixIndex};
use crate::policy::{EvictionPolicy, Retention};
use crate::stats::CacheStats;

use super::pins::Pins;

/// What the prefix cache knows of one block id: 32 bytes, aligned to 32,
/// so that a slot never straddles two cache lines.
#[derive(Clone, Copy)]
#[repr(align(32))]
pub(crate) struct Slot {
    /// The block's hash while `cached` (stale otherwise): see [`Slot::hash`].
    hash: BlockHash,
    /// Whether the block is in the prefix index under `hash`.
    cached: bool,
    /// The index shard holding it (its chain's), while it is cached.
    pub(crate) shard: u8,
    /// Holders that keep it from eviction: locks, pins (each pin also
    /// counts here) and, under a `BlockManager`, one for a block in use.
    pub(crate) locks: u32,
    /// Pins among the locks.
    pub(crate) pins: u32,
}

const _: () = assert!(size_of::<Slot>() == 32 && align_of::<Slot>() == 32);

impl Default for Slot {
    /// An uncached, unlocked block.
    fn default() -> Self {
        Self {
            hash: BlockHash(0),
            cached: false,
            shard: 0,
            locks: 0,
            pins: 0,
        }
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("hash", &self.hash())
            .field("shard", &self.shard)
            .field("locks", &self.locks)
            .field("pins", &self.pins)
            .finish()
    }
}

impl Slot {
    /// The hash the block is in the prefix index under, if it is cached.
    pub(crate) fn hash(&self) -> Option<BlockHash> {
        self.cached.then_some(self.hash)
    }

    /// Whether the block is in the prefix index.
    pub(crate) fn is_cached(&self) -> bool {
        self.cached
    }

    /// Records that the block is in the prefix index under `hash`.
    pub(crate) fn set_hash(&mut self, hash: BlockHash) {
        self.hash = hash;
        self.cached = true;
    }

    /// The block's hash, if it was cached; it is not cached any more.
    pub(crate) fn take_hash(&mut self) -> Option<BlockHash> {
        let hash = self.hash();
        self.cached = false;
        hash
    }
}

/// The settings the rules read, taken from the [`CacheConfig`].
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) num_blocks: usize,
    pub(crate) block_size: usize,
    pub(crate) enabled: bool,
    pub(crate) verify_tokens: bool,
    pub(crate) events: bool,
    pub(crate) max_events: usize,
    pub(crate) pin_budget: usize,
}

/// The hasher, the index and the settings: read without the state lock.
#[derive(Debug)]
pub(crate) struct Prefixes {
    pub(crate) hasher: Hasher,
    pub(crate) index: PrefixIndex,
    pub(crate) settings: Settings,
}

/// The prefix cache's mutable state, kept under its owner's lock.
#[derive(Debug)]
pub(crate) struct CacheState {
    pub(crate) slots: Vec<Slot>,
    /// The evictable set: cached blocks with no lock.
    pub(crate) policy: Box<dyn EvictionPolicy>,
    pub(crate) pins: Pins,
    /// Counters (the gauges are filled in by `stats`).
    pub(crate) stats: CacheStats,
    pub(crate) events: Vec<CacheEvent>,
    /// Evicted (hash, block) pairs since the last take, when logging.
    pub(crate) evicted: Option<Vec<(BlockHash, BlockId)>>,
    /// Scratch space of the hasher.
    pub(crate) buf: Vec<u8>,
    /// Scratch space of `evict_victims`: (block, hash, shard) per victim.
    pub(crate) victims: Vec<(BlockId, BlockHash, u8)>,
}

/// Blocks [`Prefixes::chain_filling`] writes and hashes per step (2 KB of
/// 64-token blocks: the step's lines fit the processor's outstanding misses).
const FILL_BLOCKS: usize = 8;

/// One step of a [`crate::RequestCache::admit_filled`] fill from `src`:
/// `append` appends `src[tokens.len()..upto]` (converted as the caller
/// needs), then as many values after `upto` (the next step) are prefetched.
pub fn fill_step<T, E>(
    src: &[T],
    tokens: &mut Vec<TokenId>,
    upto: usize,
    append: impl FnOnce(&[T], &mut Vec<TokenId>) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let start = tokens.len();
    append(&src[start..upto], tokens)?;
    let next = &src[upto..(2 * upto - start).min(src.len())];
    let line = 64 / std::mem::size_of::<T>().max(1);
    for i in (0..next.len()).step_by(line.max(1)) {
        prefetch_line(std::ptr::from_ref(&next[i]).cast());
    }
    Ok(())
}

/// Runs `fill(tokens, upto)` and checks it appended exactly up to `upto`:
/// a caller's `fill` is not trusted with the prompt's length.
pub(crate) fn filled(
    fill: &mut dyn FnMut(&mut Vec<TokenId>, usize) -> Result<()>,
    tokens: &mut Vec<TokenId>,
    upto: usize,
) -> Result<()> {
    fill(tokens, upto)?;
    if tokens.len() == upto {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "the prompt's fill left {} tokens where {upto} were due",
            tokens.len()
        )))
    }
}

impl Prefixes {
    /// The hasher, an empty index and the settings of `config`.
    pub(crate) fn new(config: &CacheConfig) -> Self {
        let seed = config.hash_seed.unwrap_or_else(random_seed);
        // vLLM's NONE_HASH seed: PYTHONHASHSEED when given, else its defaults.
        let engine_seed = match (config.hash_seed, config.block_hash) {
            (Some(s), _) => s.to_string(),
            (None, BlockHashKind::Sha256Cbor) => DEFAULT_NONE_HASH_SEED.to_string(),
            (None, _) => format!("{seed:016x}"),
        };
        Self {
            hasher: Hasher::with_kind(config.block_hash, &engine_seed, seed, config.block_size),
            index: PrefixIndex::new(),
            settings: Settings {
                num_blocks: config.num_blocks,
                block_size: config.block_size,
                enabled: config.enable_prefix_caching,
                verify_tokens: config.verify_tokens,
                events: config.enable_events,
                max_events: config.max_pending_events,
                pin_budget: config.pin_budget(),
            },
        }
    }

    /// Hashes of the full blocks of `tokens` (none without prefix caching).
    pub(crate) fn chain(&self, tokens: &[TokenId], keys: &KeyDigest) -> Vec<BlockHash> {
        self.chain_of(tokens, keys).hashes
    }

    /// [`Prefixes::chain`] with what extending it later needs.
    pub(crate) fn chain_of(&self, tokens: &[TokenId], keys: &KeyDigest) -> Chain {
        let mut out = Chain::default();
        if self.settings.enabled {
            let mut buf = Vec::with_capacity(16 + 4 * self.settings.block_size + 64);
            self.hasher
                .extend_chain(tokens, keys, usize::MAX, &mut out, &mut buf);
        }
        out
    }

    /// [`Prefixes::chain_of`] of tokens the caller owns, hashed in place
    /// (`tokens` end as they started).
    pub(crate) fn chain_in_place(&self, tokens: &mut [TokenId], keys: &KeyDigest) -> Chain {
        let mut out = Chain::default();
        if self.settings.enabled {
            let mut buf = Vec::with_capacity(16 + 4 * self.settings.block_size + 64);
            self.hasher
                .extend_chain_in_place(tokens, keys, usize::MAX, &mut out, &mut buf);
        }
        out
    }

    /// [`Prefixes::chain_in_place`] of a prompt of `len` tokens that `fill`
    /// writes into a fresh buffer a few blocks at a time, each step hashed
    /// right after it is written, while it is still in L1: a prompt that is
    /// not in cache is then read from memory once, the next step's lines
    /// arriving while this one hashes ([`fill_step`] prefetches them), not
    /// copied whole first and hashed after. `fill(tokens, upto)` appends the
    /// prompt's tokens up to `upto`, or fails (then so does this); a `fill`
    /// that leaves another length fails with [`Error::InvalidArgument`].
    /// Returns the tokens and their chain.
    pub(crate) fn chain_filling(
        &self,
        len: usize,
        keys: &KeyDigest,
        fill: &mut dyn FnMut(&mut Vec<TokenId>, usize) -> Result<()>,
    ) -> Result<(Vec<TokenId>, Chain)> {
        let mut tokens = Vec::with_capacity(len);
        let mut chain = Chain::default();
        if !self.settings.enabled {
            filled(fill, &mut tokens, len)?;
            return Ok((tokens, chain));
        }
        let mut buf = Vec::with_capacity(16 + 4 * self.settings.block_size + 64);
        let step = FILL_BLOCKS * self.settings.block_size;
        while tokens.len() < len {
            let upto = (tokens.len() + step).min(len);
            filled(fill, &mut tokens, upto)?;
            self.hasher
                .extend_chain_in_place(&mut tokens, keys, usize::MAX, &mut chain, &mut buf);
        }
        Ok((tokens, chain))
    }

    /// Block `i`'s tokens, when the index verifies tokens.
    pub(crate) fn verify<'t>(&self, tokens: &'t [TokenId], i: usize) -> Option<&'t [TokenId]> {
        let bs = self.settings.block_size;
        self.settings
            .verify_tokens
            .then(|| &tokens[i * bs..(i + 1) * bs])
    }

    /// Leading blocks of `hashes` found in the index, at most `limit`.
    pub(crate) fn lookup(
        &self,
        tokens: &[TokenId],
        hashes: &[BlockHash],
        limit: usize,
    ) -> Vec<BlockId> {
        let keys = hashes.iter().take(limit).enumerate();
        self.index
            .leading_run(keys.map(|(i, h)| (*h, self.verify(tokens, i))), hashes)
    }

    /// Indexes blocks `range` of a chain: block `blocks[i]` under
    /// `hashes[i]`, holding `tokens[i * block_size..]`. Blocks already
    /// cached are skipped; a block whose hash another block holds stays
    /// uncached (a duplicate). Stored blocks are new to the policy
    /// (`on_store` with `retention` and the block holding the previous
    /// hash) and evictable unless locked; each run
    /// of consecutive stored blocks is one `BlockStored` event.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_chain(
        &self,
        st: &mut CacheState,
        tokens: &[TokenId],
        hashes: &[BlockHash],
        blocks: &[BlockId],
        range: Range<usize>,
        retention: Retention,
        adapter: Option<&Arc<str>>,
    ) {
        let Some(&root) = hashes.first() else {
            return;
        };
        let shard = PrefixIndex::shard_of_chain(root);
        let mut index = self.index.writer();
        for &hash in &hashes[range.clone()] {
            index.prefetch(shard, hash);
        }
        let mut run: Option<Range<usize>> = None;
        for i in range {
            let (b, hash) = (blocks[i], hashes[i]);
            let stored = !st.slots[b as usize].is_cached()
                && index.insert(shard, hash, b, self.verify(tokens, i));
            if stored {
                // The block holding the previous hash: the chain's previous
                // block, or, when that is a duplicate, the one indexed.
                let parent = i.checked_sub(1).and_then(|j| {
                    let p = blocks[j];
                    if st.slots[p as usize].hash() == Some(hashes[j]) {
                        Some(p)
                    } else {
                        index.block_of(shard, hashes[j])
                    }
                });
                let slot = &mut st.slots[b as usize];
                slot.set_hash(hash);
                slot.shard = shard;
                st.policy.on_store(b, hash, retention, parent);
                if slot.locks == 0 {
                    st.policy.insert(b);
                }
                st.stats.blocks_stored += 1;
                match &mut run {
                    Some(r) => r.end = i + 1,
                    None => run = Some(i..i + 1),
                }
            } else if let Some(r) = run.take() {
                self.announce_stored(st, tokens, hashes, r, adapter);
            }
        }
        if let Some(r) = run {
            self.announce_stored(st, tokens, hashes, r, adapter);
        }
    }

    /// A `BlockStored` event for blocks `run` of a chain, when events are on.
    fn announce_stored(
        &self,
        st: &mut CacheState,
        tokens: &[TokenId],
        hashes: &[BlockHash],
        run: Range<usize>,
        adapter: Option<&Arc<str>>,
    ) {
        if !self.settings.events {
            return;
        }
        let bs = self.settings.block_size;
        self.record(
            st,
            CacheEvent::BlockStored {
                block_hashes: hashes[run.clone()].iter().map(|h| h.external()).collect(),
                parent_block_hash: run.start.checked_sub(1).map(|p| hashes[p].external()),
                token_ids: tokens[run.start * bs..run.end * bs].to_vec(),
                block_size: bs,
                adapter: adapter.cloned(),
            },
        );
    }

    /// Queues `event` for `take_events`, or counts it dropped when
    /// `max_pending_events` are already waiting.
    fn record(&self, st: &mut CacheState, event: CacheEvent) {
        if st.events.len() < self.settings.max_events {
            st.events.push(event);
        } else {
            st.stats.events_dropped += 1;
        }
    }

    /// A `BlockRemoved` event for `hash`, when events are on.
    fn announce_removed(&self, st: &mut CacheState, hash: BlockHash) {
        if self.settings.events {
            self.record(
                st,
                CacheEvent::BlockRemoved {
                    block_hashes: vec![hash.external()],
                },
            );
        }
    }

    /// Evicts up to `n` of the policy's victims, in its order, appending
    /// them to `out`; returns how many (fewer when fewer are evictable).
    /// Their hashes leave the index through `index` (evictions: counted,
    /// logged, announced), each bucket prefetched a few victims ahead so
    /// that their cache misses overlap. The blocks are uncached and
    /// unlocked; the caller owns what happens to them next.
    pub(crate) fn evict_victims(
        &self,
        st: &mut CacheState,
        index: &mut IndexWriter<'_>,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> usize {
        /// Victims between a bucket's prefetch and its removal.
        const AHEAD: usize = 8;
        let start = out.len();
        st.policy.evict_many(n, out);
        // Each victim's slot (where its hash is) is prefetched a few
        // victims ahead of its read, as its bucket is ahead of its removal.
        let taken = &out[start..];
        for &b in taken.iter().take(AHEAD) {
            prefetch_slot(&st.slots, b);
        }
        let mut victims = std::mem::take(&mut st.victims);
        victims.clear();
        for (i, &b) in taken.iter().enumerate() {
            if let Some(&next) = taken.get(i + AHEAD) {
                prefetch_slot(&st.slots, next);
            }
            let slot = &mut st.slots[b as usize];
            let hash = slot.take_hash().expect("evictable blocks are hashed");
            victims.push((b, hash, slot.shard));
        }
        for &(_, hash, shard) in victims.iter().take(AHEAD) {
            index.prefetch(shard, hash);
        }
        for (i, &(b, hash, shard)) in victims.iter().enumerate() {
            if let Some(&(_, next, next_shard)) = victims.get(i + AHEAD) {
                index.prefetch(next_shard, next);
            }
            index.remove(shard, hash);
            st.stats.evictions += 1;
            if let Some(log) = &mut st.evicted {
                log.push((hash, b));
            }
            self.announce_removed(st, hash);
        }
        st.victims = victims;
        out.len() - start
    }

    /// Checks that every block of `blocks` exists and may be dropped from
    /// the index (none is pinned: pins are released by prefix through the
    /// index, so a dropped pinned block could never be unpinned).
    pub(crate) fn check_droppable(&self, st: &CacheState, blocks: &[BlockId]) -> Result<()> {
        for &b in blocks {
            let slot = st.slots.get(b as usize).ok_or(Error::InvalidBlock(b))?;
            if slot.pins > 0 {
                return Err(Error::InvalidArgument(format!(
                    "block {b} is pinned: unpin its prefix before evicting it"
                )));
            }
        }
        Ok(())
    }

    /// Drops `b` from the index on the caller's request (not an eviction:
    /// neither counted nor logged, but announced); the policy forgets it.
    /// Returns `None` when `b` was not cached, else whether it is unlocked
    /// (it was evictable). The caller checked [`Self::check_droppable`].
    pub(crate) fn drop_block(&self, st: &mut CacheState, b: BlockId) -> Option<bool> {
        let slot = &mut st.slots[b as usize];
        let hash = slot.take_hash()?;
        let unlocked = slot.locks == 0;
        self.index.writer().remove(slot.shard, hash);
        if unlocked {
            st.policy.remove(b);
        }
        st.policy.forget(b);
        self.announce_removed(st, hash);
        Some(unlocked)
    }

    /// Drops every cached block from the index, which must hold no locked
    /// block ([`Error::BlocksInUse`] otherwise, changing nothing). Returns
    /// the blocks dropped, in the policy's eviction order.
    pub(crate) fn reset(&self, st: &mut CacheState) -> Result<Vec<BlockId>> {
        let locked = st.slots.iter().filter(|s| s.locks > 0).count();
        if locked > 0 {
            return Err(Error::BlocksInUse(locked));
        }
        let mut dropped = Vec::with_capacity(st.policy.len());
        let mut index = self.index.writer();
        while let Some(b) = st.policy.evict() {
            let slot = &mut st.slots[b as usize];
            let hash = slot.take_hash().expect("evictable blocks are hashed");
            index.remove(slot.shard, hash);
            dropped.push(b);
        }
        if self.settings.events {
            self.record(st, CacheEvent::AllBlocksCleared);
        }
        Ok(dropped)
    }

    /// The counters with the gauges the prefix cache knows filled in.
    pub(crate) fn stats(&self, st: &CacheState) -> CacheStats {
        CacheStats {
            num_blocks: self.settings.num_blocks as u64,
            cached_blocks: self.index.len() as u64,
            pinned_blocks: st.pins.num_pinned() as u64,
            evictable_blocks: st.policy.len() as u64,
            ..st.stats
        }
    }
}

impl CacheState {
    /// `num_blocks` uncached, unlocked blocks under `policy` (which must be empty).
    pub(crate) fn new(num_blocks: usize, policy: Box<dyn EvictionPolicy>) -> Result<Self> {
        if !policy.is_empty() {
            return Err(Error::InvalidConfig(
                "the eviction policy must start empty".into(),
            ));
        }
        Ok(Self {
            slots: crate::alloc::filled(num_blocks, Slot::default(), "the block slots")?,
            policy,
            pins: Pins::default(),
            stats: CacheStats::default(),
            events: Vec::new(),
            evicted: None,
            buf: Vec::new(),
            victims: Vec::new(),
        })
    }

    /// Whether `b` is cached and nobody holds it (the policy may evict it).
    pub(crate) fn is_evictable(&self, b: BlockId) -> bool {
        let slot = &self.slots[b as usize];
        slot.locks == 0 && slot.is_cached()
    }

    /// Takes a lock on `b`; a cached block leaves the evictable set.
    pub(crate) fn lock(&mut self, b: BlockId) {
        if self.is_evictable(b) {
            self.policy.remove(b);
        }
        self.slots[b as usize].locks += 1;
    }

    /// Drops a lock on `b`; the last one makes a cached block evictable.
    /// Returns true when `b` is now unlocked and uncached (its owner lists
    /// it as free).
    pub(crate) fn unlock(&mut self, b: BlockId) -> bool {
        let slot = &mut self.slots[b as usize];
        slot.locks -= 1;
        if slot.locks > 0 {
            return false;
        }
        if slot.is_cached() {
            self.policy.insert(b);
            false
        } else {
            true
        }
    }

    /// Marks `path` (a chain from its root) as just used: its evictable
    /// blocks move to the most recent end of the policy's order, deepest
    /// first, so each is more recent than every block below it.
    pub(crate) fn touch(&mut self, path: &[BlockId]) {
        for &b in path.iter().rev() {
            if self.is_evictable(b) {
                self.policy.remove(b);
                self.policy.insert(b);
            }
        }
    }

    /// Counts a hit on each block of `path` (a chain from its root) and
    /// renews it as [`touch`](Self::touch) does: the evictable blocks leave
    /// the policy's order, take their hits root first (as a request's
    /// admission counts them), and come back deepest first, so a policy that
    /// reclassifies a hit block still finds each more recent than every
    /// block below it.
    pub(crate) fn hit_path(&mut self, path: &[BlockId]) {
        for &b in path {
            if self.is_evictable(b) {
                self.policy.remove(b);
            }
        }
        for &b in path {
            self.policy.on_hit(b);
        }
        for &b in path.iter().rev() {
            if self.is_evictable(b) {
                self.policy.insert(b);
            }
        }
    }
}

/// Asks the processor to bring block `b`'s slot into cache (a hint): the
/// one line it lies in.
fn prefetch_slot(slots: &[Slot], b: BlockId) {
    if let Some(slot) = slots.get(b as usize) {
        // Aligned to 32 bytes, a slot lies in one line.
        let slot: *const Slot = slot;
        prefetch_line(slot.cast());
    }
}

/// A random hash seed, from the standard library's per-process random keys.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(0x6d6c_615f_6361_6368_u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Lru;
    use std::sync::{Arc, Mutex};

    /// Stored blocks and the parents the policy was told.
    type Stores = Arc<Mutex<Vec<(BlockId, Option<BlockId>)>>>;

    /// LRU that records every stored block's parent.
    #[derive(Debug)]
    struct Parents(Lru, Stores);

    impl EvictionPolicy for Parents {
        fn name(&self) -> &'static str {
            "parents"
        }
        fn on_store(&mut self, b: BlockId, _: BlockHash, _: Retention, p: Option<BlockId>) {
            self.1.lock().unwrap().push((b, p));
        }
        fn insert(&mut self, b: BlockId) {
            self.0.insert(b)
        }
        fn remove(&mut self, b: BlockId) {
            self.0.remove(b)
        }
        fn evict(&mut self) -> Option<BlockId> {
            self.0.evict()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn a_block_stored_after_a_duplicate_has_the_indexed_block_as_parent() {
        let config = CacheConfig {
            num_blocks: 8,
            block_size: 4,
            ..CacheConfig::default()
        };
        let prefixes = Prefixes::new(&config);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let policy = Parents(Lru::new(8).unwrap(), seen.clone());
        let mut st = CacheState::new(8, Box::new(policy)).unwrap();
        let tokens: Vec<TokenId> = (0..12).collect();
        let hashes = prefixes.chain(&tokens, &Default::default());
        // One request stores blocks 0 and 1; another, which prefilled the
        // same prefix meanwhile into blocks 2 and 3, then a block of its own.
        prefixes.store_chain(
            &mut st,
            &tokens,
            &hashes,
            &[0, 1],
            0..2,
            Retention::Keep,
            None,
        );
        prefixes.store_chain(
            &mut st,
            &tokens,
            &hashes,
            &[2, 3, 4],
            0..3,
            Retention::Keep,
            None,
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [(0, None), (1, Some(0)), (4, Some(1))]
        );
    }

    proptest::proptest! {
        /// A prompt written and hashed step by step is the prompt, and its
        /// chain the one hashed whole, whatever the kind, keys, block size
        /// and length (across steps, with a partial tail), with prefix
        /// caching on or off; a failing fill fails the call.
        #[test]
        fn a_filled_chain_is_the_whole_prompts_chain(
            tokens in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..1200),
            block_size in 1usize..=70,
            key in 0usize..3,
            kind in 0usize..BlockHashKind::ALL.len(),
            enabled: bool,
            fail_at in proptest::option::of(0usize..1200),
        ) {
            let config = CacheConfig {
                num_blocks: 64,
                block_size,
                block_hash: BlockHashKind::ALL[kind],
                enable_prefix_caching: enabled,
                ..CacheConfig::default()
            };
            let prefixes = Prefixes::new(&config);
            let keys = match key {
                0 => crate::hash::ExtraKeys::default(),
                1 => crate::hash::ExtraKeys::salt("s"),
                _ => crate::hash::ExtraKeys::adapter("a"),
            };
            let digest = prefixes.hasher.digest(&keys);
            let fail_at = fail_at.filter(|&i| i < tokens.len());
            let filled = prefixes.chain_filling(tokens.len(), &digest, &mut |out, upto| {
                fill_step(&tokens, out, upto, |step, out| {
                    out.extend_from_slice(step);
                    match fail_at {
                        Some(i) if i < out.len() => Err(Error::InvalidArgument(i.to_string())),
                        _ => Ok(()),
                    }
                })
            });
            match fail_at {
                Some(i) => proptest::prop_assert!(
                    matches!(filled, Err(Error::InvalidArgument(m)) if m == i.to_string())
                ),
                None => {
                    let (filled, chain) = filled.expect("no failure");
                    proptest::prop_assert_eq!(&filled, &tokens);
                    proptest::prop_assert_eq!(chain.hashes, prefixes.chain_of(&tokens, &digest).hashes);
                }
            }
        }
    }
}
