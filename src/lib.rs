//! # mla_cache
//!
//! A paged cache for Multi-head Latent Attention (DeepSeek-V2/V3/R1, Kimi-K2).
//! MLA caches one 576-element latent per token and layer (512 compressed
//! `c_kv` + 64 decoupled RoPE key). This crate provides:
//!
//! - [`BlockManager`]: block allocation, prefix sharing by chained block
//!   hashes, copy-on-write for forked sequences, pinning and eviction;
//!   thread-safe (`Send + Sync`);
//! - [`PrefixCache`]: the same prefix cache over block ids the caller
//!   allocates (SGLang's model), which `BlockManager` is built on;
//! - [`codec`] and [`store`]: the latent storage formats (`bf16`,
//!   `fp8_ds_mla`, `mxfp6`) and stores on host and GPU memory;
//! - [`tier`]: a host-memory tier and a remote tier shared by a fleet
//!   (Valkey/Redis with feature `remote-redis`) below the device cache.
//!
//! ```
//! use mla_cache::{AdmitOptions, BlockManager, CacheConfig, Dtype};
//!
//! let config = CacheConfig::preset("deepseek-v3", 1024, Dtype::Fp8DsMla)?;
//! assert_eq!(config.bytes_per_token(), 61 * 656);
//! let manager = BlockManager::new(config)?;
//!
//! // A 200-token prompt with room for 56 generated tokens: 4 blocks of 64.
//! let prompt: Vec<u32> = (0..200).collect();
//! let a = manager.admit(1, &prompt, &AdmitOptions::decode_slots(56))?;
//! assert_eq!(a.block_ids.len(), 4);
//! assert_eq!(a.num_cached_tokens, 0);
//!
//! // A second request with the same prompt reuses its 3 full blocks.
//! let b = manager.admit(2, &prompt, &AdmitOptions::default())?;
//! assert_eq!(b.num_cached_tokens, 192);
//! assert_eq!(b.block_ids[..3], a.block_ids[..3]);
//!
//! // Slot numbers for the engine's attention kernels.
//! let slots = manager.slot_mapping(1, 0..2)?;
//! assert_eq!(slots[0], a.block_ids[0] as i64 * 64);
//!
//! manager.free(1)?;
//! manager.free(2)?;
//! assert_eq!(manager.num_free_blocks(), 1024);
//! # Ok::<(), mla_cache::Error>(())
//! ```

#![warn(missing_docs)]

mod alloc;
pub mod codec;
pub mod config;
mod engine_hash;
pub mod error;
mod events;
mod hash;
mod id_list;
mod ids;
mod index;
mod manager;
mod policy;
mod prefix_cache;
pub mod publish;
mod request_cache;
mod stats;
pub mod store;
mod sync;
pub mod tier;
pub mod vllm_rules;

pub use config::{
    BlockHashKind, CacheConfig, Dtype, EvictionPolicyKind, IndexerGeometry, ModelGeometry,
};
pub use error::{Error, Result};
pub use events::CacheEvent;
pub use hash::{BlockHash, ExtraKeys, MultiModalKey};
pub use ids::{BlockId, RequestId, TokenId};
pub use manager::{
    Admission, AdmitCheck, AdmitOptions, AppendOutcome, BatchAppendOutcome, BlockCopy,
    BlockManager, TableSizes,
};
pub use policy::{EvictionPolicy, Retention};
pub use prefix_cache::{fill_step, Insertion, PrefixCache, PrefixMatch};
pub use request_cache::{Admitted, RequestCache};
pub use stats::CacheStats;

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The Rust guide's examples (docs/rust.md), compiled and run as doc tests.
#[doc = include_str!("../docs/rust.md")]
#[cfg(doctest)]
pub struct RustGuideDoctests;
