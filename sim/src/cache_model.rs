//! The cache-only model: what an eviction policy keeps, with time and
//! concurrency taken out.
//!
//! Requests are served one at a time, in arrival order. Each looks up the
//! leading run of its prompt's full blocks that are cached (capped at
//! `len - 1` tokens, so the last token is recomputed), takes the cached ones
//! out of the evictable set, computes the rest into free blocks (evicting the
//! policy's victims) and releases all of them, tail first, before the next
//! request comes. The cache holds `num_blocks` blocks; partial blocks and
//! decode slots take none, and blocks of the running request are never
//! victims. These are the manager's rules with every request alone in the
//! cache, driven through the same [`EvictionPolicy`] calls, so a policy
//! behaves here as it does in the manager.
//!
//! [`super::belady`] computes the offline optimum of the same model.

use serde::Serialize;

use super::keys::BlockKeys;
use mla_cache::EvictionPolicy;
use mla_cache::EvictionPolicyKind;

const NONE: u32 = u32::MAX;

/// Hit rate of one policy (or of the offline bound) in the cache-only model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheModelReport {
    /// Policy name, or `belady` for the offline bound.
    pub policy: String,
    /// Blocks the cache holds.
    pub num_blocks: usize,
    /// Prompt tokens of all requests.
    pub prompt_tokens: u64,
    /// Of which served from the cache.
    pub hit_tokens: u64,
    /// `hit_tokens / prompt_tokens`.
    pub token_hit_rate: f64,
    /// Blocks each request found cached, in request order (for hit rates
    /// over part of a workload).
    #[serde(skip)]
    pub hit_blocks_by_request: Vec<u64>,
}

impl CacheModelReport {
    pub(crate) fn new(
        policy: &str,
        keys: &BlockKeys,
        num_blocks: usize,
        hit_blocks_by_request: Vec<u64>,
    ) -> Self {
        let prompt_tokens = keys.prompt_tokens();
        let hit_blocks: u64 = hit_blocks_by_request.iter().sum();
        let hit_tokens = hit_blocks * keys.block_size() as u64;
        Self {
            policy: policy.to_string(),
            num_blocks,
            prompt_tokens,
            hit_tokens,
            token_hit_rate: if prompt_tokens == 0 {
                0.0
            } else {
                hit_tokens as f64 / prompt_tokens as f64
            },
            hit_blocks_by_request,
        }
    }
}

/// Replays `keys` through a cache of `num_blocks` blocks evicting with `kind`.
pub fn cache_only(
    keys: &BlockKeys,
    num_blocks: usize,
    kind: EvictionPolicyKind,
) -> CacheModelReport {
    // The simulated caches' arrays are a few bytes per block.
    let mut policy = kind
        .build(num_blocks)
        .expect("the policy's arrays fit in memory");
    let hits = replay(keys, num_blocks, policy.as_mut());
    CacheModelReport::new(kind.name(), keys, num_blocks, hits)
}

/// The replay itself; returns the blocks each request hit.
fn replay(keys: &BlockKeys, num_blocks: usize, policy: &mut dyn EvictionPolicy) -> Vec<u64> {
    // key -> block holding it, block -> key it holds (NONE: unhashed).
    let mut block_of = vec![NONE; keys.num_keys()];
    let mut key_of = vec![NONE; num_blocks];
    let mut unhashed: Vec<u32> = (0..num_blocks as u32).rev().collect();
    let mut held: Vec<u32> = Vec::new();
    let mut hashes = Vec::new();
    let mut hit_blocks = Vec::with_capacity(keys.requests().len());
    for r in keys.requests() {
        let limit = keys.hit_limit(r);
        let hits = r.keys[..limit]
            .iter()
            .take_while(|&&k| block_of[k as usize] != NONE)
            .count();
        hit_blocks.push(hits as u64);
        hashes.clear();
        hashes.extend(r.keys.iter().map(|&k| keys.hash(k)));
        let retention = policy.on_request(&hashes, hits);
        held.clear();
        for &k in &r.keys[..hits] {
            let b = block_of[k as usize];
            policy.remove(b);
            policy.on_hit(b);
            held.push(b);
        }
        // All blocks are taken before any is stored, as the manager does.
        for _ in hits..r.keys.len() {
            let b = match unhashed.pop() {
                Some(b) => b,
                None => match policy.evict() {
                    Some(b) => {
                        block_of[key_of[b as usize] as usize] = NONE;
                        key_of[b as usize] = NONE;
                        b
                    }
                    // Every block holds this request: the rest stays uncached.
                    None => break,
                },
            };
            held.push(b);
        }
        for (j, (&k, &b)) in r.keys[hits..].iter().zip(&held[hits..]).enumerate() {
            // A key cached past a miss keeps its block; this copy stays unhashed.
            if block_of[k as usize] == NONE {
                block_of[k as usize] = b;
                key_of[b as usize] = k;
                let parent = (hits + j)
                    .checked_sub(1)
                    .map(|i| block_of[r.keys[i] as usize])
                    .filter(|&p| p != NONE);
                policy.on_store(b, keys.hash(k), retention, parent);
            }
        }
        for &b in held.iter().rev() {
            if key_of[b as usize] == NONE {
                unhashed.push(b);
            } else {
                policy.insert(b);
            }
        }
    }
    hit_blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRequest;
    use mla_cache::{AdmitOptions, BlockManager, CacheConfig};

    fn req(input_length: usize, hash_ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp: 0,
            input_length,
            output_length: 0,
            hash_ids: hash_ids.to_vec(),
        }
    }

    /// A small workload with shared prefixes, reuse and one-offs.
    fn workload(n: usize) -> Vec<TraceRequest> {
        let mut rng = crate::rng::SplitMix64::new(5);
        (0..n)
            .map(|_| {
                let len = rng.range(1, 6) as usize;
                let base = rng.range(0, 3) * 100;
                let mut ids: Vec<u64> = (0..len as u64).map(|i| base + i).collect();
                if rng.range(0, 1) == 0 {
                    *ids.last_mut().unwrap() = 1000 + rng.range(0, 50);
                }
                // Never a whole number of blocks: the manager's partial tail
                // is the one block it needs beyond the model's.
                let input = len * 512 - rng.range(1, 100) as usize;
                req(input, &ids)
            })
            .collect()
    }

    #[test]
    fn the_model_is_the_manager_with_one_request_at_a_time() {
        let reqs = workload(300);
        let bs = 128;
        let keys = BlockKeys::new(&reqs, bs);
        for (kind, num_blocks) in EvictionPolicyKind::ALL
            .into_iter()
            .flat_map(|k| [(k, 30), (k, 50), (k, 100)])
        {
            let model = cache_only(&keys, num_blocks, kind);
            // The manager needs one more block for each prompt's partial tail,
            // which it recycles from request to request.
            let mut c = CacheConfig::new(num_blocks + 1);
            c.block_size = bs;
            c.hash_seed = Some(1);
            c.eviction = kind;
            let m = BlockManager::new(c).unwrap();
            for (i, r) in reqs.iter().enumerate() {
                m.admit(i as u64, &r.prompt_tokens(), &AdmitOptions::default())
                    .unwrap();
                m.free(i as u64).unwrap();
            }
            let s = m.stats();
            if kind == EvictionPolicyKind::Lru {
                assert_eq!(model.hit_tokens, s.prefix_hit_tokens, "{num_blocks} blocks");
            } else {
                // The manager's policy is sized for one block more (its ghost
                // lists remember a little longer): close, not equal.
                let diff = model.hit_tokens.abs_diff(s.prefix_hit_tokens);
                assert!(
                    diff * 100 <= s.prefix_query_tokens,
                    "{kind}, {num_blocks} blocks: {} vs {}",
                    model.hit_tokens,
                    s.prefix_hit_tokens
                );
            }
            assert_eq!(model.prompt_tokens, s.prefix_query_tokens);
        }
    }

    #[test]
    fn more_blocks_never_hit_less_under_lru() {
        let keys = BlockKeys::new(&workload(300), 128);
        let rates: Vec<u64> = [5, 10, 20, 40, 80, 1000]
            .iter()
            .map(|&n| cache_only(&keys, n, EvictionPolicyKind::Lru).hit_tokens)
            .collect();
        assert!(rates.windows(2).all(|w| w[0] <= w[1]), "{rates:?}");
        assert!(rates[0] < rates[5]);
    }
}
