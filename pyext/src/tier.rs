//! `TieredCache`: the Rust [`tier::TieredCache`] over a `LatentStore`, with
//! a host-memory tier and a remote tier given by size and URL.

use std::time::Duration;

use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::config::CacheConfig;
use super::errors;
use super::extra_keys;
use super::int_arrays::{tokens, PromptTokens};
use super::ints;
use super::outcomes::AppendOutcome;
use super::request_ids::RequestIds;
use super::requests::RequestApi;
use super::store::LatentStore;
use super::tier_outcomes::{TierHits, TieredAdmission};
use mla_cache::store::Stream;
use mla_cache::tier::{self, RemoteOptions, TierSettings, WritePolicy};
use mla_cache::TokenId;

/// A block manager and its ``LatentStore`` (the device tier, L1) with
/// lower tiers: host memory (L2, ``host_mem`` bytes, LRU over whole
/// blocks) and a remote Valkey/Redis store shared by a fleet (L3,
/// ``remote``: ``"redis://host:port/"``, ``"rediss://..."`` for TLS,
/// ``"redis://user:password@host:port/"`` for ACL credentials, or
/// ``"cluster:url,url,..."``).
///
/// ``admit`` serves the device tier's cached prefix, continues it with
/// blocks copied in from host memory, then from the remote tier, and only
/// then returns: ``num_cached_tokens`` covers every loaded token.
/// ``write_policy`` decides when blocks go down: ``"write-through"`` (once
/// computed), ``"write-through-selective:N"`` (once hit N times in the
/// device tier) or ``"write-back"`` (when evicted, before reuse). Allocate
/// only through this object, never through a separate ``BlockManager``.
///
/// The remote tier needs ``config.hash_seed`` set, the same on every node,
/// and nodes share blocks only under the same ``namespace`` (name the model
/// and weights). A remote lookup waits at most ``lookup_budget_ms``; an
/// unreachable, slow or failing server only costs hits (see ``stats()``).
/// Block copies out of and into a GPU store run on ``stream`` (a
/// ``CUstream`` as an int, 0 for the default stream) and are waited for.
///
/// Thread-safe; calls run without the GIL. Raises like ``BlockManager``,
/// plus ``ValueError`` for bad tier settings (an unknown policy, a remote
/// tier without a hash seed or without Valkey/Redis support in the build).
#[pyclass(frozen, module = "mla_cache")]
pub struct TieredCache {
    inner: tier::TieredCache,
    config: Py<CacheConfig>,
    store: Py<LatentStore>,
    ids: RequestIds,
}

impl TieredCache {
    /// The request API over this cache.
    fn api(&self) -> RequestApi<'_, tier::TieredCache> {
        RequestApi::new(&self.inner, &self.ids)
    }
}

#[pymethods]
impl TieredCache {
    #[new]
    #[pyo3(signature = (
        config, store, *, host_mem = 0, remote = None, write_policy = "write-through",
        namespace = "default", lookup_budget_ms = 20.0, queue_depth = 64, stream = 0,
        remote_name = "REMOTE"
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        config: Bound<'_, CacheConfig>,
        store: Bound<'_, LatentStore>,
        #[pyo3(from_py_with = ints::u64_of)] host_mem: u64,
        remote: Option<String>,
        write_policy: &str,
        namespace: &str,
        lookup_budget_ms: f64,
        #[pyo3(from_py_with = ints::size)] queue_depth: usize,
        #[pyo3(from_py_with = ints::size)] stream: usize,
        remote_name: &str,
    ) -> PyResult<Self> {
        let lookup_budget =
            Duration::try_from_secs_f64(lookup_budget_ms / 1000.0).map_err(|_| {
                PyValueError::new_err(format!(
                    "lookup_budget_ms must be >= 0, got {lookup_budget_ms}"
                ))
            })?;
        let settings = TierSettings {
            host_bytes: host_mem,
            remote,
            write_policy: write_policy.parse::<WritePolicy>().map_err(errors::to_py)?,
            remote_options: RemoteOptions {
                namespace: namespace.to_owned(),
                lookup_budget,
                queue_depth,
                name: remote_name.to_owned(),
            },
            stream: Stream(stream),
        };
        let (blocks, store_config) = store.get().blocks();
        let inner = settings
            .build(config.get().0.clone(), store_config, blocks)
            .map_err(errors::to_py)?;
        Ok(Self {
            inner,
            config: config.unbind(),
            store: store.unbind(),
            ids: RequestIds::default(),
        })
    }

    /// The configuration.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<CacheConfig> {
        self.config.clone_ref(py)
    }

    /// The device store.
    #[getter]
    fn store(&self, py: Python<'_>) -> Py<LatentStore> {
        self.store.clone_ref(py)
    }

    /// The write policy, as its name (``"write-through"``, ...).
    #[getter]
    fn write_policy(&self) -> String {
        self.inner.write_policy().to_string()
    }

    /// Admits ``request_id`` like ``BlockManager.admit``, then loads the
    /// continuation of its cached prefix from host memory and the remote
    /// tier into its blocks before returning. ``hits`` says how many tokens
    /// each tier served. With ``chunked_prefill=True`` the engine commits
    /// from ``num_cached_tokens`` on; otherwise the whole prompt counts as
    /// computed, and its blocks go down (write-through) once the next
    /// ``append`` or ``free`` says the prefill ran.
    #[pyo3(signature = (request_id, tokens, *, decode_slots = 0, extra_keys = None, salt = None, chunked_prefill = false))]
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        #[pyo3(from_py_with = ints::size)] decode_slots: usize,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
        chunked_prefill: bool,
    ) -> PyResult<TieredAdmission> {
        let admitted = self.api().admit(
            py,
            request_id,
            PromptTokens::Converted(tokens),
            decode_slots,
            extra_keys,
            salt,
            chunked_prefill,
        )?;
        TieredAdmission::new(py, admitted)
    }

    /// Where the longest cached prefix of ``tokens`` lies, without admitting
    /// or loading anything (the remote tier is probed within the lookup
    /// budget). Not capped at ``len - 1``.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn lookup(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<TierHits> {
        let keys = extra_keys::extract(extra_keys, salt)?;
        Ok(py.detach(|| self.inner.lookup(&tokens, &keys)).into())
    }

    /// Appends generated ``tokens`` like ``BlockManager.append``; blocks it
    /// evicts are copied down first under write-back.
    fn append(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
    ) -> PyResult<AppendOutcome> {
        self.api().append(py, request_id, tokens)
    }

    /// Reports that the first ``num_computed_tokens`` tokens of
    /// ``request_id`` have their KV written (chunked prefill); under
    /// write-through their full blocks go down.
    fn commit(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] num_computed_tokens: usize,
    ) -> PyResult<()> {
        self.api().commit(py, request_id, num_computed_tokens)
    }

    /// Creates request ``child`` sharing the blocks of ``parent``, like
    /// ``BlockManager.fork``.
    fn fork(&self, parent: &Bound<'_, PyAny>, child: &Bound<'_, PyAny>) -> PyResult<()> {
        self.api().fork(parent, child)
    }

    /// Frees ``request_id`` like ``BlockManager.free`` (an unchunked
    /// request's written blocks go down first under write-through).
    fn free(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.api().free(py, request_id)
    }

    /// The block table of ``request_id`` (numpy int32), reserved room included.
    fn block_table(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyArray1<i32>>> {
        self.api().block_table(py, request_id)
    }

    /// Slot numbers (numpy int64) of token positions ``start .. end`` of
    /// ``request_id``, for ``LatentStore.write``.
    fn slot_mapping(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] start: usize,
        #[pyo3(from_py_with = ints::size)] end: usize,
    ) -> PyResult<Py<PyArray1<i64>>> {
        self.api().slot_mapping(py, request_id, start, end)
    }

    /// Tokens (prompt and appended) of ``request_id``.
    fn num_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.api().num_tokens(request_id)
    }

    /// Waits up to ``timeout_s`` seconds until the remote tier has run
    /// every write queued so far; returns whether it did (``True`` without
    /// a remote tier).
    #[pyo3(signature = (timeout_s = 10.0))]
    fn flush_remote(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
        let timeout = Duration::try_from_secs_f64(timeout_s).map_err(|_| {
            PyValueError::new_err(format!("timeout_s must be >= 0, got {timeout_s}"))
        })?;
        Ok(self
            .inner
            .remote()
            .is_none_or(|r| py.detach(|| r.flush(timeout))))
    }

    /// Every tier's events since the last call, oldest first, each with its
    /// ``medium`` (``"GPU"``, ``"CPU"``, the remote tier's name); empty
    /// unless the config enables events. On a tiered cache, take events
    /// here, not from ``manager``.
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        super::events::wire_to_py_list(py, self.inner.take_events())
    }

    /// A snapshot of the counters as a dict: ``query_tokens``,
    /// ``device_hit_tokens``, ``host_hit_tokens``, ``remote_hit_tokens``,
    /// ``written_through``, ``written_back``, ``copy_errors``,
    /// ``events_dropped`` (by ``take_events``' bounded queue); ``host``: a
    /// dict (``capacity_blocks``, ``blocks``, ``stores``, ``loads``,
    /// ``evictions``) or ``None``; ``remote``: a dict (``lookups``,
    /// ``hit_blocks``, ``miss_blocks``, ``rejected``, ``timeouts``,
    /// ``errors``, ``queue_full``, ``put_blocks``, ``put_bytes``,
    /// ``get_bytes``) or ``None``; ``manager``: ``BlockManager.stats()``'s
    /// counters of the device tier.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let tiers = serde_json::to_value(self.inner.stats())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let manager = serde_json::to_value(self.inner.manager().stats())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let d = json_dict(py, &tiers)?;
        d.set_item("manager", json_dict(py, &manager)?)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        format!(
            "TieredCache(write_policy={}, host={}, remote={})",
            self.inner.write_policy(),
            s.host
                .map_or("None".into(), |h| format!("{} blocks", h.capacity_blocks)),
            if s.remote.is_some() { "on" } else { "None" }
        )
    }
}

/// A JSON object of counters as a dict (nested objects as dicts, null as None).
fn json_dict<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    if let serde_json::Value::Object(map) = value {
        for (k, v) in map {
            d.set_item(k, json_value(py, v)?)?;
        }
    }
    Ok(d)
}

fn json_value<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match n.as_u64() {
            Some(u) => u.into_pyobject(py)?.into_any(),
            None => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => PyList::new(
            py,
            a.iter()
                .map(|x| json_value(py, x))
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any(),
        Value::Object(_) => json_dict(py, v)?.into_any(),
    })
}
