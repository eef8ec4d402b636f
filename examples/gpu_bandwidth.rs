//! Write and gather bandwidth of the CUDA store at 1, 64 and 16,384 tokens,
//! next to a device-to-device memcpy of the same bytes, timed with CUDA
//! events. Needs a GPU:
//!
//! ```text
//! cargo run --release --features cuda --example gpu_bandwidth
//! ```
//!
//! Bandwidth counts bytes read plus bytes written: a write reads bf16 `c_kv`
//! and `k_pe` and the slots and writes the latents; a gather reads the
//! latents and the block table and writes bf16 rows; the memcpy of `n`
//! bytes moves `2n`. The memcpy copies as many bytes as the kernel writes.

use cudarc::driver::result::stream::StreamKind;
use cudarc::driver::{result as cu, sys, CudaContext};
use mla_cache::codec::ElemType;
use mla_cache::store::{CudaStore, LatentStore, MatrixDesc, Stream, VectorDesc};
use mla_cache::{BlockId, CacheConfig, Dtype};

const TOKENS: [usize; 3] = [1, 64, 16_384];

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Timer {
    start: sys::CUevent,
    end: sys::CUevent,
    stream: sys::CUstream,
}

impl Timer {
    /// Mean time of `f` in microseconds over enough runs for a stable figure.
    fn time(&self, tokens: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
        let iters = if tokens >= 4096 { 50 } else { 500 };
        for _ in 0..5 {
            f()?;
        }
        // SAFETY: our events and stream.
        unsafe { cu::event::record(self.start, self.stream) }?;
        for _ in 0..iters {
            f()?;
        }
        unsafe {
            cu::event::record(self.end, self.stream)?;
            cu::event::synchronize(self.end)?;
            Ok(f64::from(cu::event::elapsed(self.start, self.end)?) * 1000.0 / iters as f64)
        }
    }
}

fn alloc(bytes: usize) -> Res<sys::CUdeviceptr> {
    // SAFETY: a plain allocation, initialized below or by the kernels.
    let ptr = unsafe { cu::malloc_sync(bytes.max(1)) }?;
    unsafe { cu::memset_d8_sync(ptr, 0, bytes.max(1)) }?;
    Ok(ptr)
}

fn upload<T>(values: &[T]) -> Res<sys::CUdeviceptr> {
    let ptr = alloc(std::mem::size_of_val(values))?;
    // SAFETY: `ptr` has room for `values`.
    unsafe { cu::memcpy_htod_sync(ptr, values) }?;
    Ok(ptr)
}

fn gbps(bytes: usize, us: f64) -> f64 {
    bytes as f64 / us / 1e3
}

fn main() -> Res<()> {
    let max_tokens = *TOKENS.iter().max().unwrap();
    // A first store says cleanly whether there is a GPU (cudarc itself
    // panics without libcuda).
    drop(CudaStore::new(&CacheConfig::new(1), 0)?);
    let ctx = CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    println!(
        "device 0: {}, compute capability {:?}",
        ctx.name()?,
        ctx.compute_capability()?
    );
    let stream = cu::stream::create(StreamKind::Default)?;
    let timer = Timer {
        start: cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?,
        end: cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?,
        stream,
    };
    // Inputs shared by every format: bf16 c_kv [T, 512], k_pe [T, 64].
    let values: Vec<u16> = (0..max_tokens * 576)
        .map(|i| half::bf16::from_f32(((i * 7919) % 1000) as f32 / 300.0 - 1.6).to_bits())
        .collect();
    let c_kv = upload(&values[..max_tokens * 512])?;
    let k_pe = upload(&values[max_tokens * 512..])?;
    let slots: Vec<i64> = (0..max_tokens as i64).collect();
    let d_slots = upload(&slots)?;
    let out = alloc(max_tokens * 576 * 2)?;
    let scratch = alloc(max_tokens * 1152)?;

    println!(
        "{:<11} {:<7} {:>7} {:>11} {:>9} {:>12} {:>9} {:>8}",
        "format", "op", "tokens", "kernel us", "GB/s", "memcpy us", "GB/s", "vs copy"
    );
    for dtype in Dtype::ALL {
        let mut config = CacheConfig::new(max_tokens / 64);
        config.dtype = dtype;
        let store = CudaStore::new(&config, 0)?;
        let bpt = config.bytes_per_token_per_layer();
        let table: Vec<BlockId> = (0..config.num_blocks as BlockId).collect();
        let d_table = upload(&table)?;
        let s = Stream(stream as usize);
        for &t in &TOKENS {
            let ckv = MatrixDesc::contiguous(c_kv as usize, ElemType::Bf16, t, 512);
            let kpe = MatrixDesc::contiguous(k_pe as usize, ElemType::Bf16, t, 64);
            let slot_desc = VectorDesc::new(d_slots as usize, t);
            // SAFETY: device buffers that outlive the synchronized timings.
            let write_us = timer.time(t, || {
                Ok(unsafe { store.write_raw(0, ckv, kpe, slot_desc, s) }?)
            })?;
            let out_desc = MatrixDesc::contiguous(out as usize, ElemType::Bf16, t, 576);
            let table_desc = VectorDesc::new(d_table as usize, t.div_ceil(64));
            let gather_us = timer.time(t, || {
                Ok(unsafe { store.gather_raw(0, table_desc, out_desc, s) }?)
            })?;
            let layer = store.layer_ptr(0)?;
            let copy = |dst: sys::CUdeviceptr, src: sys::CUdeviceptr, n: usize| {
                // SAFETY: both buffers hold at least `n` bytes.
                move || Ok(unsafe { cu::memcpy_dtod_async(dst, src, n, stream) }?)
            };
            let write_copy_us = timer.time(t, copy(layer, scratch, t * bpt))?;
            let gather_copy_us = timer.time(t, copy(out, scratch, t * 576 * 2))?;
            let write_bytes = t * (576 * 2 + 8 + bpt);
            let gather_bytes = t * (bpt + 576 * 2) + 4 * t.div_ceil(64);
            for (op, us, bytes, copy_us, copied) in [
                ("write", write_us, write_bytes, write_copy_us, t * bpt),
                (
                    "gather",
                    gather_us,
                    gather_bytes,
                    gather_copy_us,
                    t * 576 * 2,
                ),
            ] {
                println!(
                    "{:<11} {:<7} {:>7} {:>11.2} {:>9.1} {:>12.2} {:>9.1} {:>7.2}x",
                    dtype.name(),
                    op,
                    t,
                    us,
                    gbps(bytes, us),
                    copy_us,
                    gbps(2 * copied, copy_us),
                    copy_us / us
                );
            }
        }
        // SAFETY: no work in flight uses the table.
        unsafe {
            cu::stream::synchronize(stream)?;
            cu::free_sync(d_table)?
        };
    }
    println!("(\"vs copy\" > 1 means the kernel took less time than copying the bytes it writes)");
    Ok(())
}
