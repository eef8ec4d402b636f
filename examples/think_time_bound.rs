//! An estimate of how many hits an online policy can reach on a generated
//! conversational workload, against what `return_time` reaches and the
//! offline optimum, reproducible with one command.
//!
//! ```text
//! cargo run --release --example think_time_bound -- [--workload multiturn,chat-long-think,agents]
//!     [--blocks 8192,16384,65536] [--seed 0] [--middle 50]
//! ```
//!
//! The cache-only model (`mla_cache::sim::cache_only`), over the middle
//! half of the workload's requests (`--middle` percent: away from the
//! filling cache and the draining traffic). A hit on a block costs the
//! cache that block for the requests served between its last use and its
//! return; each request served leaves the cache's blocks, less those of
//! the request itself, for that. Belady picks the returns that cost least.
//! An online policy does not know when a conversation's next turn comes:
//! its think time is drawn uniformly (the workload's `turn_gap_ms`),
//! independent of everything the cache sees, so a policy that keeps a
//! block until it returns pays the expected cost (the requests that arrive
//! within a think time drawn from that range, counted on the workload's
//! other arrivals); under a steady arrival rate, giving a block up before
//! it returns only raises the cost of each hit (the chance to return grows
//! with the age over a uniform range). The estimate keeps the cheapest
//! returns up to the window's capacity, as a fractional knapsack (a return
//! whose wait straddles an edge of the window counts with the share of its
//! wait inside, as does its cost), and grants the policy a great deal: it
//! knows the think-time range and the arrivals to come, never keeps a
//! conversation that has ended, pays for a shared block (used more often
//! than a conversation has turns: a system prompt) only its real
//! intervals, and ignores that a hit must be a leading run of the prompt.
//! It is an estimate, not a bound: it pools the window's capacity, so it
//! may spend in a quiet stretch what a cache could not hold at once (the
//! wider the window, the more), and it is one workload seed's. Capped at
//! Belady's figure.

use std::ops::Range;

#[path = "common/conversations.rs"]
mod conversations;
#[path = "common/flags.rs"]
mod flags;

use mla_cache::sim::{
    belady, cache_only, generate_mix, generated_workload, BlockKeys, CacheModelReport, SimConfig,
};
use mla_cache::EvictionPolicyKind;

use conversations::Conversations;
use flags::Flags;

/// Think times sampled per return (midpoints of equal slices of the
/// uniform range still open).
const THINK_TIME_SAMPLES: u64 = 64;

/// The requests the figures cover: the middle `percent` of them.
fn middle(requests: usize, percent: usize) -> Range<usize> {
    let skipped = requests * (100 - percent.min(100)) / 200;
    skipped..requests - skipped
}

/// A return the estimate may pay for: the cost of the hit (requests served
/// while the block waits for it) and the share of its wait that falls in
/// the window, which is the share of the hit, and of its cost, the window
/// is credited with (so returns that straddle an edge count as much as
/// their wait inside, neither free nor lost).
struct Return {
    cost: f64,
    share: f64,
}

/// Every return whose wait overlaps `window`, cheapest first.
fn returns(
    stamps: &[u64],
    keys: &BlockKeys,
    conversations: &Conversations,
    window: &Range<usize>,
) -> Vec<Return> {
    let (think_min, think_max) = conversations.think_ms;
    let arrived_by = |t: u64| stamps.partition_point(|&s| s <= t);
    let mut uses = vec![0u64; keys.num_keys()];
    for r in keys.requests() {
        for &k in &r.keys {
            uses[k as usize] += 1;
        }
    }
    let mut last_use = vec![usize::MAX; keys.num_keys()];
    let mut found = Vec::new();
    let mut expected = (usize::MAX, usize::MAX, 0.0);
    for (j, r) in keys.requests().iter().enumerate() {
        let limit = keys.hit_limit(r);
        for (i, &k) in r.keys.iter().enumerate() {
            let p = std::mem::replace(&mut last_use[k as usize], j);
            if i >= limit || p == usize::MAX {
                continue;
            }
            // The wait: requests p + 1 to j, the return included.
            let inside = j.min(window.end - 1) + 1;
            let inside = inside.saturating_sub((p + 1).max(window.start));
            if inside == 0 {
                continue;
            }
            let share = inside as f64 / (j - p) as f64;
            if uses[k as usize] > conversations.max_turns() {
                found.push(Return {
                    cost: (j - p - 1) as f64,
                    share,
                });
                continue;
            }
            if (expected.0, expected.1) != (p, j) {
                // Requests other than the return itself arriving within
                // each think time sampled.
                let total: usize = (0..THINK_TIME_SAMPLES)
                    .map(|s| {
                        let think = think_min
                            + (think_max - think_min) * (2 * s + 1) / (2 * THINK_TIME_SAMPLES);
                        let t = stamps[p] + think;
                        arrived_by(t).saturating_sub(p + 1 + usize::from(stamps[j] <= t))
                    })
                    .sum();
                expected = (p, j, total as f64 / THINK_TIME_SAMPLES as f64);
            }
            found.push(Return {
                cost: expected.2,
                share,
            });
        }
    }
    found.sort_by(|a, b| a.cost.total_cmp(&b.cost));
    found
}

/// The estimate's hits (in blocks) over `window` for a cache of
/// `num_blocks`: the cheapest returns the room pays for, each credited
/// with its share in the window.
fn online_hits(
    returns: &[Return],
    keys: &BlockKeys,
    num_blocks: usize,
    window: &Range<usize>,
) -> f64 {
    let mut room: f64 = keys.requests()[window.clone()]
        .iter()
        .map(|r| num_blocks.saturating_sub(r.keys.len()) as f64)
        .sum();
    let mut hits = 0.0;
    for r in returns {
        let cost = r.cost * r.share;
        if cost > room {
            hits += r.share * room / cost;
            break;
        }
        room -= cost;
        hits += r.share;
    }
    hits
}

fn main() -> Result<(), String> {
    let mut middle_percent = 50;
    let Flags {
        workloads,
        sizes,
        seed,
    } = Flags::conversational().parse(&mut [("--middle", &mut middle_percent)])?;
    println!("| workload, blocks | lru | arc | return_time | estimate | belady | gap closed: return_time / estimate | return_time's share of the estimate's gain |");
    println!("|---|---|---|---|---|---|---|---|");
    for name in &workloads {
        let populations =
            generated_workload(name).ok_or(format!("unknown generated workload {name:?}"))?;
        let conversations = Conversations::of(&populations)?;
        let trace = generate_mix(&populations, seed);
        let stamps: Vec<u64> = trace.requests.iter().map(|r| r.timestamp).collect();
        let keys = BlockKeys::new(&trace.requests, SimConfig::default().block_size);
        let window = middle(trace.requests.len(), middle_percent);
        let returns = returns(&stamps, &keys, &conversations, &window);
        let tokens: u64 = trace.requests[window.clone()]
            .iter()
            .map(|r| r.input_length as u64)
            .sum();
        let rate = |blocks: f64| blocks * keys.block_size() as f64 / tokens as f64;
        let in_window = |r: &CacheModelReport| {
            rate(r.hit_blocks_by_request[window.clone()].iter().sum::<u64>() as f64)
        };
        for &num_blocks in &sizes {
            let (keys, in_window) = (&keys, &in_window);
            let (lru, arc, return_time, best) = std::thread::scope(|s| {
                let run = |kind| s.spawn(move || in_window(&cache_only(keys, num_blocks, kind)));
                let runs = [
                    run(EvictionPolicyKind::Lru),
                    run(EvictionPolicyKind::Arc),
                    run(EvictionPolicyKind::ReturnTime),
                ];
                let best = in_window(&belady(keys, num_blocks));
                let [lru, arc, return_time] = runs.map(|h| h.join().expect("a replay"));
                (lru, arc, return_time, best)
            });
            let estimate = rate(online_hits(&returns, keys, num_blocks, &window)).min(best);
            let pct = |x: f64| format!("{:.2}%", 100.0 * x);
            // Where everything fits, LRU is the optimum: no gap to close.
            let ratio = |gain: f64, whole: f64| {
                if whole.abs() > 1e-9 {
                    format!("{:.1}%", 100.0 * gain / whole)
                } else {
                    "-".to_string()
                }
            };
            let share = |x: f64| ratio(x - lru, best - lru);
            let below = if estimate < lru.max(arc).max(return_time) {
                " (under a policy's figure: not a bound here)"
            } else {
                ""
            };
            println!(
                "| {name}, {num_blocks} | {} | {} | {} | {}{below} | {} | {} / {} | {} |",
                pct(lru),
                pct(arc),
                pct(return_time),
                pct(estimate),
                pct(best),
                share(return_time),
                share(estimate),
                ratio(return_time - lru, estimate - lru),
            );
        }
    }
    Ok(())
}
