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
    /// appended token: its blocks are shared before the engine writes
    /// them, which only an engine that computes every hit in the same
    /// forward pass may allow (docs/semantics.md). Multi-threaded engines
    /// set this and commit what they wrote.
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
pub struct BlockCopy {
    /// Block to copy from (still shared with other requests).
    pub src: BlockId,
    /// Fresh block that replaces `src` in the appending request's table.
    pub dst: BlockId,
    /// Where `dst` sits in that table (the index of the tail block).
    pub position: usize,
}

/// The outcome of [`BlockManager::append`] and [`BlockManager::reserve`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Blocks added to the end of the request's table.
    pub new_block_ids: Vec<BlockId>,
    /// Copies to perform before writing the new tokens.
    pub copies: Vec<BlockCopy>,
}

/// The outcome of [`BlockManager::append_batch`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchAppendOutcome {
    /// Per request, in the batch's order: the blocks added and the copies.
    pub requests: Vec<AppendOutcome>,
    /// The slot (`block_id * block_size + offset`) of every appended token,
    /// request after request in the batch's order.
    pub slot_mapping: Vec<i64>,
}

/// What [`BlockManager::fill_block_tables`] wrote: the sizes the batch
/// needs, also reported by [`crate::Error::BatchBuffersTooSmall`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableSizes {
    /// Entries of the longest block table (the least row width).
    pub max_blocks: usize,
    /// Slots written to the slot mapping.
    pub num_slots: usize,
}

/// The outcome of [`BlockManager::would_admit`]: what admitting a prompt
/// now would take, without taking it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmitCheck {
    /// Leading prompt tokens a hit would serve.
    pub num_cached_tokens: usize,
    /// Blocks the admission would allocate (beyond the hits).
    pub new_blocks: usize,
    /// Blocks it could allocate now (free blocks minus the hits it would revive).
    pub available_blocks: usize,
}

impl AdmitCheck {
    /// Whether the admission would succeed now.
    pub fn fits(&self) -> bool {
        self.new_blocks <= self.available_blocks
    }
}
