//! `adaptive` against its candidate rules, replayed through the block
//! manager (release build: a few seconds), on the two workloads where the
//! better rule differs: `multiturn` (long conversations over shared system
//! prompts whose next turn returns after about one turnover of the cache:
//! residency wins) and the Mooncake trace (little looping: ARC wins). See
//! docs/eviction.md for the figures over ten hash seeds
//! (`cargo run --release --example duel_seeds`).
//!
//! Pinned for the workload's seed 0 and hash seed 0: adaptive within 2%
//! (relative) of the better of `arc` and `residency`, and never below
//! `lru`, at two cache sizes per workload.

use mla_cache::sim::{
    simulate, ChatConfig, OnMalformed, SimConfig, Trace, TraceRequest, MOONCAKE_SYNTHETIC_TRACE,
};
use mla_cache::EvictionPolicyKind;

/// The policies compared, by name.
const POLICIES: [&str; 4] = ["lru", "arc", "residency", "adaptive"];

/// Prompt-token hit rate of `policy` on `requests` with a cache of `num_blocks`.
fn hit_rate(requests: &[TraceRequest], num_blocks: usize, policy: &str) -> f64 {
    let eviction: EvictionPolicyKind = policy.parse().expect("a policy name");
    let config = SimConfig {
        num_blocks,
        eviction,
        ..SimConfig::default()
    };
    simulate(policy, requests, &config, |_, _| {})
        .expect("the replay runs")
        .token_hit_rate
}

/// Checks the targets on `requests` at each size; `best_rule` is the rule
/// expected to win there, so the workload is known to separate the rules.
fn adaptive_follows_the_better_rule(requests: &[TraceRequest], sizes: [usize; 2], best_rule: &str) {
    for num_blocks in sizes {
        // One thread per policy: the replays are independent.
        let rates: Vec<f64> = std::thread::scope(|s| {
            let runs: Vec<_> = POLICIES
                .iter()
                .map(|&policy| s.spawn(move || hit_rate(requests, num_blocks, policy)))
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("a replay thread"))
                .collect()
        });
        let rate = |name: &str| rates[POLICIES.iter().position(|&p| p == name).unwrap()];
        let (lru, arc, residency, adaptive) = (
            rate("lru"),
            rate("arc"),
            rate("residency"),
            rate("adaptive"),
        );
        let best = arc.max(residency);
        let rates = format!(
            "{num_blocks} blocks: lru {lru:.4} arc {arc:.4} residency {residency:.4} adaptive {adaptive:.4}"
        );
        assert!(adaptive >= 0.98 * best, "{rates}");
        assert!(adaptive >= lru, "{rates}");
        // The workload separates the rules: the expected one wins clearly.
        assert_eq!(rate(best_rule), best, "{rates}");
        assert!(arc.min(residency) < 0.99 * best, "{rates}");
    }
}

#[test]
fn adaptive_follows_residency_on_multiturn_at_two_sizes() {
    let trace = ChatConfig::multiturn().generate(0);
    adaptive_follows_the_better_rule(&trace.requests, [8192, 16_384], "residency");
}

#[test]
fn adaptive_follows_arc_on_the_mooncake_trace_at_two_sizes() {
    let trace =
        Trace::parse(MOONCAKE_SYNTHETIC_TRACE, OnMalformed::Fail).expect("the trace parses");
    adaptive_follows_the_better_rule(&trace.requests, [16_384, 32_768], "arc");
}
