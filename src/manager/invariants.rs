//! The block manager's invariants, written down once: the requests and the
//! pool here, the prefix cache's own in `prefix_cache/invariants.rs`.

use super::BlockManager;
use crate::hash::Chain;
use crate::ids::BlockId;

impl BlockManager {
    /// Checks every bookkeeping invariant; for tests of this crate and of its
    /// bindings. Returns a description of the first violation.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let st = self.state.lock();
        let n = self.config.num_blocks;
        let mut refs = vec![0u32; n];
        for (id, r) in &st.requests {
            let holding = self.blocks_for(r.len);
            if r.tokens.len() > r.len || (r.tokens.len() < r.len && !r.caller_hashed) {
                return Err(format!(
                    "request {id} knows {} of its {} tokens",
                    r.tokens.len(),
                    r.len
                ));
            }
            if r.blocks.len() < holding {
                return Err(format!("request {id} has too few blocks"));
            }
            for &b in &r.blocks {
                refs[b as usize] += 1;
            }
            for &b in &r.blocks[holding..] {
                if st.pool.ref_count(b) != 1 || st.cache.slots[b as usize].is_cached() {
                    return Err(format!(
                        "request {id}: reserved block {b} is shared or hashed"
                    ));
                }
            }
            let upto = r.num_computed / self.config.block_size;
            if r.caller_hashed {
                // The caller's hasher may differ from the manager's: only the count is known.
                if r.chain.hashes.len() > upto {
                    return Err(format!("request {id}: hashes past its computed blocks"));
                }
            } else {
                let mut chain = Chain::default();
                if self.config.enable_prefix_caching {
                    let mut buf = Vec::new();
                    self.prefixes
                        .hasher
                        .extend_chain(&r.tokens, &r.keys, upto, &mut chain, &mut buf);
                }
                if chain.hashes != r.chain.hashes {
                    return Err(format!(
                        "request {id}: stored hashes differ from its tokens' chain"
                    ));
                }
            }
            for (i, h) in r.chain.hashes.iter().enumerate() {
                if let Some(bh) = st.cache.slots[r.blocks[i] as usize].hash() {
                    if bh != *h {
                        return Err(format!(
                            "request {id}: block {i} indexed under another hash"
                        ));
                    }
                }
            }
        }
        let mut in_use = vec![0u32; n];
        for b in 0..n {
            let count = st.pool.ref_count(b as BlockId);
            if count != refs[b] {
                return Err(format!(
                    "block {b}: ref count {count} != {} tables",
                    refs[b]
                ));
            }
            in_use[b] = u32::from(count > 0);
            let slot = &st.cache.slots[b];
            let listed = st.pool.unhashed.contains(b as BlockId);
            if listed != (slot.locks == 0 && !slot.is_cached()) {
                return Err(format!(
                    "block {b}: listed as never hashed is {listed}, yet {} locks and hash {:?}",
                    slot.locks,
                    slot.hash()
                ));
            }
        }
        self.prefixes.check(&st.cache, Some(&in_use))
    }
}
