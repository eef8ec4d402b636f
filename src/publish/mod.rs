//! A native KV event publisher with vLLM's wire format, so that an engine
//! linking mla_cache feeds the KV-aware routers written for vLLM (Dynamo's
//! KV router, llm-d's indexer) unchanged.
//!
//! [`EventPublisher`] owns a ZeroMQ PUB socket (and optionally vLLM's replay
//! ROUTER socket) on a thread of its own. [`EventPublisher::publish`] only
//! moves events into a bounded queue: it never blocks, and when the queue is
//! full it drops the events and counts them. The thread gathers events into
//! batches (by count or by time), sends each as the multipart message
//! `[topic, 8-byte big-endian sequence number, msgpack KVEventBatch]` and
//! keeps the last `buffer_steps` batches for replay. See docs/events.md.
//!
//! ```no_run
//! use mla_cache::publish::{EventPublisher, PublisherConfig};
//! use mla_cache::{AdmitOptions, BlockManager, CacheConfig};
//!
//! let mut config = CacheConfig::new(1024);
//! config.enable_events = true;
//! let manager = BlockManager::new(config)?;
//! let publisher = EventPublisher::new(PublisherConfig::default())?;
//! manager.admit(1, &(0..256).collect::<Vec<u32>>(), &AdmitOptions::default())?;
//! publisher.publish(manager.take_events());
//! # Ok::<(), mla_cache::Error>(())
//! ```

mod endpoint;
mod wire;
mod worker;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

pub use endpoint::{is_bind_endpoint, offset_for_rank};
pub use wire::{encode_batch, WireEvent, MEDIUM_CPU, MEDIUM_GPU};

use crate::{CacheEvent, Error, Result};

/// Settings of an [`EventPublisher`]; the first six are vLLM's
/// `KVEventsConfig` fields with its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct PublisherConfig {
    /// PUB endpoint; bound when it has a wildcard host (`tcp://*:5557`),
    /// `::`, or is `ipc://` / `inproc://`, connected to otherwise. A TCP
    /// port of 0 lets the OS choose ([`EventPublisher::endpoint`] tells).
    pub endpoint: String,
    /// ROUTER endpoint for replay requests (always bound); `None` for none.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// ZeroMQ send high-water mark of the PUB socket, in messages.
    pub hwm: i32,
    /// Most events waiting in the queue; more are dropped and counted.
    pub max_queue_size: usize,
    /// Topic frame of every message (subscribers filter on its prefix).
    pub topic: String,
    /// Data-parallel rank: written into every batch, and offsets the ports
    /// of both endpoints (see [`offset_for_rank`]).
    pub data_parallel_rank: u32,
    /// A batch is sent once it holds this many events...
    pub max_batch_events: usize,
    /// ... or once its first event has waited this long.
    pub max_batch_delay: Duration,
    /// `medium` of the events given to [`EventPublisher::publish`].
    pub medium: String,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
            data_parallel_rank: 0,
            max_batch_events: 1024,
            max_batch_delay: Duration::from_millis(5),
            medium: MEDIUM_GPU.into(),
        }
    }
}

impl PublisherConfig {
    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidConfig(format!("publisher: {m}")));
        if self.buffer_steps == 0 && self.replay_endpoint.is_some() {
            return bad("buffer_steps must be at least 1 with a replay endpoint");
        }
        if self.hwm < 0 {
            return bad("hwm must be 0 (no limit) or more");
        }
        if self.max_queue_size == 0 {
            return bad("max_queue_size must be at least 1");
        }
        if self.max_batch_events == 0 {
            return bad("max_batch_events must be at least 1");
        }
        if self.medium.is_empty() {
            return bad("medium must not be empty");
        }
        Ok(())
    }
}

/// Counters of an [`EventPublisher`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Events accepted by `publish` so far.
    pub events_accepted: u64,
    /// Events dropped by `publish` because the queue was full.
    pub events_dropped: u64,
    /// Events sent on the PUB socket.
    pub events_published: u64,
    /// Batches sent; the next batch's sequence number.
    pub batches_published: u64,
    /// Replay requests answered.
    pub replays_served: u64,
}

/// Counters and queue depth shared by the handle and its thread.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) queued: AtomicUsize,
    pub(crate) accepted: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) published: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) replays: AtomicU64,
}

/// What the handle sends its thread.
pub(crate) enum Command {
    Events(Vec<WireEvent>),
    /// Send the open batch now; the sender is told when it went out.
    Flush(mpsc::SyncSender<()>),
}

/// A ZeroMQ publisher of KV events in vLLM's wire format (see the module
/// docs). `Send + Sync`; dropping it sends what is queued and stops its thread.
pub struct EventPublisher {
    commands: Mutex<Option<Sender<Command>>>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    endpoint: String,
    replay_endpoint: Option<String>,
    medium: Arc<str>,
    max_queue_size: usize,
}

impl EventPublisher {
    /// Opens the sockets (binding or connecting as the config says) and
    /// starts the publishing thread. Fails on a bad config or an endpoint
    /// that cannot be bound or connected.
    pub fn new(config: PublisherConfig) -> Result<Self> {
        config.validate()?;
        let opened = worker::Sockets::open(&config)?;
        let endpoint = opened.endpoint.clone();
        let replay_endpoint = opened.replay_endpoint.clone();
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel();
        let medium: Arc<str> = config.medium.as_str().into();
        let thread = worker::spawn(opened, config.clone(), rx, Arc::clone(&shared))?;
        Ok(Self {
            commands: Mutex::new(Some(tx)),
            shared,
            thread: Mutex::new(Some(thread)),
            endpoint,
            replay_endpoint,
            medium,
            max_queue_size: config.max_queue_size,
        })
    }

    /// The PUB endpoint in use (with the port the OS chose for port 0).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The `medium` [`publish`](Self::publish) gives events.
    pub fn medium(&self) -> &Arc<str> {
        &self.medium
    }

    /// The replay endpoint in use, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queues `events` (oldest first) with the configured medium; returns
    /// how many were accepted: all of them, or none when they do not fit in
    /// the queue (then they are counted in `events_dropped`). Never blocks.
    pub fn publish(&self, events: Vec<CacheEvent>) -> usize {
        let medium = Arc::clone(&self.medium);
        self.publish_from(events, &medium)
    }

    /// [`publish`](Self::publish) with another `medium` (a lower tier's).
    pub fn publish_from(&self, events: Vec<CacheEvent>, medium: &Arc<str>) -> usize {
        let wire = events
            .into_iter()
            .map(|event| WireEvent {
                event,
                medium: Arc::clone(medium),
            })
            .collect();
        self.publish_events(wire)
    }

    /// [`publish`](Self::publish) for events that carry their own medium
    /// (those of [`TieredCache::take_events`](crate::tier::TieredCache::take_events)).
    pub fn publish_events(&self, events: Vec<WireEvent>) -> usize {
        let n = events.len();
        if n == 0 {
            return 0;
        }
        let fits = self
            .shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + n <= self.max_queue_size).then_some(q + n)
            })
            .is_ok();
        let sent = fits && self.send(Command::Events(events));
        if sent {
            self.shared.accepted.fetch_add(n as u64, Ordering::Relaxed);
            n
        } else {
            if fits {
                self.shared.queued.fetch_sub(n, Ordering::AcqRel);
            }
            self.shared.dropped.fetch_add(n as u64, Ordering::Relaxed);
            0
        }
    }

    /// Sends the events queued so far without waiting for the batch to
    /// fill, and waits at most `timeout` for them to go out. Returns whether
    /// they did.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Command::Flush(tx)) && rx.recv_timeout(timeout).is_ok()
    }

    /// The publisher's counters.
    pub fn stats(&self) -> PublisherStats {
        let s = &self.shared;
        PublisherStats {
            events_accepted: s.accepted.load(Ordering::Relaxed),
            events_dropped: s.dropped.load(Ordering::Relaxed),
            events_published: s.published.load(Ordering::Relaxed),
            batches_published: s.batches.load(Ordering::Relaxed),
            replays_served: s.replays.load(Ordering::Relaxed),
        }
    }

    /// Sends what is queued, closes the sockets and stops the thread.
    /// Later `publish` calls drop their events. Idempotent.
    pub fn shutdown(&self) {
        drop(self.lock_commands().take());
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            // The thread catches nothing that could panic on valid data;
            // a panic there has already been reported on stderr.
            let _ = t.join();
        }
    }

    fn send(&self, command: Command) -> bool {
        self.lock_commands()
            .as_ref()
            .is_some_and(|tx| tx.send(command).is_ok())
    }

    fn lock_commands(&self) -> std::sync::MutexGuard<'_, Option<Sender<Command>>> {
        self.commands.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for EventPublisher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("stats", &self.stats())
            .finish()
    }
}
