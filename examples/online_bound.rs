//! An upper bound on the hits any online policy can expect on a generated
//! conversational workload, held request by request, reproducible with one
//! command.
//!
//! ```text
//! cargo run --release --example online_bound -- [--workload multiturn,chat-long-think,agents]
//!     [--blocks 8192,16384,65536] [--seed 0] [--iterations 1500]
//! ```
//!
//! The cache-only model (`mla_cache::sim::cache_only`) over the whole run.
//! A conversation's next turn comes a think time after its last, drawn
//! uniformly from the workload's `turn_gap_ms`, and it has a next turn
//! with a chance that only its turn count tells (turn counts uniform over
//! `turns`); neither depends on anything else the cache sees. So whatever
//! an online policy does, the time it gives a conversation's block up does
//! not depend on whether or when that conversation comes back, only on
//! "not back yet": given up `d` ms after its last use, the block is hit
//! with chance `g F(d)` (`g` the chance of a next turn, `F` the think
//! time's distribution) and held across each other request `s` ms after
//! the last use, `s < d`, with chance `1 - g F(s)`; a policy that decides
//! as it goes mixes such `d`. Every request leaves the cache's blocks, less
//! its own, for the blocks held across it: in every run, so on average.
//! Maximising the expected hits under those average capacities is a
//! linear program; its Lagrangian dual, one price per request, is an upper
//! bound for every choice of prices,
//!
//! `sum over requests (price x room) + sum over waits max(0, max over d
//! (g F(d) - sum over the requests before d (price x (1 - g F))))`,
//!
//! lowered here by projected subgradient steps (the least value seen is
//! printed). It grants the policy a great deal: it knows what every other
//! conversation will do, pays for a shared block (used more often than a
//! conversation has turns: a system prompt) only its real intervals, and
//! ignores that a hit must be a leading run of the prompt. It averages
//! each conversation's own think time and end while taking the rest of the
//! traffic as it came (a conversation's own later requests are not among
//! those its blocks wait across: they move with its think time), an
//! approximation with no proven direction, close while no one conversation
//! moves the others much (hundreds to thousands run side by side on these
//! workloads). It bounds the expected hits: one run of a policy can beat
//! it by luck, by little where thousands of conversations return. A second
//! bound is also told which conversations end. Both are capped at Belady's
//! figure.

#[path = "common/conversations.rs"]
mod conversations;
#[path = "common/flags.rs"]
mod flags;

use mla_cache::sim::{
    belady, cache_only, generate_mix, generated_workload, BlockKeys, ChatConfig, SimConfig,
};
use mla_cache::EvictionPolicyKind;

use conversations::Conversations;
use flags::Flags;

/// Steps without the bound falling by a ten-thousandth before the target
/// is drawn closer.
const STALLED: u32 = 50;

impl Conversations {
    /// The conversations of a workload of one population: with two, a
    /// request's chance of a next turn would depend on which it belongs to,
    /// which the bound cannot tell.
    fn single(populations: &[ChatConfig]) -> Result<Self, String> {
        if populations.len() != 1 {
            return Err("the bound needs a workload of one population".into());
        }
        let conversations = Self::of(populations)?;
        if conversations.think_ms.1 <= conversations.think_ms.0 {
            return Err("the think times need a range".into());
        }
        Ok(conversations)
    }

    /// The chance that a conversation that has had `turns` turns has
    /// another (turn counts uniform over the population's range).
    fn goes_on(&self, turns: u64) -> f64 {
        let (lo, hi) = self.turns;
        let at_least = |n: u64| (hi + 1).saturating_sub(n.max(lo)) as f64;
        if turns >= hi {
            0.0
        } else {
            at_least(turns + 1) / at_least(turns)
        }
    }

    /// The chance that a think time (whole milliseconds) is at most `ms`:
    /// a return at the same millisecond as another request counts as before
    /// it, which can only raise the bound.
    fn within(&self, ms: u64) -> f64 {
        let (lo, hi) = self.think_ms;
        if ms < lo {
            return 0.0;
        }
        ((ms - lo + 1) as f64 / (hi - lo + 1) as f64).min(1.0)
    }
}

/// Blocks one request leaves in the cache, waiting to be used again: a
/// conversation's own (back after a think time, if the conversation goes
/// on) or a shared prefix's (back at its real next use).
struct Wait {
    /// The request that last used the blocks.
    last_use: usize,
    /// Where the blocks are shared: the request that uses them next.
    shared_until: Option<usize>,
    /// How many blocks.
    blocks: f64,
    /// The chance that they are used again at all.
    comes_back: f64,
}

/// What the bound reads of a workload.
struct Workload {
    /// Arrival of each request, in milliseconds.
    stamps: Vec<u64>,
    /// The conversation each request belongs to (its first private block's
    /// first request), `usize::MAX` where it has none.
    conversation: Vec<usize>,
    /// Blocks each request holds itself.
    own: Vec<f64>,
    waits: Vec<Wait>,
    conversations: Conversations,
}

impl Workload {
    /// `told_ends`: the policy knows which conversations go on (a
    /// conversation's blocks come back exactly when it has a next turn);
    /// otherwise it knows only how many turns each has had.
    fn new(
        stamps: Vec<u64>,
        keys: &BlockKeys,
        conversations: Conversations,
        told_ends: bool,
    ) -> Self {
        let requests = keys.requests();
        let mut uses = vec![0u64; keys.num_keys()];
        for r in requests {
            for &k in &r.keys {
                uses[k as usize] += 1;
            }
        }
        let private = |k: u32| uses[k as usize] <= conversations.max_turns();
        let mut first_use = vec![usize::MAX; keys.num_keys()];
        let mut last_use = vec![usize::MAX; keys.num_keys()];
        let mut conversation = Vec::with_capacity(requests.len());
        let mut waits = Vec::new();
        for (j, r) in requests.iter().enumerate() {
            let limit = keys.hit_limit(r);
            // Shared blocks last used by the same request wait together.
            let mut group: Option<Wait> = None;
            for (i, &k) in r.keys.iter().enumerate() {
                if first_use[k as usize] == usize::MAX {
                    first_use[k as usize] = j;
                }
                let p = std::mem::replace(&mut last_use[k as usize], j);
                if i >= limit || p == usize::MAX || private(k) {
                    continue;
                }
                match &mut group {
                    Some(g) if g.last_use == p => g.blocks += 1.0,
                    _ => {
                        waits.extend(group.take());
                        group = Some(Wait {
                            last_use: p,
                            shared_until: Some(j),
                            blocks: 1.0,
                            comes_back: 1.0,
                        });
                    }
                }
            }
            waits.extend(group);
            conversation.push(
                r.keys
                    .iter()
                    .find(|&&k| private(k))
                    .map_or(usize::MAX, |&k| first_use[k as usize]),
            );
        }
        // A conversation's own blocks wait from each of its turns for the next.
        // A conversation is named by its first request: an index.
        let mut turns = vec![0u64; requests.len()];
        let mut goes_on = vec![false; requests.len()];
        let mut latest = vec![usize::MAX; requests.len()];
        for (j, &c) in conversation.iter().enumerate() {
            if c == usize::MAX {
                continue;
            }
            let p = std::mem::replace(&mut latest[c], j);
            if p != usize::MAX {
                goes_on[p] = true;
            }
        }
        for (p, r) in requests.iter().enumerate() {
            let c = conversation[p];
            if c == usize::MAX {
                continue;
            }
            turns[c] += 1;
            let comes_back = if told_ends {
                f64::from(u8::from(goes_on[p]))
            } else {
                conversations.goes_on(turns[c])
            };
            let blocks = r.keys.iter().filter(|&&k| private(k)).count() as f64;
            if comes_back > 0.0 && blocks > 0.0 {
                waits.push(Wait {
                    last_use: p,
                    shared_until: None,
                    blocks,
                    comes_back,
                });
            }
        }
        let own = requests.iter().map(|r| r.keys.len() as f64).collect();
        Self {
            stamps,
            conversation,
            own,
            waits,
            conversations,
        }
    }

    /// The requests a wait's blocks may be held across: those after their
    /// last use, up to their next (shared) or within the longest think
    /// time, less their conversation's own.
    fn across<'a>(&'a self, w: &'a Wait) -> impl Iterator<Item = usize> + 'a {
        let end = w.shared_until.unwrap_or_else(|| {
            let until = self.stamps[w.last_use] + self.conversations.think_ms.1;
            self.stamps.partition_point(|&s| s < until)
        });
        let own = self.conversation[w.last_use];
        (w.last_use + 1..end)
            .filter(move |&q| w.shared_until.is_some() || self.conversation[q] != own)
    }

    /// The chance that `w`'s blocks come back no later than request `q`.
    fn back_by(&self, w: &Wait, q: usize) -> f64 {
        match w.shared_until {
            Some(_) => 0.0,
            None => {
                let since = self.stamps[q] - self.stamps[w.last_use];
                w.comes_back * self.conversations.within(since)
            }
        }
    }

    /// The dual bound at `prices`, and each request's expected occupancy
    /// under the choices that attain it (the subgradient's other half).
    fn dual(&self, prices: &[f64], room: &[f64], occupancy: &mut [f64]) -> f64 {
        occupancy.iter_mut().for_each(|o| *o = 0.0);
        let mut bound: f64 = prices.iter().zip(room).map(|(p, r)| p * r).sum();
        for w in &self.waits {
            // The best time to give the blocks up: right before a request
            // they would be held across, or not before they come back.
            let (mut best, mut best_end, mut cost) = (0.0, w.last_use, 0.0);
            for q in self.across(w) {
                // Nothing later can do better: the chance to come back is
                // at most `comes_back`, the cost only grows.
                if w.comes_back - cost <= best {
                    break;
                }
                let back = self.back_by(w, q);
                if back - cost > best {
                    (best, best_end) = (back - cost, q);
                }
                cost += prices[q] * (1.0 - back);
            }
            if w.comes_back - cost > best {
                (best, best_end) = (w.comes_back - cost, usize::MAX);
            }
            if best <= 0.0 {
                continue;
            }
            bound += w.blocks * best;
            for q in self.across(w).take_while(|&q| q < best_end) {
                occupancy[q] += w.blocks * (1.0 - self.back_by(w, q));
            }
        }
        bound
    }

    /// The least dual bound found in `iterations` projected subgradient
    /// steps, in blocks hit.
    fn bound(&self, num_blocks: usize, iterations: usize) -> f64 {
        let n = self.stamps.len();
        let room: Vec<f64> = self
            .own
            .iter()
            .map(|&own| (num_blocks as f64 - own).max(0.0))
            .collect();
        // Start from one price for every request: a block's hit is worth at
        // most one, and it waits across some hundreds of requests.
        let mut prices = vec![1.0 / 256.0; n];
        let mut occupancy = vec![0.0; n];
        let mut least = f64::INFINITY;
        // Polyak's steps toward a target under the least bound seen, the
        // target drawn closer while the bound stops falling.
        let mut below = 0.1;
        let mut stalled = 0;
        for _ in 0..iterations {
            let bound = self.dual(&prices, &room, &mut occupancy);
            if bound < least * (1.0 - 1e-4) {
                stalled = 0;
            } else {
                stalled += 1;
                if stalled == STALLED {
                    below /= 2.0;
                    stalled = 0;
                    if below < 1e-5 {
                        break;
                    }
                }
            }
            least = least.min(bound);
            // The slope in each price, left out where the price is held at 0.
            let slopes: Vec<f64> = (0..n)
                .map(|q| {
                    let g = room[q] - occupancy[q];
                    if prices[q] == 0.0 && g > 0.0 {
                        0.0
                    } else {
                        g
                    }
                })
                .collect();
            let norm: f64 = slopes.iter().map(|g| g * g).sum();
            if norm == 0.0 {
                break;
            }
            let step = (bound - least * (1.0 - below)) / norm;
            for (price, g) in prices.iter_mut().zip(&slopes) {
                *price = (*price - step * g).max(0.0);
            }
        }
        least
    }
}

fn main() -> Result<(), String> {
    let mut iterations = 1500;
    let Flags {
        workloads,
        sizes,
        seed,
    } = Flags::conversational().parse(&mut [("--iterations", &mut iterations)])?;
    println!("| workload, blocks | lru | return_time | bound, told which conversations end | bound | belady | gap closed: return_time / told / bound |");
    println!("|---|---|---|---|---|---|---|");
    for name in &workloads {
        let populations =
            generated_workload(name).ok_or(format!("unknown generated workload {name:?}"))?;
        let trace = generate_mix(&populations, seed);
        let stamps: Vec<u64> = trace.requests.iter().map(|r| r.timestamp).collect();
        let keys = BlockKeys::new(&trace.requests, SimConfig::default().block_size);
        let workload = |told_ends| {
            Conversations::single(&populations)
                .map(|c| Workload::new(stamps.clone(), &keys, c, told_ends))
        };
        let (told, untold) = (workload(true)?, workload(false)?);
        let rate = |blocks: f64| blocks * keys.block_size() as f64 / keys.prompt_tokens() as f64;
        for &num_blocks in &sizes {
            let (keys, told, untold) = (&keys, &told, &untold);
            let [lru, return_time, best, told, bound] = std::thread::scope(|s| {
                let run = |kind| s.spawn(move || cache_only(keys, num_blocks, kind).token_hit_rate);
                let runs = [
                    run(EvictionPolicyKind::Lru),
                    run(EvictionPolicyKind::ReturnTime),
                    s.spawn(move || belady(keys, num_blocks).token_hit_rate),
                    s.spawn(move || rate(told.bound(num_blocks, iterations))),
                    s.spawn(move || rate(untold.bound(num_blocks, iterations))),
                ];
                runs.map(|h| h.join().expect("a replay"))
            });
            let (told, bound) = (told.min(best), bound.min(best));
            let pct = |x: f64| format!("{:.2}%", 100.0 * x);
            let share = |x: f64| {
                if (best - lru).abs() > 1e-9 {
                    format!("{:.1}%", 100.0 * (x - lru) / (best - lru))
                } else {
                    "-".to_string()
                }
            };
            println!(
                "| {name}, {num_blocks} | {} | {} | {} | {} | {} | {} / {} / {} |",
                pct(lru),
                pct(return_time),
                pct(told),
                pct(bound),
                pct(best),
                share(return_time),
                share(told),
                share(bound),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small workload: a few dozen conversations over two system prompts.
    fn small() -> (ChatConfig, BlockKeys, Vec<u64>) {
        let config = ChatConfig {
            conversations: 40,
            system_prompts: 2,
            turns: (3, 6),
            mean_interarrival_ms: 2_000.0,
            turn_gap_ms: (5_000, 30_000),
            ..ChatConfig::default()
        };
        let trace = config.generate(7);
        let stamps = trace.requests.iter().map(|r| r.timestamp).collect();
        let keys = BlockKeys::new(&trace.requests, SimConfig::default().block_size);
        (config, keys, stamps)
    }

    fn workload(told_ends: bool) -> (Workload, BlockKeys) {
        let (config, keys, stamps) = small();
        let conversations = Conversations::single(&[config]).expect("one population");
        (Workload::new(stamps, &keys, conversations, told_ends), keys)
    }

    #[test]
    fn a_conversation_goes_on_by_its_turn_counts_range() {
        let c = Conversations::single(&[ChatConfig::long_think()]).expect("one population");
        assert_eq!(c.turns, (3, 12));
        assert_eq!(c.goes_on(1), 1.0);
        assert_eq!(c.goes_on(2), 1.0);
        assert_eq!(c.goes_on(3), 0.9);
        assert_eq!(c.goes_on(11), 0.5);
        assert_eq!(c.goes_on(12), 0.0);
        assert_eq!(c.within(59_999), 0.0);
        assert_eq!(c.within(60_000), 1.0 / 540_001.0);
        assert_eq!(c.within(329_999), 270_000.0 / 540_001.0);
        assert_eq!(c.within(600_000), 1.0);
        assert_eq!(c.within(700_000), 1.0);
    }

    #[test]
    fn two_populations_or_one_turn_are_refused() {
        let mixed = generated_workload("chat-under-flood").expect("a workload");
        assert!(Conversations::single(&mixed).is_err());
        assert!(Conversations::single(&[ChatConfig::prompt_flood()]).is_err());
    }

    #[test]
    fn told_the_ends_a_cache_that_holds_everything_is_bounded_by_every_return() {
        let (told, keys) = workload(true);
        let num_blocks = 1 << 20;
        let every_return: u64 = belady(&keys, num_blocks).hit_blocks_by_request.iter().sum();
        assert!(every_return > 0);
        let bound = told.bound(num_blocks, 200);
        assert!(
            (bound - every_return as f64).abs() < 1e-6 * every_return as f64,
            "{bound} against {every_return}"
        );
    }

    #[test]
    fn the_bound_rises_with_the_cache_and_with_what_the_policy_is_told() {
        let ((told, keys), (untold, _)) = (workload(true), workload(false));
        let every_return: u64 = belady(&keys, 1 << 20).hit_blocks_by_request.iter().sum();
        let small = untold.bound(64, 1500);
        let large = untold.bound(256, 1500);
        let told = told.bound(256, 1500);
        assert!(0.0 < small && small < large, "{small} then {large}");
        assert!(
            large < told && told < every_return as f64,
            "{large}, {told}"
        );
    }

    /// Three requests of three conversations, think times of 1 to 100 ms:
    /// the first two leave two blocks each, the third arrives 50 ms later
    /// with room for one block besides its own.
    fn one_slot_at_half_time() -> Workload {
        Workload {
            stamps: vec![0, 0, 50],
            conversation: vec![0, 1, 2],
            own: vec![0.0, 0.0, 9.0],
            waits: (0..2)
                .map(|last_use| Wait {
                    last_use,
                    shared_until: None,
                    blocks: 2.0,
                    comes_back: 1.0,
                })
                .collect(),
            conversations: Conversations {
                think_ms: (1, 100),
                turns: (2, 2),
            },
        }
    }

    #[test]
    fn the_bound_meets_the_linear_programs_optimum_by_hand() {
        // Each block comes back by the third request with chance 1/2 and
        // is held across it with chance 1/2; the one block of room holds
        // one conversation's two past it: 2 x 1/2 + 2 x 1/2 + 2 x 1/2 = 3
        // (the dual's price 1 at the third request attains it).
        let bound = one_slot_at_half_time().bound(10, 1500);
        assert!((bound - 3.0).abs() < 1e-3, "{bound}");
        // With room for both, every block; with none, only the half.
        assert!((one_slot_at_half_time().bound(11, 1500) - 4.0).abs() < 1e-3);
        assert!((one_slot_at_half_time().bound(9, 1500) - 2.0).abs() < 1e-3);
    }
}
