//! Events for KV-aware routers, mirroring vLLM's KV event stream. Block
//! hashes are the external 64-bit ones ([`BlockHash::external`]).

use std::sync::Arc;

#[cfg(doc)]
use crate::hash::BlockHash;
use crate::ids::TokenId;

/// A change to the prefix index, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive blocks of one chain entered the index.
    BlockStored {
        /// External hashes of the stored blocks, in chain order.
        block_hashes: Vec<u64>,
        /// External hash of the block before the first one; `None` for a chain's first block.
        parent_block_hash: Option<u64>,
        /// The blocks' tokens, `block_size` per block.
        token_ids: Vec<TokenId>,
        /// Tokens per block.
        block_size: usize,
        /// Adapter the blocks were computed with.
        adapter: Option<Arc<str>>,
    },
    /// Blocks left the index (evicted).
    BlockRemoved {
        /// External hashes of the removed blocks.
        block_hashes: Vec<u64>,
    },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}
