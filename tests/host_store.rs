//! The host store: write/gather round trips, skipped slots, block copies,
//! raw descriptors, layer views, concurrency, and errors that change nothing.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use half::{bf16, f16};
use mla_cache::codec::{Codec, ElemType, Values};
use mla_cache::store::{
    Device, HostStore, HostStoreOptions, LatentStore, MatrixDesc, Stream, VectorDesc,
};
use mla_cache::{BlockId, CacheConfig, Dtype};
use proptest::prelude::*;

const RANK: usize = 512;
const ROPE: usize = 64;
const WIDTH: usize = RANK + ROPE;

fn config(dtype: Dtype) -> CacheConfig {
    CacheConfig {
        num_layers: 3,
        block_size: 16,
        dtype,
        ..CacheConfig::new(8)
    }
}

fn snapshot(store: &HostStore) -> Vec<Vec<u8>> {
    (0..store.config().num_layers)
        .map(|l| store.with_layer_bytes(l, |b| b.to_vec()).unwrap())
        .collect()
}

/// Slots of `tokens` consecutive tokens of a sequence with `table`.
fn slots_for(table: &[BlockId], tokens: usize, block_size: usize) -> Vec<i64> {
    (0..tokens)
        .map(|t| (table[t / block_size] as usize * block_size + t % block_size) as i64)
        .collect()
}

/// What the codec makes of `tokens` rows.
fn expected_f32(codec: &Codec, c_kv: Values<'_>, k_pe: Values<'_>, tokens: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; tokens * codec.bytes_per_token()];
    codec.encode_batch(c_kv, k_pe, &mut bytes).unwrap();
    let mut out = vec![0f32; tokens * WIDTH];
    codec.decode_batch(&bytes, &mut out).unwrap();
    out
}

/// Fills every slot of every layer with Gaussian data.
fn fill(store: &HostStore, seed: u64) {
    let mut rng = common::rng(seed);
    let tokens = store.config().num_tokens();
    let slots: Vec<i64> = (0..tokens as i64).collect();
    for layer in 0..store.config().num_layers {
        let c = common::gaussian_rows(&mut rng, tokens, RANK, &[3], 10.0);
        let k = common::gaussian_rows(&mut rng, tokens, ROPE, &[], 1.0);
        store.write(layer, &c, &k, &slots).unwrap();
    }
}

#[test]
fn host_store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<HostStore>();
    assert_send_sync::<Box<dyn LatentStore>>();
}

#[test]
fn write_then_gather_round_trips_in_every_format_and_input_type() {
    let mut rng = common::rng(20);
    let tokens = 37; // two full blocks and a partial one
    let table: Vec<BlockId> = vec![5, 2, 7];
    let slots = slots_for(&table, tokens, 16);
    let c = common::TypedRows::new(&common::gaussian_rows(
        &mut rng,
        tokens,
        RANK,
        &[1, 300],
        12.0,
    ));
    let k = common::TypedRows::new(&common::gaussian_rows(&mut rng, tokens, ROPE, &[], 1.0));
    for dtype in Dtype::ALL {
        for c_type in ElemType::ALL {
            let k_type = ElemType::ALL[(c_type as usize + 1) % 3];
            let store = HostStore::new(&config(dtype)).unwrap();
            store
                .write(1, c.get(c_type), k.get(k_type), &slots)
                .unwrap();
            let expected = expected_f32(store.codec(), c.get(c_type), k.get(k_type), tokens);
            assert_eq!(
                store.gather_f32(1, &table, tokens).unwrap(),
                expected,
                "{dtype} {c_type}"
            );
            let narrow = store.gather_bf16(1, &table, tokens).unwrap();
            assert!(
                narrow.iter().zip(&expected).all(|(a, b)| a.to_f32() == *b),
                "{dtype} {c_type} bf16"
            );
            // A prefix of the sequence, and the other layers stay zero.
            assert_eq!(
                store.gather_f32(1, &table[..1], 5).unwrap(),
                expected[..5 * WIDTH]
            );
            for layer in [0, 2] {
                assert!(store
                    .with_layer_bytes(layer, |b| b.iter().all(|&x| x == 0))
                    .unwrap());
            }
        }
    }
}

#[test]
fn negative_slots_are_skipped_and_leave_their_bytes_alone() {
    for dtype in Dtype::ALL {
        let store = HostStore::new(&config(dtype)).unwrap();
        fill(&store, 21);
        let before = snapshot(&store);
        let bpt = store.codec().bytes_per_token();
        let slots = [-1i64, 3, -7, 9, i64::MIN];
        let c = vec![0.25f32; slots.len() * RANK];
        let k = vec![0.5f32; slots.len() * ROPE];
        store.write(0, &c, &k, &slots).unwrap();
        let after = snapshot(&store);
        assert_eq!(before[1..], after[1..]);
        for slot in 0..store.config().num_tokens() {
            let (b, a) = (
                &before[0][slot * bpt..][..bpt],
                &after[0][slot * bpt..][..bpt],
            );
            if slot == 3 || slot == 9 {
                assert_ne!(a, b, "{dtype}: slot {slot} should be written");
            } else {
                assert_eq!(a, b, "{dtype}: slot {slot} should be untouched");
            }
        }
    }
}

#[test]
fn copy_blocks_copies_every_layer_and_nothing_else() {
    for dtype in Dtype::ALL {
        let store = HostStore::new(&config(dtype)).unwrap();
        fill(&store, 22);
        let before = snapshot(&store);
        store
            .copy_blocks(&[(1, 4), (2, 6), (1, 0)], Stream::default())
            .unwrap();
        let after = snapshot(&store);
        let block = 16 * store.codec().bytes_per_token();
        let range = |b: usize| b * block..(b + 1) * block;
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(a[range(4)], b[range(1)]);
            assert_eq!(a[range(6)], b[range(2)]);
            assert_eq!(a[range(0)], b[range(1)]);
            for untouched in [1, 2, 3, 5, 7] {
                assert_eq!(a[range(untouched)], b[range(untouched)]);
            }
        }
        store.copy_blocks(&[], Stream::default()).unwrap();
        assert_eq!(snapshot(&store), after);
    }
}

#[test]
fn every_error_leaves_memory_and_outputs_unchanged() {
    let store = HostStore::new(&config(Dtype::Fp8DsMla)).unwrap();
    fill(&store, 23);
    let before = snapshot(&store);
    let capacity = store.config().num_tokens() as i64;
    let c = vec![1.0f32; 2 * RANK];
    let k = vec![1.0f32; 2 * ROPE];
    let s = Stream::default();

    let write_errors: Vec<(&str, mla_cache::Result<()>)> = vec![
        ("layer out of range", store.write(3, &c, &k, &[0, 1])),
        ("c_kv too short", store.write(0, &c[1..], &k, &[0, 1])),
        (
            "k_pe too long",
            store.write(0, &c, &vec![1.0f32; 2 * ROPE + 1], &[0, 1]),
        ),
        (
            "slot past the end after a good one",
            store.write(0, &c, &k, &[0, capacity]),
        ),
        (
            "slot far past the end",
            store.write(0, &c, &k, &[i64::MAX, 1]),
        ),
        (
            "copy: block out of range",
            store.copy_blocks(&[(0, 1), (8, 2)], s),
        ),
        (
            "copy: destination twice",
            store.copy_blocks(&[(0, 1), (2, 1)], s),
        ),
        (
            "copy: destination is a source",
            store.copy_blocks(&[(0, 1), (1, 2)], s),
        ),
        ("copy: onto itself", store.copy_blocks(&[(3, 3)], s)),
    ];
    let mut out = vec![7f32; 20 * WIDTH];
    let gather_errors: Vec<(&str, mla_cache::Result<()>)> = vec![
        (
            "gather: layer out of range",
            store.gather_into(5, &[0, 1], &mut out),
        ),
        (
            "gather: table too short",
            store.gather_into(0, &[0], &mut out),
        ),
        (
            "gather: block out of range",
            store.gather_into(0, &[0, 8], &mut out),
        ),
        (
            "gather: block -1 as u32",
            store.gather_into(0, &[u32::MAX, 0], &mut out),
        ),
        (
            "gather: partial row",
            store.gather_into(0, &[0, 1], &mut out[1..]),
        ),
    ];
    for (what, result) in write_errors.into_iter().chain(gather_errors) {
        assert!(result.is_err(), "{what} should fail");
        println!("{what}: {}", result.unwrap_err());
    }
    assert!(out.iter().all(|&v| v == 7.0));
    assert!(store.gather_f32(0, &[1], 17).is_err());
    assert!(store.layer_view(3).is_err());
    assert!(store.with_layer_bytes(3, |_| ()).is_err());

    // Raw descriptors.
    let good_c = MatrixDesc::contiguous(c.as_ptr() as usize, ElemType::F32, 2, RANK);
    let good_k = MatrixDesc::contiguous(k.as_ptr() as usize, ElemType::F32, 2, ROPE);
    let slots = [0i64, 1];
    let good_s = VectorDesc::from_slice(&slots);
    let raw_writes = [
        (
            "null c_kv",
            MatrixDesc { addr: 0, ..good_c },
            good_k,
            good_s,
        ),
        (
            "misaligned c_kv",
            MatrixDesc {
                addr: good_c.addr + 2,
                ..good_c
            },
            good_k,
            good_s,
        ),
        (
            "overlapping rows",
            MatrixDesc {
                row_stride: 4,
                ..good_c
            },
            good_k,
            good_s,
        ),
        (
            "stride not a multiple of the element",
            MatrixDesc {
                row_stride: RANK * 4 + 2,
                ..good_c
            },
            good_k,
            good_s,
        ),
        (
            "wrong width",
            MatrixDesc {
                cols: RANK - 1,
                ..good_c
            },
            good_k,
            good_s,
        ),
        (
            "wrong rows",
            good_c,
            MatrixDesc { rows: 3, ..good_k },
            good_s,
        ),
        (
            "extent overflows",
            MatrixDesc {
                row_stride: usize::MAX / 2,
                ..good_c
            },
            good_k,
            good_s,
        ),
        ("null slots", good_c, good_k, VectorDesc::new(0, 2)),
        (
            "misaligned slots",
            good_c,
            good_k,
            VectorDesc::new(slots.as_ptr() as usize + 4, 2),
        ),
    ];
    for (what, cd, kd, sd) in raw_writes {
        // SAFETY: every descriptor is rejected before memory is read.
        let result = unsafe { store.write_raw(0, cd, kd, sd, s) };
        assert!(result.is_err(), "{what} should fail");
    }
    let mut halves = vec![f16::ZERO; WIDTH];
    let table = [0u32];
    // SAFETY: rejected (f16 output) before memory is touched.
    let result = unsafe {
        store.gather_raw(
            0,
            VectorDesc::from_slice(&table),
            MatrixDesc::contiguous(halves.as_mut_ptr() as usize, ElemType::F16, 1, WIDTH),
            s,
        )
    };
    assert!(result.is_err());
    assert_eq!(snapshot(&store), before);
}

#[test]
fn raw_descriptors_with_padded_rows_match_the_slice_api() {
    let mut rng = common::rng(24);
    let tokens = 9;
    let (pad_c, pad_k, pad_out) = (RANK + 40, ROPE + 8, WIDTH + 24);
    let values = common::gaussian_rows(&mut rng, tokens, pad_c, &[], 2.0);
    let c: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
    let k: Vec<bf16> = common::gaussian_rows(&mut rng, tokens, pad_k, &[], 1.0)
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let table: Vec<BlockId> = vec![3];
    let slots = slots_for(&table, tokens, 16);
    for dtype in Dtype::ALL {
        let raw = HostStore::new(&config(dtype)).unwrap();
        let plain = HostStore::new(&config(dtype)).unwrap();
        let cd = MatrixDesc {
            addr: c.as_ptr() as usize,
            elem: ElemType::F16,
            rows: tokens,
            cols: RANK,
            row_stride: 2 * pad_c,
        };
        let kd = MatrixDesc {
            addr: k.as_ptr() as usize,
            elem: ElemType::Bf16,
            rows: tokens,
            cols: ROPE,
            row_stride: 2 * pad_k,
        };
        // SAFETY: the descriptors cover live vectors, read-only for the call.
        unsafe {
            raw.write_raw(2, cd, kd, VectorDesc::from_slice(&slots), Stream(0))
                .unwrap()
        };
        let dense_c: Vec<f16> = c.chunks(pad_c).flat_map(|r| r[..RANK].to_vec()).collect();
        let dense_k: Vec<bf16> = k.chunks(pad_k).flat_map(|r| r[..ROPE].to_vec()).collect();
        plain.write(2, &dense_c, &dense_k, &slots).unwrap();
        assert_eq!(snapshot(&raw), snapshot(&plain));

        let mut out = vec![-1f32; tokens * pad_out];
        let od = MatrixDesc {
            addr: out.as_mut_ptr() as usize,
            elem: ElemType::F32,
            rows: tokens,
            cols: WIDTH,
            row_stride: 4 * pad_out,
        };
        // SAFETY: `out` is a live exclusive vector covering the descriptor.
        unsafe {
            raw.gather_raw(2, VectorDesc::from_slice(&table), od, Stream(0))
                .unwrap()
        };
        let dense = plain.gather_f32(2, &table, tokens).unwrap();
        for t in 0..tokens {
            assert_eq!(out[t * pad_out..][..WIDTH], dense[t * WIDTH..][..WIDTH]);
            assert!(
                out[t * pad_out + WIDTH..(t + 1) * pad_out]
                    .iter()
                    .all(|&v| v == -1.0),
                "padding untouched"
            );
        }
    }
}

#[test]
fn layer_views_describe_the_memory() {
    let store = HostStore::new(&config(Dtype::Mxfp6)).unwrap();
    fill(&store, 25);
    let bpt = 528;
    let mut previous_end = 0;
    for layer in 0..3 {
        let v = store.layer_view(layer).unwrap();
        assert_eq!((v.device, v.dtype), (Device::Host, Dtype::Mxfp6));
        assert_eq!(v.shape, [8, 16, bpt]);
        assert_eq!(v.strides, [16 * bpt, bpt, 1]);
        assert_eq!(v.layout.rope_offset, 400);
        assert_eq!(v.addr % 4096, 0, "page-aligned");
        assert!(v.addr >= previous_end);
        previous_end = v.addr + v.len_bytes();
        // SAFETY: the view is valid while the store lives and nobody writes.
        let raw = unsafe { std::slice::from_raw_parts(v.addr as *const u8, v.len_bytes()) };
        assert_eq!(raw, snapshot(&store)[layer].as_slice());
    }
}

#[test]
fn huge_page_option_works_with_or_without_system_support() {
    let config = CacheConfig {
        num_layers: 2,
        ..CacheConfig::new(64)
    };
    let store = HostStore::with_options(&config, HostStoreOptions { huge_pages: true }).unwrap();
    println!("pages: {:?}", store.page_kind());
    let c = vec![0.5f32; RANK];
    let k = vec![0.25f32; ROPE];
    store.write(1, &c, &k, &[64 * 64 - 1]).unwrap();
    let last_block = [63u32];
    let out = store.gather_f32(1, &last_block, 64).unwrap();
    assert!(out[63 * WIDTH..][..RANK].iter().all(|&v| v == 0.5));
    assert_eq!(
        HostStore::new(&config).unwrap().page_kind(),
        mla_cache::store::PageKind::Regular
    );
}

#[test]
fn invalid_configs_are_rejected() {
    assert!(HostStore::new(&CacheConfig::new(0)).is_err());
    let c = CacheConfig {
        kv_lora_rank: 100,
        dtype: Dtype::Mxfp6,
        ..CacheConfig::new(4)
    };
    assert!(HostStore::new(&c).is_err());
    let huge = CacheConfig {
        num_layers: 61,
        block_size: 1 << 20,
        ..CacheConfig::new(1 << 30)
    };
    assert!(HostStore::new(&huge).is_err());
}

#[test]
fn zero_tokens_are_fine() {
    let store = HostStore::new(&config(Dtype::Bf16)).unwrap();
    store
        .write(0, Values::F32(&[]), Values::F32(&[]), &[])
        .unwrap();
    assert!(store.gather_f32(0, &[], 0).unwrap().is_empty());
}

#[test]
fn concurrent_writers_and_readers_see_whole_tokens() {
    let store = Arc::new(HostStore::new(&config(Dtype::Fp8DsMla)).unwrap());
    let threads: Vec<_> = (0..4u32)
        .map(|i| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                // Thread i owns blocks 2i and 2i+1 (in every layer).
                let table = [2 * i, 2 * i + 1];
                let slots = slots_for(&table, 32, 16);
                for round in 0..50 {
                    let value = (i * 100 + round) as f32;
                    let c = vec![value; 32 * RANK];
                    let k = vec![value; 32 * ROPE];
                    store.write(0, &c, &k, &slots).unwrap();
                    let out = store.gather_f32(0, &table, 32).unwrap();
                    let mut bytes = vec![0u8; store.codec().bytes_per_token()];
                    store
                        .codec()
                        .encode(c[..RANK].into(), k[..ROPE].into(), &mut bytes)
                        .unwrap();
                    let mut expected = vec![0f32; WIDTH];
                    store.codec().decode_f32(&bytes, &mut expected).unwrap();
                    // Nobody else writes these blocks, and no token is torn.
                    for row in out.chunks(WIDTH) {
                        assert_eq!(row, expected.as_slice());
                    }
                    store
                        .copy_blocks(&[(2 * i, 2 * i + 1)], Stream::default())
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of writes (negative and repeated slots included) leaves
    /// each slot holding the encoding of the last token written to it.
    #[test]
    fn writes_match_a_slot_map_model(
        batches in proptest::collection::vec(
            proptest::collection::vec((-3i64..32, -100i32..100), 0..12),
            1..6,
        ),
        dtype in prop_oneof![Just(Dtype::Bf16), Just(Dtype::Fp8DsMla), Just(Dtype::Mxfp6)],
    ) {
        let config = CacheConfig { num_layers: 2, block_size: 4, dtype, ..CacheConfig::new(8) };
        let store = HostStore::new(&config).unwrap();
        let codec = *store.codec();
        let bpt = codec.bytes_per_token();
        let mut model: HashMap<i64, Vec<u8>> = HashMap::new();
        for batch in &batches {
            let slots: Vec<i64> = batch.iter().map(|&(s, _)| s).collect();
            let c: Vec<f32> = batch.iter().flat_map(|&(_, v)| (0..RANK).map(move |i| v as f32 + i as f32 / 64.0)).collect();
            let k: Vec<f32> = batch.iter().flat_map(|&(_, v)| vec![v as f32 / 8.0; ROPE]).collect();
            store.write(1, &c, &k, &slots).unwrap();
            for (t, &slot) in slots.iter().enumerate().filter(|(_, &s)| s >= 0) {
                let mut bytes = vec![0u8; bpt];
                codec.encode(c[t * RANK..][..RANK].into(), k[t * ROPE..][..ROPE].into(), &mut bytes).unwrap();
                model.insert(slot, bytes);
            }
        }
        let layer = store.with_layer_bytes(1, |b| b.to_vec()).unwrap();
        for slot in 0..32i64 {
            let got = &layer[slot as usize * bpt..][..bpt];
            match model.get(&slot) {
                Some(bytes) => prop_assert_eq!(got, bytes.as_slice()),
                None => prop_assert!(got.iter().all(|&b| b == 0)),
            }
        }
        prop_assert!(store.with_layer_bytes(0, |b| b.iter().all(|&x| x == 0)).unwrap());
    }
}
