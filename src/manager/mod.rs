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

mod batch;
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

    /// Hashes of the full blocks of `tokens` under `keys` (none without prefix caching).
    fn chain(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Vec<BlockHash> {
        self.prefixes
            .chain(tokens, &self.prefixes.hasher.digest(keys))
    }

    /// Admits request `id` with its prompt `tokens`, reusing the longest
    /// cached prefix (capped at `len - 1` tokens by default) and reserving
    /// `opts.decode_slots` more slots. All or nothing: it holds exactly
    /// `ceil((len + decode_slots) / block_size)` blocks, or fails with
    /// [`Error::OutOfBlocks`] (fits later) or [`Error::RequestTooLarge`]
    /// (never fits) and changes nothing.
    pub fn admit(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        // The request keeps a copy of its tokens: made as the chain is
        // hashed, it is also the buffer the chain is hashed in.
        self.admit_filled(
            id,
            tokens.len(),
            &mut |out, upto| {
                fill_step(tokens, out, upto, |step, out| {
                    out.extend_from_slice(step);
                    Ok(())
                })
            },
            opts,
        )
    }

    /// [`BlockManager::admit`] of a prompt of `len` tokens that `fill`
    /// writes into the request's buffer block by block as they are hashed
    /// (`fill(tokens, upto)` appends them up to `upto`; see
    /// [`Prefixes::chain_filling`]): a caller converting its prompt (the
    /// bindings' arrays) converts it there, and an error of `fill` (a value
    /// out of range) fails the call before anything changes.
    pub(crate) fn admit_filled(
        &self,
        id: RequestId,
        len: usize,
        fill: &mut dyn FnMut(&mut Vec<TokenId>, usize) -> Result<()>,
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        let (needed, keys) = self.check_prompt(len, opts)?;
        let (tokens, chain) = self.prefixes.chain_filling(len, &keys, fill)?;
        let prompt = self.prompt(len, keys, chain, needed);
        self.admit_checked(id, Cow::Owned(tokens), opts, Cow::Owned(prompt))
    }

    /// [`BlockManager::admit`] of a prompt the caller owns: its tokens are
    /// hashed in place and move into the request instead of being copied
    /// (the bindings' path).
    #[cfg(feature = "python")]
    pub(crate) fn admit_vec(
        &self,
        id: RequestId,
        mut tokens: Vec<TokenId>,
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        let (needed, keys) = self.check_prompt(tokens.len(), opts)?;
        let chain = self.prefixes.chain_in_place(&mut tokens, &keys);
        let prompt = self.prompt(tokens.len(), keys, chain, needed);
        self.admit_checked(id, Cow::Owned(tokens), opts, Cow::Owned(prompt))
    }

    /// [`BlockManager::admit`] keyed by the caller's block hashes: `hashes`
    /// names the full blocks of `tokens`, one each, as the engine hashed
    /// them ([`BlockManager::engine_block_hash`] of vLLM's digests), and the
    /// manager never hashes this request's tokens. The lookup reads them
    /// all; what is indexed at once is the hit under chunked prefill, else
    /// every full block. Later blocks are indexed by
    /// [`BlockManager::commit_hashed`] with their hashes (from the first one
    /// not indexed); `append` and `commit` leave them unindexed.
    ///
    /// Caller hashes and the manager's own share one index, so they must
    /// name equal prefixes alike: they are taken only under an
    /// engine-compatible [`CacheConfig::block_hash`] (`sha256_cbor`,
    /// `xxhash_cbor`), whose chain the manager computes as vLLM does, and
    /// without `verify_tokens`; otherwise, and for a count other than
    /// `tokens.len() / block_size`, [`Error::InvalidArgument`] and nothing
    /// changes.
    pub fn admit_hashed(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        hashes: &[BlockHash],
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        self.check_caller_hashes()?;
        let full = tokens.len() / self.config.block_size;
        if hashes.len() != full {
            return Err(Error::InvalidArgument(format!(
                "{} block hashes for {full} full blocks",
                hashes.len()
            )));
        }
        let mut prompt = self.prepare_keyed(tokens, opts, Some(hashes))?;
        prompt.caller_hashed = true;
        self.admit_checked(id, Cow::Borrowed(tokens), opts, Cow::Owned(prompt))
    }

    /// The manager's name for one block digest of the engine's hasher
    /// (vLLM's `request.block_hashes` entries): its last 16 bytes,
    /// big-endian, as the manager derives its own `sha256_cbor` and
    /// `xxhash_cbor` hashes, so events carry vLLM's external hashes. The
    /// digest is 32 bytes under `sha256_cbor`, 16 under `xxhash_cbor`;
    /// [`Error::InvalidArgument`] for another length or under `xxh3`.
    pub fn engine_block_hash(&self, digest: &[u8]) -> Result<BlockHash> {
        self.check_caller_hashes()?;
        let want = match self.config.block_hash {
            BlockHashKind::Sha256Cbor => 32,
            _ => 16,
        };
        if digest.len() != want {
            return Err(Error::InvalidArgument(format!(
                "a {} block digest has {want} bytes, got {}",
                self.config.block_hash.name(),
                digest.len()
            )));
        }
        let tail: [u8; 16] = digest[want - 16..].try_into().expect("16 bytes");
        Ok(BlockHash(u128::from_be_bytes(tail)))
    }

    /// Refuses caller hashes where they could not equal the manager's own.
    fn check_caller_hashes(&self) -> Result<()> {
        if self.config.block_hash == BlockHashKind::Xxh3 {
            return Err(Error::InvalidArgument(
                "caller block hashes need block_hash 'sha256_cbor' or 'xxhash_cbor' \
                 (the 'xxh3' chain is the library's own, unlike any engine's)"
                    .into(),
            ));
        }
        if self.config.verify_tokens {
            return Err(Error::InvalidArgument(
                "caller block hashes cannot be used with verify_tokens".into(),
            ));
        }
        Ok(())
    }

    /// Checks a prompt and computes, before the state lock is taken, what
    /// admitting it needs: its key digest, its chain and its hit cap.
    pub(crate) fn prepare(&self, tokens: &[TokenId], opts: &AdmitOptions) -> Result<Prompt> {
        self.prepare_keyed(tokens, opts, None)
    }

    /// [`BlockManager::prepare`] with the chain `hashes` when the caller gives it.
    fn prepare_keyed(
        &self,
        tokens: &[TokenId],
        opts: &AdmitOptions,
        hashes: Option<&[BlockHash]>,
    ) -> Result<Prompt> {
        let (needed, keys) = self.check_prompt(tokens.len(), opts)?;
        let chain = match hashes {
            Some(h) if self.config.enable_prefix_caching => Chain::from_hashes(h.to_vec()),
            Some(_) => Chain::default(),
            None => self.prefixes.chain_of(tokens, &keys),
        };
        Ok(self.prompt(tokens.len(), keys, chain, needed))
    }

    /// Checks a prompt of `len` tokens under `opts`: the blocks it needs
    /// and its key digest.
    fn check_prompt(&self, len: usize, opts: &AdmitOptions) -> Result<(usize, KeyDigest)> {
        if len == 0 {
            return Err(Error::EmptyInput(
                "a request needs at least one prompt token",
            ));
        }
        let slots = len
            .checked_add(opts.decode_slots)
            .ok_or_else(|| Error::InvalidArgument("prompt + decode slots overflow".into()))?;
        let needed = self.blocks_for(slots);
        if needed > self.config.num_blocks {
            return Err(Error::RequestTooLarge {
                needed,
                total: self.config.num_blocks,
            });
        }
        opts.keys.check(len)?;
        Ok((needed, self.prefixes.hasher.digest(&opts.keys)))
    }

    /// The checked prompt of `len` tokens with its `chain`.
    fn prompt(&self, len: usize, keys: KeyDigest, chain: Chain, needed: usize) -> Prompt {
        let hit_limit = if self.config.cap_hit_at_last_token {
            (len - 1) / self.config.block_size
        } else {
            chain.hashes.len()
        };
        Prompt {
            keys: Arc::new(keys),
            chain,
            hit_limit,
            needed,
            caller_hashed: false,
        }
    }

    /// [`BlockManager::admit`] of a prompt that [`BlockManager::prepare`]
    /// computed with the same `tokens` and `opts`.
    pub(crate) fn admit_prepared(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        opts: &AdmitOptions,
        prompt: &Prompt,
    ) -> Result<Admission> {
        self.admit_checked(id, Cow::Borrowed(tokens), opts, Cow::Borrowed(prompt))
    }

    /// The admission itself: an owned prompt's chain and tokens move into
    /// the request, a borrowed one's are copied (the chain only as far as
    /// it is kept).
    fn admit_checked(
        &self,
        id: RequestId,
        tokens: Cow<'_, [TokenId]>,
        opts: &AdmitOptions,
        prompt: Cow<'_, Prompt>,
    ) -> Result<Admission> {
        let (hashes, needed, bs) = (&prompt.chain.hashes, prompt.needed, self.config.block_size);
        let len = tokens.len();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.requests.contains_key(&id) {
            return Err(Error::DuplicateRequest(id));
        }
        // The hits start the block table.
        let (mut blocks, check) = self.check_admit(st, &tokens, &prompt);
        if !check.fits() {
            return Err(Error::OutOfBlocks {
                needed: check.new_blocks,
                available: check.available_blocks,
            });
        }
        let (fresh, num_hits) = (check.new_blocks, blocks.len());

        let retention = st.cache.policy.on_request(hashes, num_hits);
        for &b in &blocks {
            st.pool.acquire(&mut st.cache, b);
            st.cache.policy.on_hit(b);
        }
        blocks.reserve_exact(needed - num_hits);
        st.pool
            .allocate_many(&self.prefixes, &mut st.cache, fresh, &mut blocks);
        let cached = num_hits * bs;
        let stats = &mut st.cache.stats;
        stats.prefix_query_tokens += len as u64;
        stats.prefix_hit_tokens += cached as u64;
        stats.prefix_query_requests += 1;
        stats.prefix_hit_requests += u64::from(cached > 0);
        stats.num_requests += 1;

        let num_computed = if opts.chunked_prefill { cached } else { len };
        // The precomputed chain is kept only up to what is hashed and indexed below.
        let (kept, keys, caller_hashed) = (
            num_computed / bs,
            Arc::clone(&prompt.keys),
            prompt.caller_hashed,
        );
        let chain = match prompt {
            Cow::Owned(mut p) => {
                p.chain.truncate(kept);
                p.chain
            }
            Cow::Borrowed(p) => p.chain.prefix(kept),
        };
        let mut request = Request {
            tokens: tokens.into_owned(),
            len,
            blocks,
            chain,
            num_computed,
            chunked: opts.chunked_prefill,
            retention,
            keys,
            caller_hashed,
        };
        self.index_blocks(&mut st.cache, &mut request, 0);
        let admission = Admission {
            block_ids: request.blocks.clone(),
            num_cached_tokens: cached,
        };
        st.requests.insert(id, request);
        Ok(admission)
    }

    /// The hits of `prompt` and what admitting it takes now, changing nothing.
    fn check_admit(
        &self,
        st: &State,
        tokens: &[TokenId],
        prompt: &Prompt,
    ) -> (Vec<BlockId>, AdmitCheck) {
        let hits = self
            .prefixes
            .lookup(tokens, &prompt.chain.hashes, prompt.hit_limit);
        let reviving = hits.iter().filter(|&&b| st.cache.is_evictable(b)).count();
        let check = AdmitCheck {
            num_cached_tokens: hits.len() * self.config.block_size,
            new_blocks: prompt.needed - hits.len(),
            available_blocks: st.pool.num_free(&st.cache) - reviving,
        };
        (hits, check)
    }

    /// What [`BlockManager::admit`] of `tokens` with `opts` would take now
    /// (hit tokens, blocks to allocate, blocks available), without admitting
    /// anything, taking references or telling the policy: a dry run. Fails
    /// as `admit` does for input it refuses ([`Error::EmptyInput`],
    /// [`Error::RequestTooLarge`]); [`AdmitCheck::fits`] says whether it
    /// would fail with [`Error::OutOfBlocks`].
    pub fn would_admit(&self, tokens: &[TokenId], opts: &AdmitOptions) -> Result<AdmitCheck> {
        let prompt = self.prepare(tokens, opts)?;
        let st = self.state.lock();
        Ok(self.check_admit(&st, tokens, &prompt).1)
    }

    /// Longest cached prefix of `tokens` under `keys`, without admitting
    /// anything or taking references: the blocks may be evicted right after.
    pub fn match_prefix(&self, tokens: &[TokenId], keys: &ExtraKeys) -> PrefixMatch {
        let block_ids = self.cached_run(tokens, &self.chain(tokens, keys));
        PrefixMatch {
            num_tokens: block_ids.len() * self.config.block_size,
            block_ids,
        }
    }

    /// Longest cached prefix named by the caller's block hashes (see
    /// [`BlockManager::admit_hashed`]), without admitting anything or taking
    /// references. Needs no tokens, and reads `hashes` only up to the first
    /// miss: [`Error::InvalidArgument`] where caller hashes are refused.
    pub fn match_hashes(&self, hashes: impl IntoIterator<Item = BlockHash>) -> Result<PrefixMatch> {
        self.check_caller_hashes()?;
        let block_ids = if self.config.enable_prefix_caching {
            let keys = hashes.into_iter().map(|h| (h, None));
            self.prefixes.index.leading_run(keys, &[])
        } else {
            Vec::new()
        };
        Ok(PrefixMatch {
            num_tokens: block_ids.len() * self.config.block_size,
            block_ids,
        })
    }

    /// The cached leading blocks of `tokens`, whose chain is `hashes`.
    pub(crate) fn cached_run(&self, tokens: &[TokenId], hashes: &[BlockHash]) -> Vec<BlockId> {
        self.prefixes.lookup(tokens, hashes, usize::MAX)
    }

    /// Appends generated `tokens` to request `id`. Fills the reserved room
    /// first and takes new blocks only when it is full; a shared partial tail
    /// is first copied to a fresh block (see [`AppendOutcome::copies`]).
    /// Blocks that become full (and computed) are hashed and shareable.
    pub fn append(&self, id: RequestId, tokens: &[TokenId]) -> Result<AppendOutcome> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let request = st.requests.get_mut(&id).ok_or(Error::UnknownRequest(id))?;
        self.append_to(&mut st.pool, &mut st.cache, request, tokens)
    }

    /// [`BlockManager::append`] of `tokens` to `request`, under the lock.
    fn append_to(
        &self,
        pool: &mut Pool,
        cache: &mut CacheState,
        request: &mut Request,
        tokens: &[TokenId],
    ) -> Result<AppendOutcome> {
        let new_len = appended_len(request, tokens)?;
        let outcome = self.make_room(pool, cache, request, new_len)?;
        if request.tokens.len() == request.len {
            request.tokens.extend_from_slice(tokens);
        }
        request.len = new_len;
        if !request.chunked {
            request.num_computed = new_len;
            let first = request.chain.hashes.len();
            self.index_blocks(cache, request, first);
        }
        Ok(outcome)
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

    /// Tokens request `id` can take before it needs a new block: the room
    /// left in its table (its partial tail and reserved blocks).
    pub fn capacity(&self, id: RequestId) -> Result<usize> {
        let st = self.state.lock();
        let request = st.requests.get(&id).ok_or(Error::UnknownRequest(id))?;
        Ok(request.blocks.len() * self.config.block_size - request.len)
    }

    /// Grows request `id`'s table so it has room for `total_slots` token
    /// positions (its tokens included) without adding tokens: lookahead
    /// slots for speculative decoding (vLLM's `num_lookahead_tokens`, draft
    /// tokens of DeepSeek's multi-token prediction), addressed with
    /// [`BlockManager::slot_mapping`]. Never shrinks: with the room already
    /// there it adds nothing. The room is private: when it starts inside a
    /// partial tail shared with a fork, that tail is copied first (see
    /// [`AppendOutcome::copies`]), so the slots can be written at once.
    ///
    /// Returns the blocks added to the end of the table and the copies, as
    /// [`BlockManager::append`] does. A later `append` fills the reserved
    /// room before taking blocks; `fork` shares only the blocks holding
    /// tokens; `free` releases the room with the rest. All or nothing:
    /// [`Error::OutOfBlocks`] (fits later) or [`Error::RequestTooLarge`]
    /// (never fits) change nothing.
    pub fn reserve(&self, id: RequestId, total_slots: usize) -> Result<AppendOutcome> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let request = st.requests.get_mut(&id).ok_or(Error::UnknownRequest(id))?;
        self.make_room(&mut st.pool, &mut st.cache, request, total_slots)
    }

    /// Grows `request`'s table to room for `slots` positions, first copying
    /// a shared partial tail that positions past its tokens would be
    /// written into. All or nothing.
    fn make_room(
        &self,
        pool: &mut Pool,
        cache: &mut CacheState,
        request: &mut Request,
        slots: usize,
    ) -> Result<AppendOutcome> {
        let growth = self.growth(request, slots)?;
        let grow = growth.grow;
        let cow = growth
            .written_tail
            .is_some_and(|(_, b)| pool.ref_count(b) > 1);
        let fresh = grow + usize::from(cow);
        let available = pool.num_free(cache);
        if fresh > available {
            return Err(Error::OutOfBlocks {
                needed: fresh,
                available,
            });
        }
        let mut outcome = AppendOutcome::default();
        if let Some((position, src)) = growth.written_tail.filter(|_| cow) {
            let dst = pool.allocate(&self.prefixes, cache);
            pool.release(cache, src);
            request.blocks[position] = dst;
            cache.stats.cow_copies += 1;
            outcome.copies.push(BlockCopy { src, dst, position });
        }
        let start = request.blocks.len();
        pool.allocate_many(&self.prefixes, cache, grow, &mut request.blocks);
        outcome.new_block_ids = request.blocks[start..].to_vec();
        Ok(outcome)
    }

    /// How `request`'s table grows to room for `slots` positions: fails
    /// with [`Error::RequestTooLarge`] past the cache's size.
    fn growth(&self, request: &Request, slots: usize) -> Result<Growth> {
        let bs = self.config.block_size;
        let needed = self.blocks_for(slots);
        if needed > self.config.num_blocks {
            return Err(Error::RequestTooLarge {
                needed,
                total: self.config.num_blocks,
            });
        }
        let len = request.len;
        let tail = len / bs;
        Ok(Growth {
            grow: needed.saturating_sub(request.blocks.len()),
            written_tail: (slots > len && len % bs != 0).then(|| (tail, request.blocks[tail])),
        })
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

/// How a request's table grows ([`BlockManager::growth`]).
#[derive(Debug, Clone, Copy)]
struct Growth {
    /// Blocks added to the end of the table.
    grow: usize,
    /// The partial tail (table position, block) that positions past the
    /// tokens are written into: copied first when shared.
    written_tail: Option<(usize, BlockId)>,
}

/// The length of `request` once `tokens` are appended.
fn appended_len(request: &Request, tokens: &[TokenId]) -> Result<usize> {
    if tokens.is_empty() {
        return Err(Error::EmptyInput("append needs at least one token"));
    }
    request
        .len
        .checked_add(tokens.len())
        .ok_or_else(|| Error::InvalidArgument("sequence length overflows".into()))
}

/// (hash, block) pairs with the hashes shown as external ones.
fn external_pairs(pairs: Vec<(BlockHash, BlockId)>) -> Vec<(u64, BlockId)> {
    pairs.into_iter().map(|(h, b)| (h.external(), b)).collect()
}
