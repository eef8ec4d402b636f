//! Block manager costs: admit+free of a 4,096-token prompt (cold and fully
//! cached), `match_prefix` of 4,096 tokens, a one-token append, a fork; and
//! admit+free of a cached prompt with two threads on one manager; and, per
//! eviction policy, admit+free of prompts that share prefixes in a cache
//! they overflow (hits, stores and evictions in every request), at 4,096
//! and at 12,000 tokens (`manager_long_prompt`, timed in thread CPU).
//!
//! `cargo bench --bench manager`

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
// Each includer uses a part of it.
#[allow(dead_code)]
#[path = "common/policy_workloads.rs"]
mod policy_workloads;
use mla_cache::{
    AdmitOptions, BlockHashKind, BlockManager, CacheConfig, EvictionPolicyKind, ExtraKeys,
};
use policy_workloads::{thread_cpu_time, LONG_PROMPT, POLICY};

const PROMPT: usize = 4096;

fn manager() -> BlockManager {
    let mut c = CacheConfig::new(8192);
    c.hash_seed = Some(1);
    // vLLM's order, as the engine adapters run by default.
    c.eviction = EvictionPolicyKind::Lru;
    BlockManager::new(c).unwrap()
}

fn prompt(base: u32) -> Vec<u32> {
    (base..base + PROMPT as u32).collect()
}

fn single_thread(c: &mut Criterion) {
    let m = manager();
    let mut g = c.benchmark_group("manager");

    let mut next = 0u32;
    g.bench_function("admit_free_4096_cold", |b| {
        b.iter(|| {
            // A new prompt every time: nothing hits, every block is stored.
            next = next.wrapping_add(PROMPT as u32);
            let p = prompt(next);
            m.admit(1, black_box(&p), &AdmitOptions::default()).unwrap();
            m.free(1).unwrap();
        })
    });

    let cached = prompt(u32::MAX - PROMPT as u32);
    m.admit(2, &cached, &AdmitOptions::default()).unwrap();
    m.free(2).unwrap();
    g.bench_function("admit_free_4096_cached", |b| {
        b.iter(|| {
            let a = m
                .admit(1, black_box(&cached), &AdmitOptions::default())
                .unwrap();
            debug_assert_eq!(a.num_cached_tokens, PROMPT - 64);
            m.free(1).unwrap();
        })
    });

    g.bench_function("match_prefix_4096", |b| {
        b.iter(|| black_box(m.match_prefix(black_box(&cached), &ExtraKeys::default())))
    });

    m.admit(3, &cached[..100], &AdmitOptions::default())
        .unwrap();
    let mut appended = 0usize;
    g.bench_function("append_1", |b| {
        b.iter(|| {
            m.append(3, black_box(&[7])).unwrap();
            appended += 1;
            if appended % 100_000 == 0 {
                // Keep the sequence bounded.
                m.free(3).unwrap();
                m.admit(3, &cached[..100], &AdmitOptions::default())
                    .unwrap();
            }
        })
    });
    m.free(3).unwrap();

    m.admit(4, &cached, &AdmitOptions::default()).unwrap();
    g.bench_function("fork_free_4096", |b| {
        b.iter(|| {
            m.fork(4, 5).unwrap();
            m.free(5).unwrap();
        })
    });
    m.free(4).unwrap();
    g.finish();
}

/// Admit+free of a cached prompt, each of `threads` threads on its own
/// request id; reports the time per operation pair per thread.
fn admit_free_threads(
    m: &Arc<BlockManager>,
    cached: &Arc<Vec<u32>>,
    threads: u64,
    iters: u64,
) -> Duration {
    let barrier = Arc::new(Barrier::new(threads as usize + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (m, cached, barrier) = (m.clone(), cached.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for _ in 0..iters {
                    m.admit(100 + t, &cached, &AdmitOptions::default()).unwrap();
                    m.free(100 + t).unwrap();
                }
                start.elapsed()
            })
        })
        .collect();
    barrier.wait();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap()
}

fn two_threads(c: &mut Criterion) {
    let m = Arc::new(manager());
    let cached = Arc::new(prompt(1 << 20));
    m.admit(1, &cached, &AdmitOptions::default()).unwrap();
    m.free(1).unwrap();
    let mut g = c.benchmark_group("manager_2_threads");
    g.bench_function("admit_free_4096_cached", |b| {
        b.iter_custom(|iters| admit_free_threads(&m, &cached, 2, iters))
    });
    g.bench_function("match_prefix_4096", |b| {
        b.iter_custom(|iters| {
            let barrier = Arc::new(Barrier::new(3));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (m, cached, barrier) = (m.clone(), cached.clone(), barrier.clone());
                    thread::spawn(move || {
                        barrier.wait();
                        let start = Instant::now();
                        for _ in 0..iters {
                            black_box(m.match_prefix(&cached, &ExtraKeys::default()));
                        }
                        start.elapsed()
                    })
                })
                .collect();
            barrier.wait();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .max()
                .unwrap()
        })
    });
    g.finish();
}

/// Admit+free of 4,096-token prompts under eviction pressure, per policy:
/// each prompt is one of 64 shared 2,048-token prefixes followed by a fresh
/// 2,048-token tail, in a 16,384-block cache: once the tails have filled
/// it, every request hits some blocks, stores others and evicts, and the
/// policy's tables are as large as a deployment's.
fn per_policy(c: &mut Criterion) {
    let mut g = c.benchmark_group("manager_policy");
    for kind in EvictionPolicyKind::ALL {
        let m = policy_workloads::manager(kind);
        let mut i = 0u32;
        let mut p = Vec::new();
        g.bench_function(format!("admit_free_4096_mixed/{kind}"), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                POLICY.write_prompt(i, &mut p);
                m.admit(1, black_box(&p), &AdmitOptions::default()).unwrap();
                m.free(1).unwrap();
            })
        });
    }
    g.finish();
}

/// The long-prompt workload of a production trace, per policy: admit+free
/// (hashing included) of 12,000-token prompts (188 blocks), each one of 64
/// shared 4,096-token prefixes followed by a fresh tail, in a 16,384-block
/// cache that, once full, evicts about 124 blocks on every admission.
/// Criterion's time divided by 188 is the cost per block. The time is the
/// thread's CPU time over admit+free only (the prompt is made outside it),
/// so other processes on a shared machine do not inflate it.
fn long_prompt(c: &mut Criterion) {
    let mut g = c.benchmark_group("manager_long_prompt");
    for kind in EvictionPolicyKind::ALL {
        let m = policy_workloads::manager(kind);
        let mut i = 0u32;
        g.bench_function(format!("admit_free_12000_evicting/{kind}"), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    i = i.wrapping_add(1);
                    let p = LONG_PROMPT.prompt(i);
                    let start = thread_cpu_time();
                    m.admit(1, black_box(&p), &AdmitOptions::default()).unwrap();
                    m.free(1).unwrap();
                    spent += thread_cpu_time() - start;
                }
                spent
            })
        });
    }
    g.finish();
}

/// Hashing a 4,096-token prompt (64 blocks of 64) with each block hash kind.
fn per_block_hash(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..4096).map(|t| t * 37 % 150_000).collect();
    let keys = ExtraKeys::default();
    for kind in BlockHashKind::ALL {
        let m = BlockManager::new(CacheConfig {
            block_hash: kind,
            hash_seed: Some(1),
            ..CacheConfig::new(128)
        })
        .unwrap();
        c.bench_function(&format!("block_hashes 4096 tokens {kind}"), |b| {
            b.iter(|| black_box(m.block_hashes(black_box(&tokens), &keys)))
        });
    }
}

criterion_group!(
    benches,
    single_thread,
    two_threads,
    per_policy,
    long_prompt,
    per_block_hash
);
criterion_main!(benches);
