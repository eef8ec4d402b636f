//! Ghost lists: the fingerprints of recently evicted blocks, two lists in
//! one compact table.

use crate::alloc::filled;
use crate::error::Result;
use crate::hash::BlockHash;
use crate::index::prefetch_line;

/// A block hash reduced to 64 bits, never 0. Policies only use it to
/// recognize blocks that come back: a collision can only mislead a
/// policy's choice, never the cache's contents.
pub(crate) fn fingerprint(hash: BlockHash) -> u64 {
    (hash.0 as u64) | 1
}

/// Generations an entry lives, at most: it expires once its list has begun
/// this many newer ones (a generation is `capacity / LIFE` pushes to a
/// list; a list of fewer than `LIFE` fingerprints has a generation a push).
const LIFE: u32 = 256;
/// Bits of an entry's generation (wrapping): eight lives, so that an entry
/// left dead in its bucket cannot pass for a live one (a push clears the
/// dead entries of its bucket, and a bucket is pushed to about four times
/// a life).
const GEN_BITS: u32 = 11;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
/// Bits of an entry's tag (the rest of the 64 bits: list 1, generation 11).
const TAG_BITS: u32 = 52;
/// Where an entry's list bit begins.
const LIST_SHIFT: u32 = GEN_BITS;
/// Where an entry's tag begins.
const TAG_SHIFT: u32 = GEN_BITS + 1;
/// Entries per bucket: two 64-byte cache lines.
const WAYS: usize = 16;

/// One way of a bucket: tag, list and generation.
type Entry = u64;

/// Two ghost lists: each remembers about the last `capacity` fingerprints
/// pushed to it, and `take` finds a fingerprint in either in one bucket
/// (two adjacent cache lines).
///
/// ```text
///   bucket = fingerprint * golden >> shift        (16 ways of 8 bytes: two cache lines)
///   entry  = tag: fingerprint * other >> 12 | list | generation: 11 bits
///   live   = generations[list] - generation < life (256)   (older entries expire)
/// ```
///
/// A list's generation advances every `capacity / 256` pushes to it
/// (rounded up), so an entry lives for its list's next `capacity` pushes,
/// less up to 1/128 of them (exactly `capacity`, for lists of up to 256).
/// Entries expire by their generation, so nothing is ever cleaned up
/// beyond the bucket at hand: a push writes one entry (and clears the dead
/// ones of its bucket), a take clears one. How many entries each
/// generation still holds is counted, so a list's length is exact as
/// generations expire. A push into a full bucket replaces its entry with
/// the least life left, so a fingerprint can be forgotten early; buckets
/// are a quarter full on average, so that is rare (it matters: losing old
/// ghosts of the busier list starves ARC of the returns it learns from).
/// A false match needs a tag collision within one bucket (52 bits, the
/// lowest forced to 1): none in practice, which matters because a false
/// match moves ARC's split (short tags, 20 bits, matched falsely once in
/// 250,000 lookups and moved hit rates by whole percents). Memory is fixed
/// at construction: a bucket of 16 ways per two fingerprints a list holds
/// (rounded up to a power of two), so 32 to 64 bytes per fingerprint
/// remembered.
#[derive(Debug, Clone, Copy)]
#[repr(align(128))]
struct Bucket([Entry; WAYS]);

#[derive(Debug)]
pub(crate) struct GhostLists {
    buckets: Vec<Bucket>,
    shift: u32,
    /// Pushes to a list per generation, and generations an entry lives.
    generation_len: u32,
    life: u32,
    /// Per list: the generation of its last push (wrapping; one before 0
    /// until the first), the pushes left before its next generation begins,
    /// and the slot of `born` that counts its current generation.
    generations: [u32; 2],
    to_next_generation: [u32; 2],
    current_slot: [u32; 2],
    /// Per list, live entries by generation (in a ring of `life` slots).
    born: [Vec<u32>; 2],
    /// Live fingerprints per list.
    len: [usize; 2],
}

impl GhostLists {
    /// Two lists of `capacity` fingerprints each (at most 2^30).
    pub(crate) fn new(capacity: usize) -> Result<Self> {
        let capacity = capacity.clamp(1, 1 << 30);
        // A bucket (16 ways) per two fingerprints one list holds: 4 ways per
        // live entry of the two, buckets a quarter full on average.
        let buckets = capacity.div_ceil(2).next_power_of_two();
        // Generations of a whole number of pushes, at most `LIFE` of them
        // within `capacity` pushes.
        let generation_len = (capacity as u32).div_ceil(LIFE);
        let life = capacity as u32 / generation_len;
        Ok(Self {
            buckets: filled(buckets, Bucket([0; WAYS]), "the ghost lists")?,
            shift: 64 - buckets.trailing_zeros(),
            generation_len,
            life,
            generations: [u32::MAX; 2],
            to_next_generation: [0; 2],
            current_slot: [life - 1; 2],
            born: [vec![0; life as usize], vec![0; life as usize]],
            len: [0; 2],
        })
    }

    /// Fingerprints list `list` (0 or 1) remembers.
    pub(crate) fn len(&self, list: usize) -> usize {
        self.len[list]
    }

    fn bucket(&self, fp: u64) -> usize {
        // The top bits of the product (Fibonacci hashing); a one-bucket
        // table shifts by 64, which `checked_shr` turns into bucket 0.
        fp.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .checked_shr(self.shift)
            .unwrap_or(0) as usize
    }

    /// The entry's tag: 52 bits of the fingerprint mixed by another
    /// multiplier than the bucket's (a caller's hashes need not be uniform
    /// in any bits), never 0.
    fn tag(fp: u64) -> Entry {
        fp.wrapping_mul(0xA076_1D64_78BD_642F) >> (64 - TAG_BITS) | 1
    }

    /// A live entry's list and age in generations (`None` for an empty way
    /// or an expired entry).
    fn live(&self, entry: Entry) -> Option<(usize, u32)> {
        let list = (entry >> LIST_SHIFT & 1) as usize;
        let age = self.generations[list].wrapping_sub(entry as u32 & GEN_MASK) & GEN_MASK;
        (entry != 0 && age < self.life).then_some((list, age))
    }

    /// Generations to go before the entry expires (0: dead or empty).
    fn life(&self, entry: Entry) -> u32 {
        self.live(entry).map_or(0, |(_, age)| self.life - age)
    }

    /// The slot of `born[list]` counting the generation `age` (under
    /// `life`) generations old.
    fn born_slot(&self, list: usize, age: u32) -> usize {
        let current = self.current_slot[list];
        (if age <= current {
            current - age
        } else {
            current + self.life - age
        }) as usize
    }

    /// The way of bucket `b` holding `tag`, live or not.
    fn way_of(&self, b: usize, tag: Entry) -> Option<usize> {
        // A mask of the matching ways, without a branch a way.
        let matches = self.buckets[b]
            .0
            .iter()
            .enumerate()
            .fold(0u32, |m, (w, &e)| m | u32::from(e >> TAG_SHIFT == tag) << w);
        (matches != 0).then(|| matches.trailing_zeros() as usize)
    }

    /// Clears way `way` of bucket `b`; a live entry is counted out, and
    /// its list returned.
    fn clear(&mut self, b: usize, way: usize) -> Option<usize> {
        let entry = std::mem::take(&mut self.buckets[b].0[way]);
        let (list, age) = self.live(entry)?;
        // Saturating: counts stay sane even if an entry outlived eight
        // lives unseen and passes for live (it cannot, short of a bucket
        // unpushed for seven lives).
        let slot = self.born_slot(list, age);
        let born = &mut self.born[list][slot];
        *born = born.saturating_sub(1);
        self.len[list] = self.len[list].saturating_sub(1);
        Some(list)
    }

    /// Starts loading `fp`'s bucket into the cache, so that a `take` or
    /// `push` of it soon after does not wait for memory (a hint: the
    /// processor may drop it).
    pub(crate) fn prefetch(&self, fp: u64) {
        let ways = &self.buckets[self.bucket(fp)].0;
        for way in [0, WAYS / 2] {
            prefetch_line(std::ptr::from_ref(&ways[way]).cast());
        }
    }

    /// Loads `fp`'s bucket now, its value dropped: a batch of these before
    /// the lookups they serve overlaps its misses, where as many prefetch
    /// hints were dropped (the long-prompt bench's profile: a store's lookup
    /// missed as often with its hint given at admission as without).
    pub(crate) fn load(&self, fp: u64) {
        let ways = &self.buckets[self.bucket(fp)].0;
        std::hint::black_box((ways[0], ways[WAYS / 2]));
    }

    /// Remembers `fp` in list `list`, as its newest entry.
    pub(crate) fn push(&mut self, list: usize, fp: u64) {
        // A new generation: the one a life before it expires.
        if self.to_next_generation[list] == 0 {
            self.to_next_generation[list] = self.generation_len;
            self.generations[list] = self.generations[list].wrapping_add(1);
            let slot = &mut self.current_slot[list];
            *slot = if *slot + 1 == self.life { 0 } else { *slot + 1 };
            let slot = *slot as usize;
            self.len[list] -= std::mem::take(&mut self.born[list][slot]) as usize;
        }
        self.to_next_generation[list] -= 1;
        let b = self.bucket(fp);
        let tag = Self::tag(fp);
        let mut ways = self.buckets[b].0;
        for way in &mut ways {
            if self.live(*way).is_none() {
                *way = 0;
            }
        }
        self.buckets[b].0 = ways;
        // A sighting of the same fingerprint, else the way with least life.
        let way = self.way_of(b, tag).unwrap_or_else(|| {
            let ways = &self.buckets[b].0;
            (0..WAYS).min_by_key(|&w| self.life(ways[w])).unwrap()
        });
        self.clear(b, way);
        let generation = self.generations[list] & GEN_MASK;
        self.buckets[b].0[way] =
            tag << TAG_SHIFT | (list as Entry) << LIST_SHIFT | Entry::from(generation);
        let slot = self.born_slot(list, 0);
        self.born[list][slot] += 1;
        self.len[list] += 1;
    }

    /// Forgets `fp`; returns the list that remembered it.
    pub(crate) fn take(&mut self, fp: u64) -> Option<usize> {
        let b = self.bucket(fp);
        let tag = Self::tag(fp);
        let way = self.way_of(b, tag)?;
        self.clear(b, way)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes `f` from `g`: the list that remembered it.
    fn list(g: &mut GhostLists, f: u64) -> Option<usize> {
        g.take(f)
    }

    /// The first `n` fingerprints, split into those in the first one's
    /// bucket (it included) and the others.
    fn by_bucket_of_the_first(g: &GhostLists, n: u64) -> (Vec<u64>, Vec<u64>) {
        let b = g.bucket(fp(0));
        (0..n).map(fp).partition(|&f| g.bucket(f) == b)
    }

    /// Distinct fingerprints spread over the table.
    fn fp(i: u64) -> u64 {
        (i.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ i << 40) | 1
    }

    #[test]
    fn each_list_remembers_its_last_pushes() {
        // At most 8 live entries: no bucket can overflow.
        let mut g = GhostLists::new(3).unwrap();
        let f: Vec<u64> = (0..7).map(fp).collect();
        for &x in &f[..4] {
            g.push(0, x);
        }
        g.push(1, f[6]);
        assert_eq!((g.len(0), g.len(1)), (3, 1));
        assert_eq!(list(&mut g, f[0]), None, "the oldest expired");
        assert_eq!(list(&mut g, f[1]), Some(0));
        assert_eq!(list(&mut g, f[1]), None);
        assert_eq!(list(&mut g, f[6]), Some(1));
        assert_eq!((g.len(0), g.len(1)), (2, 0));
        g.push(0, f[4]); // expires f[1], taken already
        g.push(0, f[5]); // expires f[2]
        assert_eq!(list(&mut g, f[2]), None);
        assert_eq!(
            [list(&mut g, f[3]), list(&mut g, f[4]), list(&mut g, f[5])],
            [Some(0); 3]
        );
        assert_eq!(list(&mut g, fp(1 << 40)), None, "never pushed");
    }

    #[test]
    fn a_second_sighting_moves_the_fingerprint() {
        let mut g = GhostLists::new(2).unwrap();
        let f: Vec<u64> = (0..4).map(fp).collect();
        g.push(0, f[0]);
        g.push(1, f[0]);
        assert_eq!((g.len(0), g.len(1)), (0, 1));
        // List 0 turns over; f[0] lives on in list 1.
        for &x in &f[1..] {
            g.push(0, x);
        }
        assert_eq!(list(&mut g, f[0]), Some(1));
    }

    #[test]
    fn a_full_bucket_gives_up_the_entry_with_least_life() {
        let mut g = GhostLists::new(64).unwrap();
        let (same, others) = by_bucket_of_the_first(&g, 2000);
        g.push(1, same[0]);
        for &f in &others[..60] {
            g.push(1, f); // list 1 ages: same[0] has 4 pushes to live
        }
        for &f in &same[1..=WAYS] {
            g.push(0, f); // the last one finds the bucket full
        }
        assert_eq!(list(&mut g, same[0]), None);
        assert!(same[1..=WAYS].iter().all(|&f| list(&mut g, f) == Some(0)));
        assert_eq!(g.len(1), 60);
    }

    #[test]
    fn a_fingerprint_never_pushed_is_not_found_beside_a_near_twin() {
        // Fingerprints that share a bucket with a pushed one and differ
        // from it only in bits 13 to 24 (20-bit tags were bits 32 to 51 of
        // the fingerprint: every one of these matched).
        let mut g = GhostLists::new(64).unwrap();
        let pushed = fp(7);
        g.push(0, pushed);
        let twins: Vec<u64> = (1..4000u64)
            .map(|k| pushed ^ k << 13)
            .filter(|&f| g.bucket(f) == g.bucket(pushed))
            .collect();
        assert!(twins.len() > 50, "{} twins", twins.len());
        assert!(twins.iter().all(|&f| list(&mut g, f).is_none()));
        assert_eq!(list(&mut g, pushed), Some(0));
    }

    #[test]
    fn a_large_table_remembers_almost_every_live_entry() {
        let n = 10_000;
        let mut g = GhostLists::new(n).unwrap();
        for i in 0..3 * n as u64 {
            g.push((i % 2) as usize, fp(i));
        }
        // The last 2n pushes alternate between the lists: all live.
        let found = (n as u64..3 * n as u64)
            .filter(|&i| list(&mut g, fp(i)).is_some())
            .count();
        assert!(found >= 2 * n * 95 / 100, "{found} of {}", 2 * n);
        assert_eq!(
            (0..n as u64)
                .filter(|&i| list(&mut g, fp(i)).is_some())
                .count(),
            0
        );
    }

    /// Live entries of `list` in the table, counted way by way.
    fn live_entries(g: &GhostLists, list: usize) -> usize {
        g.buckets
            .iter()
            .flat_map(|b| b.0)
            .filter(|&e| g.live(e).is_some_and(|(l, _)| l == list))
            .count()
    }

    #[test]
    fn lengths_count_the_live_entries_as_generations_expire() {
        // 1,000 per list: generations of 4 pushes, 250 of them.
        let mut g = GhostLists::new(1000).unwrap();
        let mut x = 1u64;
        for step in 0..20_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let list = (x >> 60 & 1) as usize;
            match x >> 61 {
                0 | 1 => {
                    // A recent push of either list (or one long expired).
                    g.take(fp(step.saturating_sub(x >> 40 & 2047)));
                }
                _ => g.push(list, fp(step)),
            }
            if step % 97 == 0 {
                for list in 0..2 {
                    assert_eq!(g.len(list), live_entries(&g, list), "step {step}");
                }
            }
        }
    }

    #[test]
    fn an_entry_lives_for_about_its_lists_next_capacity_pushes() {
        // Generations of 4 pushes: 250 of them in 1,000 pushes, 255 in 1,023
        // (an entry lives for 1,020 of the next 1,023).
        for (capacity, later, alive) in [
            (1000, 999, true),
            (1000, 1000, false),
            (1023, 1019, true),
            (1023, 1020, false),
        ] {
            let mut g = GhostLists::new(capacity).unwrap();
            g.push(0, fp(0));
            for i in 1..=later {
                g.push(0, fp(i));
                g.push(1, fp(1 << 20 | i)); // the other list does not age it
            }
            assert_eq!(list(&mut g, fp(0)).is_some(), alive, "{later} pushes later");
        }
    }

    #[test]
    fn a_push_clears_its_buckets_dead_entries_before_they_pass_for_live() {
        // 64 per list: a generation a push, wrapping after 2,048.
        let mut g = GhostLists::new(64).unwrap();
        let (same, others) = by_bucket_of_the_first(&g, 4000);
        g.push(0, same[0]);
        g.push(0, same[1]); // way 1, after way 0 is emptied
        list(&mut g, same[0]);
        for &f in &others[..64] {
            g.push(0, f); // same[1] expires
        }
        g.push(0, same[2]); // into way 0, clearing same[1]
        for &f in &others[64..2050] {
            g.push(0, f); // same[1]'s generation comes round again
        }
        assert_eq!(list(&mut g, same[1]), None);
    }
}
