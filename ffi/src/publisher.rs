//! The KV event publisher (ZeroMQ, vLLM's wire format; docs/events.md).

use std::ffi::{c_char, CString};
use std::time::Duration;

use super::manager::{MlaManager, MANAGERS};
use super::tier::{MlaTieredCache, TIERED};
use super::{guard, opt_text, Failure, MlaPublisherStats, MlaStatus, Out, Registry};
use mla_cache::publish::{EventPublisher, PublisherConfig};

/// Settings of `mla_publisher_create`; zero-initialize for vLLM's defaults
/// (every zero or NULL field takes its default).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaPublisherOptions {
    /// PUB endpoint (default: port 5557 on every interface); bound when it has a wildcard
    /// host, `::`, or is `ipc://`/`inproc://`, connected to otherwise.
    pub endpoint: *const c_char,
    /// Replay (ROUTER) endpoint, always bound; NULL for none.
    pub replay_endpoint: *const c_char,
    /// Batches kept for replay (default 10000).
    pub buffer_steps: usize,
    /// Send high-water mark of the PUB socket, in messages (default 100000).
    pub hwm: i32,
    /// Most events queued; more are dropped and counted (default 100000).
    pub max_queue_size: usize,
    /// Topic frame of every message (default empty).
    pub topic: *const c_char,
    /// Data-parallel rank: in every batch, and offsets the TCP ports.
    pub data_parallel_rank: u32,
    /// A batch is sent once it holds this many events (default 1024) ...
    pub max_batch_events: usize,
    /// ... or once its first event waited this many microseconds (default 5000).
    pub max_batch_delay_us: u64,
    /// `medium` of the events (default `GPU`).
    pub medium: *const c_char,
}

/// A KV event publisher (opaque).
pub struct MlaPublisher {
    inner: EventPublisher,
    endpoint: CString,
}

static PUBLISHERS: Registry<MlaPublisher> = Registry::new("MlaPublisher");

/// The crate's config for `o`, defaults for zero fields.
///
/// # Safety
/// Non-null strings in `o` must be NUL-terminated.
unsafe fn config(o: &MlaPublisherOptions) -> Result<PublisherConfig, Failure> {
    let d = PublisherConfig::default();
    let or = |v: usize, d: usize| if v == 0 { d } else { v };
    // SAFETY (all four): per the contract.
    let endpoint = unsafe { opt_text(o.endpoint, "endpoint") }?;
    let replay = unsafe { opt_text(o.replay_endpoint, "replay_endpoint") }?;
    let topic = unsafe { opt_text(o.topic, "topic") }?;
    let medium = unsafe { opt_text(o.medium, "medium") }?;
    Ok(PublisherConfig {
        endpoint: endpoint.map_or(d.endpoint, str::to_owned),
        replay_endpoint: replay.map(str::to_owned),
        buffer_steps: or(o.buffer_steps, d.buffer_steps),
        hwm: if o.hwm == 0 { d.hwm } else { o.hwm },
        max_queue_size: or(o.max_queue_size, d.max_queue_size),
        topic: topic.map_or(d.topic, str::to_owned),
        data_parallel_rank: o.data_parallel_rank,
        max_batch_events: or(o.max_batch_events, d.max_batch_events),
        max_batch_delay: if o.max_batch_delay_us == 0 {
            d.max_batch_delay
        } else {
            Duration::from_micros(o.max_batch_delay_us)
        },
        medium: medium.map_or(d.medium, str::to_owned),
    })
}

/// Opens the publisher's sockets and starts its thread; a bad setting or an
/// endpoint that cannot be bound fails with `MLA_STATUS_INVALID_CONFIG`.
///
/// # Safety
/// `options` must be readable (its non-null strings NUL-terminated); `out`
/// must be valid for a write and receives the new handle.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_publisher_create(
    options: *const MlaPublisherOptions,
    out: *mut *mut MlaPublisher,
) -> MlaStatus {
    guard("mla_publisher_create", || {
        let out = Out::new(out, "out")?;
        if options.is_null() {
            return Err(Failure::null("options"));
        }
        // SAFETY: non-null and readable per the contract.
        let config = unsafe { config(&*options) }?;
        let inner = EventPublisher::new(config)?;
        let endpoint = CString::new(inner.endpoint()).map_err(|_| Failure::invalid("endpoint"))?;
        // SAFETY: per the contract.
        unsafe { out.set(PUBLISHERS.register(MlaPublisher { inner, endpoint })) };
        Ok(())
    })
}

/// Takes the manager's recorded events and queues them for publishing,
/// never blocking; writes how many were accepted (all, or 0 when the queue
/// is full: they are dropped and counted). `accepted` may be NULL.
///
/// # Safety
/// A non-null `accepted` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_publisher_publish(
    publisher: *const MlaPublisher,
    manager: *const MlaManager,
    accepted: *mut usize,
) -> MlaStatus {
    guard("mla_publisher_publish", || {
        let out = (!accepted.is_null())
            .then(|| Out::new(accepted, "accepted"))
            .transpose()?;
        let n = PUBLISHERS.with(publisher, |p| {
            let events = MANAGERS.with(manager, |m| Ok(m.inner.take_events()))?;
            Ok(p.inner.publish(events))
        })?;
        if let Some(out) = out {
            // SAFETY: per the contract.
            unsafe { out.set(n) };
        }
        Ok(())
    })
}

/// Takes every tier's events from a tiered cache and queues them for
/// publishing, each with its own `medium` (the publisher's is not used);
/// otherwise like `mla_publisher_publish`. `accepted` may be NULL.
///
/// # Safety
/// A non-null `accepted` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_publisher_publish_tiered(
    publisher: *const MlaPublisher,
    cache: *const MlaTieredCache,
    accepted: *mut usize,
) -> MlaStatus {
    guard("mla_publisher_publish_tiered", || {
        let out = (!accepted.is_null())
            .then(|| Out::new(accepted, "accepted"))
            .transpose()?;
        let n = PUBLISHERS.with(publisher, |p| {
            let events = TIERED.with(cache, |c| Ok(c.inner.take_events()))?;
            Ok(p.inner.publish_events(events))
        })?;
        if let Some(out) = out {
            // SAFETY: per the contract.
            unsafe { out.set(n) };
        }
        Ok(())
    })
}

/// Sends the queued events now and waits at most `timeout_ms` for them to
/// go out; `sent` (may be NULL) tells whether they did.
///
/// # Safety
/// A non-null `sent` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_publisher_flush(
    publisher: *const MlaPublisher,
    timeout_ms: u64,
    sent: *mut bool,
) -> MlaStatus {
    guard("mla_publisher_flush", || {
        let out = (!sent.is_null())
            .then(|| Out::new(sent, "sent"))
            .transpose()?;
        let done = PUBLISHERS.with(publisher, |p| {
            Ok(p.inner.flush(Duration::from_millis(timeout_ms)))
        })?;
        if let Some(out) = out {
            // SAFETY: per the contract.
            unsafe { out.set(done) };
        }
        Ok(())
    })
}

/// Reads the publisher's counters.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_publisher_stats(
    publisher: *const MlaPublisher,
    out: *mut MlaPublisherStats,
) -> MlaStatus {
    guard("mla_publisher_stats", || {
        let out = Out::new(out, "out")?;
        let stats = PUBLISHERS.with(publisher, |p| Ok(p.inner.stats().into()))?;
        // SAFETY: per the contract.
        unsafe { out.set(stats) };
        Ok(())
    })
}

/// Writes the PUB endpoint in use (with the port the OS chose for port 0);
/// the string lives as long as the publisher.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_publisher_endpoint(
    publisher: *const MlaPublisher,
    out: *mut *const c_char,
) -> MlaStatus {
    guard("mla_publisher_endpoint", || {
        let out = Out::new(out, "out")?;
        let p = PUBLISHERS.with(publisher, |p| Ok(p.endpoint.as_ptr()))?;
        // SAFETY: per the contract.
        unsafe { out.set(p) };
        Ok(())
    })
}

/// Sends what is queued, closes the sockets, stops the thread and destroys
/// the publisher.
///
/// # Safety
/// `publisher` must not be used after this call.
///
/// Thread safety: waits for calls in flight on this handle.
#[no_mangle]
pub unsafe extern "C" fn mla_publisher_destroy(publisher: *mut MlaPublisher) -> MlaStatus {
    guard("mla_publisher_destroy", || PUBLISHERS.destroy(publisher))
}
