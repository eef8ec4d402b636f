//! `mla_cache.EventPublisher`: the native KV event publisher
//! ([`mla_cache::publish`]) for the events of ``take_events``.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors;
use super::events::{AllBlocksCleared, BlockRemoved, BlockStored};
use mla_cache::publish::{self, PublisherConfig, WireEvent};
use mla_cache::CacheEvent;

/// Publishes KV events over ZeroMQ in vLLM's wire format (multipart
/// ``[topic, 8-byte big-endian seq, msgpack KVEventBatch]``), with vLLM's
/// replay socket; the arguments are vLLM's ``KVEventsConfig`` fields plus
/// batching. ``publish`` never blocks: a full queue drops and counts.
#[pyclass(frozen, module = "mla_cache")]
pub struct EventPublisher {
    inner: publish::EventPublisher,
}

#[pymethods]
impl EventPublisher {
    #[new]
    #[pyo3(signature = (
        endpoint = "tcp://*:5557",
        replay_endpoint = None,
        buffer_steps = 10_000,
        hwm = 100_000,
        max_queue_size = 100_000,
        topic = "",
        data_parallel_rank = 0,
        max_batch_events = 1024,
        max_batch_delay_s = 0.005,
        medium = "GPU",
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoint: &str,
        replay_endpoint: Option<String>,
        buffer_steps: usize,
        hwm: i32,
        max_queue_size: usize,
        topic: &str,
        data_parallel_rank: u32,
        max_batch_events: usize,
        max_batch_delay_s: f64,
        medium: &str,
    ) -> PyResult<Self> {
        let max_batch_delay = Duration::try_from_secs_f64(max_batch_delay_s)
            .map_err(|_| PyValueError::new_err("max_batch_delay_s must be a finite number >= 0"))?;
        let config = PublisherConfig {
            endpoint: endpoint.to_owned(),
            replay_endpoint,
            buffer_steps,
            hwm,
            max_queue_size,
            topic: topic.to_owned(),
            data_parallel_rank,
            max_batch_events,
            max_batch_delay,
            medium: medium.to_owned(),
        };
        let inner = py
            .detach(|| publish::EventPublisher::new(config))
            .map_err(errors::to_py)?;
        Ok(Self { inner })
    }

    /// The PUB endpoint in use (with the port the OS chose for port 0).
    #[getter]
    fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    /// The replay (ROUTER) endpoint in use, or ``None``.
    #[getter]
    fn replay_endpoint(&self) -> Option<&str> {
        self.inner.replay_endpoint()
    }

    /// Queues the events of ``take_events`` (oldest first), each with
    /// ``medium`` if given, else its own (a tiered cache's events), else
    /// the publisher's; returns how many were accepted: all, or none when
    /// the queue is full (they are counted as dropped).
    #[pyo3(signature = (events, medium = None))]
    fn publish(&self, events: Vec<Bound<'_, PyAny>>, medium: Option<&str>) -> PyResult<usize> {
        if medium == Some("") {
            return Err(PyValueError::new_err("medium must not be empty"));
        }
        let given = medium.map(Arc::<str>::from);
        let events = events
            .iter()
            .map(|obj| {
                // The conversion comes first: it refuses what is not an event.
                let event = from_py(obj)?;
                let own = obj.getattr("medium")?.extract::<Option<String>>()?;
                let medium = match (&given, own) {
                    (Some(m), _) => Arc::clone(m),
                    (None, Some(m)) if !m.is_empty() => Arc::from(m),
                    (None, _) => Arc::clone(self.inner.medium()),
                };
                Ok(WireEvent { event, medium })
            })
            .collect::<PyResult<Vec<WireEvent>>>()?;
        Ok(self.inner.publish_events(events))
    }

    /// Sends the queued events now; waits at most ``timeout_s`` seconds for
    /// them to go out and returns whether they did.
    #[pyo3(signature = (timeout_s = 5.0))]
    fn flush(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
        let timeout = Duration::try_from_secs_f64(timeout_s)
            .map_err(|_| PyValueError::new_err("timeout_s must be a finite number >= 0"))?;
        Ok(py.detach(|| self.inner.flush(timeout)))
    }

    /// Counters: ``events_accepted``, ``events_dropped``,
    /// ``events_published``, ``batches_published``, ``replays_served``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("events_accepted", s.events_accepted)?;
        d.set_item("events_dropped", s.events_dropped)?;
        d.set_item("events_published", s.events_published)?;
        d.set_item("batches_published", s.batches_published)?;
        d.set_item("replays_served", s.replays_served)?;
        Ok(d)
    }

    /// Sends what is queued, closes the sockets and stops the publishing
    /// thread; later ``publish`` calls drop their events.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.inner.shutdown());
    }
}

/// The crate's event behind one of the native event objects.
fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<CacheEvent> {
    if obj.is_instance_of::<BlockStored>() {
        Ok(CacheEvent::BlockStored {
            block_hashes: obj.getattr("block_hashes")?.extract()?,
            parent_block_hash: obj.getattr("parent_block_hash")?.extract()?,
            token_ids: obj.getattr("token_ids")?.extract()?,
            block_size: obj.getattr("block_size")?.extract()?,
            adapter: obj
                .getattr("adapter")?
                .extract::<Option<String>>()?
                .map(Arc::from),
        })
    } else if obj.is_instance_of::<BlockRemoved>() {
        Ok(CacheEvent::BlockRemoved {
            block_hashes: obj.getattr("block_hashes")?.extract()?,
        })
    } else if obj.is_instance_of::<AllBlocksCleared>() {
        Ok(CacheEvent::AllBlocksCleared)
    } else {
        Err(PyTypeError::new_err(format!(
            "expected an event of take_events, got {}",
            obj.get_type().name()?
        )))
    }
}
