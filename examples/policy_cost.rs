//! Each eviction policy's admit+free cost as a ratio to LRU's, measured
//! paired: the policies' managers take turns, a few requests each, so a
//! noisy neighbour slows them alike and the ratio holds where criterion's
//! separate runs scatter (on a shared 2-vCPU machine, 1.3x to 2.6x for the
//! same binary).
//!
//! ```text
//! cargo run --release --example policy_cost -- [--rounds 400] [--turn 8]
//! ```
//!
//! The workloads are the criterion policy benches' (`benches/manager.rs`):
//! `policy`, 4,096-token prompts of which 2,048 are one of 64 shared
//! prefixes; `long_prompt`, 12,000-token prompts of which 4,096 are shared;
//! both in a 16,384-block cache that every request overflows. Each manager
//! first runs until its cache is full; then, in every round, each policy
//! serves `--turn` requests, timed in thread CPU time (prompts are made
//! outside the timing). Printed per policy: the median time per request,
//! and the median over rounds of its time over LRU's in the same round.

use std::hint::black_box;

use mla_cache::{AdmitOptions, BlockManager, EvictionPolicyKind};

// Each includer uses a part of it.
#[allow(dead_code)]
#[path = "../benches/common/policy_workloads.rs"]
mod policy_workloads;
use policy_workloads::{manager, thread_cpu_time, LONG_PROMPT, POLICY};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, not {v}"))
        })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (rounds, turn) = (arg(&args, "--rounds", 400), arg(&args, "--turn", 8));
    let kinds = EvictionPolicyKind::ALL;
    for w in [&POLICY, &LONG_PROMPT] {
        let managers: Vec<BlockManager> = kinds.iter().map(|&kind| manager(kind)).collect();
        let mut next = 0u32;
        let serve = |m: &BlockManager, p: &[u32]| {
            m.admit(1, black_box(p), &AdmitOptions::default()).unwrap();
            m.free(1).unwrap();
        };
        // Fill every cache: from here on each request evicts.
        let filling = 2 * 16_384 * 64 / (w.len - w.shared);
        for _ in 0..filling {
            let p = w.prompt(next);
            next += 1;
            for m in &managers {
                serve(m, &p);
            }
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
        for _ in 0..rounds {
            let prompts: Vec<Vec<u32>> = (0..turn as u32).map(|k| w.prompt(next + k)).collect();
            next += turn as u32;
            for (m, t) in managers.iter().zip(&mut times) {
                let start = thread_cpu_time();
                for p in &prompts {
                    serve(m, p);
                }
                t.push((thread_cpu_time() - start).as_secs_f64() / turn as f64);
            }
        }
        let lru = kinds
            .iter()
            .position(|&k| k == EvictionPolicyKind::Lru)
            .expect("LRU is a policy");
        for (kind, t) in kinds.iter().zip(&times) {
            let ratios = t.iter().zip(&times[lru]).map(|(a, b)| a / b).collect();
            println!(
                "{:<12} {:<12} {:>8.2} µs per request  {:.2}x LRU",
                w.name,
                kind.to_string(),
                median(t.clone()) * 1e6,
                median(ratios)
            );
        }
    }
}
