//! The block manager: who holds which block, which blocks are shared, and
//! which are reused next.
//!
//! ```text
//!            admit / append / fork                      free (tail first)
//!   free ───────────────────────────────▶ in use ───────────────────────────▶ free
//!    │  unhashed list (reused first)       ref_count > 0                       │
//!    │  policy's evictable set (cached)    full computed blocks indexed        │
//!    └──────────── a prefix hit revives a cached free block ◀──────────────────┘
//! ```
//!
//! The prefix cache (`crate::prefix_cache`: index, policy, pins, events)
//! is the one `PrefixCache` uses too; this module adds the pool (`pool.rs`)
//! and the requests on top. The rules are in `docs/semantics.md`.
//!
//! Ownership rules:
//! - a block is free (no table and no pin holds it, in exactly one of the
//!   unhashed list and the policy's evictable set) or in use;
//! - only full, computed blocks are hashed; a hashed block is in the prefix
//!   index, and no two blocks are indexed under one hash (a duplicate stays
//!   unhashed and is freed as such);
//! - full blocks are immutable; a shared partial tail is copied on write;
//! - room reserved past a request's tokens is private and unhashed.

mod admit;
mod batch;
mod grow;
mod invariants;
mod outcomes;
mod pool;

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use rustc_hash::FxHashMap;

pub use self::outcomes::{
    Admission, AdmitCheck, AdmitOptions, AppendOutcome, BatchAppendOutcome, BlockCopy, TableSizes,
};
pub use crate::prefix_cache::PrefixMatch;

use self::pool::Pool;
use crate::config::{BlockHashKind, CacheConfig};
use crate::error::{Error, Result};
use crate::events::CacheEvent;
use crate::hash::{BlockHash, Chain, ExtraKeys, KeyDigest};
use crate::ids::{BlockId, RequestId, TokenId};
use crate::policy::{EvictionPolicy, Retention};
use crate::prefix_cache::{fill_step, CacheState, Prefixes};
use crate::stats::CacheStats;
use crate::sync::Mutex;

/// A paged MLA cache's bookkeeping: allocation, prefix sharing,
/// copy-on-write, pinning and eviction. `Send + Sync`: share it with `Arc`.
///
/// Every failing call returns an [`Error`] and changes nothing.
#[derive(Debug)]
pub struct BlockManager {
    config: CacheConfig,
    prefixes: Prefixes,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
struct Request {
    /// The leading token ids the manager knows: all of them, unless a
    /// caller-hashed commit went past them ([`BlockManager::commit_hashed`]).
    tokens: Vec<TokenId>,
    /// Tokens the request holds (`tokens.len()` or more).
    len: usize,
    blocks: Vec<BlockId>,
    /// Hashes of the leading full computed blocks (indexed or duplicate).
    chain: Chain,
    num_computed: usize,
    chunked: bool,
    /// How the blocks it stores are kept, as the policy decided at admission.
    retention: Retention,
    keys: Arc<KeyDigest>,
    /// Keyed by the caller's block hashes ([`BlockManager::admit_hashed`]):
    /// the manager never hashes its tokens.
    caller_hashed: bool,
}

/// A checked prompt with what admitting it needs ([`BlockManager::prepare`]).
#[derive(Debug, Clone)]
pub(crate) struct Prompt {
    keys: Arc<KeyDigest>,
    /// Hashes of its full blocks.
    pub(crate) chain: Chain,
    /// How many leading blocks a hit may cover.
    pub(crate) hit_limit: usize,
    /// Blocks the request holds once admitted.
    needed: usize,
    /// Whether `hashes` are the caller's.
    caller_hashed: bool,
}

/// Everything under the manager's lock, in parts that calls borrow apart:
/// a request from `requests` while `pool` and `cache` change.
#[derive(Debug)]
struct State {
    cache: CacheState,
    pool: Pool,
    requests: FxHashMap<RequestId, Request>,
}

impl BlockManager {
    /// A manager for `config`, with the policy the config names.
    pub fn new(config: CacheConfig) -> Result<Self> {
        config.validate()?;
        let policy = config.eviction.build(config.num_blocks)?;
        Self::with_policy(config, policy)
    }

    /// A manager with a caller-supplied eviction policy.
    pub fn with_policy(config: CacheConfig, policy: Box<dyn EvictionPolicy>) -> Result<Self> {
        config.validate()?;
        let n = config.num_blocks;
        let mut cache = CacheState::new(n, policy)?;
        cache.stats.num_blocks = n as u64;
        let state = State {
            cache,
            pool: Pool::new(n)?,
            requests: FxHashMap::default(),
        };
        Ok(Self {
            prefixes: Prefixes::new(&config),
            config,
            state: Mutex::new(state),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.config.block_size)
    }

    /// Reports that the first `num_computed_tokens` tokens of request `id`
    /// have their KV written; full blocks among them become shareable.
    /// Progress only moves forward and cannot pass the request's length.
    pub fn commit(&self, id: RequestId, num_computed_tokens: usize) -> Result<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let request = st.requests.get_mut(&id).ok_or(Error::UnknownRequest(id))?;
        self.check_commit(request, num_computed_tokens)?;
        request.num_computed = num_computed_tokens;
        let first = request.chain.hashes.len();
        self.index_blocks(&mut st.cache, request, first);
        Ok(())
    }

    /// [`BlockManager::commit`] of a request admitted with
    /// [`BlockManager::admit_hashed`], indexing its blocks that become full
    /// and computed under the caller's `hashes`: one for each full block
    /// among the first `num_computed_tokens` tokens past those indexed
    /// before. The commit may reach past the request's tokens into its
    /// reserved room ([`BlockManager::reserve`]): those positions become
    /// tokens whose ids the manager does not know, so the engine never has
    /// to pass them. Not while events are on (they carry token ids): append
    /// the tokens first.
    ///
    /// Fails, changing nothing, with [`Error::InvalidArgument`] for another
    /// count of hashes, a commit past the room or backwards, or a request
    /// the manager hashes itself.
    pub fn commit_hashed(
        &self,
        id: RequestId,
        num_computed_tokens: usize,
        hashes: &[BlockHash],
    ) -> Result<()> {
        let n = num_computed_tokens;
        let bs = self.config.block_size;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let request = st.requests.get_mut(&id).ok_or(Error::UnknownRequest(id))?;
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if !request.caller_hashed {
            return bad(format!(
                "request {id} was admitted without caller block hashes: commit it without them"
            ));
        }
        let room = request.blocks.len() * bs;
        if n > room {
            return bad(format!(
                "cannot commit {n} tokens of a request with {room} slots"
            ));
        }
        if n > request.tokens.len() && self.config.enable_events {
            return bad(format!(
                "events carry token ids: append the tokens up to {n} before committing them"
            ));
        }
        if n < request.num_computed {
            return bad(format!(
                "commit moves backwards: {n} < {} already computed",
                request.num_computed
            ));
        }
        let want = (n / bs).saturating_sub(request.chain.hashes.len());
        if self.config.enable_prefix_caching && hashes.len() != want {
            return bad(format!(
                "{} block hashes for the {want} blocks this commit makes full",
                hashes.len()
            ));
        }
        request.len = request.len.max(n);
        request.num_computed = n;
        let first = request.chain.hashes.len();
        if self.config.enable_prefix_caching {
            request.chain.hashes.extend_from_slice(hashes);
        }
        self.index_blocks(&mut st.cache, request, first);
        Ok(())
    }

    /// Creates request `child` sharing every block of `parent` that holds
    /// tokens (parallel sampling, beam search). Takes no new block: the
    /// first append to a shared partial tail copies it.
    pub fn fork(&self, parent: RequestId, child: RequestId) -> Result<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.requests.contains_key(&child) {
            return Err(Error::DuplicateRequest(child));
        }
        let p = st
            .requests
            .get(&parent)
            .ok_or(Error::UnknownRequest(parent))?;
        let mut c = p.clone();
        c.blocks.truncate(self.blocks_for(p.len));
        for &b in &c.blocks {
            st.pool.acquire(&mut st.cache, b);
        }
        st.cache.stats.num_requests += 1;
        st.requests.insert(child, c);
        Ok(())
    }

    /// Frees request `id`. Its blocks are released tail first, so the deepest
    /// blocks of a prefix chain are evicted before its root.
    pub fn free(&self, id: RequestId) -> Result<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let request = st.requests.remove(&id).ok_or(Error::UnknownRequest(id))?;
        self.release_request(st, &request);
        Ok(())
    }

    /// Releases the blocks of a request taken out of `st.requests`, tail first.
    fn release_request(&self, st: &mut State, request: &Request) {
        for &b in request.blocks.iter().rev() {
            st.pool.release(&mut st.cache, b);
        }
        st.cache.stats.num_requests -= 1;
    }

    /// The block table of request `id`.
    pub fn block_table(&self, id: RequestId) -> Result<Vec<BlockId>> {
        let st = self.state.lock();
        let request = st.requests.get(&id).ok_or(Error::UnknownRequest(id))?;
        Ok(request.blocks.clone())
    }

    /// Slot numbers (`block_id * block_size + offset`) of positions `range`
    /// of request `id`; positions may reach into its reserved room.
    pub fn slot_mapping(&self, id: RequestId, range: Range<usize>) -> Result<Vec<i64>> {
        let st = self.state.lock();
        let request = st.requests.get(&id).ok_or(Error::UnknownRequest(id))?;
        self.check_positions(request, &range)?;
        Ok(self.slots(request, range).collect())
    }

    /// Fails unless `range` lies within `request`'s slots.
    fn check_positions(&self, request: &Request, range: &Range<usize>) -> Result<()> {
        let room = request.blocks.len() * self.config.block_size;
        if range.start > range.end || range.end > room {
            return Err(Error::InvalidArgument(format!(
                "positions {range:?} outside the request's {room} slots"
            )));
        }
        Ok(())
    }

    /// The slots of positions `range` of `request` (checked by
    /// [`BlockManager::check_positions`]).
    fn slots<'a>(
        &self,
        request: &'a Request,
        range: Range<usize>,
    ) -> impl Iterator<Item = i64> + 'a {
        let bs = self.config.block_size;
        range.map(move |p| request.blocks[p / bs] as i64 * bs as i64 + (p % bs) as i64)
    }

    /// Tokens (prompt and appended) of request `id`.
    pub fn num_tokens(&self, id: RequestId) -> Result<usize> {
        let st = self.state.lock();
        Ok(st.requests.get(&id).ok_or(Error::UnknownRequest(id))?.len)
    }

    /// Tokens of request `id` whose KV is written: its length without
    /// `chunked_prefill`, else what [`BlockManager::commit`] reported last
    /// (at least its cached prefix).
    pub fn num_computed_tokens(&self, id: RequestId) -> Result<usize> {
        let st = self.state.lock();
        Ok(st
            .requests
            .get(&id)
            .ok_or(Error::UnknownRequest(id))?
            .num_computed)
    }

    /// Drops `blocks` from the prefix index (vLLM's `evict_blocks`: a KV
    /// connector reports their contents unreadable), so no later lookup
    /// finds them; one `BlockRemoved` event per block. A free block moves
    /// from the policy's evictable set to the never-hashed free list (in the
    /// order given); a block in use stays with its holders, who may keep
    /// using it, but is no longer shareable and is freed as unhashed. Blocks
    /// not in the index (never hashed, dropped before, repeated) are skipped;
    /// blocks after a dropped one in a prefix chain stay indexed, though no
    /// lookup reaches them through it. Not an eviction to make room: neither
    /// counted in [`CacheStats::evictions`] nor logged for
    /// [`BlockManager::take_evicted`] (the contents are not worth keeping).
    ///
    /// Returns how many blocks left the index. Fails, changing nothing, with
    /// [`Error::InvalidBlock`] for an id outside the cache, and with
    /// [`Error::InvalidArgument`] for a pinned block: pins are released by
    /// prefix through the index ([`BlockManager::unpin`]), so unpin first.
    pub fn evict_blocks(&self, blocks: &[BlockId]) -> Result<usize> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        self.prefixes.check_droppable(&st.cache, blocks)?;
        Ok(blocks
            .iter()
            .filter(|&&b| st.pool.drop_block(&self.prefixes, &mut st.cache, b))
            .count())
    }

    /// Evicts up to `num_blocks` free cached blocks, chosen as allocation
    /// chooses them (the policy's victims): their hashes leave the index and
    /// they join the never-hashed free list, reused first. Counted, logged
    /// and announced like the evictions allocation makes. For engines that
    /// evict ahead of allocating (SGLang's `RadixCache.evict`); allocation
    /// evicts by itself. Returns how many blocks were evicted (fewer when
    /// fewer free blocks are cached).
    pub fn evict(&self, num_blocks: usize) -> usize {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.pool.evict(&self.prefixes, &mut st.cache, num_blocks)
    }

    /// Pins the cached full blocks of the prefix `tokens` under `keys`: they
    /// are neither evicted nor reused until [`BlockManager::unpin`] of the
    /// same prefix. Returns the tokens pinned (0, and nothing to unpin, when
    /// nothing of the prefix is cached). Pins nest.
    pub fn pin(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Result<usize> {
        let hashes = self.chain(tokens, keys);
        let mut st = self.state.lock();
        self.prefixes.pin(&mut st.cache, tokens, &hashes)
    }

    /// Releases one pin of the prefix `tokens`: the pin whose run ends
    /// deepest in it, exactly the blocks that `pin` took. Returns the tokens
    /// unpinned, or [`Error::NotPinned`] when no pin lies on the prefix.
    pub fn unpin(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Result<usize> {
        let hashes = self.chain(tokens, keys);
        let mut st = self.state.lock();
        self.prefixes.unpin(&mut st.cache, &hashes)
    }

    /// A snapshot of gauges and counters.
    pub fn stats(&self) -> CacheStats {
        let st = self.state.lock();
        let free = st.pool.num_free(&st.cache) as u64;
        CacheStats {
            free_blocks: free,
            used_blocks: self.config.num_blocks as u64 - free,
            ..self.prefixes.stats(&st.cache)
        }
    }

    /// How many requests hold `block` (0 for a free one): vLLM's `ref_cnt`.
    /// [`Error::InvalidBlock`] for an id outside the cache.
    pub fn ref_count(&self, block: BlockId) -> Result<u32> {
        if block as usize >= self.config.num_blocks {
            return Err(Error::InvalidBlock(block));
        }
        Ok(self.state.lock().pool.ref_count(block))
    }

    /// Blocks no request holds.
    pub fn num_free_blocks(&self) -> usize {
        let st = self.state.lock();
        st.pool.num_free(&st.cache)
    }

    /// Fraction of blocks in use, `0.0..=1.0`.
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free_blocks() as f64 / self.config.num_blocks as f64
    }

    /// Events recorded since the last call (empty unless
    /// [`CacheConfig::enable_events`]).
    pub fn take_events(&self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.state.lock().cache.events)
    }

    /// Drops every cached block from the prefix index. Refused with
    /// [`Error::BlocksInUse`] while any block is held (by requests or pins).
    pub fn reset_prefix_cache(&self) -> Result<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        for b in self.prefixes.reset(&mut st.cache)? {
            st.pool.unhashed.push_back(b);
        }
        Ok(())
    }

    /// External hashes ([`BlockHash::external`]) of the full blocks of
    /// `tokens` under `keys`: the values events carry for them (empty
    /// without prefix caching).
    pub fn block_hashes(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Vec<u64> {
        let hashes = self.chain_hashes(tokens, keys);
        hashes.into_iter().map(BlockHash::external).collect()
    }

    /// The 128-bit chain hashes of the full blocks of `tokens` under `keys`,
    /// as admission computes them (empty without prefix caching). Lower
    /// cache tiers ([`crate::tier`]) key their blocks by these.
    pub fn chain_hashes(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Vec<BlockHash> {
        self.chain(tokens, keys)
    }

    /// The (external hash, block) pairs of request `id`'s full computed blocks from
    /// block `from` on, in table order, up to the first one dropped by
    /// [`BlockManager::evict_blocks`] (its contents were declared
    /// unreadable). Their contents are final: full computed blocks are never
    /// written again.
    pub fn computed_blocks(&self, id: RequestId, from: usize) -> Result<Vec<(u64, BlockId)>> {
        let blocks = self.computed_chain(id, from)?;
        Ok(external_pairs(blocks))
    }

    /// [`BlockManager::computed_blocks`] with the 128-bit chain hashes, for the tiers.
    pub(crate) fn computed_chain(
        &self,
        id: RequestId,
        from: usize,
    ) -> Result<Vec<(BlockHash, BlockId)>> {
        let st = self.state.lock();
        let request = st.requests.get(&id).ok_or(Error::UnknownRequest(id))?;
        Ok(request
            .chain
            .hashes
            .iter()
            .zip(&request.blocks)
            .skip(from)
            .map(|(&h, &b)| (h, b))
            .take_while(|&(_, b)| !st.pool.blocks[b as usize].dropped)
            .collect())
    }

    /// Starts (`true`) or stops logging evictions for [`BlockManager::take_evicted`].
    /// Stopping drops the log.
    pub fn set_eviction_log(&self, on: bool) {
        let mut st = self.state.lock();
        let log = &mut st.cache.evicted;
        match (on, log.is_some()) {
            (true, false) => *log = Some(Vec::new()),
            (false, true) => *log = None,
            _ => {}
        }
    }

    /// The (external hash, block) pairs evicted since the last call, oldest first
    /// (empty unless [`BlockManager::set_eviction_log`] is on). An evicted
    /// block was handed to a new owner by the call that evicted it, but keeps
    /// its old contents until that owner's engine writes it: copy it out
    /// before returning the block table to the engine (write-back).
    pub fn take_evicted(&self) -> Vec<(u64, BlockId)> {
        external_pairs(self.take_evicted_chain())
    }

    /// [`BlockManager::take_evicted`] with the 128-bit chain hashes, for the tiers.
    pub(crate) fn take_evicted_chain(&self) -> Vec<(BlockHash, BlockId)> {
        self.state
            .lock()
            .cache
            .evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Checks that a commit of `n` tokens moves `request` forward within its tokens.
    fn check_commit(&self, request: &Request, n: usize) -> Result<()> {
        if n > request.len {
            return Err(Error::InvalidArgument(format!(
                "cannot commit {n} tokens of a {}-token request",
                request.len
            )));
        }
        if n < request.num_computed {
            return Err(Error::InvalidArgument(format!(
                "commit moves backwards: {n} < {} already computed",
                request.num_computed
            )));
        }
        Ok(())
    }

    /// Hashes and indexes the request's full computed blocks from block
    /// `first` on; the hashes of blocks before `request.chain.hashes.len()` are
    /// known already. A caller-hashed request is indexed only as far as
    /// the caller's hashes go.
    fn index_blocks(&self, cache: &mut CacheState, request: &mut Request, first: usize) {
        if !self.config.enable_prefix_caching {
            return;
        }
        let mut full = request.num_computed / self.config.block_size;
        if request.caller_hashed {
            full = full.min(request.chain.hashes.len());
        }
        if full <= first {
            return;
        }
        if !request.caller_hashed {
            self.prefixes.hasher.extend_chain(
                &request.tokens,
                &request.keys,
                full,
                &mut request.chain,
                &mut cache.buf,
            );
        }
        self.prefixes.store_chain(
            cache,
            &request.tokens,
            &request.chain.hashes,
            &request.blocks,
            first..full,
            request.retention,
            request.keys.adapter_name.as_ref(),
        );
    }
}

/// (hash, block) pairs with the hashes shown as external ones.
fn external_pairs(pairs: Vec<(BlockHash, BlockId)>) -> Vec<(u64, BlockId)> {
    pairs.into_iter().map(|(h, b)| (h.external(), b)).collect()
}
