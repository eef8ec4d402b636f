//! The `mla_cache._native` extension module: links the library built with its
//! `python` feature, whose `#[pymodule]` (`PyInit__native`) this cdylib exports.

pub use mla_cache;
