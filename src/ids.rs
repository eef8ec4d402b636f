//! The ids every layer names things by.

/// Index of a physical block, `0..num_blocks`, the same in every layer.
pub type BlockId = u32;
/// A token id.
pub type TokenId = u32;
/// The engine's id for a request (sequence).
pub type RequestId = u64;
