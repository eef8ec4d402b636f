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

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result as cu, sys, CudaContext};
use cudarc::nvrtc::{result as rtc, sys as rtc_sys};

use super::{
    check_block_io, check_copy_pairs, check_gather_args, check_layer, check_write_args,
    layer_view_at, Device, LatentStore, LayerView, MatrixDesc, Stream, VectorDesc,
};
use crate::codec::{Codec, ElemType};
use crate::config::{CacheConfig, Dtype};
use crate::error::{Error, Result};
use crate::BlockId;

/// The CUDA C source of every kernel, compiled by NVRTC at run time.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// The entry points of [`KERNEL_SOURCE`].
pub const KERNEL_NAMES: [&str; 16] = [
    "mla_write_bf16_from_bf16",
    "mla_write_bf16_from_f16",
    "mla_write_bf16_from_f32",
    "mla_write_fp8_ds_mla_from_bf16",
    "mla_write_fp8_ds_mla_from_f16",
    "mla_write_fp8_ds_mla_from_f32",
    "mla_write_mxfp6_from_bf16",
    "mla_write_mxfp6_from_f16",
    "mla_write_mxfp6_from_f32",
    "mla_gather_bf16_to_bf16",
    "mla_gather_bf16_to_f32",
    "mla_gather_fp8_ds_mla_to_bf16",
    "mla_gather_fp8_ds_mla_to_f32",
    "mla_gather_mxfp6_to_bf16",
    "mla_gather_mxfp6_to_f32",
    "mla_copy_blocks",
];

/// Environment variable naming libnvrtc (the file, or its directory) to load
/// before cudarc looks for it.
pub const NVRTC_ENV: &str = "MLA_CACHE_NVRTC";

/// Options every compilation uses: IEEE division, no flush to zero, no fused
/// multiply-add (the kernels' float operations must round exactly as the CPU's).
const NVRTC_OPTIONS: [&str; 5] = [
    "--std=c++17",
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
];

/// Warps per thread block in write and gather (`WARPS_PER_BLOCK` in the source).
const WARPS_PER_BLOCK: u32 = 4;
/// Pairs one `mla_copy_blocks` launch carries (`COPY_PAIRS_PER_LAUNCH`).
const COPY_PAIRS_PER_LAUNCH: usize = 480;

/// A raw CUDA stream handle (`CUstream`); null is the legacy default stream.
pub type RawStream = sys::CUstream;

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

// ---------------------------------------------------------------------------
// NVRTC

/// Loads libnvrtc from `path` (the library file, or a directory holding
/// `libnvrtc.so.12` or `libnvrtc.so`) so that cudarc finds it already loaded.
/// The library stays loaded for the life of the process.
pub fn preload_nvrtc(path: &Path) -> Result<()> {
    let candidates: Vec<std::path::PathBuf> = if path.is_dir() {
        ["libnvrtc.so.12", "libnvrtc.so"]
            .iter()
            .map(|n| path.join(n))
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    let mut tried = Vec::new();
    for file in candidates {
        if !file.exists() {
            tried.push(format!("{} (missing)", file.display()));
            continue;
        }
        let c = CString::new(file.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::InvalidArgument(format!("bad path {}", file.display())))?;
        // SAFETY: dlopen of a NUL-terminated path; the handle is kept open on
        // purpose (never closed), so symbols looked up later stay valid.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !handle.is_null() {
            return Ok(());
        }
        // SAFETY: dlerror returns a thread-local C string or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null dlerror strings are NUL-terminated.
            unsafe { std::ffi::CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        tried.push(format!("{} ({msg})", file.display()));
    }
    Err(Error::Storage(format!(
        "cannot load libnvrtc: tried {}",
        tried.join(", ")
    )))
}

static NVRTC_ENV_PRELOAD: OnceLock<std::result::Result<(), String>> = OnceLock::new();
static NVRTC_FOUND: AtomicBool = AtomicBool::new(false);

/// Makes libnvrtc loadable (honouring [`NVRTC_ENV`]) or says why it is not.
fn ensure_nvrtc() -> Result<()> {
    let pre = NVRTC_ENV_PRELOAD.get_or_init(|| match std::env::var_os(NVRTC_ENV) {
        Some(p) if !p.is_empty() => preload_nvrtc(Path::new(&p)).map_err(|e| e.to_string()),
        _ => Ok(()),
    });
    if let Err(e) = pre {
        return Err(Error::Storage(format!("{NVRTC_ENV}: {e}")));
    }
    if NVRTC_FOUND.load(Ordering::Relaxed) {
        return Ok(());
    }
    // SAFETY: only tries to dlopen the candidate names.
    if unsafe { rtc_sys::is_culib_present() } {
        NVRTC_FOUND.store(true, Ordering::Relaxed);
        Ok(())
    } else {
        Err(Error::Storage(format!(
            "libnvrtc (CUDA 12) not found: put its directory on LD_LIBRARY_PATH, \
             or set {NVRTC_ENV} to the library or its directory"
        )))
    }
}

/// Whether libnvrtc can be loaded (see [`preload_nvrtc`] and [`NVRTC_ENV`]).
pub fn nvrtc_available() -> bool {
    ensure_nvrtc().is_ok()
}

/// NVRTC's version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    guard("nvrtcVersion", || {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let r = unsafe { rtc_sys::nvrtcVersion(&mut major, &mut minor) };
        r.result()
            .map_err(|e| Error::Storage(format!("nvrtcVersion: {e:?}")))?;
        Ok((major, minor))
    })
}

/// The target the kernels are compiled for on a device of compute capability
/// `major.minor`: `sm_80` for Ampere (8.x runs sm_80 code), `sm_90a` for
/// Hopper, the device's own `sm_XY` otherwise.
pub fn arch_for(major: i32, minor: i32) -> String {
    match major {
        8 => "sm_80".to_string(),
        9 => "sm_90a".to_string(),
        _ => format!("sm_{major}{minor}"),
    }
}

/// The kernels compiled for one architecture.
#[derive(Debug, Clone)]
pub struct CompiledKernels {
    /// The target (`sm_90a`, or `compute_XY` for PTX).
    pub arch: String,
    /// The module image: a cubin for `sm_*` targets, NUL-terminated PTX for
    /// `compute_*` ones. Loadable with `cuModuleLoadData`.
    pub image: Vec<u8>,
    /// NVRTC's log (warnings); empty when the compiler had nothing to say.
    pub log: String,
}

/// Compiles [`KERNEL_SOURCE`] for `arch` (`sm_80`, `sm_90a`, ... for a cubin;
/// `compute_XY` for PTX). Needs libnvrtc, not a GPU.
pub fn compile_kernels(arch: &str) -> Result<CompiledKernels> {
    compile_source(KERNEL_SOURCE, arch)
}

/// Compiles CUDA C `source` for `arch` with the options the kernels use
/// (IEEE division, no flush to zero, no fused multiply-add); the error
/// carries NVRTC's log.
pub fn compile_source(source: &str, arch: &str) -> Result<CompiledKernels> {
    ensure_nvrtc()?;
    guard("NVRTC", || compile_unguarded(source, arch))
}

fn compile_unguarded(source: &str, arch: &str) -> Result<CompiledKernels> {
    let src = CString::new(source)
        .map_err(|_| Error::InvalidArgument("CUDA source contains NUL".into()))?;
    let prog = rtc::create_program(&src, Some(c"mla_cache_kernels.cu"))
        .map_err(|e| Error::Storage(format!("nvrtcCreateProgram: {e:?}")))?;
    let mut options: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` is a live program until destroy_program below.
    let compiled = unsafe { rtc::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { rtc::get_program_log(prog) }
        .map(|raw| {
            let bytes: Vec<u8> = raw
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        })
        .unwrap_or_default();
    let image = compiled
        .map_err(|e| {
            Error::Storage(format!(
                "NVRTC could not compile the kernels for {arch}: {e:?}\n{log}"
            ))
        })
        .and_then(|()| {
            // SAFETY: the program compiled; buffers are sized by NVRTC.
            unsafe { program_image(prog, arch.starts_with("sm_")) }
        });
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { rtc::destroy_program(prog) };
    Ok(CompiledKernels {
        arch: arch.to_string(),
        image: image?,
        log,
    })
}

/// The cubin (`cubin`) or PTX of a compiled program.
unsafe fn program_image(prog: rtc_sys::nvrtcProgram, cubin: bool) -> Result<Vec<u8>> {
    let what = if cubin {
        "nvrtcGetCUBIN"
    } else {
        "nvrtcGetPTX"
    };
    let err = |e: rtc_sys::nvrtcResult| Error::Storage(format!("{what}: {e:?}"));
    let mut size = 0usize;
    // SAFETY (whole block): valid program, out-pointers and buffers of the
    // size NVRTC reported.
    unsafe {
        if cubin {
            rtc_sys::nvrtcGetCUBINSize(prog, &mut size)
                .result()
                .map_err(|e| err(e.0))?;
            let mut buf = vec![0u8; size];
            rtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                .result()
                .map_err(|e| err(e.0))?;
            Ok(buf)
        } else {
            rtc_sys::nvrtcGetPTXSize(prog, &mut size)
                .result()
                .map_err(|e| err(e.0))?;
            let mut buf = vec![0u8; size];
            rtc_sys::nvrtcGetPTX(prog, buf.as_mut_ptr().cast())
                .result()
                .map_err(|e| err(e.0))?;
            Ok(buf)
        }
    }
}

// ---------------------------------------------------------------------------
// Per-device kernels

/// Index of a function in [`KERNEL_NAMES`].
fn write_kernel(dtype: Dtype, elem: ElemType) -> usize {
    3 * dtype_index(dtype) + elem_index(elem)
}

fn gather_kernel(dtype: Dtype, out: ElemType) -> usize {
    9 + 2 * dtype_index(dtype) + usize::from(out == ElemType::F32)
}

const COPY_KERNEL: usize = 15;

fn dtype_index(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bf16 => 0,
        Dtype::Fp8DsMla => 1,
        Dtype::Mxfp6 => 2,
    }
}

/// The element type code the kernels take (0 bf16, 1 f16, 2 f32).
fn elem_index(elem: ElemType) -> usize {
    match elem {
        ElemType::Bf16 => 0,
        ElemType::F16 => 1,
        ElemType::F32 => 2,
    }
}

/// The kernels loaded into one device's primary context.
struct DeviceKernels {
    ctx: Arc<CudaContext>,
    arch: String,
    functions: Vec<sys::CUfunction>,
}

// SAFETY: CUfunction handles are plain driver handles, valid from any thread
// once their context is current; the module is never unloaded.
unsafe impl Send for DeviceKernels {}
// SAFETY: as above; the handles are only read.
unsafe impl Sync for DeviceKernels {}

/// Kernels per device ordinal, compiled and loaded once per process. The
/// modules (and the primary contexts they live in) stay loaded for the life
/// of the process.
static DEVICE_KERNELS: Mutex<Vec<(usize, Arc<DeviceKernels>)>> = Mutex::new(Vec::new());

/// Checks that a driver and device `ordinal` exist (no panics on machines
/// without libcuda).
fn check_device(ordinal: usize) -> Result<()> {
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

fn driver_error(what: &str, e: cu::DriverError) -> Error {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    Error::Storage(format!("{what} failed: {name}"))
}

fn device_kernels(ordinal: usize) -> Result<Arc<DeviceKernels>> {
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
    let functions = KERNEL_NAMES
        .iter()
        .map(|name| {
            let c = CString::new(*name).expect("kernel names have no NUL");
            // SAFETY: `module` is loaded and never unloaded.
            unsafe { cu::module::get_function(module, c) }
                .map_err(|e| driver_error(&format!("kernel {name}"), e))
        })
        .collect::<Result<Vec<_>>>()?;
    let kernels = Arc::new(DeviceKernels {
        ctx,
        arch: compiled.arch,
        functions,
    });
    cache.push((ordinal, kernels.clone()));
    Ok(kernels)
}

// ---------------------------------------------------------------------------
// The store

/// Latent storage for all layers in the memory of one CUDA device.
///
/// One device allocation holds every layer (`[num_blocks][block_size]
/// [bytes_per_token]` bytes each, 256-byte aligned). Operations take the
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
}

impl std::fmt::Debug for CudaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStore")
            .field("config", &self.config)
            .field("device", &self.ordinal)
            .field("arch", &self.kernels.arch)
            .field("bytes", &(self.layer_stride * self.config.num_layers))
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
        let total = layer_stride
            .checked_mul(config.num_layers)
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

    /// Bytes of one block in all layers (`num_layers x block_size x bytes_per_token`).
    pub fn block_bytes(&self) -> usize {
        self.config.num_layers * self.config.block_size * self.codec.bytes_per_token()
    }

    /// Copies block `block` of every layer, in stored format, into `out`
    /// (`block_bytes()` bytes, layer after layer, as the host store lays
    /// them out): device-to-host copies enqueued on `stream`, after the
    /// work the caller enqueued there, then waited for.
    pub fn read_block(&self, block: BlockId, out: &mut [u8], stream: Stream) -> Result<()> {
        let per_layer = check_block_io(&self.config, &self.codec, block, out.len())?;
        let offset = (block as usize * per_layer) as u64;
        guard("CUDA read_block", || {
            self.bind()?;
            let copies = out
                .chunks_exact_mut(per_layer)
                .enumerate()
                .map(|(layer, chunk)| {
                    // SAFETY: the source is inside layer `layer` (block checked); the
                    // destination outlives the copy, which `finish` waits for.
                    unsafe {
                        cu::memcpy_dtoh_async(
                            chunk,
                            self.layer_base(layer) + offset,
                            stream.0 as RawStream,
                        )
                    }
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
        let per_layer = check_block_io(&self.config, &self.codec, block, data.len())?;
        let offset = (block as usize * per_layer) as u64;
        guard("CUDA write_block", || {
            self.bind()?;
            let copies = data
                .chunks_exact(per_layer)
                .enumerate()
                .map(|(layer, chunk)| {
                    // SAFETY: the destination is inside layer `layer` (block
                    // checked); the source outlives the copy (`finish` waits).
                    unsafe {
                        cu::memcpy_htod_async(
                            self.layer_base(layer) + offset,
                            chunk,
                            stream.0 as RawStream,
                        )
                    }
                    .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
                });
            finish(copies, stream)
        })
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

    /// Enqueues `launch` on `stream`.
    ///
    /// # Safety
    /// Every address in the launch must be valid for the kernel's accesses
    /// until the stream reaches it.
    unsafe fn enqueue(&self, mut launch: KernelLaunch, stream: Stream) -> Result<()> {
        let f = self.kernels.functions[launch.kernel];
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

// ---------------------------------------------------------------------------
// Launch planning (shared by the store and by anyone who runs the kernels)

/// One kernel launch: which kernel, its shape and its arguments, as the
/// store performs it. Built by [`write_launch`], [`gather_launch`] and
/// [`copy_blocks_launches`]; [`KernelLaunch::params`] gives the argument
/// array `cuLaunchKernel` takes.
#[derive(Debug, Clone)]
pub struct KernelLaunch {
    kernel: usize,
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
    /// The kernel's name (one of [`KERNEL_NAMES`]).
    pub fn name(&self) -> &'static str {
        KERNEL_NAMES[self.kernel]
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
fn kernel_codec(config: &CacheConfig) -> Result<Codec> {
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

/// The launch of a write ([`LatentStore::write_raw`]) into the layer whose
/// first byte is at `layer_addr`; `None` when there are no tokens. Checks the
/// descriptors as the store does (the layer index excepted).
pub fn write_launch(
    config: &CacheConfig,
    layer_addr: u64,
    c_kv: &MatrixDesc,
    k_pe: &MatrixDesc,
    slot_mapping: &VectorDesc<i64>,
) -> Result<Option<KernelLaunch>> {
    let codec = kernel_codec(config)?;
    check_write_args(config, 0, c_kv, k_pe, slot_mapping)?;
    let tokens = slot_mapping.len;
    if tokens == 0 {
        return Ok(None);
    }
    let rank = config.kv_lora_rank;
    let shared = if config.dtype == Dtype::Mxfp6 {
        WARPS_PER_BLOCK as usize * rank
    } else {
        0
    };
    let args = vec![
        Arg::U64(c_kv.addr as u64),
        Arg::I64((c_kv.row_stride / c_kv.elem.size()) as i64),
        Arg::U64(k_pe.addr as u64),
        Arg::I64((k_pe.row_stride / k_pe.elem.size()) as i64),
        Arg::I32(elem_index(k_pe.elem) as i32),
        Arg::U64(slot_mapping.addr as u64),
        Arg::I64(tokens as i64),
        Arg::U64(layer_addr),
        Arg::I64(config.num_tokens() as i64),
        Arg::I32(rank as i32),
        Arg::I32(config.rope_dim as i32),
        Arg::I32(codec.bytes_per_token() as i32),
    ];
    Ok(Some(KernelLaunch {
        kernel: write_kernel(config.dtype, c_kv.elem),
        grid: token_grid(tokens)?,
        block: 32 * WARPS_PER_BLOCK,
        shared_bytes: u32::try_from(shared)
            .map_err(|_| Error::InvalidConfig("kv_lora_rank too large".into()))?,
        args,
    }))
}

/// The launch of a gather ([`LatentStore::gather_raw`]) from the layer whose
/// first byte is at `layer_addr`; `None` when `out` has no rows.
pub fn gather_launch(
    config: &CacheConfig,
    layer_addr: u64,
    block_table: &VectorDesc<BlockId>,
    out: &MatrixDesc,
) -> Result<Option<KernelLaunch>> {
    let codec = kernel_codec(config)?;
    check_gather_args(config, 0, block_table, out)?;
    if out.rows == 0 {
        return Ok(None);
    }
    let args = vec![
        Arg::U64(layer_addr),
        Arg::U64(block_table.addr as u64),
        Arg::I64(out.rows as i64),
        Arg::I32(config.block_size as i32),
        Arg::I64(config.num_blocks as i64),
        Arg::U64(out.addr as u64),
        Arg::I64((out.row_stride / out.elem.size()) as i64),
        Arg::I32(config.kv_lora_rank as i32),
        Arg::I32(config.rope_dim as i32),
        Arg::I32(codec.bytes_per_token() as i32),
    ];
    Ok(Some(KernelLaunch {
        kernel: gather_kernel(config.dtype, out.elem),
        grid: token_grid(out.rows)?,
        block: 32 * WARPS_PER_BLOCK,
        shared_bytes: 0,
        args,
    }))
}

/// The launches of a `copy_blocks` ([`LatentStore::copy_blocks`]) over all
/// layers of a store whose layer `l` starts at `base + l * layer_stride`
/// (`layer_stride` a multiple of 16 when `block_size * bytes_per_token` is).
/// Up to 480 pairs ride in each launch's parameters.
pub fn copy_blocks_launches(
    config: &CacheConfig,
    base: u64,
    layer_stride: usize,
    pairs: &[(BlockId, BlockId)],
) -> Result<Vec<KernelLaunch>> {
    let codec = kernel_codec(config)?;
    check_copy_pairs(config, pairs)?;
    let block_bytes = config.block_size * codec.bytes_per_token();
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
                kernel: COPY_KERNEL,
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

    unsafe fn write_raw(
        &self,
        layer: usize,
        c_kv: MatrixDesc,
        k_pe: MatrixDesc,
        slot_mapping: VectorDesc<i64>,
        stream: Stream,
    ) -> Result<()> {
        let layer_addr = self.layer_ptr(layer)?;
        let Some(launch) = write_launch(&self.config, layer_addr, &c_kv, &k_pe, &slot_mapping)?
        else {
            return Ok(());
        };
        guard("CUDA write", || {
            self.bind()?;
            // SAFETY: the caller vouches for the descriptors (trait
            // contract); the layer is ours.
            unsafe { self.enqueue(launch, stream) }
        })
    }

    unsafe fn gather_raw(
        &self,
        layer: usize,
        block_table: VectorDesc<BlockId>,
        out: MatrixDesc,
        stream: Stream,
    ) -> Result<()> {
        let layer_addr = self.layer_ptr(layer)?;
        let Some(launch) = gather_launch(&self.config, layer_addr, &block_table, &out)? else {
            return Ok(());
        };
        guard("CUDA gather", || {
            self.bind()?;
            // SAFETY: the caller vouches for the descriptors (trait
            // contract); the layer is ours.
            unsafe { self.enqueue(launch, stream) }
        })
    }

    fn copy_blocks(&self, pairs: &[(BlockId, BlockId)], stream: Stream) -> Result<()> {
        let launches = copy_blocks_launches(&self.config, self.base, self.layer_stride, pairs)?;
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
}
