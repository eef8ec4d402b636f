//! `adaptive` against its candidate rules on the `multiturn` workload: long
//! conversations over shared system prompts whose next turn returns after
//! about one turnover of the cache (see docs/eviction.md for the figures).
//!
//! Pinned at two cache sizes, for the workload's seed 0 and hash seed 0:
//! adaptive within 2% (relative) of the better of `arc` and `residency`, and
//! never below `lru`. Replayed through the block manager, release build: a
//! few seconds.

use mla_cache::sim::{simulate, ChatConfig, SimConfig, TraceRequest};
use mla_cache::EvictionPolicyKind;

/// Prompt-token hit rate of `kind` on `requests` with a cache of `num_blocks`.
fn hit_rate(requests: &[TraceRequest], num_blocks: usize, kind: EvictionPolicyKind) -> f64 {
    let config = SimConfig {
        num_blocks,
        eviction: kind,
        ..SimConfig::default()
    };
    simulate("multiturn", requests, &config, |_, _| {})
        .expect("the replay runs")
        .token_hit_rate
}

#[test]
fn adaptive_follows_the_better_rule_on_multiturn_at_two_sizes() {
    let trace = ChatConfig::multiturn().generate(0);
    let requests = &trace.requests;
    for num_blocks in [8192, 16_384] {
        // One thread per policy: the replays are independent.
        let [lru, arc, residency, adaptive] = std::thread::scope(|s| {
            let rules = [
                EvictionPolicyKind::Lru,
                EvictionPolicyKind::Arc,
                EvictionPolicyKind::Residency,
                EvictionPolicyKind::Adaptive,
            ];
            let runs = rules.map(|kind| s.spawn(move || hit_rate(requests, num_blocks, kind)));
            runs.map(|r| r.join().expect("a replay thread"))
        });
        let best = arc.max(residency);
        let rates = format!(
            "{num_blocks} blocks: lru {lru:.4} arc {arc:.4} residency {residency:.4} adaptive {adaptive:.4}"
        );
        assert!(adaptive >= 0.98 * best, "{rates}");
        assert!(adaptive >= lru, "{rates}");
        // The workload is one where keeping returning conversations pays.
        assert!(best > lru * 1.01, "{rates}");
    }
}
