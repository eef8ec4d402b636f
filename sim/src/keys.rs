//! Which prompt blocks of a trace are the same block: each full block of a
//! prompt gets a dense key, equal for two blocks exactly when their tokens
//! and every token before them are equal (the prefix cache's notion of one
//! block).
//!
//! With the trace's token rule (see [`super::trace`]) the tokens of block `i`
//! are a function of `i` and the hash ids it overlaps, so a key is a chain
//! hash over those, as the manager chains its block hashes over tokens:
//!
//! ```text
//!   k[-1] = 0
//!   k[i]  = xxh3_128(k[i-1] | i | hash ids overlapping tokens [i*B, (i+1)*B))
//! ```

use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::xxh3_128;

use super::trace::{TraceRequest, HASH_BLOCK_TOKENS};
use mla_cache::BlockHash;

/// One request's view: its prompt length and the keys of its full blocks.
#[derive(Debug, Clone)]
pub struct RequestKeys {
    /// Prompt tokens.
    pub input_length: usize,
    /// Dense keys of the prompt's full blocks, in order.
    pub keys: Vec<u32>,
}

/// The full prompt blocks of a workload as dense keys `0..num_keys()`.
#[derive(Debug, Clone)]
pub struct BlockKeys {
    block_size: usize,
    requests: Vec<RequestKeys>,
    hashes: Vec<BlockHash>,
}

impl BlockKeys {
    /// Keys of the prompts of `requests` (in order) cut into blocks of
    /// `block_size` tokens. Panics if `block_size` is 0.
    pub fn new(requests: &[TraceRequest], block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        let mut dense: FxHashMap<u128, u32> = FxHashMap::default();
        let mut hashes = Vec::new();
        let mut buf = Vec::new();
        let requests = requests
            .iter()
            .map(|r| {
                let full = r.input_length / block_size;
                let mut parent = 0u128;
                let keys = (0..full)
                    .map(|i| {
                        buf.clear();
                        buf.extend_from_slice(&parent.to_le_bytes());
                        buf.extend_from_slice(&(i as u64).to_le_bytes());
                        let first = i * block_size / HASH_BLOCK_TOKENS;
                        let last = ((i + 1) * block_size - 1) / HASH_BLOCK_TOKENS;
                        for id in &r.hash_ids[first..=last] {
                            buf.extend_from_slice(&id.to_le_bytes());
                        }
                        parent = xxh3_128(&buf);
                        *dense.entry(parent).or_insert_with(|| {
                            hashes.push(BlockHash(parent));
                            hashes.len() as u32 - 1
                        })
                    })
                    .collect();
                RequestKeys {
                    input_length: r.input_length,
                    keys,
                }
            })
            .collect();
        Self {
            block_size,
            requests,
            hashes,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Distinct blocks in the workload.
    pub fn num_keys(&self) -> usize {
        self.hashes.len()
    }

    /// Prompt tokens of all requests.
    pub fn prompt_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.input_length as u64).sum()
    }

    /// The requests, in order.
    pub fn requests(&self) -> &[RequestKeys] {
        &self.requests
    }

    /// The hash standing for key `key` (what a policy sees on a store).
    pub(crate) fn hash(&self, key: u32) -> BlockHash {
        self.hashes[key as usize]
    }

    /// Full blocks of request `r` that a hit may cover: the prompt's last
    /// token is always recomputed, as in the manager's default.
    pub fn hit_limit(&self, r: &RequestKeys) -> usize {
        ((r.input_length - 1) / self.block_size).min(r.keys.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(input_length: usize, hash_ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp: 0,
            input_length,
            output_length: 1,
            hash_ids: hash_ids.to_vec(),
        }
    }

    #[test]
    fn equal_keys_mean_equal_prefixes() {
        let reqs = [req(1024, &[1, 2]), req(1000, &[1, 3]), req(512, &[2])];
        let k = BlockKeys::new(&reqs, 256);
        let r = k.requests();
        assert_eq!(r[0].keys.len(), 4);
        assert_eq!(r[1].keys.len(), 3, "only full blocks");
        assert_eq!(r[0].keys[..2], r[1].keys[..2], "hash id 1 is shared");
        assert_ne!(r[0].keys[2], r[1].keys[2]);
        // Hash id 2 at another position is another block.
        assert!(!r[0].keys.contains(&r[2].keys[0]));
        assert_eq!(k.num_keys(), 4 + 1 + 2);
        assert_eq!(k.hit_limit(&r[0]), 3);
        assert_eq!(k.hit_limit(&r[1]), 3);
        assert_eq!(k.prompt_tokens(), 2536);
    }

    #[test]
    fn blocks_larger_than_a_hash_block_cover_every_id() {
        let reqs = [req(2048, &[1, 2, 3, 4]), req(2048, &[1, 5, 3, 4])];
        let k = BlockKeys::new(&reqs, 1024);
        let r = k.requests();
        assert_ne!(r[0].keys[0], r[1].keys[0]);
        assert_ne!(
            r[0].keys[1], r[1].keys[1],
            "chained: a differing parent differs"
        );
    }
}
