//! `return_time` against `lru` and `arc` on the `multiturn` workload: long
//! conversations over shared system prompts whose next turn returns after
//! about one turnover of the cache (see docs/eviction.md for the figures).
//!
//! Pinned at two cache sizes, for the workload's seed 0 and hash seed 0:
//! replayed through the block manager, `return_time` hits more than `arc`
//! and `lru`; in the cache-only model it closes at least 40% of the gap
//! between LRU and the offline optimum at 16,384 blocks, and a third of it
//! at 8,192. Release build: a few seconds.

use mla_cache::sim::{belady, cache_only, simulate, BlockKeys, ChatConfig, SimConfig};
use mla_cache::EvictionPolicyKind;

#[test]
fn return_time_beats_arc_and_lru_on_multiturn_at_two_sizes() {
    let trace = ChatConfig::multiturn().generate(0);
    let requests = &trace.requests;
    let keys = BlockKeys::new(requests, 64);
    for (num_blocks, share_of_gap) in [(8192, 1.0 / 3.0), (16_384, 0.4)] {
        let kinds = [
            EvictionPolicyKind::Lru,
            EvictionPolicyKind::Arc,
            EvictionPolicyKind::ReturnTime,
        ];
        // One thread per policy: the replays are independent.
        let [lru, arc, return_time] = std::thread::scope(|s| {
            let runs = kinds.map(|eviction| {
                s.spawn(move || {
                    let config = SimConfig {
                        num_blocks,
                        eviction,
                        ..SimConfig::default()
                    };
                    simulate("multiturn", requests, &config, |_, _| {})
                        .expect("the replay runs")
                        .token_hit_rate
                })
            });
            runs.map(|r| r.join().expect("a replay thread"))
        });
        let rates =
            format!("{num_blocks} blocks: lru {lru:.4} arc {arc:.4} return_time {return_time:.4}");
        assert!(return_time > arc && return_time > lru, "{rates}");

        let model = |kind| cache_only(&keys, num_blocks, kind).token_hit_rate;
        let (lru, ours) = (
            model(EvictionPolicyKind::Lru),
            model(EvictionPolicyKind::ReturnTime),
        );
        let bound = belady(&keys, num_blocks).token_hit_rate;
        let closed = (ours - lru) / (bound - lru);
        assert!(
            closed >= share_of_gap,
            "{num_blocks} blocks, cache-only: lru {lru:.4} return_time {ours:.4} belady {bound:.4}: {closed:.3} of the gap"
        );
    }
}
