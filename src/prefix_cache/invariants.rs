//! The prefix cache's invariants, written down once for tests of this crate
//! and of its bindings.

use super::core::{CacheState, Prefixes};

impl Prefixes {
    /// Checks the prefix cache's bookkeeping. `owner_locks[b]`, when given,
    /// is how many locks on `b` its owner accounts for besides pins (a
    /// `BlockManager`: one while `b` is in use); without it, a block may hold
    /// any number of the caller's locks beyond its pins. Returns a
    /// description of the first violation.
    pub(crate) fn check(&self, st: &CacheState, owner_locks: Option<&[u32]>) -> Result<(), String> {
        let pins = st.pins.per_block(st.slots.len());
        for (b, slot) in st.slots.iter().enumerate() {
            if slot.pins != pins[b] {
                return Err(format!(
                    "block {b}: {} pins, its pin records say {}",
                    slot.pins, pins[b]
                ));
            }
            let expected = owner_locks.map(|o| o[b] + slot.pins);
            if expected.is_some_and(|e| e != slot.locks) || slot.locks < slot.pins {
                return Err(format!(
                    "block {b}: {} locks for {} pins and {:?} holders",
                    slot.locks,
                    slot.pins,
                    owner_locks.map(|o| o[b])
                ));
            }
            if slot.pins > 0 && !slot.is_cached() {
                return Err(format!("block {b} is pinned but not cached"));
            }
        }
        let evictable = (0..st.slots.len())
            .filter(|&b| st.is_evictable(b as u32))
            .count();
        if evictable != st.policy.len() {
            return Err(format!(
                "{evictable} cached unlocked blocks, the policy holds {}",
                st.policy.len()
            ));
        }
        let entries = self.index.entries();
        let hashed = st.slots.iter().filter(|s| s.is_cached()).count();
        if entries.len() != hashed {
            return Err(format!(
                "{} index entries but {hashed} hashed blocks",
                entries.len()
            ));
        }
        for (h, b) in entries {
            if st.slots[b as usize].hash() != Some(h) {
                return Err(format!(
                    "index maps a hash to block {b}, which holds another"
                ));
            }
        }
        let pinned = st.slots.iter().filter(|s| s.pins > 0).count();
        if pinned != st.pins.num_pinned() || pinned > self.settings.pin_budget {
            return Err(format!(
                "{pinned} pinned blocks, counted {}",
                st.pins.num_pinned()
            ));
        }
        Ok(())
    }
}
