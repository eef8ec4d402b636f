//! [`CudaStore`]: the latents of every layer in one device allocation,
//! written, gathered and copied by the kernels on the caller's stream.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{result as cu, sys};

use super::kernels::{check_device, device_kernels, driver_error, DeviceKernels};
use super::launch::{
    copy_blocks_launches, gather_launch, indexer_copy_blocks_launches,
    indexer_gather_quantized_launch, kernel_codec, write_launch, KernelLaunch,
};
use super::{guard, RawStream};
use crate::codec::Codec;
use crate::config::CacheConfig;
use crate::error::{Error, Result};
use crate::store::{
    check_block_io, check_indexer, check_layer, indexer_view_at, layer_view_at, BlockParts, Device,
    IndexerView, LatentStore, LayerView, MatrixDesc, Part, Stream, VectorDesc,
};
use crate::BlockId;

/// Latent storage for all layers in the memory of one CUDA device.
///
/// One device allocation holds every layer (`[num_blocks][block_size]
/// [bytes_per_token]` bytes each, 256-byte aligned), then, with an indexer,
/// every layer's indexer keys (`[num_blocks][block_size x (head_dim + 4)]`
/// bytes each, 256-byte aligned). Operations take the
/// caller's stream and return once the work is enqueued; the caller orders
/// them (by stream) and synchronizes when it needs results. The store is
/// zeroed at construction.
///
/// What the device cannot check without synchronizing is defined instead of
/// checked: slots `>= num_blocks * block_size` are skipped like negative ones,
/// and block ids `>= num_blocks` in a gather's table give rows of zeros (the
/// host store rejects both).
pub struct CudaStore {
    config: CacheConfig,
    codec: Codec,
    ordinal: usize,
    kernels: Arc<DeviceKernels>,
    base: sys::CUdeviceptr,
    layer_stride: usize,
    /// Bytes from one layer's indexer keys to the next (0 without an indexer).
    indexer_stride: usize,
}

impl std::fmt::Debug for CudaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStore")
            .field("config", &self.config)
            .field("device", &self.ordinal)
            .field("arch", &self.kernels.arch)
            .field(
                "bytes",
                &((self.layer_stride + self.indexer_stride) * self.config.num_layers),
            )
            .finish()
    }
}

impl CudaStore {
    /// A zeroed store for `config` on CUDA device `ordinal`. Compiles the
    /// kernels for the device on its first store. Fails with
    /// [`Error::Storage`] when there is no driver, no such device, no libnvrtc
    /// or not enough device memory; with [`Error::InvalidConfig`] when the
    /// configuration is invalid or `bytes_per_token` is not a multiple of 4
    /// (the kernels store 32-bit words).
    pub fn new(config: &CacheConfig, ordinal: usize) -> Result<Self> {
        config.validate()?;
        let codec = kernel_codec(config)?;
        let bpt = codec.bytes_per_token();
        let too_big = || Error::InvalidConfig("the store does not fit in the address space".into());
        let layer_bytes = config.num_tokens().checked_mul(bpt).ok_or_else(too_big)?;
        let layer_stride = layer_bytes
            .checked_next_multiple_of(256)
            .ok_or_else(too_big)?;
        let indexer_stride = config
            .num_tokens()
            .checked_mul(config.indexer_bytes_per_token_per_layer())
            .and_then(|b| b.checked_next_multiple_of(256))
            .ok_or_else(too_big)?;
        let total = (layer_stride.checked_add(indexer_stride))
            .and_then(|per_layer| per_layer.checked_mul(config.num_layers))
            .ok_or_else(too_big)?;
        guard("CUDA", || {
            check_device(ordinal)?;
            let kernels = device_kernels(ordinal)?;
            kernels
                .ctx
                .bind_to_thread()
                .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
            // SAFETY: plain allocation in the current context, zeroed before use.
            let base = unsafe { cu::malloc_sync(total) }.map_err(|e| {
                driver_error(&format!("allocating {total} bytes of device memory"), e)
            })?;
            // SAFETY: `base` holds `total` bytes. The memset is asynchronous
            // to the host: wait for it, since callers' streams need not order
            // after the legacy default stream.
            let zeroed =
                unsafe { cu::memset_d8_sync(base, 0, total) }.and_then(|()| cu::ctx::synchronize());
            if let Err(e) = zeroed {
                // SAFETY: allocated above, never used.
                let _ = unsafe { cu::free_sync(base) };
                return Err(driver_error("zeroing the store", e));
            }
            Ok(Self {
                config: config.clone(),
                codec,
                ordinal,
                kernels,
                base,
                layer_stride,
                indexer_stride,
            })
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The target the kernels were compiled for (`sm_90a`, ...).
    pub fn arch(&self) -> &str {
        &self.kernels.arch
    }

    /// Device address of layer `layer`'s first byte (see also
    /// [`LatentStore::layer_view`]).
    pub fn layer_ptr(&self, layer: usize) -> Result<sys::CUdeviceptr> {
        check_layer(&self.config, layer)?;
        Ok(self.layer_base(layer))
    }

    /// Bytes of one block in all layers: every layer's latents, then every
    /// layer's indexer keys.
    pub fn block_bytes(&self) -> usize {
        BlockParts::of(&self.config).block_bytes(self.config.num_layers)
    }

    /// Copies block `block` of every layer, in stored format, into `out`
    /// (`block_bytes()` bytes, laid out as the host store's
    /// `read_block` gives them): device-to-host copies enqueued on `stream`,
    /// after the work the caller enqueued there, then waited for.
    pub fn read_block(&self, block: BlockId, out: &mut [u8], stream: Stream) -> Result<()> {
        let parts = check_block_io(&self.config, block, out.len())?;
        let (latents, keys) = out.split_at_mut(self.config.num_layers * parts.latent);
        guard("CUDA read_block", || {
            self.bind()?;
            let sources = self.block_sources(block, parts);
            // Without an indexer `keys` is empty: `max(1)` only avoids a zero chunk size.
            let chunks = latents
                .chunks_exact_mut(parts.latent)
                .chain(keys.chunks_exact_mut(parts.indexer.max(1)));
            let copies = chunks.zip(sources).map(|(chunk, src)| {
                // SAFETY: the source is inside this store (block checked); the
                // destination outlives the copy, which `finish` waits for.
                unsafe { cu::memcpy_dtoh_async(chunk, src, stream.0 as RawStream) }
                    .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))
            });
            finish(copies, stream)
        })
    }

    /// Overwrites block `block` of every layer with `data` (as
    /// [`CudaStore::read_block`] gives them): host-to-device copies
    /// enqueued on `stream`, then waited for, so `data` may go once this
    /// returns and the caller's later work on `stream` sees the block.
    pub fn write_block(&self, block: BlockId, data: &[u8], stream: Stream) -> Result<()> {
        let parts = check_block_io(&self.config, block, data.len())?;
        let (latents, keys) = data.split_at(self.config.num_layers * parts.latent);
        guard("CUDA write_block", || {
            self.bind()?;
            let destinations = self.block_sources(block, parts);
            // Without an indexer `keys` is empty: `max(1)` only avoids a zero chunk size.
            let chunks = latents
                .chunks_exact(parts.latent)
                .chain(keys.chunks_exact(parts.indexer.max(1)));
            let copies = chunks.zip(destinations).map(|(chunk, dst)| {
                // SAFETY: the destination is inside this store (block
                // checked); the source outlives the copy (`finish` waits).
                unsafe { cu::memcpy_htod_async(dst, chunk, stream.0 as RawStream) }
                    .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
            });
            finish(copies, stream)
        })
    }

    /// Device addresses of block `block`'s latent part in every layer, then
    /// of its indexer part in every layer (none without an indexer).
    fn block_sources(
        &self,
        block: BlockId,
        parts: BlockParts,
    ) -> impl Iterator<Item = sys::CUdeviceptr> + '_ {
        let b = block as u64;
        let layers = 0..self.config.num_layers;
        let latent = layers
            .clone()
            .map(move |l| self.layer_base(l) + b * parts.latent as u64);
        let indexer = layers
            .filter(move |_| parts.indexer > 0)
            .map(move |l| self.indexer_base(l) + b * parts.indexer as u64);
        latent.chain(indexer)
    }

    /// Device address of `part` of layer `layer`: checks the layer, and for
    /// the indexer part that the configuration has one.
    fn part_ptr(&self, part: Part, layer: usize) -> Result<sys::CUdeviceptr> {
        match part {
            Part::Latent => self.layer_ptr(layer),
            Part::Indexer => {
                check_indexer(&self.config)?;
                check_layer(&self.config, layer)?;
                Ok(self.indexer_base(layer))
            }
        }
    }

    /// Device address of layer `layer`'s indexer keys (in range).
    fn indexer_base(&self, layer: usize) -> sys::CUdeviceptr {
        self.base
            + (self.config.num_layers * self.layer_stride + layer * self.indexer_stride) as u64
    }

    /// Device address of layer `layer` (in range).
    fn layer_base(&self, layer: usize) -> sys::CUdeviceptr {
        self.base + (layer * self.layer_stride) as u64
    }

    fn bind(&self) -> Result<()> {
        self.kernels
            .ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    /// Binds the store's context and enqueues `launch` on `stream`, panics
    /// caught as `what`'s errors.
    ///
    /// # Safety
    /// As for [`CudaStore::enqueue`].
    unsafe fn launch(&self, launch: KernelLaunch, stream: Stream, what: &str) -> Result<()> {
        guard(what, || {
            self.bind()?;
            // SAFETY: forwarded.
            unsafe { self.enqueue(launch, stream) }
        })
    }

    /// Enqueues `launch` on `stream`.
    ///
    /// # Safety
    /// Every address in the launch must be valid for the kernel's accesses
    /// until the stream reaches it.
    unsafe fn enqueue(&self, mut launch: KernelLaunch, stream: Stream) -> Result<()> {
        let f = self.kernels.function(launch.kernel())?;
        let name = launch.name();
        let (grid, block, shared) = (launch.grid, launch.block, launch.shared_bytes);
        let mut params = launch.params();
        // SAFETY: the parameters match the kernel (built by the launch
        // planners); addresses are forwarded to the caller.
        unsafe {
            cu::launch_kernel(
                f,
                grid,
                (block, 1, 1),
                shared,
                stream.0 as RawStream,
                &mut params,
            )
        }
        .map_err(|e| driver_error(&format!("launching {name}"), e))
    }
}

/// Enqueues `copies` until one fails, then waits for `stream`, whatever
/// happened: no copy may outlive the host buffer it reads or writes.
fn finish(copies: impl Iterator<Item = Result<()>>, stream: Stream) -> Result<()> {
    let mut enqueued = Ok(());
    for copy in copies {
        if let Err(e) = copy {
            enqueued = Err(e);
            break;
        }
    }
    // SAFETY: the caller's stream of this store's context (API contract).
    let waited = unsafe { cu::stream::synchronize(stream.0 as RawStream) }
        .map_err(|e| driver_error("cuStreamSynchronize", e));
    enqueued.and(waited)
}

impl Drop for CudaStore {
    fn drop(&mut self) {
        let base = self.base;
        let ctx = &self.kernels.ctx;
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if ctx.bind_to_thread().is_ok() {
                // SAFETY: allocated by `new`, freed once; cuMemFree waits for
                // work that still uses it.
                let _ = unsafe { cu::free_sync(base) };
            }
        }));
    }
}

impl LatentStore for CudaStore {
    fn config(&self) -> &CacheConfig {
        &self.config
    }

    fn codec(&self) -> &Codec {
        &self.codec
    }

    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    unsafe fn write_part_raw(
        &self,
        part: Part,
        layer: usize,
        rows: &[MatrixDesc],
        slot_mapping: VectorDesc<i64>,
        stream: Stream,
    ) -> Result<()> {
        let addr = self.part_ptr(part, layer)?;
        let Some(launch) = write_launch(&self.config, part, addr, rows, &slot_mapping)? else {
            return Ok(());
        };
        // SAFETY: the caller vouches for the descriptors (trait contract);
        // the layer is ours.
        unsafe { self.launch(launch, stream, "CUDA write") }
    }

    unsafe fn gather_part_raw(
        &self,
        part: Part,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        out: MatrixDesc,
        stream: Stream,
    ) -> Result<()> {
        let addr = self.part_ptr(part, layer)?;
        let Some(launch) = gather_launch(&self.config, part, addr, &block_table, &out)? else {
            return Ok(());
        };
        // SAFETY: the caller vouches for the descriptors (trait contract);
        // the layer is ours.
        unsafe { self.launch(launch, stream, "CUDA gather") }
    }

    fn copy_blocks(&self, pairs: &[(BlockId, BlockId)], stream: Stream) -> Result<()> {
        let mut launches = copy_blocks_launches(&self.config, self.base, self.layer_stride, pairs)?;
        launches.extend(indexer_copy_blocks_launches(
            &self.config,
            self.indexer_base(0),
            self.indexer_stride,
            pairs,
        )?);
        guard("CUDA copy_blocks", || {
            self.bind()?;
            for launch in launches {
                // SAFETY: block ids were checked; the memory is ours.
                unsafe { self.enqueue(launch, stream) }?;
            }
            Ok(())
        })
    }

    fn layer_view(&self, layer: usize) -> Result<LayerView> {
        let addr = self.layer_ptr(layer)? as usize;
        Ok(layer_view_at(
            &self.config,
            &self.codec,
            self.device(),
            addr,
        ))
    }

    unsafe fn gather_indexer_quantized_raw(
        &self,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        codes: VectorDesc<u8>,
        scales: VectorDesc<f32>,
        stream: Stream,
    ) -> Result<()> {
        let addr = self.part_ptr(Part::Indexer, layer)?;
        let Some(launch) =
            indexer_gather_quantized_launch(&self.config, addr, &block_table, &codes, &scales)?
        else {
            return Ok(());
        };
        // SAFETY: the caller vouches for the descriptors (trait contract);
        // the layer is ours.
        unsafe { self.launch(launch, stream, "CUDA indexer gather") }
    }

    fn indexer_view(&self, layer: usize) -> Result<IndexerView> {
        let indexer = check_indexer(&self.config)?;
        check_layer(&self.config, layer)?;
        Ok(indexer_view_at(
            &self.config,
            indexer,
            self.device(),
            self.indexer_base(layer) as usize,
        ))
    }
}
