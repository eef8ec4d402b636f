//! Gives the C library (feature `capi`) its versioned SONAME,
//! `libmla_cache.so.MAJOR`, so programs linked to it record that name rather
//! than a path. Other builds of the crate (the Python extension, the rlib)
//! are left alone.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let capi = std::env::var_os("CARGO_FEATURE_CAPI").is_some();
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if capi && linux {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmla_cache.so.{major}");
    }
}
