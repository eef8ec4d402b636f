//! Results of tiered-cache calls: `TierHits` and `TieredAdmission`.

use numpy::PyArray1;
use pyo3::prelude::*;

use super::outcomes::block_array;
use mla_cache::tier;

/// Prompt tokens served by each tier: a leading run from the device tier,
/// continued from host memory, then from the remote tier. Multiples of the
/// block size.
#[pyclass(frozen, eq, module = "mla_cache")]
#[derive(PartialEq, Eq)]
pub struct TierHits {
    /// Tokens already in the device tier.
    #[pyo3(get)]
    device_tokens: usize,
    /// Tokens loaded (or, for a lookup, loadable) from host memory.
    #[pyo3(get)]
    host_tokens: usize,
    /// Tokens loaded (or loadable) from the remote tier.
    #[pyo3(get)]
    remote_tokens: usize,
}

impl From<tier::TierHits> for TierHits {
    fn from(h: tier::TierHits) -> Self {
        Self {
            device_tokens: h.device_tokens,
            host_tokens: h.host_tokens,
            remote_tokens: h.remote_tokens,
        }
    }
}

#[pymethods]
impl TierHits {
    /// Tokens served by all tiers together.
    #[getter]
    fn total(&self) -> usize {
        self.device_tokens + self.host_tokens + self.remote_tokens
    }

    fn __repr__(&self) -> String {
        format!(
            "TierHits(device_tokens={}, host_tokens={}, remote_tokens={})",
            self.device_tokens, self.host_tokens, self.remote_tokens
        )
    }
}

/// The outcome of ``TieredCache.admit``.
#[pyclass(frozen, module = "mla_cache")]
pub struct TieredAdmission {
    /// The request's block table (numpy int32), reserved room included.
    #[pyo3(get)]
    block_ids: Py<PyArray1<i32>>,
    /// Leading prompt tokens whose KV is in the device store now (hits and
    /// completed loads): the engine computes the prompt from here.
    #[pyo3(get)]
    num_cached_tokens: usize,
    /// Where those tokens came from.
    #[pyo3(get)]
    hits: Py<TierHits>,
}

impl TieredAdmission {
    pub(crate) fn new(py: Python<'_>, a: tier::TieredAdmission) -> PyResult<Self> {
        Ok(Self {
            block_ids: block_array(py, a.block_ids),
            num_cached_tokens: a.num_cached_tokens,
            hits: Py::new(py, TierHits::from(a.hits))?,
        })
    }
}

#[pymethods]
impl TieredAdmission {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "TieredAdmission(block_ids={}, num_cached_tokens={}, hits={})",
            self.block_ids.bind(py).repr()?,
            self.num_cached_tokens,
            self.hits.get().__repr__()
        ))
    }
}
