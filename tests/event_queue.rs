//! The in-process event queue is bounded: past `max_pending_events`
//! undrained events, new ones are dropped and counted.

use mla_cache::{AdmitOptions, BlockManager, CacheConfig, CacheEvent, PrefixCache};
use proptest::prelude::*;

fn manager(cap: usize) -> BlockManager {
    BlockManager::new(CacheConfig {
        block_size: 4,
        enable_events: true,
        max_pending_events: cap,
        hash_seed: Some(1),
        ..CacheConfig::new(16)
    })
    .unwrap()
}

/// Admits and frees `n` distinct 2-block prompts (each stores one run, and
/// evicts once the 16 blocks are used).
fn churn(m: &BlockManager, first: u64, n: u64) {
    for id in first..first + n {
        let prompt: Vec<u32> = (0..9).map(|t| t + 100 * id as u32).collect();
        m.admit(id, &prompt, &AdmitOptions::default()).unwrap();
        m.free(id).unwrap();
    }
}

#[test]
fn the_default_cap_is_documented_and_positive() {
    let c = CacheConfig::new(8);
    assert_eq!(
        c.max_pending_events,
        CacheConfig::DEFAULT_MAX_PENDING_EVENTS
    );
    assert!(BlockManager::new(CacheConfig {
        max_pending_events: 0,
        ..c
    })
    .is_err());
}

#[test]
fn the_queue_keeps_the_oldest_events_and_counts_the_rest() {
    let unbounded = manager(usize::MAX);
    churn(&unbounded, 0, 30);
    let all = unbounded.take_events();
    assert!(all.len() > 10);
    assert_eq!(unbounded.stats().events_dropped, 0);

    let capped = manager(10);
    churn(&capped, 0, 30);
    let kept = capped.take_events();
    assert_eq!(kept, all[..10]);
    assert_eq!(capped.stats().events_dropped, (all.len() - 10) as u64);
    // Draining makes room again; the counter only grows.
    churn(&capped, 30, 1);
    assert!(!capped.take_events().is_empty());
    assert_eq!(capped.stats().events_dropped, (all.len() - 10) as u64);
}

#[test]
fn a_prefix_cache_is_bounded_too() {
    let cache = PrefixCache::new(CacheConfig {
        block_size: 4,
        enable_events: true,
        max_pending_events: 1,
        ..CacheConfig::new(16)
    })
    .unwrap();
    cache.reset().unwrap();
    cache.reset().unwrap();
    assert_eq!(cache.take_events(), [CacheEvent::AllBlocksCleared]);
    assert_eq!(cache.stats().events_dropped, 1);
}

proptest! {
    #[test]
    fn kept_plus_dropped_is_every_event(cap in 1usize..40, n in 1u64..40) {
        let reference = manager(usize::MAX);
        churn(&reference, 0, n);
        let total = reference.take_events().len();
        let m = manager(cap);
        churn(&m, 0, n);
        let kept = m.take_events().len();
        prop_assert_eq!(kept, total.min(cap));
        prop_assert_eq!(kept as u64 + m.stats().events_dropped, total as u64);
    }
}
