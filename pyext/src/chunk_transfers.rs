//! `ChunkTransfers`: the remote tier moving chunks of an engine's host
//! buffer (the Rust [`remote::ChunkTransfers`]), for the engines' own
//! offload plug-ins.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::errors;
use super::ints;
use mla_cache::tier::remote::{self, chunk_key, BlockFormat, Direction, Encoding, HostRegion};
use mla_cache::tier::{redis_backend, RemoteOptions, RemoteTier};
use mla_cache::BlockHash;

/// The transfers and the exported buffer their region points into; the
/// buffer is released only after the transfers (and their workers) are
/// gone, by whoever drops the last reference: `close`, or a call still
/// running when `close` came.
struct Open {
    transfers: remote::ChunkTransfers,
    _buffer: PyUntypedBuffer,
}

/// Loads and stores between mla_cache's remote tier (Valkey/Redis: ``remote``
/// is ``"redis://host:port/"``, ``"rediss://..."``, or ``"cluster:url,..."``)
/// and an engine's host buffer of fixed-size chunks (``region``: any
/// writable C-contiguous buffer; chunk ``i`` is ``chunk_bytes`` at ``i *
/// chunk_stride`` bytes, by default the buffer's first stride, or
/// ``chunk_bytes`` for a flat buffer).
///
/// A chunk holds ``num_layers`` layers of ``tokens_per_chunk`` MLA latents
/// in ``dtype`` (``"bf16"``, ``"fp8_ds_mla"``, ..., or ``"fp8_e4m3"``, an
/// engine's plain fp8 latent): ``chunk_bytes`` is checked against them
/// (``ValueError``). Keys are bytes or str; only caches with the same
/// ``namespace`` (name the model and weights) and geometry share chunks,
/// and a chunk that fails its checksum is a miss.
///
/// ``probe`` waits at most ``lookup_budget_ms``. ``submit_load`` and
/// ``submit_store`` queue a job (at most ``queue_depth`` queued: beyond it
/// a job fails at once) and ``take_finished`` reports it; ``load`` and
/// ``store`` run a job and wait for it, for an engine's own I/O threads.
/// The engine must leave a job's chunks alone until it is reported, and
/// keep ``region`` alive until ``close()``.
#[pyclass(frozen, module = "mla_cache")]
pub struct ChunkTransfers {
    // No lock is held while a call runs (it may wait on the server with the
    // GIL released): a call takes a reference, `close` takes the slot.
    open: Mutex<Option<Arc<Open>>>,
}

impl ChunkTransfers {
    fn with<T>(&self, f: impl FnOnce(&remote::ChunkTransfers) -> PyResult<T>) -> PyResult<T> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match open {
            Some(o) => f(&o.transfers),
            None => Err(PyRuntimeError::new_err("the chunk transfers are closed")),
        }
    }

    /// Runs `f` on the transfers with the job's keys and chunks read from
    /// Python, its errors raised as Python's.
    fn with_job<T>(
        &self,
        keys: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
        f: impl FnOnce(&remote::ChunkTransfers, Vec<BlockHash>, Vec<usize>) -> mla_cache::Result<T>,
    ) -> PyResult<T> {
        let (keys, chunks) = (hashes(keys)?, chunk_ids(chunks)?);
        self.with(|t| f(t, keys, chunks).map_err(errors::to_py))
    }
}

/// Keys as block hashes: bytes, or str (its UTF-8 bytes).
fn hashes(keys: &Bound<'_, PyAny>) -> PyResult<Vec<BlockHash>> {
    keys.try_iter()?
        .map(|k| {
            let k = k?;
            match k.cast::<PyString>() {
                Ok(s) => Ok(chunk_key(s.to_str()?.as_bytes())),
                Err(_) => Ok(chunk_key(k.cast::<PyBytes>()?.as_bytes())),
            }
        })
        .collect()
}

fn chunk_ids(chunks: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    chunks.try_iter()?.map(|c| ints::size(&c?)).collect()
}

#[pymethods]
impl ChunkTransfers {
    #[new]
    #[pyo3(signature = (
        remote, region, *, chunk_bytes, dtype, num_layers, tokens_per_chunk, namespace,
        chunk_stride = None, lookup_budget_ms = 20.0, queue_depth = 64, name = "REMOTE"
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        remote: &str,
        region: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] chunk_bytes: usize,
        dtype: &str,
        #[pyo3(from_py_with = ints::size)] num_layers: usize,
        #[pyo3(from_py_with = ints::size)] tokens_per_chunk: usize,
        namespace: &str,
        #[pyo3(from_py_with = ints::opt_size)] chunk_stride: Option<usize>,
        lookup_budget_ms: f64,
        #[pyo3(from_py_with = ints::size)] queue_depth: usize,
        name: &str,
    ) -> PyResult<Self> {
        let encoding: Encoding = dtype.parse().map_err(errors::to_py)?;
        let (num_layers, tokens) =
            match (u32::try_from(num_layers), u32::try_from(tokens_per_chunk)) {
                (Ok(l), Ok(t)) => (l, t),
                _ => {
                    return Err(PyValueError::new_err(
                        "num_layers and tokens_per_chunk must fit in 32 bits",
                    ))
                }
            };
        let lookup_budget =
            Duration::try_from_secs_f64(lookup_budget_ms / 1000.0).map_err(|_| {
                PyValueError::new_err(format!(
                    "lookup_budget_ms must be >= 0, got {lookup_budget_ms}"
                ))
            })?;
        let buffer = PyUntypedBuffer::get(region)?;
        if buffer.readonly() || !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "region must be a writable C-contiguous buffer",
            ));
        }
        let stride = match chunk_stride {
            Some(s) => s,
            None if buffer.dimensions() >= 2 => buffer.strides()[0] as usize,
            None => chunk_bytes,
        };
        let format = BlockFormat::mla_chunk(encoding, num_layers, tokens, chunk_bytes)
            .map_err(errors::to_py)?;
        // SAFETY: `buffer` stays exported (so its memory stays put) until the
        // transfers, whose worker is the only other user, are dropped first
        // (`Open`'s field order, and `close`). The engine keeps a job's chunks
        // alone until it is reported (documented above).
        let host = unsafe {
            HostRegion::new(
                buffer.buf_ptr().cast(),
                buffer.len_bytes(),
                stride,
                format.payload_len as usize,
            )
        }
        .map_err(errors::to_py)?;
        let options = RemoteOptions {
            namespace: namespace.to_owned(),
            lookup_budget,
            queue_depth,
            name: name.to_owned(),
        };
        // Probes and loads go over connections of their own: neither waits
        // behind a store.
        let tier = |options| RemoteTier::new(redis_backend(remote)?, format, options);
        let transfers = tier(options.clone())
            .and_then(|t| remote::ChunkTransfers::new(t, host))
            .and_then(|t| t.with_lookups(tier(options.clone())?))
            .and_then(|t| t.with_loads(tier(options)?))
            .map_err(errors::to_py)?;
        Ok(Self {
            open: Mutex::new(Some(Arc::new(Open {
                transfers,
                _buffer: buffer,
            }))),
        })
    }

    /// Chunks in the region.
    #[getter]
    fn num_chunks(&self) -> PyResult<usize> {
        self.with(|t| Ok(t.chunks()))
    }

    /// Jobs queued or running.
    #[getter]
    fn in_flight(&self) -> PyResult<usize> {
        self.with(|t| Ok(t.in_flight()))
    }

    /// Whether each of ``keys`` (bytes) is in the store, in one round trip
    /// within the lookup budget; ``None`` past it or on any failure.
    fn probe(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Option<Vec<bool>>> {
        let keys = hashes(keys)?;
        self.with(|t| Ok(py.detach(|| t.probe(&keys))))
    }

    /// Queues job ``job``: load ``keys[i]`` into chunk ``chunks[i]``
    /// (integers, e.g. a numpy array). Raises ``ValueError`` (queuing
    /// nothing) on mismatched lengths or a chunk outside the region.
    fn submit_load(
        &self,
        job: u64,
        keys: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_job(keys, chunks, |t, k, c| t.submit_load(job, k, c))
    }

    /// Queues job ``job``: store chunk ``chunks[i]`` as ``keys[i]``, skipping
    /// the keys the store has. As ``submit_load``.
    fn submit_store(
        &self,
        job: u64,
        keys: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_job(keys, chunks, |t, k, c| t.submit_store(job, k, c))
    }

    /// Loads ``keys[i]`` into chunk ``chunks[i]`` and waits for it (bounded
    /// by the server timeouts; the GIL is released); returns how many
    /// leading chunks were loaded (the rest are untouched). A full queue
    /// returns 0 at once. Raises as ``submit_load``.
    fn load(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        self.with_job(keys, chunks, |t, k, c| {
            py.detach(|| t.load(k, c)).map(|f| f.done)
        })
    }

    /// Stores chunk ``chunks[i]`` as ``keys[i]`` (skipping the keys the
    /// store has) and waits for it, as ``load``; returns whether every chunk
    /// is in the store.
    fn store(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.with_job(keys, chunks, |t, k, c| {
            py.detach(|| t.store(k, c)).map(|f| f.success())
        })
    }

    /// The jobs finished since the last call, each a tuple ``(job, is_load,
    /// done, total, bytes, seconds)``: a load's ``done`` leading chunks were
    /// copied in (the rest untouched); a store succeeded if ``done ==
    /// total``.
    fn take_finished<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let finished = self.with(|t| Ok(t.take_finished()))?;
        let items = finished
            .into_iter()
            .map(|f| {
                (
                    f.job,
                    f.direction == Direction::Load,
                    f.done,
                    f.total,
                    f.bytes,
                    f.seconds,
                )
                    .into_pyobject(py)
            })
            .collect::<PyResult<Vec<Bound<'py, PyTuple>>>>()?;
        PyList::new(py, items)
    }

    /// Waits up to ``timeout_s`` seconds until no job is queued or running;
    /// returns whether none is (jobs are never cut short).
    #[pyo3(signature = (timeout_s = 10.0))]
    fn wait_idle(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
        let timeout = Duration::try_from_secs_f64(timeout_s).map_err(|_| {
            PyValueError::new_err(format!("timeout_s must be >= 0, got {timeout_s}"))
        })?;
        self.with(|t| Ok(py.detach(|| t.wait_idle(timeout))))
    }

    /// The remote tier's counters as a dict: ``lookups``, ``hit_blocks``,
    /// ``miss_blocks``, ``rejected``, ``timeouts``, ``errors``,
    /// ``queue_full``, ``put_blocks``, ``put_bytes``, ``get_bytes``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(|t| Ok(t.stats()))?;
        let d = PyDict::new(py);
        for (k, v) in [
            ("lookups", s.lookups),
            ("hit_blocks", s.hit_blocks),
            ("miss_blocks", s.miss_blocks),
            ("rejected", s.rejected),
            ("timeouts", s.timeouts),
            ("errors", s.errors),
            ("queue_full", s.queue_full),
            ("put_blocks", s.put_blocks),
            ("put_bytes", s.put_bytes),
            ("get_bytes", s.get_bytes),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Finishes the queued jobs (each bounded by the server timeouts), stops
    /// the workers and releases ``region`` (once a call still running on
    /// another thread returns). Idempotent; later calls raise
    /// ``RuntimeError``, except ``close``.
    fn close(&self, py: Python<'_>) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner()).take();
        // A call still running keeps the transfers; its end releases them.
        if let Some(Ok(Open { transfers, _buffer })) = open.map(Arc::try_unwrap) {
            py.detach(|| drop(transfers));
            drop(_buffer);
        }
    }
}
