//! Latent stores: the cached latents of every layer, on host or GPU memory.
//!
//! A store holds, per layer, `[num_blocks][block_size][bytes_per_token]`
//! bytes in one of the [`Dtype`] formats (see [`crate::codec`]), and, when
//! the configuration has an indexer (DeepSeek-V3.2), per layer
//! `[num_blocks][block_size x (head_dim + 4)]` bytes of indexer keys under
//! the same block ids ([`crate::codec::indexer_fp8`]).
//! Slot `s` of a layer is token `s % block_size` of block `s / block_size`.
//! Every backend implements [`LatentStore`], whose operations take raw
//! tensor descriptors ([`MatrixDesc`], [`VectorDesc`]) so that device
//! pointers work as well as host ones, plus a [`Stream`] that GPU backends
//! enqueue on (without synchronizing) and the host backend ignores.
//!
//! Every operation validates its arguments (layer, shapes, element types,
//! slots and block ids the backend can see) and returns an error, leaving the
//! store unchanged, instead of panicking.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;

#[cfg(feature = "cuda")]
pub use cuda::CudaStore;
pub use host::{HostStore, HostStoreOptions, PageKind};

use std::marker::PhantomData;

use crate::codec::{Codec, ElemType, IndexerCodec, TokenLayout};
use crate::config::{CacheConfig, Dtype, IndexerGeometry};
use crate::error::{Error, Result};
use crate::BlockId;

/// A CUDA stream (`CUstream`) as an integer; 0 is the legacy default
/// stream. Host stores ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Stream(pub usize);

/// Where a store keeps its latents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Host,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

/// Which part of a block an operation writes or reads: the latents, or
/// DeepSeek-V3.2's indexer keys, which live beside them under the same block
/// ids (only when the configuration has an indexer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// The latents (`c_kv` and `k_pe` of each token, in the storage format).
    Latent,
    /// The indexer keys (`head_dim` e4m3 codes and one fp32 scale per token).
    Indexer,
}

impl Part {
    /// The row inputs a write of this part takes, in order, as (name, values
    /// per row): `c_kv` and `k_pe`, or `keys`. Fails for the indexer part of
    /// a configuration without an indexer.
    pub fn write_inputs(self, config: &CacheConfig) -> Result<Vec<(&'static str, usize)>> {
        Ok(match self {
            Part::Latent => vec![("c_kv", config.kv_lora_rank), ("k_pe", config.rope_dim)],
            Part::Indexer => vec![("keys", check_indexer(config)?.head_dim)],
        })
    }

    /// Values per row of a gather of this part: `kv_lora_rank + rope_dim`,
    /// or the indexer's `head_dim`. Fails as [`Part::write_inputs`] does.
    pub fn gather_width(self, config: &CacheConfig) -> Result<usize> {
        match self {
            Part::Latent => Ok(config.elements_per_token()),
            Part::Indexer => Ok(check_indexer(config)?.head_dim),
        }
    }
}

/// A 2-D tensor in a store's memory space (host or device): `rows` rows of
/// `cols` elements of `elem`, consecutive rows `row_stride` bytes apart,
/// elements within a row contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixDesc {
    /// Address of element `[0, 0]`.
    pub addr: usize,
    /// Element type.
    pub elem: ElemType,
    /// Number of rows (tokens).
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// Bytes from one row to the next.
    pub row_stride: usize,
}

impl MatrixDesc {
    /// A row-major tensor without padding.
    pub fn contiguous(addr: usize, elem: ElemType, rows: usize, cols: usize) -> Self {
        Self {
            addr,
            elem,
            rows,
            cols,
            row_stride: cols * elem.size(),
        }
    }

    /// Checks the descriptor against the `rows x cols` shape an operation
    /// expects: element type among `allowed`, non-null and aligned when not
    /// empty, row stride a multiple of the element size that keeps rows from
    /// overlapping, and an extent that fits in the address space.
    pub(crate) fn check(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        allowed: &[ElemType],
    ) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("{name}: {m}")));
        if !allowed.contains(&self.elem) {
            let names: Vec<&str> = allowed.iter().map(|e| e.name()).collect();
            return bad(format!(
                "element type {} not supported (expected {})",
                self.elem,
                names.join(" or ")
            ));
        }
        if self.rows != rows || self.cols != cols {
            return bad(format!(
                "shape [{}, {}], expected [{rows}, {cols}]",
                self.rows, self.cols
            ));
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let size = self.elem.size();
        if self.addr == 0 {
            return bad("null address".into());
        }
        if self.addr % size != 0 || self.row_stride % size != 0 {
            return bad(format!(
                "address and row stride must be multiples of {size} bytes"
            ));
        }
        if rows > 1 && self.row_stride < cols * size {
            return bad(format!(
                "row stride {} bytes overlaps rows of {} bytes",
                self.row_stride,
                cols * size
            ));
        }
        let extent = (rows - 1)
            .checked_mul(self.row_stride)
            .and_then(|e| e.checked_add(cols * size))
            .filter(|&e| e <= isize::MAX as usize && self.addr.checked_add(e).is_some());
        if extent.is_none() {
            return bad("extent overflows the address space".into());
        }
        Ok(())
    }
}

/// A 1-D array of `len` values of `T` in a store's memory space.
#[derive(Debug, PartialEq, Eq)]
pub struct VectorDesc<T> {
    /// Address of the first value.
    pub addr: usize,
    /// Number of values.
    pub len: usize,
    marker: PhantomData<fn() -> T>,
}

impl<T> Clone for VectorDesc<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for VectorDesc<T> {}

impl<T> VectorDesc<T> {
    /// `len` values at `addr`.
    pub fn new(addr: usize, len: usize) -> Self {
        Self {
            addr,
            len,
            marker: PhantomData,
        }
    }

    /// The values of a host slice (valid while the slice is borrowed).
    pub fn from_slice(values: &[T]) -> Self {
        Self::new(values.as_ptr() as usize, values.len())
    }

    /// Checks that the array is non-null and aligned when not empty, and fits
    /// in the address space.
    pub(crate) fn check(&self, name: &str) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidArgument(format!("{name}: {m}")));
        if self.len == 0 {
            return Ok(());
        }
        if self.addr == 0 {
            return bad("null address");
        }
        if self.addr % std::mem::align_of::<T>() != 0 {
            return bad("misaligned address");
        }
        let fits = self
            .len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize && self.addr.checked_add(b).is_some());
        if fits.is_none() {
            return bad("extent overflows the address space");
        }
        Ok(())
    }
}

/// The raw memory of one layer, for attention kernels that read the cache
/// in place (FlashMLA reads `[num_blocks, block_size, 1, bytes_per_token]`
/// bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerView {
    /// Address of the layer's first byte in the store's memory space; valid
    /// while the store lives.
    pub addr: usize,
    /// Where the memory is.
    pub device: Device,
    /// Storage format.
    pub dtype: Dtype,
    /// `[num_blocks, block_size, bytes_per_token]`, in bytes.
    pub shape: [usize; 3],
    /// Strides of `shape` in bytes: `[block_size * bytes_per_token, bytes_per_token, 1]`.
    pub strides: [usize; 3],
    /// Where the parts of one latent lie.
    pub layout: TokenLayout,
}

impl LayerView {
    /// Bytes of the layer (`num_blocks * block_size * bytes_per_token`).
    pub fn len_bytes(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The raw memory of one layer's indexer keys, for the indexer's kernels
/// (vLLM's `DeepseekV32IndexerCache` reads `[num_blocks, block_size,
/// head_dim + 4]` bytes, each block all codes first, then all scales).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerView {
    /// Address of the layer's first indexer byte in the store's memory
    /// space; valid while the store lives.
    pub addr: usize,
    /// Where the memory is.
    pub device: Device,
    /// Values per key.
    pub head_dim: usize,
    /// `[num_blocks, block_size, head_dim + 4]`, in bytes.
    pub shape: [usize; 3],
    /// Strides of `shape` in bytes: `[block_size * (head_dim + 4), head_dim + 4, 1]`.
    /// Within a block the bytes are not per token: codes of every token
    /// first, then every scale.
    pub strides: [usize; 3],
}

impl IndexerView {
    /// Bytes of the layer's indexer keys.
    pub fn len_bytes(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Storage for the latents of all layers, one implementation per memory
/// kind. Handles are `Send + Sync`: concurrent calls are sound (a backend
/// orders operations on the same layer; GPU backends by their streams).
pub trait LatentStore: Send + Sync {
    /// The (validated) configuration.
    fn config(&self) -> &CacheConfig;

    /// The codec of the storage format.
    fn codec(&self) -> &Codec;

    /// Where the latents live.
    fn device(&self) -> Device;

    /// Quantizes and stores rows into `part` of `layer`: row `t` of each of
    /// `rows` (the part's [`Part::write_inputs`], `[T, width]` each, bf16, f16
    /// or f32) goes to slot `slot_mapping[t]`; tokens with a negative slot
    /// are skipped. If a slot appears twice the result for that slot is
    /// unspecified (the host store keeps the last). Fails for the indexer
    /// part unless the configuration has an indexer.
    ///
    /// # Safety
    /// The descriptors must describe memory of this store's device,
    /// readable for their whole extent until the operation completes (for
    /// GPU backends: until `stream` reaches it), not written meanwhile, and
    /// not overlapping the store's own memory.
    unsafe fn write_part_raw(
        &self,
        part: Part,
        layer: usize,
        rows: &[MatrixDesc],
        slot_mapping: VectorDesc<i64>,
        stream: Stream,
    ) -> Result<()>;

    /// Decodes `part` of the first `out.rows` tokens of a sequence into `out`
    /// (`[num_tokens, width]` with the part's [`Part::gather_width`], bf16 or
    /// f32): token `t` is read from block `block_table[t / block_size]`,
    /// offset `t % block_size`. The table needs at least `ceil(num_tokens /
    /// block_size)` entries.
    ///
    /// # Safety
    /// `block_table` must be readable and `out` writable for their whole
    /// extent until the operation completes, in this store's memory space,
    /// neither touched by anyone else meanwhile nor overlapping each other or
    /// the store's memory.
    unsafe fn gather_part_raw(
        &self,
        part: Part,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        out: MatrixDesc,
        stream: Stream,
    ) -> Result<()>;

    /// Quantizes and stores latents (vLLM's `concat_and_cache_mla`): row `t`
    /// of `c_kv [T, kv_lora_rank]` and `k_pe [T, rope_dim]` goes to slot
    /// `slot_mapping[t]` of `layer`. [`LatentStore::write_part_raw`] of
    /// [`Part::Latent`].
    ///
    /// # Safety
    /// As for [`LatentStore::write_part_raw`].
    unsafe fn write_raw(
        &self,
        layer: usize,
        c_kv: MatrixDesc,
        k_pe: MatrixDesc,
        slot_mapping: VectorDesc<i64>,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.write_part_raw(Part::Latent, layer, &[c_kv, k_pe], slot_mapping, stream) }
    }

    /// Decodes the latents of the first `out.rows` tokens of a sequence into
    /// `out` (`[num_tokens, kv_lora_rank + rope_dim]`).
    /// [`LatentStore::gather_part_raw`] of [`Part::Latent`].
    ///
    /// # Safety
    /// As for [`LatentStore::gather_part_raw`].
    unsafe fn gather_raw(
        &self,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        out: MatrixDesc,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.gather_part_raw(Part::Latent, layer, block_table, out, stream) }
    }

    /// Copies whole blocks `src -> dst` in every layer (copy-on-write of a
    /// shared partial block). Destinations must be distinct and none may be
    /// a source, so the copies can run in any order.
    fn copy_blocks(&self, pairs: &[(BlockId, BlockId)], stream: Stream) -> Result<()>;

    /// The raw memory of `layer`.
    fn layer_view(&self, layer: usize) -> Result<LayerView>;

    /// Quantizes and stores indexer keys (vLLM's `indexer_k_quant_and_cache`):
    /// row `t` of `keys [T, head_dim]` goes to slot `slot_mapping[t]` of
    /// `layer`'s indexer part. [`LatentStore::write_part_raw`] of
    /// [`Part::Indexer`].
    ///
    /// # Safety
    /// As for [`LatentStore::write_part_raw`].
    unsafe fn write_indexer_raw(
        &self,
        layer: usize,
        keys: MatrixDesc,
        slot_mapping: VectorDesc<i64>,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.write_part_raw(Part::Indexer, layer, &[keys], slot_mapping, stream) }
    }

    /// Dequantizes the indexer keys of the first `out.rows` tokens of a
    /// sequence into `out` (`[num_tokens, head_dim]`).
    /// [`LatentStore::gather_part_raw`] of [`Part::Indexer`].
    ///
    /// # Safety
    /// As for [`LatentStore::gather_part_raw`].
    unsafe fn gather_indexer_raw(
        &self,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        out: MatrixDesc,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.gather_part_raw(Part::Indexer, layer, block_table, out, stream) }
    }

    /// Copies the stored indexer keys of the first `scales.len` tokens of a
    /// sequence, without dequantizing: token `t`'s e4m3 codes to
    /// `codes[t * head_dim ..]` and its fp32 scale to `scales[t]` (vLLM's
    /// `cp_gather_indexer_k_quant_cache`).
    ///
    /// # Safety
    /// As for [`LatentStore::gather_raw`], for `block_table`, `codes` and
    /// `scales`.
    unsafe fn gather_indexer_quantized_raw(
        &self,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        codes: VectorDesc<u8>,
        scales: VectorDesc<f32>,
        stream: Stream,
    ) -> Result<()>;

    /// The raw memory of `layer`'s indexer keys; fails unless the
    /// configuration has an indexer.
    fn indexer_view(&self, layer: usize) -> Result<IndexerView>;
}

/// The indexer geometry of `config`, or the error an indexer operation on a
/// store without one returns.
pub fn check_indexer(config: &CacheConfig) -> Result<IndexerGeometry> {
    config.indexer.ok_or_else(|| {
        Error::InvalidArgument(
            "this store has no indexer keys (the configuration has no indexer)".into(),
        )
    })
}

/// The indexer codec of `config`, if it has an indexer.
pub(crate) fn indexer_codec(config: &CacheConfig) -> Result<Option<IndexerCodec>> {
    config
        .indexer
        .map(|g| IndexerCodec::new(g, config.block_size))
        .transpose()
}

/// Checks the arguments of a quantized indexer gather; returns the number of
/// block-table entries it reads.
pub(crate) fn check_indexer_quantized_args(
    config: &CacheConfig,
    layer: usize,
    block_table: &VectorDesc<BlockId>,
    codes: &VectorDesc<u8>,
    scales: &VectorDesc<f32>,
) -> Result<usize> {
    let indexer = check_indexer(config)?;
    check_layer(config, layer)?;
    block_table.check("block_table")?;
    codes.check("codes")?;
    scales.check("scales")?;
    if Some(codes.len) != scales.len.checked_mul(indexer.head_dim) {
        return Err(Error::InvalidArgument(format!(
            "codes: {} bytes, {} tokens of {} codes need {}",
            codes.len,
            scales.len,
            indexer.head_dim,
            scales.len.saturating_mul(indexer.head_dim)
        )));
    }
    check_table_covers(config, block_table, scales.len)
}

/// Checks that `block_table` covers `tokens` tokens; returns the entries read.
fn check_table_covers(
    config: &CacheConfig,
    block_table: &VectorDesc<BlockId>,
    tokens: usize,
) -> Result<usize> {
    let blocks = tokens.div_ceil(config.block_size);
    if block_table.len < blocks {
        return Err(Error::InvalidArgument(format!(
            "block_table has {} entries, {tokens} tokens need {blocks}",
            block_table.len
        )));
    }
    Ok(blocks)
}

/// Checks `layer < num_layers`.
pub(crate) fn check_layer(config: &CacheConfig, layer: usize) -> Result<()> {
    if layer < config.num_layers {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "layer {layer} out of range (num_layers {})",
            config.num_layers
        )))
    }
}

/// Checks the arguments of a write of `part` that the backend can see
/// without reading memory: the part, layer, inputs, shapes, element types.
pub(crate) fn check_write_args(
    config: &CacheConfig,
    part: Part,
    layer: usize,
    rows: &[MatrixDesc],
    slot_mapping: &VectorDesc<i64>,
) -> Result<()> {
    let inputs = part.write_inputs(config)?;
    check_layer(config, layer)?;
    if rows.len() != inputs.len() {
        let names: Vec<&str> = inputs.iter().map(|i| i.0).collect();
        return Err(Error::InvalidArgument(format!(
            "a write of {part:?} takes {} inputs ({}), got {}",
            inputs.len(),
            names.join(", "),
            rows.len()
        )));
    }
    slot_mapping.check("slot_mapping")?;
    for (m, &(name, width)) in rows.iter().zip(&inputs) {
        m.check(name, slot_mapping.len, width, &ElemType::ALL)?;
    }
    Ok(())
}

/// The element types a gather can write.
pub(crate) const GATHER_OUTPUTS: [ElemType; 2] = [ElemType::Bf16, ElemType::F32];

/// Checks the arguments of a gather of `part` that the backend can see
/// without reading memory; returns the number of block-table entries it
/// reads.
pub(crate) fn check_gather_args(
    config: &CacheConfig,
    part: Part,
    layer: usize,
    block_table: &VectorDesc<BlockId>,
    out: &MatrixDesc,
) -> Result<usize> {
    let width = part.gather_width(config)?;
    check_layer(config, layer)?;
    block_table.check("block_table")?;
    out.check("out", out.rows, width, &GATHER_OUTPUTS)?;
    check_table_covers(config, block_table, out.rows)
}

/// Checks a block id against `num_blocks`.
pub(crate) fn check_block(config: &CacheConfig, block: BlockId) -> Result<()> {
    if (block as usize) < config.num_blocks {
        Ok(())
    } else {
        Err(Error::InvalidBlock(block))
    }
}

/// The bytes of one block in one layer: its latent part and its indexer
/// part (0 without an indexer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockParts {
    /// Bytes of the block's latents in one layer.
    pub latent: usize,
    /// Bytes of the block's indexer keys in one layer.
    pub indexer: usize,
}

impl BlockParts {
    /// The parts of `config`'s blocks (valid config).
    pub(crate) fn of(config: &CacheConfig) -> Self {
        Self {
            latent: config.block_size * config.latent_bytes_per_token_per_layer(),
            indexer: config.block_size * config.indexer_bytes_per_token_per_layer(),
        }
    }

    /// Bytes of one block in all layers: every layer's latent part, then
    /// every layer's indexer part (the unit the tiers keep).
    pub(crate) fn block_bytes(&self, num_layers: usize) -> usize {
        num_layers * (self.latent + self.indexer)
    }
}

/// Checks a copy of one whole block (all layers, `len` bytes) in or out of
/// a store; returns the block's bytes per layer.
pub(crate) fn check_block_io(
    config: &CacheConfig,
    block: BlockId,
    len: usize,
) -> Result<BlockParts> {
    check_block(config, block)?;
    let parts = BlockParts::of(config);
    let expected = parts.block_bytes(config.num_layers);
    if len != expected {
        return Err(Error::InvalidArgument(format!(
            "a block of all layers is {expected} bytes, got {len}"
        )));
    }
    Ok(parts)
}

/// Checks `copy_blocks` pairs: ids in range, distinct destinations, no
/// destination among the sources.
pub(crate) fn check_copy_pairs(config: &CacheConfig, pairs: &[(BlockId, BlockId)]) -> Result<()> {
    for &(src, dst) in pairs {
        check_block(config, src)?;
        check_block(config, dst)?;
    }
    let mut sources: Vec<BlockId> = pairs.iter().map(|p| p.0).collect();
    let mut destinations: Vec<BlockId> = pairs.iter().map(|p| p.1).collect();
    sources.sort_unstable();
    destinations.sort_unstable();
    if let Some(w) = destinations.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::InvalidArgument(format!(
            "copy_blocks: block {} is a destination twice",
            w[0]
        )));
    }
    if let Some(&dst) = destinations
        .iter()
        .find(|d| sources.binary_search(d).is_ok())
    {
        return Err(Error::InvalidArgument(format!(
            "copy_blocks: block {dst} is both a source and a destination"
        )));
    }
    Ok(())
}

/// The indexer view of a store whose `layer`'s indexer part starts at `addr`.
pub(crate) fn indexer_view_at(
    config: &CacheConfig,
    indexer: IndexerGeometry,
    device: Device,
    addr: usize,
) -> IndexerView {
    let bpt = indexer.bytes_per_token();
    IndexerView {
        addr,
        device,
        head_dim: indexer.head_dim,
        shape: [config.num_blocks, config.block_size, bpt],
        strides: [config.block_size * bpt, bpt, 1],
    }
}

/// The view of `layer` of a store whose layer `layer` starts at `addr`.
pub(crate) fn layer_view_at(
    config: &CacheConfig,
    codec: &Codec,
    device: Device,
    addr: usize,
) -> LayerView {
    let bpt = codec.bytes_per_token();
    LayerView {
        addr,
        device,
        dtype: config.dtype,
        shape: [config.num_blocks, config.block_size, bpt],
        strides: [config.block_size * bpt, bpt, 1],
        layout: codec.layout(),
    }
}
