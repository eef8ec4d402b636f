//! The kernel table: the entry points of `kernels.cu` named by what they do
//! (format and element type), the launch constants the source is compiled
//! with, and the kernels loaded once per device.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result as cu, sys, CudaContext};

use super::nvrtc::{arch_for, compile_kernels};
use crate::codec::ElemType;
use crate::config::Dtype;
use crate::error::{Error, Result};
use crate::store::GATHER_OUTPUTS;

/// The CUDA C source of every kernel, compiled by NVRTC at run time with the
/// macros of [`kernel_defines`].
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// Warps per thread block in write and gather: one warp per token.
pub(super) const WARPS_PER_BLOCK: u32 = 4;
/// Block pairs one `mla_copy_blocks` launch carries in its parameters.
pub(super) const COPY_PAIRS_PER_LAUNCH: usize = 480;

/// The macros [`KERNEL_SOURCE`] needs, as `(name, value)`: the launch
/// constants are defined here only and handed to the compiler (NVRTC's `-D`).
pub fn kernel_defines() -> [(&'static str, usize); 2] {
    [
        ("WARPS_PER_BLOCK", WARPS_PER_BLOCK as usize),
        ("COPY_PAIRS_PER_LAUNCH", COPY_PAIRS_PER_LAUNCH),
    ]
}

/// An entry point of [`KERNEL_SOURCE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Quantizes rows of `input` elements into a layer in `format`.
    Write {
        /// The stored format.
        format: Dtype,
        /// The element type of `c_kv` (and of `k_pe`'s code argument).
        input: ElemType,
    },
    /// Dequantizes a layer in `format` through a block table into `output`.
    Gather {
        /// The stored format.
        format: Dtype,
        /// The element type written (bf16 or f32).
        output: ElemType,
    },
    /// Copies blocks within every layer (any format).
    CopyBlocks,
    /// Quantizes rows of `input` elements into a layer's indexer keys.
    IndexerWrite {
        /// The element type of the keys.
        input: ElemType,
    },
    /// Dequantizes a layer's indexer keys through a block table into `output`.
    IndexerGather {
        /// The element type written (bf16 or f32).
        output: ElemType,
    },
    /// Copies a layer's stored indexer codes and scales through a block table.
    IndexerGatherQuantized,
}

impl Kernel {
    /// Every entry point of the source.
    pub fn all() -> Vec<Kernel> {
        let writes = Dtype::ALL.into_iter().flat_map(|format| {
            ElemType::ALL
                .into_iter()
                .map(move |input| Kernel::Write { format, input })
        });
        let gathers = Dtype::ALL.into_iter().flat_map(|format| {
            GATHER_OUTPUTS
                .into_iter()
                .map(move |output| Kernel::Gather { format, output })
        });
        let indexer = ElemType::ALL
            .into_iter()
            .map(|input| Kernel::IndexerWrite { input })
            .chain(
                GATHER_OUTPUTS
                    .into_iter()
                    .map(|output| Kernel::IndexerGather { output }),
            )
            .chain([Kernel::IndexerGatherQuantized]);
        writes
            .chain(gathers)
            .chain([Kernel::CopyBlocks])
            .chain(indexer)
            .collect()
    }

    /// The function's name in the source (`mla_write_fp8_ds_mla_from_bf16`, ...).
    pub fn name(self) -> String {
        match self {
            Kernel::Write { format, input } => format!("mla_write_{format}_from_{input}"),
            Kernel::Gather { format, output } => format!("mla_gather_{format}_to_{output}"),
            Kernel::CopyBlocks => "mla_copy_blocks".to_string(),
            Kernel::IndexerWrite { input } => format!("mla_indexer_write_from_{input}"),
            Kernel::IndexerGather { output } => format!("mla_indexer_gather_to_{output}"),
            Kernel::IndexerGatherQuantized => "mla_indexer_gather_quantized".to_string(),
        }
    }
}

/// The kernels loaded into one device's primary context.
pub(super) struct DeviceKernels {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) arch: String,
    functions: HashMap<Kernel, sys::CUfunction>,
}

// SAFETY: CUfunction handles are plain driver handles, valid from any thread
// once their context is current; the module is never unloaded.
unsafe impl Send for DeviceKernels {}
// SAFETY: as above; the handles are only read.
unsafe impl Sync for DeviceKernels {}

impl DeviceKernels {
    /// The loaded function of `kernel` (every [`Kernel`] is loaded).
    pub(super) fn function(&self, kernel: Kernel) -> Result<sys::CUfunction> {
        self.functions
            .get(&kernel)
            .copied()
            .ok_or_else(|| Error::Storage(format!("kernel {} not loaded", kernel.name())))
    }
}

/// Kernels per device ordinal, compiled and loaded once per process. The
/// modules (and the primary contexts they live in) stay loaded for the life
/// of the process.
static DEVICE_KERNELS: Mutex<Vec<(usize, Arc<DeviceKernels>)>> = Mutex::new(Vec::new());

/// Checks that a driver and device `ordinal` exist (no panics on machines
/// without libcuda).
pub(super) fn check_device(ordinal: usize) -> Result<()> {
    // SAFETY: only tries to dlopen the candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Storage(
            "no CUDA driver: libcuda could not be loaded (no NVIDIA GPU or driver on this machine)"
                .into(),
        ));
    }
    cu::init().map_err(|e| driver_error("cuInit", e))?;
    let count = cu::device::get_count().map_err(|e| driver_error("cuDeviceGetCount", e))?;
    if ordinal >= count as usize {
        return Err(Error::Storage(format!(
            "no CUDA device {ordinal} ({count} present)"
        )));
    }
    Ok(())
}

/// A driver error as [`Error::Storage`], with the driver's name for it.
pub(super) fn driver_error(what: &str, e: cu::DriverError) -> Error {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    Error::Storage(format!("{what} failed: {name}"))
}

/// The kernels of device `ordinal`, compiled and loaded on first use.
pub(super) fn device_kernels(ordinal: usize) -> Result<Arc<DeviceKernels>> {
    let mut cache = DEVICE_KERNELS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, k)) = cache.iter().find(|(o, _)| *o == ordinal) {
        return Ok(k.clone());
    }
    let ctx =
        CudaContext::new(ordinal).map_err(|e| driver_error("retaining the primary context", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
    let compiled = compile_kernels(&arch_for(major, minor))?;
    ctx.bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    // SAFETY: a cubin NVRTC just produced, loaded into the current context.
    let module = unsafe { cu::module::load_data(compiled.image.as_ptr().cast()) }
        .map_err(|e| driver_error(&format!("loading the {} kernels", compiled.arch), e))?;
    let functions = Kernel::all()
        .into_iter()
        .map(|kernel| {
            let name = kernel.name();
            let c = CString::new(name.as_str()).expect("kernel names have no NUL");
            // SAFETY: `module` is loaded and never unloaded.
            unsafe { cu::module::get_function(module, c) }
                .map(|f| (kernel, f))
                .map_err(|e| driver_error(&format!("kernel {name}"), e))
        })
        .collect::<Result<HashMap<_, _>>>()?;
    let kernels = Arc::new(DeviceKernels {
        ctx,
        arch: compiled.arch,
        functions,
    });
    cache.push((ordinal, kernels.clone()));
    Ok(kernels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_defined_once_in_the_source() {
        let kernels = Kernel::all();
        assert_eq!(kernels.len(), 4 * 3 + 4 * 2 + 1 + 3 + 2 + 1);
        for kernel in &kernels {
            let name = kernel.name();
            // Defined by a WRITE_KERNEL/GATHER_KERNEL line or a plain definition.
            let defined = KERNEL_SOURCE.matches(&format!("({name},")).count()
                + KERNEL_SOURCE.matches(&format!(" {name}(")).count();
            assert_eq!(defined, 1, "{name} defined {defined} times in kernels.cu");
        }
    }

    #[test]
    fn the_launch_constants_are_not_defined_in_the_source() {
        for (name, _) in kernel_defines() {
            assert!(
                !KERNEL_SOURCE.contains(&format!("#define {name}")),
                "{name} is defined in kernels.cu as well"
            );
        }
    }
}
