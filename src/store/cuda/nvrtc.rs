//! Loading libnvrtc and compiling CUDA C with it (needs the library, not a GPU).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use cudarc::nvrtc::{result as rtc, sys as rtc_sys};
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use super::guard;
use super::kernels::{kernel_defines, KERNEL_SOURCE};
use crate::error::{Error, Result};

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

/// Loads libnvrtc from `path` (the library file, or a directory holding
/// `libnvrtc.so.12` or `libnvrtc.so`) so that cudarc finds it already loaded.
/// The library stays loaded for the life of the process.
pub fn preload_nvrtc(path: &Path) -> Result<()> {
    let candidates: Vec<PathBuf> = if path.is_dir() {
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
        // SAFETY: libnvrtc's initializers are safe to run. RTLD_GLOBAL makes
        // its symbols visible to cudarc's own dlopen of the same soname.
        match unsafe { Library::open(Some(&file), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => {
                // Never unloaded, so symbols looked up later stay valid.
                lib.into_raw();
                return Ok(());
            }
            Err(e) => tried.push(format!("{} ({e})", file.display())),
        }
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
/// (IEEE division, no flush to zero, no fused multiply-add, the launch
/// constants of [`kernel_defines`] as macros); the error carries NVRTC's log.
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
    options.extend(
        kernel_defines()
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
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
