//! Per-call overhead of the C ABI against the Rust API: admit + free of a
//! cached 4,096-token prompt (64 blocks of 64, all hits but the last), once
//! through `BlockManager` and once through the `extern "C"` functions; the
//! fixed cost of a call (`num_free_blocks`, which does almost nothing); and
//! one decode step of 256 requests (one token each, with its slot; then the
//! padded block tables), through the batched calls and through one call per
//! request, in the same run.

use std::ptr;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use mla_cache::{AdmitOptions, BlockManager, CacheConfig};
use mla_cache_ffi::*;

const PROMPT: usize = 4096;
const NUM_BLOCKS: usize = 1024;

fn prompt() -> Vec<u32> {
    (0..PROMPT as u32)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect()
}

fn rust_api(c: &mut Criterion) {
    let mut config = CacheConfig::new(NUM_BLOCKS);
    config.hash_seed = Some(7);
    let m = BlockManager::new(config).unwrap();
    let tokens = prompt();
    let opts = AdmitOptions::default();
    m.admit(0, &tokens, &opts).unwrap();
    m.free(0).unwrap();
    c.bench_function("admit+free cached 4096 tokens: Rust API", |b| {
        b.iter(|| {
            let a = m.admit(1, &tokens, &opts).unwrap();
            assert_eq!(a.num_cached_tokens, PROMPT - 64);
            m.free(1).unwrap();
        })
    });
    c.bench_function("num_free_blocks: Rust API", |b| {
        b.iter(|| m.num_free_blocks())
    });
}

/// A manager of `num_blocks` blocks through the C ABI, with a fixed hash
/// seed when `seed` is given.
fn manager(num_blocks: usize, seed: Option<u64>) -> *mut MlaManager {
    let mut config = ptr::null_mut();
    let mut m = ptr::null_mut();
    // SAFETY: every pointer is valid for the access the function makes.
    unsafe {
        assert_eq!(mla_config_create(num_blocks, &mut config), MlaStatus::Ok);
        if let Some(seed) = seed {
            assert_eq!(mla_config_set_hash_seed(config, true, seed), MlaStatus::Ok);
        }
        assert_eq!(mla_manager_create(config, &mut m), MlaStatus::Ok);
        assert_eq!(mla_config_destroy(config), MlaStatus::Ok);
    }
    m
}

/// Admits request `id` with `tokens` into `table` through the C ABI;
/// returns the status and the cached tokens reported.
fn admit(m: *mut MlaManager, id: u64, tokens: &[u32], table: &mut [u32]) -> (MlaStatus, usize) {
    let (mut n, mut cached) = (0usize, 0usize);
    // SAFETY: every buffer holds its length; `m` is a live handle.
    let status = unsafe {
        mla_manager_admit(
            m,
            id,
            tokens.as_ptr(),
            tokens.len(),
            ptr::null(),
            table.as_mut_ptr(),
            table.len(),
            &mut n,
            &mut cached,
        )
    };
    (status, cached)
}

fn c_abi(c: &mut Criterion) {
    let tokens = prompt();
    let m = manager(NUM_BLOCKS, Some(7));
    let mut ids = vec![0u32; NUM_BLOCKS];
    let mut admit_prompt = |id| admit(m, id, &tokens, &mut ids);
    // SAFETY: every pointer below is valid for the access the function makes.
    unsafe {
        assert_eq!(admit_prompt(0).0, MlaStatus::Ok);
        assert_eq!(mla_manager_free(m, 0), MlaStatus::Ok);
        c.bench_function("admit+free cached 4096 tokens: C ABI", |b| {
            b.iter(|| {
                assert_eq!(admit_prompt(1), (MlaStatus::Ok, PROMPT - 64));
                assert_eq!(mla_manager_free(m, 1), MlaStatus::Ok);
            })
        });
        c.bench_function("num_free_blocks: C ABI", |b| {
            b.iter(|| {
                let mut free = 0;
                assert_eq!(mla_manager_num_free_blocks(m, &mut free), MlaStatus::Ok);
                free
            })
        });
        assert_eq!(mla_manager_destroy(m), MlaStatus::Ok);
    }
}

/// Requests of a decode step.
const BATCH: usize = 256;
/// Decode steps before the requests are freed and admitted again (untimed).
const STEPS: usize = 512;
/// Widest block table: a 512-token prompt, or a 64-token prompt and `STEPS`
/// tokens, in 64-token blocks.
const MAX_BLOCKS: usize = (64 + STEPS) / 64 + 1;

/// A manager with `BATCH` requests of `prompt`-token prompts, admitted
/// afresh every `STEPS` steps.
struct Decode {
    m: *mut MlaManager,
    ids: Vec<u64>,
    prompt: usize,
    lens: Vec<usize>,
    step: usize,
}

impl Decode {
    fn new(prompt: usize) -> Self {
        let mut d = Self {
            m: manager(BATCH * MAX_BLOCKS, None),
            ids: (0..BATCH as u64).collect(),
            prompt,
            lens: vec![0; BATCH],
            step: 0,
        };
        d.admit();
        d
    }

    fn admit(&mut self) {
        let mut table = [0u32; MAX_BLOCKS];
        for &id in &self.ids {
            let tokens: Vec<u32> = (0..self.prompt as u32)
                .map(|t| t + 10_000 * id as u32)
                .collect();
            assert_eq!(admit(self.m, id, &tokens, &mut table).0, MlaStatus::Ok);
        }
        self.lens.fill(self.prompt);
        self.step = 0;
    }

    /// Frees and admits the requests again once they have run `STEPS` steps.
    fn restart_if_done(&mut self) {
        if self.step == STEPS {
            // SAFETY: as above.
            let s = unsafe { mla_manager_free_batch(self.m, self.ids.as_ptr(), BATCH) };
            assert_eq!(s, MlaStatus::Ok);
            self.admit();
        }
    }

    /// Times `iters` steps of `step`, restarts excluded.
    fn time(&mut self, iters: u64, mut step: impl FnMut(&mut Self)) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            self.restart_if_done();
            let start = Instant::now();
            step(self);
            total += start.elapsed();
            self.step += 1;
            for len in &mut self.lens {
                *len += 1;
            }
        }
        total
    }
}

/// Benchmarks `step` as `name` on a fresh `Decode` of `prompt`-token prompts.
fn bench_steps(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    prompt: usize,
    mut step: impl FnMut(&mut Decode),
) {
    let mut d = Decode::new(prompt);
    g.bench_function(name, |b| b.iter_custom(|iters| d.time(iters, &mut step)));
}

impl Drop for Decode {
    fn drop(&mut self) {
        // SAFETY: the handle is live.
        unsafe { mla_manager_destroy(self.m) };
    }
}

fn decode_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode step of 256 requests: C ABI");
    let tokens = vec![7u32; BATCH];
    let mut fresh = vec![0u32; BATCH];
    let mut counts = vec![0usize; BATCH];
    let mut copies = vec![
        MlaBatchCopy {
            request_index: 0,
            copy: MlaBlockCopy {
                src: 0,
                dst: 0,
                position: 0,
            },
        };
        BATCH
    ];
    let mut single_copies = [MlaBlockCopy {
        src: 0,
        dst: 0,
        position: 0,
    }; MLA_MAX_COPIES_PER_APPEND];
    let mut slots = vec![0i64; BATCH];
    let mut tables = vec![0i32; BATCH * MAX_BLOCKS];
    let mut table = [0u32; MAX_BLOCKS];
    let (mut n_fresh, mut n_copies, mut n_slots, mut widest) = (0, 0, 0, 0);

    bench_steps(&mut g, "append_batch (1 call)", 64, |d| {
        // SAFETY: every buffer holds its capacity.
        let s = unsafe {
            mla_manager_append_batch(
                d.m,
                d.ids.as_ptr(),
                BATCH,
                tokens.as_ptr(),
                ptr::null(),
                fresh.as_mut_ptr(),
                fresh.len(),
                counts.as_mut_ptr(),
                &mut n_fresh,
                copies.as_mut_ptr(),
                copies.len(),
                &mut n_copies,
                slots.as_mut_ptr(),
                slots.len(),
                &mut n_slots,
            )
        };
        assert_eq!(s, MlaStatus::Ok);
    });
    bench_steps(&mut g, "append + slot_mapping (512 calls)", 64, |d| {
        for (i, &id) in d.ids.iter().enumerate() {
            let len = d.lens[i];
            // SAFETY: every buffer holds its capacity.
            unsafe {
                let s = mla_manager_append(
                    d.m,
                    id,
                    &tokens[i],
                    1,
                    fresh.as_mut_ptr(),
                    fresh.len(),
                    &mut n_fresh,
                    single_copies.as_mut_ptr(),
                    single_copies.len(),
                    &mut n_copies,
                );
                assert_eq!(s, MlaStatus::Ok);
                let s =
                    mla_manager_slot_mapping(d.m, id, len, len + 1, &mut slots[i], 1, &mut n_slots);
                assert_eq!(s, MlaStatus::Ok);
            }
        }
    });

    // A step's padded block tables of 512-token requests (8 blocks each):
    // one call, or one per request and the padding done by the caller.
    bench_steps(&mut g, "fill_block_tables (1 call)", 512, |d| {
        // SAFETY: every buffer holds its capacity.
        let s = unsafe {
            mla_manager_fill_block_tables(
                d.m,
                d.ids.as_ptr(),
                BATCH,
                tables.as_mut_ptr(),
                MAX_BLOCKS,
                -1,
                ptr::null(),
                ptr::null_mut(),
                0,
                &mut widest,
                &mut n_slots,
            )
        };
        assert_eq!(s, MlaStatus::Ok);
    });
    bench_steps(&mut g, "block_table + padding (256 calls)", 512, |d| {
        for (row, &id) in tables.chunks_exact_mut(MAX_BLOCKS).zip(&d.ids) {
            let mut n = 0;
            // SAFETY: the buffer holds its capacity.
            let s =
                unsafe { mla_manager_block_table(d.m, id, table.as_mut_ptr(), MAX_BLOCKS, &mut n) };
            assert_eq!(s, MlaStatus::Ok);
            for (entry, i) in row.iter_mut().zip(0..) {
                *entry = if i < n { table[i] as i32 } else { -1 };
            }
        }
    });
    g.finish();
}

criterion_group!(benches, rust_api, c_abi, decode_step);
criterion_main!(benches);
