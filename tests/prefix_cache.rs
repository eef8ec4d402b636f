//! `PrefixCache` over caller-owned block ids: one test per rule
//! (docs/semantics.md), then random operation sequences against a naive model.

use std::collections::{BTreeSet, HashMap};

use mla_cache::{
    CacheConfig, CacheEvent, Error, EvictionPolicyKind, ExtraKeys, Insertion, PrefixCache,
};
use proptest::prelude::*;

const BS: usize = 4;

fn cache_with(num_blocks: usize, f: impl FnOnce(&mut CacheConfig)) -> PrefixCache {
    let mut c = CacheConfig::new(num_blocks);
    c.block_size = BS;
    c.hash_seed = Some(42);
    f(&mut c);
    PrefixCache::new(c).unwrap()
}

fn cache(num_blocks: usize) -> PrefixCache {
    cache_with(num_blocks, |_| {})
}

fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

fn none() -> ExtraKeys {
    ExtraKeys::default()
}

fn ok(c: &PrefixCache) {
    c.check_invariants().unwrap();
}

#[test]
fn insert_indexes_full_blocks_and_reports_duplicates_to_free() {
    let c = cache(16);
    // Three full blocks and a partial tail: the tail's id is ignored.
    let first = c.insert(&toks(0..14), &none(), &[3, 5, 7, 9]).unwrap();
    assert_eq!(
        first,
        Insertion {
            num_cached_blocks: 0,
            duplicate_block_ids: vec![],
            block_ids: vec![3, 5, 7],
        }
    );
    assert_eq!(c.match_prefix(&toks(0..14), &none()).block_ids, [3, 5, 7]);
    assert_eq!(c.match_prefix(&toks(0..14), &none()).num_tokens, 12);
    // The same prefix in other ids, one block longer: two duplicates (the
    // caller's 5 is its own cached id, not a duplicate), one new block.
    let second = c.insert(&toks(0..16), &none(), &[1, 5, 2, 4]).unwrap();
    assert_eq!(
        second,
        Insertion {
            num_cached_blocks: 3,
            duplicate_block_ids: vec![1, 2],
            block_ids: vec![3, 5, 7, 4],
        }
    );
    assert_eq!(c.stats().cached_blocks, 4);
    assert_eq!((c.evictable_blocks(), c.protected_blocks()), (4, 0));
    // A diverging prompt shares the first block only.
    let m = c.match_prefix(&[0, 1, 2, 3, 9, 9, 9, 9], &none());
    assert_eq!(m.block_ids, [3]);
    // Keys separate prefixes.
    assert!(c
        .match_prefix(&toks(0..16), &ExtraKeys::salt("t"))
        .block_ids
        .is_empty());
    ok(&c);
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let c = cache_with(8, |c| c.enable_events = true);
    c.insert(&toks(0..8), &none(), &[0, 1]).unwrap();
    c.take_events();
    let before = c.stats();
    let refused = |r: mla_cache::Result<Insertion>| {
        let e = r.unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_) | Error::InvalidBlock(_)),
            "{e}"
        );
    };
    refused(c.insert(&toks(0..12), &none(), &[0, 1])); // too few ids
    refused(c.insert(&toks(100..112), &none(), &[2, 3, 2])); // an id twice
    refused(c.insert(&toks(100..108), &none(), &[2, 8])); // outside the cache
    refused(c.insert(&toks(100..108), &none(), &[2, 0])); // 0 holds another block
    refused(c.insert(&toks(100..108), &none(), &[1, 2])); // so does 1
    assert_eq!(c.lock(&[8]), Err(Error::InvalidBlock(8)));
    c.lock(&[0]).unwrap();
    assert!(c.unlock(&[0, 0]).is_err(), "one lock, two unlocks");
    assert!(c.unlock(&[1]).is_err(), "never locked");
    assert_eq!(c.reset(), Err(Error::BlocksInUse(1)));
    c.unlock(&[0]).unwrap();
    assert_eq!(c.stats(), before);
    assert!(c.take_events().is_empty());
    assert_eq!(c.match_prefix(&toks(0..8), &none()).block_ids, [0, 1]);
    assert!(PrefixCache::new(CacheConfig {
        enable_prefix_caching: false,
        ..CacheConfig::new(4)
    })
    .is_err());
    ok(&c);
}

#[test]
fn locked_blocks_are_never_evicted_and_the_counts_are_exact() {
    let c = cache(8);
    c.insert(&toks(0..12), &none(), &[0, 1, 2]).unwrap();
    c.insert(&toks(50..58), &none(), &[3, 4]).unwrap();
    let m = c.match_prefix(&toks(0..8), &none());
    c.lock(&m.block_ids).unwrap();
    c.lock(&m.block_ids).unwrap(); // locks nest
    assert_eq!((c.evictable_blocks(), c.protected_blocks()), (3, 2));
    let evicted: BTreeSet<_> = c.evict(10).into_iter().collect();
    assert_eq!(evicted, BTreeSet::from([2, 3, 4]));
    assert_eq!((c.evictable_blocks(), c.protected_blocks()), (0, 2));
    assert!(c.evict(1).is_empty());
    c.unlock(&m.block_ids).unwrap();
    assert_eq!((c.evictable_blocks(), c.protected_blocks()), (0, 2));
    c.unlock(&m.block_ids).unwrap();
    assert_eq!((c.evictable_blocks(), c.protected_blocks()), (2, 0));
    assert_eq!(c.evict(10), [1, 0], "the child before its parent");
    assert_eq!(c.stats().evictions, 5);
    ok(&c);
}

#[test]
fn a_lock_on_an_id_not_cached_yet_holds_once_it_is_inserted() {
    let c = cache(4);
    c.lock(&[2]).unwrap();
    c.insert(&toks(0..4), &none(), &[2]).unwrap();
    assert_eq!((c.evictable_blocks(), c.protected_blocks()), (0, 1));
    assert!(c.evict(1).is_empty());
    c.unlock(&[2]).unwrap();
    assert_eq!(c.evict(1), [2]);
    ok(&c);
}

#[test]
fn lru_evicts_children_before_parents_and_a_match_renews_a_path() {
    let c = cache(16);
    // r -> x, then r -> y: inserting y's path renews r.
    c.insert(&toks(0..8), &none(), &[0, 1]).unwrap();
    let mut other = toks(0..4);
    other.extend(100..104);
    c.insert(&other, &none(), &[5, 2]).unwrap();
    // An older chain, then renewed by a match: it goes last.
    c.insert(&toks(200..208), &none(), &[3, 4]).unwrap();
    c.match_prefix(&toks(0..8), &none());
    // Oldest first: y (below r, whose use renewed it), the chain 200..
    // (its second block first), then x before its parent r.
    assert_eq!(c.evict(16), [2, 4, 3, 1, 0]);
    ok(&c);
}

#[test]
fn every_policy_evicts_a_matched_chain_leaf_first() {
    for kind in EvictionPolicyKind::ALL {
        let c = cache_with(16, |c| c.eviction = kind);
        c.insert(&toks(0..12), &none(), &[0, 1, 2]).unwrap();
        // Matches count hits, which reclassify the blocks under every policy
        // but LRU; the chain must still leave from its leaf.
        for _ in 0..2 {
            assert_eq!(c.match_prefix(&toks(0..12), &none()).num_tokens, 12);
        }
        assert_eq!(c.evict(1), [2], "{kind}");
        assert_eq!(
            c.match_prefix(&toks(0..12), &none()).num_tokens,
            8,
            "{kind}"
        );
        assert_eq!(c.evict(2), [1, 0], "{kind}");
        ok(&c);
    }
}

#[test]
fn every_policy_keeps_pinned_and_locked_blocks_through_a_flood() {
    for kind in EvictionPolicyKind::ALL {
        let c = cache_with(16, |c| c.eviction = kind);
        c.insert(&toks(0..12), &none(), &[0, 1, 2]).unwrap();
        assert_eq!(c.pin(&toks(0..8), &none()), Ok(8), "{kind}");
        c.insert(&toks(100..108), &none(), &[3, 4]).unwrap();
        c.lock(&[3, 4]).unwrap();
        // One-off prompts, each evicting everything it may.
        let mut evicted = BTreeSet::new();
        for i in 0..20u32 {
            let ids: Vec<u32> = (5..16).collect();
            let prompt = toks(1000 * (i + 1)..1000 * (i + 1) + 44);
            c.insert(&prompt, &none(), &ids).unwrap();
            evicted.extend(c.evict(16));
            ok(&c);
        }
        assert!(evicted.contains(&2), "{kind}: the unpinned tail goes");
        assert!(
            evicted.iter().all(|&b| b >= 5 || b == 2),
            "{kind}: evicted {evicted:?}"
        );
        assert_eq!(
            c.match_prefix(&toks(0..12), &none()).num_tokens,
            8,
            "{kind}"
        );
        assert_eq!(
            c.match_prefix(&toks(100..112), &none()).num_tokens,
            8,
            "{kind}"
        );
    }
}

#[test]
fn pins_lock_a_prefix_within_the_budget_and_unpin_releases_them() {
    let c = cache_with(8, |c| c.pin_budget_blocks = Some(2));
    c.insert(&toks(0..12), &none(), &[0, 1, 2]).unwrap();
    assert!(matches!(
        c.pin(&toks(0..12), &none()),
        Err(Error::PinBudgetExceeded { .. })
    ));
    assert_eq!(c.pin(&toks(0..8), &none()), Ok(8));
    assert_eq!(c.stats().pinned_blocks, 2);
    assert_eq!((c.evictable_blocks(), c.protected_blocks()), (1, 2));
    assert!(c.unlock(&[0]).is_err(), "a pin is not a lock to release");
    assert_eq!(c.evict(8), [2]);
    assert_eq!(c.reset(), Err(Error::BlocksInUse(2)));
    assert_eq!(c.unpin(&toks(0..12), &none()), Ok(8));
    assert_eq!(c.unpin(&toks(0..12), &none()), Err(Error::NotPinned));
    assert_eq!(c.evictable_blocks(), 2);
    ok(&c);
}

#[test]
fn reset_hands_back_every_cached_id_and_events_carry_external_hashes() {
    let c = cache_with(8, |c| c.enable_events = true);
    let prompt = toks(7..19);
    c.insert(&prompt, &none(), &[4, 5, 6]).unwrap();
    let hashes = c.block_hashes(&prompt, &none());
    // The values the Rust, C and Python tests of the block manager assert.
    assert_eq!(
        hashes,
        [
            5_565_884_646_872_614_745,
            11_616_947_711_106_753_066,
            6_371_776_174_528_016_060
        ]
    );
    let mut ids = c.reset().unwrap();
    ids.sort_unstable();
    assert_eq!(ids, [4, 5, 6]);
    assert_eq!(c.stats().cached_blocks, 0);
    assert_eq!(
        c.take_events(),
        vec![
            CacheEvent::BlockStored {
                block_hashes: hashes,
                parent_block_hash: None,
                token_ids: prompt,
                block_size: BS,
                adapter: None,
            },
            CacheEvent::AllBlocksCleared,
        ]
    );
    ok(&c);
}

#[test]
fn stats_count_matches_and_evictions() {
    let c = cache(8);
    c.insert(&toks(0..8), &none(), &[0, 1]).unwrap();
    c.match_prefix(&toks(0..10), &none());
    c.match_prefix(&toks(50..60), &none());
    c.evict(1);
    let s = c.stats();
    assert_eq!((s.prefix_query_tokens, s.prefix_hit_tokens), (20, 8));
    assert_eq!((s.prefix_query_requests, s.prefix_hit_requests), (2, 1));
    assert_eq!((s.blocks_stored, s.evictions, s.cached_blocks), (2, 1, 1));
    assert_eq!((s.num_blocks, s.free_blocks, s.used_blocks), (8, 0, 0));
}

// ---- random sequences against a naive model ----

/// A prompt: a path of block symbols (each block is `BS` copies of its
/// symbol), optionally a partial tail.
#[derive(Debug, Clone)]
struct Prompt {
    symbols: Vec<u8>,
    tail: bool,
}

impl Prompt {
    fn tokens(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self
            .symbols
            .iter()
            .flat_map(|&s| [u32::from(s); BS])
            .collect();
        if self.tail {
            t.push(99);
        }
        t
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Insert a prompt in fresh ids, or in the cached ids of its match.
    Insert(Prompt, bool),
    Match(Prompt),
    /// Match a prompt and lock the path.
    Lock(Prompt),
    /// Unlock the n-th locked path.
    Unlock(usize),
    Evict(usize),
    Reset,
}

fn prompt() -> impl Strategy<Value = Prompt> {
    (prop::collection::vec(0..3u8, 1..5), any::<bool>())
        .prop_map(|(symbols, tail)| Prompt { symbols, tail })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prompt(), any::<bool>()).prop_map(|(p, r)| Op::Insert(p, r)),
        2 => prompt().prop_map(Op::Match),
        2 => prompt().prop_map(Op::Lock),
        2 => any::<usize>().prop_map(Op::Unlock),
        2 => (1..6usize).prop_map(Op::Evict),
        1 => Just(Op::Reset),
    ]
}

/// The naive model: cached paths (symbol prefixes) to ids, locks per id,
/// and the ids the caller holds free.
struct Model {
    cached: HashMap<Vec<u8>, u32>,
    locks: HashMap<u32, u32>,
    free: BTreeSet<u32>,
    locked_paths: Vec<Vec<u32>>,
}

impl Model {
    fn leading(&self, p: &Prompt) -> Vec<u32> {
        (1..=p.symbols.len())
            .map_while(|n| self.cached.get(&p.symbols[..n]).copied())
            .collect()
    }

    fn evictable(&self) -> usize {
        self.cached
            .values()
            .filter(|b| self.locks.get(b).copied().unwrap_or(0) == 0)
            .count()
    }

    fn take(&mut self, id: u32) -> Vec<u8> {
        let key = self
            .cached
            .iter()
            .find(|(_, &b)| b == id)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| panic!("block {id} handed back but not cached"));
        self.cached.remove(&key);
        assert!(self.free.insert(id), "block {id} handed back twice");
        key
    }
}

fn run(kind: EvictionPolicyKind, ops: Vec<Op>) {
    const N: u32 = 12;
    let c = cache_with(N as usize, |c| {
        c.block_size = BS;
        c.eviction = kind;
    });
    let mut m = Model {
        cached: HashMap::new(),
        locks: HashMap::new(),
        free: (0..N).collect(),
        locked_paths: Vec::new(),
    };
    for op in ops {
        match op {
            Op::Insert(p, reuse) => {
                let hit = if reuse { m.leading(&p) } else { Vec::new() };
                let blocks = p.symbols.len() + usize::from(p.tail);
                let fresh = blocks - hit.len();
                if fresh > m.free.len() {
                    continue;
                }
                let mut ids = hit.clone();
                for _ in 0..fresh {
                    ids.push(m.free.pop_first().unwrap());
                }
                let (mut dups, mut path, mut leading) = (Vec::new(), Vec::new(), true);
                let mut num_cached = 0;
                for n in 1..=p.symbols.len() {
                    let id = ids[n - 1];
                    match m.cached.get(&p.symbols[..n]) {
                        Some(&cached) => {
                            if cached != id {
                                dups.push(id);
                            }
                            num_cached += usize::from(leading);
                            path.push(cached);
                        }
                        None => {
                            leading = false;
                            m.cached.insert(p.symbols[..n].to_vec(), id);
                            path.push(id);
                        }
                    }
                }
                let got = c.insert(&p.tokens(), &none(), &ids).unwrap();
                assert_eq!(
                    got,
                    Insertion {
                        num_cached_blocks: num_cached,
                        duplicate_block_ids: dups.clone(),
                        block_ids: path.clone(),
                    }
                );
                // The caller frees its duplicates and the tail's id.
                m.free.extend(dups);
                if p.tail {
                    m.free.insert(ids[blocks - 1]);
                }
            }
            Op::Match(p) => {
                let got = c.match_prefix(&p.tokens(), &none());
                assert_eq!(got.block_ids, m.leading(&p));
                assert_eq!(got.num_tokens, got.block_ids.len() * BS);
            }
            Op::Lock(p) => {
                let path = c.match_prefix(&p.tokens(), &none()).block_ids;
                assert_eq!(path, m.leading(&p));
                c.lock(&path).unwrap();
                for &b in &path {
                    *m.locks.entry(b).or_default() += 1;
                }
                m.locked_paths.push(path);
            }
            Op::Unlock(i) => {
                if m.locked_paths.is_empty() {
                    continue;
                }
                let path = m.locked_paths.remove(i % m.locked_paths.len());
                c.unlock(&path).unwrap();
                for &b in &path {
                    *m.locks.get_mut(&b).unwrap() -= 1;
                }
            }
            Op::Evict(n) => {
                let expected = n.min(m.evictable());
                let got = c.evict(n);
                assert_eq!(got.len(), expected);
                for &b in &got {
                    assert_eq!(
                        m.locks.get(&b).copied().unwrap_or(0),
                        0,
                        "evicted a locked block"
                    );
                    m.take(b);
                }
                if kind == EvictionPolicyKind::Lru {
                    for key in m.cached.keys() {
                        let parent = &key[..key.len() - 1];
                        assert!(
                            parent.is_empty() || m.cached.contains_key(parent),
                            "{key:?} cached after its parent was evicted"
                        );
                    }
                }
            }
            Op::Reset => {
                if m.locks.values().all(|&n| n == 0) {
                    let ids = c.reset().unwrap();
                    assert_eq!(ids.len(), m.cached.len());
                    for b in ids {
                        m.take(b);
                    }
                } else {
                    assert!(matches!(c.reset(), Err(Error::BlocksInUse(_))));
                }
            }
        }
        let locked = m
            .cached
            .values()
            .filter(|b| m.locks.get(b).copied().unwrap_or(0) > 0)
            .count();
        assert_eq!(c.evictable_blocks(), m.evictable());
        assert_eq!(c.protected_blocks(), locked);
        assert_eq!(c.stats().cached_blocks as usize, m.cached.len());
        c.check_invariants().unwrap();
    }
    // Nothing leaks: with every lock released, eviction hands back every
    // cached id, and the caller holds all ids again.
    for path in std::mem::take(&mut m.locked_paths) {
        c.unlock(&path).unwrap();
    }
    for b in c.evict(usize::MAX) {
        m.take(b);
    }
    assert!(m.cached.is_empty());
    assert_eq!(m.free, (0..N).collect());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_operations_agree_with_the_model(
        kind in prop::sample::select(EvictionPolicyKind::ALL.to_vec()),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(kind, ops);
    }
}
