//! The CUDA kernels, run on the CPU by a small emulator (`kernel_emu/emu.cpp`
//! built with g++: one thread per CUDA thread, warp shuffles at barriers),
//! against the CPU codec bit for bit. The launches are the ones the CUDA
//! store performs ([`cuda::write_launch`] and friends), so this checks the
//! kernels' arithmetic, indexing, packing and argument passing without a GPU.
//! Skipped (with a message) when g++ is missing, unless
//! `MLA_CACHE_REQUIRE_EMULATION=1`.
#![cfg(feature = "cuda")]

mod cuda_common;

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use cuda_common::*;
use half::bf16;
use mla_cache::codec::{Decoded, ElemType};
use mla_cache::store::cuda::{self, KernelLaunch};
use mla_cache::store::{HostStore, LatentStore, MatrixDesc, Part, VectorDesc};
use mla_cache::{BlockId, CacheConfig, Dtype};

type EmuLaunch =
    unsafe extern "C" fn(*const c_char, c_uint, c_uint, c_uint, c_uint, *mut *mut c_void) -> c_int;

/// Builds and loads the emulator once; `None` (skip) without g++.
fn emulator() -> Option<EmuLaunch> {
    static EMU: OnceLock<Option<EmuLaunch>> = OnceLock::new();
    let f = EMU.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let lib = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mla_kernel_emu.so");
        let status = Command::new("g++")
            .args([
                "-std=c++20",
                "-O1",
                "-ffp-contract=off",
                "-fPIC",
                "-shared",
                "-pthread",
                "-Wall",
                "-Werror",
            ])
            .args(
                cuda::kernel_defines()
                    .iter()
                    .map(|(name, value)| format!("-D{name}={value}")),
            )
            .arg("-o")
            .arg(&lib)
            .arg(root.join("tests/kernel_emu/emu.cpp"))
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("g++ failed to build the kernel emulator: {s}"),
            Err(e) => {
                if std::env::var("MLA_CACHE_REQUIRE_EMULATION").as_deref() == Ok("1") {
                    panic!("g++ not available ({e}) and MLA_CACHE_REQUIRE_EMULATION=1");
                }
                eprintln!("skipping the kernel emulation tests: g++ not available ({e})");
                return None;
            }
        }
        // SAFETY: loading a library we just built; it stays loaded (leaked).
        let lib = Box::leak(Box::new(
            unsafe { libloading::Library::new(&lib) }.expect("cannot load the kernel emulator"),
        ));
        // SAFETY: `emu_launch` has this signature (see emu.cpp).
        let launch = unsafe { lib.get::<EmuLaunch>(b"emu_launch\0") }.expect("emu_launch missing");
        Some(*launch)
    });
    *f
}

fn run(emu: EmuLaunch, mut launch: KernelLaunch) {
    let name = CString::new(launch.name()).unwrap();
    let (grid, block, shared) = (launch.grid, launch.block, launch.shared_bytes);
    assert_eq!(grid.2, 1);
    let mut params = launch.params();
    // SAFETY: the launch's addresses point into live host buffers of this test.
    let rc = unsafe {
        emu(
            name.as_ptr(),
            grid.0,
            grid.1,
            block,
            shared,
            params.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "emulator refused {}", launch.name());
}

macro_rules! emulator_or_skip {
    () => {
        match emulator() {
            Some(e) => e,
            None => return,
        }
    };
}

/// Writes `tokens` tokens with the emulated kernel and with the host store,
/// compares the layer bytes; returns the host store and slots for gathers.
fn write_case(
    emu: EmuLaunch,
    dtype: Dtype,
    ckv_elem: ElemType,
    kpe_elem: ElemType,
    tokens: usize,
    seed: u64,
) {
    let config = config(dtype, tokens);
    let mut rng = rng(seed);
    let c_kv = sample(&mut rng, ckv_elem, tokens * config.kv_lora_rank, true);
    let k_pe = sample(&mut rng, kpe_elem, tokens * config.rope_dim, true);
    let slots = slot_mapping(&mut rng, tokens, config.num_tokens());

    let host = HostStore::new(&config).unwrap();
    host.write(1, c_kv.values(), k_pe.values(), &slots).unwrap();
    let bpt = host.codec().bytes_per_token();

    let mut cache = vec![FILL; config.num_tokens() * bpt];
    let launch = cuda::write_launch(
        &config,
        Part::Latent,
        cache.as_mut_ptr() as u64,
        &[
            c_kv.desc_at(c_kv.bytes().as_ptr() as usize, tokens, config.kv_lora_rank),
            k_pe.desc_at(k_pe.bytes().as_ptr() as usize, tokens, config.rope_dim),
        ],
        &VectorDesc::from_slice(&slots),
    )
    .unwrap()
    .unwrap();
    run(emu, launch);
    let what = format!("write {dtype} from c_kv {ckv_elem} / k_pe {kpe_elem}, {tokens} tokens");
    check_layer(&what, &cache, &layer_bytes(&host, 1), &slots, bpt);
}

#[test]
fn write_matches_cpu_codec() {
    let emu = emulator_or_skip!();
    for dtype in Dtype::ALL {
        for elem in ElemType::ALL {
            for (i, &tokens) in EMULATED_TOKEN_COUNTS.iter().enumerate() {
                write_case(emu, dtype, elem, elem, tokens, 1000 + i as u64);
            }
        }
    }
}

#[test]
fn write_with_mixed_input_types() {
    let emu = emulator_or_skip!();
    for dtype in Dtype::ALL {
        write_case(emu, dtype, ElemType::F32, ElemType::Bf16, 65, 7);
        write_case(emu, dtype, ElemType::Bf16, ElemType::F16, 3, 8);
    }
}

#[test]
fn write_with_row_strides() {
    // c_kv and k_pe as the two halves of one [T, 576] f32 tensor.
    let emu = emulator_or_skip!();
    for dtype in Dtype::ALL {
        let tokens = 65;
        let config = config(dtype, tokens);
        let mut rng = rng(11);
        let width = config.elements_per_token();
        let fused = sample_f32(&mut rng, tokens * width, true);
        let slots = slot_mapping(&mut rng, tokens, config.num_tokens());
        let c_kv: Vec<f32> = fused
            .chunks(width)
            .flat_map(|r| r[..config.kv_lora_rank].to_vec())
            .collect();
        let k_pe: Vec<f32> = fused
            .chunks(width)
            .flat_map(|r| r[config.kv_lora_rank..].to_vec())
            .collect();
        let host = HostStore::new(&config).unwrap();
        host.write(0, &c_kv, &k_pe, &slots).unwrap();
        let bpt = host.codec().bytes_per_token();
        let mut cache = vec![FILL; config.num_tokens() * bpt];
        let base = fused.as_ptr() as usize;
        let ckv = MatrixDesc {
            addr: base,
            elem: ElemType::F32,
            rows: tokens,
            cols: config.kv_lora_rank,
            row_stride: 4 * width,
        };
        let kpe = MatrixDesc {
            addr: base + 4 * config.kv_lora_rank,
            cols: config.rope_dim,
            ..ckv
        };
        let launch = cuda::write_launch(
            &config,
            Part::Latent,
            cache.as_mut_ptr() as u64,
            &[ckv, kpe],
            &VectorDesc::from_slice(&slots),
        )
        .unwrap()
        .unwrap();
        run(emu, launch);
        check_layer(
            &format!("strided write {dtype}"),
            &cache,
            &layer_bytes(&host, 0),
            &slots,
            bpt,
        );
    }
}

fn gather_case(emu: EmuLaunch, dtype: Dtype, tokens: usize, seed: u64) {
    let config = config(dtype, tokens);
    let mut rng = rng(seed);
    // Fill every slot through the host store, then gather a sequence that
    // walks the blocks in random order.
    let all = config.num_tokens();
    let c_kv = sample(&mut rng, ElemType::F32, all * config.kv_lora_rank, true);
    let k_pe = sample(&mut rng, ElemType::Bf16, all * config.rope_dim, true);
    let slots: Vec<i64> = (0..all as i64).collect();
    let host = HostStore::new(&config).unwrap();
    host.write(0, c_kv.values(), k_pe.values(), &slots).unwrap();
    let cache = layer_bytes(&host, 0);
    let table = block_table(&mut rng, config.num_blocks);
    let width = config.elements_per_token();

    let expected_f32 = host.gather_f32(0, &table, tokens).unwrap();
    let mut got_f32 = vec![f32::from_bits(0xDEAD_BEEF); tokens * width];
    let out = MatrixDesc::contiguous(got_f32.as_mut_ptr() as usize, ElemType::F32, tokens, width);
    let launch = cuda::gather_launch(
        &config,
        Part::Latent,
        cache.as_ptr() as u64,
        &VectorDesc::from_slice(&table),
        &out,
    )
    .unwrap()
    .unwrap();
    run(emu, launch);
    let as_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    check_decoded(
        &format!("gather {dtype} -> f32, {tokens} tokens"),
        &as_bytes(&got_f32),
        &as_bytes(&expected_f32),
        4,
        width,
    );

    let expected_bf16 = host.gather_bf16(0, &table, tokens).unwrap();
    let mut got_bf16 = vec![bf16::from_bits(0xBEEF); tokens * width];
    let out = MatrixDesc::contiguous(
        got_bf16.as_mut_ptr() as usize,
        ElemType::Bf16,
        tokens,
        width,
    );
    let launch = cuda::gather_launch(
        &config,
        Part::Latent,
        cache.as_ptr() as u64,
        &VectorDesc::from_slice(&table),
        &out,
    )
    .unwrap()
    .unwrap();
    run(emu, launch);
    let as_bytes = |v: &[bf16]| {
        v.iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect::<Vec<u8>>()
    };
    check_decoded(
        &format!("gather {dtype} -> bf16, {tokens} tokens"),
        &as_bytes(&got_bf16),
        &as_bytes(&expected_bf16),
        2,
        width,
    );
}

#[test]
fn gather_matches_cpu_codec() {
    let emu = emulator_or_skip!();
    for dtype in Dtype::ALL {
        for (i, &tokens) in EMULATED_TOKEN_COUNTS.iter().enumerate() {
            gather_case(emu, dtype, tokens, 2000 + i as u64);
        }
    }
}

#[test]
fn gather_decodes_codes_the_encoder_never_writes() {
    // Random bytes: NaN codes, scale byte 255, arbitrary fp32 scales.
    let emu = emulator_or_skip!();
    for dtype in [Dtype::Fp8DsMla, Dtype::Mxfp6] {
        let tokens = 64;
        let mut config = config(dtype, tokens);
        config.num_layers = 1;
        let host = HostStore::new(&config).unwrap();
        let bpt = host.codec().bytes_per_token();
        let mut rng = rng(5);
        let mut cache: Vec<u8> = (0..config.num_tokens() * bpt)
            .map(|_| rand::Rng::gen(&mut rng))
            .collect();
        if dtype == Dtype::Fp8DsMla {
            // Keep scales finite powers of two (NaN scales decode differently
            // on different CPUs too).
            let codec = host.codec().layout();
            for t in 0..config.num_tokens() {
                for s in 0..codec.num_scales {
                    let at = t * bpt + codec.scales_offset + 4 * s;
                    let e: i32 = rand::Rng::gen_range(&mut rng, -20..20);
                    cache[at..at + 4].copy_from_slice(&2f32.powi(e).to_le_bytes());
                }
            }
        }
        let width = config.elements_per_token();
        let mut expected = vec![0f32; tokens * width];
        host.codec()
            .decode_batch(&cache[..tokens * bpt], &mut expected)
            .unwrap();
        let table: Vec<BlockId> = (0..config.num_blocks as BlockId).collect();
        let mut got = vec![0f32; tokens * width];
        let out = MatrixDesc::contiguous(got.as_mut_ptr() as usize, ElemType::F32, tokens, width);
        run(
            emu,
            cuda::gather_launch(
                &config,
                Part::Latent,
                cache.as_ptr() as u64,
                &VectorDesc::from_slice(&table),
                &out,
            )
            .unwrap()
            .unwrap(),
        );
        let bits = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        check_decoded(
            &format!("gather of arbitrary {dtype} bytes"),
            &bits(&got),
            &bits(&expected),
            4,
            width,
        );
    }
}

/// The block copies the copy tests launch: (source, destination).
const COPY_PAIRS: [(BlockId, BlockId); 3] = [(1, 7), (0, 3), (11, 2)];

/// Three layers of random bytes, `stride` apart from a 16-byte aligned
/// base (as device allocations are), and a copy of them as they were.
struct RandomLayers {
    memory: Vec<u8>,
    before: Vec<u8>,
    offset: usize,
    stride: usize,
}

impl RandomLayers {
    fn new(stride: usize, seed: u64) -> Self {
        let mut rng = rng(seed);
        let memory: Vec<u8> = (0..stride * 3 + 16)
            .map(|_| rand::Rng::gen(&mut rng))
            .collect();
        let offset = memory.as_ptr().align_offset(16);
        Self {
            before: memory.clone(),
            memory,
            offset,
            stride,
        }
    }

    /// The aligned base address the kernels write through.
    fn base(&mut self) -> u64 {
        self.memory[self.offset..].as_mut_ptr() as u64
    }

    /// Asserts that the memory holds what it held before, with each pair
    /// of [`COPY_PAIRS`] copied in every layer (blocks `block_bytes` long).
    fn assert_copied(&self, block_bytes: usize, what: &str) {
        let mut expected = self.before.clone();
        for layer in 0..3 {
            let start = self.offset + layer * self.stride;
            for &(src, dst) in &COPY_PAIRS {
                let s = start + src as usize * block_bytes;
                let d = start + dst as usize * block_bytes;
                expected.copy_within(s..s + block_bytes, d);
            }
        }
        assert!(
            self.memory == expected,
            "{what}: bytes differ from the expected copy"
        );
    }
}

#[test]
fn copy_blocks_copies_every_layer() {
    let emu = emulator_or_skip!();
    for dtype in Dtype::ALL {
        let mut config: CacheConfig = config(dtype, 300);
        config.num_layers = 3;
        config.num_blocks = 12;
        let bpt = config.bytes_per_token_per_layer();
        let stride = (config.num_tokens() * bpt).next_multiple_of(256);
        let mut layers = RandomLayers::new(stride, 9);
        let base = layers.base();
        for launch in cuda::copy_blocks_launches(&config, base, stride, &COPY_PAIRS).unwrap() {
            run(emu, launch);
        }
        layers.assert_copied(config.block_size * bpt, &format!("copy_blocks {dtype}"));
        // Chunks of more than one launch.
        let many: Vec<(BlockId, BlockId)> = (0..6).map(|i| (i, i + 6)).collect();
        assert_eq!(
            cuda::copy_blocks_launches(&config, base, stride, &many)
                .unwrap()
                .len(),
            1
        );
    }
}

/// [`config`] with DeepSeek-V3.2's indexer keys.
fn indexer_config(tokens: usize) -> CacheConfig {
    CacheConfig {
        indexer: Some(mla_cache::IndexerGeometry::DEEPSEEK_V32),
        ..config(Dtype::Fp8DsMla, tokens)
    }
}

/// The indexer bytes of `layer` of a host store.
fn indexer_bytes(store: &HostStore, layer: usize) -> Vec<u8> {
    store.with_indexer_bytes(layer, |b| b.to_vec()).unwrap()
}

#[test]
fn indexer_write_matches_cpu_codec() {
    let emu = emulator_or_skip!();
    for elem in ElemType::ALL {
        for (i, &tokens) in EMULATED_TOKEN_COUNTS.iter().enumerate() {
            let config = indexer_config(tokens);
            let head_dim = 128;
            let mut rng = rng(3000 + i as u64);
            let keys = sample(&mut rng, elem, tokens * head_dim, true);
            let slots = slot_mapping(&mut rng, tokens, config.num_tokens());
            let host = HostStore::new(&config).unwrap();
            host.write_indexer(1, keys.values(), &slots).unwrap();
            let expected = indexer_bytes(&host, 1);

            let mut cache = vec![FILL; expected.len()];
            let launch = cuda::write_launch(
                &config,
                Part::Indexer,
                cache.as_mut_ptr() as u64,
                &[keys.desc_at(keys.bytes().as_ptr() as usize, tokens, head_dim)],
                &VectorDesc::from_slice(&slots),
            )
            .unwrap()
            .unwrap();
            run(emu, launch);
            // Compare the written tokens' codes and scales; others stay FILL.
            let what = format!("indexer write from {elem}, {tokens} tokens");
            let (bs, block_bytes) = (config.block_size, config.block_size * 132);
            for slot in 0..config.num_tokens() {
                let block = slot / bs * block_bytes;
                let codes = block + slot % bs * head_dim..block + (slot % bs + 1) * head_dim;
                let scale = block + bs * head_dim + slot % bs * 4
                    ..block + bs * head_dim + (slot % bs + 1) * 4;
                if slots.contains(&(slot as i64)) {
                    assert_eq!(
                        cache[codes.clone()],
                        expected[codes],
                        "{what}: slot {slot} codes"
                    );
                    assert_eq!(
                        cache[scale.clone()],
                        expected[scale],
                        "{what}: slot {slot} scale"
                    );
                } else {
                    assert!(
                        cache[codes].iter().all(|&b| b == FILL),
                        "{what}: slot {slot} changed"
                    );
                    assert!(
                        cache[scale].iter().all(|&b| b == FILL),
                        "{what}: slot {slot} changed"
                    );
                }
            }
        }
    }
}

/// The bytes of decoded values.
fn value_bytes<O: Decoded>(values: &[O]) -> &[u8] {
    // SAFETY: `Decoded` is sealed to `f32` and `bf16`: plain values, no padding.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// An indexer layer written through the host store, its bytes, and a
/// shuffled block table to gather `tokens` tokens by.
struct IndexerCase {
    config: CacheConfig,
    host: HostStore,
    cache: Vec<u8>,
    table: Vec<BlockId>,
    tokens: usize,
}

impl IndexerCase {
    const HEAD_DIM: usize = 128;

    fn new(tokens: usize, seed: u64) -> Self {
        let config = indexer_config(tokens);
        let mut rng = rng(seed);
        let all = config.num_tokens();
        let keys = sample(&mut rng, ElemType::F32, all * Self::HEAD_DIM, true);
        let slots: Vec<i64> = (0..all as i64).collect();
        let host = HostStore::new(&config).unwrap();
        host.write_indexer(0, keys.values(), &slots).unwrap();
        let cache = indexer_bytes(&host, 0);
        let table = block_table(&mut rng, config.num_blocks);
        Self {
            config,
            host,
            cache,
            table,
            tokens,
        }
    }

    /// The emulated gather into `O` values (the output starts as `fill`)
    /// against the host store's, bit for bit.
    fn check_gather<O: Decoded>(&self, emu: EmuLaunch, fill: O) {
        let n = self.tokens * Self::HEAD_DIM;
        let mut expected = vec![O::default(); n];
        self.host
            .gather_indexer_into(0, &self.table, &mut expected)
            .unwrap();
        let mut got = vec![fill; n];
        let out = MatrixDesc::contiguous(
            got.as_mut_ptr() as usize,
            O::TYPE,
            self.tokens,
            Self::HEAD_DIM,
        );
        let launch = cuda::gather_launch(
            &self.config,
            Part::Indexer,
            self.cache.as_ptr() as u64,
            &VectorDesc::from_slice(&self.table),
            &out,
        );
        run(emu, launch.unwrap().unwrap());
        check_decoded(
            &format!("indexer gather -> {}, {} tokens", O::TYPE, self.tokens),
            value_bytes(&got),
            value_bytes(&expected),
            std::mem::size_of::<O>(),
            Self::HEAD_DIM,
        );
    }

    /// The emulated gather of FP8 codes and scales against the host store's.
    fn check_gather_quantized(&self, emu: EmuLaunch) {
        let n = self.tokens * Self::HEAD_DIM;
        let (mut codes, mut scales) = (vec![0u8; n], vec![0f32; self.tokens]);
        self.host
            .gather_indexer_quantized(0, &self.table, &mut codes, &mut scales)
            .unwrap();
        let (mut got_codes, mut got_scales) = (vec![FILL; n], vec![-1f32; self.tokens]);
        let launch = cuda::indexer_gather_quantized_launch(
            &self.config,
            self.cache.as_ptr() as u64,
            &VectorDesc::from_slice(&self.table),
            &VectorDesc::new(got_codes.as_mut_ptr() as usize, got_codes.len()),
            &VectorDesc::new(got_scales.as_mut_ptr() as usize, got_scales.len()),
        );
        run(emu, launch.unwrap().unwrap());
        let what = format!("quantized indexer gather, {} tokens", self.tokens);
        assert!(got_codes == codes, "{what}: codes");
        assert_eq!(
            value_bytes(&got_scales),
            value_bytes(&scales),
            "{what}: scales"
        );
    }
}

#[test]
fn indexer_gathers_match_cpu_codec() {
    let emu = emulator_or_skip!();
    for (i, &tokens) in EMULATED_TOKEN_COUNTS.iter().enumerate() {
        let case = IndexerCase::new(tokens, 4000 + i as u64);
        case.check_gather(emu, f32::from_bits(0xDEAD_BEEF));
        case.check_gather(emu, bf16::from_bits(0xBEEF));
        case.check_gather_quantized(emu);
    }
}

#[test]
fn indexer_copy_blocks_copies_every_layer() {
    let emu = emulator_or_skip!();
    let mut config = indexer_config(300);
    config.num_layers = 3;
    config.num_blocks = 12;
    let block_bytes = config.block_size * 132;
    let stride = (config.num_blocks * block_bytes).next_multiple_of(256);
    let mut layers = RandomLayers::new(stride, 10);
    let base = layers.base();
    for launch in cuda::indexer_copy_blocks_launches(&config, base, stride, &COPY_PAIRS).unwrap() {
        run(emu, launch);
    }
    layers.assert_copied(block_bytes, "indexer copy_blocks");
    let plain = CacheConfig {
        indexer: None,
        ..config
    };
    assert!(
        cuda::indexer_copy_blocks_launches(&plain, base, stride, &COPY_PAIRS)
            .unwrap()
            .is_empty()
    );
}
