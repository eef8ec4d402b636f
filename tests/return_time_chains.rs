//! `return_time` through the block manager: a chain's turns are counted on
//! the chain, however its blocks are committed (chunk by chunk) and
//! whatever other requests run meanwhile.

use mla_cache::{AdmitOptions, BlockManager, CacheConfig, EvictionPolicyKind, ExtraKeys};

const BS: usize = 4;

/// Turn `turn` (1, 2, ...) of the conversation starting at token `first`:
/// two blocks more than the turn before.
fn prompt(first: u32, turn: u32) -> Vec<u32> {
    (first..first + 2 * BS as u32 * turn).collect()
}

/// A 32-block `return_time` manager, and the options of a chunked admission.
fn manager() -> (BlockManager, AdmitOptions) {
    let mut config = CacheConfig::new(32);
    config.block_size = BS;
    config.hash_seed = Some(7);
    config.eviction = EvictionPolicyKind::ReturnTime;
    let chunked = AdmitOptions {
        chunked_prefill: true,
        ..AdmitOptions::default()
    };
    (BlockManager::new(config).unwrap(), chunked)
}

fn cached_tokens(m: &BlockManager, tokens: &[u32]) -> usize {
    m.match_prefix(tokens, &ExtraKeys::default()).num_tokens
}

#[test]
fn turns_are_counted_per_chain_with_chunked_commits_of_interleaved_requests() {
    let (m, chunked) = manager();
    // Admitted turns are committed one block at a time, past what was cached.
    let commit_in_chunks = |ids: &[(u64, usize)]| {
        let longest = ids.iter().map(|&(_, len)| len).max().unwrap_or(0);
        for done in (BS..=longest).step_by(BS) {
            for &(id, len) in ids {
                if done <= len && done > m.num_computed_tokens(id).unwrap() {
                    m.commit(id, done).unwrap();
                }
            }
        }
    };
    let (a, b) = (0, 1000);
    // Conversation A's first two turns, then B's first.
    for (id, tokens) in [(1, prompt(a, 1)), (2, prompt(a, 2)), (3, prompt(b, 1))] {
        m.admit(id, &tokens, &chunked).unwrap();
        commit_in_chunks(&[(id, tokens.len())]);
        m.free(id).unwrap();
    }
    // A's third turn and B's second run together, their chunks interleaved.
    let (a3, b2) = (prompt(a, 3), prompt(b, 2));
    m.admit(4, &a3, &chunked).unwrap();
    m.admit(5, &b2, &chunked).unwrap();
    commit_in_chunks(&[(4, a3.len()), (5, b2.len())]);
    m.free(5).unwrap();
    m.free(4).unwrap();
    assert_eq!((cached_tokens(&m, &a3), cached_tokens(&m, &b2)), (24, 16));
    // A's chain was extended twice, B's once: A's path goes first, deepest
    // block first, though B's was released earlier (LRU would take B's).
    assert_eq!(m.evict(2), 2);
    assert_eq!((cached_tokens(&m, &a3), cached_tokens(&m, &b2)), (16, 16));
    assert_eq!(m.evict(4), 4);
    assert_eq!((cached_tokens(&m, &a3), cached_tokens(&m, &b2)), (0, 16));
    assert_eq!(m.evict(2), 2);
    assert_eq!((cached_tokens(&m, &a3), cached_tokens(&m, &b2)), (0, 8));
    m.check_invariants().unwrap();
}

#[test]
fn a_tip_hit_while_its_request_still_prefills_is_no_previous_turn() {
    let (m, chunked) = manager();
    // A one-off prompt of two blocks, cold, released first.
    let other: Vec<u32> = (5000..5000 + 2 * BS as u32).collect();
    m.admit(1, &other, &chunked).unwrap();
    m.commit(1, other.len()).unwrap();
    m.free(1).unwrap();
    // A cold prompt of four blocks, committed one block at a time; after
    // its first block another request matches that block (its whole
    // prompt: one block and two tokens) and leaves.
    let long: Vec<u32> = (0..4 * BS as u32).collect();
    m.admit(2, &long, &chunked).unwrap();
    m.commit(2, BS).unwrap();
    let peek: Vec<u32> = (0..BS as u32 + 2).collect();
    let hit = m.admit(3, &peek, &AdmitOptions::default()).unwrap();
    assert_eq!(hit.num_cached_tokens, BS);
    m.free(3).unwrap();
    for done in (2 * BS..=long.len()).step_by(BS) {
        m.commit(2, done).unwrap();
    }
    m.free(2).unwrap();
    // Request 2's own later commits are no extension of a previous turn:
    // both prompts are cold with no turn, and the older one goes first
    // (counted as a turn, request 2's blocks would).
    assert_eq!(m.evict(1), 1);
    assert_eq!(
        (cached_tokens(&m, &other), cached_tokens(&m, &long)),
        (BS, 16)
    );
    m.check_invariants().unwrap();
}
