//! Cache tiers below the device: host memory (L2) and a remote store
//! shared by a fleet (L3).
//!
//! ```text
//!   L1  device store   BlockManager + LatentStore      ~1M tokens per GPU
//!   L2  host memory    HostTier (LRU, whole blocks)    10-100x more
//!   L3  remote         RemoteTier -> Valkey/Redis      shared by every node
//! ```
//!
//! Every tier keys a block by its [`BlockHash`](crate::BlockHash), which
//! names the whole prefix, adapter and salt, and keeps it in its stored
//! format, all layers together ([`BlockTransfer`]). [`TieredCache`] ties
//! them together: admission serves the device tier's hit, continues it from
//! host memory then from the remote tier, and the [`WritePolicy`] decides
//! when blocks go down.

mod cache;
mod directory;
mod event_log;
mod host;
pub mod remote;
mod settings;
mod transfer;
mod write_policy;

pub use cache::{TierHits, TierOptions, TierStats, TieredAdmission, TieredCache};
pub use host::{HostStored, HostTier, HostTierStats};
pub use remote::{RemoteOptions, RemoteTier};
pub use settings::{check_same_blocks, redis_backend, TierSettings};
pub use transfer::{BlockTransfer, BookkeepingOnly};
pub use write_policy::WritePolicy;
