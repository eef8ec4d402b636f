//! What a simulation replays through: the cache, its lower tiers and the
//! model of time ([`SimConfig`]), read by the replay (`engine.rs`) and by
//! its report (`report.rs`).

use std::time::Duration;

use serde::Serialize;

use mla_cache::tier::remote::{BlockFormat, RemoteBackend, SimRemote};
use mla_cache::tier::{
    redis_backend, BookkeepingOnly, HostTier, RemoteOptions, RemoteTier, TierOptions, TieredCache,
    WritePolicy,
};
use mla_cache::{BlockManager, CacheConfig, Dtype, EvictionPolicyKind, ModelGeometry, Result};

/// The remote tier of a simulation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum SimRemoteTier {
    /// An in-process store holding this many blocks.
    InProcess {
        /// Capacity in blocks.
        blocks: usize,
    },
    /// A Valkey/Redis server or Cluster (see
    /// `RedisRemote::from_spec`; needs feature `remote-redis`).
    Redis {
        /// The server's URL, or `cluster:` and node URLs.
        #[serde(serialize_with = "redacted")]
        spec: String,
    },
}

/// Serializes a server spec without its passwords.
fn redacted<S: serde::Serializer>(spec: &str, s: S) -> std::result::Result<S::Ok, S::Error> {
    let parts: Vec<String> = spec
        .split(',')
        .map(|url| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let creds = &url[scheme + 3..at];
                let user = creds.split(':').next().unwrap_or("");
                format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
            }
            _ => url.to_string(),
        })
        .collect();
    s.collect_str(&parts.join(","))
}

/// Nanoseconds per millisecond (trace timestamps are in ms).
pub(super) const NS_PER_MS: u64 = 1_000_000;

/// What to simulate: the cache and the model of time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    /// Model preset name (see [`ModelGeometry::preset`]).
    pub model: String,
    /// Storage format (decides bytes, not hits).
    #[serde(serialize_with = "by_name")]
    pub dtype: Dtype,
    /// Blocks in the cache.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Eviction policy.
    #[serde(serialize_with = "by_name")]
    pub eviction: EvictionPolicyKind,
    /// Time per output token, in nanoseconds.
    pub tpot_ns: u64,
    /// Prefill time per uncached prompt token, in nanoseconds (0: instantaneous).
    pub prefill_ns_per_token: u64,
    /// Seed of the manager's block hash chain (hits do not depend on it).
    pub hash_seed: u64,
    /// Host-memory tier (L2) capacity in blocks; 0 for none.
    pub host_blocks: usize,
    /// The remote tier (L3), if any.
    pub remote: Option<SimRemoteTier>,
    /// When blocks are copied to the lower tiers.
    #[serde(serialize_with = "by_name")]
    pub write_policy: WritePolicy,
}

impl Default for SimConfig {
    /// DeepSeek-V3 in fp8_ds_mla, 16,384 blocks of 64, the default eviction
    /// policy (ARC), 40 ms per output token, instantaneous prefill.
    fn default() -> Self {
        Self {
            model: ModelGeometry::DEEPSEEK_V3.name.to_string(),
            dtype: Dtype::Fp8DsMla,
            num_blocks: 16_384,
            block_size: CacheConfig::DEFAULT_BLOCK_SIZE,
            eviction: EvictionPolicyKind::default(),
            tpot_ns: 40 * NS_PER_MS,
            prefill_ns_per_token: 0,
            hash_seed: 0,
            host_blocks: 0,
            remote: None,
            write_policy: WritePolicy::WriteThrough,
        }
    }
}

impl SimConfig {
    /// The manager's configuration (prefix caching on, hit capped at the
    /// last prompt token).
    pub fn cache_config(&self) -> Result<CacheConfig> {
        let model = ModelGeometry::preset(&self.model)?;
        let mut config = CacheConfig::for_model(&model, self.num_blocks, self.dtype);
        config.block_size = self.block_size;
        config.eviction = self.eviction;
        config.hash_seed = Some(self.hash_seed);
        config.validate()?;
        Ok(config)
    }

    /// The tiered cache this configuration replays through.
    pub(super) fn tiered_cache(&self, cache: CacheConfig) -> Result<TieredCache> {
        let host = (self.host_blocks > 0)
            .then(|| HostTier::new(0, self.host_blocks))
            .transpose()?;
        let remote = match &self.remote {
            None => None,
            Some(tier) => {
                let (backend, budget): (Box<dyn RemoteBackend>, Duration) = match tier {
                    SimRemoteTier::InProcess { blocks } => {
                        (Box::new(SimRemote::new(*blocks)), Duration::from_secs(60))
                    }
                    SimRemoteTier::Redis { spec } => (redis_backend(spec)?, Duration::from_secs(1)),
                };
                let options = RemoteOptions {
                    namespace: format!("simulate:{}", self.model),
                    lookup_budget: budget,
                    ..RemoteOptions::default()
                };
                Some(RemoteTier::new(
                    backend,
                    BlockFormat::new(&cache, 0),
                    options,
                )?)
            }
        };
        let manager = BlockManager::new(cache)?;
        let tiers = TierOptions {
            write_policy: self.write_policy,
            host,
            remote,
            ..TierOptions::default()
        };
        TieredCache::new(manager, std::sync::Arc::new(BookkeepingOnly), tiers)
    }
}

/// Serializes a configuration enum by its CLI name.
fn by_name<T: std::fmt::Display, S: serde::Serializer>(
    value: &T,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(value)
}
