//! The C library (`libmla_cache.so`, `libmla_cache.a`): the core's C ABI,
//! `mla_cache::ffi` (feature `capi`), linked into a `cdylib` and a
//! `staticlib`. Its `#[no_mangle] pub extern "C"` functions are exported by
//! these products although they are defined in a dependency: rustc exports
//! every C-level symbol of the crates it links into a `cdylib`, and the
//! `use` below makes sure the core is linked.

pub use mla_cache_core::ffi::*;
