//! Workload replay through the block manager: what the cache does for a
//! serving deployment.
//!
//! ```text
//!   Mooncake trace (JSONL) ──┐
//!                            ├─▶ Vec<TraceRequest> ──▶ simulate(..) ──▶ SimReport
//!   ChatConfig::generate ────┘         arrivals, FIFO queue, decode      (serde)
//!                                      through a real BlockManager
//! ```
//!
//! ```
//! use mla_cache_sim::{simulate, OnMalformed, SimConfig, Trace};
//!
//! let trace = Trace::parse(
//!     "{\"timestamp\": 0, \"input_length\": 2048, \"output_length\": 8, \"hash_ids\": [1, 2, 3, 4]}\n\
//!      {\"timestamp\": 500, \"input_length\": 2048, \"output_length\": 8, \"hash_ids\": [1, 2, 3, 5]}",
//!     OnMalformed::Fail,
//! )?;
//! let report = simulate("example", &trace.requests, &SimConfig::default(), |_, _| {})?;
//! assert_eq!(report.hit_tokens, 3 * 512);
//! assert_eq!(report.token_hit_rate, 1536.0 / 4096.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod belady;
mod cache_model;
mod chat;
mod config;
mod engine;
mod keys;
mod report;
mod rng;
mod trace;
pub mod units;

pub use belady::belady;
pub use cache_model::{cache_only, CacheModelReport};
pub use chat::{generate_mix, generated_workload, ChatConfig};
pub use config::{SimConfig, SimRemoteTier};
pub use engine::simulate;
pub use keys::{BlockKeys, RequestKeys};
pub use report::{Distribution, ManagerCost, SimReport};
pub use trace::{
    OnMalformed, Trace, TraceLineError, TraceRequest, GENERATED_TOKEN_BASE, HASH_BLOCK_TOKENS,
    MAX_HASH_ID,
};

/// The Mooncake FAST'25 synthetic trace (3,993 requests, Apache-2.0; see
/// `data/NOTICE`): the default workload.
pub const MOONCAKE_SYNTHETIC_TRACE: &str =
    include_str!("../../data/mooncake_synthetic_trace.jsonl");
