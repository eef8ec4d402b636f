//! ARC (Megiddo and Modha, FAST'03) over the evictable set: blocks used once
//! against blocks reused, with ghost lists that move the split between them;
//! and, over the same blocks, a residency rule for traffic that loops.
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
//! Where ARC fails: sessions that all come back, but later than the cache
//! turns over (agents resending a long context every few seconds, chats whose
//! users think for minutes). Every returning block comes back from a ghost
//! list, so everything is "reused" and `reused` churns like LRU: each session
//! pushes out the one that returns next, and nothing hits. The optimum keeps
//! a stable share of the sessions instead. [`Rule::Residency`] does that:
//!
//! ```text
//!   a request whose prompt was at least half cached (a resident session):
//!       its new blocks are kept
//!   any other request (a session coming back cold, a one-off):
//!       its new blocks go on probation, evicted before anything kept,
//!       except every 32nd such request, admitted as kept
//!   hits make a block kept
//!   a kept block released longer ago than the horizon is stale: evicted
//!       first of all (the horizon: 1.5 x the 99th percentile of the
//!       witnesses' return ages, in releases, learned online; the oldest
//!       return learned where reused kept blocks evicted before it rarely
//!       come back)
//! ```
//!
//! Residents keep hitting and keep their blocks, including the new ones each
//! step adds; a cold request turns over in probation without displacing
//! them; the 1-in-32 admissions (BIP's rate, Qureshi et al., ISCA'07) renew
//! the residents, pushing out those that stopped coming first. On traffic
//! with no loop (the Mooncake trace), residency loses to LRU;
//! [`super::Adaptive`] runs both rules on shadow caches and follows the better.
//!
//! Stale blocks are residents that stopped coming (conversations that
//! ended): without the horizon they outlive every cold request, which is
//! what loses to LRU once the cache holds most of what returns. The horizon
//! is learned from witnesses, one block stored in 16, which are never
//! evicted as stale: their returns are measured under the plain rule, so a
//! horizon too short cannot hide the later returns that would lengthen it
//! (learned from every kept block, it shrinks itself: a block evicted as
//! stale never shows its return). A cache picks its witnesses by the count
//! of blocks stored, so that its choices do not depend on the hash seed; a
//! shadow cache of [`super::Adaptive`], which sees a sample of the blocks
//! by hash already, picks them by fingerprint ([`Witnesses`]). Where reused kept blocks
//! evicted before the horizon rarely come back, the horizon is the oldest
//! return learned ([`KeptEvictions`]).
//!
//! Both rules classify every block all the time, whichever is in force: a
//! cached block is once or reused (ARC's view) and on probation or kept
//! (residency's), kept witnesses apart, so it sits in one of six lists, each
//! in release order, and each rule's list is the union of some of them:
//!
//! ```text
//!                    probation     kept     kept witness
//!   once             [0]           [1]      [4]          ARC's once    = [0] + [1] + [4]
//!   reused           [2]           [3]      [5]          ARC's reused  = [2] + [3] + [5]
//!                                                        residency's probation = [0] + [2]
//!                                                        residency's kept = [1] + [3] + [4] + [5]
//!                                                        residency's stale: the older front of [1] and [3]
//! ```
//!
//! A victim is the oldest front of its rule's lists (by release stamp),
//! so each rule evicts in exactly the order it would over lists of its own,
//! and a switch of rules ([`OnceReused::set_rule`]) finds the other rule's
//! classification up to date: nothing to rebuild.
//!
//! Except residency's residents: a spell under ARC evicts them, and the
//! one cold request in 32 would take many turnovers to admit as many
//! again. So back under residency after a spell under ARC, every cold
//! request keeps its blocks until as many blocks are kept as when the
//! spell began (then the rule is as it was): the cache refills its
//! residents from the sessions that come next, as it first filled them.
//! On `chat-under-flood` at 65,535 blocks, whose flood of one-off documents
//! sent [`super::Adaptive`] to ARC for a while, this brought ten hash
//! seeds from 33.3%-34.8% to 34.1%-36.2% (residency alone 37.5%;
//! `adaptive`, judging by its shadows, stays under residency there).
//!
//! A variant of residency's order after the stale blocks, for the real
//! cache of [`super::Adaptive`] ([`OnceReused::set_residency_order`]; see
//! [`ResidencyOrder`]): residency's own order is probation (lists 0 and 2,
//! oldest first) before kept (1, 3, 4, 5);
//!
//! ```text
//!   Plain         [0 + 2]  [1 + 3 + 4 + 5]        the rule as it is
//!   SpareReused   [0]  [2]  [1 + 3 + 4 + 5]       probation keeps ARC's reused blocks longest
//! ```
//!
//! `SpareReused` keeps what ARC would keep longest where residency's own
//! choice is indifferent (within probation), so that a spell under
//! residency costs few of the reused blocks ARC keeps for the long run,
//! while a resident conversation's new blocks (kept, seen once) still
//! outlive the cold ones' seen once.
//!
//! Every list keeps the manager's tail-first release order, so within a
//! list a chain's deepest blocks go before its root.
//!
//! Costs: O(1) per call; a ghost lookup or push touches one bucket (two
//! adjacent cache lines); every 128 witness returns the 240-bucket age
//! table is rebuilt.
//! Memory per block of the cache: one entry of 32 bytes, its links in the
//! six lists (which share one array: a block is in one list at a time) and
//! its state beside them (release stamp, fingerprint, classes), so moving a
//! block touches one line; and the ghost table, 64 bytes per ghost a list
//! holds rounded up to a power of two (each list holds 2 x num_blocks): 128
//! to 256 bytes; 160 bytes per block for a 16,383-block cache, against the
//! 2.5 MiB a block of DeepSeek-V3 KV takes in fp8.

use super::ghost::{fingerprint, GhostLists};
use super::kept_evictions::KeptEvictions;
use super::return_ages::{Learning, ReturnAges, AGE_BUCKETS};
use super::{EvictionPolicy, Retention};
use crate::error::Result;
use crate::hash::BlockHash;
use crate::id_list::IdLists;
use crate::ids::BlockId;

/// Each ghost list remembers this many evictions per block of the cache.
/// ARC's directory is twice the cache; a prompt cache's reuse comes back
/// later (a user's next turn), so each list here remembers two cache-fulls.
const GHOSTS_PER_BLOCK: usize = 2;

/// Under [`Rule::Residency`], one cold request in this many keeps its blocks.
const COLD_ADMISSION_PERIOD: u64 = 32;

/// Ghost list of blocks evicted while seen once.
const ONCE: usize = 0;
/// Ghost list of blocks evicted while reused.
const REUSED: usize = 1;

/// What a cached block has shown so far, in ARC's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Not in the prefix index.
    Uncached,
    /// Stored, never hit since.
    Once,
    /// Hit since it was stored, or stored again soon after an eviction.
    Reused,
}

/// Which rule chooses the victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// ARC: once before reused while more than `target` blocks are once;
    /// the split is learned from ghost hits.
    Arc,
    /// Probation before kept.
    Residency,
}

/// How residency orders its victims after the stale ones (see the module
/// docs for the lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResidencyOrder {
    /// Probation, then kept, each oldest first: the rule as it is.
    Plain,
    /// Probation ARC sees once, probation ARC sees reused, then kept.
    SpareReused,
}

/// The lists: ARC's class (once 0, reused 2) plus residency's (probation 0,
/// kept 1); kept witnesses in 4 (once) and 5 (reused).
const LISTS: usize = 6;
const ARC_REUSED: usize = 2;
const KEPT: usize = 1;
const WITNESSES: usize = 4;
/// ARC's once and reused lists, and residency's kept ones.
const ONCE_LISTS: [usize; 3] = [0, KEPT, WITNESSES];
const REUSED_LISTS: [usize; 3] = [ARC_REUSED, ARC_REUSED + KEPT, WITNESSES + 1];
const KEPT_LISTS: [usize; 4] = [KEPT, ARC_REUSED + KEPT, WITNESSES, WITNESSES + 1];
/// Residency's kept lists of blocks ARC sees as reused.
const REUSED_KEPT_LISTS: [usize; 2] = [ARC_REUSED + KEPT, WITNESSES + 1];
/// One block stored in this many is a witness (a power of two).
const WITNESS_RATE: u64 = 16;
/// Spreads the count of blocks stored over 64 bits (Fibonacci hashing):
/// its top bits pick the witnesses.
const STORE_COUNT_MIX: u64 = 0x9E37_79B9_7F4A_7C15;
/// How the witnesses' return ages are learned: rebuilt every 128 returns,
/// halved past 256 (a witness returns for every 16 kept blocks, so this
/// follows the traffic about as fast as `return_time`'s tables); the
/// horizon is 1.5 x their 99th percentile.
const WITNESS_RETURNS: Learning = Learning {
    buckets: AGE_BUCKETS,
    relearn_period: 128,
    window: 256,
    percentile: 99,
};

/// How the witnesses are picked, one block stored in [`WITNESS_RATE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Witnesses {
    /// By the count of blocks stored (the top bits of the count times
    /// [`STORE_COUNT_MIX`] are 0): the same blocks for every hash seed,
    /// spread so that no stride of the traffic (blocks stored per request)
    /// puts them at the same depth of every chain. By fingerprint,
    /// residency's hit rate varied by up to 5.6% (relative) over ten hash
    /// seeds.
    ByStoreCount,
    /// Blocks whose fingerprint has bits 40 to 43 at 0: for a shadow
    /// cache, whose blocks are a sample by hash (there, by store count,
    /// which blocks are witnesses decided the duel on some workloads).
    ByFingerprint,
}

/// What the policy knows of a block, kept next to its links (a move from
/// list to list reads both).
#[derive(Debug, Clone, Copy)]
struct BlockState {
    /// When it was last released (a count of releases).
    released_at: u64,
    fingerprint: u64,
    class: Class,
    /// Residency's view: kept, or on probation.
    kept: bool,
    /// Its returns are measured (it is never evicted as stale).
    witness: bool,
    /// Taken out of the lists by `remove` since its last release: the next
    /// `on_hit` is a return, of its age.
    revived: bool,
}

impl BlockState {
    const UNCACHED: BlockState = BlockState {
        released_at: 0,
        fingerprint: 0,
        class: Class::Uncached,
        kept: false,
        witness: false,
        revived: false,
    };
}

/// ARC over the evictable set, or residency over the same blocks (see the
/// module docs).
#[derive(Debug)]
pub(crate) struct OnceReused {
    /// The six lists, and each block's state next to its links.
    lists: IdLists<LISTS, BlockState>,
    releases: u64,
    /// Cached blocks (evictable or in use) ARC sees once.
    cached_once: usize,
    /// List 0: evicted while seen once; list 1: evicted while reused.
    ghosts: GhostLists,
    /// How many cached blocks may be seen-once before `once` is evicted first.
    /// Learned under every rule, used under ARC's.
    target: usize,
    capacity: usize,
    rule: Rule,
    /// Requests admitted as cold (less than half their prompt cached, or
    /// so judged by a shadow cache).
    cold_requests: u64,
    /// Blocks kept when the last spell under ARC began: back under
    /// residency, cold requests keep their blocks until as many are kept
    /// again (0: nothing to rebuild).
    kept_before_arc: usize,
    /// Residency's order after the stale blocks.
    residency_order: ResidencyOrder,
    /// Return ages of kept witnesses (in releases), and the horizon past
    /// which a kept block is stale.
    returns: ReturnAges,
    /// How witnesses are picked.
    witnesses: Witnesses,
    /// Blocks stored so far (counted for [`Witnesses::ByStoreCount`]).
    stored: u64,
    /// Reused kept blocks evicted before the horizon under residency, and
    /// their returns (their ghosts are marked).
    kept_evictions: KeptEvictions,
    /// `evict_many`'s victims' ghosts (kept to reuse its allocation).
    victim_ghosts: Vec<VictimGhost>,
}

/// What a victim leaves in the ghost lists.
#[derive(Debug, Clone, Copy)]
struct VictimGhost {
    /// [`ONCE`] or [`REUSED`].
    list: usize,
    /// The block's fingerprint.
    fingerprint: u64,
    /// A reused kept block evicted before the horizon under residency (the
    /// ghost's mark: its return is counted in [`KeptEvictions`]).
    kept_early: bool,
}

impl OnceReused {
    pub(crate) fn new(num_blocks: usize, rule: Rule) -> Result<Self> {
        Ok(Self {
            lists: IdLists::with_records(num_blocks, BlockState::UNCACHED)?,
            releases: 0,
            cached_once: 0,
            ghosts: GhostLists::new(GHOSTS_PER_BLOCK.saturating_mul(num_blocks))?,
            target: 0,
            capacity: num_blocks,
            rule,
            cold_requests: 0,
            kept_before_arc: 0,
            residency_order: ResidencyOrder::Plain,
            returns: ReturnAges::new(WITNESS_RETURNS),
            witnesses: Witnesses::ByStoreCount,
            stored: 0,
            kept_evictions: KeptEvictions::default(),
            victim_ghosts: Vec::new(),
        })
    }

    /// How witnesses are picked from now on ([`Witnesses::ByStoreCount`]
    /// unless set).
    pub(crate) fn set_witnesses(&mut self, witnesses: Witnesses) {
        self.witnesses = witnesses;
    }

    /// Whether the block being stored, of fingerprint `fp`, is a witness.
    fn next_is_witness(&mut self, fp: u64) -> bool {
        match self.witnesses {
            Witnesses::ByStoreCount => {
                self.stored += 1;
                self.stored.wrapping_mul(STORE_COUNT_MIX) >> (64 - WITNESS_RATE.trailing_zeros())
                    == 0
            }
            Witnesses::ByFingerprint => (fp >> 40) % WITNESS_RATE == 0,
        }
    }

    /// [`EvictionPolicy::on_request`] with the request already judged
    /// `warm` or cold: the rule's own test is at least half the prompt
    /// cached; a shadow cache, which sees a sample of the prompt's blocks,
    /// passes its estimate ([`super::Adaptive`]).
    pub(crate) fn on_judged_request(
        &mut self,
        hashes: &[BlockHash],
        hit: usize,
        warm: bool,
    ) -> Retention {
        // The blocks past the hit are about to be stored: load their ghost
        // buckets all at once rather than one miss at a time.
        for &h in &hashes[hit.min(hashes.len())..] {
            self.ghosts.load(fingerprint(h));
        }
        if warm {
            return Retention::Keep;
        }
        // Counted under every rule, so a switch finds the count going.
        self.cold_requests += 1;
        if self.rule == Rule::Residency && self.kept_before_arc > 0 {
            if self.kept() < self.kept_before_arc {
                return Retention::Keep;
            }
            self.kept_before_arc = 0;
        }
        if self.cold_requests % COLD_ADMISSION_PERIOD == 0 {
            Retention::Keep
        } else {
            Retention::Probation
        }
    }

    /// How residency orders its victims after the stale ones (see the
    /// module docs); ARC's order is the same in every case.
    pub(crate) fn set_residency_order(&mut self, order: ResidencyOrder) {
        self.residency_order = order;
    }

    /// Residency's order in force.
    #[cfg(test)]
    pub(crate) fn residency_order(&self) -> ResidencyOrder {
        self.residency_order
    }

    /// The rule in force.
    pub(crate) fn rule(&self) -> Rule {
        self.rule
    }

    /// The list `block` belongs in, by its classes.
    fn list_of(&self, block: BlockId) -> usize {
        let state = self.lists.record(block);
        let reused = usize::from(state.class == Class::Reused);
        match (state.kept, state.witness) {
            (true, true) => WITNESSES + reused,
            (kept, _) => reused * ARC_REUSED + usize::from(kept) * KEPT,
        }
    }

    /// Whether `block` is evictable (in one of the lists).
    pub(crate) fn is_evictable(&self, block: BlockId) -> bool {
        self.lists.contains(self.list_of(block), block)
    }

    /// Switches rules; the lists and classes stay as they are. Back under
    /// residency after a spell under ARC, cold requests keep their blocks
    /// until as many blocks are kept as when the spell began (see the
    /// module docs).
    pub(crate) fn set_rule(&mut self, rule: Rule) {
        if (self.rule, rule) == (Rule::Residency, Rule::Arc) {
            self.kept_before_arc = self.kept();
        }
        self.rule = rule;
    }

    /// Evictable blocks residency keeps (witnesses included).
    pub(crate) fn kept(&self) -> usize {
        KEPT_LISTS.iter().map(|&l| self.lists.len(l)).sum()
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

    /// Releases since `block`'s own (`u32::MAX` at most).
    fn age(&self, block: BlockId) -> u32 {
        let age = self.releases - self.lists.record(block).released_at;
        u32::try_from(age).unwrap_or(u32::MAX)
    }

    /// Of `lists`, the nonempty one whose front was released first.
    fn oldest(&self, lists: &[usize]) -> Option<usize> {
        lists
            .iter()
            .filter_map(|&l| {
                self.lists
                    .front(l)
                    .map(|b| (self.lists.record(b).released_at, l))
            })
            .min()
            .map(|(_, l)| l)
    }

    /// Remembers a victim in the ghost lists.
    fn push_ghost(&mut self, ghost: VictimGhost) {
        self.ghosts
            .push(ghost.list, ghost.fingerprint, ghost.kept_early);
    }

    /// Past this age a kept block is stale: the horizon, or the oldest
    /// return learned where reused kept blocks evicted before the horizon
    /// rarely come back (see [`KeptEvictions`]).
    fn stale_age(&self) -> u32 {
        let horizon = self.returns.horizon();
        if self.kept_evictions.rarely_return() {
            horizon.min(self.returns.oldest_return())
        } else {
            horizon
        }
    }

    /// Takes the next victim out of its list (it is uncached from now on):
    /// the block and its ghost (list, fingerprint, and whether it was a
    /// reused kept block evicted before the horizon under residency).
    /// Fetches the entry of the block after the list's new front, which a
    /// run of victims reaches next but one.
    fn take_victim(&mut self) -> Option<(BlockId, VictimGhost)> {
        let list = self.victim_list()?;
        let block = self.lists.pop_front(list)?;
        // Counted once a horizon is learned (before, every age is under
        // it), including blocks the shortened stale age evicts: their
        // returns are what turns the rule off.
        let horizon = self.returns.horizon();
        let kept_early = self.rule == Rule::Residency
            && REUSED_KEPT_LISTS.contains(&list)
            && horizon != u32::MAX
            && self.age(block) <= horizon;
        if kept_early {
            self.kept_evictions.evicted();
        }
        if let Some(after) = self.lists.front(list).and_then(|b| self.lists.after(b)) {
            self.lists.prefetch(after);
        }
        self.set_class(block, Class::Uncached);
        let ghost = VictimGhost {
            list: if REUSED_LISTS.contains(&list) {
                REUSED
            } else {
                ONCE
            },
            fingerprint: self.lists.record(block).fingerprint,
            kept_early,
        };
        Some((block, ghost))
    }

    /// The list the next victim comes from.
    fn victim_list(&self) -> Option<usize> {
        let (reused, reused_kept) = (ARC_REUSED, ARC_REUSED + KEPT);
        match self.rule {
            Rule::Residency => {
                let kept = self.oldest(&[KEPT, reused_kept]);
                let stale_age = self.stale_age();
                let stale = kept.filter(|&k| {
                    let front = self.lists.front(k).expect("nonempty");
                    self.age(front) > stale_age
                });
                let nonempty = |l: usize| (!self.lists.is_empty(l)).then_some(l);
                stale.or_else(|| match self.residency_order {
                    ResidencyOrder::Plain => self
                        .oldest(&[0, reused])
                        .or_else(|| self.oldest(&KEPT_LISTS)),
                    ResidencyOrder::SpareReused => nonempty(0)
                        .or_else(|| nonempty(reused))
                        .or_else(|| self.oldest(&KEPT_LISTS)),
                })
            }
            Rule::Arc => {
                let once = self.oldest(&ONCE_LISTS);
                match once {
                    Some(_) if self.cached_once > self.target => once,
                    _ => self.oldest(&REUSED_LISTS).or(once),
                }
            }
        }
    }
}

impl EvictionPolicy for OnceReused {
    fn name(&self) -> &'static str {
        match self.rule {
            Rule::Arc => "arc",
            Rule::Residency => "residency",
        }
    }

    fn on_request(&mut self, hashes: &[BlockHash], hit: usize) -> Retention {
        // A prompt without a full block has nothing to be judged by: warm.
        self.on_judged_request(hashes, hit, 2 * hit >= hashes.len())
    }

    fn on_store(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        retention: Retention,
        _parent: Option<BlockId>,
    ) {
        debug_assert_eq!(self.lists.record(block).class, Class::Uncached);
        let fp = fingerprint(hash);
        self.lists.record_mut(block).fingerprint = fp;
        let (b1, b2) = (self.ghosts.len(ONCE), self.ghosts.len(REUSED));
        let ghost = self.ghosts.take(fp);
        if ghost.is_some_and(|g| g.marked) {
            self.kept_evictions.returned();
        }
        let returned = match ghost.map(|g| g.list) {
            Some(ONCE) => {
                // Evicted as seen-once, yet it came back: keep new blocks longer.
                self.target = (self.target + (b2 / b1).max(1)).min(self.capacity);
                true
            }
            Some(_) => {
                // A reused block came back: protect reused blocks more.
                self.target = self.target.saturating_sub((b1 / b2).max(1));
                true
            }
            None => false,
        };
        self.set_class(block, if returned { Class::Reused } else { Class::Once });
        self.lists.record_mut(block).kept = retention == Retention::Keep;
        self.lists.record_mut(block).witness = self.next_is_witness(fp);
    }

    fn insert(&mut self, block: BlockId) {
        assert_ne!(
            self.lists.record(block).class,
            Class::Uncached,
            "block {block} was released but never stored"
        );
        self.lists.record_mut(block).released_at = self.releases;
        self.releases += 1;
        self.lists.record_mut(block).revived = false;
        let list = self.list_of(block);
        self.lists.push_back(list, block);
    }

    fn remove(&mut self, block: BlockId) {
        let list = self.list_of(block);
        self.lists.remove(list, block);
        // A return if a hit follows (the prefix cache also takes blocks out
        // to lock or pin them).
        self.lists.record_mut(block).revived = true;
    }

    fn evict(&mut self) -> Option<BlockId> {
        let (block, ghost) = self.take_victim()?;
        self.push_ghost(ghost);
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
            let Some((block, ghost)) = self.take_victim() else {
                break;
            };
            self.ghosts.prefetch(ghost.fingerprint);
            ghosts.push(ghost);
            out.push(block);
        }
        for &ghost in &ghosts {
            self.push_ghost(ghost);
        }
        self.victim_ghosts = ghosts;
        out.len() - start
    }

    fn on_hit(&mut self, block: BlockId) {
        debug_assert_ne!(self.lists.record(block).class, Class::Uncached);
        // The prefix cache takes a path out of the order before counting its
        // hits; a caller that does not finds the block at the back of the
        // list its new classes name, released now, so every list stays in
        // release order.
        let before = self.list_of(block);
        let revived = std::mem::take(&mut self.lists.record_mut(block).revived);
        if revived && before >= WITNESSES && self.rule == Rule::Residency {
            self.returns.record(self.age(block));
        }
        let listed = self.lists.contains(before, block);
        if listed {
            self.lists.remove(before, block);
        }
        self.set_class(block, Class::Reused);
        self.lists.record_mut(block).kept = true;
        if listed {
            self.insert(block);
        }
    }

    fn forget(&mut self, block: BlockId) {
        // Dropped, not evicted: no ghost, so its return moves no target.
        debug_assert!(!self.is_evictable(block));
        self.set_class(block, Class::Uncached);
        self.lists.record_mut(block).revived = false;
    }

    fn len(&self) -> usize {
        (0..LISTS).map(|l| self.lists.len(l)).sum()
    }

    fn is_empty(&self) -> bool {
        (0..LISTS).all(|l| self.lists.is_empty(l))
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
    fn store_free(p: &mut OnceReused, block: BlockId, hash: u128) {
        p.on_store(block, h(hash), Retention::Keep, None);
        p.insert(block);
    }

    #[test]
    fn blocks_seen_once_go_before_reused_ones() {
        let mut p = OnceReused::new(4, Rule::Arc).unwrap();
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
        let mut p = OnceReused::new(4, Rule::Arc).unwrap();
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
        let mut p = OnceReused::new(4, Rule::Arc).unwrap();
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
        let mut p = OnceReused::new(4, Rule::Arc).unwrap();
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
        let mut p = OnceReused::new(4, Rule::Arc).unwrap();
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

    fn hashes(n: u128) -> Vec<BlockHash> {
        (0..n).map(h).collect()
    }

    #[test]
    fn residency_evicts_probation_first_and_keeps_resident_requests_blocks() {
        let mut p = OnceReused::new(8, Rule::Residency).unwrap();
        // A request that found 3 of its 4 blocks cached is a resident's: keep.
        let kept = p.on_request(&hashes(4), 3);
        assert_eq!(kept, Retention::Keep);
        p.on_store(0, h(10), kept, None);
        p.on_store(1, h(11), kept, None);
        // A cold one (1 of 4): its blocks go on probation.
        let cold = p.on_request(&hashes(4), 1);
        assert_eq!(cold, Retention::Probation);
        p.on_store(2, h(12), cold, None);
        p.on_store(3, h(13), cold, None);
        for b in [1, 0, 3, 2] {
            p.insert(b); // each request's blocks released tail first
        }
        // The probation blocks go first although they were freed last.
        assert_eq!(
            std::iter::from_fn(|| p.evict()).collect::<Vec<_>>(),
            [3, 2, 1, 0]
        );
    }

    #[test]
    fn residency_admits_one_cold_request_in_32() {
        let mut p = OnceReused::new(8, Rule::Residency).unwrap();
        let kept: Vec<usize> = (1..=96)
            .filter(|_| p.on_request(&hashes(10), 2) == Retention::Keep)
            .collect();
        assert_eq!(kept.len(), 3);
        // Half the prompt cached is enough, and does not count as cold.
        assert_eq!(p.on_request(&hashes(10), 5), Retention::Keep);
        assert_eq!(p.on_request(&hashes(0), 0), Retention::Keep);
    }

    #[test]
    fn residency_ignores_ghost_returns_but_promotes_hits() {
        let mut p = OnceReused::new(4, Rule::Residency).unwrap();
        p.on_store(0, h(10), Retention::Probation, None);
        p.insert(0);
        assert_eq!(p.evict(), Some(0)); // hash 10 enters the once ghosts
                                        // ARC sees its return as reuse; a cold session coming back after the
                                        // cache turned over stays on probation under residency.
        p.on_store(0, h(10), Retention::Probation, None);
        assert_eq!(
            (p.lists.record(0).class, p.lists.record(0).kept),
            (Class::Reused, false)
        );
        assert_eq!(p.target, 1, "the target is still learned");
        p.on_hit(0);
        assert!(p.lists.record(0).kept);
    }

    #[test]
    fn arc_ignores_retention() {
        let mut p = OnceReused::new(4, Rule::Arc).unwrap();
        p.on_store(0, h(10), Retention::Keep, None);
        p.on_store(1, h(11), Retention::Probation, None);
        assert_eq!(
            (p.lists.record(0).class, p.lists.record(1).class),
            (Class::Once, Class::Once)
        );
        assert_eq!(
            (p.lists.record(0).kept, p.lists.record(1).kept),
            (true, false),
            "residency's view is kept too"
        );
        assert_eq!(p.name(), "arc");
        p.set_rule(Rule::Residency);
        assert_eq!((p.name(), p.rule()), ("residency", Rule::Residency));
    }

    #[test]
    fn a_switch_of_rules_finds_each_rules_order_intact() {
        let mut p = OnceReused::new(8, Rule::Arc).unwrap();
        // Released in this order: 0 once and kept, 1 once on probation,
        // 2 reused and kept (a hit).
        p.on_store(0, h(10), Retention::Keep, None);
        p.on_store(1, h(11), Retention::Probation, None);
        p.on_store(2, h(12), Retention::Probation, None);
        p.on_hit(2);
        for b in [0, 1, 2] {
            p.insert(b);
        }
        // Residency: probation first (1), then kept in release order (0, 2).
        p.set_rule(Rule::Residency);
        assert_eq!(p.victim_list().map(|l| p.lists.front(l)), Some(Some(1)));
        // ARC with target 0: once first in release order (0, then 1).
        p.set_rule(Rule::Arc);
        assert_eq!(p.evict(), Some(0));
        p.set_rule(Rule::Residency);
        assert_eq!(p.evict(), Some(1));
        assert_eq!(p.evict(), Some(2));
        assert_eq!(p.evict(), None);
    }

    #[test]
    fn residencys_orders_give_up_probation_or_its_seen_once_blocks_first() {
        // Released in this order: 0 reused on probation (it came back from
        // the once ghosts), 1 once on probation, 2 once and kept, 3 reused
        // and kept (hit).
        let build = |order: ResidencyOrder| {
            let mut p = OnceReused::new(8, Rule::Residency).unwrap();
            p.set_residency_order(order);
            p.on_store(0, h(10), Retention::Probation, None);
            p.insert(0);
            assert_eq!(p.evict(), Some(0));
            p.on_store(0, h(10), Retention::Probation, None);
            p.on_store(1, h(11), Retention::Probation, None);
            p.on_store(2, h(12), Retention::Keep, None);
            p.on_store(3, h(13), Retention::Probation, None);
            p.on_hit(3);
            for b in [0, 1, 2, 3] {
                p.insert(b);
            }
            assert_eq!(
                (p.lists.record(0).class, p.lists.record(0).kept),
                (Class::Reused, false)
            );
            assert_eq!(
                (p.lists.record(3).class, p.lists.record(3).kept),
                (Class::Reused, true)
            );
            p
        };
        let victims = |mut p: OnceReused| std::iter::from_fn(move || p.evict()).collect::<Vec<_>>();
        assert_eq!(
            victims(build(ResidencyOrder::Plain)),
            [0, 1, 2, 3],
            "probation, then kept, each in release order"
        );
        assert_eq!(
            victims(build(ResidencyOrder::SpareReused)),
            [1, 0, 2, 3],
            "probation seen once first, kept last"
        );
        // ARC's order is the same in every case.
        let arc = |order: ResidencyOrder| {
            let mut p = build(order);
            p.set_rule(Rule::Arc);
            victims(p)
        };
        assert_eq!(arc(ResidencyOrder::SpareReused), arc(ResidencyOrder::Plain));
    }

    #[test]
    fn a_kept_block_past_the_horizon_goes_before_probation_unless_a_witness() {
        // Hashes whose fingerprint makes a witness, and others.
        let witness = |x: u128| BlockHash(x << 1);
        let other = |x: u128| BlockHash(x << 1 | 1 << 41);
        let mut p = OnceReused::new(8, Rule::Residency).unwrap();
        p.set_witnesses(Witnesses::ByFingerprint);
        p.on_store(0, witness(1), Retention::Keep, None);
        p.on_store(1, other(2), Retention::Probation, None);
        // The witness comes back 2 releases after its own (counting its
        // own), 128 times: the horizon becomes 1.5 x 2.
        for _ in 0..WITNESS_RETURNS.relearn_period {
            assert_eq!(p.returns.horizon(), u32::MAX, "nothing learned yet");
            p.insert(0);
            p.insert(1);
            p.remove(1);
            p.remove(0);
            p.on_hit(0);
        }
        assert_eq!(p.returns.horizon(), 3);
        // Released in this order: 2 kept, 3 a kept witness, 4 on probation.
        p.on_store(2, other(3), Retention::Keep, None);
        p.on_store(3, witness(4), Retention::Keep, None);
        p.on_store(4, other(5), Retention::Probation, None);
        p.on_store(5, other(6), Retention::Probation, None);
        for b in [2, 3, 4] {
            p.insert(b);
        }
        assert_eq!(p.evict(), Some(4), "2 is 3 releases old: not stale yet");
        p.insert(1);
        p.insert(5);
        assert_eq!(
            p.evict(),
            Some(2),
            "5 releases old: stale, before probation"
        );
        assert!(p.age(3) > p.returns.horizon(), "the witness is as old");
        assert_eq!(p.evict(), Some(1), "but a witness never goes stale-first");
        assert_eq!(p.evict(), Some(5));
        assert_eq!(p.evict(), Some(3));
        // Only a hit on a kept witness taken out of the lists is a return:
        // not a kept block's, not a witness's on probation, not a witness
        // taken out to be locked (no hit), nor one hit under ARC.
        let learned = p.returns.learned();
        p.on_store(6, other(7), Retention::Keep, None);
        p.on_store(7, witness(8), Retention::Probation, None);
        p.on_store(3, witness(9), Retention::Keep, None);
        for b in [6, 7, 3] {
            p.insert(b);
            p.remove(b);
        }
        p.on_hit(6);
        p.on_hit(7);
        p.insert(3);
        p.set_rule(Rule::Arc);
        p.remove(3);
        p.on_hit(3);
        assert_eq!(p.returns.learned(), learned);
        p.insert(3);
        p.set_rule(Rule::Residency);
        p.remove(3);
        p.on_hit(3);
        assert_ne!(p.returns.learned(), learned, "this one is");
    }

    /// The stores (counted from 1) whose block `witnesses` makes a witness,
    /// of 1,600 stores of block 0 under the hashes `hash` gives.
    fn witnesses_picked(witnesses: Witnesses, hash: impl Fn(u128) -> BlockHash) -> Vec<u128> {
        let mut p = OnceReused::new(4, Rule::Residency).unwrap();
        p.set_witnesses(witnesses);
        let mut picked = Vec::new();
        for i in 1..=1600u128 {
            // Block 0 stored again and again: a witness is per store.
            p.on_store(0, hash(i), Retention::Keep, None);
            if p.lists.record(0).witness {
                picked.push(i);
            }
            p.forget(0);
        }
        picked
    }

    #[test]
    fn a_cache_picks_one_block_stored_in_16_as_a_witness_whatever_its_hash() {
        // Every hash a witness by fingerprint, then none.
        let by_fingerprint = |x: u128| BlockHash(x << 1);
        let not_by_fingerprint = |x: u128| BlockHash(x << 1 | 1 << 41);
        let picked = witnesses_picked(Witnesses::ByStoreCount, by_fingerprint);
        assert_eq!(
            picked,
            witnesses_picked(Witnesses::ByStoreCount, not_by_fingerprint)
        );
        assert!((95..=105).contains(&picked.len()), "{}", picked.len());
        // No stride: witnesses fall at most of the 16 places of a run of
        // 16 stores (a stride of 16 puts them all at one).
        let places: std::collections::BTreeSet<u128> = picked.iter().map(|i| i % 16).collect();
        assert!(places.len() >= 8, "{picked:?}");
        // By fingerprint, the hash decides.
        assert_eq!(
            witnesses_picked(Witnesses::ByFingerprint, by_fingerprint).len(),
            1600
        );
        assert!(witnesses_picked(Witnesses::ByFingerprint, not_by_fingerprint).is_empty());
    }

    #[test]
    fn where_reused_kept_blocks_evicted_early_do_not_come_back_the_oldest_return_is_the_horizon() {
        let mut p = OnceReused::new(8, Rule::Residency).unwrap();
        // No witnesses: by fingerprint, and no hash here makes one.
        p.set_witnesses(Witnesses::ByFingerprint);
        let h = |x: u128| BlockHash(x << 1 | 1 << 41);
        // Block 0 stored under `h(i)`, hit (reused) and released.
        let release_reused = |p: &mut OnceReused, i: u128| {
            p.on_store(0, h(i), Retention::Keep, None);
            p.insert(0);
            p.remove(0);
            p.on_hit(0);
            p.insert(0);
        };
        // ... and evicted.
        let evict_reused = |p: &mut OnceReused, i: u128| {
            release_reused(p, i);
            assert_eq!(p.evict(), Some(0));
        };
        // Not counted, any of them: evictions before a horizon is learned,
        // ...
        for i in 400..410 {
            evict_reused(&mut p, i);
        }
        // Witnesses came back at age 8: the horizon is 12, the oldest return 8.
        for _ in 0..WITNESS_RETURNS.relearn_period {
            p.returns.record(8);
        }
        assert_eq!((p.returns.horizon(), p.returns.oldest_return()), (12, 8));
        // ... under ARC, ...
        p.set_rule(Rule::Arc);
        for i in 500..510 {
            evict_reused(&mut p, i);
        }
        p.set_rule(Rule::Residency);
        // ... past the horizon (13 releases old), ...
        for i in 600..610 {
            release_reused(&mut p, i);
            p.on_store(1, h(i + 1000), Retention::Keep, None);
            p.insert(1);
            for _ in 0..12 {
                p.remove(1);
                p.insert(1);
            }
            assert_eq!(p.evict(), Some(0));
            p.remove(1);
            p.forget(1);
        }
        // ... and of kept blocks seen once.
        for i in 300..310u128 {
            p.on_store(0, h(i), Retention::Keep, None);
            p.insert(0);
            assert_eq!(p.evict(), Some(0));
        }
        // 256 reused kept blocks evicted before the horizon (nothing else to
        // evict).
        for i in 0..256u128 {
            if i == 255 {
                assert_eq!(p.stale_age(), 12, "255 counted: too few to tell");
            }
            evict_reused(&mut p, i);
        }
        assert_eq!(p.stale_age(), 8, "none came back");
        // A kept block 11 releases old goes before a probation block.
        let victim_of_the_scene = |p: &mut OnceReused, base: u128| {
            p.on_store(1, h(base), Retention::Keep, None);
            p.insert(1);
            p.on_store(2, h(base + 1), Retention::Probation, None);
            p.insert(2);
            p.on_store(3, h(base + 2), Retention::Keep, None);
            p.insert(3);
            for _ in 0..8 {
                p.remove(3);
                p.insert(3);
            }
            assert_eq!(p.age(1), 11);
            let victim = p.evict();
            for b in 1..=3 {
                if p.is_evictable(b) {
                    p.remove(b);
                }
                p.forget(b);
            }
            victim
        };
        assert_eq!(victim_of_the_scene(&mut p, 1000), Some(1));
        // The last 13 of the 256 come back (their ghosts, marked, are still
        // remembered): one in 20 is not rare, and the horizon is back.
        for i in 243..256u128 {
            p.on_store(0, h(i), Retention::Keep, None);
            p.forget(0);
        }
        assert_eq!(p.stale_age(), 12);
        assert_eq!(victim_of_the_scene(&mut p, 2000), Some(2));
    }

    #[test]
    fn after_a_spell_under_arc_cold_requests_are_kept_until_the_residents_are_back() {
        let mut p = OnceReused::new(64, Rule::Residency).unwrap();
        let hashes: Vec<BlockHash> = (1..=64).map(BlockHash).collect();
        let cold = |p: &mut OnceReused| p.on_request(&hashes[..4], 0);
        let store = |p: &mut OnceReused, blocks: std::ops::Range<BlockId>, retention| {
            for b in blocks {
                p.on_store(b, hashes[b as usize], retention, None);
                p.insert(b);
            }
        };
        // Eight residents, then a spell under ARC that evicts six of them.
        store(&mut p, 0..8, Retention::Keep);
        assert_eq!(p.kept(), 8);
        p.set_rule(Rule::Arc);
        for _ in 0..6 {
            p.evict().unwrap();
        }
        assert_eq!(p.kept(), 2);
        assert_eq!(cold(&mut p), Retention::Probation, "no rebuild under ARC");
        // Back under residency: cold requests are kept until eight blocks are.
        p.set_rule(Rule::Residency);
        assert_eq!(cold(&mut p), Retention::Keep);
        store(&mut p, 8..12, Retention::Keep);
        assert_eq!(cold(&mut p), Retention::Keep);
        store(&mut p, 12..14, Retention::Keep);
        assert_eq!(p.kept(), 8);
        for _ in 0..4 {
            assert_eq!(
                cold(&mut p),
                Retention::Probation,
                "rebuilt: the rule as it is"
            );
        }
        // A switch to the rule in force is no spell.
        p.set_rule(Rule::Residency);
        assert_eq!(cold(&mut p), Retention::Probation);
        // A spell that evicts nothing kept leaves nothing to rebuild.
        p.set_rule(Rule::Arc);
        p.set_rule(Rule::Residency);
        assert_eq!(cold(&mut p), Retention::Probation);
    }

    proptest! {
        /// The rules hold after any sequence of stores, releases, hits,
        /// drops, evictions and switches of rule, under each of residency's
        /// orders, either way of picking witnesses, and with a learned
        /// horizon or none: the class
        /// counts match the blocks, the target stays in range, and each
        /// victim is the block released first among those its rule puts
        /// first (under residency a kept block past the stale age, not a
        /// witness, before all).
        #[test]
        fn the_rules_hold_on_random_sequences(
            ops in prop::collection::vec((0..5u8, 0..12u128, any::<usize>()), 1..300),
            first in 0..2usize,
            order in 0..2usize,
            by_fingerprint: bool,
            learned_age in prop::option::of(0..24u32),
        ) {
            const N: usize = 6;
            const RULES: [Rule; 2] = [Rule::Arc, Rule::Residency];
            let mut p = OnceReused::new(N, RULES[first]).unwrap();
            const ORDERS: [ResidencyOrder; 2] = [ResidencyOrder::Plain, ResidencyOrder::SpareReused];
            p.set_residency_order(ORDERS[order]);
            if by_fingerprint {
                p.set_witnesses(Witnesses::ByFingerprint);
            }
            let mut stored = 0u64;
            for age in learned_age.into_iter().cycle().take(WITNESS_RETURNS.relearn_period as usize) {
                p.returns.record(age);
            }
            let mut free: Vec<BlockId> = (0..N as BlockId).collect();
            let mut held: Vec<BlockId> = Vec::new();
            // Evictable blocks in release order, with the releases counted.
            let mut released: Vec<BlockId> = Vec::new();
            let (mut releases, mut released_at) = (0u64, [0u64; N]);
            for (what, hash, pick) in ops {
                // One hash in three is a witness's by fingerprint.
                let hash = BlockHash(hash << 1 | (hash % 3) << 41);
                match what {
                    0 => {
                        let b = match free.pop() {
                            Some(b) => b,
                            None => {
                                let once = |b: &&BlockId| p.lists.record(**b).class == Class::Once;
                                let probation = |b: &&BlockId| !p.lists.record(**b).kept;
                                let stale = released
                                    .iter()
                                    .find(|&&b| p.lists.record(b).kept && !p.lists.record(b).witness)
                                    .filter(|&&b| releases - released_at[b as usize] > u64::from(p.stale_age()));
                                let expected = match p.rule() {
                                    Rule::Residency if stale.is_some() => stale,
                                    Rule::Residency => match ORDERS[order] {
                                        ResidencyOrder::Plain => None,
                                        ResidencyOrder::SpareReused => released.iter().find(|b| probation(b) && once(b)),
                                    }
                                    .or_else(|| released.iter().find(probation))
                                    .or(released.first()),
                                    Rule::Arc => {
                                        let first_once = released.iter().find(once);
                                        let first_reused = released.iter().find(|b| !once(b));
                                        match first_once {
                                            Some(_) if p.cached_once > p.target => first_once,
                                            _ => first_reused.or(first_once),
                                        }
                                    }
                                }.copied();
                                let Some(b) = p.evict() else {
                                    prop_assert!(released.is_empty());
                                    continue;
                                };
                                prop_assert_eq!(Some(b), expected);
                                released.retain(|&x| x != b);
                                b
                            }
                        };
                        let retention = if pick % 2 == 0 {
                            Retention::Keep
                        } else {
                            Retention::Probation
                        };
                        p.on_store(b, hash, retention, None);
                        prop_assert_eq!(p.lists.record(b).kept, retention == Retention::Keep);
                        stored += 1;
                        let witness = if by_fingerprint {
                            hash.0 >> 41 == 0
                        } else {
                            stored.wrapping_mul(STORE_COUNT_MIX) >> 60 == 0
                        };
                        prop_assert_eq!(p.lists.record(b).witness, witness);
                        held.push(b);
                    }
                    1 if !held.is_empty() => {
                        let b = held.swap_remove(pick % held.len());
                        p.insert(b);
                        released.push(b);
                        released_at[b as usize] = releases;
                        releases += 1;
                    }
                    2 if !released.is_empty() => {
                        let b = released.remove(pick % released.len());
                        p.remove(b);
                        p.on_hit(b);
                        prop_assert!(p.lists.record(b).kept && p.lists.record(b).class == Class::Reused);
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
                    4 => p.set_rule(RULES[pick % 2]),
                    _ => {}
                }
                let count = |c: Class| (0..N as BlockId).filter(|&b| p.lists.record(b).class == c).count();
                prop_assert_eq!(p.cached_once, count(Class::Once));
                prop_assert!(p.target <= N);
                prop_assert_eq!(p.len(), released.len());
                prop_assert!(released.iter().all(|&b| p.is_evictable(b)));
                prop_assert!(held.iter().all(|&b| !p.is_evictable(b)));
                prop_assert_eq!(p.len() + held.len() + free.len(), N);
            }
        }
    }
}
