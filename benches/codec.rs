//! Encode and decode throughput of every format on a batch of 4,096 latents
//! (512 + 64), in GB/s of the dense side (input for encode, output for
//! decode, counted as bf16: 1152 bytes per latent).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use mla_cache::codec::{Codec, Values};
use mla_cache::Dtype;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOKENS: usize = 4096;
const RANK: usize = 512;
const ROPE: usize = 64;

fn data() -> (Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(7);
    let c = (0..TOKENS * RANK)
        .map(|i| rng.gen_range(-1.0f32..1.0) * if i % 97 == 0 { 30.0 } else { 1.0 })
        .collect();
    let k = (0..TOKENS * ROPE)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    (c, k)
}

fn bench(c: &mut Criterion) {
    let (c_f32, k_f32) = data();
    let c_bf16: Vec<bf16> = c_f32.iter().map(|&v| bf16::from_f32(v)).collect();
    let k_bf16: Vec<bf16> = k_f32.iter().map(|&v| bf16::from_f32(v)).collect();
    let dense_bytes = (TOKENS * (RANK + ROPE) * 2) as u64;

    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Bytes(dense_bytes));
    for dtype in Dtype::ALL {
        let codec = Codec::new(dtype, RANK, ROPE).unwrap();
        let mut out = vec![0u8; TOKENS * codec.bytes_per_token()];
        group.bench_function(BenchmarkId::new(dtype.name(), "from_bf16"), |b| {
            b.iter(|| {
                codec
                    .encode_batch(Values::Bf16(&c_bf16), Values::Bf16(&k_bf16), &mut out)
                    .unwrap()
            })
        });
        group.bench_function(BenchmarkId::new(dtype.name(), "from_f32"), |b| {
            b.iter(|| {
                codec
                    .encode_batch(Values::F32(&c_f32), Values::F32(&k_f32), &mut out)
                    .unwrap()
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(dense_bytes));
    for dtype in Dtype::ALL {
        let codec = Codec::new(dtype, RANK, ROPE).unwrap();
        let mut encoded = vec![0u8; TOKENS * codec.bytes_per_token()];
        codec
            .encode_batch(Values::F32(&c_f32), Values::F32(&k_f32), &mut encoded)
            .unwrap();
        let mut out_bf16 = vec![bf16::ZERO; TOKENS * (RANK + ROPE)];
        let mut out_f32 = vec![0f32; TOKENS * (RANK + ROPE)];
        group.bench_function(BenchmarkId::new(dtype.name(), "to_bf16"), |b| {
            b.iter(|| codec.decode_batch(&encoded, &mut out_bf16).unwrap())
        });
        group.bench_function(BenchmarkId::new(dtype.name(), "to_f32"), |b| {
            b.iter(|| codec.decode_batch(&encoded, &mut out_f32).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
