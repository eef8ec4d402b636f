//! Results of manager and prefix-cache calls: `Admission`, `PrefixMatch`,
//! `AppendOutcome`, `Insertion`.
//! Block ids are numpy int32 arrays built from Rust vectors without copies.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use mla_cache::BlockId;

/// Block ids as a numpy int32 array that takes over the vector's memory.
pub(crate) fn block_array(py: Python<'_>, ids: Vec<BlockId>) -> Py<PyArray1<i32>> {
    // Block ids are below 2**31 (checked by `CacheConfig`); the collect
    // reuses the allocation.
    let ids: Vec<i32> = ids.into_iter().map(|b| b as i32).collect();
    PyArray1::from_vec(py, ids).unbind()
}

fn array_repr(py: Python<'_>, a: &Py<PyArray1<i32>>) -> String {
    a.bind(py)
        .repr()
        .map_or_else(|_| "?".into(), |r| r.to_string())
}

/// The outcome of ``BlockManager.admit``.
#[pyclass(frozen, module = "mla_cache")]
pub struct Admission {
    /// The request's block table (numpy int32), reserved room included.
    #[pyo3(get)]
    block_ids: Py<PyArray1<i32>>,
    /// Leading prompt tokens whose KV is already cached (a multiple of the
    /// block size); the engine computes the prompt from there.
    #[pyo3(get)]
    num_cached_tokens: usize,
}

impl Admission {
    pub(crate) fn new(py: Python<'_>, a: mla_cache::Admission) -> Self {
        Self {
            block_ids: block_array(py, a.block_ids),
            num_cached_tokens: a.num_cached_tokens,
        }
    }
}

#[pymethods]
impl Admission {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Admission(block_ids={}, num_cached_tokens={})",
            array_repr(py, &self.block_ids),
            self.num_cached_tokens
        )
    }
}

/// The outcome of ``BlockManager.match_prefix`` and ``PrefixCache.match_prefix``.
#[pyclass(frozen, module = "mla_cache")]
pub struct PrefixMatch {
    /// Cached blocks of the longest cached prefix (numpy int32).
    #[pyo3(get)]
    block_ids: Py<PyArray1<i32>>,
    /// Tokens those blocks cover.
    #[pyo3(get)]
    num_tokens: usize,
}

impl PrefixMatch {
    pub(crate) fn new(py: Python<'_>, m: mla_cache::PrefixMatch) -> Self {
        Self {
            block_ids: block_array(py, m.block_ids),
            num_tokens: m.num_tokens,
        }
    }
}

#[pymethods]
impl PrefixMatch {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "PrefixMatch(block_ids={}, num_tokens={})",
            array_repr(py, &self.block_ids),
            self.num_tokens
        )
    }
}

/// The outcome of ``BlockManager.append`` and ``BlockManager.reserve``.
#[pyclass(frozen, module = "mla_cache")]
pub struct AppendOutcome {
    /// Blocks added to the end of the request's table (numpy int32).
    #[pyo3(get)]
    new_block_ids: Py<PyArray1<i32>>,
    /// ``(src, dst)`` block copies to perform before writing the new tokens
    /// (copy-on-write of a shared partial tail; ``dst`` replaced ``src`` in
    /// the request's table).
    #[pyo3(get)]
    copies: Py<PyList>,
}

impl AppendOutcome {
    pub(crate) fn new(py: Python<'_>, o: mla_cache::AppendOutcome) -> PyResult<Self> {
        let copies = PyList::new(py, o.copies.iter().map(|c| (c.src, c.dst)))?;
        Ok(Self {
            new_block_ids: block_array(py, o.new_block_ids),
            copies: copies.unbind(),
        })
    }
}

#[pymethods]
impl AppendOutcome {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "AppendOutcome(new_block_ids={}, copies={})",
            array_repr(py, &self.new_block_ids),
            self.copies.bind(py).repr()?
        ))
    }
}

/// The outcome of ``PrefixCache.insert``.
#[pyclass(frozen, module = "mla_cache")]
pub struct Insertion {
    /// Leading full blocks that were cached before the call.
    #[pyo3(get)]
    num_cached_blocks: usize,
    /// The caller's ids whose block was already cached under another id:
    /// free them (numpy int32).
    #[pyo3(get)]
    duplicate_block_ids: Py<PyArray1<i32>>,
    /// The id now cached for each full block (numpy int32).
    #[pyo3(get)]
    block_ids: Py<PyArray1<i32>>,
}

impl Insertion {
    pub(crate) fn new(py: Python<'_>, i: mla_cache::Insertion) -> Self {
        Self {
            num_cached_blocks: i.num_cached_blocks,
            duplicate_block_ids: block_array(py, i.duplicate_block_ids),
            block_ids: block_array(py, i.block_ids),
        }
    }
}

#[pymethods]
impl Insertion {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Insertion(num_cached_blocks={}, duplicate_block_ids={}, block_ids={})",
            self.num_cached_blocks,
            array_repr(py, &self.duplicate_block_ids),
            array_repr(py, &self.block_ids)
        )
    }
}
