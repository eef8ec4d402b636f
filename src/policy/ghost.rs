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
/// Bit of a map entry that names the list; the rest is the slot.
const LIST_BIT: u32 = 1 << 31;

/// Two ghost lists sharing one index: each remembers the last `capacity`
/// fingerprints pushed to it, in a ring; one hash map finds a fingerprint's
/// list and slot, so a lookup costs one probe whichever list holds it.
/// Pushing into a full ring forgets its oldest entry. Memory is fixed at
/// construction: 8 bytes per slot plus the map's table, reserved for both
/// rings so it never grows.
///
/// ```text
///   ring 0: [ f7 | -- | f2 ]   ring 1: [ f4 | f9 | -- ]    map: f7 -> (0, 0), f2 -> (0, 2),
///                  ^ next 0              ^ next 1                f4 -> (1, 0), f9 -> (1, 1)
///   (a fingerprint taken out leaves a hole, refilled when the ring comes round)
/// ```
#[derive(Debug)]
pub(crate) struct GhostLists {
    rings: [Vec<u64>; 2],
    next: [usize; 2],
    len: [usize; 2],
    map: FxHashMap<u64, u32>,
}

impl GhostLists {
    /// Two rings of `capacity` fingerprints each (at most 2^31 - 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, LIST_BIT as usize - 1);
        let mut map = FxHashMap::default();
        map.reserve(2 * capacity);
        Self {
            rings: [vec![EMPTY; capacity], vec![EMPTY; capacity]],
            next: [0; 2],
            len: [0; 2],
            map,
        }
    }

    /// Fingerprints remembered by list `list` (0 or 1).
    pub(crate) fn len(&self, list: usize) -> usize {
        self.len[list]
    }

    /// Remembers `fp` in list `list`, forgetting that ring's oldest entry if
    /// it is full. `fp` must not be remembered already.
    pub(crate) fn push(&mut self, list: usize, fp: u64) {
        debug_assert_ne!(fp, EMPTY);
        let slot = self.next[list];
        let entry = slot as u32 | if list == 1 { LIST_BIT } else { 0 };
        let old = std::mem::replace(&mut self.rings[list][slot], fp);
        if old == EMPTY {
            self.len[list] += 1;
        } else if let Some(moved) = self.map.remove(&old).filter(|&e| e != entry) {
            // A collision moved `old` elsewhere since: keep that entry.
            self.map.insert(old, moved);
        }
        if let Some(other) = self.map.insert(fp, entry) {
            // A 64-bit collision: the newer sighting wins.
            self.forget(other);
        }
        self.next[list] = (slot + 1) % self.rings[list].len();
    }

    /// Forgets `fp`; returns the list that remembered it.
    pub(crate) fn take(&mut self, fp: u64) -> Option<usize> {
        let entry = self.map.remove(&fp)?;
        Some(self.forget(entry))
    }

    /// Empties the slot a map entry named; returns its list.
    fn forget(&mut self, entry: u32) -> usize {
        let list = usize::from(entry & LIST_BIT != 0);
        self.rings[list][(entry & !LIST_BIT) as usize] = EMPTY;
        self.len[list] -= 1;
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_list_remembers_its_last_pushes() {
        let mut g = GhostLists::new(3);
        for fp in [3, 5, 7, 9] {
            g.push(0, fp);
        }
        g.push(1, 11);
        assert_eq!((g.len(0), g.len(1)), (3, 1));
        assert_eq!(g.take(3), None, "the oldest was forgotten");
        assert_eq!(g.take(5), Some(0));
        assert_eq!(g.take(5), None);
        assert_eq!(g.take(11), Some(1));
        g.push(0, 13); // the ring's next slot is the hole 5 left: nothing forgotten
        assert_eq!(g.len(0), 3);
        g.push(0, 15); // forgets 7, now the oldest
        assert_eq!(g.take(7), None);
        assert_eq!([g.take(9), g.take(13), g.take(15)], [Some(0); 3]);
        assert_eq!((g.len(0), g.len(1)), (0, 0));
    }

    #[test]
    fn a_colliding_push_moves_the_fingerprint() {
        let mut g = GhostLists::new(2);
        g.push(0, 3);
        g.push(1, 3);
        assert_eq!((g.len(0), g.len(1)), (0, 1));
        g.push(0, 5);
        g.push(0, 7);
        g.push(0, 9); // overwrites 5: the map entry of 3 (list 1) is untouched
        assert_eq!(g.take(3), Some(1));
    }
}
