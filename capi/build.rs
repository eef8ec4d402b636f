//! Gives the C library its versioned SONAME, `libmla_cache.so.MAJOR`, so
//! programs linked to it record that name rather than a path.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmla_cache.so.{major}");
    }
}
