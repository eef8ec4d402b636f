//! Host store throughput: writing 4,096 tokens (bf16 input, scattered
//! slots), gathering them back (bf16 output), and copying 32 blocks in each
//! of 4 layers. GB/s of dense bf16 data for write and gather, of stored
//! bytes for copy.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use mla_cache::store::{HostStore, LatentStore, Stream};
use mla_cache::{BlockId, CacheConfig, Dtype};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const TOKENS: usize = 4096;
const BLOCK: usize = 64;
const RANK: usize = 512;
const ROPE: usize = 64;

fn bench(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(9);
    let c_kv: Vec<bf16> = (0..TOKENS * RANK)
        .map(|_| bf16::from_f32(rng.gen_range(-2.0f32..2.0)))
        .collect();
    let k_pe: Vec<bf16> = (0..TOKENS * ROPE)
        .map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
        .collect();
    let mut blocks: Vec<BlockId> = (0..256).collect();
    blocks.shuffle(&mut rng);
    let table = &blocks[..TOKENS / BLOCK];
    let slots: Vec<i64> = (0..TOKENS)
        .map(|t| (table[t / BLOCK] as usize * BLOCK + t % BLOCK) as i64)
        .collect();
    let pairs: Vec<(BlockId, BlockId)> = blocks[64..96]
        .iter()
        .zip(&blocks[96..128])
        .map(|(&s, &d)| (s, d))
        .collect();
    let dense_bytes = (TOKENS * (RANK + ROPE) * 2) as u64;

    for dtype in Dtype::ALL {
        let config = CacheConfig {
            num_layers: 4,
            dtype,
            ..CacheConfig::new(256)
        };
        let store = HostStore::new(&config).unwrap();
        store.write(0, &c_kv, &k_pe, &slots).unwrap();
        let mut group = c.benchmark_group(format!("host_store/{}", dtype.name()));
        group.throughput(Throughput::Bytes(dense_bytes));
        group.bench_function(BenchmarkId::new("write", TOKENS), |b| {
            b.iter(|| store.write(0, &c_kv, &k_pe, &slots).unwrap())
        });
        let mut out = vec![bf16::ZERO; TOKENS * (RANK + ROPE)];
        group.bench_function(BenchmarkId::new("gather_bf16", TOKENS), |b| {
            b.iter(|| store.gather_into(0, table, &mut out).unwrap())
        });
        group.throughput(Throughput::Bytes(
            (pairs.len() * 4 * config.bytes_per_block_per_layer()) as u64,
        ));
        group.bench_function(BenchmarkId::new("copy_blocks", pairs.len()), |b| {
            b.iter(|| store.copy_blocks(&pairs, Stream::default()).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
