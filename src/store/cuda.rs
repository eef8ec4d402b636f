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

use crate::config::{CacheConfig, Dtype};
use crate::error::{Error, Result};

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
const NVRTC_OPTIONS: [&str; 5] =
    ["--std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"];

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
        ["libnvrtc.so.12", "libnvrtc.so"].iter().map(|n| path.join(n)).collect()
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
            unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy().into_owned()
        };
        tried.push(format!("{} ({msg})", file.display()));
    }
    Err(Error::Storage(format!("cannot load libnvrtc: tried {}", tried.join(", "))))
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
        r.result().map_err(|e| Error::Storage(format!("nvrtcVersion: {e:?}")))?;
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
    ensure_nvrtc()?;
    guard("NVRTC", || compile_unguarded(arch))
}

fn compile_unguarded(arch: &str) -> Result<CompiledKernels> {
    let src = CString::new(KERNEL_SOURCE).expect("kernel source has no NUL");
    let prog = rtc::create_program(&src, Some(c"mla_cache_kernels.cu"))
        .map_err(|e| Error::Storage(format!("nvrtcCreateProgram: {e:?}")))?;
    let mut options: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` is a live program until destroy_program below.
    let compiled = unsafe { rtc::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { rtc::get_program_log(prog) }
        .map(|raw| {
            let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        })
        .unwrap_or_default();
    let image = compiled
        .map_err(|e| {
            Error::Storage(format!("NVRTC could not compile the kernels for {arch}: {e:?}\n{log}"))
        })
        .and_then(|()| {
            // SAFETY: the program compiled; buffers are sized by NVRTC.
            unsafe { program_image(prog, arch.starts_with("sm_")) }
        });
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { rtc::destroy_program(prog) };
    Ok(CompiledKernels { arch: arch.to_string(), image: image?, log })
}

/// The cubin (`cubin`) or PTX of a compiled program.
unsafe fn program_image(prog: rtc_sys::nvrtcProgram, cubin: bool) -> Result<Vec<u8>> {
    let what = if cubin { "nvrtcGetCUBIN" } else { "nvrtcGetPTX" };
    let err = |e: rtc_sys::nvrtcResult| Error::Storage(format!("{what}: {e:?}"));
    let mut size = 0usize;
    // SAFETY (whole block): valid program, out-pointers and buffers of the
    // size NVRTC reported.
    unsafe {
        if cubin {
            rtc_sys::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| err(e.0))?;
            let mut buf = vec![0u8; size];
            rtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()).result().map_err(|e| err(e.0))?;
            Ok(buf)
        } else {
            rtc_sys::nvrtcGetPTXSize(prog, &mut size).result().map_err(|e| err(e.0))?;
            let mut buf = vec![0u8; size];
            rtc_sys::nvrtcGetPTX(prog, buf.as_mut_ptr().cast()).result().map_err(|e| err(e.0))?;
            Ok(buf)
        }
    }
}
