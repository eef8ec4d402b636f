//! Eviction policies: which cached free block is reused first.
//!
//! The manager keeps never-hashed free blocks in a list of its own and reuses
//! them before any cached block. Cached blocks whose reference count drops to
//! zero are handed to the policy; allocation asks the policy for a victim
//! when no unhashed block is left. A prefix hit on a cached free block takes
//! it back out (`remove`).

use std::fmt;

use crate::BlockId;

/// Orders the evictable set: cached blocks that no request holds.
///
/// Every method is called with the manager's lock held; implementations need
/// no synchronization of their own. Each must cost O(1) or O(log n).
pub trait EvictionPolicy: Send + fmt::Debug {
    /// The policy's name (`lru`, ...).
    fn name(&self) -> &'static str;
    /// `block` became evictable (its last holder released it).
    fn insert(&mut self, block: BlockId);
    /// `block` left the evictable set without being evicted (a hit revived it).
    fn remove(&mut self, block: BlockId);
    /// Chooses a victim and removes it from the evictable set.
    fn evict(&mut self) -> Option<BlockId>;
    /// A request hit `block` (free or not). Frequency-aware policies count it.
    fn on_hit(&mut self, _block: BlockId) {}
    /// Number of evictable blocks.
    fn len(&self) -> usize;
    /// True when nothing can be evicted.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Least recently freed first (vLLM's free-block queue).
#[derive(Debug)]
pub(crate) struct Lru {
    queue: IdList,
}

impl Lru {
    pub(crate) fn new(num_blocks: usize) -> Self {
        Self {
            queue: IdList::new(num_blocks),
        }
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, block: BlockId) {
        self.queue.push_back(block);
    }

    fn remove(&mut self, block: BlockId) {
        self.queue.remove(block);
    }

    fn evict(&mut self) -> Option<BlockId> {
        self.queue.pop_front()
    }

    fn len(&self) -> usize {
        self.queue.len()
    }
}

const NIL: u32 = u32::MAX;

/// An intrusive doubly linked list over block ids: O(1) push, pop and
/// removal from the middle, no allocation after construction.
///
/// ```text
///   head -> [7] <-> [2] <-> [9] <- tail      next[7] = 2, prev[2] = 7, ...
/// ```
#[derive(Debug)]
pub(crate) struct IdList {
    prev: Vec<u32>,
    next: Vec<u32>,
    member: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl IdList {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            member: vec![false; capacity],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, id: BlockId) -> bool {
        self.member[id as usize]
    }

    pub(crate) fn push_back(&mut self, id: BlockId) {
        let i = id as usize;
        debug_assert!(!self.member[i], "block {id} is already listed");
        self.member[i] = true;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        match self.tail {
            NIL => self.head = id,
            t => self.next[t as usize] = id,
        }
        self.tail = id;
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, id: BlockId) {
        let i = id as usize;
        debug_assert!(self.member[i], "block {id} is not listed");
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.member[i] = false;
        self.len -= 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<BlockId> {
        let head = self.head;
        (head != NIL).then(|| {
            self.remove(head);
            head
        })
    }

    /// Ids from front (next out) to back.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), |&b| {
            let n = self.next[b as usize];
            (n != NIL).then_some(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_keeps_order_through_removals() {
        let mut l = IdList::new(8);
        for b in [3, 1, 4, 5] {
            l.push_back(b);
        }
        l.remove(4);
        l.remove(3);
        l.push_back(3);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![1, 5, 3]);
        assert!(l.contains(5) && !l.contains(4));
        assert_eq!(l.pop_front(), Some(1));
        assert_eq!(l.pop_front(), Some(5));
        assert_eq!(l.pop_front(), Some(3));
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn lru_evicts_least_recently_freed() {
        let mut p = Lru::new(4);
        p.insert(2);
        p.insert(0);
        p.insert(3);
        p.remove(0);
        assert_eq!(p.evict(), Some(2));
        assert_eq!(p.evict(), Some(3));
        assert!(p.is_empty());
    }
}
