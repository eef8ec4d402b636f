//! The caller's controls: dropping blocks, eviction on request, reserve,
//! pins, and the hashes events and lower tiers see.

use super::{manager, manager_with, ok, toks, BS};
use mla_cache::{
    AdmitOptions, BlockCopy, BlockManager, CacheEvent, Error, EvictionPolicyKind, ExtraKeys,
};

fn removed_hashes(m: &BlockManager) -> Vec<u64> {
    m.take_events()
        .into_iter()
        .filter_map(|e| match e {
            CacheEvent::BlockRemoved { block_hashes } => Some(block_hashes),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn evict_blocks_moves_a_free_cached_block_to_the_unhashed_list() {
    for kind in EvictionPolicyKind::ALL {
        let m = manager_with(4, |c| {
            c.enable_events = true;
            c.eviction = kind;
        });
        let a = m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
        m.free(1).unwrap();
        let stored = m.block_hashes(&toks(0..8), &ExtraKeys::default());
        m.take_events();
        assert_eq!(m.stats().evictable_blocks, 2);
        // Drop the root: the chain is unreachable from its start.
        assert_eq!(m.evict_blocks(&[a.block_ids[0]]).unwrap(), 1, "{kind}");
        assert_eq!(removed_hashes(&m), vec![stored[0]]);
        assert_eq!(
            m.match_prefix(&toks(0..9), &ExtraKeys::default())
                .num_tokens,
            0
        );
        let s = m.stats();
        assert_eq!(
            (s.cached_blocks, s.evictable_blocks, s.free_blocks),
            (1, 1, 4)
        );
        assert_eq!(s.evictions, 0, "dropping is not evicting to make room");
        ok(&m);
        // Unhashed blocks are reused first: the never-used block 3, then a's
        // partial tail (freed first, tail first), then the dropped root; the
        // cached second block is evicted last.
        let b = m
            .admit(2, &toks(100..113), &AdmitOptions::default())
            .unwrap();
        assert_eq!(
            b.block_ids,
            vec![3, a.block_ids[2], a.block_ids[0], a.block_ids[1]],
            "{kind}"
        );
        assert_eq!(m.stats().evictions, 1);
        ok(&m);
    }
}

#[test]
fn evict_blocks_leaves_a_block_in_use_with_its_holders_unshared() {
    let m = manager_with(8, |c| c.enable_events = true);
    let a = m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
    m.take_events();
    // Skipped: a partial block, an id twice; counted once.
    assert_eq!(
        m.evict_blocks(&[a.block_ids[1], a.block_ids[2], a.block_ids[1]])
            .unwrap(),
        1
    );
    assert_eq!(removed_hashes(&m).len(), 1);
    assert_eq!(m.block_table(1).unwrap(), a.block_ids);
    assert_eq!(m.stats().cached_blocks, 1);
    // No longer shared: another request with the prompt hits only the first block.
    let b = m.admit(2, &toks(0..9), &AdmitOptions::default()).unwrap();
    assert_eq!(b.num_cached_tokens, 4);
    assert_ne!(b.block_ids[1], a.block_ids[1]);
    // b cached its own copy of the second block; a keeps decoding on its own.
    assert_eq!(
        m.match_prefix(&toks(0..9), &ExtraKeys::default()).block_ids,
        b.block_ids[..2]
    );
    m.append(1, &[9, 10, 11]).unwrap();
    ok(&m);
    // Freed, the dropped block joins the unhashed list (after the three
    // never used) and is reused before any cached block.
    m.free(1).unwrap();
    let s = m.stats();
    assert_eq!((s.free_blocks, s.evictable_blocks), (5, 1));
    let c = m
        .admit(3, &toks(500..516), &AdmitOptions::default())
        .unwrap();
    assert_eq!(c.block_ids, vec![5, 6, 7, a.block_ids[1]]);
    assert_eq!(m.stats().evictions, 0);
    ok(&m);
}

#[test]
fn evict_blocks_refuses_bad_ids_and_pinned_blocks_changing_nothing() {
    let m = manager_with(4, |c| c.enable_events = true);
    let a = m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap();
    m.free(1).unwrap();
    m.take_events();
    assert_eq!(
        m.evict_blocks(&[a.block_ids[0], 4]),
        Err(Error::InvalidBlock(4))
    );
    assert_eq!(
        m.evict_blocks(&[u32::MAX]),
        Err(Error::InvalidBlock(u32::MAX))
    );
    assert_eq!(m.pin(&toks(0..4), &ExtraKeys::default()).unwrap(), 4);
    // A pinned block stays: its pin is released by prefix, through the index.
    assert!(matches!(
        m.evict_blocks(&[a.block_ids[1], a.block_ids[0]]),
        Err(Error::InvalidArgument(msg)) if msg.contains("pinned")
    ));
    assert_eq!(m.stats().cached_blocks, 2);
    assert!(m.take_events().is_empty());
    assert_eq!(m.evict_blocks(&[]).unwrap(), 0);
    ok(&m);
    m.unpin(&toks(0..4), &ExtraKeys::default()).unwrap();
    assert_eq!(
        m.evict_blocks(&[a.block_ids[1], a.block_ids[0]]).unwrap(),
        2
    );
    assert_eq!(m.evict_blocks(&a.block_ids).unwrap(), 0);
    let s = m.stats();
    assert_eq!(
        (s.cached_blocks, s.evictable_blocks, s.free_blocks),
        (0, 0, 4)
    );
    ok(&m);
}

#[test]
fn a_dropped_block_can_be_cached_again() {
    for kind in EvictionPolicyKind::ALL {
        let m = manager_with(1, |c| c.eviction = kind);
        m.admit(1, &toks(0..4), &AdmitOptions::default()).unwrap();
        assert_eq!(m.evict_blocks(&[0]).unwrap(), 1);
        m.free(1).unwrap();
        assert_eq!(m.stats().evictable_blocks, 0);
        // The same prompt again: computed anew in the same block, which the
        // policy sees stored afresh.
        let b = m.admit(2, &toks(0..4), &AdmitOptions::default()).unwrap();
        assert_eq!((b.num_cached_tokens, b.block_ids[0]), (0, 0));
        m.free(2).unwrap();
        assert_eq!(
            m.match_prefix(&toks(0..4), &ExtraKeys::default()).block_ids,
            [0],
            "{kind}"
        );
        assert_eq!(m.stats().evictable_blocks, 1);
        ok(&m);
    }
}

#[test]
fn evict_takes_the_policys_victims_ahead_of_allocation() {
    let m = manager_with(6, |c| c.enable_events = true);
    m.set_eviction_log(true);
    let a = m.admit(1, &toks(0..12), &AdmitOptions::default()).unwrap(); // 3 full blocks
    m.free(1).unwrap();
    let hashes = m.block_hashes(&toks(0..12), &ExtraKeys::default());
    m.take_events();
    assert_eq!(m.stats().evictable_blocks, 3);
    // Tail first, as allocation would; counted, logged and announced.
    assert_eq!(m.evict(2), 2);
    assert_eq!(
        m.take_evicted(),
        vec![(hashes[2], a.block_ids[2]), (hashes[1], a.block_ids[1])]
    );
    assert_eq!(removed_hashes(&m), vec![hashes[2], hashes[1]]);
    let s = m.stats();
    assert_eq!((s.evictions, s.evictable_blocks, s.free_blocks), (2, 1, 6));
    assert_eq!(
        m.match_prefix(&toks(0..12), &ExtraKeys::default())
            .num_tokens,
        4
    );
    ok(&m);
    assert_eq!(m.evict(5), 1, "only what is cached and free");
    assert_eq!(m.evict(1), 0);
    assert_eq!(m.stats().cached_blocks, 0);
    ok(&m);
}

#[test]
fn reserve_grows_the_table_without_tokens_all_or_nothing() {
    let m = manager(6);
    let a = m.admit(1, &toks(0..5), &AdmitOptions::default()).unwrap();
    // Room for 5 + 6 lookahead slots: 3 blocks.
    let out = m.reserve(1, 11).unwrap();
    assert_eq!(out.new_block_ids.len(), 1);
    assert!(out.copies.is_empty());
    let table = m.block_table(1).unwrap();
    assert_eq!(
        table,
        [a.block_ids.clone(), out.new_block_ids.clone()].concat()
    );
    assert_eq!(m.num_tokens(1).unwrap(), 5);
    assert_eq!(m.slot_mapping(1, 5..12).unwrap().len(), 7);
    // Never shrinks; the room already there adds nothing.
    assert!(m.reserve(1, 12).unwrap().new_block_ids.is_empty());
    assert!(m.reserve(1, 0).unwrap().new_block_ids.is_empty());
    assert_eq!(m.block_table(1).unwrap(), table);
    // All or nothing.
    m.admit(9, &[900], &AdmitOptions::default()).unwrap();
    assert_eq!(
        m.reserve(1, 25),
        Err(Error::RequestTooLarge {
            needed: 7,
            total: 6
        })
    );
    assert_eq!(
        m.reserve(1, 24),
        Err(Error::OutOfBlocks {
            needed: 3,
            available: 2
        })
    );
    assert_eq!(m.reserve(2, 4), Err(Error::UnknownRequest(2)));
    assert_eq!(m.block_table(1).unwrap(), table);
    ok(&m);
    // Appends fill the reserved room before taking blocks.
    assert!(m.append(1, &toks(5..12)).unwrap().new_block_ids.is_empty());
    assert_eq!(m.append(1, &[12]).unwrap().new_block_ids.len(), 1);
    ok(&m);
    m.free(1).unwrap();
    m.free(9).unwrap();
    assert_eq!(m.num_free_blocks(), 6);
    ok(&m);
}

#[test]
fn fork_shares_no_reserved_room_and_reserve_copies_a_shared_tail() {
    let m = manager(8);
    m.admit(1, &toks(0..6), &AdmitOptions::default()).unwrap();
    m.reserve(1, 12).unwrap(); // blocks 0, 1 (partial tail), 2
    let parent = m.block_table(1).unwrap();
    m.fork(1, 2).unwrap();
    assert_eq!(m.block_table(2).unwrap(), parent[..2]);
    ok(&m);
    // The child's lookahead slots start inside the shared tail: it is copied
    // first, so drafts written there never reach the parent.
    let out = m.reserve(2, 10).unwrap();
    assert_eq!(out.copies.len(), 1);
    let BlockCopy { src, dst, .. } = out.copies[0];
    assert_eq!(src, parent[1]);
    assert_eq!(out.new_block_ids.len(), 1);
    assert_eq!(
        m.block_table(2).unwrap(),
        vec![parent[0], dst, out.new_block_ids[0]]
    );
    assert_eq!(m.stats().cow_copies, 1);
    // Both now own their tails: appends copy nothing.
    assert!(m.append(1, &[6]).unwrap().copies.is_empty());
    assert!(m.append(2, &[7]).unwrap().copies.is_empty());
    ok(&m);
    // Reserving no room past the tokens copies nothing, even when shared.
    m.fork(1, 3).unwrap();
    assert_eq!(m.reserve(3, 7), Ok(Default::default()));
    // Room already there, but the tail is shared: copied.
    let out = m.reserve(1, 8).unwrap();
    assert_eq!((out.copies.len(), out.new_block_ids.len()), (1, 0));
    ok(&m);
    for id in 1..=3 {
        m.free(id).unwrap();
    }
    assert_eq!(m.num_free_blocks(), 8);
    ok(&m);
}

#[test]
fn unpin_releases_exactly_what_its_pin_took() {
    let m = manager(8);
    let p = toks(0..12); // three full blocks once computed
    m.admit(1, &p[..5], &AdmitOptions::default()).unwrap(); // caches block 0 only
    m.free(1).unwrap();
    // Pinned while only its first block is cached.
    assert_eq!(m.pin(&p[..8], &ExtraKeys::default()).unwrap(), 4);
    m.admit(2, &toks(0..13), &AdmitOptions::default()).unwrap(); // caches blocks 1 and 2
    m.free(2).unwrap();
    // A longer prefix pinned over the same first block.
    assert_eq!(m.pin(&p, &ExtraKeys::default()).unwrap(), 12);
    assert_eq!(m.stats().pinned_blocks, 3);
    // Unpinning the short prefix releases its one block, not the long pin's.
    assert_eq!(m.unpin(&p[..8], &ExtraKeys::default()).unwrap(), 4);
    assert_eq!(m.stats().pinned_blocks, 3);
    ok(&m);
    assert_eq!(m.unpin(&p, &ExtraKeys::default()).unwrap(), 12);
    assert_eq!(m.stats().pinned_blocks, 0);
    assert_eq!(m.unpin(&p, &ExtraKeys::default()), Err(Error::NotPinned));
    assert_eq!(m.num_free_blocks(), 8);
    ok(&m);
}

#[test]
fn blocks_dropped_in_use_are_not_offered_to_lower_tiers() {
    let m = manager(4);
    let a = m.admit(1, &toks(0..13), &AdmitOptions::default()).unwrap(); // 3 full blocks
    assert_eq!(m.computed_blocks(1, 0).unwrap().len(), 3);
    assert_eq!(m.evict_blocks(&[a.block_ids[1]]).unwrap(), 1);
    // Only the run before the dropped block may be copied anywhere.
    let offered: Vec<_> = m
        .computed_blocks(1, 0)
        .unwrap()
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert_eq!(offered, vec![a.block_ids[0]]);
    m.free(1).unwrap();
    ok(&m);
    // Reallocated (the cache has 4 blocks: all are reused), the block is an
    // ordinary block again.
    let b = m
        .admit(2, &toks(100..113), &AdmitOptions::default())
        .unwrap();
    assert!(b.block_ids.contains(&a.block_ids[1]));
    assert_eq!(m.computed_blocks(2, 0).unwrap().len(), 3);
    ok(&m);
}

/// External hashes of `7..19` (three blocks of 4) under seed 42; the C and
/// Python tests assert the same values, so every surface derives them alike.
const EXTERNAL_7_TO_19: [u64; 3] = [
    5_565_884_646_872_614_745,
    11_616_947_711_106_753_066,
    6_371_776_174_528_016_060,
];

#[test]
fn events_and_block_hashes_show_the_same_external_hashes() {
    let m = manager_with(8, |c| c.enable_events = true);
    let prompt = toks(7..19);
    let chain = m.chain_hashes(&prompt, &ExtraKeys::default());
    let external = m.block_hashes(&prompt, &ExtraKeys::default());
    assert_eq!(
        external,
        chain.iter().map(|h| h.external()).collect::<Vec<_>>()
    );
    assert!(chain.iter().all(|h| h.external() == h.0 as u64));
    assert_eq!(external, EXTERNAL_7_TO_19);
    let a = m.admit(1, &toks(7..20), &AdmitOptions::default()).unwrap();
    let ev = m.take_events();
    assert_eq!(
        ev,
        vec![CacheEvent::BlockStored {
            block_hashes: external.clone(),
            parent_block_hash: None,
            token_ids: prompt.clone(),
            block_size: BS,
            adapter: None,
        }]
    );
    let pairs: Vec<_> = external.iter().copied().zip(a.block_ids.clone()).collect();
    assert_eq!(m.computed_blocks(1, 0).unwrap(), pairs);
    m.append(1, &toks(20..23)).unwrap();
    let CacheEvent::BlockStored {
        parent_block_hash, ..
    } = &m.take_events()[0]
    else {
        panic!("a fourth block is stored");
    };
    assert_eq!(*parent_block_hash, Some(external[2]));
    m.set_eviction_log(true);
    m.free(1).unwrap();
    m.admit(2, &toks(100..132), &AdmitOptions::default())
        .unwrap(); // evicts all four
    let evicted = m.take_evicted();
    assert_eq!(evicted.len(), 4);
    assert_eq!(
        evicted.iter().map(|&(h, _)| h).collect::<Vec<_>>(),
        removed_hashes(&m),
        "the log and the events name blocks alike"
    );
    assert!(pairs.iter().all(|p| evicted.contains(p)));
}
