//! The remote tier (L3): blocks shared by every node of a fleet, in a
//! key-value store, behind [`RemoteBackend`].
//!
//! ```text
//!   scheduler thread                         worker thread
//!   get(hashes) ──try_send──▶ [bounded queue] ──▶ backend.get(keys)
//!       ◀── reply, or nothing within the budget: misses    │ check headers,
//!   put(blocks) ──try_send──▶ (full queue: dropped)        ▼ checksums
//! ```
//!
//! Every backend call runs on one worker thread. The scheduler never waits
//! longer than the lookup budget: a slow or lost server, a refused
//! connection or a full queue turn into misses and counters, never into an
//! error or a stalled admission. Blocks are content-addressed and immutable,
//! so writes only add (`SET NX`) and a lost write is merely a later miss.

mod chunks;
mod sim;
mod value;

#[cfg(feature = "remote-redis")]
mod redis;

#[cfg(feature = "remote-redis")]
pub use self::redis::{RedisOptions, RedisRemote};
pub use chunks::{chunk_key, ChunkTransfers, Direction, Finished, HostRegion};
pub use sim::SimRemote;
pub use value::{BlockFormat, Encoding, Rejected, HEADER_LEN};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::hash::BlockHash;

/// A failed backend call: the worker counts it and reports misses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("remote store: {0}")]
pub struct RemoteError(pub String);

/// A key-value store holding immutable blocks, called from the remote
/// tier's worker thread only. Implementations reconnect on their own after
/// failures; each call returns promptly (bounded by the backend's own
/// timeouts). Valkey/Redis is [`RedisRemote`] (feature `remote-redis`);
/// [`SimRemote`] is an in-process stand-in; a Mooncake Store backend would
/// implement the same three calls.
pub trait RemoteBackend: Send {
    /// The values of `keys`, `None` where absent, in order.
    fn get(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, RemoteError>;
    /// Whether each of `keys` is present.
    fn exists(&mut self, keys: &[Vec<u8>]) -> Result<Vec<bool>, RemoteError>;
    /// Stores each `(key, value)` unless the key is present.
    fn put_if_absent(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), RemoteError>;
}

/// Value bytes one round trip to the backend carries at most (one value,
/// however large, always goes). A server takes small values fastest in long
/// pipelines, but multi-megabyte values (an MLA block of all layers) one or
/// two at a time: on loopback, 2.2 MB `SET`s run at 1.6 GB/s two at a time
/// and 0.8 GB/s four or more at a time.
pub(crate) const ROUND_TRIP_BYTES: usize = 4 << 20;

/// How a [`RemoteTier`] talks to its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOptions {
    /// Names the deployment (model and weights): only caches with the same
    /// namespace, block format and hash seed share blocks.
    pub namespace: String,
    /// Longest a lookup waits for the worker before counting misses.
    pub lookup_budget: Duration,
    /// Jobs (lookups and write batches) queued for the worker at most;
    /// beyond it lookups miss and writes are dropped.
    pub queue_depth: usize,
    /// The tier's `medium` in KV events (vLLM's field): names it to routers.
    pub name: String,
}

impl Default for RemoteOptions {
    /// Namespace `default`, a 20 ms lookup budget, 64 queued jobs, name `REMOTE`.
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            lookup_budget: Duration::from_millis(20),
            queue_depth: 64,
            name: "REMOTE".into(),
        }
    }
}

/// Counters of a [`RemoteTier`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[repr(C)]
pub struct RemoteStats {
    /// Lookups sent (block gets and existence probes).
    pub lookups: u64,
    /// Blocks found and accepted.
    pub hit_blocks: u64,
    /// Blocks asked for and not found, or lost to a failure.
    pub miss_blocks: u64,
    /// Values refused: bad header, geometry, length or checksum.
    pub rejected: u64,
    /// Lookups that ran past the budget.
    pub timeouts: u64,
    /// Backend calls that failed (connection refused or lost, timeout, server error).
    pub errors: u64,
    /// Jobs not queued because the queue was full.
    pub queue_full: u64,
    /// Blocks handed to the backend for writing.
    pub put_blocks: u64,
    /// Value bytes handed to the backend for writing.
    pub put_bytes: u64,
    /// Value bytes read and accepted.
    pub get_bytes: u64,
}

impl std::ops::AddAssign for RemoteStats {
    fn add_assign(&mut self, o: Self) {
        self.lookups += o.lookups;
        self.hit_blocks += o.hit_blocks;
        self.miss_blocks += o.miss_blocks;
        self.rejected += o.rejected;
        self.timeouts += o.timeouts;
        self.errors += o.errors;
        self.queue_full += o.queue_full;
        self.put_blocks += o.put_blocks;
        self.put_bytes += o.put_bytes;
        self.get_bytes += o.get_bytes;
    }
}

#[derive(Debug, Default)]
struct Counters {
    lookups: AtomicU64,
    hit_blocks: AtomicU64,
    miss_blocks: AtomicU64,
    rejected: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    queue_full: AtomicU64,
    put_blocks: AtomicU64,
    put_bytes: AtomicU64,
    get_bytes: AtomicU64,
}

type Reply<T> = mpsc::Sender<T>;

enum Job {
    /// Values of the leading run of hashes that are present and valid.
    Get {
        hashes: Vec<BlockHash>,
        deadline: Instant,
        reply: Reply<Vec<Vec<u8>>>,
    },
    /// Whether each hash is present.
    Exists {
        hashes: Vec<BlockHash>,
        deadline: Instant,
        reply: Reply<Vec<bool>>,
    },
    /// A load or store between the store and a host region of chunks.
    Chunks(chunks::ChunkJob),
    Put {
        entries: Vec<(BlockHash, Vec<u8>)>,
    },
    Flush {
        reply: Reply<()>,
    },
}

/// The remote tier: a worker thread owning a [`RemoteBackend`], fed through
/// a bounded queue. `Send + Sync`. Dropping it lets the worker finish the
/// queued writes and joins it, so no thread outlives the tier.
#[derive(Debug)]
pub struct RemoteTier {
    format: BlockFormat,
    options: RemoteOptions,
    jobs: SyncSender<Job>,
    counters: Arc<Counters>,
    worker: Option<JoinHandle<()>>,
}

impl RemoteTier {
    /// Starts the worker for `backend`, holding blocks of `format`.
    pub fn new(
        backend: Box<dyn RemoteBackend>,
        format: BlockFormat,
        options: RemoteOptions,
    ) -> Result<Self> {
        if options.queue_depth == 0 {
            return Err(Error::InvalidConfig(
                "the remote queue depth must be at least 1".into(),
            ));
        }
        let (jobs, rx) = mpsc::sync_channel(options.queue_depth);
        let counters = Arc::new(Counters::default());
        let worker = Worker {
            backend,
            format,
            prefix: format.key_prefix(&options.namespace),
            counters: Arc::clone(&counters),
        };
        let worker = std::thread::Builder::new()
            .name("mla-cache-remote".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| Error::Storage(format!("cannot start the remote tier's worker: {e}")))?;
        Ok(Self {
            format,
            options,
            jobs,
            counters,
            worker: Some(worker),
        })
    }

    /// The block format values carry.
    pub fn format(&self) -> &BlockFormat {
        &self.format
    }

    /// The options.
    pub fn options(&self) -> &RemoteOptions {
        &self.options
    }

    /// Payloads of the leading run of `hashes` present and intact in the
    /// store; empty after the lookup budget, on any failure, or when the
    /// queue is full. Each value is `HEADER_LEN` bytes of header, then the
    /// payload.
    pub fn get(&self, hashes: &[BlockHash]) -> Vec<Vec<u8>> {
        if hashes.is_empty() {
            return Vec::new();
        }
        let n = hashes.len() as u64;
        let found = self
            .ask(|deadline, reply| Job::Get {
                hashes: hashes.to_vec(),
                deadline,
                reply,
            })
            .unwrap_or_default();
        self.counters
            .miss_blocks
            .fetch_add(n - found.len() as u64, Relaxed);
        found
    }

    /// Length of the leading run of `hashes` present in the store (their
    /// values are not checked); 0 after the budget or on any failure.
    pub fn probe(&self, hashes: &[BlockHash]) -> usize {
        self.probe_each(hashes)
            .map_or(0, |present| present.iter().take_while(|&&p| p).count())
    }

    /// Whether each of `hashes` is present in the store (values not
    /// checked), in one batch; `None` after the lookup budget, on any
    /// failure, or when the queue is full.
    pub fn probe_each(&self, hashes: &[BlockHash]) -> Option<Vec<bool>> {
        if hashes.is_empty() {
            return Some(Vec::new());
        }
        self.ask(|deadline, reply| Job::Exists {
            hashes: hashes.to_vec(),
            deadline,
            reply,
        })
    }

    /// Queues values (from [`BlockFormat::encode`]) for writing; drops them
    /// when the queue is full. Never blocks. Returns whether they were queued.
    pub fn put(&self, entries: Vec<(BlockHash, Vec<u8>)>) -> bool {
        if entries.is_empty() {
            return false;
        }
        let (n, bytes) = (
            entries.len() as u64,
            entries.iter().map(|e| e.1.len() as u64).sum::<u64>(),
        );
        match self.jobs.try_send(Job::Put { entries }) {
            Ok(()) => {
                self.counters.put_blocks.fetch_add(n, Relaxed);
                self.counters.put_bytes.fetch_add(bytes, Relaxed);
                true
            }
            Err(_) => {
                self.counters.queue_full.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// Waits up to `timeout` until every job queued before the call has
    /// run; returns whether they all did.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (reply, rx) = mpsc::channel();
        let deadline = Instant::now() + timeout;
        let mut job = Job::Flush { reply };
        loop {
            match self.jobs.try_send(job) {
                Ok(()) => break,
                Err(TrySendError::Full(j)) if Instant::now() < deadline => {
                    job = j;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return false,
            }
        }
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RemoteStats {
        let c = &self.counters;
        RemoteStats {
            lookups: c.lookups.load(Relaxed),
            hit_blocks: c.hit_blocks.load(Relaxed),
            miss_blocks: c.miss_blocks.load(Relaxed),
            rejected: c.rejected.load(Relaxed),
            timeouts: c.timeouts.load(Relaxed),
            errors: c.errors.load(Relaxed),
            queue_full: c.queue_full.load(Relaxed),
            put_blocks: c.put_blocks.load(Relaxed),
            put_bytes: c.put_bytes.load(Relaxed),
            get_bytes: c.get_bytes.load(Relaxed),
        }
    }

    /// Sends a lookup and waits for its reply within the budget.
    fn ask<T>(&self, job: impl FnOnce(Instant, Reply<T>) -> Job) -> Option<T> {
        self.counters.lookups.fetch_add(1, Relaxed);
        let deadline = Instant::now() + self.options.lookup_budget;
        let (reply, rx) = mpsc::channel();
        if self.jobs.try_send(job(deadline, reply)).is_err() {
            self.counters.queue_full.fetch_add(1, Relaxed);
            return None;
        }
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(v) => Some(v),
            Err(RecvTimeoutError::Timeout) => {
                self.counters.timeouts.fetch_add(1, Relaxed);
                None
            }
            // The worker dropped the reply: the backend failed (counted there).
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }
}

impl Drop for RemoteTier {
    fn drop(&mut self) {
        // Disconnect the queue (the worker drains what is queued, then stops).
        self.jobs = mpsc::sync_channel(0).0;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// The worker thread's state.
struct Worker {
    backend: Box<dyn RemoteBackend>,
    format: BlockFormat,
    prefix: String,
    counters: Arc<Counters>,
}

impl Worker {
    /// Serves jobs until the tier is dropped. Lookups whose caller stopped
    /// waiting are skipped.
    fn run(mut self, jobs: Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            match job {
                Job::Get {
                    hashes,
                    deadline,
                    reply,
                } => {
                    if Instant::now() < deadline {
                        if let Some(found) = self.get(&hashes) {
                            let _ = reply.send(found);
                        }
                    }
                }
                Job::Exists {
                    hashes,
                    deadline,
                    reply,
                } => {
                    if Instant::now() < deadline {
                        if let Some(n) = self.exists(&hashes) {
                            let _ = reply.send(n);
                        }
                    }
                }
                Job::Put { entries } => {
                    let entries: Vec<(Vec<u8>, Vec<u8>)> =
                        entries.into_iter().map(|(h, v)| (self.key(h), v)).collect();
                    if self.backend.put_if_absent(&entries).is_err() {
                        self.counters.errors.fetch_add(1, Relaxed);
                    }
                }
                Job::Chunks(job) => self.transfer(job),
                Job::Flush { reply } => {
                    let _ = reply.send(());
                }
            }
        }
    }

    fn key(&self, hash: BlockHash) -> Vec<u8> {
        format!("{}{:032x}", self.prefix, hash.0).into_bytes()
    }

    /// The leading run of present, intact values, read in round trips of
    /// about [`ROUND_TRIP_BYTES`] and no further than the first missing or
    /// refused one; `None` if the first round trip fails.
    fn get(&mut self, hashes: &[BlockHash]) -> Option<Vec<Vec<u8>>> {
        let mut found = Vec::new();
        'trips: for trip in hashes.chunks(self.values_per_trip()) {
            let keys: Vec<Vec<u8>> = trip.iter().map(|&h| self.key(h)).collect();
            // A reply per key, or the trip failed (a short reply must never
            // shift values onto other keys).
            let values = match self.backend.get(&keys) {
                Ok(values) if values.len() == keys.len() => values,
                _ => {
                    self.counters.errors.fetch_add(1, Relaxed);
                    if found.is_empty() {
                        return None;
                    }
                    break;
                }
            };
            for (&hash, value) in trip.iter().zip(values) {
                let Some(value) = value else { break 'trips };
                if self.format.check(hash, &value).is_err() {
                    self.counters.rejected.fetch_add(1, Relaxed);
                    break 'trips;
                }
                self.counters
                    .get_bytes
                    .fetch_add(value.len() as u64, Relaxed);
                found.push(value);
            }
        }
        self.counters
            .hit_blocks
            .fetch_add(found.len() as u64, Relaxed);
        Some(found)
    }

    /// Values one round trip carries: about [`ROUND_TRIP_BYTES`], at least one.
    fn values_per_trip(&self) -> usize {
        (ROUND_TRIP_BYTES / self.format.value_len()).max(1)
    }

    fn exists(&mut self, hashes: &[BlockHash]) -> Option<Vec<bool>> {
        let keys: Vec<Vec<u8>> = hashes.iter().map(|&h| self.key(h)).collect();
        match self.backend.exists(&keys) {
            Ok(present) if present.len() == keys.len() => Some(present),
            _ => {
                self.counters.errors.fetch_add(1, Relaxed);
                None
            }
        }
    }
}
