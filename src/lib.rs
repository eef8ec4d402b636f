//! # mla_cache
//!
//! A paged cache for Multi-head Latent Attention (DeepSeek-V2/V3/R1, Kimi-K2).
//! MLA caches one 576-element latent per token and layer (512 compressed
//! `c_kv` + 64 decoupled RoPE key). This crate provides:
//!
//! - [`BlockManager`]: block allocation, prefix sharing by chained block
//!   hashes, copy-on-write for forked sequences, pinning and eviction;
//!   thread-safe (`Send + Sync`);
//! - [`codec`] and [`store`]: the latent storage formats (`bf16`,
//!   `fp8_ds_mla`, `mxfp6`) and stores on host and GPU memory.
//!
#![warn(missing_docs)]

pub mod codec;
pub mod config;
pub mod error;
pub mod sim;
pub mod store;

pub use config::{CacheConfig, Dtype, EvictionPolicyKind, ModelGeometry};
pub use error::{Error, Result};

/// Index of a physical block, `0..num_blocks`, the same in every layer.
pub type BlockId = u32;
/// A token id.
pub type TokenId = u32;
/// The engine's id for a request (sequence).
pub type RequestId = u64;
