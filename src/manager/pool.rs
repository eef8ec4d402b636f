//! The block pool a [`BlockManager`](super::BlockManager) adds on top of the
//! prefix cache: who holds each block, and which free block is reused next.
//!
//! A block is in use while some table holds it (`ref_count > 0`); the pool
//! then holds one lock on it in the prefix cache, so it is never evictable.
//! A free block is either cached (in the policy's evictable set, which the
//! prefix cache keeps) or never hashed (in the pool's `unhashed` list,
//! reused first). Pins are the prefix cache's: a pinned block with no table
//! is locked, so not free either.

use super::super::prefix_cache::{CacheState, Prefixes};
use crate::alloc::filled;
use crate::error::Result;
use crate::id_list::IdList;
use crate::ids::BlockId;

/// Per block, what the pool keeps.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PoolBlock {
    /// Tables holding the block.
    pub(super) ref_count: u32,
    /// Its contents were declared unreadable (`evict_blocks` while in use):
    /// not to be copied anywhere until it is reallocated.
    pub(super) dropped: bool,
}

/// Reference counts and the never-hashed free list.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) blocks: Vec<PoolBlock>,
    /// Free blocks with no hash, FIFO.
    pub(super) unhashed: IdList,
}

impl Pool {
    /// `num_blocks` free, never-hashed blocks; [`crate::Error::OutOfMemory`]
    /// when their arrays cannot be allocated.
    pub(super) fn new(num_blocks: usize) -> Result<Self> {
        let mut unhashed = IdList::new(num_blocks)?;
        for b in 0..num_blocks as BlockId {
            unhashed.push_back(b);
        }
        Ok(Self {
            blocks: filled(num_blocks, PoolBlock::default(), "the block pool")?,
            unhashed,
        })
    }

    /// Blocks no table and no pin holds: never hashed, or cached and evictable.
    pub(super) fn num_free(&self, cache: &CacheState) -> usize {
        self.unhashed.len() + cache.policy.len()
    }

    /// Tables holding `b`.
    pub(super) fn ref_count(&self, b: BlockId) -> u32 {
        self.blocks[b as usize].ref_count
    }

    /// Takes a free block for a new owner: never-hashed blocks first, then
    /// the policy's victim, whose hash leaves the index. The caller checked
    /// that a free block exists.
    pub(super) fn allocate(&mut self, prefixes: &Prefixes, cache: &mut CacheState) -> BlockId {
        let mut out = Vec::with_capacity(1);
        self.allocate_many(prefixes, cache, 1, &mut out);
        out[0]
    }

    /// Takes `n` free blocks as [`Pool::allocate`] does, appending them to
    /// `out`: never-hashed ones first, then the policy's victims, whose
    /// hashes leave the index in one batch. The caller checked that `n`
    /// free blocks exist.
    pub(super) fn allocate_many(
        &mut self,
        prefixes: &Prefixes,
        cache: &mut CacheState,
        n: usize,
        out: &mut Vec<BlockId>,
    ) {
        out.reserve(n);
        let start = out.len();
        while out.len() - start < n {
            let Some(b) = self.unhashed.pop_front() else {
                break;
            };
            out.push(b);
        }
        let rest = n - (out.len() - start);
        if rest > 0 {
            let mut index = prefixes.index.writer();
            let evicted = prefixes.evict_victims(cache, &mut index, rest, out);
            assert_eq!(evicted, rest, "caller checked free blocks");
        }
        for &b in &out[start..] {
            cache.lock(b);
            self.blocks[b as usize] = PoolBlock {
                ref_count: 1,
                dropped: false,
            };
        }
    }

    /// Takes a reference to `b`, reviving it from the evictable set if free.
    pub(super) fn acquire(&mut self, cache: &mut CacheState, b: BlockId) {
        let block = &mut self.blocks[b as usize];
        block.ref_count += 1;
        if block.ref_count == 1 {
            cache.lock(b);
        }
    }

    /// Drops a reference to `b`; the last one frees it unless it is pinned.
    pub(super) fn release(&mut self, cache: &mut CacheState, b: BlockId) {
        let block = &mut self.blocks[b as usize];
        block.ref_count -= 1;
        if block.ref_count == 0 && cache.unlock(b) {
            self.unhashed.push_back(b);
        }
    }

    /// Evicts up to `n` of the policy's victims, as allocation chooses them,
    /// onto the never-hashed list. Returns how many were evicted.
    pub(super) fn evict(&mut self, prefixes: &Prefixes, cache: &mut CacheState, n: usize) -> usize {
        let mut victims = Vec::with_capacity(n.min(cache.policy.len()));
        prefixes.evict_victims(cache, &mut prefixes.index.writer(), n, &mut victims);
        for &b in &victims {
            self.unhashed.push_back(b);
        }
        victims.len()
    }

    /// Drops `b` from the prefix index (the caller checked it may be): a
    /// free block moves to the never-hashed list, one in use is marked
    /// dropped and freed as unhashed later. Returns whether it was cached.
    pub(super) fn drop_block(
        &mut self,
        prefixes: &Prefixes,
        cache: &mut CacheState,
        b: BlockId,
    ) -> bool {
        let Some(free) = prefixes.drop_block(cache, b) else {
            return false;
        };
        if free {
            self.unhashed.push_back(b);
        } else {
            self.blocks[b as usize].dropped = true;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheConfig;
    use crate::policy::Retention;

    const BS: usize = 4;

    struct Fixture {
        prefixes: Prefixes,
        cache: CacheState,
        pool: Pool,
    }

    fn fixture(num_blocks: usize) -> Fixture {
        let mut config = CacheConfig::new(num_blocks);
        config.block_size = BS;
        config.hash_seed = Some(1);
        let policy = config.eviction.build(num_blocks).unwrap();
        Fixture {
            prefixes: Prefixes::new(&config),
            cache: CacheState::new(num_blocks, policy).unwrap(),
            pool: Pool::new(num_blocks).unwrap(),
        }
    }

    impl Fixture {
        fn allocate(&mut self) -> BlockId {
            self.pool.allocate(&self.prefixes, &mut self.cache)
        }

        /// Indexes `blocks` as the chain of `tokens`.
        fn store(&mut self, tokens: &[u32], blocks: &[BlockId]) {
            let hashes = self.prefixes.chain(tokens, &Default::default());
            self.prefixes.store_chain(
                &mut self.cache,
                tokens,
                &hashes,
                blocks,
                0..blocks.len(),
                Retention::Keep,
                None,
            );
        }

        fn free(&self) -> usize {
            self.pool.num_free(&self.cache)
        }

        fn check(&self) {
            let owner: Vec<u32> = (0..self.pool.blocks.len() as BlockId)
                .map(|b| u32::from(self.pool.ref_count(b) > 0))
                .collect();
            self.prefixes.check(&self.cache, Some(&owner)).unwrap();
        }
    }

    #[test]
    fn never_hashed_blocks_go_first_in_free_order_then_the_policys_victims() {
        let mut f = fixture(3);
        let (a, b, c) = (f.allocate(), f.allocate(), f.allocate());
        assert_eq!((a, b, c), (0, 1, 2), "FIFO over the initial list");
        assert_eq!(f.free(), 0);
        f.store(&[1, 2, 3, 4, 5, 6, 7, 8], &[a, b]);
        f.check();
        // Released tail first: b is older in LRU order than a.
        f.pool.release(&mut f.cache, b);
        f.pool.release(&mut f.cache, a);
        f.pool.release(&mut f.cache, c);
        assert_eq!(f.free(), 3);
        assert_eq!(f.cache.policy.len(), 2);
        f.check();
        assert_eq!(f.allocate(), c, "the unhashed block first");
        assert_eq!(f.allocate(), b, "then the least recently freed cached one");
        assert!(!f.cache.slots[b as usize].is_cached(), "its hash left");
        assert_eq!(f.prefixes.index.len(), 1);
        assert_eq!(f.cache.stats.evictions, 1);
        f.check();
    }

    #[test]
    fn a_hit_revives_a_free_cached_block_and_sharing_counts_references() {
        let mut f = fixture(2);
        let a = f.allocate();
        f.store(&[9, 9, 9, 9], &[a]);
        f.pool.release(&mut f.cache, a);
        assert_eq!((f.free(), f.cache.policy.len()), (2, 1));
        f.pool.acquire(&mut f.cache, a);
        f.pool.acquire(&mut f.cache, a);
        assert_eq!((f.free(), f.cache.policy.len()), (1, 0));
        assert_eq!(f.pool.ref_count(a), 2);
        f.check();
        f.pool.release(&mut f.cache, a);
        assert_eq!(f.free(), 1, "still held once");
        f.pool.release(&mut f.cache, a);
        assert_eq!(f.cache.policy.len(), 1, "free again, cached");
        f.check();
    }

    #[test]
    fn evict_moves_victims_to_the_unhashed_list_and_stops_when_none_is_left() {
        let mut f = fixture(4);
        let blocks: Vec<BlockId> = (0..3).map(|_| f.allocate()).collect();
        f.store(&(0..12).collect::<Vec<u32>>(), &blocks);
        for &b in blocks.iter().rev() {
            f.pool.release(&mut f.cache, b);
        }
        assert_eq!(f.pool.evict(&f.prefixes, &mut f.cache, 2), 2);
        assert_eq!((f.cache.policy.len(), f.pool.unhashed.len()), (1, 3));
        assert_eq!(f.pool.evict(&f.prefixes, &mut f.cache, 5), 1);
        assert_eq!(f.pool.evict(&f.prefixes, &mut f.cache, 5), 0);
        assert_eq!(f.free(), 4);
        f.check();
    }

    #[test]
    fn dropping_a_block_in_use_marks_it_and_frees_it_as_unhashed() {
        let mut f = fixture(2);
        let (a, b) = (f.allocate(), f.allocate());
        f.store(&(0..8).collect::<Vec<u32>>(), &[a, b]);
        f.pool.release(&mut f.cache, b);
        assert!(
            f.pool.drop_block(&f.prefixes, &mut f.cache, b),
            "free: listed"
        );
        assert!(f.pool.unhashed.contains(b));
        assert!(f.pool.drop_block(&f.prefixes, &mut f.cache, a));
        assert!(f.pool.blocks[a as usize].dropped);
        assert!(
            !f.pool.drop_block(&f.prefixes, &mut f.cache, a),
            "gone already"
        );
        f.pool.release(&mut f.cache, a);
        assert!(f.pool.unhashed.contains(a), "freed as never hashed");
        assert_eq!(f.prefixes.index.len(), 0);
        f.check();
        assert_eq!((f.allocate(), f.allocate()), (b, a), "in the order freed");
        assert!(
            !f.pool.blocks[a as usize].dropped,
            "reallocated: readable again"
        );
    }
}
