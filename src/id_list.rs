//! An intrusive doubly linked list over block ids.

use crate::alloc::filled;
use crate::error::Result;
use crate::ids::BlockId;

const NIL: u32 = u32::MAX;

/// An intrusive doubly linked list over block ids: O(1) push, pop and
/// removal from the middle, no allocation after construction (9 bytes per
/// block).
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
    pub(crate) fn new(capacity: usize) -> Result<Self> {
        Ok(Self {
            prev: filled(capacity, NIL, "a block list")?,
            next: filled(capacity, NIL, "a block list")?,
            member: filled(capacity, false, "a block list")?,
            head: NIL,
            tail: NIL,
            len: 0,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn contains(&self, id: BlockId) -> bool {
        self.member[id as usize]
    }

    /// The id `pop_front` would return.
    pub(crate) fn front(&self) -> Option<BlockId> {
        (self.head != NIL).then_some(self.head)
    }

    /// The id after `id` (towards the back), if any; `id` must be listed.
    pub(crate) fn after(&self, id: BlockId) -> Option<BlockId> {
        let n = self.next[id as usize];
        (n != NIL).then_some(n)
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
        let head = self.front()?;
        self.remove(head);
        Some(head)
    }

    /// Ids from front (next out) to back.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors(self.front(), |&b| {
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
        let mut l = IdList::new(8).unwrap();
        for b in [3, 1, 4, 5] {
            l.push_back(b);
        }
        l.remove(4);
        l.remove(3);
        l.push_back(3);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![1, 5, 3]);
        assert!(l.contains(5) && !l.contains(4));
        assert_eq!(l.front(), Some(1));
        assert_eq!(l.pop_front(), Some(1));
        assert_eq!(l.pop_front(), Some(5));
        assert_eq!(l.pop_front(), Some(3));
        assert_eq!(l.pop_front(), None);
        assert!(l.is_empty());
    }
}
