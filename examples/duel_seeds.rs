//! `adaptive` against its candidate rules over several hash seeds: the
//! spread of hit rates, reproducible with one command.
//!
//! ```text
//! cargo run --release --example duel_seeds -- [--workload multiturn|mooncake|NAME]
//!     [--blocks 8192,16384] [--hash-seeds 10] [--jobs 2] [--cache-only] [--policy adaptive]
//! ```
//!
//! For each cache size it replays the workload through the block manager
//! (`mla_cache::sim::simulate`) under `lru`, `arc` and `residency` for hash
//! seed 0, and under `adaptive` (or the `--policy` named) for hash seeds 0
//! to N-1, and prints each rule's prompt-token hit rate, that policy's min
//! and max, its spread ((max - min) / max) and its worst gap to the better
//! candidate rule ((best - min) / best). Both workloads by default. `--cache-only` replays
//! the cache-only model (`mla_cache::sim::cache_only`, the sweep's starred
//! columns) instead; its block keys do not depend on a hash seed, so each
//! rule gives one figure there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use mla_cache::sim::{
    cache_only, generate_mix, generated_workload, simulate, BlockKeys, OnMalformed, SimConfig,
    Trace, TraceRequest, MOONCAKE_SYNTHETIC_TRACE,
};
use mla_cache::EvictionPolicyKind;

/// One replay to run: a policy, a cache size, a hash seed.
#[derive(Clone, Copy)]
struct Run<'a> {
    policy: &'a str,
    num_blocks: usize,
    hash_seed: u64,
}

/// The workload as each replay sees it.
enum Replay<'a> {
    Manager(&'a [TraceRequest]),
    CacheOnly(&'a BlockKeys),
}

fn hit_rate(replay: &Replay, run: Run<'_>) -> Result<f64, String> {
    let eviction: EvictionPolicyKind = run.policy.parse().map_err(|e| format!("{e}"))?;
    let requests = match replay {
        Replay::Manager(requests) => requests,
        Replay::CacheOnly(keys) => {
            return Ok(cache_only(keys, run.num_blocks, eviction).token_hit_rate)
        }
    };
    let config = SimConfig {
        num_blocks: run.num_blocks,
        eviction,
        hash_seed: run.hash_seed,
        ..SimConfig::default()
    };
    simulate(run.policy, requests, &config, |_, _| {})
        .map(|r| r.token_hit_rate)
        .map_err(|e| format!("{e}"))
}

/// Runs `runs` on `jobs` threads; the rates in the order of `runs`.
fn run_all(replay: &Replay, runs: &[Run<'_>], jobs: usize) -> Result<Vec<f64>, String> {
    let next = AtomicUsize::new(0);
    let rates = Mutex::new(vec![Ok(0.0); runs.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&run) = runs.get(i) else { break };
                let rate = hit_rate(replay, run);
                rates.lock().expect("no replay panicked")[i] = rate;
            });
        }
    });
    rates
        .into_inner()
        .expect("no replay panicked")
        .into_iter()
        .collect()
}

fn workload(name: &str) -> Result<Trace, String> {
    match name {
        "mooncake" => {
            Trace::parse(MOONCAKE_SYNTHETIC_TRACE, OnMalformed::Fail).map_err(|e| format!("{e}"))
        }
        generated => generated_workload(generated)
            .map(|populations| generate_mix(&populations, 0))
            .ok_or_else(|| format!("unknown workload {generated:?} (`simulate --workload` names)")),
    }
}

fn main() -> Result<(), String> {
    let mut workloads = vec!["multiturn".to_string(), "mooncake".to_string()];
    let mut sizes = vec![8192, 16_384];
    let mut seeds = 10u64;
    let mut jobs = 2;
    let mut model_only = false;
    let mut seeded = "adaptive".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--cache-only" {
            model_only = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--workload" => workloads = vec![value.clone()],
            "--blocks" => {
                sizes = value
                    .split(',')
                    .map(|s| s.trim().parse().map_err(bad))
                    .collect::<Result<_, _>>()?
            }
            "--hash-seeds" => seeds = value.parse().map_err(bad)?,
            "--jobs" => jobs = value.parse().map_err(bad)?,
            "--policy" => {
                value
                    .parse::<EvictionPolicyKind>()
                    .map_err(|e| format!("--policy {value}: {e}"))?;
                seeded = value;
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if seeds == 0 {
        return Err("--hash-seeds must be at least 1".into());
    }
    println!("| workload, blocks | lru | arc | residency | {seeded}, min to max | spread | worst gap to the best rule |");
    println!("|---|---|---|---|---|---|---|");
    for name in &workloads {
        let trace = workload(name)?;
        let keys;
        let replay = if model_only {
            keys = BlockKeys::new(&trace.requests, SimConfig::default().block_size);
            Replay::CacheOnly(&keys)
        } else {
            Replay::Manager(&trace.requests)
        };
        // The cache-only model gives one figure per rule.
        let seeds = if model_only { 1 } else { seeds };
        for &num_blocks in &sizes {
            let mut runs: Vec<Run> = ["lru", "arc", "residency"]
                .iter()
                .map(|&policy| Run {
                    policy,
                    num_blocks,
                    hash_seed: 0,
                })
                .collect();
            runs.extend((0..seeds).map(|hash_seed| Run {
                policy: &seeded,
                num_blocks,
                hash_seed,
            }));
            let rates = run_all(&replay, &runs, jobs)?;
            let (lru, arc, residency) = (rates[0], rates[1], rates[2]);
            let seeded_rates = &rates[3..];
            let min = seeded_rates.iter().copied().fold(f64::INFINITY, f64::min);
            let max = seeded_rates.iter().copied().fold(0.0, f64::max);
            let best = arc.max(residency);
            let pct = |x: f64| format!("{:.2}%", 100.0 * x);
            println!(
                "| {name}, {num_blocks} | {} | {} | {} | {} to {} | {:.2}% | {:.2}%{} |",
                pct(lru),
                pct(arc),
                pct(residency),
                pct(min),
                pct(max),
                100.0 * (max - min) / max.max(f64::MIN_POSITIVE),
                100.0 * (best - min) / best.max(f64::MIN_POSITIVE),
                if min < lru { " (below lru)" } else { "" },
            );
        }
    }
    Ok(())
}
