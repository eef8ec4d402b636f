//! The host store: latents of all layers in one page-aligned anonymous
//! mapping, optionally on huge pages.
//!
//! ```text
//! mapping: | layer 0 | pad | ... | layer L-1 | pad | indexer 0 | pad | ... |
//!          (each part page-aligned; indexer parts only with an indexer)
//! layer:   | block 0 | block 1 | ... |               (block = block_size tokens)
//! block:   | token 0 | token 1 | ... |               (token = bytes_per_token)
//! indexer: | block 0 | block 1 | ... |               (codes of every token, then scales)
//! ```
//!
//! One reader-writer lock per layer orders writes, gathers and block copies
//! on that layer's latent and indexer parts; [`LatentStore::layer_view`] and
//! [`LatentStore::indexer_view`] hand out raw addresses, which bypass the
//! locks.

mod descriptors;
mod mapping;

use descriptors::matrix_of;
use mapping::{page_size, Mapping};

use crate::sync::RwLock;
use half::bf16;

use super::{
    check_block, check_block_io, check_copy_pairs, check_gather_args, check_indexer,
    check_indexer_quantized_args, check_layer, check_write_args, indexer_codec, indexer_view_at,
    layer_view_at, BlockParts, Device, IndexerView, LatentStore, LayerView, MatrixDesc, Part,
    Stream, VectorDesc,
};
use crate::codec::{Codec, Decoded, IndexerCodec, Values};
use crate::config::CacheConfig;
use crate::error::{Error, Result};
use crate::BlockId;

/// How a [`HostStore`] allocates its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostStoreOptions {
    /// Back the store with huge pages: `MAP_HUGETLB` if the system has
    /// enough reserved, else transparent huge pages (`MADV_HUGEPAGE`).
    /// Linux only; elsewhere regular pages are used.
    pub huge_pages: bool,
}

/// Which pages back a [`HostStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// Regular pages.
    Regular,
    /// Reserved huge pages (`MAP_HUGETLB`).
    HugeTlb,
    /// Regular pages advised for transparent huge pages (`MADV_HUGEPAGE`).
    TransparentHuge,
}

/// Latent storage for all layers in host memory.
pub struct HostStore {
    config: CacheConfig,
    codec: Codec,
    memory: Mapping,
    /// Bytes from one layer's start to the next (page-aligned).
    layer_stride: usize,
    /// Bytes of one layer's latents.
    layer_bytes: usize,
    /// The indexer keys' codec, with an indexer.
    indexer: Option<IndexerCodec>,
    /// Bytes from one layer's indexer part to the next (page-aligned).
    indexer_stride: usize,
    /// Bytes of one layer's indexer keys.
    indexer_bytes: usize,
    layers: Vec<RwLock<()>>,
}

impl std::fmt::Debug for HostStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStore")
            .field("config", &self.config)
            .field("bytes", &self.memory.len)
            .field("pages", &self.memory.kind)
            .finish()
    }
}

impl HostStore {
    /// A zeroed store for `config` on regular pages.
    pub fn new(config: &CacheConfig) -> Result<Self> {
        Self::with_options(config, HostStoreOptions::default())
    }

    /// A zeroed store for `config`.
    pub fn with_options(config: &CacheConfig, options: HostStoreOptions) -> Result<Self> {
        config.validate()?;
        let codec = Codec::for_config(config)?;
        let too_big = || Error::InvalidConfig("the store does not fit in the address space".into());
        let layer_bytes = config
            .num_tokens()
            .checked_mul(codec.bytes_per_token())
            .ok_or_else(too_big)?;
        let indexer = indexer_codec(config)?;
        let indexer_bytes = config
            .num_tokens()
            .checked_mul(config.indexer_bytes_per_token_per_layer())
            .ok_or_else(too_big)?;
        let page = page_size();
        let layer_stride = layer_bytes
            .checked_next_multiple_of(page)
            .ok_or_else(too_big)?;
        let indexer_stride = indexer_bytes
            .checked_next_multiple_of(page)
            .ok_or_else(too_big)?;
        let total = (layer_stride.checked_add(indexer_stride))
            .and_then(|per_layer| per_layer.checked_mul(config.num_layers))
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(too_big)?;
        let memory = Mapping::new(total, options.huge_pages)?;
        Ok(Self {
            config: config.clone(),
            codec,
            memory,
            layer_stride,
            layer_bytes,
            indexer,
            indexer_stride,
            indexer_bytes,
            layers: (0..config.num_layers).map(|_| RwLock::new(())).collect(),
        })
    }

    /// Which pages back the store.
    pub fn page_kind(&self) -> PageKind {
        self.memory.kind
    }

    /// Quantizes and stores `T = slot_mapping.len()` tokens: `c_kv` is
    /// `[T, kv_lora_rank]`, `k_pe` is `[T, rope_dim]`, row-major; negative
    /// slots are skipped. See [`LatentStore::write_raw`].
    pub fn write<'a>(
        &self,
        layer: usize,
        c_kv: impl Into<Values<'a>>,
        k_pe: impl Into<Values<'a>>,
        slot_mapping: &[i64],
    ) -> Result<()> {
        self.write_part(
            Part::Latent,
            layer,
            &[c_kv.into(), k_pe.into()],
            slot_mapping,
        )
    }

    /// Quantizes and stores `T = slot_mapping.len()` rows of each of `rows`
    /// (the part's [`Part::write_inputs`], row-major) into `part`.
    fn write_part(
        &self,
        part: Part,
        layer: usize,
        rows: &[Values<'_>],
        slot_mapping: &[i64],
    ) -> Result<()> {
        let inputs = part.write_inputs(&self.config)?;
        let rows = rows
            .iter()
            .zip(&inputs)
            .map(|(&v, &(name, width))| matrix_of(v, name, slot_mapping.len(), width))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: the descriptors cover borrowed slices that live, unchanged,
        // for the whole call, and shared borrows cannot alias the store's
        // memory, which is only reachable through `&self` methods that never
        // hand out references beyond a call.
        unsafe {
            self.write_part_raw(
                part,
                layer,
                &rows,
                VectorDesc::from_slice(slot_mapping),
                Stream::default(),
            )
        }
    }

    /// Decodes the first `out.len() / (kv_lora_rank + rope_dim)` tokens of a
    /// sequence with `block_table` into `out` (f32 or bf16).
    pub fn gather_into<O: Decoded>(
        &self,
        layer: usize,
        block_table: &[BlockId],
        out: &mut [O],
    ) -> Result<()> {
        self.gather_part_into(Part::Latent, layer, block_table, out)
    }

    /// Decodes `part` of the first `out.len() / width` tokens of a sequence
    /// with `block_table` into `out` (the part's [`Part::gather_width`]).
    fn gather_part_into<O: Decoded>(
        &self,
        part: Part,
        layer: usize,
        block_table: &[BlockId],
        out: &mut [O],
    ) -> Result<()> {
        let width = part.gather_width(&self.config)?;
        if out.len() % width != 0 {
            return Err(Error::InvalidArgument(format!(
                "out: {} values is not a whole number of {width}-value rows",
                out.len()
            )));
        }
        let out =
            MatrixDesc::contiguous(out.as_mut_ptr() as usize, O::TYPE, out.len() / width, width);
        // SAFETY: `out` is an exclusive borrow and `block_table` a shared one,
        // both alive for the call, and neither can alias the store's memory.
        unsafe {
            self.gather_part_raw(
                part,
                layer,
                VectorDesc::from_slice(block_table),
                out,
                Stream::default(),
            )
        }
    }

    /// Decodes the first `num_tokens` tokens of a sequence into a new
    /// `[num_tokens, kv_lora_rank + rope_dim]` f32 vector.
    pub fn gather_f32(
        &self,
        layer: usize,
        block_table: &[BlockId],
        num_tokens: usize,
    ) -> Result<Vec<f32>> {
        self.gather_vec(layer, block_table, num_tokens)
    }

    /// Decodes the first `num_tokens` tokens of a sequence into a new
    /// `[num_tokens, kv_lora_rank + rope_dim]` bf16 vector.
    pub fn gather_bf16(
        &self,
        layer: usize,
        block_table: &[BlockId],
        num_tokens: usize,
    ) -> Result<Vec<bf16>> {
        self.gather_vec(layer, block_table, num_tokens)
    }

    fn gather_vec<O: Decoded>(
        &self,
        layer: usize,
        block_table: &[BlockId],
        num_tokens: usize,
    ) -> Result<Vec<O>> {
        let len = num_tokens
            .checked_mul(self.config.elements_per_token())
            .ok_or_else(|| Error::InvalidArgument(format!("num_tokens {num_tokens} too large")))?;
        // Check the table before allocating what it cannot fill.
        if block_table.len() < num_tokens.div_ceil(self.config.block_size) {
            return Err(Error::InvalidArgument(format!(
                "block_table has {} entries, {num_tokens} tokens need {}",
                block_table.len(),
                num_tokens.div_ceil(self.config.block_size)
            )));
        }
        let mut out = crate::alloc::filled(len, O::default(), "the gathered values")?;
        self.gather_into(layer, block_table, &mut out)?;
        Ok(out)
    }

    /// Runs `f` on the bytes of `layer` (`[num_blocks][block_size][bytes_per_token]`)
    /// while holding the layer's read lock.
    pub fn with_layer_bytes<R>(&self, layer: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        check_layer(&self.config, layer)?;
        let _guard = self.layers[layer].read();
        // SAFETY: the read lock keeps writers out while the slice lives.
        Ok(f(unsafe { self.layer_slice(layer) }))
    }

    /// Bytes of one block in all layers: every layer's latents, then every
    /// layer's indexer keys (`num_layers x block_size x bytes_per_token`).
    pub fn block_bytes(&self) -> usize {
        BlockParts::of(&self.config).block_bytes(self.config.num_layers)
    }

    /// Copies block `block` of every layer, in stored format, into `out`
    /// (`block_bytes()` bytes: the latent part layer after layer, then the
    /// indexer part layer after layer).
    pub fn read_block(&self, block: BlockId, out: &mut [u8]) -> Result<()> {
        let parts = check_block_io(&self.config, block, out.len())?;
        let (latents, keys) = out.split_at_mut(self.config.num_layers * parts.latent);
        let b = block as usize;
        for layer in 0..self.config.num_layers {
            let _guard = self.layers[layer].read();
            // SAFETY: the layer's read lock is held until the end of the scope.
            let (memory, indexer) = unsafe { (self.layer_slice(layer), self.indexer_slice(layer)) };
            latents[layer * parts.latent..(layer + 1) * parts.latent]
                .copy_from_slice(&memory[b * parts.latent..(b + 1) * parts.latent]);
            keys[layer * parts.indexer..(layer + 1) * parts.indexer]
                .copy_from_slice(&indexer[b * parts.indexer..(b + 1) * parts.indexer]);
        }
        Ok(())
    }

    /// Overwrites block `block` of every layer with `data`, in stored format
    /// (`block_bytes()` bytes), as [`HostStore::read_block`] gives them.
    pub fn write_block(&self, block: BlockId, data: &[u8]) -> Result<()> {
        let parts = check_block_io(&self.config, block, data.len())?;
        let (latents, keys) = data.split_at(self.config.num_layers * parts.latent);
        let b = block as usize;
        for layer in 0..self.config.num_layers {
            let _guard = self.layers[layer].write();
            // SAFETY: the layer's write lock is held until the end of the scope.
            let (memory, indexer) =
                unsafe { (self.layer_slice_mut(layer), self.indexer_slice_mut(layer)) };
            memory[b * parts.latent..(b + 1) * parts.latent]
                .copy_from_slice(&latents[layer * parts.latent..(layer + 1) * parts.latent]);
            indexer[b * parts.indexer..(b + 1) * parts.indexer]
                .copy_from_slice(&keys[layer * parts.indexer..(layer + 1) * parts.indexer]);
        }
        Ok(())
    }

    /// Quantizes and stores `T = slot_mapping.len()` indexer keys (`keys` is
    /// `[T, head_dim]`, row-major); negative slots are skipped. See
    /// [`LatentStore::write_indexer_raw`].
    pub fn write_indexer<'a>(
        &self,
        layer: usize,
        keys: impl Into<Values<'a>>,
        slot_mapping: &[i64],
    ) -> Result<()> {
        self.write_part(Part::Indexer, layer, &[keys.into()], slot_mapping)
    }

    /// Dequantizes the indexer keys of the first `out.len() / head_dim`
    /// tokens of a sequence with `block_table` into `out` (f32 or bf16).
    pub fn gather_indexer_into<O: Decoded>(
        &self,
        layer: usize,
        block_table: &[BlockId],
        out: &mut [O],
    ) -> Result<()> {
        self.gather_part_into(Part::Indexer, layer, block_table, out)
    }

    /// Copies the stored codes (`scales.len() x head_dim` bytes) and scales
    /// of the first `scales.len()` tokens' indexer keys. See
    /// [`LatentStore::gather_indexer_quantized_raw`].
    pub fn gather_indexer_quantized(
        &self,
        layer: usize,
        block_table: &[BlockId],
        codes: &mut [u8],
        scales: &mut [f32],
    ) -> Result<()> {
        // SAFETY: exclusive borrows alive for the call, unaliased with the store.
        unsafe {
            self.gather_indexer_quantized_raw(
                layer,
                VectorDesc::from_slice(block_table),
                VectorDesc::new(codes.as_mut_ptr() as usize, codes.len()),
                VectorDesc::new(scales.as_mut_ptr() as usize, scales.len()),
                Stream::default(),
            )
        }
    }

    /// Runs `f` on the indexer bytes of `layer` (`[num_blocks][block_size x
    /// (head_dim + 4)]`) while holding the layer's read lock.
    pub fn with_indexer_bytes<R>(&self, layer: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        check_indexer(&self.config)?;
        check_layer(&self.config, layer)?;
        let _guard = self.layers[layer].read();
        // SAFETY: the read lock keeps writers out while the slice lives.
        Ok(f(unsafe { self.indexer_slice(layer) }))
    }

    /// Address of `layer`'s indexer part (`layer < num_layers`).
    fn indexer_addr(&self, layer: usize) -> *mut u8 {
        // SAFETY: the indexer parts follow the latent layers inside the mapping.
        unsafe {
            self.memory
                .ptr
                .add(self.config.num_layers * self.layer_stride + layer * self.indexer_stride)
        }
    }

    /// The indexer bytes of `layer` (empty without an indexer).
    ///
    /// # Safety
    /// As for [`HostStore::layer_slice`].
    unsafe fn indexer_slice(&self, layer: usize) -> &[u8] {
        // SAFETY: the part lies inside the mapping; the lock orders access.
        unsafe { std::slice::from_raw_parts(self.indexer_addr(layer), self.indexer_bytes) }
    }

    /// The indexer bytes of `layer`, mutable.
    ///
    /// # Safety
    /// As for [`HostStore::layer_slice_mut`].
    #[allow(clippy::mut_from_ref)]
    unsafe fn indexer_slice_mut(&self, layer: usize) -> &mut [u8] {
        // SAFETY: the part lies inside the mapping; the write lock makes the
        // access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.indexer_addr(layer), self.indexer_bytes) }
    }

    /// The bytes of `layer`.
    ///
    /// # Safety
    /// The caller holds the layer's lock (read or write) for the lifetime of
    /// the slice; `layer < num_layers`.
    unsafe fn layer_slice(&self, layer: usize) -> &[u8] {
        // SAFETY: the layer lies inside the mapping; the lock orders access.
        unsafe {
            std::slice::from_raw_parts(
                self.memory.ptr.add(layer * self.layer_stride),
                self.layer_bytes,
            )
        }
    }

    /// The bytes of `layer`, mutable.
    ///
    /// # Safety
    /// The caller holds the layer's write lock for the lifetime of the slice;
    /// `layer < num_layers`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn layer_slice_mut(&self, layer: usize) -> &mut [u8] {
        // SAFETY: the layer lies inside the mapping; the write lock makes the
        // access exclusive.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.memory.ptr.add(layer * self.layer_stride),
                self.layer_bytes,
            )
        }
    }
}

impl LatentStore for HostStore {
    fn config(&self) -> &CacheConfig {
        &self.config
    }

    fn codec(&self) -> &Codec {
        &self.codec
    }

    fn device(&self) -> Device {
        Device::Host
    }

    unsafe fn write_part_raw(
        &self,
        part: Part,
        layer: usize,
        rows: &[MatrixDesc],
        slot_mapping: VectorDesc<i64>,
        _stream: Stream,
    ) -> Result<()> {
        check_write_args(&self.config, part, layer, rows, &slot_mapping)?;
        // SAFETY: checked; readable per the contract.
        let slots = unsafe { self.checked_slots(&slot_mapping) }?;
        let bpt = self.codec.bytes_per_token();
        // The indexer codec's scratch (one widened key); empty for latents.
        let wide_len = match (part, self.indexer) {
            (Part::Indexer, Some(codec)) => codec.head_dim(),
            _ => 0,
        };
        let mut wide = vec![0f32; wide_len];
        let _guard = self.layers[layer].write();
        // SAFETY: the layer's write lock is held until the end of the scope.
        let memory = unsafe { self.part_slice_mut(part, layer) };
        for (t, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            // SAFETY: row `t` of each descriptor was checked to lie within its
            // extent, with the right alignment; readable per the contract.
            let row = |m: &MatrixDesc| unsafe {
                Values::from_raw(m.elem, (m.addr + t * m.row_stride) as *const u8, m.cols)
            };
            let slot = slot as usize;
            match (part, self.indexer) {
                (Part::Latent, _) => self.codec.encode_unchecked(
                    row(&rows[0]),
                    row(&rows[1]),
                    &mut memory[slot * bpt..(slot + 1) * bpt],
                ),
                (Part::Indexer, Some(codec)) => {
                    let (block, offset) = (slot / codec.block_size(), slot % codec.block_size());
                    let bytes = codec.block_bytes();
                    let block = &mut memory[block * bytes..(block + 1) * bytes];
                    codec.encode_unchecked(row(&rows[0]), block, offset, &mut wide);
                }
                // Unreachable: the args check needs an indexer.
                (Part::Indexer, None) => {}
            }
        }
        Ok(())
    }

    unsafe fn gather_part_raw(
        &self,
        part: Part,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        out: MatrixDesc,
        _stream: Stream,
    ) -> Result<()> {
        let blocks = check_gather_args(&self.config, part, layer, &block_table, &out)?;
        if out.rows == 0 {
            return Ok(());
        }
        // SAFETY: checked; readable per the contract.
        let table = unsafe { self.checked_table(&block_table, blocks) }?;
        match out.elem {
            crate::codec::ElemType::F32 => {
                // SAFETY: forwarded; `out` holds f32.
                unsafe { self.gather_rows::<f32>(part, layer, table, &out) }
            }
            _ => {
                // SAFETY: forwarded; `out` holds bf16 (the only other type
                // `check_gather_args` accepts).
                unsafe { self.gather_rows::<bf16>(part, layer, table, &out) }
            }
        }
        Ok(())
    }

    fn copy_blocks(&self, pairs: &[(BlockId, BlockId)], _stream: Stream) -> Result<()> {
        check_copy_pairs(&self.config, pairs)?;
        let parts = BlockParts::of(&self.config);
        for layer in 0..self.config.num_layers {
            let _guard = self.layers[layer].write();
            // SAFETY: the layer's write lock is held until the end of the scope.
            let (memory, indexer) =
                unsafe { (self.layer_slice_mut(layer), self.indexer_slice_mut(layer)) };
            for &(src, dst) in pairs {
                let (src, dst) = (src as usize, dst as usize);
                memory.copy_within(
                    src * parts.latent..(src + 1) * parts.latent,
                    dst * parts.latent,
                );
                indexer.copy_within(
                    src * parts.indexer..(src + 1) * parts.indexer,
                    dst * parts.indexer,
                );
            }
        }
        Ok(())
    }

    fn layer_view(&self, layer: usize) -> Result<LayerView> {
        check_layer(&self.config, layer)?;
        let addr = self.memory.ptr as usize + layer * self.layer_stride;
        Ok(layer_view_at(&self.config, &self.codec, Device::Host, addr))
    }

    unsafe fn gather_indexer_quantized_raw(
        &self,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        codes: VectorDesc<u8>,
        scales: VectorDesc<f32>,
        _stream: Stream,
    ) -> Result<()> {
        let blocks =
            check_indexer_quantized_args(&self.config, layer, &block_table, &codes, &scales)?;
        // SAFETY: checked; readable per the contract.
        let table = unsafe { self.checked_table(&block_table, blocks) }?;
        let Some(codec) = self.indexer else {
            return Ok(()); // Unreachable: the args check needs an indexer.
        };
        if scales.len == 0 {
            return Ok(());
        }
        // SAFETY: checked non-null, aligned and in range; writable and
        // unaliased per the contract.
        let (codes_out, scales_out) = unsafe {
            (
                std::slice::from_raw_parts_mut(codes.addr as *mut u8, codes.len),
                std::slice::from_raw_parts_mut(scales.addr as *mut f32, scales.len),
            )
        };
        let (hd, bs) = (codec.head_dim(), codec.block_size());
        let _guard = self.layers[layer].read();
        // SAFETY: the layer's read lock is held until the end of the scope.
        let indexer = unsafe { self.indexer_slice(layer) };
        for (t, scale) in scales_out.iter_mut().enumerate() {
            let block = indexer_block(indexer, &codec, table[t / bs]);
            let at = codec.codes_offset(t % bs);
            codes_out[t * hd..(t + 1) * hd].copy_from_slice(&block[at..at + hd]);
            let at = codec.scale_offset(t % bs);
            *scale = f32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
        }
        Ok(())
    }

    fn indexer_view(&self, layer: usize) -> Result<IndexerView> {
        let indexer = check_indexer(&self.config)?;
        check_layer(&self.config, layer)?;
        Ok(indexer_view_at(
            &self.config,
            indexer,
            Device::Host,
            self.indexer_addr(layer) as usize,
        ))
    }
}

/// Block `block` of a layer's indexer part (the id was checked).
fn indexer_block<'a>(indexer: &'a [u8], codec: &IndexerCodec, block: BlockId) -> &'a [u8] {
    let bytes = codec.block_bytes();
    &indexer[block as usize * bytes..(block as usize + 1) * bytes]
}

impl HostStore {
    /// The bytes of `part` of `layer` (see [`HostStore::layer_slice`]).
    ///
    /// # Safety
    /// As for [`HostStore::layer_slice`].
    unsafe fn part_slice(&self, part: Part, layer: usize) -> &[u8] {
        // SAFETY: forwarded.
        unsafe {
            match part {
                Part::Latent => self.layer_slice(layer),
                Part::Indexer => self.indexer_slice(layer),
            }
        }
    }

    /// The bytes of `part` of `layer`, mutable.
    ///
    /// # Safety
    /// As for [`HostStore::layer_slice_mut`].
    #[allow(clippy::mut_from_ref)]
    unsafe fn part_slice_mut(&self, part: Part, layer: usize) -> &mut [u8] {
        // SAFETY: forwarded.
        unsafe {
            match part {
                Part::Latent => self.layer_slice_mut(layer),
                Part::Indexer => self.indexer_slice_mut(layer),
            }
        }
    }
}
