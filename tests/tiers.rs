//! The host tier and the tiered cache with an in-process remote tier:
//! byte-exact round trips in every format, each write policy, sharing
//! between caches, rejected values and a slow remote store.

mod tier_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mla_cache::tier::remote::{BlockFormat, RemoteBackend, RemoteError, SimRemote};
use mla_cache::tier::{RemoteOptions, RemoteTier, TierHits, WritePolicy};
use mla_cache::{AdmitOptions, Dtype, ExtraKeys};
use tier_common::*;

const PROMPT: usize = 3 * BLOCK + 1; // 3 full blocks, all loadable under the last-token cap

/// Evicts everything from an 8-block device tier by running an unrelated
/// 8-block request.
fn flush_device(
    cache: &mla_cache::tier::TieredCache,
    store: &mla_cache::store::HostStore,
    id: u64,
) {
    run_prefill(cache, store, id, 999 + id as u32, 8 * BLOCK);
    cache.free(id).unwrap();
}

#[test]
fn blocks_round_trip_device_host_device_byte_for_byte_in_every_format() {
    for dtype in Dtype::ALL {
        let (cache, store) = cache(dtype, 8, WritePolicy::WriteThrough, Some(16), None);
        let table = run_prefill(&cache, &store, 1, 7, PROMPT);
        let original = block_bytes(&store, &table[..3]);
        assert!(
            original.iter().all(|b| b.iter().any(|&x| x != 0)),
            "{dtype}: latents written"
        );
        assert_eq!(
            cache.host().unwrap().stats().blocks,
            3,
            "{dtype}: written through on commit"
        );
        cache.free(1).unwrap();
        flush_device(&cache, &store, 2);
        assert_eq!(
            cache
                .manager()
                .match_prefix(&prompt(7, PROMPT), &ExtraKeys::default())
                .num_tokens,
            0
        );

        let hits = cache.lookup(&prompt(7, PROMPT), &ExtraKeys::default());
        assert_eq!(
            hits,
            TierHits {
                device_tokens: 0,
                host_tokens: 3 * BLOCK,
                remote_tokens: 0
            }
        );
        let a = cache
            .admit(3, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap();
        assert_eq!(a.hits.host_tokens, 3 * BLOCK, "{dtype}");
        assert_eq!(a.num_cached_tokens, 3 * BLOCK);
        assert_eq!(
            block_bytes(&store, &a.block_ids[..3]),
            original,
            "{dtype}: loaded bytes differ"
        );
        // Loaded blocks are committed: a later request hits them in the device tier.
        let again = cache
            .admit(4, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap();
        assert_eq!(again.hits.device_tokens, 3 * BLOCK);
        cache.manager().check_invariants().unwrap();
    }
}

#[test]
fn write_back_copies_blocks_only_when_evicted_and_before_reuse() {
    let (cache, store) = cache(Dtype::Fp8DsMla, 8, WritePolicy::WriteBack, Some(16), None);
    let table = run_prefill(&cache, &store, 1, 7, PROMPT);
    let original = block_bytes(&store, &table[..3]);
    cache.free(1).unwrap();
    assert_eq!(
        cache.host().unwrap().stats().blocks,
        0,
        "nothing copied before eviction"
    );
    // The flushing request's admission evicts the 3 blocks, then overwrites
    // them with its own latents: the copies must hold the old bytes.
    flush_device(&cache, &store, 2);
    assert_eq!(cache.host().unwrap().stats().blocks, 3);
    assert_eq!(cache.stats().written_back, 3);
    let a = cache
        .admit(3, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(a.hits.host_tokens, 3 * BLOCK);
    assert_eq!(block_bytes(&store, &a.block_ids[..3]), original);
}

#[test]
fn write_through_selective_copies_blocks_hit_often_enough() {
    let (cache, store) = cache(
        Dtype::Bf16,
        8,
        WritePolicy::WriteThroughSelective { min_hits: 2 },
        Some(16),
        None,
    );
    run_prefill(&cache, &store, 1, 7, PROMPT);
    assert_eq!(
        cache.host().unwrap().stats().blocks,
        0,
        "computed, never hit"
    );
    let hit = cache
        .admit(2, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(hit.hits.device_tokens, 3 * BLOCK);
    assert_eq!(cache.host().unwrap().stats().blocks, 0, "one hit");
    cache
        .admit(3, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(cache.host().unwrap().stats().blocks, 3, "two hits");
    assert_eq!(cache.stats().written_through, 3);
}

#[test]
fn unchunked_requests_copy_blocks_down_only_once_the_engine_wrote_them() {
    let (cache, store) = cache(
        Dtype::Fp8DsMla,
        8,
        WritePolicy::WriteThrough,
        Some(16),
        None,
    );
    let p = prompt(7, PROMPT);
    let a = cache.admit(1, &p, &AdmitOptions::decode_slots(16)).unwrap();
    assert_eq!(
        cache.host().unwrap().stats().blocks,
        0,
        "the prefill has not run yet"
    );
    write_prefill(&cache, &store, 1, 7, PROMPT);
    let original = block_bytes(&store, &a.block_ids[..3]);
    cache.append(1, &[5]).unwrap();
    assert_eq!(
        cache.host().unwrap().stats().blocks,
        3,
        "the first decode step follows the prefill"
    );
    cache.free(1).unwrap();
    flush_device(&cache, &store, 2);
    let b = cache.admit(3, &p, &AdmitOptions::default()).unwrap();
    assert_eq!(b.hits.host_tokens, 3 * BLOCK);
    assert_eq!(block_bytes(&store, &b.block_ids[..3]), original);
}

fn remote(store: SimRemote, budget: Duration) -> RemoteTier {
    remote_with(Box::new(store), budget)
}

fn remote_with(backend: Box<dyn RemoteBackend>, budget: Duration) -> RemoteTier {
    remote_for(&config(Dtype::Fp8DsMla, 8), backend, budget)
}

fn remote_for(
    c: &mla_cache::CacheConfig,
    backend: Box<dyn RemoteBackend>,
    budget: Duration,
) -> RemoteTier {
    let format = BlockFormat::new(c, c.bytes_per_block());
    let options = RemoteOptions {
        namespace: "test".into(),
        lookup_budget: budget,
        queue_depth: 16,
        ..RemoteOptions::default()
    };
    RemoteTier::new(backend, format, options).unwrap()
}

#[test]
fn two_caches_share_blocks_through_one_remote_store() {
    let shared = SimRemote::new(1000);
    let (a, store_a) = cache(
        Dtype::Fp8DsMla,
        8,
        WritePolicy::WriteThrough,
        None,
        Some(remote(shared.clone(), Duration::from_secs(10))),
    );
    let (b, store_b) = cache(
        Dtype::Fp8DsMla,
        8,
        WritePolicy::WriteThrough,
        Some(4),
        Some(remote(shared.clone(), Duration::from_secs(10))),
    );
    let table = run_prefill(&a, &store_a, 1, 7, PROMPT);
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
    assert_eq!(shared.len(), 3);
    let hits = b
        .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(
        hits.hits,
        TierHits {
            device_tokens: 0,
            host_tokens: 0,
            remote_tokens: 3 * BLOCK
        }
    );
    assert_eq!(
        block_bytes(&store_b, &hits.block_ids[..3]),
        block_bytes(&store_a, &table[..3])
    );
    assert_eq!(
        b.host().unwrap().stats().blocks,
        3,
        "remote hits are kept in host memory too"
    );
    assert_eq!(b.remote().unwrap().stats().hit_blocks, 3);
}

/// A store whose values can be damaged or delayed.
struct Faulty {
    inner: SimRemote,
    damage: fn(&mut Vec<u8>),
    slow: Arc<AtomicBool>,
}

impl RemoteBackend for Faulty {
    fn get(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        if self.slow.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_secs(2));
        }
        let mut values = self.inner.get(keys)?;
        for v in values.iter_mut().flatten() {
            (self.damage)(v);
        }
        Ok(values)
    }

    fn exists(&mut self, keys: &[Vec<u8>]) -> Result<Vec<bool>, RemoteError> {
        self.inner.exists(keys)
    }

    fn put_if_absent(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), RemoteError> {
        self.inner.put_if_absent(entries)
    }
}

#[test]
fn corrupted_or_truncated_values_are_rejected_never_loaded() {
    let damages: [fn(&mut Vec<u8>); 3] = [
        |v| *v.last_mut().unwrap() ^= 1,
        |v| v.truncate(v.len() / 2),
        |v| v[30] ^= 0x80,
    ];
    for damage in damages {
        let shared = SimRemote::new(100);
        let (a, store_a) = cache(
            Dtype::Fp8DsMla,
            8,
            WritePolicy::WriteThrough,
            None,
            Some(remote(shared.clone(), Duration::from_secs(10))),
        );
        run_prefill(&a, &store_a, 1, 7, PROMPT);
        assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
        let faulty = Faulty {
            inner: shared,
            damage,
            slow: Arc::default(),
        };
        let (b, _) = cache(
            Dtype::Fp8DsMla,
            8,
            WritePolicy::WriteThrough,
            None,
            Some(remote_with(Box::new(faulty), Duration::from_secs(10))),
        );
        let hit = b
            .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap();
        assert_eq!(hit.num_cached_tokens, 0);
        let stats = b.remote().unwrap().stats();
        assert_eq!((stats.rejected, stats.hit_blocks), (1, 0));
    }
}

/// The admission must not wait for a slow store beyond its budget. The
/// bound asserted is 10x the budget, generous for a loaded machine; the
/// store takes 2 s, 40x the budget.
#[test]
fn a_slow_remote_store_costs_misses_not_a_stalled_admission() {
    let budget = Duration::from_millis(50);
    let slow = Arc::new(AtomicBool::new(true));
    let faulty = Faulty {
        inner: SimRemote::new(100),
        damage: |_| {},
        slow: slow.clone(),
    };
    let (cache, _) = cache(
        Dtype::Fp8DsMla,
        8,
        WritePolicy::WriteThrough,
        None,
        Some(remote_with(Box::new(faulty), budget)),
    );
    for id in 0..3 {
        let start = Instant::now();
        let a = cache
            .admit(id, &prompt(id as u32, PROMPT), &AdmitOptions::default())
            .unwrap();
        assert!(
            start.elapsed() < budget * 10,
            "admission took {:?}",
            start.elapsed()
        );
        assert_eq!(a.num_cached_tokens, 0);
        cache.free(id).unwrap();
    }
    assert!(cache.remote().unwrap().stats().timeouts >= 1);
    slow.store(false, Ordering::SeqCst);
}

#[test]
fn v32_blocks_keep_their_indexer_keys_through_the_host_and_remote_tiers() {
    let c = config_v32(Dtype::Fp8DsMla, 8);
    let shared = SimRemote::new(100);
    let remote = remote_for(&c, Box::new(shared.clone()), Duration::from_secs(10));
    let (a, store_a) = cache_with(c.clone(), WritePolicy::WriteThrough, Some(16), Some(remote));
    assert_eq!(
        store_a.block_bytes(),
        3 * BLOCK * (656 + 132),
        "a block is its latents and its indexer keys"
    );
    let table = run_prefill(&a, &store_a, 1, 7, PROMPT);
    let original = block_bytes(&store_a, &table[..3]);
    let keys = indexer_parts(&store_a, &table[..3]);
    assert!(keys.iter().all(|(codes, _)| codes.iter().any(|&x| x != 0)));
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));

    // Through the host tier: evicted from the device, loaded back.
    a.free(1).unwrap();
    flush_device(&a, &store_a, 2);
    let back = a
        .admit(3, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(back.hits.host_tokens, 3 * BLOCK);
    assert_eq!(block_bytes(&store_a, &back.block_ids[..3]), original);
    assert_eq!(indexer_parts(&store_a, &back.block_ids[..3]), keys);

    // Through the remote tier, into another cache.
    let remote = remote_for(&c, Box::new(shared), Duration::from_secs(10));
    let (b, store_b) = cache_with(c, WritePolicy::WriteThrough, None, Some(remote));
    let hit = b
        .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(hit.hits.remote_tokens, 3 * BLOCK);
    assert_eq!(block_bytes(&store_b, &hit.block_ids[..3]), original);
    assert_eq!(indexer_parts(&store_b, &hit.block_ids[..3]), keys);
}

#[test]
fn a_remote_block_whose_indexer_part_is_damaged_or_missing_is_a_miss() {
    let c = config_v32(Dtype::Fp8DsMla, 8);
    let indexer_part = c.num_layers * c.block_size * 132;
    // The payload ends with the indexer part of every layer.
    let damages: [fn(&mut Vec<u8>); 3] = [
        |v| *v.last_mut().unwrap() ^= 0x40,
        |v| {
            let at = v.len() - 3 * BLOCK * 132 + 5;
            v[at] ^= 1;
        },
        |v| v.truncate(v.len() - 3 * BLOCK * 132),
    ];
    assert_eq!(indexer_part, 3 * BLOCK * 132);
    for damage in damages {
        let shared = SimRemote::new(100);
        let remote = remote_for(&c, Box::new(shared.clone()), Duration::from_secs(10));
        let (a, store_a) = cache_with(c.clone(), WritePolicy::WriteThrough, None, Some(remote));
        run_prefill(&a, &store_a, 1, 7, PROMPT);
        assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
        let faulty = Faulty {
            inner: shared,
            damage,
            slow: Arc::default(),
        };
        let remote = remote_for(&c, Box::new(faulty), Duration::from_secs(10));
        let (b, _) = cache_with(c.clone(), WritePolicy::WriteThrough, None, Some(remote));
        let hit = b
            .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap();
        assert_eq!(hit.num_cached_tokens, 0, "a half block was loaded");
        let stats = b.remote().unwrap().stats();
        assert_eq!((stats.rejected, stats.hit_blocks), (1, 0));
    }
}

#[test]
fn a_cache_without_the_indexer_never_reads_v32_blocks() {
    let shared = SimRemote::new(100);
    let v32 = config_v32(Dtype::Fp8DsMla, 8);
    let remote = remote_for(&v32, Box::new(shared.clone()), Duration::from_secs(10));
    let (a, store_a) = cache_with(v32, WritePolicy::WriteThrough, None, Some(remote));
    run_prefill(&a, &store_a, 1, 7, PROMPT);
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
    let plain = config(Dtype::Fp8DsMla, 8);
    let remote = remote_for(&plain, Box::new(shared), Duration::from_secs(10));
    let (b, _) = cache_with(plain, WritePolicy::WriteThrough, None, Some(remote));
    let hit = b
        .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(hit.num_cached_tokens, 0);
}
