//! What the block manager's calls take and return.

use crate::hash::ExtraKeys;
use crate::ids::BlockId;

#[cfg(doc)]
use super::BlockManager;

/// How a request is admitted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmitOptions {
    /// Extra token slots to reserve beyond the prompt (for decoding).
    pub decode_slots: usize,
    /// Keys beyond the token ids (adapter, salt, multimodal inputs).
    pub keys: ExtraKeys,
    /// The engine computes the prompt in chunks and reports progress with
    /// [`BlockManager::commit`]; until then, uncomputed blocks are never
    /// served to another request. When false, the whole prompt counts as
    /// computed once admitted (an unchunked prefill), and so does every
    /// appended token.
    pub chunked_prefill: bool,
}

impl AdmitOptions {
    /// Options reserving `n` decode slots.
    pub fn decode_slots(n: usize) -> Self {
        Self {
            decode_slots: n,
            ..Self::default()
        }
    }
}

/// The outcome of [`BlockManager::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The request's block table.
    pub block_ids: Vec<BlockId>,
    /// Leading prompt tokens whose KV is already cached.
    pub num_cached_tokens: usize,
}

/// A block copy the engine must perform before writing (copy-on-write).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct BlockCopy {
    /// Block to copy from (still shared with other requests).
    pub src: BlockId,
    /// Fresh block that replaces `src` in the appending request's table.
    pub dst: BlockId,
}

/// The outcome of [`BlockManager::append`] and [`BlockManager::reserve`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Blocks added to the end of the request's table.
    pub new_block_ids: Vec<BlockId>,
    /// Copies to perform before writing the new tokens.
    pub copies: Vec<BlockCopy>,
}
