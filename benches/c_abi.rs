//! Per-call overhead of the C ABI against the Rust API: admit + free of a
//! cached 4,096-token prompt (64 blocks of 64, all hits but the last), once
//! through `BlockManager` and once through the `extern "C"` functions; and
//! the fixed cost of a call (`num_free_blocks`, which does almost nothing).

use std::ptr;

use criterion::{criterion_group, criterion_main, Criterion};
use mla_cache::ffi::*;
use mla_cache::{AdmitOptions, BlockManager, CacheConfig};

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

fn c_abi(c: &mut Criterion) {
    let tokens = prompt();
    let mut config = ptr::null_mut();
    let mut m = ptr::null_mut();
    let mut ids = vec![0u32; NUM_BLOCKS];
    let (mut n, mut cached) = (0usize, 0usize);
    // SAFETY: every pointer below is valid for the access the function makes.
    unsafe {
        assert_eq!(mla_config_create(NUM_BLOCKS, &mut config), MlaStatus::Ok);
        assert_eq!(mla_config_set_hash_seed(config, true, 7), MlaStatus::Ok);
        assert_eq!(mla_manager_create(config, &mut m), MlaStatus::Ok);
        assert_eq!(mla_config_destroy(config), MlaStatus::Ok);
        let mut admit = |id| {
            mla_manager_admit(
                m,
                id,
                tokens.as_ptr(),
                tokens.len(),
                ptr::null(),
                ids.as_mut_ptr(),
                ids.len(),
                &mut n,
                &mut cached,
            )
        };
        assert_eq!(admit(0), MlaStatus::Ok);
        assert_eq!(mla_manager_free(m, 0), MlaStatus::Ok);
        c.bench_function("admit+free cached 4096 tokens: C ABI", |b| {
            b.iter(|| {
                assert_eq!(admit(1), MlaStatus::Ok);
                assert_eq!(mla_manager_free(m, 1), MlaStatus::Ok);
            })
        });
        assert_eq!(cached, PROMPT - 64);
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

criterion_group!(benches, rust_api, c_abi);
criterion_main!(benches);
