//! Return time: evicts the cached blocks whose chain is expected back last,
//! using what only a prefix cache knows: how often a chain has been
//! extended (a conversation's turns) rather than forked from, whether the
//! request that last used it found it cached, and how long chains take to
//! come back, learned online.
//!
//! ```text
//!   class of a block:
//!     cold   stored by a request that found fewer than half its prompt's
//!            blocks cached, and not hit since (a hit makes it warm)
//!     turns  the times its chain was extended above it, 0 to 15, fixed
//!            when it is stored under the parent its caller names: the
//!            parent's turns, plus one when the parent had no cached child,
//!            was released since it was stored and hit since (the tip a
//!            previous turn stored: an extension); a child added under a
//!            block that has one already is a fork, and one under a block
//!            never hit or not yet released the same request's next commit. A released path takes its
//!            deepest block's turns (released deepest first, a block right
//!            after its child takes the larger of the two)
//!     shared a block hit 16 times or more (a system prompt): its own class
//!
//!   evict, in this order:
//!     1. the least recently used block, if it is older than the return
//!        horizon (learned: 1.5 x the 92nd percentile of return ages)
//!     2. while cold blocks rarely return near (see below): from the
//!        first non-empty class of
//!          cold 15 turns .. cold 0 turns, warm 15 .. warm 0, shared
//!        the oldest group or the youngest group (a group: the blocks one
//!        request released together), whichever is expected back later
//!        (learned remaining time to return at its age); tail first
//!     3. else cold and warm blocks of a turn count are one pool (its
//!        oldest head and its youngest group; ties go to the cold one):
//!        of every pool, the end expected back later (but not a young end
//!        twice as dense as the old one, where the densities are trusted);
//!        of those, the one whose turn count is least dense at its age
//!        (learned: the chance it comes back over the mean wait of those
//!        that do), ties to more turns; shared last
//! ```
//!
//! Why: on traffic whose sessions come back after the cache turns over (a
//! user thinking for minutes), LRU evicts the sessions about to return. A
//! session just served is the one expected back last, one that ended is
//! never back, and one that has gone on for many turns is the likeliest to
//! have ended. The ages at which blocks come back (hits, and stores of a
//! hash evicted earlier, remembered by a ghost table) give both the horizon
//! past which a chain has ended and, for any age, the expected time to its
//! return: whether the old end or the young end of a class goes first is
//! decided by them, so recency-friendly traffic keeps LRU's order. Cold
//! blocks go first only while they come back "near" (fewer releases after
//! their own than the cache holds: LRU would still have them) five times
//! less often than warm ones ([`NearReturns`]): where prefixes are forked
//! soon after they are first stored, cold-first evicts the very blocks LRU
//! keeps and hits with. In that case which turn count gives up the victim
//! is learned as well ([`TurnDensity`]): "more turns first" is a guess
//! about conversations, and a chain with many turns may still come back
//! sooner than a prompt with none (on large caches, and on the Mooncake
//! trace, whose forks are miscounted as turns when the branch they fork
//! from was evicted). The densities also guard the end of a pool: the
//! remaining time counts only the blocks that come back, so where most
//! come back young it would evict the young end of every pool (the
//! Mooncake trace at 131,072 blocks: 17% below LRU); a young end twice as
//! dense as the old one is kept, where the densities can be trusted (on
//! small caches they read low at old ages, whose returns the ghost table
//! forgot, just where conversations are about to come back).
//!
//! Children before parents: a released path's blocks share one turn count,
//! and a child is cold only if its parent is or was never hit (a hit on the
//! child is one on the parent), so within a path a child's class comes no
//! later than its parent's in every order; ties between the oldest heads of classes go to
//! the class evicted first, ties in a pool to the cold class, a shared
//! parent is in the class evicted last, and a path is released tail first,
//! so a group's first block is its deepest. A block is evicted before its
//! child only when a later request used the parent without the child (a
//! fork, or a system prompt in its first 16 uses): the parent is then
//! younger, and may be the young end picked, or it kept fewer turns than
//! the child (a path's turns stop at a block with two cached children), and
//! in the third order its turn count may be the less dense.
//!
//! Costs: O(1) per call (`on_request`: O(1) per uncached block, whose
//! ghost entries it prefetches): a block moves between intrusive lists; eviction
//! reads the heads of the non-empty classes (a 64-bit mask finds them, at
//! most 33) and two candidates of one class, or of each of the (at most
//! 16) turn counts listed in the third order; every 1,024 returns the
//! age and density tables are rebuilt. Memory: a 64-byte record per block
//! (one cache line per block touched) and 8 bytes of groups, and the ghost
//! table, 16 bytes per entry (its tag, last use, release stamp and turn
//! count; one cache line per look-up, fetched ahead
//! when the request is admitted), two entries per block rounded up to a
//! power of two: 104 to 136 bytes per block. Shared blocks' hits do not
//! teach the age tables nor the densities (their returns still count as
//! near returns, and their rare ghost returns teach the age tables).

use super::near_returns::NearReturns;
use super::return_ages::{Learning, ReturnAges};
use super::turn_density::TurnDensity;
use super::{EvictionPolicy, Retention};
use crate::alloc::filled;
use crate::error::Result;
use crate::hash::BlockHash;
use crate::ids::BlockId;
use crate::index::prefetch_line;

const NIL: u32 = u32::MAX;
/// Turn counts told apart; more count as the last.
const TURNS: usize = 16;
/// Classes: (cold, turns) pairs and the shared class.
const CLASSES: usize = 2 * TURNS + 1;
/// The class of shared blocks, evicted last.
const SHARED: usize = CLASSES - 1;
/// Hits that make a block shared: more than a conversation has turns.
const SHARED_HITS: u8 = 16;
/// How the return ages (in requests) are learned: 128 buckets (ages from
/// 245,760 on count as one), rebuilt every 1,024 returns, halved past
/// 65,536 (recent traffic weighs more); the horizon
/// is 1.5 x their 92nd percentile. Ages past it are still seen (stores of
/// evicted hashes), so it does not shrink itself.
const LEARNING: Learning = Learning {
    buckets: 128,
    relearn_period: 1024,
    window: 1 << 16,
    percentile: 92,
};

/// How many times as dense as a pool's old end its young end must be to
/// be kept, where the remaining time would evict it.
const YOUNG_DENSER: f32 = 2.0;

/// The class of a block last used by a request of this kind.
fn class_of(cold: bool, turns: u8) -> usize {
    usize::from(!cold) * TURNS + usize::from(turns).min(TURNS - 1)
}

/// The eviction order of the classes (see the module docs).
fn class_order() -> [u8; CLASSES] {
    let mut order = [SHARED as u8; CLASSES];
    let classes = [true, false]
        .into_iter()
        .flat_map(|cold| (0..TURNS as u8).rev().map(move |t| class_of(cold, t) as u8));
    for (slot, c) in order.iter_mut().zip(classes) {
        *slot = c;
    }
    order
}

/// A fingerprint per recently evicted hash with its last use, its release
/// stamp and its turn count: a direct-mapped table, one entry per slot (a
/// newer eviction overwrites).
#[derive(Debug)]
struct Ghosts {
    entries: Vec<Ghost>,
    mask: usize,
}

/// One slot of [`Ghosts`]: its tag and last use, its release stamp and
/// turn count, in one cache line.
#[derive(Debug, Clone, Copy)]
struct Ghost {
    /// The tag (32 bits, never 0: 0 is an empty slot) and the last use.
    key: u64,
    stamp: Stamp,
    /// Its turn count when evicted; `TURNS` for a shared block.
    turns: u8,
}

const _: () = assert!(size_of::<Ghost>() == 16);

impl Ghosts {
    fn new(num_blocks: usize) -> Result<Self> {
        let len = num_blocks.max(1).saturating_mul(2).next_power_of_two();
        let empty = Ghost {
            key: 0,
            stamp: Stamp(0),
            turns: 0,
        };
        Ok(Self {
            entries: filled(len, empty, "the policy's ghost table")?,
            mask: len - 1,
        })
    }

    fn slot(&self, fp: u64) -> usize {
        (fp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask
    }

    /// The entry's tag: 32 bits of `fp`, never 0, so no entry is 0.
    fn tag(fp: u64) -> u64 {
        (fp >> 32) | 1
    }

    /// Brings `fp`'s slot into the cache ahead of a `take`.
    fn prefetch(&self, fp: u64) {
        prefetch_line((&raw const self.entries[self.slot(fp)]).cast());
    }

    /// Remembers that `fp`, last used at `clock`, released as `stamp` says
    /// and with `turns` turns, was evicted; returns the last use and turns
    /// of the entry it overwrites, if any (forgotten unreturned).
    fn push(&mut self, fp: u64, clock: u32, stamp: Stamp, turns: u8) -> Option<(u32, u8)> {
        let slot = self.slot(fp);
        let forgotten = self.entries[slot];
        self.entries[slot] = Ghost {
            key: Self::tag(fp) << 32 | u64::from(clock),
            stamp,
            turns,
        };
        (forgotten.key != 0).then_some((forgotten.key as u32, forgotten.turns))
    }

    /// When `fp` was last used, its stamp and turns, if it is remembered
    /// (and forgets it).
    fn take(&mut self, fp: u64) -> Option<(u32, Stamp, u8)> {
        let slot = self.slot(fp);
        let e = self.entries[slot];
        (e.key >> 32 == Self::tag(fp)).then(|| {
            self.entries[slot].key = 0;
            (e.key as u32, e.stamp, e.turns)
        })
    }
}

/// The 64 bits of `hash` the ghost table keys on (never 0).
fn fingerprint(hash: BlockHash) -> u64 {
    (hash.0 as u64) | 1
}

/// A block's release, packed in 32 bits: whether it was cold (the top bit)
/// and the number of releases made by then (31 bits, wrapping).
#[derive(Debug, Clone, Copy)]
struct Stamp(u32);

impl Stamp {
    const COUNT: u32 = u32::MAX >> 1;

    fn new(cold: bool, releases: u32) -> Self {
        Self(u32::from(cold) << 31 | releases & Self::COUNT)
    }

    fn cold(self) -> bool {
        self.0 >> 31 != 0
    }

    /// Releases since this one, when `releases` have been made.
    fn since(self, releases: u32) -> u64 {
        u64::from(releases.wrapping_sub(self.0) & Self::COUNT)
    }
}

/// Group ids `0..num_blocks`, the lowest taken first.
fn free_groups(num_blocks: usize) -> Result<Vec<u32>> {
    let mut ids = filled(num_blocks, 0u32, "the policy's groups")?;
    for (id, g) in ids.iter_mut().rev().enumerate() {
        *g = id as u32;
    }
    Ok(ids)
}

/// What the policy knows of one block, in one cache line: every call on a
/// block (and on its parent, list neighbours or last released child) reads
/// and writes one record.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Record {
    fingerprint: u64,
    /// Links of its class list (each in release order, oldest first).
    prev: u32,
    next: u32,
    /// Its group while listed (NIL: not evictable).
    group: u32,
    /// The clock when it last became evictable.
    released_at: u32,
    /// Its age when a hit revived it, until `on_hit` records it.
    revived_age: u32,
    /// The block before it in its chain when it was stored (NIL: a root),
    /// and that block's `stored` number then.
    parent: u32,
    parent_stored: u32,
    /// Stores so far when it was stored: tells a parent's block reused
    /// since from the parent itself.
    stored: u32,
    /// Its last release.
    stamp: Stamp,
    class: u8,
    /// Last used by a cold request.
    cold: bool,
    /// Hits since stored, up to `SHARED_HITS`.
    hits: u8,
    /// Times the chain was extended above it, up to `TURNS - 1`.
    turns: u8,
    /// Cached blocks stored with it as their parent (saturating: 255 stays).
    children: u8,
    /// Released since stored: its last holder (pins included) let it go,
    /// so it may be a finished turn's tip.
    released: bool,
}

const _: () = assert!(size_of::<Record>() == 64);

/// The record of a block never stored.
const NEVER_STORED: Record = Record {
    fingerprint: 0,
    prev: NIL,
    next: NIL,
    group: NIL,
    released_at: 0,
    revived_age: NIL,
    parent: NIL,
    parent_stored: 0,
    stored: 0,
    stamp: Stamp(0),
    class: 0,
    cold: false,
    hits: 0,
    turns: 0,
    children: 0,
    released: false,
};

/// Return time over the evictable set (see the module docs).
#[derive(Debug)]
pub(crate) struct ReturnTime {
    blocks: Vec<Record>,
    /// First (deepest) block of each group still listed.
    group_first: Vec<u32>,
    free_groups: Vec<u32>,
    head: [u32; CLASSES],
    tail: [u32; CLASSES],
    /// Bit `c` set while class `c` lists a block.
    nonempty: u64,
    len: usize,
    /// Requests admitted so far: the policy's clock.
    clock: u32,
    ages: ReturnAges,
    ghosts: Ghosts,
    order: [u8; CLASSES],
    stores: u32,
    releases: u32,
    /// Whether cold blocks go first, from how often each kind returns near.
    near: NearReturns,
    /// The block released last and the turns its class took.
    last_released: u32,
    last_turns: u8,
    /// Whether the path being released is one chain so far (no block of
    /// it had another cached child): its blocks keep its turns.
    last_chain: bool,
    /// Hit density by turn count and age: while cold blocks do not go
    /// first, which turn count gives up the victim, and whether a pool's
    /// young end is spared.
    density: TurnDensity,
}

impl ReturnTime {
    /// An empty policy for a cache of `num_blocks` blocks.
    pub(crate) fn new(num_blocks: usize) -> Result<Self> {
        Ok(Self {
            blocks: filled(num_blocks, NEVER_STORED, "the policy's records")?,
            group_first: filled(num_blocks, NIL, "the policy's groups")?,
            free_groups: free_groups(num_blocks)?,
            head: [NIL; CLASSES],
            tail: [NIL; CLASSES],
            nonempty: 0,
            len: 0,
            clock: 0,
            ages: ReturnAges::new(LEARNING),
            ghosts: Ghosts::new(num_blocks)?,
            order: class_order(),
            stores: 0,
            releases: 0,
            near: NearReturns::new(num_blocks),
            last_released: NIL,
            last_turns: 0,
            last_chain: true,
            density: TurnDensity::new(TURNS),
        })
    }

    fn age(&self, b: BlockId) -> u32 {
        self.clock.wrapping_sub(self.blocks[b as usize].released_at)
    }

    /// Sets `b`'s class from its hits, coldness and turns.
    fn classify(&mut self, b: BlockId) {
        let i = b as usize;
        self.blocks[i].class = if self.blocks[i].hits >= SHARED_HITS {
            SHARED as u8
        } else {
            class_of(self.blocks[i].cold, self.blocks[i].turns) as u8
        };
    }

    /// Lists `b` at the young end of its class, in the current group.
    fn push(&mut self, b: BlockId) {
        let i = b as usize;
        let c = usize::from(self.blocks[i].class);
        self.blocks[i].released_at = self.clock;
        self.releases = self.releases.wrapping_add(1);
        self.blocks[i].stamp = Stamp::new(self.blocks[i].cold, self.releases);
        self.near.released(self.blocks[i].cold);
        if c != SHARED {
            self.density.released(c % TURNS);
        }
        let t = self.tail[c];
        let g = if t != NIL && self.blocks[t as usize].released_at == self.clock {
            self.blocks[t as usize].group
        } else {
            let g = self.free_groups.pop().expect("at most one group per block");
            self.group_first[g as usize] = b;
            g
        };
        self.blocks[i].group = g;
        self.blocks[i].prev = t;
        self.blocks[i].next = NIL;
        if t == NIL {
            self.head[c] = b;
            self.nonempty |= 1 << c;
        } else {
            self.blocks[t as usize].next = b;
        }
        self.tail[c] = b;
        self.len += 1;
    }

    /// Takes `b` out of its class list.
    fn unlink(&mut self, b: BlockId) {
        let i = b as usize;
        let c = usize::from(self.blocks[i].class);
        let (p, n, g) = (
            self.blocks[i].prev,
            self.blocks[i].next,
            self.blocks[i].group,
        );
        debug_assert_ne!(g, NIL, "block {b} is not evictable");
        if self.group_first[g as usize] == b {
            if n != NIL && self.blocks[n as usize].group == g {
                self.group_first[g as usize] = n;
            } else {
                self.group_first[g as usize] = NIL;
                self.free_groups.push(g);
            }
        }
        match p {
            NIL => self.head[c] = n,
            p => self.blocks[p as usize].next = n,
        }
        match n {
            NIL => self.tail[c] = p,
            n => self.blocks[n as usize].prev = p,
        }
        if self.head[c] == NIL {
            self.nonempty &= !(1 << c);
        }
        self.blocks[i].group = NIL;
        self.len -= 1;
    }

    /// Brings into cache what evicting `b` reads and writes that is not in
    /// cache already: the record after it in its list (`unlink` reads its
    /// group) and its ghost slot. Victims come from the ends of a class, so
    /// the block after a victim is usually the next one.
    fn prefetch_victim(&self, b: BlockId) {
        let r = &self.blocks[b as usize];
        if let Some(after) = self.blocks.get(r.next as usize) {
            prefetch_line(std::ptr::from_ref(after).cast());
        }
        self.ghosts.prefetch(r.fingerprint);
    }

    fn is_listed(&self, b: BlockId) -> bool {
        self.blocks[b as usize].group != NIL
    }

    /// A block released as `stamp` says came back.
    fn returned(&mut self, stamp: Stamp) {
        self.near.returned(stamp.cold(), stamp.since(self.releases));
    }

    /// `b` leaves the cache: its parent, if still cached, has one child fewer.
    fn orphan(&mut self, b: BlockId) {
        let i = b as usize;
        let p = std::mem::replace(&mut self.blocks[i].parent, NIL);
        if p != NIL && self.blocks[p as usize].stored == self.blocks[i].parent_stored {
            let c = &mut self.blocks[p as usize].children;
            if *c != u8::MAX {
                *c -= 1;
            }
        }
    }

    /// The next victim: see the module docs.
    fn victim(&self) -> Option<BlockId> {
        let cold_first = self.near.cold_first();
        let mut classes = self.nonempty;
        let mut oldest: Option<(u32, usize, BlockId)> = None;
        while classes != 0 {
            let c = classes.trailing_zeros() as usize;
            classes &= classes - 1;
            let b = self.head[c];
            // Ties go to the class evicted first: a child's comes no later
            // than its parent's.
            let key = (self.age(b), usize::MAX - merged_rank(c));
            if oldest.is_none_or(|(age, rank, _)| key > (age, rank)) {
                oldest = Some((key.0, key.1, b));
            }
        }
        let (age, _, oldest) = oldest?;
        if age > self.ages.horizon() {
            return Some(oldest);
        }
        if !cold_first {
            return self.merged_victim();
        }
        let c = usize::from(
            *self
                .order
                .iter()
                .find(|&&c| self.nonempty & (1 << c) != 0)?,
        );
        if c == SHARED {
            return Some(self.head[c]);
        }
        Some(self.back_later(self.head[c], self.youngest_group(c)))
    }

    /// Of a class's (or pool's) oldest block and its youngest group's
    /// first, the one expected back later (learned remaining time).
    fn back_later(&self, old: BlockId, young: BlockId) -> BlockId {
        if self.ages.remaining(self.age(young)) > self.ages.remaining(self.age(old)) {
            young
        } else {
            old
        }
    }

    /// The first (deepest) block of class `c`'s youngest group.
    fn youngest_group(&self, c: usize) -> BlockId {
        self.group_first[self.blocks[self.tail[c] as usize].group as usize]
    }

    /// The victim when cold and warm blocks of a turn count alike: of each
    /// turn count listed (cold and warm as one pool), the end
    /// [`Self::pool_victim`] picks; of those, the one whose turn count is
    /// least dense at its age
    /// ([`TurnDensity`]), ties going to more turns; the shared class's head
    /// once no other is listed.
    fn merged_victim(&self) -> Option<BlockId> {
        let listed = self.nonempty;
        let mut turns = (listed | listed >> TURNS) & ((1 << TURNS) - 1);
        if turns == 0 {
            let b = self.head[SHARED];
            return (b != NIL).then_some(b);
        }
        let mut victim: Option<(f32, BlockId)> = None;
        // Fewest turns first, so a tie goes to the later.
        while turns != 0 {
            let t = turns.trailing_zeros() as u8;
            turns &= turns - 1;
            let (old, young) = self.pool_ends(t);
            let b = self.pool_victim(t, old, young);
            let density = self.density.density(usize::from(t), self.age(b));
            if victim.is_none_or(|(least, _)| density <= least) {
                victim = Some((density, b));
            }
        }
        victim.map(|(_, b)| b)
    }

    /// Of the two ends of the pool of blocks with `t` turns, the one
    /// expected back later, unless that is the young end and, where the
    /// densities can be trusted ([`TurnDensity::trusted`]), the young end
    /// is [`YOUNG_DENSER`] times as dense as the old one: the remaining
    /// time counts only the blocks that come back, not how many do, and on
    /// traffic where most come back young (the Mooncake trace on a large
    /// cache) it would evict them.
    fn pool_victim(&self, t: u8, old: BlockId, young: BlockId) -> BlockId {
        let later = self.back_later(old, young);
        if later == old || !self.density.trusted(self.age(old), self.ages.horizon()) {
            return later;
        }
        let density = |b| self.density.density(usize::from(t), self.age(b));
        let young_density = density(young);
        // A young end with no density learned is no evidence either way.
        if young_density > 0.0 && young_density >= YOUNG_DENSER * density(old) {
            old
        } else {
            young
        }
    }

    /// The two ends of the pool of blocks with `t` turns, cold and warm
    /// alike: its oldest head and its youngest group's first block, ties
    /// going to the cold class (a cold child's parent may be warm, released
    /// with it). Called with a block of `t` turns listed.
    fn pool_ends(&self, t: u8) -> (BlockId, BlockId) {
        let listed = self.nonempty;
        let (cold, warm) = (class_of(true, t), class_of(false, t));
        match (listed >> cold & 1 != 0, listed >> warm & 1 != 0) {
            (true, true) => {
                let (hc, hw) = (self.head[cold], self.head[warm]);
                let old = if self.age(hw) > self.age(hc) { hw } else { hc };
                let (yc, yw) = (self.youngest_group(cold), self.youngest_group(warm));
                let young = if self.age(yw) < self.age(yc) { yw } else { yc };
                (old, young)
            }
            (true, false) => (self.head[cold], self.youngest_group(cold)),
            _ => (self.head[warm], self.youngest_group(warm)),
        }
    }
}

/// The rank of class `c` for ties between the oldest heads at the horizon
/// (most turns first, cold before warm, shared last): a child's class
/// never comes after its parent's within a path.
fn merged_rank(c: usize) -> usize {
    if c == SHARED {
        return CLASSES;
    }
    let (warm, turns) = (c / TURNS, c % TURNS);
    2 * (TURNS - 1 - turns) + warm
}

impl EvictionPolicy for ReturnTime {
    fn name(&self) -> &'static str {
        "return_time"
    }

    fn on_request(&mut self, hashes: &[BlockHash], hit: usize) -> Retention {
        self.clock = self.clock.wrapping_add(1);
        // The blocks it stores look their hashes up in the ghost table.
        for h in hashes.iter().skip(hit) {
            self.ghosts.prefetch(fingerprint(*h));
        }
        if 2 * hit < hashes.len() {
            Retention::Probation
        } else {
            Retention::Keep
        }
    }

    fn on_store(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        retention: Retention,
        parent: Option<BlockId>,
    ) {
        let i = block as usize;
        let fp = fingerprint(hash);
        if let Some((last_use, stamp, turns)) = self.ghosts.take(fp) {
            let age = self.clock.wrapping_sub(last_use);
            self.ages.record(age);
            if usize::from(turns) < TURNS {
                self.density.returned(usize::from(turns), age);
            }
            self.returned(stamp);
        }
        self.stores = self.stores.wrapping_add(1);
        // Under the tip a previous request stored and released, and a later
        // one hit: an extension; under a block with a child: a fork; under a
        // block never hit, or not yet released (another request hit it
        // while its own still prefills): the same request's next commit.
        let (turns, parent_stored) = match parent {
            Some(p) => {
                let up = &mut self.blocks[p as usize];
                let extends = up.children == 0 && up.hits > 0 && up.released;
                let turns = if up.hits >= SHARED_HITS {
                    0
                } else {
                    (up.turns + u8::from(extends)).min(TURNS as u8 - 1)
                };
                up.children = up.children.saturating_add(1);
                (turns, up.stored)
            }
            None => (0, self.blocks[i].parent_stored),
        };
        let r = &mut self.blocks[i];
        r.fingerprint = fp;
        r.cold = retention == Retention::Probation;
        r.hits = 0;
        r.turns = turns;
        r.revived_age = NIL;
        r.stored = self.stores;
        r.children = 0;
        r.released = false;
        r.parent = parent.unwrap_or(NIL);
        r.parent_stored = parent_stored;
        self.classify(block);
    }

    fn insert(&mut self, block: BlockId) {
        let i = block as usize;
        self.blocks[i].revived_age = NIL;
        self.blocks[i].released = true;
        // A path is released deepest first: a parent released right after
        // its child takes the child's turns (the chain's, as the request
        // that used it left them), and keeps them when the child is its
        // only one (the chain's count survives the eviction of its tail;
        // a prefix forked from keeps its own).
        let l = self.last_released;
        let below = l != NIL
            && self.blocks[l as usize].parent == block
            && self.blocks[l as usize].parent_stored == self.blocks[i].stored
            && self.blocks[l as usize].released_at == self.clock;
        self.classify(block);
        let shared = self.blocks[i].class == SHARED as u8;
        let keeps = below && self.last_chain && self.blocks[i].children <= 1 && !shared;
        self.last_chain = !below || keeps;
        if below && !shared {
            let turns = self.blocks[i].turns.max(self.last_turns);
            if keeps {
                self.blocks[i].turns = turns;
            }
            self.blocks[i].class = class_of(self.blocks[i].cold, turns) as u8;
        }
        self.last_released = block;
        self.last_turns = match usize::from(self.blocks[i].class) {
            SHARED => 0,
            c => (c % TURNS) as u8,
        };
        self.push(block);
    }

    fn remove(&mut self, block: BlockId) {
        self.unlink(block);
        self.blocks[block as usize].revived_age = self.age(block);
    }

    fn evict(&mut self) -> Option<BlockId> {
        let b = self.victim()?;
        let i = b as usize;
        let after = self.blocks[i].next;
        self.unlink(b);
        if after != NIL {
            self.prefetch_victim(after);
        }
        self.orphan(b);
        self.near.on_evict();
        let turns = match usize::from(self.blocks[i].class) {
            SHARED => TURNS,
            c => c % TURNS,
        };
        let forgotten = self.ghosts.push(
            self.blocks[i].fingerprint,
            self.blocks[i].released_at,
            self.blocks[i].stamp,
            turns as u8,
        );
        if let Some((last_use, forgotten_turns)) = forgotten {
            // A shared block's return would not teach the densities either.
            if usize::from(forgotten_turns) < TURNS {
                self.density.unwatched(self.clock.wrapping_sub(last_use));
            }
        }
        Some(b)
    }

    fn on_hit(&mut self, block: BlockId) {
        let i = block as usize;
        let age = std::mem::replace(&mut self.blocks[i].revived_age, NIL);
        if age != NIL {
            // A shared block's returns do not teach the age tables: its
            // frequent returns would teach the other classes' young-or-old
            // choice, and the horizon, ages that are not theirs.
            let class = usize::from(self.blocks[i].class);
            if class != SHARED {
                self.ages.record(age);
                self.density.returned(class % TURNS, age);
            }
            self.returned(self.blocks[i].stamp);
        }
        // The prefix cache takes a path out of the order before counting its
        // hits; a caller that does not finds the block reclassified in place.
        let listed = self.is_listed(block);
        if listed {
            self.unlink(block);
        }
        self.blocks[i].hits = self.blocks[i].hits.saturating_add(1).min(SHARED_HITS);
        self.blocks[i].cold = false;
        self.classify(block);
        if listed {
            self.push(block);
        }
    }

    fn forget(&mut self, block: BlockId) {
        self.orphan(block);
    }

    fn len(&self) -> usize {
        self.len
    }
}

// The victim search reads every class's head through one 64-bit mask of
// non-empty classes, and at most two candidates in one class: O(1).
const _: () = assert!(CLASSES <= u64::BITS as usize);

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    /// The turns of blocks `range`.
    fn turns(p: &ReturnTime, blocks: std::ops::Range<usize>) -> Vec<u8> {
        p.blocks[blocks].iter().map(|r| r.turns).collect()
    }

    fn hashes(first: u128, n: usize) -> Vec<BlockHash> {
        (0..n as u128)
            .map(|i| BlockHash((first + i) << 1))
            .collect()
    }

    /// `n` hashes whose fingerprints differ in their high bits too (the
    /// ghost table's tags), unlike [`hashes`]'.
    fn spread_hashes(n: u64) -> Vec<BlockHash> {
        (1..=n)
            .map(|i| BlockHash(u128::from(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))))
            .collect()
    }

    /// One request in the cache-only way: `path` holds its blocks, the
    /// leading `hit` of them cached; new blocks come from `free` or victims.
    /// Returns the victims.
    fn request(
        p: &mut ReturnTime,
        path: &[(BlockHash, BlockId)],
        hit: usize,
        free: &mut Vec<BlockId>,
    ) -> Vec<BlockId> {
        let hs: Vec<BlockHash> = path.iter().map(|&(h, _)| h).collect();
        let retention = p.on_request(&hs, hit);
        for &(_, b) in &path[..hit] {
            p.remove(b);
            p.on_hit(b);
        }
        let mut victims = Vec::new();
        for (k, &(h, b)) in path.iter().enumerate().skip(hit) {
            if let Some(i) = free.iter().position(|&f| f == b) {
                free.swap_remove(i);
            } else {
                assert_eq!(p.evict(), Some(b), "the test names the victims");
                victims.push(b);
            }
            let parent = k.checked_sub(1).map(|j| path[j].1);
            p.on_store(b, h, retention, parent);
        }
        for &(_, b) in path.iter().rev() {
            p.insert(b);
        }
        victims
    }

    #[test]
    fn a_cold_requests_new_blocks_go_before_a_warm_ones() {
        let mut p = ReturnTime::new(8).unwrap();
        let h = hashes(0, 4);
        // Warm: 3 of 4 cached (stored by nobody here: a fresh policy).
        assert_eq!(p.on_request(&h, 2), Retention::Keep);
        p.on_store(0, h[0], Retention::Keep, None);
        let cold = p.on_request(&hashes(10, 4), 1);
        assert_eq!(cold, Retention::Probation);
        p.on_store(1, hashes(10, 1)[0], cold, None);
        p.insert(0);
        p.insert(1);
        assert_eq!((p.evict(), p.evict(), p.evict()), (Some(1), Some(0), None));
    }

    /// Two cold groups of one class, blocks `first..first + 2` (the old
    /// one) released 150 requests before `first + 2..first + 4`.
    fn two_groups_150_requests_apart(p: &mut ReturnTime, first: BlockId) {
        let mut free: Vec<BlockId> = (first..first + 4).collect();
        let old: Vec<(BlockHash, BlockId)> =
            hashes(5000, 2).into_iter().zip(first..first + 2).collect();
        let young: Vec<(BlockHash, BlockId)> = hashes(6000, 2)
            .into_iter()
            .zip(first + 2..first + 4)
            .collect();
        request(p, &old, 0, &mut free);
        for _ in 0..150 {
            p.on_request(&[], 0);
        }
        request(p, &young, 0, &mut free);
    }

    /// Teaches `p` that cold blocks come back near and warm ones never:
    /// cold and warm blocks of a turn count are one pool.
    fn cold_returns_near(p: &mut ReturnTime) {
        p.near.on_evict();
        for _ in 0..10 {
            p.near.released(true);
            p.near.returned(true, 0);
            p.near.released(false);
        }
    }

    #[test]
    fn cold_blocks_go_first_only_while_they_rarely_return_near() {
        let setup = |p: &mut ReturnTime| {
            // A warm request's block, released first, then a cold one's.
            let h = hashes(0, 4);
            p.on_request(&h, 2);
            p.on_store(0, h[0], Retention::Keep, None);
            p.insert(0);
            let cold = p.on_request(&hashes(10, 4), 1);
            p.on_store(1, hashes(10, 1)[0], cold, None);
            p.insert(1);
        };
        let mut p = ReturnTime::new(8).unwrap();
        setup(&mut p);
        assert_eq!(p.evict(), Some(1), "cold first");
        // Cold blocks came back soon after their release, warm ones never:
        // cold and warm blocks of a turn count alike, oldest first.
        let mut p = ReturnTime::new(8).unwrap();
        cold_returns_near(&mut p);
        setup(&mut p);
        assert_eq!((p.evict(), p.evict()), (Some(0), Some(1)));
    }

    #[test]
    fn a_fork_is_no_turn_and_an_extension_is_one() {
        let mut p = ReturnTime::new(32).unwrap();
        let mut free: Vec<BlockId> = (0..32).collect();
        // A prefix of two blocks and a tail of two, stored by one request.
        let first: Vec<(BlockHash, BlockId)> = hashes(0, 4).into_iter().zip(0..4).collect();
        request(&mut p, &first, 0, &mut free);
        // Five requests fork from the prefix's last block (it has a child).
        for k in 0..5 {
            let mut path = first[..2].to_vec();
            path.push((hashes(100 + 10 * k, 1)[0], 4 + k as BlockId));
            request(&mut p, &path, 2, &mut free);
        }
        assert_eq!(p.blocks[0].hits, 5);
        assert_eq!(
            turns(&p, 0..9),
            [0; 9],
            "one request's blocks and forks are no turns"
        );
        assert_eq!(usize::from(p.blocks[1].class), class_of(false, 0));
        // A request that goes on past the tail (no cached child) extends it.
        let mut path = first.clone();
        path.push((hashes(200, 1)[0], 20));
        request(&mut p, &path, 4, &mut free);
        assert_eq!(p.blocks[20].turns, 1);
        assert_eq!(usize::from(p.blocks[20].class), class_of(false, 1));
        // Evicting the new tail makes its parent the tip again.
        for _ in 0..16 {
            p.on_request(&[], 0);
        }
        let mut order = Vec::new();
        while let Some(b) = p.evict() {
            order.push(b);
            if b == 20 {
                break;
            }
        }
        assert_eq!(order, [20], "the chain extended once goes first");
        // The path released with 20 kept its turn up to the fork point
        // (3 and 2, each 20's chain's only child; not 1, which the forks
        // share, nor 0 above it).
        assert_eq!(turns(&p, 0..4), [0, 0, 1, 1]);
        path.truncate(4);
        path.push((hashes(300, 1)[0], 21));
        free.push(20);
        request(&mut p, &path, 4, &mut free);
        assert_eq!(
            p.blocks[21].turns, 2,
            "the tip again, the chain's second turn"
        );
        // The next turn extends the new tip: three turns above its blocks.
        path.push((hashes(400, 2)[0], 22));
        path.push((hashes(400, 2)[1], 23));
        request(&mut p, &path, 5, &mut free);
        assert_eq!(turns(&p, 22..24), [3, 3]);
    }

    #[test]
    fn one_pool_takes_a_cold_child_before_its_warm_parent() {
        let mut p = ReturnTime::new(16).unwrap();
        // Blocks come back 200 requests after their release: the young end
        // goes first; cold and warm blocks return near alike: one pool.
        for _ in 0..LEARNING.relearn_period {
            p.ages.record(200);
        }
        p.near.on_evict();
        for _ in 0..10_000 {
            p.near.released(true);
            p.near.returned(true, 0);
        }
        let mut free: Vec<BlockId> = (0..16).collect();
        // An old warm block, then a chain, then a cold fork from its middle
        // released with the parent it hit.
        let other = [(hashes(900, 1)[0], 10)];
        request(&mut p, &other, 0, &mut free);
        request(&mut p, &other, 1, &mut free);
        let chain: Vec<(BlockHash, BlockId)> = hashes(0, 3).into_iter().zip(0..3).collect();
        request(&mut p, &chain, 0, &mut free);
        let mut fork = chain[..2].to_vec();
        fork.extend(hashes(100, 3).into_iter().zip(3..6));
        request(&mut p, &fork, 2, &mut free);
        assert!(!p.near.cold_first());
        assert_eq!(usize::from(p.blocks[1].class), class_of(false, 0));
        assert_eq!(usize::from(p.blocks[3].class), class_of(true, 0));
        // The warm class has the older head (10), its young group holds the
        // parent (1): the cold group released with it goes first.
        let order: Vec<BlockId> = (0..3).filter_map(|_| p.evict()).collect();
        assert_eq!(order, [5, 4, 3]);
    }

    #[test]
    fn a_chain_extended_more_often_goes_first() {
        let mut p = ReturnTime::new(16).unwrap();
        let mut free: Vec<BlockId> = (0..16).collect();
        let long: Vec<(BlockHash, BlockId)> = hashes(0, 3).into_iter().zip(0..3).collect();
        let short: Vec<(BlockHash, BlockId)> = hashes(100, 2).into_iter().zip(3..5).collect();
        request(&mut p, &long[..1], 0, &mut free);
        request(&mut p, &long[..2], 1, &mut free);
        request(&mut p, &long, 2, &mut free); // extended twice: 2 turns
        request(&mut p, &short[..1], 0, &mut free);
        request(&mut p, &short, 1, &mut free); // once

        // A path released takes its deepest block's turns; before any
        // return is seen each class goes oldest group first, deepest first:
        // the twice-extended chain before the newer one.
        let order: Vec<BlockId> = std::iter::from_fn(|| p.evict()).collect();
        assert_eq!(order, [2, 1, 0, 4, 3]);
    }

    #[test]
    fn while_cold_goes_with_warm_the_turn_count_that_returns_least_goes_first() {
        let run = |teach: bool| {
            let mut p = ReturnTime::new(16).unwrap();
            cold_returns_near(&mut p);
            if teach {
                // Blocks with 2 turns come back 10 requests after their
                // release, blocks with none never.
                for _ in 0..2000 {
                    p.density.released(0);
                    p.density.released(2);
                }
                for _ in 0..1024 {
                    p.density.returned(2, 10);
                }
            }
            let mut free: Vec<BlockId> = (0..16).collect();
            let chain: Vec<(BlockHash, BlockId)> = hashes(0, 3).into_iter().zip(0..3).collect();
            request(&mut p, &chain[..1], 0, &mut free);
            request(&mut p, &chain[..2], 1, &mut free);
            request(&mut p, &chain, 2, &mut free);
            let one_off: Vec<(BlockHash, BlockId)> = hashes(100, 2).into_iter().zip(3..5).collect();
            request(&mut p, &one_off, 0, &mut free);
            assert!(!p.near.cold_first());
            std::iter::from_fn(|| p.evict()).collect::<Vec<_>>()
        };
        // Before anything is learned, more turns go first.
        assert_eq!(run(false), [2, 1, 0, 4, 3]);
        // Once learned, the blocks that never come back go first, although
        // they have fewer turns and were released later.
        assert_eq!(run(true), [4, 3, 2, 1, 0]);
    }

    #[test]
    fn where_densities_are_trusted_a_far_denser_young_end_is_kept() {
        // Of 100,000 blocks released, `young` come back at age 2 and `old`
        // at age 400.
        let run = |watched: bool, young: usize, old: usize| {
            let mut p = ReturnTime::new(16).unwrap();
            cold_returns_near(&mut p);
            // Returns spread from 10 to 1,000 requests after release: the
            // young end is expected back later than one 150 requests old.
            for i in 0..LEARNING.relearn_period as u32 {
                p.ages.record(10 + i * 990 / 1024);
            }
            for _ in 0..100_000 {
                p.density.released(0);
            }
            if !watched {
                // Most blocks forgotten by the ghost table at age 50.
                for _ in 0..60_000 {
                    p.density.unwatched(50);
                }
            }
            for _ in 0..young {
                p.density.returned(0, 2);
            }
            for _ in 0..old {
                p.density.returned(0, 400);
            }
            two_groups_150_requests_apart(&mut p, 0);
            assert!(!p.near.cold_first());
            p.evict()
        };
        // 2,048 and 1,024: the young end 5.7 times as dense. Censored
        // densities are not trusted: the end expected back later.
        assert_eq!(run(false, 2048, 1024), Some(3));
        // Trusted: the old end, deepest block first.
        assert_eq!(run(true, 2048, 1024), Some(1));
        // 1,024 and 2,048: 1.4 times as dense, not enough.
        assert_eq!(run(true, 1024, 2048), Some(3));
    }

    #[test]
    fn a_ghost_push_reports_the_live_entry_it_overwrites() {
        let mut g = Ghosts::new(1).unwrap();
        let fps: Vec<u64> = spread_hashes(64).into_iter().map(fingerprint).collect();
        let same_slot: Vec<u64> = fps
            .iter()
            .copied()
            .filter(|&fp| g.slot(fp) == g.slot(fps[0]))
            .take(3)
            .collect();
        let stamp = Stamp::new(false, 0);
        assert_eq!(g.push(same_slot[0], 10, stamp, 3), None, "an empty slot");
        assert_eq!(g.push(same_slot[1], 20, stamp, 4), Some((10, 3)));
        assert!(g.take(same_slot[1]).is_some());
        assert_eq!(
            g.push(same_slot[2], 30, stamp, 5),
            None,
            "a taken entry is not forgotten"
        );
    }

    #[test]
    fn an_evicted_hash_the_ghost_table_forgets_is_unwatched_at_its_age() {
        let mut p = ReturnTime::new(1).unwrap();
        let slot_of = |p: &ReturnTime, h: BlockHash| p.ghosts.slot(fingerprint(h));
        let candidates = spread_hashes(64);
        let first = candidates[0];
        let same_slot: Vec<BlockHash> = candidates
            .into_iter()
            .filter(|&h| slot_of(&p, h) == slot_of(&p, first))
            .take(4)
            .collect();
        let store_and_evict = |p: &mut ReturnTime, h: BlockHash, hits: u8, wait: u32| {
            p.on_store(0, h, Retention::Keep, None);
            for _ in 0..hits {
                p.on_request(&[], 0);
                p.on_hit(0);
            }
            p.insert(0);
            for _ in 0..wait {
                p.on_request(&[], 0);
            }
            assert_eq!(p.evict(), Some(0));
        };
        store_and_evict(&mut p, same_slot[0], 0, 5);
        assert_eq!(p.density.forgotten(), []);
        // Its ghost overwritten 5 requests after its release.
        store_and_evict(&mut p, same_slot[1], 0, 0);
        assert_eq!(p.density.forgotten(), [(5, 1)]);
        // A shared block's ghost: the one it overwrites counts (16 hits,
        // one request each, after that one's release: age 16, in bucket
        // 16 to 17)...
        store_and_evict(&mut p, same_slot[2], SHARED_HITS, 0);
        assert_eq!(p.density.forgotten(), [(5, 1), (17, 1)]);
        // ... and the shared one, overwritten in turn, does not.
        store_and_evict(&mut p, same_slot[3], 0, 0);
        assert_eq!(p.density.forgotten(), [(5, 1), (17, 1)]);
    }

    #[test]
    fn an_evicted_blocks_return_teaches_the_density_of_its_turn_count() {
        let mut p = ReturnTime::new(3).unwrap();
        let mut free: Vec<BlockId> = (0..3).collect();
        let chain: Vec<(BlockHash, BlockId)> = hashes(0, 3).into_iter().zip(0..3).collect();
        request(&mut p, &chain[..1], 0, &mut free);
        request(&mut p, &chain[..2], 1, &mut free);
        request(&mut p, &chain, 2, &mut free);
        assert_eq!(turns(&p, 0..3), [2, 2, 2], "extended twice");
        let before = p.density.returns_by_turns();
        let victims: BTreeSet<BlockId> = std::iter::from_fn(|| p.evict()).collect();
        assert_eq!(victims, BTreeSet::from([0, 1, 2]));
        // Its hash stored again: a return of a block with 2 turns.
        p.on_request(&[chain[0].0], 0);
        p.on_store(0, chain[0].0, Retention::Probation, None);
        let mut after = before.clone();
        after[2] += 1;
        assert_eq!(p.density.returns_by_turns(), after);

        // A shared block's return teaches nothing.
        let shared = hashes(500, 1)[0];
        p.on_store(1, shared, Retention::Keep, None);
        p.insert(1);
        for _ in 0..SHARED_HITS {
            p.remove(1);
            p.on_hit(1);
            p.insert(1);
        }
        assert_eq!(p.blocks[1].class, SHARED as u8);
        p.insert(0);
        assert_eq!((p.evict(), p.evict()), (Some(0), Some(1)));
        let before = p.density.returns_by_turns();
        p.on_request(&[shared], 0);
        p.on_store(1, shared, Retention::Probation, None);
        assert_eq!(p.density.returns_by_turns(), before);
    }

    #[test]
    fn returns_long_after_release_make_the_young_group_go_first() {
        let mut p = ReturnTime::new(64).unwrap();
        // Teach it that blocks come back 200 requests after their release.
        for round in 0..u128::from(LEARNING.relearn_period) {
            let h = BlockHash(round << 1);
            p.on_store(0, h, Retention::Keep, None);
            p.insert(0);
            for _ in 0..200 {
                p.on_request(&[], 0);
            }
            p.remove(0);
            p.on_hit(0);
            p.forget(0);
        }
        assert!(
            p.ages.horizon() > 200 && p.ages.horizon() < 400,
            "{}",
            p.ages.horizon()
        );
        two_groups_150_requests_apart(&mut p, 1);
        // The old group is due back in about 50 requests, the young one in
        // 200: the young one goes first, deepest block first.
        assert_eq!(p.evict(), Some(4));
        assert_eq!(p.evict(), Some(3));
        // Past the horizon, a block goes first whatever its class.
        for _ in 0..400 {
            p.on_request(&[], 0);
        }
        assert_eq!(p.evict(), Some(2));
    }

    #[test]
    fn a_stored_hash_that_was_evicted_records_its_return_age() {
        let mut p = ReturnTime::new(4).unwrap();
        let h = BlockHash(42 << 1);
        p.on_store(0, h, Retention::Keep, None);
        p.insert(0);
        assert_eq!(p.evict(), Some(0));
        for _ in 0..7 {
            p.on_request(&[], 0);
        }
        p.on_store(1, h, Retention::Keep, None);
        assert_eq!(p.ages.learned(), [(7, 1)]);
    }

    #[test]
    fn a_block_hit_16_times_is_shared_and_goes_last() {
        let mut p = ReturnTime::new(4).unwrap();
        p.on_store(0, BlockHash(2), Retention::Keep, None);
        for _ in 0..SHARED_HITS {
            p.on_request(&[], 0);
            p.on_hit(0);
        }
        assert_eq!(usize::from(p.blocks[0].class), SHARED);
        p.insert(0);
        p.on_request(&hashes(9, 1), 0);
        p.on_store(1, BlockHash(4), Retention::Probation, None);
        p.insert(1);
        assert_eq!((p.evict(), p.evict()), (Some(1), Some(0)));
    }

    proptest! {
        /// Conversations over their own chains (no two share a block): any
        /// sequence of turns, each extending its chain by the tokens it
        /// cached, evicts every block at most once, only while evictable,
        /// and never a block whose child is cached; with return ages
        /// learned (a horizon that old heads pass, young groups picked) and
        /// cold and warm blocks in either order.
        #[test]
        fn children_go_before_parents(
            turns in prop::collection::vec((0..6usize, 1..4usize), 1..300),
            learned in prop::collection::vec(0..48u32, 0..6),
            merged: bool,
        ) {
            const N: usize = 12;
            let mut p = ReturnTime::new(N).unwrap();
            for age in learned.iter().cycle().take(LEARNING.relearn_period as usize) {
                p.ages.record(*age);
            }
            if merged {
                // Cold blocks came back near, warm ones never: one pool.
                p.near.on_evict();
                for _ in 0..10_000 {
                    p.near.released(true);
                    p.near.returned(true, 0);
                }
            }
            let mut free: Vec<BlockId> = (0..N as BlockId).collect();
            // Each conversation's chain of hashes; cached: hash -> block.
            let mut chains: Vec<Vec<BlockHash>> = vec![Vec::new(); 6];
            let mut cached: BTreeMap<BlockHash, BlockId> = BTreeMap::new();
            let mut parent: BTreeMap<BlockId, Option<BlockId>> = BTreeMap::new();
            for (conv, grow) in turns {
                let chain = &mut chains[conv];
                for _ in 0..grow {
                    chain.push(BlockHash(((conv as u128) << 32 | chain.len() as u128) << 1));
                }
                if chain.len() > N {
                    chain.truncate(N);
                }
                let hs = chain.clone();
                let hit = hs.iter().take_while(|h| cached.contains_key(h)).count();
                let retention = p.on_request(&hs, hit);
                let mut path: Vec<BlockId> = Vec::new();
                for h in &hs[..hit] {
                    let b = cached[h];
                    p.remove(b);
                    p.on_hit(b);
                    path.push(b);
                }
                for h in &hs[hit..] {
                    let b = match free.pop() {
                        Some(b) => b,
                        None => {
                            let Some(v) = p.evict() else { break };
                            prop_assert!(!path.contains(&v), "evicted a held block");
                            let children: BTreeSet<BlockId> = parent
                                .iter()
                                .filter(|&(_, &pa)| pa == Some(v))
                                .map(|(&c, _)| c)
                                .collect();
                            prop_assert!(children.is_empty(), "evicted {v} before its children {children:?}");
                            cached.retain(|_, &mut b| b != v);
                            parent.remove(&v);
                            v
                        }
                    };
                    if cached.contains_key(h) {
                        // Cached past a miss: this copy stays unhashed.
                        free.push(b);
                        break;
                    }
                    p.on_store(b, *h, retention, path.last().copied());
                    cached.insert(*h, b);
                    parent.insert(b, path.last().copied());
                    path.push(b);
                }
                for &b in path.iter().rev() {
                    p.insert(b);
                }
                prop_assert_eq!(p.len(), cached.len());
            }
            if merged {
                prop_assert!(!p.near.cold_first(), "the pool held");
            }
        }
    }
}
