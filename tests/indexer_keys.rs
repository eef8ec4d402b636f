//! DeepSeek-V3.2's indexer keys in the host store: an independent encoder
//! and decoder written from the layout (`docs/formats.md`, "indexer keys")
//! in f64, compared bit for bit with what the store writes; gathers,
//! copy-on-write copies and whole-block I/O move the keys with the latents.

use half::bf16;
use mla_cache::codec::indexer_fp8::scale_exponent;
use mla_cache::codec::{IndexerCodec, Values};
use mla_cache::store::{HostStore, LatentStore};
use mla_cache::{CacheConfig, Dtype, IndexerGeometry};
use proptest::prelude::*;

const HEAD_DIM: usize = 128;

/// float8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN.
fn e4m3_value(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 3) & 0xF);
    let m = f64::from(b & 7);
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

/// The e4m3 code nearest to `t` (ties to the even code), saturating at 448.
fn nearest_e4m3(t: f64) -> u8 {
    let sign = if t < 0.0 { 0x80 } else { 0 };
    let t = t.abs();
    let mut best = 0u8;
    for code in 0..0x7Eu8 + 1 {
        let (d, db) = ((e4m3_value(code) - t).abs(), (e4m3_value(best) - t).abs());
        if d < db || (d == db && code % 2 == 0) {
            best = code;
        }
    }
    best | sign
}

/// One token's codes and scale from the definition: `s = 2^e` with `e` the
/// least integer such that `2^e >= max(amax, 1e-4) / 448` (the division in
/// f32), codes `nearest_e4m3(x / s)`.
fn reference_encode(key: &[f32]) -> (Vec<u8>, f32) {
    let amax = key.iter().fold(0f32, |m, x| m.max(x.abs()));
    let target = f64::from(amax.max(1e-4) / 448.0);
    let mut e = -160;
    while 2f64.powi(e) < target {
        e += 1;
    }
    let codes = key
        .iter()
        .map(|&x| nearest_e4m3(f64::from(x) / 2f64.powi(e)))
        .collect();
    (codes, 2f64.powi(e) as f32)
}

/// Token `offset`'s key decoded from a block's bytes, from the layout: codes
/// of every token first (`head_dim` bytes each), then every fp32 scale.
fn reference_decode(block: &[u8], block_size: usize, offset: usize) -> Vec<f64> {
    let at = block_size * HEAD_DIM + 4 * offset;
    let scale = f32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
    block[offset * HEAD_DIM..(offset + 1) * HEAD_DIM]
        .iter()
        .map(|&c| e4m3_value(c) * f64::from(scale))
        .collect()
}

fn config(num_blocks: usize, block_size: usize) -> CacheConfig {
    CacheConfig {
        num_layers: 2,
        block_size,
        dtype: Dtype::Fp8DsMla,
        indexer: Some(IndexerGeometry::DEEPSEEK_V32),
        ..CacheConfig::new(num_blocks)
    }
}

/// Keys mostly in [-4, 4] with occasional large outliers.
fn keys(tokens: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(
        prop_oneof![
            8 => -4.0f32..4.0,
            1 => -3000.0f32..3000.0,
            1 => -1e-3f32..1e-3,
        ],
        tokens * HEAD_DIM,
    )
}

/// The indexer bytes of block `block` in `layer`.
fn block_of(store: &HostStore, layer: usize, block: usize) -> Vec<u8> {
    let bytes = store.config().block_size * (HEAD_DIM + 4);
    store
        .with_indexer_bytes(layer, |b| b[block * bytes..(block + 1) * bytes].to_vec())
        .unwrap()
}

#[test]
fn a_64_token_block_is_8448_bytes_keys_first_then_scales() {
    let codec = IndexerCodec::new(IndexerGeometry::DEEPSEEK_V32, 64).unwrap();
    assert_eq!(codec.block_bytes(), 8_448);
    assert_eq!(codec.codes_offset(3), 3 * 128);
    assert_eq!(codec.scale_offset(0), 64 * 128);
    assert_eq!(codec.scale_offset(63), 8_448 - 4);
    let store = HostStore::new(&config(4, 64)).unwrap();
    let view = store.indexer_view(1).unwrap();
    assert_eq!(view.shape, [4, 64, 132]);
    assert_eq!(view.strides, [8_448, 132, 1]);
    assert_eq!(view.len_bytes(), 4 * 8_448);
}

#[test]
fn the_scale_is_the_power_of_two_above_amax_over_448_with_a_floor() {
    // vLLM: exp2(ceil(log2(max(amax, 1e-4) / 448))).
    for amax in [0.0f32, 1e-6, 1e-4, 0.5, 1.0, 3.5, 448.0, 449.0, 896.0, 1e30] {
        let expected = (f64::from(amax.max(1e-4) / 448.0)).log2().ceil() as i32;
        assert_eq!(scale_exponent(amax), expected, "amax {amax}");
    }
    assert_eq!(scale_exponent(0.0), -22);
    assert_eq!(scale_exponent(448.0), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn stored_keys_match_the_definition_bit_for_bit(
        keys in keys(12),
        block_size in prop::sample::select(vec![1usize, 4, 16, 64]),
        as_bf16 in any::<bool>(),
    ) {
        let store = HostStore::new(&config(16, block_size)).unwrap();
        let capacity = 16 * block_size;
        // Scattered slots, one skipped.
        let slots: Vec<i64> = (0..12)
            .map(|t| if t == 5 { -1 } else { ((t * 7 + 3) % capacity) as i64 })
            .collect();
        let keys: Vec<f32> = if as_bf16 {
            keys.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
        } else {
            keys
        };
        if as_bf16 {
            let narrow: Vec<bf16> = keys.iter().map(|&x| bf16::from_f32(x)).collect();
            store.write_indexer(1, &narrow[..], &slots).unwrap();
        } else {
            store.write_indexer(1, &keys[..], &slots).unwrap();
        }
        for (t, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let (block, offset) = (slot as usize / block_size, slot as usize % block_size);
            let bytes = block_of(&store, 1, block);
            let (codes, scale) = reference_encode(&keys[t * HEAD_DIM..(t + 1) * HEAD_DIM]);
            prop_assert_eq!(&bytes[offset * HEAD_DIM..(offset + 1) * HEAD_DIM], &codes[..]);
            let at = block_size * HEAD_DIM + 4 * offset;
            prop_assert_eq!(&bytes[at..at + 4], &scale.to_le_bytes()[..]);

            // Dequantized gather of that one token, through a one-block table.
            let table = [block as u32];
            let mut out = vec![0f32; (offset + 1) * HEAD_DIM];
            store.gather_indexer_into(1, &table, &mut out).unwrap();
            let expected = reference_decode(&bytes, block_size, offset);
            for (got, want) in out[offset * HEAD_DIM..].iter().zip(&expected) {
                prop_assert_eq!(f64::from(*got), *want);
            }
        }
        // Layer 0 was not written.
        prop_assert!(store.with_indexer_bytes(0, |b| b.iter().all(|&x| x == 0)).unwrap());
    }

    #[test]
    fn the_codec_round_trips_within_half_a_step(key in keys(1)) {
        let codec = IndexerCodec::new(IndexerGeometry::DEEPSEEK_V32, 4).unwrap();
        let mut block = vec![0u8; codec.block_bytes()];
        codec.encode(Values::F32(&key), &mut block, 2).unwrap();
        let mut out = vec![0f32; HEAD_DIM];
        codec.decode(&block, 2, &mut out).unwrap();
        let amax = key.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = 2f32.powi(scale_exponent(amax));
        for (&x, &y) in key.iter().zip(&out) {
            // e4m3 has 3 mantissa bits: relative error <= 2^-4 for normals,
            // absolute <= 2^-10 x scale in the subnormal range.
            let bound = (x.abs() / 16.0).max(scale / 1024.0) * 1.0001;
            prop_assert!((x - y).abs() <= bound, "{} -> {}", x, y);
        }
    }
}

#[test]
fn quantized_gather_returns_the_stored_codes_and_scales() {
    let store = HostStore::new(&config(4, 4)).unwrap();
    let keys: Vec<f32> = (0..6 * HEAD_DIM).map(|i| (i % 97) as f32 - 48.0).collect();
    // Tokens 0..6 of a sequence in blocks [2, 0].
    let slots: Vec<i64> = vec![8, 9, 10, 11, 0, 1];
    store.write_indexer(0, &keys[..], &slots).unwrap();
    let mut codes = vec![0u8; 6 * HEAD_DIM];
    let mut scales = vec![0f32; 6];
    store
        .gather_indexer_quantized(0, &[2, 0], &mut codes, &mut scales)
        .unwrap();
    for t in 0..6 {
        let (want_codes, want_scale) = reference_encode(&keys[t * HEAD_DIM..(t + 1) * HEAD_DIM]);
        assert_eq!(&codes[t * HEAD_DIM..(t + 1) * HEAD_DIM], &want_codes[..]);
        assert_eq!(scales[t], want_scale);
    }
    // Mismatched lengths are refused.
    assert!(store
        .gather_indexer_quantized(0, &[2, 0], &mut codes[..10], &mut scales)
        .is_err());
    assert!(store
        .gather_indexer_quantized(0, &[2], &mut codes, &mut scales)
        .is_err());
}

#[test]
fn copies_and_whole_block_io_move_latents_and_keys_together() {
    let c = config(4, 4);
    let store = HostStore::new(&c).unwrap();
    let slots: Vec<i64> = (4..8).collect(); // block 1
    let keys: Vec<f32> = (0..4 * HEAD_DIM).map(|i| (i as f32).sin() * 9.0).collect();
    let c_kv: Vec<f32> = (0..4 * 512).map(|i| (i as f32).cos()).collect();
    let k_pe: Vec<f32> = (0..4 * 64).map(|i| i as f32 / 64.0).collect();
    for layer in 0..2 {
        store.write(layer, &c_kv[..], &k_pe[..], &slots).unwrap();
        store.write_indexer(layer, &keys[..], &slots).unwrap();
    }
    store.copy_blocks(&[(1, 3)], Default::default()).unwrap();
    for layer in 0..2 {
        assert_eq!(block_of(&store, layer, 3), block_of(&store, layer, 1));
    }
    assert_eq!(
        store.gather_f32(1, &[3], 4).unwrap(),
        store.gather_f32(1, &[1], 4).unwrap()
    );

    assert_eq!(store.block_bytes(), 2 * 4 * (656 + 132));
    let mut whole = vec![0u8; store.block_bytes()];
    store.read_block(1, &mut whole).unwrap();
    // Layout: both layers' latents, then both layers' indexer keys.
    let latent = 4 * 656;
    assert_eq!(
        &whole[2 * latent..2 * latent + 4 * 132],
        &block_of(&store, 0, 1)[..]
    );
    assert_eq!(&whole[2 * latent + 4 * 132..], &block_of(&store, 1, 1)[..]);
    store.write_block(2, &whole).unwrap();
    let mut again = vec![0u8; store.block_bytes()];
    store.read_block(2, &mut again).unwrap();
    assert_eq!(again, whole);
    assert_eq!(block_of(&store, 1, 2), block_of(&store, 1, 1));
    // A block without its indexer part is refused and changes nothing.
    assert!(store.write_block(0, &whole[..2 * latent]).is_err());
    assert!(store
        .with_indexer_bytes(0, |b| b[..4 * 132].iter().all(|&x| x == 0))
        .unwrap());
}

#[test]
fn bad_indexer_calls_are_errors_that_change_nothing() {
    let store = HostStore::new(&config(2, 4)).unwrap();
    let keys = vec![1f32; 2 * HEAD_DIM];
    assert!(store.write_indexer(2, &keys[..], &[0, 1]).is_err(), "layer");
    assert!(store.write_indexer(0, &keys[..], &[0]).is_err(), "shape");
    assert!(store.write_indexer(0, &keys[..], &[0, 8]).is_err(), "slot");
    assert!(store
        .with_indexer_bytes(0, |b| b.iter().all(|&x| x == 0))
        .unwrap());
    let mut out = vec![0f32; HEAD_DIM + 1];
    assert!(store.gather_indexer_into(0, &[0], &mut out).is_err());
    let mut out = vec![0f32; HEAD_DIM];
    assert!(
        store.gather_indexer_into(0, &[7], &mut out).is_err(),
        "block id"
    );

    let plain = HostStore::new(&CacheConfig::new(2)).unwrap();
    let err = plain.write_indexer(0, &keys[..], &[0, 1]).unwrap_err();
    assert!(err.to_string().contains("no indexer"), "{err}");
    assert!(plain.indexer_view(0).is_err());
    assert!(plain.gather_indexer_into(0, &[0], &mut out).is_err());
}
