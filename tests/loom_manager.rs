//! loom models of the manager's races, each explored once per eviction
//! policy. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_manager`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use mla_cache::{AdmitOptions, BlockManager, CacheConfig, Error, EvictionPolicyKind, ExtraKeys};

fn manager(blocks: usize, kind: EvictionPolicyKind) -> Arc<BlockManager> {
    let mut c = CacheConfig::new(blocks);
    c.eviction = kind;
    c.block_size = 2;
    c.hash_seed = Some(1);
    Arc::new(BlockManager::new(c).unwrap())
}

/// Explores `f` with every eviction policy.
fn model(f: impl Fn(EvictionPolicyKind) + Sync + Send + Copy + 'static) {
    for kind in EvictionPolicyKind::ALL {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(4);
        b.check(move || f(kind));
    }
}

/// Thread A frees a cached block (ref 1 -> 0, into the LRU queue), thread B
/// hits its hash and revives it, thread C's allocation needs to evict.
#[test]
fn free_revive_evict() {
    model(|kind| {
        let m = manager(3, kind);
        m.admit(1, &[0, 1, 2], &AdmitOptions::default()).unwrap(); // 1 full cached block + 1 partial
        let (a, b, c) = (m.clone(), m.clone(), m.clone());
        let ta = thread::spawn(move || a.free(1).unwrap());
        let tb = thread::spawn(move || b.admit(2, &[0, 1, 2], &AdmitOptions::default()));
        // Needs two blocks: fits only once request 1 is freed.
        let tc = thread::spawn(move || c.admit(3, &[7, 7, 7], &AdmitOptions::default()).is_ok());
        ta.join().unwrap();
        let hit = tb.join().unwrap();
        let c_admitted = tc.join().unwrap();
        match hit {
            // The cached block was shared or revived, never evicted under B.
            Ok(a) => assert_eq!(a.num_cached_tokens, 2),
            // B only loses the race to C, which then holds the two unhashed blocks.
            Err(Error::OutOfBlocks { .. }) => assert!(c_admitted),
            Err(e) => panic!("unexpected {e}"),
        }
        m.check_invariants().unwrap();
        let s = m.stats();
        assert_eq!(s.free_blocks + s.used_blocks, 3);
        let _ = m.free(2);
        let _ = m.free(3);
        assert_eq!(m.num_free_blocks(), 3);
        assert_eq!(s.evictions, 0);
        m.check_invariants().unwrap();
    });
}

/// Admissions and frees race with lock-free prefix lookups.
#[test]
fn concurrent_admit_free_and_match() {
    model(|kind| {
        let m = manager(4, kind);
        m.admit(1, &[5, 6, 7], &AdmitOptions::default()).unwrap();
        let (a, b) = (m.clone(), m.clone());
        let ta = thread::spawn(move || {
            a.admit(2, &[5, 6, 8], &AdmitOptions::default()).unwrap();
            a.free(2).unwrap();
        });
        let tb = thread::spawn(move || {
            b.free(1).unwrap();
            let found = b.match_prefix(&[5, 6, 7], &ExtraKeys::default());
            assert!(found.num_tokens == 2 || found.num_tokens == 0);
        });
        ta.join().unwrap();
        tb.join().unwrap();
        m.check_invariants().unwrap();
        assert_eq!(m.num_free_blocks(), 4);
        // The shared block [5, 6] is still cached: nothing needed to evict it.
        assert_eq!(m.match_prefix(&[5, 6], &ExtraKeys::default()).num_tokens, 2);
    });
}

/// A fork and an append race over a shared partial tail: exactly one copy.
#[test]
fn fork_and_append_copy_on_write() {
    model(|kind| {
        let m = manager(4, kind);
        m.admit(1, &[1, 2, 3], &AdmitOptions::default()).unwrap();
        let (a, b) = (m.clone(), m.clone());
        let ta = thread::spawn(move || a.fork(1, 2).unwrap());
        let tb = thread::spawn(move || a_append(&b));
        ta.join().unwrap();
        tb.join().unwrap();
        m.check_invariants().unwrap();
        let parent = m.block_table(1).unwrap();
        let child = m.block_table(2).unwrap();
        assert_eq!(parent[0], child[0]);
        let copies = m.stats().cow_copies;
        // Fork before append: the parent copied its tail. After: it shared a full block.
        assert!(copies <= 1);
        assert_eq!(copies == 1, parent[1] != child[1]);
    });
}

fn a_append(m: &BlockManager) {
    m.append(1, &[4]).unwrap();
}
