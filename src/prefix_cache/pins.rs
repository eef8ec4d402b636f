//! Pins: cached prefixes kept from eviction within a budget of blocks.
//!
//! Each `pin` call is a record of the blocks it took, filed under the hash
//! of the deepest one; `unpin` releases the record lying deepest on its
//! prefix, so it gives back exactly what a pin took even when the prefix
//! grew in between. A pin holds a lock on each of its blocks, so pinned
//! blocks are never evictable; the number of distinct pinned blocks is
//! bounded by the budget.

use rustc_hash::FxHashMap;

use super::core::{CacheState, Prefixes};
use crate::error::{Error, Result};
use crate::hash::BlockHash;
use crate::ids::{BlockId, TokenId};

/// The blocks one `pin` call took, and how many such calls are outstanding.
#[derive(Debug)]
struct PinRecord {
    blocks: Vec<BlockId>,
    count: u32,
}

/// Every outstanding pin.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    /// Pins by the hash of the deepest block they hold.
    records: FxHashMap<BlockHash, PinRecord>,
    /// Distinct pinned blocks.
    num_pinned: usize,
}

impl Pins {
    /// Distinct pinned blocks.
    pub(crate) fn num_pinned(&self) -> usize {
        self.num_pinned
    }

    /// Pins per block, as the records count them (for invariant checks).
    pub(crate) fn per_block(&self, num_blocks: usize) -> Vec<u32> {
        let mut pins = vec![0u32; num_blocks];
        for record in self.records.values() {
            for &b in &record.blocks {
                pins[b as usize] += record.count;
            }
        }
        pins
    }
}

impl Prefixes {
    /// Pins the cached leading blocks of the chain `hashes` (of `tokens`).
    /// Returns the tokens pinned: 0, and nothing to unpin, when nothing of
    /// the prefix is cached. Refused over the budget, changing nothing.
    pub(crate) fn pin(
        &self,
        st: &mut CacheState,
        tokens: &[TokenId],
        hashes: &[BlockHash],
    ) -> Result<usize> {
        let blocks = self.lookup(tokens, hashes, usize::MAX);
        let Some(&last) = blocks.len().checked_sub(1).and_then(|i| hashes.get(i)) else {
            return Ok(0);
        };
        let newly = blocks
            .iter()
            .filter(|&&b| st.slots[b as usize].pins == 0)
            .count();
        let budget = self.settings.pin_budget;
        if st.pins.num_pinned + newly > budget {
            return Err(Error::PinBudgetExceeded {
                pinned: st.pins.num_pinned,
                requested: newly,
                budget,
            });
        }
        for &b in &blocks {
            st.lock(b);
            let slot = &mut st.slots[b as usize];
            slot.pins += 1;
            if slot.pins == 1 {
                st.pins.num_pinned += 1;
            }
        }
        let tokens_pinned = blocks.len() * self.settings.block_size;
        // Pinned blocks stay indexed, so the same hash always names the same run.
        st.pins
            .records
            .entry(last)
            .or_insert_with(|| PinRecord { blocks, count: 0 })
            .count += 1;
        Ok(tokens_pinned)
    }

    /// Releases one pin lying on the chain `hashes`: the one whose run ends
    /// deepest in it, exactly the blocks that `pin` took (tail first).
    /// Returns the tokens unpinned; [`Error::NotPinned`] when no pin lies on
    /// the chain. Pinned blocks stay indexed, so unpinned ones that nobody
    /// else locks become evictable.
    pub(crate) fn unpin(&self, st: &mut CacheState, hashes: &[BlockHash]) -> Result<usize> {
        let key = *hashes
            .iter()
            .rev()
            .find(|h| st.pins.records.contains_key(h))
            .ok_or(Error::NotPinned)?;
        let record = st.pins.records.get_mut(&key).expect("found above");
        record.count -= 1;
        let blocks = if record.count == 0 {
            st.pins.records.remove(&key).expect("found above").blocks
        } else {
            record.blocks.clone()
        };
        for &b in blocks.iter().rev() {
            let slot = &mut st.slots[b as usize];
            slot.pins -= 1;
            if slot.pins == 0 {
                st.pins.num_pinned -= 1;
            }
            let uncached = st.unlock(b);
            debug_assert!(!uncached, "pinned blocks stay indexed");
        }
        Ok(blocks.len() * self.settings.block_size)
    }
}
