//! The request lifecycle that [`BlockManager`] and [`TieredCache`] share:
//! admit, grow, commit, fork, free. Code that drives requests (the C and
//! Python bindings, a scheduler) is written once over [`RequestCache`] and
//! runs on either.
//!
//! ```
//! use mla_cache::{AdmitOptions, Admitted, BlockManager, CacheConfig, RequestCache};
//!
//! fn serve(cache: &impl RequestCache, prompt: &[u32]) -> mla_cache::Result<usize> {
//!     let admitted = cache.admit(1, prompt, &AdmitOptions::default())?;
//!     cache.commit(1, prompt.len())?;
//!     cache.free(1)?;
//!     Ok(admitted.block_ids().len())
//! }
//!
//! let mut config = CacheConfig::new(64);
//! config.block_size = 16;
//! let manager = BlockManager::new(config)?;
//! assert_eq!(serve(&manager, &[7; 40])?, 3);
//! # Ok::<(), mla_cache::Error>(())
//! ```

use crate::tier::{TieredAdmission, TieredCache};
use crate::TokenId;
use crate::{Admission, AdmitOptions, AppendOutcome, BlockId, BlockManager, RequestId, Result};

/// What an admission hands back, whatever cache admitted it.
pub trait Admitted {
    /// The request's block table.
    fn block_ids(&self) -> &[BlockId];
    /// Leading prompt tokens whose KV is in the device tier now.
    fn num_cached_tokens(&self) -> usize;
}

impl Admitted for Admission {
    fn block_ids(&self) -> &[BlockId] {
        &self.block_ids
    }

    fn num_cached_tokens(&self) -> usize {
        self.num_cached_tokens
    }
}

impl Admitted for TieredAdmission {
    fn block_ids(&self) -> &[BlockId] {
        &self.block_ids
    }

    fn num_cached_tokens(&self) -> usize {
        self.num_cached_tokens
    }
}

/// A cache that runs requests: [`BlockManager`] (the device tier alone) or
/// [`TieredCache`] (with host and remote tiers below it). Each method is
/// the type's own method of that name where it has one, with its semantics
/// and errors; `TieredCache` admits owned and filled prompts through
/// [`RequestCache::admit`].
pub trait RequestCache: Send + Sync {
    /// What an admission returns.
    type Admission: Admitted + Send;

    /// The device tier's manager: block tables, slots, lengths, statistics.
    fn manager(&self) -> &BlockManager;

    /// Admits request `id` with its prompt.
    fn admit(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        opts: &AdmitOptions,
    ) -> Result<Self::Admission>;

    /// [`RequestCache::admit`] of a prompt the caller owns: it moves into
    /// the request where the cache keeps prompts, instead of being copied.
    fn admit_owned(
        &self,
        id: RequestId,
        tokens: Vec<TokenId>,
        opts: &AdmitOptions,
    ) -> Result<Self::Admission> {
        self.admit(id, &tokens, opts)
    }

    /// [`RequestCache::admit`] of a prompt of `len` tokens that `fill`
    /// converts (`fill(tokens, upto)` appends them up to `upto`): a caller
    /// holding its prompt in another integer type converts it here, and an
    /// error of `fill` (a value out of range) fails the call before
    /// anything changes. The manager converts block by block as it hashes.
    fn admit_filled(
        &self,
        id: RequestId,
        len: usize,
        fill: &mut dyn FnMut(&mut Vec<TokenId>, usize) -> Result<()>,
        opts: &AdmitOptions,
    ) -> Result<Self::Admission> {
        let mut tokens = Vec::with_capacity(len);
        crate::prefix_cache::filled(fill, &mut tokens, len)?;
        self.admit_owned(id, tokens, opts)
    }

    /// Appends generated tokens to request `id`.
    fn append(&self, id: RequestId, tokens: &[TokenId]) -> Result<AppendOutcome>;

    /// Reports that the first `num_computed_tokens` tokens of `id` have their KV written.
    fn commit(&self, id: RequestId, num_computed_tokens: usize) -> Result<()>;

    /// Creates request `child` sharing the blocks of `parent`.
    fn fork(&self, parent: RequestId, child: RequestId) -> Result<()>;

    /// Frees request `id`.
    fn free(&self, id: RequestId) -> Result<()>;
}

impl RequestCache for BlockManager {
    type Admission = Admission;

    fn manager(&self) -> &BlockManager {
        self
    }

    fn admit(&self, id: RequestId, tokens: &[TokenId], opts: &AdmitOptions) -> Result<Admission> {
        BlockManager::admit(self, id, tokens, opts)
    }

    fn admit_owned(
        &self,
        id: RequestId,
        tokens: Vec<TokenId>,
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        BlockManager::admit_owned(self, id, tokens, opts)
    }

    fn admit_filled(
        &self,
        id: RequestId,
        len: usize,
        fill: &mut dyn FnMut(&mut Vec<TokenId>, usize) -> Result<()>,
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        BlockManager::admit_filled(self, id, len, fill, opts)
    }

    fn append(&self, id: RequestId, tokens: &[TokenId]) -> Result<AppendOutcome> {
        BlockManager::append(self, id, tokens)
    }

    fn commit(&self, id: RequestId, num_computed_tokens: usize) -> Result<()> {
        BlockManager::commit(self, id, num_computed_tokens)
    }

    fn fork(&self, parent: RequestId, child: RequestId) -> Result<()> {
        BlockManager::fork(self, parent, child)
    }

    fn free(&self, id: RequestId) -> Result<()> {
        BlockManager::free(self, id)
    }
}

impl RequestCache for TieredCache {
    type Admission = TieredAdmission;

    fn manager(&self) -> &BlockManager {
        TieredCache::manager(self)
    }

    fn admit(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        opts: &AdmitOptions,
    ) -> Result<TieredAdmission> {
        TieredCache::admit(self, id, tokens, opts)
    }

    fn append(&self, id: RequestId, tokens: &[TokenId]) -> Result<AppendOutcome> {
        TieredCache::append(self, id, tokens)
    }

    fn commit(&self, id: RequestId, num_computed_tokens: usize) -> Result<()> {
        TieredCache::commit(self, id, num_computed_tokens)
    }

    fn fork(&self, parent: RequestId, child: RequestId) -> Result<()> {
        TieredCache::fork(self, parent, child)
    }

    fn free(&self, id: RequestId) -> Result<()> {
        TieredCache::free(self, id)
    }
}
