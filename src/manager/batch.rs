//! Batched calls: one engine step over many requests under one lock, all or
//! nothing (a failing batch changes no request).

use std::ops::Range;

use rustc_hash::{FxHashMap, FxHashSet};

use super::grow::appended_len;
use super::{BlockManager, State};
use crate::error::{Error, Result};
use crate::ids::{RequestId, TokenId};
use crate::manager::{BatchAppendOutcome, TableSizes};

impl BlockManager {
    /// Appends `tokens` to each request of `batch` (one decoded token, or
    /// `k` draft tokens, per request), in order, under one lock: the same
    /// outcome as [`BlockManager::append`] called for each entry in turn,
    /// plus the slot of every appended token. All or nothing: every request
    /// is checked and the blocks the whole batch needs are counted (a copy
    /// one request makes can spare another's) before anything changes, so
    /// a failure ([`Error::UnknownRequest`], [`Error::EmptyInput`],
    /// [`Error::OutOfBlocks`] for the batch's total, [`Error::RequestTooLarge`],
    /// [`Error::InvalidArgument`] for a request given twice) changes nothing.
    pub fn append_batch(&self, batch: &[(RequestId, &[TokenId])]) -> Result<BatchAppendOutcome> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        self.check_append_batch(st, batch)?;
        let num_tokens = batch.iter().map(|(_, t)| t.len()).sum();
        let mut out = BatchAppendOutcome {
            requests: Vec::with_capacity(batch.len()),
            slot_mapping: Vec::with_capacity(num_tokens),
        };
        for &(id, tokens) in batch {
            let request = st.requests.get_mut(&id).ok_or(Error::UnknownRequest(id))?;
            let start = request.len;
            let outcome = self.append_to(&mut st.pool, &mut st.cache, request, tokens)?;
            out.slot_mapping
                .extend(self.slots(request, start..request.len));
            out.requests.push(outcome);
        }
        Ok(out)
    }

    /// Fails, as the appends of `batch` in turn would, unless all of them
    /// succeed: the blocks they take together must be free.
    fn check_append_batch(&self, st: &State, batch: &[(RequestId, &[TokenId])]) -> Result<()> {
        let mut seen = FxHashSet::default();
        // Copies planned away from each shared tail: each one leaves the
        // tail with one holder less, so the last holder writes in place.
        let mut copied: FxHashMap<_, u32> = FxHashMap::default();
        let mut fresh = 0;
        for &(id, tokens) in batch {
            let request = st.requests.get(&id).ok_or(Error::UnknownRequest(id))?;
            if !seen.insert(id) {
                return Err(Error::InvalidArgument(format!(
                    "request {id} appears twice in the batch"
                )));
            }
            let growth = self.growth(request, appended_len(request, tokens)?)?;
            fresh += growth.grow;
            if let Some((_, tail)) = growth.written_tail {
                let copies = copied.entry(tail).or_default();
                if st.pool.ref_count(tail) - *copies > 1 {
                    *copies += 1;
                    fresh += 1;
                }
            }
        }
        let available = st.pool.num_free(&st.cache);
        if fresh > available {
            return Err(Error::OutOfBlocks {
                needed: fresh,
                available,
            });
        }
        Ok(())
    }

    /// Fills the block tables and slot mapping of a batch as attention
    /// kernels take them (FlashMLA, FlashInfer): row `i` of `tables`
    /// (row-major, `ids.len()` rows of `max_blocks` entries) gets request
    /// `ids[i]`'s table, padded with `pad`; `slots` gets the slots of
    /// positions `positions[i]` of each request in turn (`positions` is
    /// empty, or one range per request). Under one lock; requests may
    /// repeat. Returns the sizes used.
    ///
    /// Fails, writing nothing: [`Error::UnknownRequest`];
    /// [`Error::InvalidArgument`] when `tables` is not `ids.len() *
    /// max_blocks` long, `positions` has the wrong length, a range lies
    /// outside a request's slots, or block ids do not fit `i32`;
    /// [`Error::BatchBuffersTooSmall`], with the sizes needed, when a table
    /// is longer than `max_blocks` or `slots` is too short.
    pub fn fill_block_tables(
        &self,
        ids: &[RequestId],
        tables: &mut [i32],
        max_blocks: usize,
        pad: i32,
        positions: &[Range<usize>],
        slots: &mut [i64],
    ) -> Result<TableSizes> {
        if ids.len().checked_mul(max_blocks) != Some(tables.len()) {
            return Err(Error::InvalidArgument(format!(
                "the block table holds {} entries, not {} rows of {max_blocks}",
                tables.len(),
                ids.len()
            )));
        }
        if !positions.is_empty() && positions.len() != ids.len() {
            return Err(Error::InvalidArgument(format!(
                "{} position ranges for {} requests",
                positions.len(),
                ids.len()
            )));
        }
        if i32::try_from(self.config.num_blocks).is_err() {
            return Err(Error::InvalidArgument(format!(
                "block ids of a {}-block cache do not fit int32",
                self.config.num_blocks
            )));
        }
        let st = self.state.lock();
        let mut requests = Vec::with_capacity(ids.len());
        let mut needed = TableSizes::default();
        for (i, &id) in ids.iter().enumerate() {
            let request = st.requests.get(&id).ok_or(Error::UnknownRequest(id))?;
            needed.max_blocks = needed.max_blocks.max(request.blocks.len());
            if let Some(range) = positions.get(i) {
                self.check_positions(request, range)?;
                needed.num_slots += range.len();
            }
            requests.push(request);
        }
        if needed.max_blocks > max_blocks || needed.num_slots > slots.len() {
            return Err(Error::BatchBuffersTooSmall {
                max_blocks: needed.max_blocks,
                num_slots: needed.num_slots,
            });
        }
        let rows = tables.chunks_exact_mut(max_blocks.max(1));
        for (request, row) in requests.iter().zip(rows) {
            let (table, padding) = row.split_at_mut(request.blocks.len());
            // Block ids are below num_blocks, which fits i32 (checked above).
            for (entry, &b) in table.iter_mut().zip(&request.blocks) {
                *entry = b as i32;
            }
            padding.fill(pad);
        }
        let mut written = slots.iter_mut();
        for (request, range) in requests.iter().zip(positions) {
            for (value, slot) in self.slots(request, range.clone()).zip(written.by_ref()) {
                *slot = value;
            }
        }
        Ok(needed)
    }

    /// Frees every request of `ids` under one lock, as
    /// [`BlockManager::free`] of each in turn would. All or nothing: an
    /// unknown request or one given twice fails
    /// ([`Error::UnknownRequest`], [`Error::InvalidArgument`]) and frees none.
    pub fn free_batch(&self, ids: &[RequestId]) -> Result<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let mut seen = FxHashSet::default();
        for &id in ids {
            if !st.requests.contains_key(&id) {
                return Err(Error::UnknownRequest(id));
            }
            if !seen.insert(id) {
                return Err(Error::InvalidArgument(format!(
                    "request {id} appears twice in the batch"
                )));
            }
        }
        for &id in ids {
            let request = st.requests.remove(&id).ok_or(Error::UnknownRequest(id))?;
            self.release_request(st, &request);
        }
        Ok(())
    }
}
