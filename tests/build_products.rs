//! The Python extension is its own package (`pyext/`), so that it never
//! shares a path with the C library; its wheel carries the library's version.

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
