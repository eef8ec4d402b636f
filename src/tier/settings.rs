//! A [`TieredCache`] built from plain settings (a memory size, a URL, a
//! policy name), as the C and Python bindings take them.

use std::sync::Arc;

use super::cache::{TierOptions, TieredCache};
use super::host::HostTier;
use super::remote::{BlockFormat, RemoteBackend, RemoteOptions, RemoteTier};
use super::transfer::BlockTransfer;
use super::write_policy::WritePolicy;
use crate::config::CacheConfig;
use crate::error::{Error, Result};
use crate::manager::BlockManager;
use crate::store::Stream;

/// The lower tiers of a cache, described by value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierSettings {
    /// Bytes of host memory for the host tier (L2), rounded down to whole
    /// blocks; 0 for none.
    pub host_bytes: u64,
    /// The remote tier (L3): a Valkey/Redis URL (`redis://`, `rediss://`
    /// for TLS, `redis://user:password@host:port/` for ACL credentials), or
    /// `cluster:` followed by comma-separated node URLs; `None` for none.
    /// Needs the `remote-redis` feature.
    pub remote: Option<String>,
    /// When device blocks go down.
    pub write_policy: WritePolicy,
    /// Namespace, lookup budget and queue depth of the remote tier.
    pub remote_options: RemoteOptions,
    /// The engine's stream, for block copies out of and into the device.
    pub stream: Stream,
}

impl TierSettings {
    /// A tiered cache over a manager for `config` and its device store
    /// `device`, whose configuration is `store_config` (they must describe
    /// the same blocks).
    pub fn build(
        &self,
        config: CacheConfig,
        store_config: &CacheConfig,
        device: Arc<dyn BlockTransfer>,
    ) -> Result<TieredCache> {
        check_same_blocks(&config, store_config)?;
        let bytes = device.block_bytes();
        let host = match self.host_bytes {
            0 => None,
            n => {
                let blocks = usize::try_from(n / bytes.max(1) as u64).unwrap_or(usize::MAX);
                if blocks == 0 {
                    return Err(Error::InvalidConfig(format!(
                        "a host tier of {n} bytes holds no block of {bytes} bytes"
                    )));
                }
                Some(HostTier::new(bytes, blocks)?)
            }
        };
        let remote = match &self.remote {
            None => None,
            Some(spec) => Some(RemoteTier::new(
                redis_backend(spec)?,
                BlockFormat::new(&config, bytes),
                self.remote_options.clone(),
            )?),
        };
        let manager = BlockManager::new(config)?;
        let tiers = TierOptions {
            write_policy: self.write_policy,
            host,
            remote,
            stream: self.stream,
        };
        TieredCache::new(manager, device, tiers)
    }
}

/// Checks that a manager's configuration and a store's describe the same
/// blocks: count, tokens per block, layers, latent sizes and format.
pub fn check_same_blocks(manager: &CacheConfig, store: &CacheConfig) -> Result<()> {
    let shape = |c: &CacheConfig| {
        (
            c.num_blocks,
            c.block_size,
            c.num_layers,
            c.kv_lora_rank,
            c.rope_dim,
            c.dtype,
        )
    };
    if shape(manager) == shape(store) {
        return Ok(());
    }
    Err(Error::InvalidConfig(format!(
        "the store's blocks differ from the manager's: (num_blocks, block_size, num_layers, \
         kv_lora_rank, rope_dim, dtype) {:?} vs {:?}",
        shape(store),
        shape(manager)
    )))
}

/// A Valkey/Redis backend for `spec` (a URL, or `cluster:` and node URLs),
/// with the default timeouts. Connects lazily.
#[cfg(feature = "remote-redis")]
pub fn redis_backend(spec: &str) -> Result<Box<dyn RemoteBackend>> {
    use super::remote::{RedisOptions, RedisRemote};
    Ok(Box::new(RedisRemote::from_spec(
        spec,
        RedisOptions::default(),
    )?))
}

/// A Valkey/Redis backend: unavailable in this build.
#[cfg(not(feature = "remote-redis"))]
pub fn redis_backend(_spec: &str) -> Result<Box<dyn RemoteBackend>> {
    Err(Error::InvalidConfig(
        "a Valkey/Redis remote tier needs mla_cache built with its remote-redis feature".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HostStore;
    use crate::{AdmitOptions, ExtraKeys};

    fn config() -> CacheConfig {
        CacheConfig {
            num_layers: 2,
            block_size: 4,
            hash_seed: Some(1),
            ..CacheConfig::new(8)
        }
    }

    #[test]
    fn sizes_the_host_tier_in_whole_blocks_and_checks_the_store() {
        let c = config();
        let store = Arc::new(HostStore::new(&c).unwrap());
        let bytes = store.block_bytes() as u64;
        let settings = TierSettings {
            host_bytes: 3 * bytes + bytes / 2,
            ..TierSettings::default()
        };
        let cache = settings.build(c.clone(), &c, store.clone()).unwrap();
        assert_eq!(cache.host().unwrap().stats().capacity_blocks, 3);
        assert!(cache.remote().is_none());
        let tokens: Vec<u32> = (0..9).collect();
        cache.admit(1, &tokens, &AdmitOptions::default()).unwrap();
        cache.free(1).unwrap();
        assert_eq!(
            cache.lookup(&tokens, &ExtraKeys::default()).device_tokens,
            8
        );

        let small = TierSettings {
            host_bytes: bytes - 1,
            ..TierSettings::default()
        };
        assert!(matches!(
            small.build(c.clone(), &c, store.clone()),
            Err(Error::InvalidConfig(_))
        ));
        let other = CacheConfig {
            num_blocks: 9,
            ..c.clone()
        };
        assert!(matches!(
            settings.build(other, &c, store),
            Err(Error::InvalidConfig(_))
        ));
    }
}
