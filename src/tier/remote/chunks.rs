//! The remote tier under an engine's own host cache: asynchronous loads and
//! stores between the store and a host region of fixed-size chunks that the
//! engine owns (vLLM's CPU offload tier, SGLang's HiCache host pool).
//!
//! ```text
//!   engine thread                              remote worker thread
//!   submit_load(job, keys, chunks) ─try_send─▶ GET values, check them,
//!   submit_store(job, keys, chunks)            copy payloads into chunks
//!   take_finished() ◀── Finished ───────────── EXISTS, then SET NX of the
//!                                              absent chunks' values
//! ```
//!
//! A submission only queues (a full queue finishes the job at once as
//! failed), and results are polled; an engine that moves chunks on its own
//! I/O threads (SGLang's HiCache) may instead run a job and wait for it
//! (`load`, `store`), each job bounded by the backend's timeouts. A chunk is one value
//! under the remote tier's header and checksum, so a load copies only values
//! that name the key, the geometry and the format it expects, and stops at
//! the first that does not: the leading `done` chunks of a job are loaded,
//! the rest untouched.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Job, RemoteStats, RemoteTier, Worker, HEADER_LEN};
use crate::error::{Error, Result};
use crate::hash::BlockHash;

/// The block hash naming an engine's key (any bytes: vLLM's offload key,
/// SGLang's page hash) in the remote store: its xxh3-128.
pub fn chunk_key(key: &[u8]) -> BlockHash {
    BlockHash(xxhash_rust::xxh3::xxh3_128(key))
}

/// A host region of `chunks` fixed-size chunks, `stride` bytes apart, each
/// `chunk_bytes` long, owned by the engine and lent to the remote tier.
#[derive(Debug)]
pub struct HostRegion {
    base: usize,
    chunks: usize,
    stride: usize,
    chunk_bytes: usize,
}

impl HostRegion {
    /// The region of `len` bytes at `base`.
    ///
    /// # Safety
    /// `base..base + len` must stay valid for reads and writes while the
    /// region lives (the transfers that use it hold it), and the engine must
    /// not touch a chunk while a job on it is in flight (from submission to
    /// its [`Finished`]).
    pub unsafe fn new(
        base: *mut u8,
        len: usize,
        stride: usize,
        chunk_bytes: usize,
    ) -> Result<Self> {
        if base.is_null() || stride == 0 || chunk_bytes == 0 || chunk_bytes > stride {
            return Err(Error::InvalidArgument(format!(
                "a host region needs a base address and 0 < chunk bytes ({chunk_bytes}) <= stride ({stride})"
            )));
        }
        Ok(Self {
            base: base as usize,
            chunks: len / stride,
            stride,
            chunk_bytes,
        })
    }

    /// Chunks in the region.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Bytes of one chunk.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Chunk `index`'s first byte.
    fn chunk(&self, index: usize) -> *mut u8 {
        debug_assert!(index < self.chunks);
        (self.base + index * self.stride) as *mut u8
    }
}

/// Which way a job moves chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the store into the region.
    Load,
    /// From the region into the store.
    Store,
}

/// A finished job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finished {
    /// The caller's job id.
    pub job: u64,
    /// Load or store.
    pub direction: Direction,
    /// Chunks done: a load's leading chunks copied in; a store's chunks in
    /// the store (already present or written), all or none.
    pub done: usize,
    /// Chunks in the job.
    pub total: usize,
    /// Value bytes moved over the network.
    pub bytes: u64,
    /// Seconds the worker spent on the job.
    pub seconds: f64,
}

impl Finished {
    /// Whether every chunk of the job was done.
    pub fn success(&self) -> bool {
        self.done == self.total
    }
}

/// A job for the worker.
pub(super) struct ChunkJob {
    id: u64,
    direction: Direction,
    hashes: Vec<BlockHash>,
    chunks: Vec<usize>,
    region: Arc<HostRegion>,
    finished: Sender<Finished>,
    in_flight: Arc<AtomicUsize>,
}

/// The remote tier moving chunks of an engine's host region. `Send + Sync`;
/// dropping it waits for the queued jobs (each bounded by the backend's
/// timeouts), so no job outlives it.
#[derive(Debug)]
pub struct ChunkTransfers {
    /// Runs the stores (and, without `loads`, the loads).
    remote: RemoteTier,
    /// The same store over a connection and worker of its own for probes,
    /// so that a probe never waits behind a transfer (see `with_lookups`).
    lookups: Option<RemoteTier>,
    /// The same for loads, so that a load never waits behind a store (see
    /// `with_loads`).
    loads: Option<RemoteTier>,
    region: Arc<HostRegion>,
    finished_tx: Sender<Finished>,
    finished_rx: Mutex<Receiver<Finished>>,
    in_flight: Arc<AtomicUsize>,
}

impl ChunkTransfers {
    /// Transfers between `remote` and `region`, whose chunks must be one
    /// value's payload each.
    pub fn new(remote: RemoteTier, region: HostRegion) -> Result<Self> {
        let payload = remote.format().payload_len;
        if payload != region.chunk_bytes as u64 {
            return Err(Error::InvalidConfig(format!(
                "a chunk of {} bytes is not one block of the remote tier's format ({payload} bytes)",
                region.chunk_bytes
            )));
        }
        let (finished_tx, finished_rx) = mpsc::channel();
        Ok(Self {
            remote,
            lookups: None,
            loads: None,
            region: Arc::new(region),
            finished_tx,
            finished_rx: Mutex::new(finished_rx),
            in_flight: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Sends the probes to `lookups`, the same store (same format and
    /// namespace) over its own connection and worker: a probe then never
    /// queues behind a transfer of many megabytes, and its budget is spent
    /// on the round trip only.
    pub fn with_lookups(mut self, lookups: RemoteTier) -> Result<Self> {
        self.same_store(&lookups)?;
        self.lookups = Some(lookups);
        Ok(self)
    }

    /// Runs the loads on `loads`, the same store over its own connection
    /// and worker: a load (what a request waits for) then never queues
    /// behind a store (what only a later request may use).
    pub fn with_loads(mut self, loads: RemoteTier) -> Result<Self> {
        self.same_store(&loads)?;
        self.loads = Some(loads);
        Ok(self)
    }

    fn same_store(&self, other: &RemoteTier) -> Result<()> {
        if other.format() != self.remote.format()
            || other.options().namespace != self.remote.options().namespace
        {
            return Err(Error::InvalidConfig(
                "a lookup or load tier must hold the transfers' format under their namespace"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The remote tier.
    pub fn remote(&self) -> &RemoteTier {
        &self.remote
    }

    /// Chunks in the region.
    pub fn chunks(&self) -> usize {
        self.region.chunks()
    }

    /// Whether each key is in the store, in one batch within the lookup
    /// budget; `None` past it, on a failure or a full queue (all misses).
    pub fn probe(&self, keys: &[BlockHash]) -> Option<Vec<bool>> {
        self.lookups
            .as_ref()
            .unwrap_or(&self.remote)
            .probe_each(keys)
    }

    /// Queues job `id`: load `keys[i]` into chunk `chunks[i]`. Never blocks;
    /// a full queue finishes the job at once with nothing done. Mismatched
    /// lengths or a chunk outside the region are refused and queue nothing.
    pub fn submit_load(&self, id: u64, keys: Vec<BlockHash>, chunks: Vec<usize>) -> Result<()> {
        self.submit(id, Direction::Load, keys, chunks)
    }

    /// Queues job `id`: store chunk `chunks[i]` as `keys[i]` (the chunks must
    /// not change until the job is finished). As [`Self::submit_load`].
    pub fn submit_store(&self, id: u64, keys: Vec<BlockHash>, chunks: Vec<usize>) -> Result<()> {
        self.submit(id, Direction::Store, keys, chunks)
    }

    /// Loads `keys[i]` into chunk `chunks[i]` and waits for the job: the
    /// leading `done` chunks are loaded, the rest untouched. For an engine's
    /// I/O thread: the wait is bounded by the backend's timeouts, and a job
    /// never outlives the call, so the chunks are the caller's again when
    /// it returns. A full queue returns at once with nothing done.
    pub fn load(&self, keys: Vec<BlockHash>, chunks: Vec<usize>) -> Result<Finished> {
        self.run(Direction::Load, keys, chunks)
    }

    /// Stores chunk `chunks[i]` as `keys[i]` (skipping the keys the store
    /// has) and waits for the job, as [`Self::load`].
    pub fn store(&self, keys: Vec<BlockHash>, chunks: Vec<usize>) -> Result<Finished> {
        self.run(Direction::Store, keys, chunks)
    }

    fn run(
        &self,
        direction: Direction,
        keys: Vec<BlockHash>,
        chunks: Vec<usize>,
    ) -> Result<Finished> {
        let (tx, rx) = mpsc::channel();
        self.submit_to(0, direction, keys, chunks, tx)?;
        // The worker reports every job it takes, and a refused one is reported
        // at submission: a closed channel would mean the worker is gone.
        rx.recv()
            .map_err(|_| Error::Storage("the remote tier's worker stopped".into()))
    }

    fn submit(
        &self,
        id: u64,
        direction: Direction,
        hashes: Vec<BlockHash>,
        chunks: Vec<usize>,
    ) -> Result<()> {
        self.submit_to(id, direction, hashes, chunks, self.finished_tx.clone())
    }

    fn submit_to(
        &self,
        id: u64,
        direction: Direction,
        hashes: Vec<BlockHash>,
        chunks: Vec<usize>,
        finished: Sender<Finished>,
    ) -> Result<()> {
        if hashes.len() != chunks.len() {
            return Err(Error::InvalidArgument(format!(
                "{} keys for {} chunks",
                hashes.len(),
                chunks.len()
            )));
        }
        if let Some(&bad) = chunks.iter().find(|&&c| c >= self.region.chunks) {
            return Err(Error::InvalidArgument(format!(
                "chunk {bad} is outside the host region ({} chunks)",
                self.region.chunks
            )));
        }
        let total = hashes.len();
        self.in_flight.fetch_add(1, SeqCst);
        let job = Job::Chunks(ChunkJob {
            id,
            direction,
            hashes,
            chunks,
            region: Arc::clone(&self.region),
            finished: finished.clone(),
            in_flight: Arc::clone(&self.in_flight),
        });
        let tier = match (direction, &self.loads) {
            (Direction::Load, Some(loads)) => loads,
            _ => &self.remote,
        };
        if tier.jobs.try_send(job).is_err() {
            tier.counters.queue_full.fetch_add(1, Relaxed);
            self.in_flight.fetch_sub(1, SeqCst);
            let _ = finished.send(Finished {
                job: id,
                direction,
                done: 0,
                total,
                bytes: 0,
                seconds: 0.0,
            });
        }
        Ok(())
    }

    /// The jobs finished since the last call.
    pub fn take_finished(&self) -> Vec<Finished> {
        let rx = self.finished_rx.lock().unwrap_or_else(|e| e.into_inner());
        rx.try_iter().collect()
    }

    /// Jobs queued or running.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(SeqCst)
    }

    /// Waits up to `timeout` until no job is queued or running; returns
    /// whether none is. Jobs are never cut short, so once it returns true
    /// no job touches the region.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.in_flight() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// A snapshot of the remote tier's counters (with its lookup and load tiers').
    pub fn stats(&self) -> RemoteStats {
        let mut stats = self.remote.stats();
        for tier in self.lookups.iter().chain(&self.loads) {
            stats += tier.stats();
        }
        stats
    }
}

impl Worker {
    /// Runs a chunk job and reports it.
    pub(super) fn transfer(&mut self, job: ChunkJob) {
        let start = Instant::now();
        let (done, bytes) = match job.direction {
            Direction::Load => self.load_chunks(&job),
            Direction::Store => self.store_chunks(&job),
        };
        let _ = job.finished.send(Finished {
            job: job.id,
            direction: job.direction,
            done,
            total: job.hashes.len(),
            bytes,
            seconds: start.elapsed().as_secs_f64(),
        });
        job.in_flight.fetch_sub(1, SeqCst);
    }

    /// Copies the leading run of present, intact values into their chunks,
    /// one round trip at a time (never more than one trip's values held).
    fn load_chunks(&mut self, job: &ChunkJob) -> (usize, u64) {
        let per_trip = self.values_per_trip();
        let (mut done, mut bytes) = (0, 0);
        for (hashes, chunks) in job.hashes.chunks(per_trip).zip(job.chunks.chunks(per_trip)) {
            let values = self.get(hashes).unwrap_or_default();
            for (value, &chunk) in values.iter().zip(chunks) {
                let payload = &value[HEADER_LEN..];
                debug_assert_eq!(payload.len(), job.region.chunk_bytes);
                // SAFETY: the chunk is inside the region (checked at submission),
                // the region is valid while `job` holds it, and the engine leaves
                // the chunk alone until the job is finished (HostRegion::new).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        payload.as_ptr(),
                        job.region.chunk(chunk),
                        payload.len(),
                    )
                };
                bytes += value.len() as u64;
            }
            done += values.len();
            if values.len() < hashes.len() {
                break;
            }
        }
        self.counters
            .miss_blocks
            .fetch_add((job.hashes.len() - done) as u64, Relaxed);
        (done, bytes)
    }

    /// Writes the chunks the store lacks, one round trip of values at a
    /// time; done only if every trip succeeds (a failed trip leaves the
    /// earlier trips' values, each whole, in the store).
    fn store_chunks(&mut self, job: &ChunkJob) -> (usize, u64) {
        let keys: Vec<Vec<u8>> = job.hashes.iter().map(|&h| self.key(h)).collect();
        let present = match self.backend.exists(&keys) {
            Ok(present) if present.len() == keys.len() => present,
            _ => {
                self.counters.errors.fetch_add(1, Relaxed);
                return (0, 0);
            }
        };
        let absent: Vec<usize> = (0..keys.len()).filter(|&i| !present[i]).collect();
        let mut bytes = 0;
        for trip in absent.chunks(self.values_per_trip()) {
            let entries: Vec<(Vec<u8>, Vec<u8>)> = trip
                .iter()
                .map(|&i| {
                    let value = self.format.encode::<()>(job.hashes[i], |payload| {
                        // SAFETY: as in load_chunks; the engine does not write
                        // the chunk while the job is in flight.
                        let src = unsafe {
                            std::slice::from_raw_parts(
                                job.region.chunk(job.chunks[i]),
                                payload.len(),
                            )
                        };
                        payload.copy_from_slice(src);
                        Ok(())
                    });
                    (keys[i].clone(), value.expect("the fill cannot fail"))
                })
                .collect();
            let trip_bytes: u64 = entries.iter().map(|e| e.1.len() as u64).sum();
            if self.backend.put_if_absent(&entries).is_err() {
                self.counters.errors.fetch_add(1, Relaxed);
                return (0, bytes);
            }
            self.counters
                .put_blocks
                .fetch_add(entries.len() as u64, Relaxed);
            self.counters.put_bytes.fetch_add(trip_bytes, Relaxed);
            bytes += trip_bytes;
        }
        (job.hashes.len(), bytes)
    }
}
