//! Events for KV-aware routers, mirroring vLLM's KV event stream.

use std::sync::Arc;

use crate::hash::BlockHash;
use crate::TokenId;

/// A change to the prefix index, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive blocks of one chain entered the index.
    BlockStored {
        /// Hashes of the stored blocks, in chain order.
        block_hashes: Vec<BlockHash>,
        /// Hash of the block before the first one; `None` for a chain's first block.
        parent_block_hash: Option<BlockHash>,
        /// The blocks' tokens, `block_size` per block.
        token_ids: Vec<TokenId>,
        /// Tokens per block.
        block_size: usize,
        /// Adapter the blocks were computed with.
        adapter: Option<Arc<str>>,
    },
    /// Blocks left the index (evicted).
    BlockRemoved {
        /// Hashes of the removed blocks.
        block_hashes: Vec<BlockHash>,
    },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}
