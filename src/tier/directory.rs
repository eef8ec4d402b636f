//! A fixed-capacity LRU directory of block hashes: which slot of a tier
//! holds which block. The host tier pairs it with an arena of bytes.
//!
//! ```text
//!   map: hash -> slot          lru: slots, least recently used first
//!   free: slots holding nothing
//! ```

use rustc_hash::FxHashMap;

use crate::alloc::filled;
use crate::error::Result;
use crate::hash::BlockHash;
use crate::id_list::IdList;

/// Maps block hashes to slots `0..capacity`, evicting the least recently
/// used entry when full.
#[derive(Debug)]
pub(crate) struct LruDirectory {
    map: FxHashMap<BlockHash, u32>,
    /// The hash each occupied slot holds.
    slots: Vec<Option<BlockHash>>,
    lru: IdList,
    free: Vec<u32>,
}

/// Where [`LruDirectory::insert`] put a new entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    /// The entry's slot.
    pub(crate) slot: u32,
    /// The entry evicted to make room, if any.
    pub(crate) evicted: Option<BlockHash>,
}

impl LruDirectory {
    /// An empty directory of `capacity` slots (at most `u32::MAX`).
    pub(crate) fn new(capacity: usize) -> Result<Self> {
        let capacity = capacity.min(u32::MAX as usize);
        let mut free = Vec::new();
        free.try_reserve_exact(capacity)
            .map_err(|_| crate::Error::OutOfMemory {
                what: "the tier's directory",
                bytes: capacity.saturating_mul(4),
            })?;
        free.extend((0..capacity as u32).rev());
        Ok(Self {
            map: FxHashMap::default(),
            slots: filled(capacity, None, "the tier's directory")?,
            lru: IdList::new(capacity)?,
            free,
        })
    }

    /// Slots in all.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether `hash` is held, without touching its recency.
    pub(crate) fn contains(&self, hash: BlockHash) -> bool {
        self.map.contains_key(&hash)
    }

    /// The slot of `hash`, made most recently used.
    pub(crate) fn get(&mut self, hash: BlockHash) -> Option<u32> {
        let slot = *self.map.get(&hash)?;
        self.lru.remove(slot);
        self.lru.push_back(slot);
        Some(slot)
    }

    /// Adds `hash` as the most recently used entry, evicting the least
    /// recently used one when full. `None` when already held (it is then
    /// touched) or when the capacity is 0.
    pub(crate) fn insert(&mut self, hash: BlockHash) -> Option<Placed> {
        if self.get(hash).is_some() {
            return None;
        }
        let (slot, evicted) = match self.free.pop() {
            Some(slot) => (slot, None),
            None => {
                let slot = self.lru.pop_front()?;
                let old = self.slots[slot as usize]
                    .take()
                    .expect("listed slots are occupied");
                self.map.remove(&old);
                self.lru.push_back(slot);
                self.slots[slot as usize] = Some(hash);
                self.map.insert(hash, slot);
                return Some(Placed {
                    slot,
                    evicted: Some(old),
                });
            }
        };
        self.lru.push_back(slot);
        self.slots[slot as usize] = Some(hash);
        self.map.insert(hash, slot);
        Some(Placed { slot, evicted })
    }

    /// Drops `hash`, freeing its slot.
    pub(crate) fn remove(&mut self, hash: BlockHash) {
        if let Some(slot) = self.map.remove(&hash) {
            self.lru.remove(slot);
            self.slots[slot as usize] = None;
            self.free.push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_and_reuses_its_slot() {
        let mut d = LruDirectory::new(2).unwrap();
        let h = |i| BlockHash(i);
        let a = d.insert(h(1)).unwrap();
        let b = d.insert(h(2)).unwrap();
        assert_ne!(a.slot, b.slot);
        assert_eq!(d.insert(h(1)), None, "already held: touched");
        let c = d.insert(h(3)).unwrap();
        assert_eq!(
            c,
            Placed {
                slot: b.slot,
                evicted: Some(h(2))
            }
        );
        assert!(d.contains(h(1)) && d.contains(h(3)) && !d.contains(h(2)));
        d.remove(h(1));
        assert_eq!(d.len(), 1);
        assert_eq!(d.insert(h(4)).unwrap().evicted, None);
        assert_eq!(LruDirectory::new(0).unwrap().insert(h(1)), None);
    }
}
