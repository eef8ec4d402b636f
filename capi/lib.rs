//! The C library: libmla_cache.so and libmla_cache.a, exporting the C ABI
//! of the package `ffi/` (rustc exports every `#[no_mangle] pub extern "C"`
//! function of the crates it links into a `cdylib` or `staticlib`).

pub use mla_cache_ffi::*;
