//! The Python extension (`pyext/`), the C ABI (`ffi/`) and the C library
//! (`capi/`) are packages of their own, so that they never share a path and
//! the core is an rlib only; each carries the library's version.

use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn the_extension_package_has_the_library_version() {
    let manifest = read("pyext/Cargo.toml");
    let version = format!("\nversion = \"{}\"\n", env!("CARGO_PKG_VERSION"));
    assert!(
        manifest.contains(&version),
        "pyext/Cargo.toml lacks {version}"
    );
    assert!(manifest.contains("name = \"_native\""));
}

#[test]
fn maturin_builds_the_extension_package() {
    let pyproject = read("pyproject.toml");
    assert!(pyproject.contains("manifest-path = \"pyext/Cargo.toml\""));
}

#[test]
fn the_c_library_package_has_the_library_version_and_name() {
    let manifest = read("capi/Cargo.toml");
    let version = format!("\nversion = \"{}\"\n", env!("CARGO_PKG_VERSION"));
    assert!(
        manifest.contains(&version),
        "capi/Cargo.toml lacks {version}"
    );
    assert!(manifest.contains("name = \"mla_cache\""));
    assert!(manifest.contains("crate-type = [\"cdylib\", \"staticlib\"]"));
}

#[test]
fn the_core_is_an_rlib_only() {
    let manifest = read("Cargo.toml");
    assert!(
        !manifest.contains("crate-type"),
        "the core builds no C library"
    );
}

#[test]
fn the_c_abi_package_has_the_library_version_and_is_an_rlib_only() {
    // `mla_version()` and the header's version macros are this package's
    // version; its tests and bench link it as an rlib, never a C library.
    let manifest = read("ffi/Cargo.toml");
    let version = format!("\nversion = \"{}\"\n", env!("CARGO_PKG_VERSION"));
    assert!(
        manifest.contains(&version),
        "ffi/Cargo.toml lacks {version}"
    );
    assert!(!manifest.contains("crate-type"), "ffi/ builds no C library");
}
