//! `adaptive`: ARC or residency, whichever would hit more, judged online on
//! two small shadow caches of sampled blocks (set dueling, as DIP does for
//! insertion policies in processor caches, Qureshi et al., ISCA'07).
//!
//! ```text
//!   every request ──▶ its blocks whose hash falls in the sample (1 in `rate`)
//!                      ├─▶ shadow cache under ARC        (num_blocks / rate blocks)
//!                      └─▶ shadow cache under residency  (num_blocks / rate blocks)
//!   the real cache follows the rule whose shadow has more hits (decayed),
//!   once it leads the rule in force by more than sqrt(hits of both),
//!   or ten times that to leave ARC; it starts under residency
//! ```
//!
//! Both rules classify every block all the time (see [`OnceReused`]): a
//! switch changes only which of the lists gives the next victim, and finds
//! the new rule's classes up to date, so following a narrow lead that turns
//! out wrong costs only the victims chosen meanwhile, and the residents a
//! spell under ARC evicted, which residency rebuilds at once when it comes
//! back.
//!
//! Under residency the real cache keeps what ARC would keep longest where
//! residency is indifferent ([`ResidencyOrder::SpareReused`]; the residency
//! shadow runs the rule as it is): its probation gives up ARC's seen-once
//! blocks before ARC's reused ones.
//!
//! The lead needed to switch is one standard deviation of the difference
//! of the two scores (as counts, sqrt(a + b)): two rules that hit about as
//! often swap the lead back and forth on sampling noise, and each swap
//! costs victims the other rule would have kept. Leaving ARC for residency
//! takes ten ([`LEAVE_ARC_LEAD`]): on traffic that ARC serves best (the
//! Mooncake trace) residency's shadow can lead for hundreds of requests
//! while the real cache, filled by ARC, would lose under residency what
//! its later requests come back to. Such a lead comes in bursts (a few hot
//! chains whose sampled blocks hit together, so the count overstates the
//! evidence): the trace at 11,585 blocks, hash seed 0, switches to ARC at
//! request 420, and in the next 360 requests residency's shadow gains 187
//! hits to ARC's 14, 6.2 deviations; with six, four hash seeds in ten go
//! back to residency and end 3.6% below ARC, with seven one does, with
//! eight or ten none; residency on its own traffic leads by far more
//! (multiturn: the same figures with six deviations or ten).
//!
//! The start is residency's because, until the shadows differ, residency's
//! victims (blocks of cold requests, in release order) are the ones both
//! rules agree on first: looping traffic ties the shadows for its first
//! turnover or so (nothing has come back yet), and time lost under ARC
//! there is what residency cannot rebuild quickly (its residents), while
//! traffic that favours ARC shows it within a few hundred requests.
//!
//! Sampling by hash (SHARDS, Waldspurger et al., FAST'15) keeps each
//! sampled block's whole history, so a shadow of `1/rate` of the cache sees
//! `1/rate` of the traffic with its reuse distances scaled alike. A shadow is
//! the cache-only model (one request at a time, tail-first release) over the
//! sampled blocks, with the real rule's own code (its witnesses picked by
//! fingerprint: [`Witnesses`]); a hit is any cached sampled block (the
//! leading-run condition is not checked: the sample keeps too few blocks
//! of a chain to tell). Residency's one decision per
//! request, warm or cold, is taken from where the sampled blocks lie in
//! the whole prompt, and leans warm (see `warm`): with it the duel stays
//! under residency on `chat-under-flood` at 65,535 blocks, which the count
//! of a handful of sampled blocks sent to ARC for a third of the run (9%
//! below residency on its worst hash seed), and follows ARC sooner on the
//! Mooncake trace, where a shadow that keeps more scores residency lower
//! at most sizes.
//!
//! The rate is the smallest power of two that keeps the shadows within
//! [`SHADOW_BLOCKS`] blocks, and at least [`MIN_RATE`], so the shadows add
//! at most 2/16 of the rule's own work per block. Scores halve every
//! [`DECAY_PER_BLOCK`] sampled accesses per shadow block, so the choice
//! follows the workload as it changes. Deterministic: the same calls (and
//! hash seed) give the same choices.
//!
//! Memory: two shadows of at most 4,096 blocks, each an
//! [`OnceReused`] (about 160 bytes a block) and a map from hash to
//! block (about 45): some 205 bytes a shadow block, at most 1.7 MB per
//! cache, 26 bytes per block of a 16,383-block cache.

use rustc_hash::FxHashMap;

use super::once_reused::{OnceReused, ResidencyOrder, Rule, Witnesses};
use super::{EvictionPolicy, Retention};
use crate::alloc::filled;
use crate::error::Result;
use crate::hash::BlockHash;
use crate::ids::BlockId;

/// Largest shadow cache, in blocks.
const SHADOW_BLOCKS: usize = 4096;
/// Smallest sampling rate: at most 1 block in this many is sampled.
const MIN_RATE: usize = 16;
/// Scores halve after this many sampled accesses per shadow block.
const DECAY_PER_BLOCK: u64 = 64;
/// Residency must lead by this many standard deviations for the real cache
/// to leave ARC (see the module docs: residency's leads on ARC's traffic
/// come in bursts); other switches take one.
const LEAVE_ARC_LEAD: u64 = 10;

/// A shadow's key for a block hash: its low 64 bits (sampling looks at the
/// high ones).
fn key(hash: &BlockHash) -> u64 {
    hash.0 as u64
}

/// Whether a shadow takes a request as warm (residency keeps its new
/// blocks), seen from its sampled blocks: found at `places` of a prompt of
/// `prompt_len` blocks, the first `hit` of them cached. Warm unless a
/// sampled block in the first half of the prompt is missing, where the
/// rule asks for half of the prompt cached: the unsampled blocks before
/// the first missing sampled one get the benefit of the doubt, so the
/// shadow keeps more requests than the rule would (at 1 in 16, a prompt
/// of 24 blocks, none cached, that has a sampled block at all has none in
/// its first half about one time in three). Chosen by measurement, not
/// derived: counting half of the sampled blocks, or judging on the middle
/// of the range the cached run may end in, keeps about as many requests as
/// the rule, but sends the duel to ARC where residency wins.
fn warm(places: &[usize], hit: usize, prompt_len: usize) -> bool {
    let first_miss = places.get(hit).copied().unwrap_or(prompt_len);
    2 * first_miss >= prompt_len
}

/// A cache-only model of the sampled blocks under one rule.
#[derive(Debug)]
struct Shadow {
    policy: OnceReused,
    /// Hash (its low 64 bits) -> shadow block, and back.
    block_of: FxHashMap<u64, BlockId>,
    hash_of: Vec<u64>,
    /// Shadow blocks never used yet.
    fresh: Vec<BlockId>,
    /// Blocks the current request holds.
    held: Vec<BlockId>,
    /// Hits, halved now and then.
    score: u64,
}

impl Shadow {
    fn new(num_blocks: usize, rule: Rule) -> Result<Self> {
        Ok(Self {
            policy: {
                let mut policy = OnceReused::new(num_blocks, rule)?;
                policy.set_witnesses(Witnesses::ByFingerprint);
                policy
            },
            block_of: FxHashMap::default(),
            hash_of: filled(num_blocks, 0, "a shadow cache")?,
            fresh: (0..num_blocks as BlockId).rev().collect(),
            held: Vec::new(),
            score: 0,
        })
    }

    /// Serves one request's sampled blocks (`hashes`, found at `places` of
    /// a prompt of `prompt_len` blocks): hits, then stores, then releases
    /// all of them tail first, as the manager does.
    fn serve(&mut self, hashes: &[BlockHash], places: &[usize], prompt_len: usize) {
        debug_assert_eq!(hashes.len(), places.len());
        let hit = hashes
            .iter()
            .take_while(|h| self.block_of.contains_key(&key(h)))
            .count();
        let retention = self
            .policy
            .on_judged_request(hashes, hit, warm(places, hit, prompt_len));
        self.held.clear();
        for h in hashes {
            if let Some(&b) = self.block_of.get(&key(h)) {
                // Every cached block is evictable between requests: one
                // that is not was taken earlier in this request.
                if self.policy.is_evictable(b) {
                    self.policy.remove(b);
                    self.policy.on_hit(b);
                    self.score += 1;
                    self.held.push(b);
                }
                continue;
            }
            let b = match self.fresh.pop() {
                Some(b) => b,
                None => match self.policy.evict() {
                    Some(b) => {
                        self.block_of.remove(&self.hash_of[b as usize]);
                        b
                    }
                    // The request holds every shadow block: the rest stays out.
                    None => break,
                },
            };
            self.block_of.insert(key(h), b);
            self.hash_of[b as usize] = key(h);
            self.policy.on_store(b, *h, retention, None);
            self.held.push(b);
        }
        for &b in self.held.iter().rev() {
            self.policy.insert(b);
        }
    }
}

/// The real cache under whichever rule wins on the shadows (see the module
/// docs).
#[derive(Debug)]
pub(crate) struct Adaptive {
    real: OnceReused,
    /// Under ARC, under residency.
    shadows: [Shadow; 2],
    /// A block is sampled when `hash >> 64` is 0 modulo the rate (a power of two).
    sample_mask: u64,
    /// The request's sampled blocks, and their places in its prompt.
    sampled: Vec<BlockHash>,
    sampled_places: Vec<usize>,
    /// Sampled accesses since the scores last halved, and how many halve them.
    accesses: u64,
    decay_after: u64,
}

impl Adaptive {
    pub(crate) fn new(num_blocks: usize) -> Result<Self> {
        let rate = num_blocks
            .div_ceil(SHADOW_BLOCKS)
            .max(MIN_RATE)
            .next_power_of_two();
        let shadow_blocks = (num_blocks / rate).max(1);
        Ok(Self {
            real: {
                let mut real = OnceReused::new(num_blocks, Rule::Residency)?;
                real.set_residency_order(ResidencyOrder::SpareReused);
                real
            },
            shadows: [
                Shadow::new(shadow_blocks, Rule::Arc)?,
                Shadow::new(shadow_blocks, Rule::Residency)?,
            ],
            sample_mask: rate as u64 - 1,
            sampled: Vec::new(),
            sampled_places: Vec::new(),
            accesses: 0,
            decay_after: DECAY_PER_BLOCK * shadow_blocks as u64,
        })
    }

    /// The rule the real cache follows now.
    #[cfg(test)]
    fn rule(&self) -> Rule {
        self.real.rule()
    }
}

impl EvictionPolicy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn on_request(&mut self, hashes: &[BlockHash], hit: usize) -> Retention {
        let mask = self.sample_mask;
        self.sampled.clear();
        self.sampled_places.clear();
        for (place, h) in hashes.iter().enumerate() {
            if (h.0 >> 64) as u64 & mask == 0 {
                self.sampled.push(*h);
                self.sampled_places.push(place);
            }
        }
        if !self.sampled.is_empty() {
            for shadow in &mut self.shadows {
                shadow.serve(&self.sampled, &self.sampled_places, hashes.len());
            }
            self.accesses += self.sampled.len() as u64;
            if self.accesses >= self.decay_after {
                self.accesses = 0;
                for shadow in &mut self.shadows {
                    shadow.score /= 2;
                }
            }
            let [arc, residency] = [self.shadows[0].score, self.shadows[1].score];
            let (leader, lead) = if arc > residency {
                (Rule::Arc, arc - residency)
            } else {
                (Rule::Residency, residency - arc)
            };
            // Leads in standard deviations, squared: lead^2 / (a + b).
            let deviations = match (self.real.rule(), leader) {
                (Rule::Arc, Rule::Residency) => LEAVE_ARC_LEAD,
                _ => 1,
            };
            let noise = (arc + residency).saturating_mul(deviations * deviations);
            if lead.saturating_mul(lead) > noise {
                self.real.set_rule(leader);
            }
        }
        self.real.on_request(hashes, hit)
    }

    fn on_store(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        retention: Retention,
        parent: Option<BlockId>,
    ) {
        self.real.on_store(block, hash, retention, parent);
    }

    fn insert(&mut self, block: BlockId) {
        self.real.insert(block);
    }

    fn remove(&mut self, block: BlockId) {
        self.real.remove(block);
    }

    fn evict(&mut self) -> Option<BlockId> {
        self.real.evict()
    }

    fn evict_many(&mut self, n: usize, out: &mut Vec<BlockId>) -> usize {
        self.real.evict_many(n, out)
    }

    fn on_hit(&mut self, block: BlockId) {
        self.real.on_hit(block);
    }

    fn forget(&mut self, block: BlockId) {
        self.real.forget(block);
    }

    fn len(&self) -> usize {
        self.real.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A well-mixed 128-bit hash of block `i` of session `s`.
    fn hash(s: u64, i: u64) -> BlockHash {
        let mut x = s.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 31)).wrapping_mul(0x94D0_49BB_1331_11EB);
        BlockHash((u128::from(x ^ (x >> 29)) << 64) | u128::from(x))
    }

    /// Serves `prompt` through `p` as the cache-only model does, with a
    /// cache of `cached` (hash -> block) and `free` blocks; returns the hits.
    fn serve(
        p: &mut Adaptive,
        prompt: &[BlockHash],
        cached: &mut FxHashMap<u128, BlockId>,
        hash_of: &mut FxHashMap<BlockId, u128>,
        free: &mut Vec<BlockId>,
    ) -> usize {
        let hit = prompt
            .iter()
            .take_while(|h| cached.contains_key(&h.0))
            .count();
        let retention = p.on_request(prompt, hit);
        let mut held = Vec::new();
        for h in &prompt[..hit] {
            let b = cached[&h.0];
            p.remove(b);
            p.on_hit(b);
            held.push(b);
        }
        for h in &prompt[hit..] {
            if cached.contains_key(&h.0) {
                continue; // cached past a miss: left where it is
            }
            let b = free.pop().or_else(|| p.evict()).expect("a victim");
            if let Some(old) = hash_of.insert(b, h.0) {
                cached.remove(&old);
            }
            cached.insert(h.0, b);
            p.on_store(b, *h, retention, None);
            held.push(b);
        }
        for &b in held.iter().rev() {
            p.insert(b);
        }
        hit
    }

    #[test]
    fn sessions_looping_through_more_than_the_cache_switch_to_residency() {
        // 1,024 blocks (shadows of 64, 1 block in 16 sampled); 40 sessions
        // of 64 blocks resent round robin: 2.5 cache-fulls, so ARC and LRU
        // keep nothing until a session comes back.
        let mut p = Adaptive::new(1024).unwrap();
        assert_eq!((p.sample_mask, p.rule()), (15, Rule::Residency));
        let (mut cached, mut hash_of) = (FxHashMap::default(), FxHashMap::default());
        let mut free: Vec<BlockId> = (0..1024).collect();
        let sessions: Vec<Vec<BlockHash>> = (0..40)
            .map(|s| (0..64).map(|i| hash(s, i)).collect())
            .collect();
        let mut hits = Vec::new();
        for round in 0..30 {
            let mut round_hits = 0;
            for prompt in &sessions {
                round_hits += serve(&mut p, prompt, &mut cached, &mut hash_of, &mut free);
            }
            hits.push(round_hits);
            if round == 0 {
                assert_eq!(round_hits, 0);
            }
        }
        assert_eq!(p.rule(), Rule::Residency);
        assert!(p.shadows[1].score > p.shadows[0].score);
        // Residents hit every round now: a stable share of the sessions.
        assert!(hits[20..].iter().all(|&h| h >= 5 * 64), "{hits:?}");
    }

    #[test]
    fn the_real_cache_follows_the_shadow_that_hits_more() {
        let mut p = Adaptive::new(1024).unwrap();
        let sampled = (0..)
            .map(|i| hash(7, i))
            .find(|h| (h.0 >> 64) as u64 & p.sample_mask == 0)
            .unwrap();
        assert_eq!(p.rule(), Rule::Residency, "the start");
        p.shadows[0].score = 10;
        p.on_request(&[sampled], 0);
        assert_eq!(p.rule(), Rule::Arc);
        // A tie keeps the rule in force (both shadows hit the block again:
        // +1 each).
        p.shadows[1].score = p.shadows[0].score;
        p.on_request(&[sampled], 1);
        assert_eq!(p.rule(), Rule::Arc);
        // Leaving ARC takes ten deviations: lead^2 > 10 x 10 x (a + b).
        p.shadows[1].score += 119; // 131 against 12 once served: 119 x 119 < 100 x 143
        p.on_request(&[sampled], 1);
        assert_eq!(p.rule(), Rule::Arc);
        p.shadows[1].score += 3; // 135 against 13: 122 x 122 > 100 x 148
        p.on_request(&[sampled], 1);
        assert_eq!(p.rule(), Rule::Residency);
        assert_eq!(p.real.residency_order(), ResidencyOrder::SpareReused);
        // Back to ARC on one deviation.
        p.shadows[0].score += 18; // 32 against 136
        p.on_request(&[sampled], 1);
        assert_eq!(p.rule(), Rule::Residency, "ARC does not lead");
        p.shadows[0].score = 146; // 147 against 137: 10 x 10 < 284
        p.on_request(&[sampled], 1);
        assert_eq!(p.rule(), Rule::Residency, "a lead within the noise");
        p.shadows[0].score = 160; // 161 against 138: 23 x 23 > 299
        p.on_request(&[sampled], 1);
        assert_eq!(p.rule(), Rule::Arc);
        // Unsampled blocks are not shown to the shadows.
        let unsampled = (0..)
            .map(|i| hash(8, i))
            .find(|h| (h.0 >> 64) as u64 & p.sample_mask != 0)
            .unwrap();
        let scores = [p.shadows[0].score, p.shadows[1].score];
        p.on_request(&[unsampled; 4], 0);
        assert_eq!([p.shadows[0].score, p.shadows[1].score], scores);
        assert!(p
            .shadows
            .iter()
            .all(|s| !s.block_of.contains_key(&key(&unsampled))));
    }

    #[test]
    fn a_request_is_judged_on_its_sampled_blocks_places_in_the_prompt() {
        // Half of the sampled blocks hit, but the one missing lies in the
        // first third of the prompt: most of it is uncached.
        assert!(!warm(&[10, 30], 1, 100));
        // One sampled block in three hit, and none of the first half missed.
        assert!(warm(&[40, 60, 70], 1, 100));
        // All hit, none hit.
        assert!(warm(&[10, 30], 2, 100));
        assert!(!warm(&[10, 30], 0, 100));
        // A run of 50 cached blocks of 100 is warm for the rule itself
        // (2 x 50 >= 100): the first miss at place 50 is, at 49 is not.
        assert!(warm(&[50], 0, 100));
        assert!(!warm(&[49], 0, 100));
    }

    #[test]
    fn the_residency_shadow_keeps_what_its_judgement_calls_warm() {
        let mut shadow = Shadow::new(64, Rule::Residency).unwrap();
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| hash(9, i));
        // Sampled blocks at places 10 (and 30, and so on) of prompts of 64
        // blocks. Nothing cached: cold, on probation.
        shadow.serve(&[a], &[10], 64);
        assert_eq!(shadow.policy.kept(), 0);
        // `a` hits and is kept; `b`, the first miss, lies in the first
        // half: cold, although one sampled block of two hit.
        shadow.serve(&[a, b], &[10, 30], 64);
        assert_eq!((shadow.score, shadow.policy.kept()), (1, 1));
        // The first miss lies in the second half: warm, although one
        // sampled block of three hit; `c` and `d` are kept.
        shadow.serve(&[a, c, d], &[10, 40, 50], 64);
        assert_eq!((shadow.score, shadow.policy.kept()), (2, 3));
    }

    #[test]
    fn shadows_stay_within_4096_blocks() {
        for num_blocks in [1, 100, 4096, 65_536, 69_631, 1 << 20] {
            let p = Adaptive::new(num_blocks).unwrap();
            let blocks = p.shadows[0].hash_of.len();
            assert!(blocks <= SHADOW_BLOCKS, "{num_blocks}: {blocks}");
            assert!(p.sample_mask >= MIN_RATE as u64 - 1);
            assert_eq!(blocks, (num_blocks / (p.sample_mask as usize + 1)).max(1));
        }
    }

    #[test]
    fn scores_decay_so_old_hits_stop_counting() {
        let mut p = Adaptive::new(64 * 16).unwrap(); // shadows of 64 blocks
        let sampled = |s: u64| -> Vec<BlockHash> {
            (0..)
                .map(|i| hash(s, i))
                .filter(|h| (h.0 >> 64) as u64 & 15 == 0)
                .take(8)
                .collect()
        };
        // One prompt over and over: every shadow hits it.
        let hot = sampled(0);
        for _ in 0..100 {
            p.on_request(&hot, 0);
        }
        let hits = p.shadows[0].score;
        assert!(hits >= 99 * 8 / 2, "{hits}");
        // Then one-off prompts only, for four decay periods: no more hits,
        // and the old ones have halved at least four times.
        let mut s = 1;
        let mut accesses = 0;
        while accesses < 4 * p.decay_after {
            p.on_request(&sampled(s), 0);
            accesses += 8;
            s += 1;
            for shadow in &p.shadows {
                assert!(shadow.block_of.len() <= 64);
            }
        }
        assert!(
            p.shadows.iter().all(|sh| sh.score <= hits / 16),
            "{}",
            p.shadows[0].score
        );
    }
}
