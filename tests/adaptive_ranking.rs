//! `adaptive` against its candidate rules, replayed through the block
//! manager (release build: a minute or two on two cores), on four
//! workloads where the better rule differs: `multiturn` (long conversations
//! over shared system prompts whose next turn returns after about one
//! turnover of the cache: residency wins), the Mooncake trace (little
//! looping: ARC wins) and `chat-under-flood` at 65,535 blocks (chats that
//! return after minutes beside a flood of one-off documents: residency
//! wins, while the flood makes ARC's shadow hit about as much for a
//! while), and `agents` at 16,383 blocks (agent sessions resending long
//! contexts: residency wins). The figures over ten hash seeds:
//! `cargo run --release --example duel_seeds`.
//!
//! Pinned for the workload's seed 0 (two cache sizes per workload, one
//! for `chat-under-flood`), with `adaptive` replayed for hash seeds 0 to 3
//! (its shadows sample blocks by hash): on every seed within 2% (relative)
//! of the better of `arc` and `residency` and never below `lru`, and its
//! spread over the seeds ((max - min) / max) under 2%. The duel before
//! both rules shared their classes missed on seeds 0 to 3 already (2.8%
//! below residency on multiturn at 16,384 blocks, 6.5% below ARC on the
//! Mooncake trace).

use mla_cache::sim::{
    generate_mix, generated_workload, simulate, ChatConfig, OnMalformed, SimConfig, Trace,
    TraceRequest, MOONCAKE_SYNTHETIC_TRACE,
};
use mla_cache::EvictionPolicyKind;

/// The policies compared, by name, and the hash seed of each replay.
const RUNS: [(&str, u64); 7] = [
    ("lru", 0),
    ("arc", 0),
    ("residency", 0),
    ("adaptive", 0),
    ("adaptive", 1),
    ("adaptive", 2),
    ("adaptive", 3),
];

/// Prompt-token hit rate of `policy` on `requests` with a cache of `num_blocks`.
fn hit_rate(requests: &[TraceRequest], num_blocks: usize, policy: &str, hash_seed: u64) -> f64 {
    let eviction: EvictionPolicyKind = policy.parse().expect("a policy name");
    let config = SimConfig {
        num_blocks,
        eviction,
        hash_seed,
        ..SimConfig::default()
    };
    simulate(policy, requests, &config, |_, _| {})
        .expect("the replay runs")
        .token_hit_rate
}

/// The hit rates of [`RUNS`]: each rule's, and `adaptive`'s per hash seed.
struct Rates {
    lru: f64,
    arc: f64,
    residency: f64,
    adaptive: Vec<f64>,
}

/// Replays each of [`RUNS`] on `requests` at `num_blocks`, one thread per
/// replay (they are independent).
fn rates_of_runs(requests: &[TraceRequest], num_blocks: usize) -> Rates {
    let rates: Vec<f64> = std::thread::scope(|s| {
        let runs: Vec<_> = RUNS
            .iter()
            .map(|&(policy, seed)| s.spawn(move || hit_rate(requests, num_blocks, policy, seed)))
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a replay thread"))
            .collect()
    });
    let rate = |name: &str| rates[RUNS.iter().position(|&(p, _)| p == name).unwrap()];
    Rates {
        lru: rate("lru"),
        arc: rate("arc"),
        residency: rate("residency"),
        adaptive: RUNS
            .iter()
            .zip(&rates)
            .filter(|((p, _), _)| *p == "adaptive")
            .map(|(_, &r)| r)
            .collect(),
    }
}

/// The Mooncake trace's requests.
fn mooncake() -> Vec<TraceRequest> {
    Trace::parse(MOONCAKE_SYNTHETIC_TRACE, OnMalformed::Fail)
        .expect("the trace parses")
        .requests
}

/// Checks the targets on `requests` at each size; `best_rule` is the rule
/// expected to win there, so the workload is known to separate the rules.
fn adaptive_follows_the_better_rule(requests: &[TraceRequest], sizes: &[usize], best_rule: &str) {
    for &num_blocks in sizes {
        let Rates {
            lru,
            arc,
            residency,
            adaptive,
        } = rates_of_runs(requests, num_blocks);
        let min = adaptive.iter().copied().fold(f64::INFINITY, f64::min);
        let max = adaptive.iter().copied().fold(0.0, f64::max);
        let best = arc.max(residency);
        let rates = format!(
            "{num_blocks} blocks: lru {lru:.4} arc {arc:.4} residency {residency:.4} adaptive {adaptive:.4?}"
        );
        assert!(min >= 0.98 * best, "{rates}");
        assert!(min >= lru, "{rates}");
        assert!(max - min < 0.02 * max, "spread: {rates}");
        // The workload separates the rules: the expected one wins clearly.
        let expected = match best_rule {
            "arc" => arc,
            "residency" => residency,
            other => panic!("{other} is not a candidate rule"),
        };
        assert_eq!(expected, best, "{rates}");
        assert!(arc.min(residency) < 0.99 * best, "{rates}");
    }
}

#[test]
fn adaptive_follows_residency_on_multiturn_at_two_sizes() {
    let trace = ChatConfig::multiturn().generate(0);
    adaptive_follows_the_better_rule(&trace.requests, &[8192, 16_384], "residency");
}

/// Where the cache holds most of what comes back, residency wins by
/// evicting kept blocks past its learned horizon (ended conversations)
/// first. Without the horizon it fell below ARC at 131,072 blocks (69.5%
/// against 70.1%), and `adaptive` with it (68.9% to 69.9%).
#[test]
fn adaptive_follows_residency_on_multiturn_when_most_of_it_fits() {
    let trace = ChatConfig::multiturn().generate(0);
    adaptive_follows_the_better_rule(&trace.requests, &[65_536, 131_072], "residency");
}

#[test]
fn adaptive_follows_arc_on_the_mooncake_trace_at_two_sizes() {
    adaptive_follows_the_better_rule(&mooncake(), &[16_384, 32_768], "arc");
}

/// On the Mooncake trace at 8,192 and 11,585 blocks the residency shadow
/// leads for spells (early in the trace, and in bursts right after the
/// real cache follows ARC) while the later requests come back to what ARC
/// keeps: the real cache leaves ARC only on a lead of ten standard
/// deviations. With six, four hash seeds in ten (seeds 0 and 2 among them)
/// ended 3.6% below ARC at 11,585 blocks; with one, before the shadows
/// judged requests on their sampled blocks' places, 3.5% below.
#[test]
fn adaptive_follows_arc_on_the_mooncake_trace_where_residency_leads_for_spells() {
    adaptive_follows_the_better_rule(&mooncake(), &[8192, 11_585], "arc");
}

/// The long-think chats beside a flood of one-off documents, at 65,535
/// blocks: while the documents flood the cache and before the chats first
/// come back, ARC's shadow hits about as much as residency's, and a switch
/// to ARC costs the residents the rest of the run needs. When the shadows
/// judged a request warm on half of its sampled blocks (a handful per
/// prompt), ARC's shadow led for a spell of some 9,000 requests, and ten
/// hash seeds ended 3% to 9% below residency.
#[test]
fn adaptive_follows_residency_on_chats_under_a_flood_of_one_off_documents() {
    let populations = generated_workload("chat-under-flood").expect("a built-in workload");
    let trace = generate_mix(&populations, 0);
    adaptive_follows_the_better_rule(&trace.requests, &[65_535], "residency");
}

/// The `agents` workload's requests (workload seed 0).
fn agents() -> Vec<TraceRequest> {
    let populations = generated_workload("agents").expect("a built-in workload");
    generate_mix(&populations, 0).requests
}

/// Where `adaptive`'s spread over hash seeds came from its real cache:
/// multiturn at 11,585 blocks and `agents` at 16,383 (over ten seeds 2.4%
/// and 2.5%), from which blocks were witnesses (by fingerprint) and from
/// the ghost table's false matches (20-bit tags).
#[test]
fn adaptive_follows_residency_where_its_real_cache_varied_with_the_hash_seed() {
    let multiturn = ChatConfig::multiturn().generate(0);
    adaptive_follows_the_better_rule(&multiturn.requests, &[11_585], "residency");
    adaptive_follows_the_better_rule(&agents(), &[16_383], "residency");
}

/// A cache makes the same choices for every hash seed (hash seeds 0 to 3):
/// residency, whose witnesses are picked by the count of blocks stored
/// (by fingerprint, multiturn at 11,585 blocks gave 17.26% / 17.67% /
/// 17.64% / 17.65%), and ARC, whose classes come from the ghost table,
/// which matches no fingerprint it was not given (with 20-bit tags,
/// `agents` at 16,383 blocks gave 13.07% to 13.23%).
#[test]
fn a_cache_makes_the_same_choices_for_every_hash_seed() {
    let multiturn = ChatConfig::multiturn().generate(0).requests;
    let agents = agents();
    for (requests, num_blocks, policy) in
        [(&multiturn, 11_585, "residency"), (&agents, 16_383, "arc")]
    {
        let rates: Vec<f64> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..4)
                .map(|seed| s.spawn(move || hit_rate(requests, num_blocks, policy, seed)))
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("a replay thread"))
                .collect()
        });
        assert!(
            rates.iter().all(|&r| r == rates[0]),
            "{policy} at {num_blocks} blocks: {rates:?}"
        );
    }
}
