//! The CUDA store on a GPU, against the CPU codec (the host store) bit for
//! bit: every format and input type, odd token counts, negative slots
//! (untouched bytes), gathers to bf16 and f32, copy_blocks. Without a GPU
//! (or libcuda, or libnvrtc) the tests print a skip message and pass, unless
//! `MLA_CACHE_REQUIRE_GPU=1`; either way, constructing the store must fail
//! with an error, not a panic.
#![cfg(feature = "cuda")]

mod cuda_common;

use std::path::PathBuf;
use std::sync::Arc;

use cuda_common::*;
use cudarc::driver::result::stream::StreamKind;
use cudarc::driver::{result as cu, sys, CudaContext};
use half::bf16;
use mla_cache::codec::ElemType;
use mla_cache::store::cuda;
use mla_cache::store::{CudaStore, Device, HostStore, LatentStore, MatrixDesc, Stream, VectorDesc};
use mla_cache::{BlockId, CacheConfig, Dtype, Error};

fn gpu_required() -> bool {
    std::env::var("MLA_CACHE_REQUIRE_GPU").as_deref() == Ok("1")
}

/// Loads libnvrtc from the project's `.venv` when nothing else provides it.
fn find_nvrtc() {
    if cuda::nvrtc_available() {
        return;
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let dir = std::fs::read_dir(lib)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("site-packages/nvidia/cuda_nvrtc/lib"))
        .find(|d| d.is_dir());
    if let Some(dir) = dir {
        cuda::preload_nvrtc(&dir).unwrap();
    }
}

/// A store on device 0, or `None` (skip) without a usable GPU.
fn store_or_skip(config: &CacheConfig) -> Option<CudaStore> {
    find_nvrtc();
    match CudaStore::new(config, 0) {
        Ok(store) => Some(store),
        Err(e) => {
            assert!(
                matches!(e, Error::Storage(_)),
                "expected a storage error, got {e:?}"
            );
            if gpu_required() {
                panic!("MLA_CACHE_REQUIRE_GPU=1 but no CUDA store: {e}");
            }
            eprintln!("skipping the CUDA store test: {e}");
            None
        }
    }
}

/// Device memory and a stream for one test. The stream is a blocking one:
/// it orders after the synchronous copies and memsets (legacy default
/// stream), which may still be in flight when they return.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
}

impl Gpu {
    fn new() -> Self {
        let ctx = CudaContext::new(0).unwrap();
        ctx.bind_to_thread().unwrap();
        let stream = cu::stream::create(StreamKind::Default).unwrap();
        Gpu { ctx, stream }
    }

    fn stream(&self) -> Stream {
        Stream(self.stream as usize)
    }

    fn sync(&self) {
        // SAFETY: our live stream.
        unsafe { cu::stream::synchronize(self.stream) }.unwrap();
    }

    fn upload(&self, bytes: &[u8]) -> DevBuf {
        self.ctx.bind_to_thread().unwrap();
        // SAFETY: a fresh allocation of the right size, filled synchronously.
        let ptr = unsafe { cu::malloc_sync(bytes.len().max(1)) }.unwrap();
        unsafe { cu::memcpy_htod_sync(ptr, bytes) }.unwrap();
        DevBuf {
            ptr,
            len: bytes.len(),
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: our stream, no longer used.
        unsafe { cu::stream::destroy(self.stream) }.unwrap();
    }
}

struct DevBuf {
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DevBuf {
    fn addr(&self) -> usize {
        self.ptr as usize
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `upload`, freed once.
        unsafe { cu::free_sync(self.ptr) }.unwrap();
    }
}

/// `len` bytes of device memory at `addr`.
fn download(addr: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: the caller names device memory of at least `len` bytes.
    unsafe { cu::memcpy_dtoh_sync(&mut out, addr as sys::CUdeviceptr) }.unwrap();
    out
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain-old-data values viewed as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

#[test]
fn without_a_gpu_construction_fails_cleanly() {
    // Runs everywhere: on a machine without a GPU this is the whole check.
    let config = CacheConfig::new(4);
    match CudaStore::new(&config, 0) {
        Ok(store) => assert_eq!(store.device(), Device::Cuda(0)),
        Err(Error::Storage(msg)) => assert!(!msg.is_empty()),
        Err(e) => panic!("unexpected error {e:?}"),
    }
    // A device that does not exist is an error, never a panic.
    assert!(matches!(
        CudaStore::new(&config, 4096),
        Err(Error::Storage(_))
    ));
}

fn write_case(
    store: &CudaStore,
    gpu: &Gpu,
    ckv_elem: ElemType,
    kpe_elem: ElemType,
    tokens: usize,
    seed: u64,
) {
    let config = store.config().clone();
    let dtype = config.dtype;
    let mut rng = rng(seed);
    let c_kv = sample(&mut rng, ckv_elem, tokens * config.kv_lora_rank, true);
    let k_pe = sample(&mut rng, kpe_elem, tokens * config.rope_dim, true);
    let slots = slot_mapping(&mut rng, tokens, config.num_tokens());
    let host = HostStore::new(&config).unwrap();
    host.write(1, c_kv.values(), k_pe.values(), &slots).unwrap();

    let view = store.layer_view(1).unwrap();
    // SAFETY: the layer's memory, before any work on it is enqueued.
    unsafe { cu::memset_d8_sync(view.addr as sys::CUdeviceptr, FILL, view.len_bytes()) }.unwrap();
    let d_ckv = gpu.upload(c_kv.bytes());
    let d_kpe = gpu.upload(k_pe.bytes());
    let d_slots = gpu.upload(as_bytes(&slots));
    // SAFETY: device buffers alive until the stream is synchronized below.
    unsafe {
        store
            .write_raw(
                1,
                c_kv.desc_at(d_ckv.addr(), tokens, config.kv_lora_rank),
                k_pe.desc_at(d_kpe.addr(), tokens, config.rope_dim),
                VectorDesc::new(d_slots.addr(), slots.len()),
                gpu.stream(),
            )
            .unwrap();
    }
    gpu.sync();
    let got = download(view.addr, view.len_bytes());
    let what = format!("GPU write {dtype} from c_kv {ckv_elem} / k_pe {kpe_elem}, {tokens} tokens");
    check_layer(&what, &got, &layer_bytes(&host, 1), &slots, view.shape[2]);
}

#[test]
fn write_matches_cpu_codec() {
    for dtype in Dtype::ALL {
        let config = config(dtype, *TOKEN_COUNTS.iter().max().unwrap());
        let Some(store) = store_or_skip(&config) else {
            return;
        };
        let gpu = Gpu::new();
        for elem in ElemType::ALL {
            for (i, &tokens) in TOKEN_COUNTS.iter().enumerate() {
                write_case(&store, &gpu, elem, elem, tokens, 1000 + i as u64);
            }
        }
        write_case(&store, &gpu, ElemType::F32, ElemType::Bf16, 65, 7);
        write_case(&store, &gpu, ElemType::Bf16, ElemType::F16, 3, 8);
    }
}

fn gather_case(store: &CudaStore, gpu: &Gpu, tokens: usize, seed: u64) {
    let config = store.config().clone();
    let dtype = config.dtype;
    let mut rng = rng(seed);
    let all = config.num_tokens();
    let c_kv = sample(&mut rng, ElemType::F32, all * config.kv_lora_rank, true);
    let k_pe = sample(&mut rng, ElemType::Bf16, all * config.rope_dim, true);
    let slots: Vec<i64> = (0..all as i64).collect();
    let host = HostStore::new(&config).unwrap();
    host.write(0, c_kv.values(), k_pe.values(), &slots).unwrap();
    let bytes = layer_bytes(&host, 0);
    let view = store.layer_view(0).unwrap();
    // SAFETY: the layer's memory, `bytes` has its size; nothing is in flight.
    unsafe { cu::memcpy_htod_sync(view.addr as sys::CUdeviceptr, &bytes) }.unwrap();
    let table = block_table(&mut rng, config.num_blocks);
    let d_table = gpu.upload(as_bytes(&table));
    let width = config.elements_per_token();

    for elem in [ElemType::F32, ElemType::Bf16] {
        let size = elem.size();
        let d_out = gpu.upload(&vec![FILL; tokens * width * size]);
        let out = MatrixDesc::contiguous(d_out.addr(), elem, tokens, width);
        // SAFETY: device buffers alive until the stream is synchronized.
        unsafe {
            store.gather_raw(
                0,
                VectorDesc::new(d_table.addr(), table.len()),
                out,
                gpu.stream(),
            )
        }
        .unwrap();
        gpu.sync();
        let got = download(d_out.addr(), d_out.len);
        let expected: Vec<u8> = match elem {
            ElemType::F32 => as_bytes(&host.gather_f32(0, &table, tokens).unwrap()).to_vec(),
            _ => as_bytes::<bf16>(&host.gather_bf16(0, &table, tokens).unwrap()).to_vec(),
        };
        check_decoded(
            &format!("GPU gather {dtype} -> {elem}, {tokens} tokens"),
            &got,
            &expected,
            size,
            width,
        );
    }
}

#[test]
fn gather_matches_cpu_codec() {
    for dtype in Dtype::ALL {
        let config = config(dtype, *TOKEN_COUNTS.iter().max().unwrap());
        let Some(store) = store_or_skip(&config) else {
            return;
        };
        let gpu = Gpu::new();
        for (i, &tokens) in TOKEN_COUNTS.iter().enumerate() {
            gather_case(&store, &gpu, tokens, 2000 + i as u64);
        }
    }
}

#[test]
fn copy_blocks_copies_every_layer() {
    for dtype in Dtype::ALL {
        let mut config = config(dtype, 300);
        config.num_layers = 3;
        config.num_blocks = 12;
        let Some(store) = store_or_skip(&config) else {
            return;
        };
        let gpu = Gpu::new();
        let mut rng = rng(9);
        let mut layers: Vec<Vec<u8>> = Vec::new();
        for layer in 0..3 {
            let view = store.layer_view(layer).unwrap();
            let bytes: Vec<u8> = (0..view.len_bytes())
                .map(|_| rand::Rng::gen(&mut rng))
                .collect();
            // SAFETY: the layer's memory; nothing is in flight.
            unsafe { cu::memcpy_htod_sync(view.addr as sys::CUdeviceptr, &bytes) }.unwrap();
            layers.push(bytes);
        }
        // More pairs than one launch carries.
        let mut pairs: Vec<(BlockId, BlockId)> = vec![(1, 7), (0, 3), (11, 2)];
        store.copy_blocks(&pairs, gpu.stream()).unwrap();
        gpu.sync();
        let block_bytes = config.block_size * config.bytes_per_token_per_layer();
        for (layer, expected) in layers.iter_mut().enumerate() {
            for &(src, dst) in &pairs {
                let s = src as usize * block_bytes;
                expected.copy_within(s..s + block_bytes, dst as usize * block_bytes);
            }
            let view = store.layer_view(layer).unwrap();
            let got = download(view.addr, view.len_bytes());
            assert!(
                got == *expected,
                "GPU copy_blocks {dtype}: layer {layer} differs"
            );
        }
        pairs.push((3, 3));
        assert!(
            store.copy_blocks(&pairs, gpu.stream()).is_err(),
            "a block both source and destination"
        );
        assert!(matches!(
            store.copy_blocks(&[(0, 12)], gpu.stream()),
            Err(Error::InvalidBlock(12))
        ));
    }
}

#[test]
fn many_pairs_span_several_launches() {
    let mut config = config(Dtype::Mxfp6, 64);
    config.block_size = 1;
    config.num_blocks = 2000;
    config.num_layers = 2;
    let Some(store) = store_or_skip(&config) else {
        return;
    };
    let gpu = Gpu::new();
    let mut rng = rng(10);
    let view = store.layer_view(1).unwrap();
    let bytes: Vec<u8> = (0..view.len_bytes())
        .map(|_| rand::Rng::gen(&mut rng))
        .collect();
    // SAFETY: the layer's memory; nothing is in flight.
    unsafe { cu::memcpy_htod_sync(view.addr as sys::CUdeviceptr, &bytes) }.unwrap();
    let pairs: Vec<(BlockId, BlockId)> = (0..1000).map(|i| (i, i + 1000)).collect();
    store.copy_blocks(&pairs, gpu.stream()).unwrap();
    gpu.sync();
    let got = download(view.addr, view.len_bytes());
    let bpt = view.shape[2];
    assert_eq!(
        got[1000 * bpt..],
        bytes[..1000 * bpt],
        "blocks 1000.. are copies of 0.."
    );
    assert_eq!(got[..1000 * bpt], bytes[..1000 * bpt], "sources unchanged");
}

#[test]
fn layer_views_and_argument_errors() {
    let config = config(Dtype::Fp8DsMla, 64);
    let Some(store) = store_or_skip(&config) else {
        return;
    };
    let v0 = store.layer_view(0).unwrap();
    let v1 = store.layer_view(1).unwrap();
    assert_eq!(v0.device, Device::Cuda(0));
    assert_eq!(v0.shape, [config.num_blocks, 64, 656]);
    assert_eq!(v0.addr as u64, store.layer_ptr(0).unwrap());
    assert!(v1.addr >= v0.addr + v0.len_bytes());
    assert_eq!(v0.addr % 256, 0);
    assert!(matches!(
        store.layer_view(2),
        Err(Error::InvalidArgument(_))
    ));
    let gpu = Gpu::new();
    let slots = VectorDesc::<i64>::new(0, 0);
    let empty = MatrixDesc::contiguous(0, ElemType::F32, 0, 512);
    let empty_pe = MatrixDesc::contiguous(0, ElemType::F32, 0, 64);
    // SAFETY: nothing is read: zero tokens, or rejected arguments.
    unsafe {
        store
            .write_raw(0, empty, empty_pe, slots, gpu.stream())
            .unwrap();
        assert!(store
            .write_raw(2, empty, empty_pe, slots, gpu.stream())
            .is_err());
        let bad = MatrixDesc::contiguous(0, ElemType::F32, 0, 500);
        assert!(store
            .write_raw(0, bad, empty_pe, slots, gpu.stream())
            .is_err());
    }
}

/// Whole blocks out of and into the device, then a tiered cache over the
/// CUDA store: blocks go down to host memory on commit and come back byte
/// for byte after the device copies were zeroed.
#[test]
fn whole_blocks_move_between_device_and_host_tier() {
    use mla_cache::tier::{BlockTransfer, HostTier, TierOptions, TieredCache};
    use mla_cache::{AdmitOptions, BlockManager};

    for dtype in Dtype::ALL {
        let mut config = config(dtype, 300);
        config.num_layers = 3;
        config.num_blocks = 12;
        config.block_size = 4;
        let Some(store) = store_or_skip(&config) else {
            return;
        };
        let store = Arc::new(store);
        let gpu = Gpu::new();
        let mut rng = rng(11);
        let per_layer = config.block_size * config.bytes_per_token_per_layer();
        let mut layers: Vec<Vec<u8>> = Vec::new();
        for layer in 0..3 {
            let view = store.layer_view(layer).unwrap();
            let bytes: Vec<u8> = (0..view.len_bytes())
                .map(|_| rand::Rng::gen(&mut rng))
                .collect();
            // SAFETY: the layer's memory; nothing is in flight.
            unsafe { cu::memcpy_htod_sync(view.addr as sys::CUdeviceptr, &bytes) }.unwrap();
            layers.push(bytes);
        }
        let block_of = |layers: &[Vec<u8>], b: usize| -> Vec<u8> {
            layers
                .iter()
                .flat_map(|l| l[b * per_layer..(b + 1) * per_layer].to_vec())
                .collect()
        };
        let mut out = vec![0u8; BlockTransfer::block_bytes(&*store)];
        BlockTransfer::read_block(&*store, 5, &mut out, gpu.stream()).unwrap();
        assert!(out == block_of(&layers, 5), "{dtype}: read_block");
        BlockTransfer::write_block(&*store, 2, &out, gpu.stream()).unwrap();
        for (layer, bytes) in layers.iter_mut().enumerate() {
            bytes.copy_within(5 * per_layer..6 * per_layer, 2 * per_layer);
            let view = store.layer_view(layer).unwrap();
            assert!(
                download(view.addr, view.len_bytes()) == *bytes,
                "{dtype}: write_block layer {layer}"
            );
        }
        assert!(matches!(
            BlockTransfer::read_block(&*store, 12, &mut out, gpu.stream()),
            Err(Error::InvalidBlock(12))
        ));
        assert!(BlockTransfer::write_block(&*store, 0, &out[1..], gpu.stream()).is_err());

        let host = HostTier::new(out.len(), 16).unwrap();
        let tiers = TierOptions {
            host: Some(host),
            stream: gpu.stream(),
            ..TierOptions::default()
        };
        let cache = TieredCache::new(
            BlockManager::new(config.clone()).unwrap(),
            store.clone(),
            tiers,
        )
        .unwrap();
        let prompt: Vec<u32> = (0..13).collect();
        let chunked = AdmitOptions {
            chunked_prefill: true,
            ..AdmitOptions::default()
        };
        let a = cache.admit(1, &prompt, &chunked).unwrap();
        let before: Vec<Vec<u8>> = a.block_ids[..3]
            .iter()
            .map(|&b| block_of(&layers, b as usize))
            .collect();
        cache.commit(1, prompt.len()).unwrap();
        cache.free(1).unwrap();
        assert_eq!(
            cache.host().unwrap().stats().blocks,
            3,
            "{dtype}: written through on commit"
        );
        let other: Vec<u32> = (1000..1048).collect();
        cache.admit(2, &other, &AdmitOptions::default()).unwrap();
        cache.free(2).unwrap();
        for layer in 0..3 {
            let view = store.layer_view(layer).unwrap();
            // SAFETY: the layer's memory; nothing is in flight.
            unsafe { cu::memset_d8_sync(view.addr as sys::CUdeviceptr, 0, view.len_bytes()) }
                .unwrap();
        }
        let b = cache.admit(3, &prompt, &AdmitOptions::default()).unwrap();
        assert_eq!(b.hits.host_tokens, 12, "{dtype}");
        for (i, &block) in b.block_ids[..3].iter().enumerate() {
            BlockTransfer::read_block(&*store, block, &mut out, gpu.stream()).unwrap();
            assert!(out == before[i], "{dtype}: block {i} came back different");
        }
        assert_eq!(cache.stats().copy_errors, 0);
    }
}

/// DeepSeek-V3.2's indexer keys on the GPU against the host store, bit for
/// bit: writes from every input type, both gathers, copy_blocks and whole
/// blocks (latents then keys) out of and into the device.
#[test]
fn indexer_keys_match_the_host_store() {
    let tokens = *TOKEN_COUNTS.iter().max().unwrap();
    let config = CacheConfig {
        indexer: Some(mla_cache::IndexerGeometry::DEEPSEEK_V32),
        ..config(Dtype::Fp8DsMla, tokens)
    };
    let Some(store) = store_or_skip(&config) else {
        return;
    };
    let gpu = Gpu::new();
    let head_dim = 128;
    let view = store.indexer_view(1).unwrap();
    assert_eq!(view.shape, [config.num_blocks, 64, 132]);
    for (i, elem) in ElemType::ALL.into_iter().enumerate() {
        let mut rng = rng(5000 + i as u64);
        let keys = sample(&mut rng, elem, tokens * head_dim, true);
        let slots = slot_mapping(&mut rng, tokens, config.num_tokens());
        let host = HostStore::new(&config).unwrap();
        host.write_indexer(1, keys.values(), &slots).unwrap();
        // SAFETY: the layer's indexer memory, nothing in flight.
        unsafe { cu::memset_d8_sync(view.addr as sys::CUdeviceptr, 0, view.len_bytes()) }.unwrap();
        let d_keys = gpu.upload(keys.bytes());
        let d_slots = gpu.upload(as_bytes(&slots));
        // SAFETY: device buffers alive until the stream is synchronized below.
        unsafe {
            store
                .write_indexer_raw(
                    1,
                    keys.desc_at(d_keys.addr(), tokens, head_dim),
                    VectorDesc::new(d_slots.addr(), slots.len()),
                    gpu.stream(),
                )
                .unwrap();
        }
        gpu.sync();
        let expected = host.with_indexer_bytes(1, |b| b.to_vec()).unwrap();
        assert!(
            download(view.addr, view.len_bytes()) == expected,
            "GPU indexer write from {elem} differs from the host store"
        );

        let table = block_table(&mut rng, config.num_blocks);
        let d_table = gpu.upload(as_bytes(&table));
        let mut want = vec![0f32; tokens * head_dim];
        host.gather_indexer_into(1, &table, &mut want).unwrap();
        let d_out = gpu.upload(&vec![0u8; 4 * tokens * head_dim]);
        let (d_codes, d_scales) = (
            gpu.upload(&vec![0u8; tokens * head_dim]),
            gpu.upload(&vec![0u8; 4 * tokens]),
        );
        // SAFETY: device buffers alive until the stream is synchronized below.
        unsafe {
            store
                .gather_indexer_raw(
                    1,
                    VectorDesc::new(d_table.addr(), table.len()),
                    MatrixDesc::contiguous(d_out.addr(), ElemType::F32, tokens, head_dim),
                    gpu.stream(),
                )
                .unwrap();
            store
                .gather_indexer_quantized_raw(
                    1,
                    VectorDesc::new(d_table.addr(), table.len()),
                    VectorDesc::new(d_codes.addr(), tokens * head_dim),
                    VectorDesc::new(d_scales.addr(), tokens),
                    gpu.stream(),
                )
                .unwrap();
        }
        gpu.sync();
        assert!(
            download(d_out.addr(), d_out.len) == as_bytes(&want),
            "GPU indexer gather"
        );
        let (mut codes, mut scales) = (vec![0u8; tokens * head_dim], vec![0f32; tokens]);
        host.gather_indexer_quantized(1, &table, &mut codes, &mut scales)
            .unwrap();
        assert!(
            download(d_codes.addr(), d_codes.len) == codes,
            "GPU quantized codes"
        );
        assert!(download(d_scales.addr(), d_scales.len) == as_bytes(&scales));

        host.copy_blocks(&[(0, 2)], Stream::default()).unwrap();
        store.copy_blocks(&[(0, 2)], gpu.stream()).unwrap();
        gpu.sync();
        let expected = host.with_indexer_bytes(1, |b| b.to_vec()).unwrap();
        assert!(
            download(view.addr, view.len_bytes()) == expected,
            "GPU copy_blocks"
        );
    }
    // Whole blocks: the device's read_block equals the host store's layout.
    let host = HostStore::new(&config).unwrap();
    let mut out = vec![0u8; store.block_bytes()];
    store.read_block(2, &mut out, gpu.stream()).unwrap();
    host.write_block(2, &out).unwrap();
    let mut back = vec![0u8; host.block_bytes()];
    host.read_block(2, &mut back).unwrap();
    assert!(back == out);
    store.write_block(1, &out, gpu.stream()).unwrap();
    let mut again = vec![0u8; store.block_bytes()];
    store.read_block(1, &mut again, gpu.stream()).unwrap();
    assert!(again == out, "GPU write_block then read_block");
    assert!(store
        .write_block(1, &out[..out.len() - 1], gpu.stream())
        .is_err());
}
