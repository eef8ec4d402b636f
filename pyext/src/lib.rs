//! The `mla_cache._native` Python module (the package `pyext`, over the library's public API). Thin bindings:
//! each class lives in its own file, and errors map to Python exceptions in
//! one place ([`errors`]).

mod chunk_transfers;
mod config;
mod digests;
mod dlpack;
mod errors;
mod events;
mod extra_keys;
mod int_arrays;
mod ints;
mod layer_buffer;
mod manager;
mod outcomes;
mod prefix_cache;
mod prefix_calls;
mod publisher;
mod request_ids;
mod requests;
mod stats;
mod store;
mod tensors;
mod tier;
mod tier_outcomes;
mod vllm_block;
mod vllm_manager;

use pyo3::prelude::*;

/// Native part of the ``mla_cache`` package; import ``mla_cache`` instead.
#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<config::CacheConfig>()?;
    m.add_class::<manager::BlockManager>()?;
    m.add_class::<store::LatentStore>()?;
    m.add_class::<layer_buffer::LayerBuffer>()?;
    m.add_class::<extra_keys::ExtraKeys>()?;
    m.add_class::<extra_keys::MultiModalKey>()?;
    m.add_class::<outcomes::Admission>()?;
    m.add_class::<outcomes::PrefixMatch>()?;
    m.add_class::<outcomes::AppendOutcome>()?;
    m.add_class::<prefix_cache::PrefixCache>()?;
    m.add_class::<outcomes::Insertion>()?;
    m.add_class::<tier::TieredCache>()?;
    m.add_class::<chunk_transfers::ChunkTransfers>()?;
    m.add_class::<tier_outcomes::TieredAdmission>()?;
    m.add_class::<tier_outcomes::TierHits>()?;
    m.add_class::<events::CacheEvent>()?;
    m.add_class::<events::BlockStored>()?;
    m.add_class::<events::BlockRemoved>()?;
    m.add_class::<events::AllBlocksCleared>()?;
    m.add_class::<publisher::EventPublisher>()?;
    m.add_class::<vllm_block::KvCacheBlock>()?;
    m.add_class::<vllm_manager::VllmManagerBase>()?;
    m.add_class::<vllm_manager::Tracked>()?;
    m.add("OutOfBlocks", py.get_type::<errors::OutOfBlocks>())?;
    m.add(
        "PinBudgetExceeded",
        py.get_type::<errors::PinBudgetExceeded>(),
    )?;
    m.add("StorageError", py.get_type::<errors::StorageError>())?;
    // The policy registry's names, for every Python surface that lists them.
    let policies = mla_cache::EvictionPolicyKind::ALL.map(|p| p.name());
    m.add(
        "EVICTION_POLICIES",
        pyo3::types::PyTuple::new(py, policies)?,
    )?;
    Ok(())
}
