//! Latent stores: write, gather and copy latents on host or GPU memory.

use std::ffi::c_void;
use std::sync::Arc;

use super::config::{info, CONFIGS};
use super::types::{elem_from, MlaBlockCopy, MlaDtype};
use super::{
    guard, input, Failure, FfiResult, MlaBlockId, MlaConfig, MlaConfigInfo, MlaStatus, Out,
    Registry,
};
use mla_cache::codec::TokenLayout;
use mla_cache::store::{
    Device, HostStore, HostStoreOptions, LatentStore, MatrixDesc, Part, Stream, VectorDesc,
};
use mla_cache::tier::BlockTransfer;
use mla_cache::CacheConfig;

/// A latent store (opaque): the cached latents of every layer, laid out per
/// layer as `[num_blocks][block_size][bytes_per_token]`. Thread-safe;
/// operations on one layer are ordered by the store.
pub struct MlaStore {
    pub(crate) inner: Arc<dyn LatentStore>,
    /// The same store, for whole-block copies by a tiered cache.
    pub(crate) blocks: Arc<dyn BlockTransfer>,
}

/// A store, seen as latents and as whole blocks.
type Shared = (Arc<dyn LatentStore>, Arc<dyn BlockTransfer>);

/// Shares a freshly created store as both views.
fn shared<S: LatentStore + BlockTransfer + 'static>(s: S) -> Shared {
    let s = Arc::new(s);
    (s.clone(), s)
}

pub(crate) static STORES: Registry<MlaStore> = Registry::new("MlaStore");

/// A 2-D tensor in the store's memory space (host memory for a host store,
/// device memory for a CUDA store): `rows` rows of `cols` elements of type
/// `elem` (an `MlaElemType` value), rows `row_stride` bytes apart (0 means
/// contiguous, `cols * element size`), elements within a row contiguous.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaMatrix {
    /// Address of element `[0][0]`; may be NULL only when the tensor is empty.
    pub data: *mut c_void,
    /// Element type, an `MlaElemType` value.
    pub elem: u32,
    /// Rows (tokens).
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// Bytes from one row to the next; 0 for contiguous rows.
    pub row_stride: usize,
}

/// Where a store keeps its latents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MlaDeviceKind {
    /// Host memory.
    Host = 0,
    /// A CUDA device (see `device_ordinal`).
    Cuda = 1,
}

/// Where the parts of one encoded latent lie, in bytes.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaTokenLayout {
    /// Bytes of one encoded latent.
    pub bytes_per_token: usize,
    /// Bytes of NoPE codes, from offset 0.
    pub nope_bytes: usize,
    /// Offset of the first scale.
    pub scales_offset: usize,
    /// Number of scales (0 for bf16).
    pub num_scales: usize,
    /// Bytes per scale: 4 (fp32) for fp8_ds_mla, 1 (UE8M0) for mxfp6, 1
    /// (e4m3) for nvfp4_ds_mla.
    pub scale_bytes: usize,
    /// Offset of the RoPE values (bf16; e4m3 in nvfp4_ds_mla).
    pub rope_offset: usize,
}

/// The raw memory of one layer, for attention kernels that read the cache
/// in place: a `[num_blocks][block_size][bytes_per_token]` byte tensor.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaLayerView {
    /// Address of the layer's first byte (host or device memory); valid
    /// until the store is destroyed. Reads and writes through it bypass the
    /// store's ordering.
    pub data: *mut c_void,
    /// Memory space of `data`.
    pub device_kind: MlaDeviceKind,
    /// CUDA device ordinal (0 for host memory).
    pub device_ordinal: usize,
    /// Storage format.
    pub dtype: MlaDtype,
    /// `[num_blocks, block_size, bytes_per_token]`.
    pub shape: [usize; 3],
    /// Byte strides of the three dimensions.
    pub strides: [usize; 3],
    /// Bytes of the layer (`shape[0] * shape[1] * shape[2]`).
    pub len_bytes: usize,
    /// Layout of one encoded latent.
    pub layout: MlaTokenLayout,
}

fn layout(l: TokenLayout) -> MlaTokenLayout {
    MlaTokenLayout {
        bytes_per_token: l.bytes_per_token,
        nope_bytes: l.nope_bytes,
        scales_offset: l.scales_offset,
        num_scales: l.num_scales,
        scale_bytes: l.scale_bytes,
        rope_offset: l.rope_offset,
    }
}

fn device(d: Device) -> (MlaDeviceKind, usize) {
    match d {
        Device::Host => (MlaDeviceKind::Host, 0),
        Device::Cuda(ordinal) => (MlaDeviceKind::Cuda, ordinal),
    }
}

/// The raw memory of one layer's indexer keys (DeepSeek-V3.2), for the
/// indexer's kernels: `[num_blocks][block_size][head_dim + 4]` bytes, each
/// block holding every token's `head_dim` e4m3 codes first, then every
/// token's fp32 scale.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaIndexerView {
    /// Address of the layer's first indexer byte (host or device memory);
    /// valid until the store is destroyed. Accesses bypass the store's ordering.
    pub data: *mut c_void,
    /// Memory space of `data`.
    pub device_kind: MlaDeviceKind,
    /// CUDA device ordinal (0 for host memory).
    pub device_ordinal: usize,
    /// Values per key.
    pub head_dim: usize,
    /// `[num_blocks, block_size, head_dim + 4]`.
    pub shape: [usize; 3],
    /// Byte strides of the three dimensions.
    pub strides: [usize; 3],
    /// Bytes of the layer's indexer keys.
    pub len_bytes: usize,
}

/// Converts a C matrix descriptor; the store checks shapes and types.
///
/// # Safety
/// A non-null `m` must point to a valid `MlaMatrix`.
unsafe fn matrix(m: *const MlaMatrix, what: &str) -> FfiResult<MatrixDesc> {
    // SAFETY: per the contract.
    let m = unsafe { m.as_ref() }.ok_or_else(|| Failure::null(what))?;
    let elem = elem_from(m.elem, what)?;
    if m.data.is_null() && m.rows > 0 && m.cols > 0 {
        return Err(Failure::null(&format!("{what}->data")));
    }
    let row_stride = match m.row_stride {
        0 => m
            .cols
            .checked_mul(elem.size())
            .ok_or_else(|| Failure::invalid(format!("{what}: row size overflows")))?,
        s => s,
    };
    Ok(MatrixDesc {
        addr: m.data as usize,
        elem,
        rows: m.rows,
        cols: m.cols,
        row_stride,
    })
}

/// The block table of a gather (`num_block_ids` ids at `block_table`).
fn block_table(
    block_table: *const MlaBlockId,
    num_block_ids: usize,
) -> FfiResult<VectorDesc<MlaBlockId>> {
    if block_table.is_null() && num_block_ids > 0 {
        return Err(Failure::null("block_table"));
    }
    Ok(VectorDesc::new(block_table as usize, num_block_ids))
}

/// A write of `part` (`mla_store_write`, `mla_store_write_indexer`): the
/// C descriptors `rows`, each with its argument's name, then the slots.
///
/// # Safety
/// As for `mla_store_write`.
unsafe fn write_part(
    store: *const MlaStore,
    part: Part,
    layer: usize,
    rows: &[(*const MlaMatrix, &str)],
    slot_mapping: *const i64,
    num_slots: usize,
    stream: *mut c_void,
) -> FfiResult<()> {
    let rows = rows
        .iter()
        // SAFETY: per the contract.
        .map(|&(m, name)| unsafe { matrix(m, name) })
        .collect::<FfiResult<Vec<_>>>()?;
    if slot_mapping.is_null() && num_slots > 0 {
        return Err(Failure::null("slot_mapping"));
    }
    let slots = VectorDesc::new(slot_mapping as usize, num_slots);
    STORES.with(store, |s| {
        // SAFETY: per the contract.
        Ok(unsafe {
            s.inner
                .write_part_raw(part, layer, &rows, slots, Stream(stream as usize))
        }?)
    })
}

/// A gather of `part` (`mla_store_gather`, `mla_store_gather_indexer`).
///
/// # Safety
/// As for `mla_store_gather`.
unsafe fn gather_part(
    store: *const MlaStore,
    part: Part,
    layer: usize,
    block_table_ids: *const MlaBlockId,
    num_block_ids: usize,
    out: *const MlaMatrix,
    stream: *mut c_void,
) -> FfiResult<()> {
    // SAFETY: per the contract.
    let out = unsafe { matrix(out, "out") }?;
    let table = block_table(block_table_ids, num_block_ids)?;
    STORES.with(store, |s| {
        // SAFETY: per the contract.
        Ok(unsafe {
            s.inner
                .gather_part_raw(part, layer, table, out, Stream(stream as usize))
        }?)
    })
}

fn create(
    config: *const MlaConfig,
    out: *mut *mut MlaStore,
    make: impl FnOnce(&CacheConfig) -> FfiResult<Shared>,
) -> FfiResult<()> {
    let out = Out::new(out, "out")?;
    let config = CONFIGS.with(config, |c| Ok(c.get()))?;
    let (inner, blocks) = make(&config)?;
    // SAFETY: `out` was checked; valid for a write per the caller's contract.
    unsafe { out.set(STORES.register(MlaStore { inner, blocks })) };
    Ok(())
}

/// Creates a zeroed store in host memory for a configuration (copied).
/// With `huge_pages`, backs it with huge pages where the system allows
/// (Linux), else regular pages. Fails with `MLA_STATUS_INVALID_CONFIG`,
/// `MLA_STATUS_OUT_OF_MEMORY` when the system has no memory for it, or
/// `MLA_STATUS_STORAGE` when the mapping fails otherwise.
///
/// # Safety
/// `out` must be valid for a write; `*out` receives the new handle.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_create_host(
    config: *const MlaConfig,
    huge_pages: bool,
    out: *mut *mut MlaStore,
) -> MlaStatus {
    guard("mla_store_create_host", || {
        create(config, out, |c| {
            let store = HostStore::with_options(c, HostStoreOptions { huge_pages })?;
            Ok(shared(store))
        })
    })
}

/// Creates a zeroed store in the memory of CUDA device `device_ordinal`;
/// its kernels are compiled by NVRTC for the device on first use. Fails
/// with `MLA_STATUS_UNSUPPORTED` when the library is built without its
/// `cuda` feature, with `MLA_STATUS_STORAGE` when there is no driver, no
/// such device, no libnvrtc or not enough device memory, and with
/// `MLA_STATUS_INVALID_CONFIG` for an invalid configuration (or one whose
/// `bytes_per_token` is not a multiple of 4).
///
/// A CUDA store defines what it cannot check without synchronizing: slots
/// at or past `num_blocks * block_size` are skipped like negative ones, and
/// block ids past the cache gather rows of zeros.
///
/// # Safety
/// `out` must be valid for a write; `*out` receives the new handle.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_create_cuda(
    config: *const MlaConfig,
    device_ordinal: usize,
    out: *mut *mut MlaStore,
) -> MlaStatus {
    guard("mla_store_create_cuda", || {
        create(config, out, |c| cuda_store(c, device_ordinal))
    })
}

#[cfg(feature = "cuda")]
fn cuda_store(config: &CacheConfig, ordinal: usize) -> FfiResult<Shared> {
    Ok(shared(mla_cache::store::CudaStore::new(config, ordinal)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_store(config: &CacheConfig, ordinal: usize) -> FfiResult<Shared> {
    config.validate()?;
    Err(Failure::new(
        MlaStatus::Unsupported,
        format!("no CUDA store for device {ordinal}: mla_cache was built without its cuda feature"),
    ))
}

/// Destroys a store and frees its memory (views into it become invalid).
///
/// # Safety
/// `store` must not be used after this call.
///
/// Thread safety: waits for calls in flight on this handle; calls made
/// after it fail with `MLA_STATUS_INVALID_HANDLE`.
#[no_mangle]
pub unsafe extern "C" fn mla_store_destroy(store: *mut MlaStore) -> MlaStatus {
    guard("mla_store_destroy", || STORES.destroy(store))
}

/// Reads the store's configuration.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_get_config(
    store: *const MlaStore,
    out: *mut MlaConfigInfo,
) -> MlaStatus {
    guard("mla_store_get_config", || {
        let out = Out::new(out, "out")?;
        let config = STORES.with(store, |s| Ok(info(s.inner.config())))?;
        // SAFETY: per the contract.
        unsafe { out.set(config) };
        Ok(())
    })
}

/// Quantizes and stores `num_slots` tokens of layer `layer`: row `t` of
/// `c_kv` (`[num_slots, kv_lora_rank]`) and of `k_pe` (`[num_slots,
/// rope_dim]`), bf16, fp16 or fp32, goes to slot `slot_mapping[t]`
/// (`block_id * block_size + offset`); negative slots are skipped. All
/// three arrays live in the store's memory space. A CUDA store enqueues the
/// work on `stream` (a `CUstream`, NULL for the legacy default stream)
/// without synchronizing; a host store ignores `stream` and is done on return.
///
/// # Safety
/// The descriptors must describe readable memory of the store's memory
/// space; `slot_mapping` must hold `num_slots` values. On a CUDA store they
/// must stay valid until the stream reaches the work.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_write(
    store: *const MlaStore,
    layer: usize,
    c_kv: *const MlaMatrix,
    k_pe: *const MlaMatrix,
    slot_mapping: *const i64,
    num_slots: usize,
    stream: *mut c_void,
) -> MlaStatus {
    guard("mla_store_write", || {
        let rows = [(c_kv, "c_kv"), (k_pe, "k_pe")];
        // SAFETY: per the contract.
        unsafe {
            write_part(
                store,
                Part::Latent,
                layer,
                &rows,
                slot_mapping,
                num_slots,
                stream,
            )
        }
    })
}

/// Decodes the first `out->rows` tokens of a sequence from layer `layer`
/// into `out` (`[tokens, kv_lora_rank + rope_dim]`, bf16 or fp32, NoPE then
/// RoPE), reading token `p` from block `block_table[p / block_size]`.
/// `block_table` (at least `ceil(rows / block_size)` ids) and `out` live in
/// the store's memory space; `stream` as for `mla_store_write`.
///
/// # Safety
/// `block_table` must hold `num_block_ids` ids and `out` describe writable
/// memory, both in the store's memory space (and valid until the stream
/// reaches the work, on a CUDA store).
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_gather(
    store: *const MlaStore,
    layer: usize,
    block_table: *const MlaBlockId,
    num_block_ids: usize,
    out: *const MlaMatrix,
    stream: *mut c_void,
) -> MlaStatus {
    guard("mla_store_gather", || {
        // SAFETY: per the contract.
        unsafe {
            gather_part(
                store,
                Part::Latent,
                layer,
                block_table,
                num_block_ids,
                out,
                stream,
            )
        }
    })
}

/// Performs the block copies returned by `mla_manager_append`, in every
/// layer: block `dst` becomes a copy of block `src`. A destination may
/// appear only once and never as a source (`MLA_STATUS_INVALID_ARGUMENT`);
/// ids must be below `num_blocks` (`MLA_STATUS_INVALID_BLOCK`). `copies`
/// is host memory; `stream` as for `mla_store_write`.
///
/// # Safety
/// `copies` must hold `num_copies` pairs.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_copy_blocks(
    store: *const MlaStore,
    copies: *const MlaBlockCopy,
    num_copies: usize,
    stream: *mut c_void,
) -> MlaStatus {
    guard("mla_store_copy_blocks", || {
        // SAFETY: per the contract.
        let copies = unsafe { input(copies, num_copies, "copies") }?;
        let pairs: Vec<(MlaBlockId, MlaBlockId)> = copies.iter().map(|c| (c.src, c.dst)).collect();
        STORES.with(store, |s| {
            Ok(s.inner.copy_blocks(&pairs, Stream(stream as usize))?)
        })
    })
}

/// Describes the raw memory of layer `layer`, for kernels that read the
/// cache in place (FlashMLA's paged KV cache is such a tensor).
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_layer_view(
    store: *const MlaStore,
    layer: usize,
    out: *mut MlaLayerView,
) -> MlaStatus {
    guard("mla_store_layer_view", || {
        let out = Out::new(out, "out")?;
        let view = STORES.with(store, |s| Ok(s.inner.layer_view(layer)?))?;
        let (device_kind, device_ordinal) = device(view.device);
        let view = MlaLayerView {
            data: view.addr as *mut c_void,
            device_kind,
            device_ordinal,
            dtype: view.dtype.into(),
            shape: view.shape,
            strides: view.strides,
            len_bytes: view.len_bytes(),
            layout: layout(view.layout),
        };
        // SAFETY: per the contract.
        unsafe { out.set(view) };
        Ok(())
    })
}

/// Quantizes and stores `num_slots` indexer keys of layer `layer` (vLLM's
/// `indexer_k_quant_and_cache`): row `t` of `keys` (`[num_slots,
/// head_dim]`, bf16, fp16 or fp32) goes to slot `slot_mapping[t]`;
/// negative slots are skipped. Fails with `MLA_STATUS_INVALID_ARGUMENT`
/// when the configuration has no indexer. Memory spaces and `stream` as for
/// `mla_store_write`.
///
/// # Safety
/// As for `mla_store_write`.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_write_indexer(
    store: *const MlaStore,
    layer: usize,
    keys: *const MlaMatrix,
    slot_mapping: *const i64,
    num_slots: usize,
    stream: *mut c_void,
) -> MlaStatus {
    guard("mla_store_write_indexer", || {
        let rows = [(keys, "keys")];
        // SAFETY: per the contract.
        unsafe {
            write_part(
                store,
                Part::Indexer,
                layer,
                &rows,
                slot_mapping,
                num_slots,
                stream,
            )
        }
    })
}

/// Dequantizes the indexer keys of the first `out->rows` tokens of a
/// sequence from layer `layer` into `out` (`[tokens, head_dim]`, bf16 or
/// fp32), through `block_table` as `mla_store_gather` reads it.
///
/// # Safety
/// As for `mla_store_gather`.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_gather_indexer(
    store: *const MlaStore,
    layer: usize,
    block_table: *const MlaBlockId,
    num_block_ids: usize,
    out: *const MlaMatrix,
    stream: *mut c_void,
) -> MlaStatus {
    guard("mla_store_gather_indexer", || {
        // SAFETY: per the contract.
        unsafe {
            gather_part(
                store,
                Part::Indexer,
                layer,
                block_table,
                num_block_ids,
                out,
                stream,
            )
        }
    })
}

/// Copies the stored indexer keys of the first `num_tokens` tokens of a
/// sequence without dequantizing: token `t`'s `head_dim` e4m3 codes to
/// `codes + t * head_dim` and its fp32 scale to `scales[t]`.
///
/// # Safety
/// `block_table` must hold `num_block_ids` ids, `codes` `num_tokens *
/// head_dim` writable bytes and `scales` `num_tokens` writable floats, all
/// in the store's memory space (valid until the stream reaches the work,
/// on a CUDA store).
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_gather_indexer_quantized(
    store: *const MlaStore,
    layer: usize,
    block_table: *const MlaBlockId,
    num_block_ids: usize,
    codes: *mut u8,
    scales: *mut f32,
    num_tokens: usize,
    stream: *mut c_void,
) -> MlaStatus {
    guard("mla_store_gather_indexer_quantized", || {
        let table = self::block_table(block_table, num_block_ids)?;
        STORES.with(store, |s| {
            let head_dim = s.inner.config().indexer.map_or(0, |i| i.head_dim);
            let codes = VectorDesc::new(codes as usize, num_tokens.saturating_mul(head_dim));
            let scales = VectorDesc::new(scales as usize, num_tokens);
            Ok(unsafe {
                s.inner.gather_indexer_quantized_raw(
                    layer,
                    table,
                    codes,
                    scales,
                    Stream(stream as usize),
                )
            }?)
        })
    })
}

/// Describes the raw memory of layer `layer`'s indexer keys; fails with
/// `MLA_STATUS_INVALID_ARGUMENT` when the configuration has no indexer.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_store_indexer_view(
    store: *const MlaStore,
    layer: usize,
    out: *mut MlaIndexerView,
) -> MlaStatus {
    guard("mla_store_indexer_view", || {
        let out = Out::new(out, "out")?;
        let view = STORES.with(store, |s| Ok(s.inner.indexer_view(layer)?))?;
        let (device_kind, device_ordinal) = device(view.device);
        let view = MlaIndexerView {
            data: view.addr as *mut c_void,
            device_kind,
            device_ordinal,
            head_dim: view.head_dim,
            shape: view.shape,
            strides: view.strides,
            len_bytes: view.len_bytes(),
        };
        // SAFETY: per the contract.
        unsafe { out.set(view) };
        Ok(())
    })
}
