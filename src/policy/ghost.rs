//! Ghost lists: bounded FIFO sets of the fingerprints of evicted blocks.

use rustc_hash::FxHashMap;

use crate::hash::BlockHash;

/// A block hash reduced to 64 bits, never 0. Policies only use it to
/// recognize blocks that come back: a collision (about one in 2^63 per
/// pair) can only mislead a policy's choice, never the cache's contents.
pub(crate) fn fingerprint(hash: BlockHash) -> u64 {
    (hash.0 as u64) | 1
}

const EMPTY: u64 = 0;

/// The last `capacity` fingerprints pushed, in a ring, with a map for O(1)
/// membership and removal. Pushing into a full ring forgets the oldest.
/// Memory is fixed at construction: 8 bytes per slot plus the map's table
/// (reserved for `capacity` entries, so it never grows).
///
/// ```text
///   slots: [ f7 | -- | f2 | f9 ]      map: f7 -> 0, f2 -> 2, f9 -> 3
///                  ^ next            (a removed fingerprint leaves a hole)
/// ```
#[derive(Debug)]
pub(crate) struct GhostList {
    slots: Vec<u64>,
    map: FxHashMap<u64, u32>,
    next: usize,
}

impl GhostList {
    pub(crate) fn new(capacity: usize) -> Self {
        let mut map = FxHashMap::default();
        map.reserve(capacity);
        Self {
            slots: vec![EMPTY; capacity.max(1)],
            map,
            next: 0,
        }
    }

    /// Fingerprints remembered.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Remembers `fp`, forgetting the oldest entry if the ring is full.
    pub(crate) fn push(&mut self, fp: u64) {
        debug_assert_ne!(fp, EMPTY);
        self.remove(fp);
        let old = std::mem::replace(&mut self.slots[self.next], fp);
        if old != EMPTY {
            self.map.remove(&old);
        }
        self.map.insert(fp, self.next as u32);
        self.next = (self.next + 1) % self.slots.len();
    }

    /// Forgets `fp`; returns whether it was remembered.
    pub(crate) fn remove(&mut self, fp: u64) -> bool {
        match self.map.remove(&fp) {
            Some(slot) => {
                self.slots[slot as usize] = EMPTY;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_pushes_and_forgets_removed_ones() {
        let mut g = GhostList::new(3);
        for fp in [3, 5, 7, 9] {
            g.push(fp);
        }
        assert_eq!(g.len(), 3);
        assert!(!g.remove(3), "the oldest was forgotten");
        assert!(g.remove(5));
        assert!(!g.remove(5));
        g.push(11); // the ring's next slot is the hole 5 left: nothing forgotten
        assert_eq!(g.len(), 3);
        g.push(13); // forgets 7, now the oldest
        assert!(!g.remove(7));
        assert!(g.remove(9) && g.remove(11) && g.remove(13));
        assert_eq!(g.len(), 0);
    }

    #[test]
    fn pushing_a_remembered_fingerprint_refreshes_it() {
        let mut g = GhostList::new(2);
        g.push(3);
        g.push(5);
        g.push(3); // 3 moves to the newest slot, forgetting nothing but its old place
        g.push(7); // forgets 5, the oldest now
        assert!(g.remove(3) && g.remove(7) && !g.remove(5));
    }
}
