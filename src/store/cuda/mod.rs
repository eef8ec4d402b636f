//! The CUDA store: the latent cache in device memory, written, gathered and
//! copied by kernels (`kernels.cu`) that NVRTC compiles at first use.
//!
//! - Every operation is enqueued on a stream the caller passes as a raw
//!   `CUstream` (the engine's stream); nothing inside an operation
//!   synchronizes.
//! - The kernels reproduce the CPU codec bit for bit: scales are powers of
//!   two computed from exponent bits, every rounding is to nearest even and is
//!   done on bit patterns, NaN and infinities follow the same rules.
//! - Without libcuda, without a device or without libnvrtc, construction
//!   returns [`Error::Storage`]; nothing panics.
//!
//! Finding libnvrtc: cudarc opens `libnvrtc.so` (then `libnvrtc.so.12`, ...)
//! through the dynamic loader, so the directory holding it must be on
//! `LD_LIBRARY_PATH` when the process starts, or be loaded before first use:
//! set `MLA_CACHE_NVRTC` to the library file or its directory (for example the
//! `nvidia/cuda_nvrtc/lib` directory of the `nvidia-cuda-nvrtc-cu12` wheel),
//! or call [`preload_nvrtc`].
//!
//! The module's parts: loading libnvrtc and compiling (`nvrtc.rs`), the kernel
//! table and its per-device modules (`kernels.rs`), the launch planning the
//! store and the kernel emulation share (`launch.rs`), and the store itself
//! (`store.rs`).

mod kernels;
mod launch;
mod nvrtc;
mod store;

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use kernels::{kernel_defines, Kernel, KERNEL_SOURCE};
pub use launch::{
    copy_blocks_launches, gather_launch, indexer_copy_blocks_launches,
    indexer_gather_quantized_launch, write_launch, KernelLaunch,
};
pub use nvrtc::{
    arch_for, compile_kernels, compile_source, nvrtc_available, nvrtc_version, preload_nvrtc,
    CompiledKernels, NVRTC_ENV,
};
pub use store::CudaStore;

use crate::error::{Error, Result};

/// A raw CUDA stream handle (`CUstream`); null is the legacy default stream.
pub type RawStream = cudarc::driver::sys::CUstream;

/// Runs `f`, turning a panic (cudarc panics when a library or a symbol is
/// missing) into [`Error::Storage`].
fn guard<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(Error::Storage(format!("{what}: {msg}")))
        }
    }
}
