//! The committed C header is what cbindgen generates from this package's
//! `src/`, and it compiles cleanly as C11 and C++17.
//!
//! After changing the C ABI, regenerate it with
//! `MLA_UPDATE_HEADER=1 cargo test -p mla-cache-ffi --test c_header`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root (the header and cbindgen's settings live there).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("ffi/ is in the repository")
}

fn header_path() -> PathBuf {
    root().join("include/mla_cache.h")
}

fn generate() -> String {
    let config = cbindgen::Config::from_file(root().join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root().join("ffi/src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

#[test]
fn committed_header_matches_cbindgen_output() {
    let generated = generate();
    if std::env::var_os("MLA_UPDATE_HEADER").is_some() {
        std::fs::write(header_path(), &generated).unwrap();
    }
    let committed = std::fs::read_to_string(header_path()).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/mla_cache.h is stale (first difference at line {}); \
             regenerate it with MLA_UPDATE_HEADER=1 cargo test -p mla-cache-ffi --test c_header",
            line + 1
        );
    }
}

fn compile(compiler: &str, std: &str, extra: &[&str], source: &str, ext: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("use_header.{ext}"));
    std::fs::write(&file, source).unwrap();
    let include = root().join("include");
    let out = Command::new(compiler)
        .arg(std)
        .args(["-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg("-fsyntax-only")
        .arg("-I")
        .arg(&include)
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {std} rejects the header:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const USE_HEADER: &str = r#"#include "mla_cache.h"
int main(void) {
    MlaCacheStats stats;
    MlaConfig *config = NULL;
    (void)stats;
    (void)config;
    return MLA_CACHE_VERSION_MAJOR + (int)MLA_STATUS_OK + (int)MLA_DTYPE_BF16;
}
"#;

#[test]
fn header_compiles_as_pedantic_c11() {
    compile("gcc", "-std=c11", &["-pedantic"], USE_HEADER, "c");
}

#[test]
fn header_compiles_as_cpp17() {
    compile("g++", "-std=c++17", &["-pedantic"], USE_HEADER, "cpp");
}
