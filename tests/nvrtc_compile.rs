//! Compiles every kernel with NVRTC for sm_80 and sm_90a: needs libnvrtc,
//! not a GPU.
//!
//! libnvrtc is found through `MLA_CACHE_NVRTC` (the library or its
//! directory), `LD_LIBRARY_PATH`, or else the `nvidia-cuda-nvrtc-cu12` wheel
//! in the project's `.venv` (`scripts/venv.sh`). Without it the test prints a
//! skip message and passes, unless `MLA_CACHE_REQUIRE_NVRTC=1`.
#![cfg(feature = "cuda")]

use std::path::PathBuf;

use mla_cache::store::cuda;

/// The wheel's library directory in the project's virtual environment.
fn venv_nvrtc_dir() -> Option<PathBuf> {
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages/nvidia/cuda_nvrtc/lib"))
        .find(|d| d.is_dir())
}

/// Whether NVRTC can be used; panics when it cannot and is required.
fn nvrtc_or_skip() -> bool {
    if !cuda::nvrtc_available() {
        if let Some(dir) = venv_nvrtc_dir() {
            cuda::preload_nvrtc(&dir).unwrap();
        }
    }
    if cuda::nvrtc_available() {
        return true;
    }
    let why = "libnvrtc not found (set MLA_CACHE_NVRTC or LD_LIBRARY_PATH, or run scripts/venv.sh)";
    if std::env::var("MLA_CACHE_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("{why}, and MLA_CACHE_REQUIRE_NVRTC=1");
    }
    eprintln!("skipping the NVRTC compile test: {why}");
    false
}

#[test]
fn every_kernel_compiles_for_ampere_and_hopper() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = cuda::nvrtc_version().unwrap();
    println!("NVRTC {major}.{minor}");
    for arch in ["sm_80", "sm_90a"] {
        let compiled = cuda::compile_kernels(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        // Warnings are failures too: the source compiles cleanly.
        assert!(
            compiled.log.is_empty(),
            "NVRTC log for {arch}:\n{}",
            compiled.log
        );
        assert_eq!(compiled.arch, arch);
        // A cubin (ELF) that defines every entry point.
        let image = &compiled.image;
        assert_eq!(&image[..4], b"\x7fELF", "{arch}: not a cubin");
        for name in cuda::Kernel::all().iter().map(|k| k.name()) {
            let found = image
                .windows(name.len() + 1)
                .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
            assert!(found, "{arch}: kernel {name} missing from the cubin");
        }
        println!(
            "{arch}: {} byte cubin, {} kernels",
            image.len(),
            cuda::Kernel::all().len()
        );
    }
}

#[test]
fn ptx_for_a_virtual_architecture() {
    if !nvrtc_or_skip() {
        return;
    }
    let compiled = cuda::compile_kernels("compute_90").unwrap();
    let ptx = String::from_utf8_lossy(&compiled.image);
    assert!(ptx.contains(".target sm_90"), "not PTX for sm_90");
    for name in cuda::Kernel::all().iter().map(|k| k.name()) {
        assert!(
            ptx.contains(&format!(".entry {name}(")),
            "{name} missing from the PTX"
        );
    }
    // The kernels keep everything in registers: no local-memory spills.
    assert!(!ptx.contains(".local"), "PTX uses local memory");
}

#[test]
fn a_broken_kernel_fails_with_the_compiler_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = cuda::compile_source(
        "extern \"C\" __global__ void k() { undefined_name; }",
        "sm_80",
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("undefined_name"),
        "log missing from the error: {msg}"
    );
}

#[test]
fn device_architectures() {
    assert_eq!(cuda::arch_for(8, 0), "sm_80");
    assert_eq!(cuda::arch_for(8, 9), "sm_80");
    assert_eq!(cuda::arch_for(9, 0), "sm_90a");
    assert_eq!(cuda::arch_for(10, 0), "sm_100");
    assert_eq!(cuda::arch_for(12, 0), "sm_120");
}
