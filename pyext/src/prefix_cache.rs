//! `PrefixCache`: the Rust [`mla_cache::PrefixCache`] with token ids from lists
//! or numpy arrays and block ids in and out as numpy int32 arrays.

use numpy::PyArray1;
use pyo3::exceptions::PyAssertionError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::config::CacheConfig;
use super::errors;
use super::events;
use super::int_arrays::{self, tokens};
use super::ints;
use super::outcomes::{block_array, Insertion, PrefixMatch};
use super::prefix_calls::keyed;
use super::stats;
use mla_cache::TokenId;

/// A prefix cache over block ids ``0 .. num_blocks`` that the caller
/// allocates and frees (SGLang's model: the engine's allocator owns the KV
/// pages, the radix cache indexes them). ``insert`` indexes a request's full
/// blocks under their chained hashes and reports the caller's duplicates to
/// free; ``match_prefix`` finds the longest cached prefix; ``lock`` keeps
/// blocks from eviction; ``evict`` hands back unlocked cached blocks to free,
/// by the configured eviction policy. Pins, stats and events are those of
/// ``BlockManager`` (block hashes are 64-bit ints).
///
/// Thread-safe; calls that hash long prompts release the GIL. A failing call
/// raises and changes nothing. Token ids and block ids are lists, tuples,
/// numpy arrays of any integer dtype or other iterables of ints; block ids
/// come back as numpy int32 arrays. Raises ``ValueError`` for bad input
/// (an id outside the cache, given twice or cached under another hash, an
/// unlock without a lock) and ``RuntimeError`` for ``reset`` while blocks
/// are locked or pinned.
#[pyclass(frozen, module = "mla_cache")]
pub struct PrefixCache {
    inner: mla_cache::PrefixCache,
    config: Py<CacheConfig>,
}

#[pymethods]
impl PrefixCache {
    #[new]
    fn new(config: Bound<'_, CacheConfig>) -> PyResult<Self> {
        let inner = mla_cache::PrefixCache::new(config.get().0.clone()).map_err(errors::to_py)?;
        Ok(Self {
            inner,
            config: config.unbind(),
        })
    }

    /// The configuration.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<CacheConfig> {
        self.config.clone_ref(py)
    }

    /// Indexes the full blocks of ``tokens``, held in the caller's
    /// ``block_ids`` (one per block, at least one per full block; a partial
    /// tail's id is ignored). A block already cached keeps its cached id;
    /// when the caller's differs, it is returned in
    /// ``duplicate_block_ids`` for the caller to free. New blocks are
    /// evictable unless locked; the whole path counts as just used.
    #[pyo3(signature = (tokens, block_ids, *, extra_keys = None, salt = None))]
    fn insert(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        block_ids: &Bound<'_, PyAny>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<Insertion> {
        let blocks = int_arrays::block_ids(block_ids)?;
        let inserted = keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.insert(&tokens, k, &blocks)
        })?;
        Ok(Insertion::new(py, inserted.map_err(errors::to_py)?))
    }

    /// The longest cached prefix of ``tokens`` (whole blocks, not capped).
    /// A hit counts as a use: the path becomes the most recently used, each
    /// block more recent than the blocks below it.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn match_prefix(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<PrefixMatch> {
        let found = keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.match_prefix(&tokens, k)
        })?;
        Ok(PrefixMatch::new(py, found))
    }

    /// Takes a lock on each of ``block_ids`` (SGLang's ``inc_lock_ref``):
    /// locked blocks are never evicted. Locks nest; lock whole matched paths.
    fn lock(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let blocks = int_arrays::block_ids(block_ids)?;
        self.inner.lock(&blocks).map_err(errors::to_py)
    }

    /// Releases one lock on each of ``block_ids`` (SGLang's
    /// ``dec_lock_ref``); ``ValueError`` for more unlocks than locks.
    fn unlock(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let blocks = int_arrays::block_ids(block_ids)?;
        self.inner.unlock(&blocks).map_err(errors::to_py)
    }

    /// Evicts up to ``num_blocks`` unlocked cached blocks by the eviction
    /// policy (under LRU, children before parents) and returns their ids
    /// (numpy int32) for the caller to free.
    fn evict(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = ints::size)] num_blocks: usize,
    ) -> Py<PyArray1<i32>> {
        block_array(py, self.inner.evict(num_blocks))
    }

    /// Cached blocks nobody locks (SGLang's ``evictable_size``, in blocks).
    #[getter]
    fn evictable_blocks(&self) -> usize {
        self.inner.evictable_blocks()
    }

    /// Cached blocks held by a lock or a pin (SGLang's ``protected_size``, in blocks).
    #[getter]
    fn protected_blocks(&self) -> usize {
        self.inner.protected_blocks()
    }

    /// Drops every cached block and returns their ids (numpy int32) for the
    /// caller to free. ``RuntimeError`` while any block is locked or pinned.
    fn reset(&self, py: Python<'_>) -> PyResult<Py<PyArray1<i32>>> {
        let ids = self.inner.reset().map_err(errors::to_py)?;
        Ok(block_array(py, ids))
    }

    /// Pins the cached full blocks of the prefix ``tokens`` within
    /// ``CacheConfig.pin_budget`` (``PinBudgetExceeded`` past it). Returns
    /// the tokens pinned (0 when nothing of the prefix is cached).
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn pin(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<usize> {
        keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.pin(&tokens, k)
        })?
        .map_err(errors::to_py)
    }

    /// Releases one pin of the prefix ``tokens`` (the one ending deepest in
    /// it); returns the tokens unpinned. ``ValueError`` when none lies on it.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn unpin(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<usize> {
        keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.unpin(&tokens, k)
        })?
        .map_err(errors::to_py)
    }

    /// External (64-bit) hashes of the full blocks of ``tokens``: the values
    /// events carry for them.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn block_hashes(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<Vec<u64>> {
        keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.block_hashes(&tokens, k)
        })
    }

    /// Gauges and counters as ``BlockManager.stats`` names them. The caller
    /// owns the blocks, so ``free_blocks``, ``used_blocks``,
    /// ``num_requests`` and ``cow_copies`` are 0; prefix queries count
    /// ``match_prefix`` calls.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats::to_dict(py, &self.inner.stats())
    }

    /// Events recorded since the last call, oldest first (empty unless the
    /// config sets ``enable_events``).
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        events::to_py_list(py, self.inner.take_events())
    }

    /// Checks every bookkeeping invariant (for tests); raises
    /// ``AssertionError`` describing the first violation.
    fn _check_invariants(&self) -> PyResult<()> {
        self.inner
            .check_invariants()
            .map_err(PyAssertionError::new_err)
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        format!(
            "PrefixCache(num_blocks={}, cached_blocks={}, evictable_blocks={})",
            s.num_blocks, s.cached_blocks, s.evictable_blocks
        )
    }
}
