//! The one error type of the crate.

use crate::ids::{BlockId, RequestId};

/// Everything that can go wrong in mla_cache. Every failing call leaves the
/// state it was called on unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The configuration cannot describe a cache.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// Not enough free blocks right now; nothing was allocated.
    #[error("out of blocks: {needed} needed, {available} available")]
    OutOfBlocks {
        /// Blocks the call needed.
        needed: usize,
        /// Blocks that could have been allocated.
        available: usize,
    },
    /// The request needs more blocks than the whole cache holds: it can never fit.
    #[error("request needs {needed} blocks but the cache has {total}")]
    RequestTooLarge {
        /// Blocks the request needs.
        needed: usize,
        /// Blocks in the cache.
        total: usize,
    },
    /// No request with this id is admitted.
    #[error("unknown request {0}")]
    UnknownRequest(RequestId),
    /// A request with this id is already admitted.
    #[error("request {0} is already admitted")]
    DuplicateRequest(RequestId),
    /// A call that needs tokens got none.
    #[error("empty input: {0}")]
    EmptyInput(&'static str),
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A block id outside `0..num_blocks`, or a block in the wrong state.
    #[error("invalid block id {0}")]
    InvalidBlock(BlockId),
    /// Pinning would exceed the pinned-block budget.
    #[error("pin budget exceeded: {pinned} pinned + {requested} requested > budget {budget}")]
    PinBudgetExceeded {
        /// Blocks pinned now.
        pinned: usize,
        /// Blocks the call would pin.
        requested: usize,
        /// The budget.
        budget: usize,
    },
    /// `unpin` of a prefix that is not pinned.
    #[error("prefix is not pinned")]
    NotPinned,
    /// The operation needs an idle cache, and blocks are in use.
    #[error("{0} blocks are in use")]
    BlocksInUse(usize),
    /// Caller-provided batch buffers are too small: a block-table row needs
    /// `max_blocks` entries and the slot mapping `num_slots` (both reported,
    /// so one retry with these sizes succeeds).
    #[error("buffers too small: the batch needs {max_blocks} blocks per table row and {num_slots} slots")]
    BatchBuffersTooSmall {
        /// Entries the longest block table needs.
        max_blocks: usize,
        /// Slots the mapping needs.
        num_slots: usize,
    },
    /// A storage backend failed or is unavailable (no GPU, no driver, ...).
    #[error("storage: {0}")]
    Storage(String),
    /// Memory for a structure sized by the caller could not be allocated.
    #[error("out of memory: {what} needs {bytes} bytes")]
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
