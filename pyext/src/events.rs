//! Cache events for KV-aware routers, mirroring vLLM's `BlockStored`,
//! `BlockRemoved` and `AllBlocksCleared`. Block hashes are the external
//! 64-bit ones (the low 64 bits of the 128-bit chain hash).

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::PyClassInitializer;

use mla_cache::publish::WireEvent;
use mla_cache::CacheEvent as Event;

/// Base class of every event from ``BlockManager.take_events`` and
/// ``TieredCache.take_events``.
#[pyclass(frozen, subclass, module = "mla_cache")]
pub struct CacheEvent {
    /// Where the blocks live (vLLM's ``medium``: ``"GPU"``, ``"CPU"``, a
    /// remote tier's name) for a tiered cache's events; ``None`` for a
    /// manager's (a publisher then uses its own).
    #[pyo3(get)]
    medium: Option<String>,
}

/// Consecutive blocks of one hash chain entered the prefix index.
#[pyclass(frozen, eq, extends = CacheEvent, module = "mla_cache")]
#[derive(PartialEq, Eq)]
pub struct BlockStored {
    /// External hashes of the stored blocks, in chain order (64-bit ints).
    #[pyo3(get)]
    block_hashes: Vec<u64>,
    /// External hash of the block before the first one; ``None`` for a chain's root.
    #[pyo3(get)]
    parent_block_hash: Option<u64>,
    token_ids: Vec<u32>,
    /// Tokens per block.
    #[pyo3(get)]
    block_size: usize,
    /// Adapter the blocks were computed with (vLLM's ``lora_name``), or ``None``.
    #[pyo3(get)]
    adapter: Option<String>,
}

#[pymethods]
impl BlockStored {
    /// The blocks' token ids, ``block_size`` per block.
    #[getter]
    fn token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.token_ids)
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockStored(block_hashes=[{} hashes], parent_block_hash={}, token_ids=[{} tokens], \
             block_size={}, adapter={})",
            self.block_hashes.len(),
            self.parent_block_hash
                .map_or_else(|| "None".into(), |h| format!("{h:#x}")),
            self.token_ids.len(),
            self.block_size,
            self.adapter
                .as_ref()
                .map_or_else(|| "None".into(), |a| format!("{a:?}")),
        )
    }
}

/// Blocks left the prefix index (evicted to make room).
#[pyclass(frozen, eq, extends = CacheEvent, module = "mla_cache")]
#[derive(PartialEq, Eq)]
pub struct BlockRemoved {
    /// External hashes of the removed blocks (64-bit ints).
    #[pyo3(get)]
    block_hashes: Vec<u64>,
}

#[pymethods]
impl BlockRemoved {
    fn __repr__(&self) -> String {
        format!(
            "BlockRemoved(block_hashes=[{} hashes])",
            self.block_hashes.len()
        )
    }
}

/// The whole prefix cache was reset.
#[pyclass(frozen, eq, extends = CacheEvent, module = "mla_cache")]
#[derive(PartialEq, Eq)]
pub struct AllBlocksCleared;

#[pymethods]
impl AllBlocksCleared {
    fn __repr__(&self) -> &'static str {
        "AllBlocksCleared()"
    }
}

/// The Python objects of `events`, oldest first.
pub(crate) fn to_py_list(py: Python<'_>, events: Vec<Event>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for e in events {
        list.append(to_py(py, e, None)?)?;
    }
    Ok(list)
}

/// The Python objects of a tiered cache's `events`, each with its medium.
pub(crate) fn wire_to_py_list(
    py: Python<'_>,
    events: Vec<WireEvent>,
) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for e in events {
        list.append(to_py(py, e.event, Some(e.medium.to_string()))?)?;
    }
    Ok(list)
}

/// The Python object of one event.
fn to_py(py: Python<'_>, event: Event, medium: Option<String>) -> PyResult<Bound<'_, PyAny>> {
    let base = PyClassInitializer::from(CacheEvent { medium });
    Ok(match event {
        Event::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            adapter,
        } => Bound::new(
            py,
            base.add_subclass(BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                adapter: adapter.map(|a| a.to_string()),
            }),
        )?
        .into_any(),
        Event::BlockRemoved { block_hashes } => {
            Bound::new(py, base.add_subclass(BlockRemoved { block_hashes }))?.into_any()
        }
        Event::AllBlocksCleared => Bound::new(py, base.add_subclass(AllBlocksCleared))?.into_any(),
    })
}
