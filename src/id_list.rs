//! An intrusive doubly linked list over block ids.

use crate::alloc::filled;
use crate::error::Result;
use crate::ids::BlockId;

/// The end of the list: no previous or next id (block ids are below it).
const NIL: u32 = u32::MAX;

/// One id's place in the list: the ids before and after it. An id is
/// listed when it has an id before it or is the head, so an id not listed
/// has `prev == NIL` (and is not the head): membership needs no word of
/// its own.
#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    /// The link of an id that is not listed.
    const OUT: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

/// An intrusive doubly linked list over block ids: O(1) push, pop and
/// removal from the middle, no allocation after construction (8 bytes per
/// block: both links of an id side by side, which also tell whether it is
/// listed, so a push or a removal touches one line per id it changes).
///
/// ```text
///   head -> [7] <-> [2] <-> [9] <- tail      next[7] = 2, prev[2] = 7, ...
/// ```
#[derive(Debug)]
pub(crate) struct IdList {
    links: Vec<Link>,
    head: u32,
    tail: u32,
    len: usize,
}

impl IdList {
    /// An empty list of ids below `capacity` (at most `u32::MAX`).
    pub(crate) fn new(capacity: usize) -> Result<Self> {
        Ok(Self {
            links: filled(capacity, Link::OUT, "a block list")?,
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
        self.links[id as usize].prev != NIL || self.head == id
    }

    /// The id `pop_front` would return.
    pub(crate) fn front(&self) -> Option<BlockId> {
        (self.head != NIL).then_some(self.head)
    }

    pub(crate) fn push_back(&mut self, id: BlockId) {
        let i = id as usize;
        debug_assert!(!self.contains(id), "block {id} is already listed");
        self.links[i] = Link {
            prev: self.tail,
            next: NIL,
        };
        match self.tail {
            NIL => self.head = id,
            t => self.links[t as usize].next = id,
        }
        self.tail = id;
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, id: BlockId) {
        let i = id as usize;
        debug_assert!(self.contains(id), "block {id} is not listed");
        let Link { prev: p, next: n } = self.links[i];
        match p {
            NIL => self.head = n,
            p => self.links[p as usize].next = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.links[n as usize].prev = p,
        }
        self.links[i] = Link::OUT;
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
            let n = self.links[b as usize].next;
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

    #[test]
    fn membership_follows_the_head_and_the_links() {
        let mut l = IdList::new(4).unwrap();
        assert!((0..4).all(|b| !l.contains(b)));
        l.push_back(0);
        l.push_back(2);
        assert!(l.contains(0) && l.contains(2) && !l.contains(1));
        // The head has no id before it: it is listed by being the head.
        l.remove(0);
        assert!(!l.contains(0) && l.contains(2));
        assert_eq!(l.front(), Some(2));
        l.push_back(0);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![2, 0]);
        l.remove(0);
        assert_eq!(l.pop_front(), Some(2));
        assert!((0..4).all(|b| !l.contains(b)) && l.is_empty());
    }
}
