//! Launch planning, shared by the store and by anyone who runs the kernels
//! elsewhere (the CPU emulation in the tests): which kernel, its shape and
//! its arguments.

use std::ffi::c_void;

use super::kernels::{Kernel, COPY_PAIRS_PER_LAUNCH, WARPS_PER_BLOCK};
use crate::codec::{Codec, ElemType};
use crate::config::{CacheConfig, Dtype};
use crate::error::{Error, Result};
use crate::store::{
    check_copy_pairs, check_gather_args, check_indexer, check_indexer_quantized_args,
    check_write_args, BlockParts, MatrixDesc, Part, VectorDesc,
};
use crate::BlockId;

/// One kernel launch: which kernel, its shape and its arguments, as the
/// store performs it. Built by [`write_launch`], [`gather_launch`],
/// [`copy_blocks_launches`] and their indexer counterparts; [`KernelLaunch::params`] gives the argument
/// array `cuLaunchKernel` takes.
#[derive(Debug, Clone)]
pub struct KernelLaunch {
    kernel: Kernel,
    /// Grid dimensions.
    pub grid: (u32, u32, u32),
    /// Threads per block (one dimension).
    pub block: u32,
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    args: Vec<Arg>,
}

#[derive(Debug, Clone)]
enum Arg {
    U64(u64),
    I64(i64),
    I32(i32),
    Pairs(Box<CopyPairs>),
}

impl KernelLaunch {
    /// The kernel launched.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// The kernel's name in the source.
    pub fn name(&self) -> String {
        self.kernel.name()
    }

    /// Pointers to each argument, in order, valid while `self` is neither
    /// moved nor dropped (the `kernelParams` of `cuLaunchKernel`).
    pub fn params(&mut self) -> Vec<*mut c_void> {
        self.args
            .iter_mut()
            .map(|a| match a {
                Arg::U64(v) => (v as *mut u64).cast(),
                Arg::I64(v) => (v as *mut i64).cast(),
                Arg::I32(v) => (v as *mut i32).cast(),
                Arg::Pairs(p) => (&mut **p as *mut CopyPairs).cast(),
            })
            .collect()
    }
}

/// The pairs argument of `mla_copy_blocks` (`CopyPairs` in the source).
#[derive(Debug, Clone)]
#[repr(C)]
struct CopyPairs {
    n: u32,
    ids: [u32; 2 * COPY_PAIRS_PER_LAUNCH],
}

/// The element type code the write kernels take for `k_pe` (0 bf16, 1 f16,
/// 2 f32: the enum's discriminant).
fn elem_code(elem: ElemType) -> i32 {
    elem as i32
}

/// Grid of one warp per token.
fn token_grid(tokens: usize) -> Result<(u32, u32, u32)> {
    let blocks = tokens.div_ceil(WARPS_PER_BLOCK as usize);
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| Error::InvalidArgument(format!("{tokens} tokens exceed one launch")))?;
    Ok((blocks, 1, 1))
}

/// Checks what the kernels need beyond a valid config: `bytes_per_token` a
/// multiple of 4 (they store 32-bit words); returns the codec.
pub(super) fn kernel_codec(config: &CacheConfig) -> Result<Codec> {
    let codec = Codec::for_config(config)?;
    let bpt = codec.bytes_per_token();
    if bpt % 4 != 0 {
        return Err(Error::InvalidConfig(format!(
            "the CUDA kernels need bytes_per_token to be a multiple of 4, got {bpt} ({} {}+{})",
            config.dtype, config.kv_lora_rank, config.rope_dim
        )));
    }
    Ok(codec)
}

/// The launch of a write of `part` ([`LatentStore::write_part_raw`]) into
/// the layer whose part starts at `part_addr`; `None` when there are no
/// tokens. Checks the descriptors as the store does (the layer index
/// excepted).
pub fn write_launch(
    config: &CacheConfig,
    part: Part,
    part_addr: u64,
    rows: &[MatrixDesc],
    slot_mapping: &VectorDesc<i64>,
) -> Result<Option<KernelLaunch>> {
    let codec = kernel_codec(config)?;
    check_write_args(config, part, 0, rows, slot_mapping)?;
    let tokens = slot_mapping.len;
    if tokens == 0 {
        return Ok(None);
    }
    let stride = |m: &MatrixDesc| Arg::I64((m.row_stride / m.elem.size()) as i64);
    let (kernel, shared, args) = match part {
        Part::Latent => {
            let (c_kv, k_pe) = (&rows[0], &rows[1]);
            let rank = config.kv_lora_rank;
            let shared = if config.dtype == Dtype::Mxfp6 {
                WARPS_PER_BLOCK as usize * rank
            } else {
                0
            };
            let args = vec![
                Arg::U64(c_kv.addr as u64),
                stride(c_kv),
                Arg::U64(k_pe.addr as u64),
                stride(k_pe),
                Arg::I32(elem_code(k_pe.elem)),
                Arg::U64(slot_mapping.addr as u64),
                Arg::I64(tokens as i64),
                Arg::U64(part_addr),
                Arg::I64(config.num_tokens() as i64),
                Arg::I32(rank as i32),
                Arg::I32(config.rope_dim as i32),
                Arg::I32(codec.bytes_per_token() as i32),
            ];
            let kernel = Kernel::Write {
                format: config.dtype,
                input: c_kv.elem,
            };
            (kernel, shared, args)
        }
        Part::Indexer => {
            let keys = &rows[0];
            let args = vec![
                Arg::U64(keys.addr as u64),
                stride(keys),
                Arg::U64(slot_mapping.addr as u64),
                Arg::I64(tokens as i64),
                Arg::U64(part_addr),
                Arg::I64(config.num_tokens() as i64),
                Arg::I32(config.block_size as i32),
                Arg::I32(kernel_head_dim(config)?),
            ];
            (Kernel::IndexerWrite { input: keys.elem }, 0, args)
        }
    };
    Ok(Some(KernelLaunch {
        kernel,
        grid: token_grid(tokens)?,
        block: 32 * WARPS_PER_BLOCK,
        shared_bytes: u32::try_from(shared)
            .map_err(|_| Error::InvalidConfig("kv_lora_rank too large".into()))?,
        args,
    }))
}

/// The launch of a gather of `part` ([`LatentStore::gather_part_raw`]) from
/// the layer whose part starts at `part_addr`; `None` when `out` has no rows.
pub fn gather_launch(
    config: &CacheConfig,
    part: Part,
    part_addr: u64,
    block_table: &VectorDesc<BlockId>,
    out: &MatrixDesc,
) -> Result<Option<KernelLaunch>> {
    let codec = kernel_codec(config)?;
    check_gather_args(config, part, 0, block_table, out)?;
    if out.rows == 0 {
        return Ok(None);
    }
    // The arguments every gather kernel takes first.
    let mut args = vec![
        Arg::U64(part_addr),
        Arg::U64(block_table.addr as u64),
        Arg::I64(out.rows as i64),
        Arg::I32(config.block_size as i32),
        Arg::I64(config.num_blocks as i64),
        Arg::U64(out.addr as u64),
        Arg::I64((out.row_stride / out.elem.size()) as i64),
    ];
    let kernel = match part {
        Part::Latent => {
            args.extend([
                Arg::I32(config.kv_lora_rank as i32),
                Arg::I32(config.rope_dim as i32),
                Arg::I32(codec.bytes_per_token() as i32),
            ]);
            Kernel::Gather {
                format: config.dtype,
                output: out.elem,
            }
        }
        Part::Indexer => {
            args.push(Arg::I32(kernel_head_dim(config)?));
            Kernel::IndexerGather { output: out.elem }
        }
    };
    Ok(Some(KernelLaunch {
        kernel,
        grid: token_grid(out.rows)?,
        block: 32 * WARPS_PER_BLOCK,
        shared_bytes: 0,
        args,
    }))
}

/// The launches of a `copy_blocks` ([`LatentStore::copy_blocks`]) over all
/// layers of a store whose layer `l` starts at `base + l * layer_stride`
/// (`layer_stride` a multiple of 16 when `block_size * bytes_per_token` is).
/// Up to `COPY_PAIRS_PER_LAUNCH` (480) pairs ride in each launch's parameters.
pub fn copy_blocks_launches(
    config: &CacheConfig,
    base: u64,
    layer_stride: usize,
    pairs: &[(BlockId, BlockId)],
) -> Result<Vec<KernelLaunch>> {
    let codec = kernel_codec(config)?;
    copy_launches(
        config,
        base,
        layer_stride,
        config.block_size * codec.bytes_per_token(),
        pairs,
    )
}

/// The launches that copy the indexer part of `copy_blocks` pairs over all
/// layers of a store whose layer `l`'s indexer keys start at `base + l *
/// layer_stride`; none without an indexer.
pub fn indexer_copy_blocks_launches(
    config: &CacheConfig,
    base: u64,
    layer_stride: usize,
    pairs: &[(BlockId, BlockId)],
) -> Result<Vec<KernelLaunch>> {
    if config.indexer.is_none() {
        check_copy_pairs(config, pairs)?;
        return Ok(Vec::new());
    }
    copy_launches(
        config,
        base,
        layer_stride,
        BlockParts::of(config).indexer,
        pairs,
    )
}

/// `mla_copy_blocks` launches over parts of `block_bytes` bytes per block.
fn copy_launches(
    config: &CacheConfig,
    base: u64,
    layer_stride: usize,
    block_bytes: usize,
    pairs: &[(BlockId, BlockId)],
) -> Result<Vec<KernelLaunch>> {
    check_copy_pairs(config, pairs)?;
    let layers = u32::try_from(config.num_layers)
        .ok()
        .filter(|&l| l <= 65535)
        .ok_or_else(|| Error::InvalidConfig("copy_blocks supports at most 65535 layers".into()))?;
    Ok(pairs
        .chunks(COPY_PAIRS_PER_LAUNCH)
        .map(|chunk| {
            let mut batch = Box::new(CopyPairs {
                n: chunk.len() as u32,
                ids: [0; 2 * COPY_PAIRS_PER_LAUNCH],
            });
            for (i, &(src, dst)) in chunk.iter().enumerate() {
                batch.ids[2 * i] = src;
                batch.ids[2 * i + 1] = dst;
            }
            KernelLaunch {
                kernel: Kernel::CopyBlocks,
                grid: (chunk.len() as u32, layers, 1),
                block: 256,
                shared_bytes: 0,
                args: vec![
                    Arg::U64(base),
                    Arg::I64(layer_stride as i64),
                    Arg::I64(block_bytes as i64),
                    Arg::I64(config.num_blocks as i64),
                    Arg::Pairs(batch),
                    Arg::I32(i32::from(
                        block_bytes % 16 == 0 && layer_stride % 16 == 0 && base % 16 == 0,
                    )),
                ],
            }
        })
        .collect())
}

/// Checks what the indexer kernels need; returns the key width.
fn kernel_head_dim(config: &CacheConfig) -> Result<i32> {
    let indexer = check_indexer(config)?;
    i32::try_from(indexer.head_dim)
        .map_err(|_| Error::InvalidConfig("indexer head_dim too large".into()))
}

/// The launch of a quantized indexer gather
/// ([`LatentStore::gather_indexer_quantized_raw`]); `None` without tokens.
pub fn indexer_gather_quantized_launch(
    config: &CacheConfig,
    indexer_addr: u64,
    block_table: &VectorDesc<BlockId>,
    codes: &VectorDesc<u8>,
    scales: &VectorDesc<f32>,
) -> Result<Option<KernelLaunch>> {
    check_indexer_quantized_args(config, 0, block_table, codes, scales)?;
    let head_dim = kernel_head_dim(config)?;
    if scales.len == 0 {
        return Ok(None);
    }
    Ok(Some(KernelLaunch {
        kernel: Kernel::IndexerGatherQuantized,
        grid: token_grid(scales.len)?,
        block: 32 * WARPS_PER_BLOCK,
        shared_bytes: 0,
        args: vec![
            Arg::U64(indexer_addr),
            Arg::U64(block_table.addr as u64),
            Arg::I64(scales.len as i64),
            Arg::I32(config.block_size as i32),
            Arg::I64(config.num_blocks as i64),
            Arg::U64(codes.addr as u64),
            Arg::U64(scales.addr as u64),
            Arg::I32(head_dim),
        ],
    }))
}
