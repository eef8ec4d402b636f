//! vLLM v1's KV cache rules as integer arithmetic: what vLLM's
//! `KVCacheManager` decides in `allocate_slots`, `get_computed_blocks` and
//! `cache_blocks` for one full-attention group, apart from any Python object.
//!
//! The vLLM adapter (`mla_cache.vllm`) reads vLLM's request and scheduler
//! state and asks these rules; the block manager carries the decisions out.
//! Every count is in tokens or blocks; sums saturate, so no input a caller
//! chooses wraps.

use crate::{BlockId, Error, Result};

/// vLLM's block id of the block manager's block `id`: vLLM's pool keeps its
/// null block at id 0 (never handed out; the worker pads block tables with
/// it), so every cache block is shifted by one.
pub fn vllm_block_id(id: BlockId) -> usize {
    id as usize + 1
}

/// The block manager's id of vLLM's block `vllm_id` in a pool of
/// `num_vllm_blocks` (null block included); `None` for the null block or an
/// id outside the pool.
pub fn cache_block_id(vllm_id: usize, num_vllm_blocks: usize) -> Option<BlockId> {
    if vllm_id == 0 || vllm_id >= num_vllm_blocks {
        return None;
    }
    BlockId::try_from(vllm_id - 1).ok()
}

/// The settings vLLM's manager is built with that its rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VllmRules {
    block_size: usize,
    max_model_len: usize,
    reprefillable_tokens: usize,
    watermark_blocks: usize,
    caching: bool,
    use_eagle: bool,
}

/// A step's token counts (`VllmRules::span`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Tokens computed once the step's adopted tokens (a prefix hit, tokens
    /// a KV connector loads) count, capped at `max_model_len`.
    pub computed: usize,
    /// Slots the request holds after the step (computed, new and lookahead
    /// tokens), capped at `max_model_len`.
    pub slots: usize,
}

/// What a running request's step asks of the free blocks
/// (`VllmRules::step_fits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCheck {
    /// Blocks the step adds to the request's table.
    pub new_blocks: usize,
    /// Blocks the request holds.
    pub held_blocks: usize,
    /// Free blocks (cached or not) of the pool.
    pub free_blocks: usize,
    /// Blocks the scheduler keeps for others (`reserved_blocks`).
    pub reserved_blocks: usize,
    /// With `full_sequence_must_fit`: the request's whole length in tokens.
    pub full_sequence_tokens: Option<usize>,
}

/// What an admission asks of the free blocks (`VllmRules::admission_fits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionCheck {
    /// Blocks of the request's table after the admission, hit included.
    pub table_blocks: usize,
    /// Blocks of the prefix hit.
    pub hit_blocks: usize,
    /// Hit blocks no request holds (free but cached: taking them uses them up).
    pub free_hit_blocks: usize,
    /// Free blocks (cached or not) of the pool.
    pub free_blocks: usize,
    /// Blocks the scheduler keeps for others (`reserved_blocks`).
    pub reserved_blocks: usize,
    /// With `full_sequence_must_fit`: the request's whole length in tokens.
    pub full_sequence_tokens: Option<usize>,
}

impl VllmRules {
    /// Rules for blocks of `block_size` tokens (at least 2: an admission
    /// hands the block manager one token past the hit, which must not fill a
    /// block of its own), requests of at most `max_model_len` tokens, the
    /// last `reprefillable_tokens` computed tokens never cached (multi-module
    /// MTP prefills them again), `watermark_blocks` kept free when a waiting
    /// or preempted request is admitted beside scheduled ones, prefix caching
    /// on or off, and EAGLE's dropped last hit block.
    pub fn new(
        block_size: usize,
        max_model_len: usize,
        reprefillable_tokens: usize,
        watermark_blocks: usize,
        caching: bool,
        use_eagle: bool,
    ) -> Result<Self> {
        if block_size < 2 {
            return Err(Error::InvalidConfig(format!(
                "vLLM's block size must be at least 2 tokens, got {block_size}"
            )));
        }
        Ok(Self {
            block_size,
            max_model_len,
            reprefillable_tokens,
            watermark_blocks,
            caching,
            use_eagle,
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Whether blocks are shared by prefix.
    pub fn caching(&self) -> bool {
        self.caching
    }

    /// Blocks kept free for admissions beside scheduled requests.
    pub fn watermark_blocks(&self) -> usize {
        self.watermark_blocks
    }

    /// Blocks that hold `tokens` slots.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// A step's counts: `computed` tokens already computed, `adopted` more
    /// (a new hit, external tokens), then `new` tokens to compute and
    /// `lookahead` speculative slots.
    pub fn span(&self, computed: usize, adopted: usize, new: usize, lookahead: usize) -> Span {
        let computed = computed.saturating_add(adopted).min(self.max_model_len);
        let slots = computed
            .saturating_add(new)
            .saturating_add(lookahead)
            .min(self.max_model_len);
        Span { computed, slots }
    }

    /// Blocks a request holding `held_blocks` adds for `slots` slots.
    pub fn new_blocks(&self, slots: usize, held_blocks: usize) -> usize {
        self.blocks_for(slots).saturating_sub(held_blocks)
    }

    /// The watermark a request's admission keeps free: `watermark_blocks`
    /// when others are scheduled and it is waiting or was preempted, else 0.
    pub fn watermark(&self, has_scheduled_reqs: bool, waiting: bool) -> usize {
        if has_scheduled_reqs && waiting {
            self.watermark_blocks
        } else {
            0
        }
    }

    /// Whether a running request's step fits, keeping `watermark` blocks
    /// free: its new blocks within the free blocks less those reserved and,
    /// with a full sequence to fit, the whole sequence's blocks within the
    /// free blocks (checked, not reserved).
    pub fn step_fits(&self, check: StepCheck, watermark: usize) -> bool {
        let needed = check
            .new_blocks
            .saturating_add(watermark)
            .saturating_add(check.reserved_blocks);
        if needed > check.free_blocks {
            return false;
        }
        match check.full_sequence_tokens {
            Some(total) => {
                let whole = self.blocks_for(total.min(self.max_model_len));
                whole
                    .saturating_sub(check.held_blocks)
                    .saturating_add(watermark)
                    <= check.free_blocks
            }
            None => true,
        }
    }

    /// Whether an admission fits, keeping `watermark` blocks free: after it
    /// takes its new blocks and its hit's free blocks, the reserved blocks
    /// and the watermark stay free and, with a full sequence to fit, so do
    /// the rest of the sequence's blocks (checked, not reserved).
    pub fn admission_fits(&self, check: AdmissionCheck, watermark: usize) -> bool {
        let taken = check
            .table_blocks
            .saturating_sub(check.hit_blocks)
            .saturating_add(check.free_hit_blocks);
        let keep = check.reserved_blocks.saturating_add(watermark);
        if check.free_blocks < taken.saturating_add(keep) {
            return false;
        }
        let free_after = check.free_blocks - taken;
        match check.full_sequence_tokens {
            Some(total) => {
                let whole = self.blocks_for(total.min(self.max_model_len));
                free_after
                    >= whole
                        .saturating_sub(check.table_blocks)
                        .saturating_add(watermark)
            }
            None => true,
        }
    }

    /// The longest prefix hit, in tokens, a request of `num_tokens` tokens
    /// may read: its last token is always computed again (for its logits),
    /// and neither the request's own `hit_limit` (vLLM 0.34's
    /// `prefix_cache_hit_limit`: 0 skips the cache, a prompt-logprob request
    /// reads no further than its first scored token) nor the caller's
    /// `bound` is passed.
    pub fn max_cache_hit(
        &self,
        num_tokens: usize,
        hit_limit: Option<usize>,
        bound: Option<usize>,
    ) -> usize {
        let mut max = num_tokens.saturating_sub(1);
        for limit in [hit_limit, bound].into_iter().flatten() {
            max = max.min(limit);
        }
        max
    }

    /// Full blocks a lookup may search under `max_hit` tokens.
    pub fn lookup_blocks(&self, max_hit: usize) -> usize {
        max_hit / self.block_size
    }

    /// Blocks of a hit whose leading `found_blocks` are cached: all of them,
    /// less the last with EAGLE (its drafter needs the block's hidden states
    /// computed again).
    pub fn hit_blocks(&self, found_blocks: usize) -> usize {
        if self.use_eagle {
            found_blocks.saturating_sub(1)
        } else {
            found_blocks
        }
    }

    /// Full blocks a request may have committed (shareable) once
    /// `num_tokens` tokens are computed: those vLLM has hashed
    /// (`hashed_blocks` digests) and the request holds, less MTP's
    /// re-prefill tail; 0 with caching off.
    pub fn committable_blocks(
        &self,
        num_tokens: usize,
        hashed_blocks: usize,
        held_blocks: usize,
    ) -> usize {
        if !self.caching {
            return 0;
        }
        let tokens = num_tokens.saturating_sub(self.reprefillable_tokens);
        (tokens / self.block_size)
            .min(hashed_blocks)
            .min(held_blocks)
    }

    /// Computed tokens from which a request with `cached_blocks` committed
    /// may commit one more block (`usize::MAX` with caching off: never).
    /// Below it a step commits nothing, so it is a counter check.
    pub fn next_commit_at(&self, cached_blocks: usize) -> usize {
        if !self.caching {
            return usize::MAX;
        }
        cached_blocks
            .saturating_add(1)
            .saturating_mul(self.block_size)
            .saturating_add(self.reprefillable_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(block_size: usize) -> VllmRules {
        VllmRules::new(block_size, 1 << 20, 0, 0, true, false).unwrap()
    }

    #[test]
    fn the_null_block_shift_round_trips_and_refuses_the_null_block() {
        assert_eq!(vllm_block_id(0), 1);
        assert_eq!(cache_block_id(1, 10), Some(0));
        assert_eq!(cache_block_id(9, 10), Some(8));
        assert_eq!(cache_block_id(0, 10), None);
        assert_eq!(cache_block_id(10, 10), None);
        for b in 0..8 {
            assert_eq!(cache_block_id(vllm_block_id(b), 10), Some(b));
        }
    }

    #[test]
    fn a_block_size_under_two_is_refused() {
        assert!(VllmRules::new(1, 100, 0, 0, true, false).is_err());
        assert!(VllmRules::new(0, 100, 0, 0, true, false).is_err());
        assert!(VllmRules::new(2, 100, 0, 0, true, false).is_ok());
    }

    #[test]
    fn spans_are_capped_at_the_model_length_and_saturate() {
        let r = VllmRules::new(16, 100, 0, 0, true, false).unwrap();
        assert_eq!(
            r.span(10, 5, 20, 3),
            Span {
                computed: 15,
                slots: 38
            }
        );
        assert_eq!(
            r.span(90, 20, 5, 0),
            Span {
                computed: 100,
                slots: 100
            }
        );
        assert_eq!(
            r.span(usize::MAX, 1, usize::MAX, 1),
            Span {
                computed: 100,
                slots: 100
            }
        );
    }

    #[test]
    fn new_blocks_round_slots_up_and_never_go_negative() {
        let r = rules(16);
        assert_eq!(r.new_blocks(0, 0), 0);
        assert_eq!(r.new_blocks(1, 0), 1);
        assert_eq!(r.new_blocks(16, 0), 1);
        assert_eq!(r.new_blocks(17, 1), 1);
        assert_eq!(r.new_blocks(17, 5), 0);
    }

    #[test]
    fn the_watermark_applies_to_waiting_requests_beside_scheduled_ones() {
        let r = VllmRules::new(16, 1000, 0, 7, true, false).unwrap();
        assert_eq!(r.watermark(true, true), 7);
        assert_eq!(r.watermark(false, true), 0);
        assert_eq!(r.watermark(true, false), 0);
    }

    #[test]
    fn a_step_fits_within_the_free_blocks_less_the_reserved_and_the_watermark() {
        let r = rules(16);
        let check = |new, free, reserved| StepCheck {
            new_blocks: new,
            held_blocks: 2,
            free_blocks: free,
            reserved_blocks: reserved,
            full_sequence_tokens: None,
        };
        assert!(r.step_fits(check(3, 3, 0), 0));
        assert!(!r.step_fits(check(4, 3, 0), 0));
        assert!(!r.step_fits(check(3, 4, 2), 0));
        assert!(r.step_fits(check(2, 4, 2), 0));
        assert!(!r.step_fits(check(2, 4, 0), 3));
        // Reservations beyond the free blocks refuse even a step that adds
        // no block, as vLLM's signed comparison does.
        assert!(!r.step_fits(check(0, 1, 5), 0));
        assert!(r.step_fits(check(0, 5, 5), 0));
    }

    #[test]
    fn a_step_with_a_full_sequence_to_fit_checks_its_remaining_blocks() {
        let r = VllmRules::new(16, 64, 0, 0, true, false).unwrap();
        let check = |free, total| StepCheck {
            new_blocks: 1,
            held_blocks: 2,
            free_blocks: free,
            reserved_blocks: 0,
            full_sequence_tokens: Some(total),
        };
        // 100 tokens capped at 64: 4 blocks, 2 held, 2 to come.
        assert!(r.step_fits(check(2, 100), 0));
        assert!(!r.step_fits(check(1, 100), 0));
        assert!(!r.step_fits(check(2, 100), 1));
        assert!(r.step_fits(check(1, 20), 0));
    }

    #[test]
    fn an_admission_counts_its_free_hit_blocks_as_taken() {
        let r = rules(16);
        let check = |free, free_hit| AdmissionCheck {
            table_blocks: 5,
            hit_blocks: 3,
            free_hit_blocks: free_hit,
            free_blocks: free,
            reserved_blocks: 1,
            full_sequence_tokens: None,
        };
        // 2 new blocks and the reserved one.
        assert!(r.admission_fits(check(3, 0), 0));
        assert!(!r.admission_fits(check(2, 0), 0));
        // Two hit blocks are free but cached: they are taken too.
        assert!(!r.admission_fits(check(4, 2), 0));
        assert!(r.admission_fits(check(5, 2), 0));
        assert!(!r.admission_fits(check(5, 2), 1));
    }

    #[test]
    fn an_admission_with_a_full_sequence_to_fit_keeps_room_for_the_rest() {
        let r = rules(16);
        let check = |free| AdmissionCheck {
            table_blocks: 2,
            hit_blocks: 0,
            free_hit_blocks: 0,
            free_blocks: free,
            reserved_blocks: 0,
            full_sequence_tokens: Some(80),
        };
        // 80 tokens: 5 blocks, 2 taken now, 3 to come.
        assert!(r.admission_fits(check(5), 0));
        assert!(!r.admission_fits(check(4), 0));
        assert!(!r.admission_fits(check(5), 1));
        assert!(r.admission_fits(check(6), 1));
    }

    #[test]
    fn the_hit_is_bounded_by_the_last_token_the_request_limit_and_the_caller() {
        let r = rules(16);
        assert_eq!(r.max_cache_hit(100, None, None), 99);
        assert_eq!(r.max_cache_hit(100, Some(0), None), 0);
        assert_eq!(r.max_cache_hit(100, Some(40), None), 40);
        assert_eq!(r.max_cache_hit(100, Some(40), Some(20)), 20);
        assert_eq!(r.max_cache_hit(100, None, Some(200)), 99);
        assert_eq!(r.max_cache_hit(0, None, None), 0);
        assert_eq!(r.lookup_blocks(40), 2);
    }

    #[test]
    fn eagle_drops_the_last_hit_block() {
        let eagle = VllmRules::new(16, 1000, 0, 0, true, true).unwrap();
        assert_eq!(eagle.hit_blocks(3), 2);
        assert_eq!(eagle.hit_blocks(0), 0);
        assert_eq!(rules(16).hit_blocks(3), 3);
    }

    #[test]
    fn commits_stop_at_the_hashed_and_held_blocks_and_the_reprefill_tail() {
        let r = rules(16);
        assert_eq!(r.committable_blocks(70, 10, 10), 4);
        assert_eq!(r.committable_blocks(70, 3, 10), 3);
        assert_eq!(r.committable_blocks(70, 10, 2), 2);
        let mtp = VllmRules::new(16, 1000, 2, 0, true, false).unwrap();
        assert_eq!(mtp.committable_blocks(65, 10, 10), 3);
        assert_eq!(mtp.committable_blocks(66, 10, 10), 4);
        assert_eq!(mtp.next_commit_at(3), 66);
        let off = VllmRules::new(16, 1000, 0, 0, false, false).unwrap();
        assert_eq!(off.committable_blocks(70, 10, 10), 0);
        assert_eq!(off.next_commit_at(0), usize::MAX);
    }

    #[test]
    fn below_the_next_commit_point_nothing_is_committable() {
        for reprefill in [0, 1, 3] {
            let r = VllmRules::new(16, 1000, reprefill, 0, true, false).unwrap();
            for cached in 0..5 {
                let at = r.next_commit_at(cached);
                assert_eq!(r.committable_blocks(at - 1, 100, 100), cached);
                assert_eq!(r.committable_blocks(at, 100, 100), cached + 1);
            }
        }
    }
}
