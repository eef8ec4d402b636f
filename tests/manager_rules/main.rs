//! One test per rule of the block manager's semantics (docs/semantics.md):
//! sharing, eviction and admission in `sharing.rs`; the caller's controls
//! (dropping blocks, eviction on request, reserve, pins) in `controls.rs`.

mod controls;
mod sharing;

use mla_cache::{BlockManager, CacheConfig};

pub(crate) const BS: usize = 4;

pub(crate) fn manager(num_blocks: usize) -> BlockManager {
    manager_with(num_blocks, |_| {})
}

pub(crate) fn manager_with(num_blocks: usize, f: impl FnOnce(&mut CacheConfig)) -> BlockManager {
    let mut c = CacheConfig::new(num_blocks);
    c.block_size = BS;
    c.hash_seed = Some(42);
    f(&mut c);
    BlockManager::new(c).unwrap()
}

pub(crate) fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

pub(crate) fn ok(m: &BlockManager) {
    m.check_invariants().unwrap();
}
