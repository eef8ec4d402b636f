//! Eviction policies: which cached free block is reused first, and which
//! newly computed blocks are worth keeping at all.
//!
//! The manager keeps never-hashed free blocks in a list of its own and reuses
//! them before any cached block. Cached blocks whose reference count drops to
//! zero are handed to the policy; allocation asks the policy for a victim
//! when no unhashed block is left. A prefix hit on a cached free block takes
//! it back out (`remove`).
//!
//! | policy | module | rule |
//! |---|---|---|
//! | `lru` | [`lru`] | least recently freed first (vLLM) |
//! | `arc` | [`arc`] | adaptive replacement: blocks used once vs reused, ghost-tuned split |
//!
//! [`EvictionPolicyKind`] is the registry: a policy is its own file, a
//! variant there and an arm of [`EvictionPolicyKind::build`]; every surface
//! (the C enum, Python's names, the CLI, the SGLang backend) lists the
//! variants.
//!
//! The lifecycle of a block, as the policy sees it:
//!
//! ```text
//!   on_request(hashes, hit) ──▶ retention r of the request's new blocks
//!   on_store(b, h, r, parent) ──▶ (in use) ──insert(b)──▶ evictable ──evict()──▶ gone (h leaves the index)
//!                        ▲   on_hit(b)            │
//!                        └──────── remove(b) ◀────┘  (a hit revives it)
//!
//!   forget(b): b left the index on request (`BlockManager::evict_blocks`),
//!              in use or free (then after remove(b)); it is as if never stored.
//! ```

mod arc;
mod ghost;
mod lru;

use std::fmt;
use std::str::FromStr;

use arc::Arc;
pub(crate) use lru::Lru;

use crate::error::{Error, Result};
use crate::hash::BlockHash;
use crate::ids::BlockId;

/// Which cached free blocks are evicted first.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    strum::IntoStaticStr,
    strum::EnumCount,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[repr(C)]
pub enum EvictionPolicyKind {
    /// Least recently freed first (vLLM's order; the engine adapters'
    /// default).
    Lru = 0,
    /// Adaptive replacement (ARC): blocks seen once are evicted before reused
    /// ones, with a split learned online from ghost lists of evicted hashes.
    /// The default: the best policy on real multi-turn serving traffic.
    #[default]
    Arc = 1,
}

impl EvictionPolicyKind {
    /// Every policy, in declaration order: strum's `VARIANTS` as an array.
    pub const ALL: [EvictionPolicyKind; <EvictionPolicyKind as strum::EnumCount>::COUNT] =
        *<Self as strum::VariantArray>::VARIANTS
            .first_chunk()
            .expect("strum lists COUNT variants");

    /// The policy's name as used by the CLI, Python and C surfaces.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// A new policy of this kind over a cache of `num_blocks` blocks, empty.
    /// Fails with [`Error::OutOfMemory`] when its arrays cannot be allocated.
    pub fn build(self, num_blocks: usize) -> Result<Box<dyn EvictionPolicy>> {
        Ok(match self {
            EvictionPolicyKind::Lru => Box::new(Lru::new(num_blocks)?),
            EvictionPolicyKind::Arc => Box::new(Arc::new(num_blocks)?),
        })
    }
}

impl FromStr for EvictionPolicyKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        crate::config::from_name(s, "eviction policy")
    }
}

/// How the blocks a request stores are kept, as its policy decided when the
/// request was admitted ([`EvictionPolicy::on_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Retention {
    /// Kept like any stored block, by the policy's own rule.
    #[default]
    Keep,
    /// On probation: a hint for a policy of the caller's
    /// ([`crate::BlockManager::with_policy`]) that keeps such blocks for less
    /// long; the built-in policies always answer `Keep`.
    Probation,
}

/// Orders the evictable set: cached blocks that no request holds.
///
/// Contract (the prefix cache's calls, under `BlockManager` and `PrefixCache`
/// alike, for every policy):
/// - [`on_request`](Self::on_request)`(hashes, hit)`: a request was admitted;
///   `hashes` are its prompt's full blocks, the leading `hit` of them
///   cached. Its answer is the retention of the blocks the request stores.
///   (`PrefixCache::insert` counts as a request: its blocks, its leading
///   cached ones.)
/// - [`on_store`](Self::on_store)`(b, h, r, parent)`: block `b` entered the
///   prefix index under `h`, stored by a request whose retention is `r`,
///   under `parent` (the block holding the chain's previous hash); its
///   contents are new. `b` is in use, never evictable, then.
/// - [`insert`](Self::insert)`(b)`: the last holder of a cached block released
///   it; it is evictable from now on. Blocks of a request are released tail
///   first.
/// - [`remove`](Self::remove)`(b)`: an evictable block was revived by a hit.
/// - [`evict`](Self::evict): choose an evictable block and forget it; the
///   manager drops its hash from the index. Returns `None` only when empty.
///   [`evict_many`](Self::evict_many) chooses several at once: the ones as
///   many calls of `evict` would.
/// - [`on_hit`](Self::on_hit)`(b)`: an admission reused `b` (after `remove`
///   when it was free).
/// - [`forget`](Self::forget)`(b)`: `b` left the prefix index without being
///   chosen by `evict` (the manager's caller dropped it); if it was
///   evictable, `remove(b)` came first. `b` is uncached from then on, as if
///   never stored, until its next `on_store`.
///
/// A block is evictable between `insert` and `remove`/`evict`, and only
/// then. Every method is called with the manager's lock held, so
/// implementations need no synchronization of their own; each must cost
/// O(1) or O(log n) per block (`on_request` sees every block of a prompt:
/// O(len) for it), and be deterministic: the same calls give the same
/// victims.
pub trait EvictionPolicy: Send + fmt::Debug {
    /// The policy's name (`lru`, ...).
    fn name(&self) -> &'static str;
    /// A request was admitted: `hashes` are its prompt's full blocks, the
    /// leading `hit` of them cached. Returns how the blocks it stores are kept.
    fn on_request(&mut self, _hashes: &[BlockHash], _hit: usize) -> Retention {
        Retention::Keep
    }
    /// `block` entered the prefix index under `hash` (it is in use), stored
    /// by a request whose retention is `retention`, under `parent`: the
    /// block holding the chain's previous hash (`None`: a root, a previous
    /// block no longer cached, or a caller that does not know chains).
    fn on_store(
        &mut self,
        _block: BlockId,
        _hash: BlockHash,
        _retention: Retention,
        _parent: Option<BlockId>,
    ) {
    }
    /// `block` became evictable (its last holder released it).
    fn insert(&mut self, block: BlockId);
    /// `block` left the evictable set without being evicted (a hit revived it).
    fn remove(&mut self, block: BlockId);
    /// Chooses a victim and removes it from the evictable set.
    fn evict(&mut self) -> Option<BlockId>;
    /// Chooses up to `n` victims, the ones `n` calls of
    /// [`evict`](Self::evict) would choose, in that order, and appends them
    /// to `out`; returns how many (fewer only when the set ran out). A
    /// policy with memory to touch per victim overrides it to overlap those
    /// accesses across the batch.
    fn evict_many(&mut self, n: usize, out: &mut Vec<BlockId>) -> usize {
        let start = out.len();
        while out.len() - start < n {
            let Some(b) = self.evict() else {
                break;
            };
            out.push(b);
        }
        out.len() - start
    }
    /// A request hit `block` (free or not). Frequency-aware policies count it.
    fn on_hit(&mut self, _block: BlockId) {}
    /// `block` left the prefix index on request, not by [`evict`](Self::evict);
    /// it is not evictable. Policies that keep state per cached block drop it.
    fn forget(&mut self, _block: BlockId) {}
    /// Number of evictable blocks.
    fn len(&self) -> usize;
    /// True when nothing can be evicted.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// A request arrives with this many full blocks, the first ones cached.
        Request { hit: u8, len: u8 },
        /// Store a new block (from the never-stored pool or a victim) under this hash.
        Store(u8),
        /// Release a held block (by index into the held ones).
        Release(usize),
        /// Hit a block: revive it when evictable (by index into all cached ones).
        Hit(usize),
        /// Drop a cached block from the index on request (by index into all cached ones).
        Drop(usize),
        /// Evict this many blocks at once.
        Evict(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0..8u8, 0..8u8).prop_map(|(a, b)| Op::Request { hit: a.min(b), len: b }),
            3 => (0..24u8).prop_map(Op::Store),
            3 => any::<usize>().prop_map(Op::Release),
            2 => any::<usize>().prop_map(Op::Hit),
            1 => any::<usize>().prop_map(Op::Drop),
            2 => (0..4usize).prop_map(Op::Evict),
        ]
    }

    const BLOCKS: usize = 10;

    /// Two instances of one policy given the same calls, except that victims
    /// are chosen one at a time by one and in batches by the other: they
    /// must choose the same ones.
    #[derive(Debug)]
    struct Twin(Box<dyn EvictionPolicy>, Box<dyn EvictionPolicy>);

    impl Twin {
        fn new(kind: EvictionPolicyKind) -> Self {
            Twin(kind.build(BLOCKS).unwrap(), kind.build(BLOCKS).unwrap())
        }

        /// Victims by `evict_many(n)` of one (appended to what `out` holds
        /// already), checked against `n` calls of `evict` of the other.
        fn evict_many(&mut self, n: usize) -> Vec<BlockId> {
            const HELD: BlockId = BlockId::MAX;
            let mut batch = vec![HELD];
            assert_eq!(self.0.evict_many(n, &mut batch), batch.len() - 1);
            assert_eq!(
                batch[0],
                HELD,
                "{}: evict_many overwrote its output",
                self.0.name()
            );
            let one_by_one: Vec<BlockId> = (0..n).map_while(|_| self.1.evict()).collect();
            assert_eq!(batch[1..], one_by_one, "{}: evict_many({n})", self.0.name());
            batch.split_off(1)
        }

        fn on_request(&mut self, hashes: &[BlockHash], hit: usize) -> Retention {
            let r = self.0.on_request(hashes, hit);
            assert_eq!(r, self.1.on_request(hashes, hit));
            r
        }

        fn on_store(&mut self, b: BlockId, h: BlockHash, r: Retention) {
            self.0.on_store(b, h, r, None);
            self.1.on_store(b, h, r, None);
        }

        fn insert(&mut self, b: BlockId) {
            self.0.insert(b);
            self.1.insert(b);
        }

        fn remove(&mut self, b: BlockId) {
            self.0.remove(b);
            self.1.remove(b);
        }

        fn on_hit(&mut self, b: BlockId) {
            self.0.on_hit(b);
            self.1.on_hit(b);
        }

        fn forget(&mut self, b: BlockId) {
            self.0.forget(b);
            self.1.forget(b);
        }

        fn len(&self) -> usize {
            assert_eq!(self.0.len(), self.1.len());
            self.0.len()
        }
    }

    /// The `i`-th (modulo) block still in the index, evictable or held.
    fn pick_cached(
        evictable: &BTreeSet<BlockId>,
        held: &[BlockId],
        dropped: &BTreeSet<BlockId>,
        i: usize,
    ) -> Option<BlockId> {
        let cached: Vec<BlockId> = evictable
            .iter()
            .chain(held)
            .filter(|b| !dropped.contains(b))
            .copied()
            .collect();
        (!cached.is_empty()).then(|| cached[i % cached.len()])
    }

    proptest! {
        /// Any sequence of calls that keeps the contract: every policy evicts
        /// only evictable blocks, each once, and counts them right; victims
        /// chosen in batches are the ones chosen one at a time.
        #[test]
        fn every_policy_keeps_the_evictable_set(ops in prop::collection::vec(op(), 1..200)) {
            for kind in EvictionPolicyKind::ALL {
                let mut p = Twin::new(kind);
                prop_assert_eq!(p.0.name(), kind.name());
                let mut never: Vec<BlockId> = (0..BLOCKS as BlockId).collect();
                let mut held: Vec<BlockId> = Vec::new();
                // Held blocks dropped from the index: released to `never`, not to the policy.
                let mut dropped: BTreeSet<BlockId> = BTreeSet::new();
                let mut evictable: BTreeSet<BlockId> = BTreeSet::new();
                let mut retention = Retention::Keep;
                for op in &ops {
                    match *op {
                        Op::Request { hit, len } => {
                            let hashes: Vec<BlockHash> =
                                (0..u128::from(len)).map(|i| BlockHash(i * 977)).collect();
                            retention = p.on_request(&hashes, usize::from(hit));
                        }
                        Op::Store(h) => {
                            let b = match never.pop() {
                                Some(b) => b,
                                None => match p.evict_many(1).pop() {
                                    Some(b) => {
                                        prop_assert!(evictable.remove(&b), "{kind}: evicted {b}");
                                        b
                                    }
                                    None => continue,
                                },
                            };
                            p.on_store(b, BlockHash(u128::from(h) * 977), retention);
                            held.push(b);
                        }
                        Op::Release(i) if !held.is_empty() => {
                            let b = held.swap_remove(i % held.len());
                            // A block may be held twice (shared): release once per hold.
                            if !held.contains(&b) {
                                if dropped.remove(&b) {
                                    never.push(b);
                                } else {
                                    p.insert(b);
                                    evictable.insert(b);
                                }
                            }
                        }
                        Op::Hit(i) => {
                            let Some(b) = pick_cached(&evictable, &held, &dropped, i) else {
                                continue;
                            };
                            if evictable.remove(&b) {
                                p.remove(b);
                            }
                            p.on_hit(b);
                            held.push(b);
                        }
                        Op::Drop(i) => {
                            let Some(b) = pick_cached(&evictable, &held, &dropped, i) else {
                                continue;
                            };
                            if evictable.remove(&b) {
                                p.remove(b);
                                never.push(b);
                            } else {
                                dropped.insert(b);
                            }
                            p.forget(b);
                        }
                        Op::Evict(n) => {
                            let got = p.evict_many(n);
                            for &b in &got {
                                prop_assert!(evictable.remove(&b), "{kind}: evicted {b}");
                                never.push(b);
                            }
                            if got.len() < n {
                                prop_assert!(evictable.is_empty());
                            }
                        }
                        Op::Release(_) => {}
                    }
                    prop_assert_eq!(p.len(), evictable.len(), "{} after {:?}", kind, op);
                }
            }
        }
    }
}
