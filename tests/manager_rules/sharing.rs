//! Sharing, eviction order and admission.

use super::{manager, manager_with, ok, toks, BS};
use mla_cache::{AdmitOptions, BlockCopy, BlockManager, CacheConfig, CacheEvent, Error, ExtraKeys};

#[test]
fn admission_holds_exactly_the_blocks_it_needs() {
    let m = manager(10);
    let a = m
        .admit(1, &toks(0..9), &AdmitOptions::decode_slots(4))
        .unwrap();
    assert_eq!(a.block_ids.len(), 4); // ceil(13 / 4)
    assert_eq!(m.num_free_blocks(), 6);
    ok(&m);
}

#[test]
fn a_hit_reuses_blocks_and_is_capped_at_len_minus_one() {
    let m = manager(10);
    let p = toks(0..8); // exactly two full blocks
    let a = m.admit(1, &p, &AdmitOptions::default()).unwrap();
    let b = m.admit(2, &p, &AdmitOptions::default()).unwrap();
    // The last token is recomputed: only the first block is reused.
    assert_eq!(b.num_cached_tokens, 4);
    assert_eq!(b.block_ids[0], a.block_ids[0]);
    assert_ne!(b.block_ids[1], a.block_ids[1]);
    // Without the cap, both blocks hit.
    let m = manager_with(10, |c| c.cap_hit_at_last_token = false);
    m.admit(1, &p, &AdmitOptions::default()).unwrap();
    assert_eq!(
        m.admit(2, &p, &AdmitOptions::default())
            .unwrap()
            .num_cached_tokens,
        8
    );
    let s = m.stats();
    assert_eq!((s.prefix_query_tokens, s.prefix_hit_tokens), (16, 8));
    assert_eq!((s.prefix_query_requests, s.prefix_hit_requests), (2, 1));
    ok(&m);
}

#[test]
fn unhashed_blocks_are_reused_before_cached_ones() {
    let m = manager(4);
    // Request 1 caches two full blocks; its partial third block is unhashed.
    let a = m.admit(1, &toks(0..10), &AdmitOptions::default()).unwrap();
    m.free(1).unwrap();
    // One never-used block and the partial one are unhashed; a 2-block request
    // must take those and leave the cached blocks alone.
    let b = m
        .admit(2, &toks(100..108), &AdmitOptions::default())
        .unwrap();
    assert!(!b.block_ids.contains(&a.block_ids[0]));
    assert!(!b.block_ids.contains(&a.block_ids[1]));
    assert_eq!(
        m.match_prefix(&toks(0..10), &ExtraKeys::default())
            .num_tokens,
        8
    );
    assert_eq!(m.stats().evictions, 0);
    ok(&m);
}

#[test]
fn eviction_is_tail_first_and_least_recently_freed_first() {
    let m = manager(6);
    let a = m.admit(1, &toks(0..12), &AdmitOptions::default()).unwrap(); // 3 full blocks
    let b = m
        .admit(2, &toks(100..112), &AdmitOptions::default())
        .unwrap();
    m.free(1).unwrap(); // freed first: its chain is older
    m.free(2).unwrap();
    // Each new block must evict: the order is a's tail, a's middle, a's root, then b's tail.
    let mut order = Vec::new();
    for (i, id) in (10..14).enumerate() {
        let got = m
            .admit(
                id,
                &toks(1000 + 10 * i as u32..1001 + 10 * i as u32),
                &AdmitOptions::default(),
            )
            .unwrap();
        order.push(got.block_ids[0]);
    }
    assert_eq!(
        order,
        vec![
            a.block_ids[2],
            a.block_ids[1],
            a.block_ids[0],
            b.block_ids[2]
        ]
    );
    assert_eq!(m.stats().evictions, 4);
    // b's root is still cached: its first two blocks hit (cap leaves 8 of 12).
    let again = m.match_prefix(&toks(100..112), &ExtraKeys::default());
    assert_eq!(again.block_ids, b.block_ids[..2].to_vec());
    ok(&m);
}

#[test]
fn a_hit_revives_a_cached_free_block() {
    let m = manager(3);
    let a = m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
    m.free(1).unwrap();
    assert_eq!(m.num_free_blocks(), 3);
    let b = m.admit(2, &toks(0..9), &AdmitOptions::default()).unwrap();
    assert_eq!(b.num_cached_tokens, 8);
    assert_eq!(b.block_ids[..2], a.block_ids[..2]);
    assert_eq!(m.num_free_blocks(), 0);
    assert_eq!(m.stats().evictions, 0);
    ok(&m);
}

#[test]
fn hits_on_free_blocks_count_against_free_blocks() {
    let m = manager(4);
    m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
    m.free(1).unwrap();
    m.admit(3, &toks(50..51), &AdmitOptions::default()).unwrap();
    // 3 free blocks, 2 of them the cached hits: reviving them leaves 1 for
    // the 2 fresh blocks needed. Refused, and nothing changes.
    let err = m
        .admit(2, &toks(0..9), &AdmitOptions::decode_slots(7))
        .unwrap_err();
    assert_eq!(
        err,
        Error::OutOfBlocks {
            needed: 2,
            available: 1
        }
    );
    assert_eq!(m.num_free_blocks(), 3);
    assert_eq!(m.stats().prefix_query_requests, 2);
    ok(&m);
}

#[test]
fn blocks_filled_during_decode_become_shareable() {
    let m = manager(8);
    m.admit(1, &toks(0..3), &AdmitOptions::decode_slots(5))
        .unwrap();
    assert_eq!(
        m.match_prefix(&toks(0..8), &ExtraKeys::default())
            .num_tokens,
        0
    );
    let out = m.append(1, &[3]).unwrap();
    assert!(out.new_block_ids.is_empty() && out.copies.is_empty());
    assert_eq!(
        m.match_prefix(&toks(0..8), &ExtraKeys::default())
            .num_tokens,
        4
    );
    m.append(1, &[4, 5, 6, 7]).unwrap();
    assert_eq!(
        m.match_prefix(&toks(0..8), &ExtraKeys::default())
            .num_tokens,
        8
    );
    // Reserved room is used before new blocks are taken.
    assert_eq!(m.block_table(1).unwrap().len(), 2);
    let out = m.append(1, &[8]).unwrap();
    assert_eq!(out.new_block_ids.len(), 1);
    ok(&m);
}

#[test]
fn no_two_blocks_share_a_hash_in_the_index() {
    let m = manager(2);
    // Two requests compute the same prompt at once: neither hits the other.
    m.admit(1, &toks(0..3), &AdmitOptions::decode_slots(1))
        .unwrap();
    m.admit(2, &toks(0..3), &AdmitOptions::decode_slots(1))
        .unwrap();
    m.append(1, &[3]).unwrap();
    m.append(2, &[3]).unwrap(); // same full block: a duplicate, left unhashed
    assert_eq!(m.stats().cached_blocks, 1);
    let dup = m.block_table(2).unwrap()[0];
    m.free(1).unwrap();
    m.free(2).unwrap();
    // The duplicate is freed as unhashed and reused before the cached block.
    let next = m.admit(3, &toks(50..51), &AdmitOptions::default()).unwrap();
    assert_eq!(next.block_ids[0], dup);
    ok(&m);
}

#[test]
fn fork_shares_blocks_and_copies_a_shared_partial_tail_on_write() {
    let m = manager(8);
    m.admit(1, &toks(0..6), &AdmitOptions::default()).unwrap(); // 1 full + 1 partial
    m.fork(1, 2).unwrap();
    let parent = m.block_table(1).unwrap();
    assert_eq!(m.block_table(2).unwrap(), parent);
    assert_eq!(m.num_free_blocks(), 6);
    let out = m.append(2, &[100]).unwrap();
    assert_eq!(out.copies.len(), 1);
    let BlockCopy { src, dst, .. } = out.copies[0];
    assert_eq!(src, parent[1]);
    let child = m.block_table(2).unwrap();
    assert_eq!(child, vec![parent[0], dst]);
    // The parent now holds its tail alone: it writes in place.
    let out = m.append(1, &[200]).unwrap();
    assert!(out.copies.is_empty());
    assert_eq!(m.stats().cow_copies, 1);
    // Full blocks stay shared; different continuations hash differently.
    m.append(1, &[201]).unwrap();
    m.append(2, &[101]).unwrap();
    assert_eq!(m.stats().cached_blocks, 3);
    ok(&m);
    m.free(1).unwrap();
    m.free(2).unwrap();
    assert_eq!(m.num_free_blocks(), 8);
    ok(&m);
}

#[test]
fn fork_of_a_block_aligned_request_needs_no_copy() {
    let m = manager(8);
    m.admit(1, &toks(0..8), &AdmitOptions::decode_slots(4))
        .unwrap();
    m.fork(1, 2).unwrap();
    assert_eq!(
        m.block_table(2).unwrap().len(),
        2,
        "reserved room is not shared"
    );
    let out = m.append(2, &[9]).unwrap();
    assert!(out.copies.is_empty());
    assert_eq!(out.new_block_ids.len(), 1);
    ok(&m);
}

#[test]
fn reset_is_refused_while_blocks_are_in_use() {
    let m = manager_with(4, |c| c.enable_events = true);
    m.admit(1, &toks(0..5), &AdmitOptions::default()).unwrap();
    assert_eq!(m.reset_prefix_cache(), Err(Error::BlocksInUse(2)));
    m.free(1).unwrap();
    m.reset_prefix_cache().unwrap();
    assert_eq!(m.stats().cached_blocks, 0);
    assert_eq!(
        m.match_prefix(&toks(0..5), &ExtraKeys::default())
            .num_tokens,
        0
    );
    assert_eq!(m.take_events().last(), Some(&CacheEvent::AllBlocksCleared));
    ok(&m);
}

#[test]
fn salts_and_adapters_isolate_tenants() {
    let m = manager(16);
    let p = toks(0..9);
    let salted = |s: &str| AdmitOptions {
        keys: ExtraKeys::salt(s),
        ..AdmitOptions::default()
    };
    m.admit(1, &p, &salted("a")).unwrap();
    assert_eq!(m.admit(2, &p, &salted("b")).unwrap().num_cached_tokens, 0);
    assert_eq!(
        m.admit(3, &p, &AdmitOptions::default())
            .unwrap()
            .num_cached_tokens,
        0
    );
    assert_eq!(m.admit(4, &p, &salted("a")).unwrap().num_cached_tokens, 8);
    let lora = AdmitOptions {
        keys: ExtraKeys::adapter("x"),
        ..AdmitOptions::default()
    };
    assert_eq!(m.admit(5, &p, &lora).unwrap().num_cached_tokens, 0);
    assert_eq!(m.match_prefix(&p, &ExtraKeys::salt("b")).num_tokens, 8);
    ok(&m);
}

#[test]
fn chunked_prefill_serves_only_committed_blocks() {
    let m = manager(8);
    let p = toks(0..12);
    let chunked = AdmitOptions {
        chunked_prefill: true,
        ..AdmitOptions::default()
    };
    m.admit(1, &p, &chunked).unwrap();
    assert_eq!(m.match_prefix(&p, &ExtraKeys::default()).num_tokens, 0);
    m.commit(1, 6).unwrap();
    assert_eq!(m.match_prefix(&p, &ExtraKeys::default()).num_tokens, 4);
    assert!(matches!(m.commit(1, 5), Err(Error::InvalidArgument(_))));
    assert!(matches!(m.commit(1, 13), Err(Error::InvalidArgument(_))));
    // Appends do not commit in chunked mode either.
    m.commit(1, 12).unwrap();
    m.append(1, &[12, 13, 14, 15]).unwrap();
    assert_eq!(
        m.match_prefix(&toks(0..16), &ExtraKeys::default())
            .num_tokens,
        12
    );
    m.commit(1, 16).unwrap();
    assert_eq!(
        m.match_prefix(&toks(0..16), &ExtraKeys::default())
            .num_tokens,
        16
    );
    ok(&m);
}

#[test]
fn pinned_prefixes_survive_eviction_within_a_budget() {
    let m = manager_with(4, |c| c.pin_budget_blocks = Some(2));
    let system = toks(0..8);
    m.admit(1, &system, &AdmitOptions::default()).unwrap();
    m.free(1).unwrap();
    assert_eq!(m.pin(&system, &ExtraKeys::default()).unwrap(), 8);
    assert_eq!(m.stats().pinned_blocks, 2);
    // Only two blocks are left for everyone else; the pinned ones are never taken.
    assert!(matches!(
        m.admit(2, &toks(100..109), &AdmitOptions::default()),
        Err(Error::OutOfBlocks { .. })
    ));
    m.admit(2, &toks(100..108), &AdmitOptions::default())
        .unwrap();
    m.free(2).unwrap();
    m.admit(3, &toks(200..208), &AdmitOptions::default())
        .unwrap();
    assert_eq!(m.match_prefix(&system, &ExtraKeys::default()).num_tokens, 8);
    m.free(3).unwrap();
    // A pinned prefix still serves hits.
    assert_eq!(
        m.admit(4, &toks(0..9), &AdmitOptions::default())
            .unwrap()
            .num_cached_tokens,
        8
    );
    m.free(4).unwrap();
    // The budget is enforced; unpinning releases.
    m.admit(5, &toks(300..305), &AdmitOptions::default())
        .unwrap();
    m.free(5).unwrap();
    let err = m.pin(&toks(300..305), &ExtraKeys::default()).unwrap_err();
    assert!(matches!(
        err,
        Error::PinBudgetExceeded {
            pinned: 2,
            requested: 1,
            budget: 2
        }
    ));
    assert_eq!(m.unpin(&system, &ExtraKeys::default()).unwrap(), 8);
    assert_eq!(
        m.unpin(&system, &ExtraKeys::default()),
        Err(Error::NotPinned)
    );
    assert_eq!(m.stats().pinned_blocks, 0);
    assert_eq!(m.num_free_blocks(), 4);
    ok(&m);
}

#[test]
fn token_verification_rejects_nothing_legitimate() {
    let m = manager_with(8, |c| c.verify_tokens = true);
    m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
    assert_eq!(
        m.admit(2, &toks(0..9), &AdmitOptions::default())
            .unwrap()
            .num_cached_tokens,
        8
    );
    ok(&m);
}

#[test]
fn slot_mapping_follows_the_block_table() {
    let m = manager(8);
    let a = m
        .admit(7, &toks(0..5), &AdmitOptions::decode_slots(2))
        .unwrap();
    let slots = m.slot_mapping(7, 2..7).unwrap();
    let bs = BS as i64;
    let want: Vec<i64> = (2..7)
        .map(|p| a.block_ids[p / BS] as i64 * bs + (p % BS) as i64)
        .collect();
    assert_eq!(slots, want);
    assert!(matches!(
        m.slot_mapping(7, 0..9),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(m.slot_mapping(8, 0..1), Err(Error::UnknownRequest(8)));
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let m = manager(4);
    assert!(matches!(
        m.admit(1, &[], &AdmitOptions::default()),
        Err(Error::EmptyInput(_))
    ));
    assert_eq!(
        m.admit(1, &toks(0..17), &AdmitOptions::default()),
        Err(Error::RequestTooLarge {
            needed: 5,
            total: 4
        })
    );
    assert!(matches!(
        m.admit(1, &toks(0..1), &AdmitOptions::decode_slots(usize::MAX)),
        Err(Error::InvalidArgument(_))
    ));
    m.admit(1, &toks(0..2), &AdmitOptions::default()).unwrap();
    assert_eq!(
        m.admit(1, &toks(0..2), &AdmitOptions::default()),
        Err(Error::DuplicateRequest(1))
    );
    assert_eq!(m.append(2, &[1]), Err(Error::UnknownRequest(2)));
    assert!(matches!(m.append(1, &[]), Err(Error::EmptyInput(_))));
    assert_eq!(m.fork(1, 1), Err(Error::DuplicateRequest(1)));
    assert_eq!(m.fork(3, 4), Err(Error::UnknownRequest(3)));
    assert_eq!(m.free(9), Err(Error::UnknownRequest(9)));
    assert_eq!(m.stats().num_requests, 1);
    assert_eq!(m.num_free_blocks(), 3);
    ok(&m);
    let bad = CacheConfig {
        block_size: 0,
        ..CacheConfig::new(4)
    };
    assert!(BlockManager::new(bad)
        .unwrap_err()
        .to_string()
        .contains("block_size"));
}

#[test]
fn events_mirror_the_index() {
    let m = manager_with(3, |c| c.enable_events = true);
    m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
    let ev = m.take_events();
    let CacheEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        adapter,
    } = &ev[0]
    else {
        panic!("expected BlockStored, got {ev:?}");
    };
    assert_eq!(
        (
            block_hashes.len(),
            *parent_block_hash,
            token_ids.clone(),
            *block_size,
            adapter
        ),
        (2, None, toks(0..8), BS, &None)
    );
    m.free(1).unwrap();
    m.admit(2, &toks(50..62), &AdmitOptions::default()).unwrap(); // evicts both cached blocks
    let ev = m.take_events();
    let removed: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            CacheEvent::BlockRemoved { block_hashes } => Some(block_hashes[0]),
            _ => None,
        })
        .collect();
    assert_eq!(
        removed,
        vec![block_hashes[1], block_hashes[0]],
        "tail first"
    );
    assert!(m.take_events().is_empty());
}

#[test]
fn prefix_caching_off_shares_nothing() {
    let m = manager_with(8, |c| c.enable_prefix_caching = false);
    m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
    assert_eq!(
        m.admit(2, &toks(0..9), &AdmitOptions::default())
            .unwrap()
            .num_cached_tokens,
        0
    );
    assert_eq!(m.stats().cached_blocks, 0);
    ok(&m);
}
