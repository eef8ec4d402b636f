//! The `mla-cache` command line (in progress).
fn main() {}
