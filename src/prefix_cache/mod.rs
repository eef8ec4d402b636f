//! A prefix cache over caller-owned block ids: SGLang's model, where the
//! engine's allocator owns KV pages and the radix cache indexes the pages it
//! is given, frees (through the allocator) the duplicates it finds and the
//! pages it evicts.
//!
//! [`PrefixCache`] is that cache. [`BlockManager`](crate::BlockManager) is
//! built on the same implementation (`core.rs`, `pins.rs`): the pool and the
//! requests on top of one index and one policy. The rules are in
//! `docs/semantics.md`.

mod core;
mod invariants;
mod pins;

pub use self::core::fill_step;
pub(crate) use self::core::{filled, CacheState, Prefixes};

use rustc_hash::FxHashMap;

use crate::config::CacheConfig;
use crate::error::{Error, Result};
use crate::events::CacheEvent;
use crate::hash::ExtraKeys;
use crate::ids::{BlockId, TokenId};
use crate::index::PrefixIndex;
use crate::stats::CacheStats;
use crate::sync::Mutex;

/// The outcome of [`BlockManager::match_prefix`](crate::BlockManager::match_prefix)
/// and [`PrefixCache::match_prefix`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Cached blocks of the longest cached prefix.
    pub block_ids: Vec<BlockId>,
    /// Tokens they cover.
    pub num_tokens: usize,
}

/// The outcome of [`PrefixCache::insert`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Insertion {
    /// Leading full blocks that were cached before the call.
    pub num_cached_blocks: usize,
    /// The caller's ids whose block was already cached under another id:
    /// the caller frees them (and uses [`Insertion::block_ids`] instead).
    pub duplicate_block_ids: Vec<BlockId>,
    /// The id now cached for each full block, in order: the caller's own,
    /// or the one cached before it. Shorter than the full blocks only when
    /// a hash collision (found with `verify_tokens`) stopped the chain.
    pub block_ids: Vec<BlockId>,
}

/// A prefix cache over block ids `0..num_blocks` that the caller allocates
/// and frees. It indexes full blocks under their chained hashes
/// ([`insert`](Self::insert)), finds the longest cached prefix
/// ([`match_prefix`](Self::match_prefix)), keeps locked blocks from
/// eviction ([`lock`](Self::lock)) and evicts unlocked ones by the
/// configured policy ([`evict`](Self::evict)), handing their ids back.
/// `Send + Sync`; every failing call returns an [`Error`] and changes
/// nothing.
///
/// ```
/// use mla_cache::{CacheConfig, ExtraKeys, PrefixCache};
///
/// let mut config = CacheConfig::new(64);
/// config.block_size = 4;
/// let cache = PrefixCache::new(config)?;
/// let none = ExtraKeys::default();
///
/// // A finished request's pages 10, 11 (full) and 12 (partial tail) go in.
/// let prompt: Vec<u32> = (0..10).collect();
/// let first = cache.insert(&prompt, &none, &[10, 11, 12])?;
/// assert_eq!(first.block_ids, [10, 11]); // the tail's page stays the caller's
///
/// // Another request computed the same prefix in pages 20, 21: duplicates.
/// let second = cache.insert(&prompt[..8], &none, &[20, 21])?;
/// assert_eq!(second.duplicate_block_ids, [20, 21]); // the caller frees them
///
/// // Match, lock the path while a request runs on it, then let it go.
/// let hit = cache.match_prefix(&prompt, &none);
/// assert_eq!((hit.block_ids.as_slice(), hit.num_tokens), (&[10, 11][..], 8));
/// cache.lock(&hit.block_ids)?;
/// assert!(cache.evict(2).is_empty());
/// cache.unlock(&hit.block_ids)?;
/// assert_eq!(cache.evict(2), [11, 10]); // freed through the caller's allocator
/// # Ok::<(), mla_cache::Error>(())
/// ```
#[derive(Debug)]
pub struct PrefixCache {
    config: CacheConfig,
    prefixes: Prefixes,
    state: Mutex<CacheState>,
}

impl PrefixCache {
    /// An empty cache for `config` (`enable_prefix_caching` must be on),
    /// with the eviction policy it names.
    pub fn new(config: CacheConfig) -> Result<Self> {
        config.validate()?;
        if !config.enable_prefix_caching {
            return Err(Error::InvalidConfig(
                "a prefix cache needs enable_prefix_caching".into(),
            ));
        }
        let policy = config.eviction.build(config.num_blocks)?;
        Ok(Self {
            prefixes: Prefixes::new(&config),
            state: Mutex::new(CacheState::new(config.num_blocks, policy)?),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Indexes the full blocks of `tokens` under `keys`, held in the
    /// caller's `block_ids` (one per block, at least one per full block; a
    /// partial tail's id is ignored). A block already cached keeps its
    /// cached id: when the caller's differs, the caller's is reported as a
    /// duplicate to free. New blocks are evictable unless locked. The whole
    /// path counts as just used (see [`match_prefix`](Self::match_prefix)).
    ///
    /// Fails, changing nothing, with [`Error::InvalidArgument`] for too few
    /// ids, an id given twice or an id cached under another hash, and with
    /// [`Error::InvalidBlock`] for an id outside the cache.
    pub fn insert(
        &self,
        tokens: &[TokenId],
        keys: &ExtraKeys,
        block_ids: &[BlockId],
    ) -> Result<Insertion> {
        let digest = self.prefixes.hasher.digest(keys);
        let hashes = self.prefixes.chain(tokens, &digest);
        let full = hashes.len();
        if block_ids.len() < full {
            return Err(Error::InvalidArgument(format!(
                "{} block ids for {full} full blocks",
                block_ids.len()
            )));
        }
        let ids = &block_ids[..full];
        self.check_ids(ids)?;
        let mut seen = vec![false; self.config.num_blocks];
        for &b in ids {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(Error::InvalidArgument(format!("block {b} given twice")));
            }
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let shard = hashes.first().map(|&h| PrefixIndex::shard_of_chain(h));
        let mut outcome = Insertion::default();
        let mut leading = true;
        for (i, (&hash, &b)) in hashes.iter().zip(ids).enumerate() {
            let found = shard.and_then(|s| {
                self.prefixes
                    .index
                    .get(s, hash, self.prefixes.verify(tokens, i))
            });
            let own_hash = st.slots[b as usize].hash();
            match found {
                Some((_, false)) => break, // a collision: nothing below is indexable here
                Some((cached, true)) => {
                    if cached != b {
                        if own_hash.is_some() {
                            return Err(cached_elsewhere(b));
                        }
                        outcome.duplicate_block_ids.push(b);
                    }
                    outcome.num_cached_blocks += usize::from(leading);
                    outcome.block_ids.push(cached);
                }
                None => {
                    if own_hash.is_some() {
                        return Err(cached_elsewhere(b));
                    }
                    leading = false;
                    outcome.block_ids.push(b);
                }
            }
        }
        let path = &outcome.block_ids;
        let retention = st.policy.on_request(&hashes, outcome.num_cached_blocks);
        self.prefixes.store_chain(
            st,
            tokens,
            &hashes,
            path,
            0..path.len(),
            retention,
            digest.adapter_name.as_ref(),
        );
        st.touch(path);
        Ok(outcome)
    }

    /// The longest cached prefix of `tokens` under `keys`. A hit counts as
    /// a use, as SGLang's tree updates access times on a match: the policy
    /// sees a hit on each block, and the path's evictable blocks become the
    /// most recently used, each more recent than the blocks below it.
    pub fn match_prefix(&self, tokens: &[TokenId], keys: &ExtraKeys) -> PrefixMatch {
        let hashes = self
            .prefixes
            .chain(tokens, &self.prefixes.hasher.digest(keys));
        let mut st = self.state.lock();
        let block_ids = self.prefixes.lookup(tokens, &hashes, usize::MAX);
        st.hit_path(&block_ids);
        let num_tokens = block_ids.len() * self.config.block_size;
        st.stats.prefix_query_tokens += tokens.len() as u64;
        st.stats.prefix_hit_tokens += num_tokens as u64;
        st.stats.prefix_query_requests += 1;
        st.stats.prefix_hit_requests += u64::from(num_tokens > 0);
        PrefixMatch {
            block_ids,
            num_tokens,
        }
    }

    /// Takes a lock on each of `block_ids` (SGLang's `inc_lock_ref` on a
    /// matched path): a locked block is never evicted. Locks nest; a lock
    /// on an id not cached yet holds once it is inserted. Lock whole paths
    /// from the root (what `match_prefix` returns), as SGLang locks a node
    /// with its ancestors, so no cached block outlives its parent.
    pub fn lock(&self, block_ids: &[BlockId]) -> Result<()> {
        self.check_ids(block_ids)?;
        let mut st = self.state.lock();
        for &b in block_ids {
            st.lock(b);
        }
        Ok(())
    }

    /// Releases one lock on each of `block_ids` (SGLang's `dec_lock_ref`),
    /// deepest first; cached blocks left without locks become evictable.
    /// Fails, changing nothing, when a block would lose more locks than
    /// [`lock`](Self::lock) took on it (pins are released by `unpin`).
    pub fn unlock(&self, block_ids: &[BlockId]) -> Result<()> {
        self.check_ids(block_ids)?;
        let mut st = self.state.lock();
        let mut wanted: FxHashMap<BlockId, u32> = FxHashMap::default();
        for &b in block_ids {
            *wanted.entry(b).or_default() += 1;
        }
        for (&b, &n) in &wanted {
            let slot = &st.slots[b as usize];
            if slot.locks - slot.pins < n {
                return Err(Error::InvalidArgument(format!(
                    "block {b}: {n} unlocks for {} locks",
                    slot.locks - slot.pins
                )));
            }
        }
        for &b in block_ids.iter().rev() {
            st.unlock(b);
        }
        Ok(())
    }

    /// Evicts up to `num_blocks` unlocked cached blocks, in the policy's
    /// order, and returns their ids for the caller to free (fewer when
    /// fewer are evictable). Under LRU, children go before their parents
    /// (see `docs/semantics.md`). Counted and announced (`BlockRemoved`).
    pub fn evict(&self, num_blocks: usize) -> Vec<BlockId> {
        let mut st = self.state.lock();
        let mut evicted = Vec::with_capacity(num_blocks.min(st.policy.len()));
        let mut index = self.prefixes.index.writer();
        self.prefixes
            .evict_victims(&mut st, &mut index, num_blocks, &mut evicted);
        evicted
    }

    /// Cached blocks nobody locks: what [`evict`](Self::evict) may take
    /// (SGLang's `evictable_size`, in blocks).
    pub fn evictable_blocks(&self) -> usize {
        self.state.lock().policy.len()
    }

    /// Cached blocks held by a lock or a pin (SGLang's `protected_size`, in blocks).
    pub fn protected_blocks(&self) -> usize {
        let st = self.state.lock();
        self.prefixes.index.len() - st.policy.len()
    }

    /// Drops every cached block from the index and returns their ids (the
    /// caller frees them). Refused with [`Error::BlocksInUse`] while any
    /// block is locked or pinned.
    pub fn reset(&self) -> Result<Vec<BlockId>> {
        self.prefixes.reset(&mut self.state.lock())
    }

    /// Pins the cached full blocks of the prefix `tokens` under `keys`
    /// within the pin budget: they are not evicted until
    /// [`unpin`](Self::unpin) of the same prefix. Returns the tokens pinned
    /// (0, and nothing to unpin, when nothing of the prefix is cached).
    pub fn pin(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Result<usize> {
        let hashes = self
            .prefixes
            .chain(tokens, &self.prefixes.hasher.digest(keys));
        self.prefixes.pin(&mut self.state.lock(), tokens, &hashes)
    }

    /// Releases one pin of the prefix `tokens`: the pin whose run ends
    /// deepest in it, exactly the blocks that `pin` took. Returns the tokens
    /// unpinned, or [`Error::NotPinned`] when no pin lies on the prefix.
    pub fn unpin(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Result<usize> {
        let hashes = self
            .prefixes
            .chain(tokens, &self.prefixes.hasher.digest(keys));
        self.prefixes.unpin(&mut self.state.lock(), &hashes)
    }

    /// External hashes of the full blocks of `tokens` under `keys`: the
    /// values events carry for them.
    pub fn block_hashes(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Vec<u64> {
        let hashes = self
            .prefixes
            .chain(tokens, &self.prefixes.hasher.digest(keys));
        hashes.into_iter().map(|h| h.external()).collect()
    }

    /// A snapshot of gauges and counters. The caller owns the blocks, so
    /// `free_blocks`, `used_blocks`, `num_requests` and `cow_copies` are 0;
    /// the prefix queries are those of `match_prefix`.
    pub fn stats(&self) -> CacheStats {
        self.prefixes.stats(&self.state.lock())
    }

    /// Events recorded since the last call (empty unless
    /// [`CacheConfig::enable_events`]).
    pub fn take_events(&self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.state.lock().events)
    }

    /// Checks every bookkeeping invariant; for tests of this crate and of its
    /// bindings. Returns a description of the first violation.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.prefixes.check(&self.state.lock(), None)
    }

    fn check_ids(&self, ids: &[BlockId]) -> Result<()> {
        match ids.iter().find(|&&b| b as usize >= self.config.num_blocks) {
            Some(&b) => Err(Error::InvalidBlock(b)),
            None => Ok(()),
        }
    }
}

fn cached_elsewhere(b: BlockId) -> Error {
    Error::InvalidArgument(format!("block {b} is cached under another hash"))
}
