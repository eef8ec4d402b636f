//! `KVCacheBlock`: vLLM's block object as `mla_cache.vllm` hands it to vLLM's
//! scheduler and connectors. Native, so that the manager marks blocks cached
//! or fresh with a field write rather than a Python attribute call, and so
//! that the cyclic garbage collector never walks the pool's objects.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors;
use super::manager::BlockManager;
use mla_cache::vllm_rules;

/// vLLM's group id suffix of a ``BlockHashWithGroupId`` (the one group).
const GROUP_0: [u8; 4] = 0u32.to_be_bytes();

/// One block as the scheduler sees it. The manager keeps one object per
/// block id; block 0 is vLLM's null block.
#[pyclass(module = "mla_cache._native", name = "KVCacheBlock")]
pub struct KvCacheBlock {
    /// The block's id (its slots are ``block_id * block_size + offset``).
    #[pyo3(get)]
    block_id: usize,
    /// Tokens up to and including this block when it holds a cached
    /// (committed) full block of a request; ``None`` otherwise.
    #[pyo3(get, set)]
    block_hash_num_tokens: Option<usize>,
    /// vLLM's digest of the block while ``block_hash_num_tokens`` is set.
    #[pyo3(get, set)]
    digest: Option<Py<PyBytes>>,
    manager: Option<Py<BlockManager>>,
}

impl KvCacheBlock {
    /// Marks the block a cached full block ending at token `num_tokens`,
    /// under vLLM's `digest`.
    pub(super) fn set_cached(&mut self, num_tokens: usize, digest: Py<PyBytes>) {
        self.block_hash_num_tokens = Some(num_tokens);
        self.digest = Some(digest);
    }

    /// Marks the block not cached.
    pub(super) fn set_uncached(&mut self) {
        self.block_hash_num_tokens = None;
    }
}

#[pymethods]
impl KvCacheBlock {
    /// Block ``block_id``; ``manager``: the block manager that counts its
    /// holders (``ref_cnt``), whose block ``block_id - 1`` it is.
    #[new]
    #[pyo3(signature = (block_id, manager = None))]
    fn new(block_id: usize, manager: Option<Py<BlockManager>>) -> Self {
        Self {
            block_id,
            block_hash_num_tokens: None,
            digest: None,
            manager,
        }
    }

    /// Whether this is vLLM's null block (id 0).
    #[getter]
    fn is_null(&self) -> bool {
        self.block_id == 0
    }

    /// vLLM's ``BlockHashWithGroupId`` of a cached full block (its digest
    /// and group 0), ``None`` otherwise.
    #[getter]
    fn block_hash<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.block_hash_num_tokens?;
        let digest = self.digest.as_ref()?.bind(py).as_bytes();
        Some(PyBytes::new(py, &[digest, &GROUP_0].concat()))
    }

    /// Requests holding the block, as vLLM counts them (blocks a deferred
    /// free has not returned yet included; 0 for the null block or without
    /// a manager).
    #[getter]
    fn ref_cnt(&self, py: Python<'_>) -> PyResult<u32> {
        let Some(manager) = &self.manager else {
            return Ok(0);
        };
        // No pool bound is known here: any id past the null block is asked.
        match vllm_rules::cache_block_id(self.block_id, usize::MAX) {
            Some(id) => manager
                .bind(py)
                .get()
                .core()
                .ref_count(id)
                .map_err(errors::to_py),
            None => Ok(0),
        }
    }

    fn __repr__(&self) -> String {
        format!("KVCacheBlock(block_id={})", self.block_id)
    }
}
