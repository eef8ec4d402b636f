//! ARC (Megiddo and Modha, FAST'03) over the evictable set: blocks used once
//! against blocks reused, with ghost lists that move the split between them.
//!
//! ```text
//!            stored, not hit since              hit since stored, or stored again
//!            (seen once)                        soon after its eviction (reused)
//!   once:    [LRU ... MRU]  ──evict──▶ once ghosts     (fingerprints, FIFO of 2 x num_blocks)
//!   reused:  [LRU ... MRU]  ──evict──▶ reused ghosts   (fingerprints, FIFO of 2 x num_blocks)
//!
//!   evict from `once` while more than `target` cached blocks are seen once
//!   (or nothing is reused), else from `reused`.
//!   a block stored with a hash in the once ghosts:    target grows  (keep new blocks longer)
//!   a block stored with a hash in the reused ghosts:  target shrinks (protect reused blocks)
//! ```
//!
//! Why it helps a prefix cache: a flood of one-off prompts only ever enters
//! `once`, so once `target` has learned that new blocks rarely come back, the
//! flood turns over within `once` and leaves reused prefixes (shared system
//! prompts, the history of conversations) alone. A block whose request comes
//! back after the cache forgot it, a user's next turn after a long think,
//! returns from a ghost list and is kept as reused. Which of the two mistakes
//! costs more is learned online from the ghost hits, as in ARC: there is no
//! tuning knob.
//!
//! Each list keeps the manager's tail-first release order, so within a list
//! a chain's deepest blocks go before its root.
//!
//! Costs: O(1) per call; a ghost lookup or push touches one bucket (two
//! adjacent cache lines). Memory per block of the cache: its links and state
//! (one entry), and the ghost table, 64 bytes per ghost a list holds rounded
//! up to a power of two (each list holds 2 x num_blocks).

use super::ghost::{fingerprint, GhostLists};
use super::{EvictionPolicy, Retention};
use crate::error::Result;
use crate::hash::BlockHash;
use crate::id_list::IdLists;
use crate::ids::BlockId;

/// Each ghost list remembers this many evictions per block of the cache.
/// ARC's directory is twice the cache; a prompt cache's reuse comes back
/// later (a user's next turn), so each list here remembers two cache-fulls.
const GHOSTS_PER_BLOCK: usize = 2;

/// The list (evictable blocks) and the ghost list (evicted fingerprints) of
/// blocks seen once.
const ONCE: usize = 0;
/// The list and the ghost list of reused blocks.
const REUSED: usize = 1;

/// What a cached block has shown so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Not in the prefix index.
    Uncached,
    /// Stored, never hit since.
    Once,
    /// Hit since it was stored, or stored again soon after an eviction.
    Reused,
}

/// What the policy knows of a block, kept next to its links (a move from
/// list to list reads both).
#[derive(Debug, Clone, Copy)]
struct BlockState {
    fingerprint: u64,
    class: Class,
}

/// ARC over the evictable set (see the module docs).
#[derive(Debug)]
pub(crate) struct Arc {
    /// The once and reused lists, and each block's state next to its links.
    lists: IdLists<2, BlockState>,
    /// Cached blocks (evictable or in use) seen once.
    cached_once: usize,
    /// Fingerprints of blocks evicted while seen once ([`ONCE`]) or reused
    /// ([`REUSED`]).
    ghosts: GhostLists,
    /// How many cached blocks may be seen once before `once` is evicted first.
    target: usize,
    capacity: usize,
    /// `evict_many`'s victims' ghosts (kept to reuse its allocation).
    victim_ghosts: Vec<(usize, u64)>,
}

impl Arc {
    pub(crate) fn new(num_blocks: usize) -> Result<Self> {
        let uncached = BlockState {
            fingerprint: 0,
            class: Class::Uncached,
        };
        Ok(Self {
            lists: IdLists::with_records(num_blocks, uncached)?,
            cached_once: 0,
            ghosts: GhostLists::new(GHOSTS_PER_BLOCK.saturating_mul(num_blocks))?,
            target: 0,
            capacity: num_blocks,
            victim_ghosts: Vec::new(),
        })
    }

    /// The list `block` belongs in while evictable.
    fn list_of(&self, block: BlockId) -> usize {
        match self.lists.record(block).class {
            Class::Reused => REUSED,
            _ => ONCE,
        }
    }

    fn set_class(&mut self, block: BlockId, class: Class) {
        let slot = &mut self.lists.record_mut(block).class;
        if *slot == Class::Once {
            self.cached_once -= 1;
        }
        if class == Class::Once {
            self.cached_once += 1;
        }
        *slot = class;
    }

    /// Takes the next victim out of its list (it is uncached from now on):
    /// the block, and the ghost list and fingerprint it leaves. Fetches the
    /// entry of the block after the list's new front, which a run of
    /// victims reaches next but one.
    fn take_victim(&mut self) -> Option<(BlockId, usize, u64)> {
        let once_first = self.cached_once > self.target || self.lists.is_empty(REUSED);
        let list = if once_first && !self.lists.is_empty(ONCE) {
            ONCE
        } else {
            REUSED
        };
        let block = self.lists.pop_front(list)?;
        if let Some(after) = self.lists.front(list).and_then(|b| self.lists.after(b)) {
            self.lists.prefetch(after);
        }
        self.set_class(block, Class::Uncached);
        Some((block, list, self.lists.record(block).fingerprint))
    }
}

impl EvictionPolicy for Arc {
    fn name(&self) -> &'static str {
        "arc"
    }

    fn on_request(&mut self, hashes: &[BlockHash], hit: usize) -> Retention {
        // The blocks past the hit are about to be stored: load their ghost
        // buckets all at once rather than one miss at a time.
        for &h in &hashes[hit.min(hashes.len())..] {
            self.ghosts.load(fingerprint(h));
        }
        Retention::Keep
    }

    fn on_store(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        _retention: Retention,
        _parent: Option<BlockId>,
    ) {
        debug_assert_eq!(self.lists.record(block).class, Class::Uncached);
        let fp = fingerprint(hash);
        self.lists.record_mut(block).fingerprint = fp;
        let (b1, b2) = (self.ghosts.len(ONCE), self.ghosts.len(REUSED));
        let class = match self.ghosts.take(fp) {
            Some(ONCE) => {
                // Evicted as seen-once, yet it came back: keep new blocks longer.
                self.target = (self.target + (b2 / b1).max(1)).min(self.capacity);
                Class::Reused
            }
            Some(_) => {
                // A reused block came back: protect reused blocks more.
                self.target = self.target.saturating_sub((b1 / b2).max(1));
                Class::Reused
            }
            None => Class::Once,
        };
        self.set_class(block, class);
    }

    fn insert(&mut self, block: BlockId) {
        assert_ne!(
            self.lists.record(block).class,
            Class::Uncached,
            "block {block} was released but never stored"
        );
        let list = self.list_of(block);
        self.lists.push_back(list, block);
    }

    fn remove(&mut self, block: BlockId) {
        let list = self.list_of(block);
        self.lists.remove(list, block);
    }

    fn evict(&mut self) -> Option<BlockId> {
        let (block, list, fp) = self.take_victim()?;
        self.ghosts.push(list, fp);
        Some(block)
    }

    fn evict_many(&mut self, n: usize, out: &mut Vec<BlockId>) -> usize {
        // The victims first, each one's ghost bucket fetched as it is
        // taken, then their ghosts pushed in the same order: by then the
        // buckets are in the cache, and nothing between reads the ghosts.
        let start = out.len();
        let mut ghosts = std::mem::take(&mut self.victim_ghosts);
        ghosts.clear();
        while out.len() - start < n {
            let Some((block, list, fp)) = self.take_victim() else {
                break;
            };
            self.ghosts.prefetch(fp);
            ghosts.push((list, fp));
            out.push(block);
        }
        for &(list, fp) in &ghosts {
            self.ghosts.push(list, fp);
        }
        self.victim_ghosts = ghosts;
        out.len() - start
    }

    fn on_hit(&mut self, block: BlockId) {
        debug_assert_ne!(self.lists.record(block).class, Class::Uncached);
        // The prefix cache takes a path out of the order before counting its
        // hits; a caller that does not finds the block at the back of the
        // reused list, released now, so every list stays in release order.
        let before = self.list_of(block);
        let listed = self.lists.contains(before, block);
        if listed {
            self.lists.remove(before, block);
        }
        self.set_class(block, Class::Reused);
        if listed {
            self.insert(block);
        }
    }

    fn forget(&mut self, block: BlockId) {
        // Dropped, not evicted: no ghost, so its return moves no target.
        debug_assert!(!self.lists.contains(self.list_of(block), block));
        self.set_class(block, Class::Uncached);
    }

    fn len(&self) -> usize {
        self.lists.len(ONCE) + self.lists.len(REUSED)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn h(x: u128) -> BlockHash {
        BlockHash(x << 1)
    }

    /// Stores `block` under `hash` and releases it at once.
    fn store_free(p: &mut Arc, block: BlockId, hash: u128) {
        p.on_store(block, h(hash), Retention::Keep, None);
        p.insert(block);
    }

    #[test]
    fn blocks_seen_once_go_before_reused_ones() {
        let mut p = Arc::new(4).unwrap();
        for b in 0..3 {
            p.on_store(b, h(b as u128), Retention::Keep, None);
        }
        p.on_hit(1);
        for b in (0..3).rev() {
            p.insert(b);
        }
        assert_eq!(p.len(), 3);
        // The target starts at 0: every seen-once block goes first, in free order.
        assert_eq!(p.evict(), Some(2));
        assert_eq!(p.evict(), Some(0));
        assert_eq!(p.evict(), Some(1));
        assert_eq!(p.evict(), None);
    }

    #[test]
    fn a_revived_block_is_reused_and_outlives_newer_one_offs() {
        let mut p = Arc::new(4).unwrap();
        store_free(&mut p, 0, 10);
        store_free(&mut p, 1, 11);
        p.remove(0); // a request hits block 0 ...
        p.on_hit(0);
        p.insert(0); // ... and releases it
        store_free(&mut p, 2, 12);
        assert_eq!(p.evict(), Some(1));
        assert_eq!(p.evict(), Some(2));
        assert_eq!(p.evict(), Some(0));
    }

    #[test]
    fn a_seen_once_block_coming_back_grows_the_target() {
        let mut p = Arc::new(4).unwrap();
        store_free(&mut p, 0, 10);
        store_free(&mut p, 1, 11);
        assert_eq!(p.evict(), Some(0)); // hash 10 goes to the once ghosts
        assert_eq!(p.target, 0);
        store_free(&mut p, 0, 10); // and comes back: reused, target 1
        assert_eq!(p.target, 1);
        assert_eq!(p.lists.record(0).class, Class::Reused);
        // One seen-once block (1) is within the target now: the reused one goes first.
        assert_eq!(p.evict(), Some(0));
        assert_eq!(p.evict(), Some(1));
    }

    #[test]
    fn a_reused_block_coming_back_shrinks_the_target() {
        let mut p = Arc::new(4).unwrap();
        store_free(&mut p, 0, 10);
        assert_eq!(p.evict(), Some(0));
        store_free(&mut p, 0, 10); // once ghost hit: target 1, block 0 reused
        store_free(&mut p, 1, 11);
        assert_eq!(p.evict(), Some(0)); // 1 seen-once <= target 1: reused goes
        store_free(&mut p, 2, 10); // reused ghost hit: target back to 0
        assert_eq!(p.target, 0);
        assert_eq!(p.evict(), Some(1));
    }

    #[test]
    fn a_dropped_block_is_forgotten_without_a_ghost() {
        let mut p = Arc::new(4).unwrap();
        store_free(&mut p, 0, 10);
        p.on_store(1, h(11), Retention::Keep, None); // in use
        p.remove(0);
        p.forget(0);
        p.forget(1);
        assert_eq!((p.len(), p.cached_once), (0, 0));
        // Stored again, neither counts as coming back from a ghost list.
        store_free(&mut p, 0, 10);
        store_free(&mut p, 1, 11);
        assert_eq!(
            (p.target, p.lists.record(0).class, p.lists.record(1).class),
            (0, Class::Once, Class::Once)
        );
        assert_eq!(p.evict(), Some(0));
    }

    proptest! {
        /// ARC's rule holds after any sequence of stores, releases, hits
        /// and drops: the seen-once count matches the blocks, the target
        /// stays in range, and each victim is the first released of the
        /// seen-once blocks while more than `target` are cached, else of
        /// the reused ones (the seen-once ones when none is reused).
        #[test]
        fn each_victim_follows_the_rule(
            ops in prop::collection::vec((0..4u8, 0..12u128, any::<usize>()), 1..300),
        ) {
            const N: usize = 6;
            let mut p = Arc::new(N).unwrap();
            let mut free: Vec<BlockId> = (0..N as BlockId).collect();
            let mut held: Vec<BlockId> = Vec::new();
            // Evictable blocks in release order.
            let mut released: Vec<BlockId> = Vec::new();
            for (what, hash, pick) in ops {
                match what {
                    0 => {
                        let b = match free.pop() {
                            Some(b) => b,
                            None => {
                                let once = |b: &&BlockId| p.lists.record(**b).class == Class::Once;
                                let first_once = released.iter().find(once);
                                let first_reused = released.iter().find(|b| !once(b));
                                let expected = match first_once {
                                    Some(_) if p.cached_once > p.target => first_once,
                                    _ => first_reused.or(first_once),
                                }
                                .copied();
                                let Some(b) = p.evict() else {
                                    prop_assert!(released.is_empty());
                                    continue;
                                };
                                prop_assert_eq!(Some(b), expected);
                                released.retain(|&x| x != b);
                                b
                            }
                        };
                        p.on_store(b, h(hash), Retention::Keep, None);
                        held.push(b);
                    }
                    1 if !held.is_empty() => {
                        let b = held.swap_remove(pick % held.len());
                        p.insert(b);
                        released.push(b);
                    }
                    2 if !released.is_empty() => {
                        let b = released.remove(pick % released.len());
                        p.remove(b);
                        p.on_hit(b);
                        prop_assert_eq!(p.lists.record(b).class, Class::Reused);
                        held.push(b);
                    }
                    3 if released.len() + held.len() > 0 => {
                        // Dropped on request: a held block, or an evictable one (removed first).
                        let i = pick % (released.len() + held.len());
                        let b = if i < held.len() {
                            held.swap_remove(i)
                        } else {
                            let b = released.remove(i - held.len());
                            p.remove(b);
                            b
                        };
                        p.forget(b);
                        free.push(b);
                    }
                    _ => {}
                }
                let once = (0..N as BlockId).filter(|&b| p.lists.record(b).class == Class::Once).count();
                prop_assert_eq!(p.cached_once, once);
                prop_assert!(p.target <= N);
                prop_assert_eq!(p.len(), released.len());
                prop_assert_eq!(p.len() + held.len() + free.len(), N);
            }
        }
    }
}
