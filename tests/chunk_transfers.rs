//! The remote tier moving chunks of an engine's host region (the calls
//! behind the vLLM secondary tier and the SGLang storage backend): round
//! trips between two regions, partial and refused loads, a full queue, a
//! failing backend, and refused arguments; queued (polled) and waited jobs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mla_cache::tier::remote::{
    chunk_key, BlockFormat, ChunkTransfers, Direction, Encoding, Finished, HostRegion,
    RemoteBackend, RemoteError, SimRemote,
};
use mla_cache::tier::{RemoteOptions, RemoteTier};
use mla_cache::{BlockHash, Dtype};

const LAYERS: u32 = 3;
const TOKENS: u32 = 4;
const CHUNK: usize = (LAYERS * TOKENS) as usize * 1152;
const STRIDE: usize = CHUNK + 64; // rows padded, as vLLM aligns its CPU tier's rows
const CHUNKS: usize = 8;

fn format() -> BlockFormat {
    BlockFormat {
        encoding: Encoding::Stored(Dtype::Bf16),
        num_layers: LAYERS,
        block_size: TOKENS,
        bytes_per_token: 1152,
        indexer_bytes_per_token: 0,
        payload_len: CHUNK as u64,
    }
}

/// A host region the test owns, and transfers over it.
struct Host {
    // Declared first, so dropped before the memory it points into.
    transfers: ChunkTransfers,
    memory: Box<[u8]>,
}

fn host(backend: Box<dyn RemoteBackend>, options: RemoteOptions) -> Host {
    let mut memory = vec![0u8; CHUNKS * STRIDE].into_boxed_slice();
    // SAFETY: the boxed memory outlives `transfers` (dropped first, by the
    // order of `Host`'s fields; moving the box does not move its bytes), and
    // the test reads a chunk only after its job has finished.
    let region =
        unsafe { HostRegion::new(memory.as_mut_ptr(), memory.len(), STRIDE, CHUNK) }.unwrap();
    let remote = RemoteTier::new(backend, format(), options).unwrap();
    let transfers = ChunkTransfers::new(remote, region).unwrap();
    Host { transfers, memory }
}

impl Drop for Host {
    fn drop(&mut self) {
        assert!(self.transfers.wait_idle(Duration::from_secs(10)));
    }
}

impl Host {
    fn chunk(&self, i: usize) -> &[u8] {
        &self.memory[i * STRIDE..i * STRIDE + CHUNK]
    }
    fn fill(&mut self, i: usize, seed: u8) {
        for (j, b) in self.memory[i * STRIDE..i * STRIDE + CHUNK]
            .iter_mut()
            .enumerate()
        {
            *b = seed.wrapping_add((j % 251) as u8);
        }
    }
    fn finish(&self) -> Vec<Finished> {
        assert!(self.transfers.wait_idle(Duration::from_secs(10)));
        self.transfers.take_finished()
    }
}

fn keys(names: &[&str]) -> Vec<BlockHash> {
    names.iter().map(|n| chunk_key(n.as_bytes())).collect()
}

fn options(namespace: &str) -> RemoteOptions {
    RemoteOptions {
        namespace: namespace.into(),
        ..RemoteOptions::default()
    }
}

#[test]
fn chunks_stored_by_one_region_load_byte_for_byte_into_another() {
    let shared = SimRemote::new(100);
    let mut a = host(Box::new(shared.clone()), options("m"));
    let b = host(Box::new(shared.clone()), options("m"));
    for i in 0..3 {
        a.fill(i, 10 + i as u8);
    }
    a.transfers
        .submit_store(7, keys(&["k0", "k1", "k2"]), vec![0, 1, 2])
        .unwrap();
    let stored = a.finish();
    assert_eq!(stored.len(), 1);
    assert_eq!((stored[0].job, stored[0].direction), (7, Direction::Store));
    assert!(stored[0].success());
    assert_eq!(shared.len(), 3);

    assert_eq!(
        b.transfers.probe(&keys(&["k0", "k1", "nope", "k2"])),
        Some(vec![true, true, false, true])
    );
    b.transfers
        .submit_load(9, keys(&["k2", "k0", "k1"]), vec![5, 6, 7])
        .unwrap();
    let loaded = b.finish();
    assert_eq!((loaded[0].job, loaded[0].done, loaded[0].total), (9, 3, 3));
    assert_eq!(b.chunk(5), a.chunk(2));
    assert_eq!(b.chunk(6), a.chunk(0));
    assert_eq!(b.chunk(7), a.chunk(1));
    assert!(loaded[0].bytes >= 3 * CHUNK as u64);

    // Storing what the store has writes nothing again.
    let puts = a.transfers.stats().put_blocks;
    a.transfers
        .submit_store(8, keys(&["k0", "k1"]), vec![0, 1])
        .unwrap();
    assert!(a.finish()[0].success());
    assert_eq!(a.transfers.stats().put_blocks, puts);
}

#[test]
fn a_load_stops_at_the_first_missing_or_foreign_chunk_and_leaves_the_rest() {
    let shared = SimRemote::new(100);
    let mut a = host(Box::new(shared.clone()), options("m"));
    let mut other = host(Box::new(shared.clone()), options("another model"));
    a.fill(0, 1);
    a.fill(1, 2);
    other.fill(0, 3);
    a.transfers
        .submit_store(1, keys(&["x", "y"]), vec![0, 1])
        .unwrap();
    other
        .transfers
        .submit_store(2, keys(&["z"]), vec![0])
        .unwrap();
    a.finish();
    other.finish();

    let b = host(Box::new(shared.clone()), options("m"));
    b.transfers
        .submit_load(3, keys(&["x", "gone", "y"]), vec![0, 1, 2])
        .unwrap();
    let f = b.finish()[0];
    assert_eq!((f.done, f.total), (1, 3));
    assert!(!f.success());
    assert_eq!(b.chunk(0), a.chunk(0));
    assert!(b.chunk(1).iter().all(|&x| x == 0) && b.chunk(2).iter().all(|&x| x == 0));

    // Another namespace's chunk is never found here.
    assert_eq!(b.transfers.probe(&keys(&["z"])), Some(vec![false]));
    b.transfers.submit_load(4, keys(&["z"]), vec![3]).unwrap();
    assert_eq!(b.finish()[0].done, 0);
    assert!(b.chunk(3).iter().all(|&x| x == 0));
}

/// A store whose values can be damaged in place, to check that loads verify.
#[derive(Clone, Default)]
struct Damaging {
    inner: Arc<Mutex<std::collections::HashMap<Vec<u8>, Vec<u8>>>>,
}

impl RemoteBackend for Damaging {
    fn get(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        let inner = self.inner.lock().unwrap();
        Ok(keys.iter().map(|k| inner.get(k).cloned()).collect())
    }
    fn exists(&mut self, keys: &[Vec<u8>]) -> Result<Vec<bool>, RemoteError> {
        let inner = self.inner.lock().unwrap();
        Ok(keys.iter().map(|k| inner.contains_key(k)).collect())
    }
    fn put_if_absent(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), RemoteError> {
        let mut inner = self.inner.lock().unwrap();
        for (k, v) in entries {
            inner.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Ok(())
    }
}

#[test]
fn a_damaged_value_is_rejected_and_never_copied() {
    let backend = Damaging::default();
    let mut a = host(Box::new(backend.clone()), options("m"));
    a.fill(0, 1);
    a.fill(1, 2);
    a.transfers
        .submit_store(1, keys(&["p", "q"]), vec![0, 1])
        .unwrap();
    assert!(a.finish()[0].success());
    for value in backend.inner.lock().unwrap().values_mut() {
        let last = value.len() - 1;
        value[last] ^= 1;
    }
    let b = host(Box::new(backend.clone()), options("m"));
    b.transfers
        .submit_load(2, keys(&["p", "q"]), vec![0, 1])
        .unwrap();
    assert_eq!(b.finish()[0].done, 0);
    assert!(b.chunk(0).iter().all(|&x| x == 0));
    assert_eq!(b.transfers.stats().rejected, 1);
}

/// A backend that fails every call while `down`, and blocks while `slow`.
#[derive(Clone)]
struct Faulty {
    store: SimRemote,
    down: Arc<AtomicBool>,
    slow: Arc<AtomicBool>,
}

impl Faulty {
    fn new() -> Self {
        Self {
            store: SimRemote::new(10),
            down: Arc::default(),
            slow: Arc::default(),
        }
    }
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut SimRemote) -> Result<T, RemoteError>,
    ) -> Result<T, RemoteError> {
        while self.slow.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(RemoteError("down".into()));
        }
        f(&mut self.store)
    }
}

impl RemoteBackend for Faulty {
    fn get(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        self.call(|s| s.get(keys))
    }
    fn exists(&mut self, keys: &[Vec<u8>]) -> Result<Vec<bool>, RemoteError> {
        self.call(|s| s.exists(keys))
    }
    fn put_if_absent(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), RemoteError> {
        self.call(|s| s.put_if_absent(entries))
    }
}

#[test]
fn a_failing_server_fails_jobs_and_counts_errors() {
    let backend = Faulty::new();
    let mut a = host(Box::new(backend.clone()), options("m"));
    a.fill(0, 1);
    backend.down.store(true, Ordering::SeqCst);
    a.transfers.submit_store(1, keys(&["a"]), vec![0]).unwrap();
    a.transfers.submit_load(2, keys(&["a"]), vec![1]).unwrap();
    let done = a.finish();
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|f| f.done == 0));
    assert_eq!(a.transfers.probe(&keys(&["a"])), None);
    assert_eq!(a.transfers.stats().errors, 3);
    backend.down.store(false, Ordering::SeqCst);
    a.transfers.submit_store(3, keys(&["a"]), vec![0]).unwrap();
    assert!(a.finish()[0].success());
}

#[test]
fn a_full_queue_finishes_jobs_at_once_and_a_slow_server_costs_only_the_budget() {
    let backend = Faulty::new();
    let opts = RemoteOptions {
        queue_depth: 2,
        lookup_budget: Duration::from_millis(20),
        ..options("m")
    };
    let a = host(Box::new(backend.clone()), opts);
    backend.slow.store(true, Ordering::SeqCst);
    // The worker takes the first job and blocks; two more fill the queue.
    for job in 0..6 {
        a.transfers.submit_load(job, keys(&["a"]), vec![0]).unwrap();
    }
    let started = std::time::Instant::now();
    assert_eq!(a.transfers.probe(&keys(&["a"])), None);
    assert!(started.elapsed() < Duration::from_secs(1));
    let refused = a.transfers.take_finished();
    assert!(refused.len() >= 3, "{refused:?}");
    assert!(refused
        .iter()
        .all(|f| f.done == 0 && f.direction == Direction::Load));
    assert!(a.transfers.stats().queue_full >= 3);
    backend.slow.store(false, Ordering::SeqCst);
    let rest = a.finish();
    assert_eq!(refused.len() + rest.len(), 6);
}

#[test]
fn bad_arguments_are_refused_and_queue_nothing() {
    let a = host(Box::new(SimRemote::new(10)), options("m"));
    assert!(a
        .transfers
        .submit_load(1, keys(&["a", "b"]), vec![0])
        .is_err());
    assert!(a
        .transfers
        .submit_store(2, keys(&["a"]), vec![CHUNKS])
        .is_err());
    assert_eq!(a.transfers.in_flight(), 0);
    assert!(a.transfers.take_finished().is_empty());

    let mut memory = vec![0u8; 100];
    // SAFETY: the region is dropped before `memory`.
    let region = unsafe { HostRegion::new(memory.as_mut_ptr(), 100, 10, 10) }.unwrap();
    let remote = RemoteTier::new(Box::new(SimRemote::new(1)), format(), options("m")).unwrap();
    assert!(
        ChunkTransfers::new(remote, region).is_err(),
        "chunk size must match the format"
    );
    assert!(unsafe { HostRegion::new(memory.as_mut_ptr(), 100, 10, 11) }.is_err());
}

#[test]
fn an_engine_chunk_must_be_whole_mla_latents() {
    let f = BlockFormat::mla_chunk(Encoding::Stored(Dtype::Bf16), LAYERS, TOKENS, CHUNK).unwrap();
    assert_eq!(f, format());
    let fp8 =
        BlockFormat::mla_chunk(Encoding::Stored(Dtype::Fp8DsMla), 61, 64, 61 * 64 * 656).unwrap();
    assert_eq!(fp8.bytes_per_token, 656);
    let err = BlockFormat::mla_chunk(Encoding::Stored(Dtype::Bf16), LAYERS, TOKENS, CHUNK + 2)
        .unwrap_err();
    assert!(err.to_string().contains("1152 bytes a token"), "{err}");
    assert!(BlockFormat::mla_chunk(Encoding::Stored(Dtype::Bf16), 0, TOKENS, 0).is_err());
}

#[test]
fn a_waited_job_reports_itself_only_and_leaves_queued_jobs_to_the_poller() {
    let shared = SimRemote::new(100);
    let mut a = host(Box::new(shared.clone()), options("m"));
    let b = host(Box::new(shared.clone()), options("m"));
    a.fill(0, 3);
    a.fill(1, 4);
    a.transfers.submit_store(5, keys(&["q"]), vec![1]).unwrap();
    let stored = a.transfers.store(keys(&["w"]), vec![0]).unwrap();
    assert_eq!(
        (stored.direction, stored.done, stored.total),
        (Direction::Store, 1, 1)
    );
    // The queued job is reported to the poller, never to the waiting call.
    let polled = a.finish();
    assert_eq!(polled.len(), 1);
    assert_eq!((polled[0].job, polled[0].done), (5, 1));

    let loaded = b
        .transfers
        .load(keys(&["w", "q", "absent", "q"]), vec![4, 5, 6, 7])
        .unwrap();
    assert_eq!(
        (loaded.direction, loaded.done, loaded.total),
        (Direction::Load, 2, 4)
    );
    assert_eq!(b.chunk(4), a.chunk(0));
    assert_eq!(b.chunk(5), a.chunk(1));
    assert!(b.chunk(6).iter().chain(b.chunk(7)).all(|&x| x == 0));
    assert!(b.transfers.take_finished().is_empty());
    assert!(b.transfers.wait_idle(Duration::from_secs(10)));
    assert!(b.transfers.load(keys(&["w"]), vec![CHUNKS]).is_err());
}

#[test]
fn a_waited_job_on_a_full_queue_or_a_failing_server_returns_with_nothing_done() {
    let backend = Faulty::new();
    let opts = RemoteOptions {
        queue_depth: 1,
        ..options("m")
    };
    let mut a = host(Box::new(backend.clone()), opts);
    a.fill(0, 9);
    backend.slow.store(true, Ordering::SeqCst);
    // One job runs (blocked), one fills the queue: the waited job is refused.
    a.transfers.submit_load(1, keys(&["x"]), vec![1]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    a.transfers.submit_load(2, keys(&["x"]), vec![2]).unwrap();
    let started = std::time::Instant::now();
    let refused = a.transfers.store(keys(&["x"]), vec![0]).unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!((refused.done, refused.total), (0, 1));
    backend.slow.store(false, Ordering::SeqCst);
    assert_eq!(a.finish().len(), 2);
    backend.down.store(true, Ordering::SeqCst);
    assert_eq!(a.transfers.store(keys(&["x"]), vec![0]).unwrap().done, 0);
    assert_eq!(a.transfers.load(keys(&["x"]), vec![1]).unwrap().done, 0);
    backend.down.store(false, Ordering::SeqCst);
    assert!(a.transfers.store(keys(&["x"]), vec![0]).unwrap().success());
    assert_eq!(a.transfers.load(keys(&["x"]), vec![1]).unwrap().done, 1);
    assert_eq!(a.chunk(1), a.chunk(0));
}

#[test]
fn probes_on_their_own_connection_answer_while_a_transfer_blocks_the_other() {
    let backend = Faulty::new();
    let opts = RemoteOptions {
        lookup_budget: Duration::from_millis(200),
        ..options("m")
    };
    let mut memory = vec![0u8; CHUNKS * STRIDE].into_boxed_slice();
    // SAFETY: as in `host`; `transfers` is dropped before `memory`.
    let region =
        unsafe { HostRegion::new(memory.as_mut_ptr(), memory.len(), STRIDE, CHUNK) }.unwrap();
    let remote = RemoteTier::new(Box::new(backend.clone()), format(), opts.clone()).unwrap();
    let lookups = RemoteTier::new(Box::new(backend.store.clone()), format(), opts.clone()).unwrap();
    let transfers = ChunkTransfers::new(remote, region)
        .unwrap()
        .with_lookups(lookups)
        .unwrap();
    transfers.submit_store(1, keys(&["a"]), vec![0]).unwrap();
    assert!(transfers.wait_idle(Duration::from_secs(10)));
    backend.slow.store(true, Ordering::SeqCst);
    transfers.submit_load(2, keys(&["a"]), vec![1]).unwrap();
    // The transfer worker is blocked; the probe still answers.
    assert_eq!(transfers.probe(&keys(&["a", "b"])), Some(vec![true, false]));
    backend.slow.store(false, Ordering::SeqCst);
    assert!(transfers.wait_idle(Duration::from_secs(10)));
    let stats = transfers.stats();
    assert_eq!((stats.lookups, stats.timeouts, stats.put_blocks), (1, 0, 1));
    drop(transfers);
    drop(memory);

    let other = RemoteTier::new(Box::new(SimRemote::new(1)), format(), options("other")).unwrap();
    let mut memory = vec![0u8; CHUNKS * STRIDE].into_boxed_slice();
    // SAFETY: as above.
    let region =
        unsafe { HostRegion::new(memory.as_mut_ptr(), memory.len(), STRIDE, CHUNK) }.unwrap();
    let remote = RemoteTier::new(Box::new(SimRemote::new(1)), format(), options("m")).unwrap();
    let refused = ChunkTransfers::new(remote, region)
        .unwrap()
        .with_lookups(other);
    assert!(
        refused.is_err(),
        "a lookup tier of another namespace is refused"
    );
    drop(memory);
}

#[test]
fn a_load_runs_beside_a_blocked_store_on_its_own_connection() {
    let backend = Faulty::new();
    let mut a = host(Box::new(backend.store.clone()), options("m"));
    a.fill(0, 5);
    a.transfers.submit_store(1, keys(&["k"]), vec![0]).unwrap();
    assert!(a.finish()[0].success());

    let mut memory = vec![0u8; CHUNKS * STRIDE].into_boxed_slice();
    // SAFETY: as in `host`; `transfers` is dropped before `memory`.
    let region =
        unsafe { HostRegion::new(memory.as_mut_ptr(), memory.len(), STRIDE, CHUNK) }.unwrap();
    let stores = RemoteTier::new(Box::new(backend.clone()), format(), options("m")).unwrap();
    let loads = RemoteTier::new(Box::new(backend.store.clone()), format(), options("m")).unwrap();
    let transfers = ChunkTransfers::new(stores, region)
        .unwrap()
        .with_loads(loads)
        .unwrap();
    backend.slow.store(true, Ordering::SeqCst);
    transfers
        .submit_store(2, keys(&["other"]), vec![1])
        .unwrap();
    // The store's worker is blocked; the load goes through.
    let loaded = transfers.load(keys(&["k"]), vec![2]).unwrap();
    assert_eq!(loaded.done, 1);
    assert_eq!(
        &memory[2 * STRIDE..2 * STRIDE + CHUNK],
        a.chunk(0),
        "the loaded chunk"
    );
    backend.slow.store(false, Ordering::SeqCst);
    assert!(transfers.wait_idle(Duration::from_secs(10)));
    drop(transfers);
}

#[test]
fn jobs_of_values_larger_than_a_round_trip_move_one_trip_at_a_time() {
    // Chunks of about 3 MiB: one value per round trip.
    let layers = (3 << 20) / (TOKENS * 1152);
    let big = (layers * TOKENS * 1152) as usize;
    let format = BlockFormat::mla_chunk(Encoding::Stored(Dtype::Bf16), layers, TOKENS, big)
        .expect("whole latents");
    let shared = SimRemote::new(100);
    let mut regions = [
        vec![0u8; 4 * big].into_boxed_slice(),
        vec![0u8; 4 * big].into_boxed_slice(),
    ];
    for (i, b) in regions[0].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let [writer, reader] = regions.each_mut().map(|memory| {
        // SAFETY: the regions outlive the transfers (dropped at the end of
        // the test, before `regions`).
        let region =
            unsafe { HostRegion::new(memory.as_mut_ptr(), memory.len(), big, big) }.unwrap();
        let tier = RemoteTier::new(Box::new(shared.clone()), format, options("m")).unwrap();
        ChunkTransfers::new(tier, region).unwrap()
    });
    assert!(writer
        .store(keys(&["a", "b", "c"]), vec![0, 1, 2])
        .unwrap()
        .success());
    assert_eq!(shared.len(), 3);
    // A miss in the third trip: the first two load, the rest stay untouched.
    let loaded = reader
        .load(keys(&["c", "a", "x", "b"]), vec![0, 1, 2, 3])
        .unwrap();
    assert_eq!((loaded.done, loaded.total), (2, 4));
    assert_eq!(reader.stats().miss_blocks, 2);
    drop((writer, reader));
    assert_eq!(regions[1][..big], regions[0][2 * big..3 * big]);
    assert_eq!(regions[1][big..2 * big], regions[0][..big]);
    assert!(regions[1][2 * big..].iter().all(|&b| b == 0));
}
