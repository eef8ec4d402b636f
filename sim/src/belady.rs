//! The offline optimum of the cache-only model (Belady's MIN with bypass):
//! how many hits a policy that knew the future could get.
//!
//! Assumptions, exactly: the model of [`super::cache_model`] (requests one at
//! a time in arrival order; a cache of `num_blocks` full blocks kept between
//! requests; a request's hit is the leading run of its cached full blocks,
//! capped at `len - 1` tokens). After each request the bound chooses which
//! blocks to keep, among those cached and those the request just computed,
//! freely: it may drop any block, keep a new one or not (bypass), and is
//! never forced to keep a block of the running request. It keeps the blocks
//! whose next *hittable* use (a later request whose capped prefix contains
//! them) comes soonest, dropping the latest first (on ties, the deeper block
//! first) and never keeping a block with no hittable use ahead.
//!
//! Why this is an upper bound for every policy of the model: with unit-size
//! blocks, keeping the soonest-needed ones maximizes the number of block hits
//! (Belady's exchange argument, which also covers the free reloads a request
//! offers for blocks it recomputes). Every request that hits a block also
//! contains its parent, earlier, so a parent is never needed later than its
//! child; with deeper-first ties the kept set is closed under parents, so
//! each counted block hit lies in its request's leading run. A real policy
//! decides without the future, and the manager also holds running requests'
//! blocks, so it can only do worse. It is not a bound for the event-driven
//! simulation, whose concurrency changes what is cached when.

use std::collections::BinaryHeap;

use super::cache_model::CacheModelReport;
use super::keys::BlockKeys;

const NEVER: u32 = u32::MAX;

/// The offline optimum's hit rate for a cache of `num_blocks` blocks.
pub fn belady(keys: &BlockKeys, num_blocks: usize) -> CacheModelReport {
    let requests = keys.requests();
    // next[r][i]: the next request after r whose capped prefix holds block i of r.
    let mut upcoming = vec![NEVER; keys.num_keys()];
    let mut next: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
    for (t, r) in requests.iter().enumerate().rev() {
        next[t] = r.keys.iter().map(|&k| upcoming[k as usize]).collect();
        for &k in &r.keys[..keys.hit_limit(r)] {
            upcoming[k as usize] = t as u32;
        }
    }

    // Kept blocks by (next use, depth): the largest goes first. Entries whose
    // next use has moved on are stale and skipped.
    let mut kept_next = vec![NEVER; keys.num_keys()];
    let mut kept = vec![false; keys.num_keys()];
    let mut heap: BinaryHeap<(u32, u32, u32)> = BinaryHeap::new();
    let mut len = 0usize;
    let mut hit_blocks = Vec::with_capacity(requests.len());
    for (r, next_r) in requests.iter().zip(&next) {
        let limit = keys.hit_limit(r);
        hit_blocks.push(
            r.keys[..limit]
                .iter()
                .take_while(|&&k| kept[k as usize])
                .count() as u64,
        );
        for (depth, (&k, &n)) in r.keys.iter().zip(next_r).enumerate() {
            let (ku, depth) = (k as usize, depth as u32);
            if kept[ku] {
                if n == NEVER {
                    kept[ku] = false;
                    len -= 1;
                } else {
                    kept_next[ku] = n;
                    heap.push((n, depth, k));
                }
                continue;
            }
            if n == NEVER || num_blocks == 0 {
                continue;
            }
            if len == num_blocks {
                while let Some(&(tn, _, tk)) = heap.peek() {
                    if kept[tk as usize] && kept_next[tk as usize] == tn {
                        break;
                    }
                    heap.pop();
                }
                let &(tn, td, tk) = heap.peek().expect("a full cache has a valid entry");
                if (tn, td) <= (n, depth) {
                    continue; // bypass: everything kept is needed sooner
                }
                heap.pop();
                kept[tk as usize] = false;
                len -= 1;
            }
            kept[ku] = true;
            kept_next[ku] = n;
            heap.push((n, depth, k));
            len += 1;
        }
    }
    CacheModelReport::new("belady", keys, num_blocks, hit_blocks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_model::cache_only;
    use crate::trace::TraceRequest;
    use mla_cache::EvictionPolicyKind;

    fn req(input_length: usize, hash_ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp: 0,
            input_length,
            output_length: 0,
            hash_ids: hash_ids.to_vec(),
        }
    }

    #[test]
    fn a_loop_larger_than_the_cache_keeps_what_fits() {
        // Three one-block prompts in a loop, a cache of two: LRU never hits,
        // the optimum keeps two of the three for good and bypasses the third.
        let mut reqs = Vec::new();
        for _ in 0..10 {
            for id in 0..3 {
                reqs.push(req(600, &[id, 99]));
            }
        }
        let keys = BlockKeys::new(&reqs, 512);
        let lru = cache_only(&keys, 2, EvictionPolicyKind::Lru);
        assert_eq!(lru.hit_tokens, 0);
        assert_eq!(lru.hit_blocks_by_request, vec![0; 30]);
        let best = belady(&keys, 2);
        assert_eq!(best.hit_tokens, 9 * 2 * 512);
        // Request by request: nothing on the first round, then two of the
        // three prompts of every round.
        let by_round: Vec<u64> = best
            .hit_blocks_by_request
            .chunks(3)
            .map(|round| round.iter().sum())
            .collect();
        assert_eq!(by_round, [0, 2, 2, 2, 2, 2, 2, 2, 2, 2]);
    }

    #[test]
    fn the_bound_is_at_least_every_policy_and_grows_with_the_cache() {
        let mut rng = crate::rng::SplitMix64::new(11);
        let reqs: Vec<TraceRequest> = (0..400)
            .map(|_| {
                let len = rng.range(1, 5);
                let base = rng.range(0, 6) * 10;
                let ids: Vec<u64> = (0..len)
                    .map(|i| base + i + rng.range(0, 1) * 1000 * i)
                    .collect();
                req(len as usize * 512, &ids)
            })
            .collect();
        let keys = BlockKeys::new(&reqs, 256);
        let mut last = 0;
        for n in [1, 3, 8, 20, 60] {
            let bound = belady(&keys, n).hit_tokens;
            assert!(bound >= last);
            last = bound;
            for kind in EvictionPolicyKind::ALL {
                let got = cache_only(&keys, n, kind).hit_tokens;
                assert!(got <= bound, "{kind} with {n} blocks: {got} > {bound}");
            }
        }
        // Unlimited room: every hittable reuse hits.
        assert_eq!(
            belady(&keys, 10_000).hit_tokens,
            cache_only(&keys, 10_000, EvictionPolicyKind::Lru).hit_tokens
        );
    }
}
