//! Intrusive doubly linked lists over block ids: one list, or several that
//! share one array of links (an id is in at most one of them at a time),
//! each id's links side by side with a record the caller keeps for it.

use crate::alloc::filled;
use crate::error::Result;
use crate::ids::BlockId;
use crate::index::prefetch_line;

/// The end of a list: no previous or next id (block ids are below it).
const NIL: u32 = u32::MAX;

/// One id's place in its list: the ids before and after it. An id is
/// listed when it has an id before it or is the head, so an id not listed
/// has `prev == NIL` (and is not a head): membership needs no word of its
/// own.
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

/// An id's links and its record, side by side: one cache line for both
/// (for records of up to 56 bytes).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Entry<T> {
    link: Link,
    record: T,
}

/// One list's ends and length.
#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

impl Ends {
    const EMPTY: Ends = Ends {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// `N` intrusive doubly linked lists over block ids, an id in at most one
/// of them: O(1) push, pop and removal from the middle, no allocation after
/// construction (8 bytes per block for all `N` lists: both links of an id
/// side by side, which also tell whether it is listed, so a push or a
/// removal touches one line per id it changes). The caller names the list
/// an id is in.
///
/// Each id also has a record of type `T` (none by default), stored next to
/// its links: a caller that reads an id's record whenever it moves the id
/// (a policy's classes and stamps) finds both in one cache line, where an
/// array of its own would cost a miss more per id.
///
/// ```text
///   list 0: head -> [7] <-> [2] <-> [9] <- tail      next[7] = 2, prev[2] = 7, ...
///   list 1: head -> [4] <-> [1] <- tail              (the same array of links)
///   entry of id 7: | prev | next | record |
/// ```
#[derive(Debug)]
pub(crate) struct IdLists<const N: usize, T = ()> {
    entries: Vec<Entry<T>>,
    ends: [Ends; N],
}

impl<const N: usize> IdLists<N> {
    /// `N` empty lists of ids below `capacity` (at most `u32::MAX`).
    pub(crate) fn new(capacity: usize) -> Result<Self> {
        Self::with_records(capacity, ())
    }
}

impl<const N: usize, T: Copy> IdLists<N, T> {
    /// `N` empty lists of ids below `capacity` (at most `u32::MAX`), every
    /// id's record `record`.
    pub(crate) fn with_records(capacity: usize, record: T) -> Result<Self> {
        let entry = Entry {
            link: Link::OUT,
            record,
        };
        Ok(Self {
            entries: filled(capacity, entry, "a block list")?,
            ends: [Ends::EMPTY; N],
        })
    }

    /// `id`'s record, listed or not.
    pub(crate) fn record(&self, id: BlockId) -> &T {
        &self.entries[id as usize].record
    }

    /// `id`'s record, to change.
    pub(crate) fn record_mut(&mut self, id: BlockId) -> &mut T {
        &mut self.entries[id as usize].record
    }

    pub(crate) fn len(&self, list: usize) -> usize {
        self.ends[list].len
    }

    pub(crate) fn is_empty(&self, list: usize) -> bool {
        self.ends[list].len == 0
    }

    /// Whether `id` is in `list`, given that it is in no other.
    pub(crate) fn contains(&self, list: usize, id: BlockId) -> bool {
        self.entries[id as usize].link.prev != NIL || self.ends[list].head == id
    }

    /// The id `pop_front(list)` would return.
    pub(crate) fn front(&self, list: usize) -> Option<BlockId> {
        let head = self.ends[list].head;
        (head != NIL).then_some(head)
    }

    /// The id after `id` (towards the back) in its list, if any; `id` must
    /// be listed.
    pub(crate) fn after(&self, id: BlockId) -> Option<BlockId> {
        let n = self.entries[id as usize].link.next;
        (n != NIL).then_some(n)
    }

    /// Starts loading `id`'s entry (its links and record) into the cache, so
    /// that reading it soon after does not wait for memory (a hint).
    pub(crate) fn prefetch(&self, id: BlockId) {
        if let Some(entry) = self.entries.get(id as usize) {
            prefetch_line(std::ptr::from_ref(entry).cast());
        }
    }

    /// Appends `id`, which no list holds, to `list`.
    pub(crate) fn push_back(&mut self, list: usize, id: BlockId) {
        let i = id as usize;
        debug_assert!(self.entries[i].link.prev == NIL && self.entries[i].link.next == NIL);
        debug_assert!(
            self.ends.iter().all(|e| e.head != id),
            "block {id} is listed"
        );
        let ends = &mut self.ends[list];
        self.entries[i].link = Link {
            prev: ends.tail,
            next: NIL,
        };
        match ends.tail {
            NIL => ends.head = id,
            t => self.entries[t as usize].link.next = id,
        }
        ends.tail = id;
        ends.len += 1;
    }

    /// Takes `id` out of `list`, which holds it.
    pub(crate) fn remove(&mut self, list: usize, id: BlockId) {
        let i = id as usize;
        debug_assert!(self.contains(list, id), "block {id} is not in list {list}");
        let Link { prev: p, next: n } = self.entries[i].link;
        let ends = &mut self.ends[list];
        debug_assert!(p != NIL || ends.head == id, "block {id} heads another list");
        debug_assert!(n != NIL || ends.tail == id, "block {id} ends another list");
        match p {
            NIL => ends.head = n,
            p => self.entries[p as usize].link.next = n,
        }
        match n {
            NIL => ends.tail = p,
            n => self.entries[n as usize].link.prev = p,
        }
        self.entries[i].link = Link::OUT;
        ends.len -= 1;
    }

    pub(crate) fn pop_front(&mut self, list: usize) -> Option<BlockId> {
        let head = self.front(list)?;
        self.remove(list, head);
        Some(head)
    }

    /// Ids of `list` from front (next out) to back.
    #[cfg(test)]
    pub(crate) fn iter(&self, list: usize) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors(self.front(list), |&b| {
            let n = self.entries[b as usize].link.next;
            (n != NIL).then_some(n)
        })
    }
}

/// One intrusive doubly linked list over block ids (see [`IdLists`]).
#[derive(Debug)]
pub(crate) struct IdList(IdLists<1>);

impl IdList {
    /// An empty list of ids below `capacity` (at most `u32::MAX`).
    pub(crate) fn new(capacity: usize) -> Result<Self> {
        Ok(Self(IdLists::new(capacity)?))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len(0)
    }

    pub(crate) fn contains(&self, id: BlockId) -> bool {
        self.0.contains(0, id)
    }

    pub(crate) fn push_back(&mut self, id: BlockId) {
        self.0.push_back(0, id)
    }

    pub(crate) fn remove(&mut self, id: BlockId) {
        self.0.remove(0, id)
    }

    pub(crate) fn pop_front(&mut self) -> Option<BlockId> {
        self.0.pop_front(0)
    }

    /// Ids from front (next out) to back.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.0.iter(0)
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
        assert_eq!(l.pop_front(), Some(1));
        assert_eq!(l.pop_front(), Some(5));
        assert_eq!(l.pop_front(), Some(3));
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
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
        l.push_back(0);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![2, 0]);
        l.remove(0);
        assert_eq!(l.pop_front(), Some(2));
        assert!((0..4).all(|b| !l.contains(b)) && l.len() == 0);
    }

    #[test]
    fn lists_share_the_links_and_keep_their_own_order() {
        let mut l: IdLists<3> = IdLists::new(8).unwrap();
        for (list, id) in [(0, 3), (1, 5), (0, 1), (2, 0), (1, 7), (0, 6)] {
            l.push_back(list, id);
        }
        assert_eq!(l.iter(0).collect::<Vec<_>>(), [3, 1, 6]);
        assert_eq!(l.iter(1).collect::<Vec<_>>(), [5, 7]);
        assert_eq!(l.iter(2).collect::<Vec<_>>(), [0]);
        l.remove(0, 1);
        l.remove(2, 0);
        l.push_back(1, 1);
        assert_eq!((l.len(0), l.len(1), l.len(2)), (2, 3, 0));
        assert!(l.is_empty(2) && l.front(2).is_none());
        assert!(l.contains(1, 1) && l.contains(1, 5) && !l.contains(0, 0));
        assert_eq!(l.pop_front(1), Some(5));
        assert_eq!(l.iter(1).collect::<Vec<_>>(), [7, 1]);
        assert_eq!(
            (l.after(7), l.after(1), l.after(3)),
            (Some(1), None, Some(6))
        );
        assert_eq!(l.iter(0).collect::<Vec<_>>(), [3, 6]);
    }
}
