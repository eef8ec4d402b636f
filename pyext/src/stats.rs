//! `CacheStats` as the dict that `BlockManager.stats` and `PrefixCache.stats` return.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use mla_cache::CacheStats;

/// The gauges and counters by name, plus ``usage`` and ``hit_rate``.
pub(crate) fn to_dict<'py>(py: Python<'py>, s: &CacheStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("num_blocks", s.num_blocks)?;
    d.set_item("free_blocks", s.free_blocks)?;
    d.set_item("used_blocks", s.used_blocks)?;
    d.set_item("cached_blocks", s.cached_blocks)?;
    d.set_item("pinned_blocks", s.pinned_blocks)?;
    d.set_item("num_requests", s.num_requests)?;
    d.set_item("prefix_query_tokens", s.prefix_query_tokens)?;
    d.set_item("prefix_hit_tokens", s.prefix_hit_tokens)?;
    d.set_item("prefix_query_requests", s.prefix_query_requests)?;
    d.set_item("prefix_hit_requests", s.prefix_hit_requests)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("cow_copies", s.cow_copies)?;
    d.set_item("blocks_stored", s.blocks_stored)?;
    d.set_item("evictable_blocks", s.evictable_blocks)?;
    d.set_item("events_dropped", s.events_dropped)?;
    d.set_item("usage", s.usage())?;
    d.set_item("hit_rate", s.hit_rate())?;
    Ok(d)
}
