//! Shared by the tier tests: a small device tier with real latents.

#![allow(dead_code)]

use std::sync::Arc;

use mla_cache::store::{HostStore, LatentStore};
use mla_cache::tier::{HostTier, RemoteTier, TierOptions, TieredCache, WritePolicy};
use mla_cache::{
    AdmitOptions, BlockId, BlockManager, CacheConfig, Dtype, IndexerGeometry, RequestId, TokenId,
};

pub const BLOCK: usize = 16;

/// 3 layers, blocks of 16 tokens, a fixed hash seed (as nodes sharing a remote tier need).
pub fn config(dtype: Dtype, num_blocks: usize) -> CacheConfig {
    CacheConfig {
        num_layers: 3,
        block_size: BLOCK,
        dtype,
        hash_seed: Some(42),
        ..CacheConfig::new(num_blocks)
    }
}

/// [`config`] with DeepSeek-V3.2's indexer keys beside the latents.
pub fn config_v32(dtype: Dtype, num_blocks: usize) -> CacheConfig {
    CacheConfig {
        indexer: Some(IndexerGeometry::DEEPSEEK_V32),
        ..config(dtype, num_blocks)
    }
}

/// A device tier of `num_blocks` blocks with the given lower tiers.
pub fn cache(
    dtype: Dtype,
    num_blocks: usize,
    policy: WritePolicy,
    host_blocks: Option<usize>,
    remote: Option<RemoteTier>,
) -> (TieredCache, Arc<HostStore>) {
    cache_with(config(dtype, num_blocks), policy, host_blocks, remote)
}

/// A device tier for `config` with the given lower tiers.
pub fn cache_with(
    config: CacheConfig,
    policy: WritePolicy,
    host_blocks: Option<usize>,
    remote: Option<RemoteTier>,
) -> (TieredCache, Arc<HostStore>) {
    let store = Arc::new(HostStore::new(&config).unwrap());
    let host = host_blocks.map(|n| HostTier::new(store.block_bytes(), n).unwrap());
    let manager = BlockManager::new(config).unwrap();
    let tiers = TierOptions {
        write_policy: policy,
        host,
        remote,
        ..TierOptions::default()
    };
    (
        TieredCache::new(manager, store.clone(), tiers).unwrap(),
        store,
    )
}

/// `n` tokens of a prompt named `seed`.
pub fn prompt(seed: u32, n: usize) -> Vec<TokenId> {
    (0..n as u32).map(|i| seed * 100_000 + i).collect()
}

/// Deterministic latents for token `t` of prompt `seed`: `(c_kv, k_pe)`.
fn latents(seed: u32, tokens: usize) -> (Vec<f32>, Vec<f32>) {
    let v = |t: usize, j: usize, salt: u32| {
        let x = (seed.wrapping_mul(2654435761) ^ (t as u32 * 7919 + j as u32 * 31 + salt)) % 2001;
        (x as f32 - 1000.0) / 250.0
    };
    let c: Vec<f32> = (0..tokens * 512).map(|i| v(i / 512, i % 512, 1)).collect();
    let k: Vec<f32> = (0..tokens * 64).map(|i| v(i / 64, i % 64, 2)).collect();
    (c, k)
}

/// Deterministic indexer keys for `tokens` tokens of prompt `seed`.
fn indexer_keys(seed: u32, tokens: usize, head_dim: usize) -> Vec<f32> {
    (0..tokens * head_dim)
        .map(|i| {
            let x = (seed.wrapping_mul(40503) ^ (i as u32).wrapping_mul(2246822519)) % 4001;
            (x as f32 - 2000.0) / 300.0
        })
        .collect()
}

/// Writes prompt `seed`'s latents (and indexer keys, if the store keeps
/// them) for `tokens` tokens of request `id` into every layer, as the
/// engine's prefill would.
pub fn write_prefill(
    cache: &TieredCache,
    store: &HostStore,
    id: RequestId,
    seed: u32,
    tokens: usize,
) {
    let slots = cache.manager().slot_mapping(id, 0..tokens).unwrap();
    let (c, k) = latents(seed, tokens);
    let keys = store
        .config()
        .indexer
        .map(|i| indexer_keys(seed, tokens, i.head_dim));
    for layer in 0..store.config().num_layers {
        store.write(layer, &c[..], &k[..], &slots).unwrap();
        if let Some(keys) = &keys {
            store.write_indexer(layer, &keys[..], &slots).unwrap();
        }
    }
}

/// Admits prompt `seed` (chunked), writes what was not served from a
/// tier, commits it; returns the block table.
pub fn run_prefill(
    cache: &TieredCache,
    store: &HostStore,
    id: RequestId,
    seed: u32,
    tokens: usize,
) -> Vec<BlockId> {
    let p = prompt(seed, tokens);
    let opts = AdmitOptions {
        chunked_prefill: true,
        ..AdmitOptions::default()
    };
    let a = cache.admit(id, &p, &opts).unwrap();
    write_prefill(cache, store, id, seed, tokens);
    cache.commit(id, tokens).unwrap();
    a.block_ids
}

/// The stored bytes of `blocks`.
pub fn block_bytes(store: &HostStore, blocks: &[BlockId]) -> Vec<Vec<u8>> {
    blocks
        .iter()
        .map(|&b| {
            let mut out = vec![0u8; store.block_bytes()];
            store.read_block(b, &mut out).unwrap();
            out
        })
        .collect()
}

/// The stored indexer codes and scales of `blocks` in every layer.
pub fn indexer_parts(store: &HostStore, blocks: &[BlockId]) -> Vec<(Vec<u8>, Vec<f32>)> {
    let c = store.config();
    let head_dim = c.indexer.expect("an indexer").head_dim;
    let tokens = blocks.len() * c.block_size;
    (0..c.num_layers)
        .map(|layer| {
            let mut codes = vec![0u8; tokens * head_dim];
            let mut scales = vec![0f32; tokens];
            store
                .gather_indexer_quantized(layer, blocks, &mut codes, &mut scales)
                .unwrap();
            (codes, scales)
        })
        .collect()
}
