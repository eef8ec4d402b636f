//! `RequestCache` drives `BlockManager` and `TieredCache` alike, and a
//! caller's fill that writes another length than asked is refused without
//! changing anything.

use std::sync::Arc;

use mla_cache::tier::{BookkeepingOnly, HostTier, TierOptions, TieredCache};
use mla_cache::{
    AdmitOptions, Admitted, BlockManager, CacheConfig, Error, RequestCache, Result, TokenId,
};

const BLOCK: usize = 16;

fn manager() -> BlockManager {
    let mut config = CacheConfig::new(32);
    config.block_size = BLOCK;
    config.hash_seed = Some(9);
    BlockManager::new(config).unwrap()
}

fn tiered() -> TieredCache {
    let options = TierOptions {
        host: Some(HostTier::new(0, 64).unwrap()),
        ..TierOptions::default()
    };
    TieredCache::new(manager(), Arc::new(BookkeepingOnly), options).unwrap()
}

/// Serves a request through every call of the trait; returns the block
/// counts and cached tokens its admissions saw.
fn serve(cache: &impl RequestCache) -> Result<Vec<(usize, usize)>> {
    let prompt: Vec<TokenId> = (0..40).collect();
    let opts = AdmitOptions::default();
    let mut seen = Vec::new();
    let a = cache.admit(1, &prompt, &opts)?;
    seen.push((a.block_ids().len(), a.num_cached_tokens()));
    cache.append(1, &[7, 8])?;
    cache.commit(1, 42)?;
    cache.fork(1, 2)?;
    cache.free(2)?;
    cache.free(1)?;
    let b = cache.admit_owned(3, prompt.clone(), &opts)?;
    seen.push((b.block_ids().len(), b.num_cached_tokens()));
    cache.free(3)?;
    let c = cache.admit_filled(
        4,
        prompt.len(),
        &mut |out, upto| {
            let from = out.len();
            out.extend_from_slice(&prompt[from..upto]);
            Ok(())
        },
        &opts,
    )?;
    seen.push((c.block_ids().len(), c.num_cached_tokens()));
    cache.free(4)?;
    cache.manager().check_invariants().unwrap();
    Ok(seen)
}

#[test]
fn both_caches_serve_the_same_calls_alike() {
    let direct = serve(&manager()).unwrap();
    // 40 tokens: 3 blocks; the second and third admissions hit the two full ones.
    assert_eq!(direct, vec![(3, 0), (3, 32), (3, 32)]);
    assert_eq!(serve(&tiered()).unwrap(), direct);
}

/// Admits through `admit_filled` with a fill that appends `extra` tokens
/// more (or fewer, when negative) than asked.
fn admit_misfilled(cache: &impl RequestCache, extra: isize) -> Result<()> {
    let prompt: Vec<TokenId> = (0..200).collect();
    let len = 40;
    cache
        .admit_filled(
            1,
            len,
            &mut |out, upto| {
                let to = (upto as isize + extra).clamp(out.len() as isize, 200) as usize;
                let from = out.len();
                out.extend_from_slice(&prompt[from..to]);
                Ok(())
            },
            &AdmitOptions::default(),
        )
        .map(|_| ())
}

fn refused_unchanged(cache: &impl RequestCache) {
    let free = cache.manager().num_free_blocks();
    for extra in [-1, 1, 100] {
        let err = admit_misfilled(cache, extra).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{extra}: {err}");
        assert_eq!(cache.manager().num_free_blocks(), free);
        assert!(cache.manager().num_tokens(1).is_err(), "nothing admitted");
        cache.manager().check_invariants().unwrap();
    }
    // A right fill still admits.
    admit_misfilled(cache, 0).unwrap();
}

#[test]
fn a_fill_of_another_length_is_refused_and_changes_nothing() {
    refused_unchanged(&manager());
    refused_unchanged(&tiered());
    let mut config = CacheConfig::new(32);
    config.block_size = BLOCK;
    config.enable_prefix_caching = false;
    refused_unchanged(&BlockManager::new(config).unwrap());
}
