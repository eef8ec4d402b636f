//! Ghost lists: the fingerprints of recently evicted blocks, two lists in
//! one compact table.

use crate::alloc::filled;
use crate::error::Result;
use crate::hash::BlockHash;

/// A block hash reduced to 64 bits, never 0. Policies only use it to
/// recognize blocks that come back: a collision can only mislead a
/// policy's choice, never the cache's contents.
pub(crate) fn fingerprint(hash: BlockHash) -> u64 {
    (hash.0 as u64) | 1
}

/// Bits of an entry's push number (wrapping).
const SEQ_BITS: u32 = 31;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// Two ghost lists: each remembers about the last `capacity` fingerprints
/// pushed to it, and `take` finds a fingerprint in either with one memory
/// access.
///
/// ```text
///   bucket = fingerprint * golden >> shift        (8 ways of 8 bytes: a cache line)
///   entry  = tag: 32 bits of the fingerprint | list: 1 bit | push number: 31 bits
///   live   = pushes[list] - push number < capacity   (older entries expire)
/// ```
///
/// Entries expire by their push number, so nothing is ever cleaned up: a
/// push writes one entry, a take clears one, each in one cache line. A
/// push into a full bucket replaces its entry with the least life left, so
/// a fingerprint can be forgotten early; buckets are a quarter full on
/// average, so that is rare (it matters: losing old ghosts of the busier
/// list starves ARC of the returns it learns from). A false match needs a
/// 32-bit tag collision within one bucket. Memory is fixed at
/// construction: 64 bytes per fingerprint a list holds (rounded up to a
/// power of two), so 32 to 64 bytes per fingerprint remembered, and a bit
/// per push.
/// Entries per bucket: one 64-byte cache line.
const WAYS: usize = 8;

/// One cache line of entries (0: empty).
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Bucket([u64; WAYS]);

#[derive(Debug)]
pub(crate) struct GhostLists {
    buckets: Vec<Bucket>,
    shift: u32,
    capacity: u64,
    /// Fingerprints ever pushed to each list.
    pushes: [u64; 2],
    /// Per list, one bit per push of the last `capacity`: set once that
    /// push was counted out (taken, or replaced in a full bucket), so its
    /// expiry does not count it out again.
    gone: [Vec<u64>; 2],
    /// Live fingerprints per list.
    len: [usize; 2],
}

impl GhostLists {
    /// Two lists of `capacity` fingerprints each (at most 2^30).
    pub(crate) fn new(capacity: usize) -> Result<Self> {
        let capacity = capacity.clamp(1, 1 << 30);
        // A bucket (8 ways) per fingerprint one list holds: 4 ways per live
        // entry of the two, buckets a quarter full on average.
        let buckets = capacity.next_power_of_two();
        Ok(Self {
            buckets: filled(buckets, Bucket([0; WAYS]), "the ghost lists")?,
            shift: 64 - buckets.trailing_zeros(),
            capacity: capacity as u64,
            pushes: [0; 2],
            gone: [
                filled(capacity.div_ceil(64), 0, "the ghost lists")?,
                filled(capacity.div_ceil(64), 0, "the ghost lists")?,
            ],
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

    /// The entry's tag: the fingerprint's high half, never 0.
    fn tag(fp: u64) -> u64 {
        (fp >> 32) | 1
    }

    /// An entry's list and how many pushes to that list came after it
    /// (`None` for an empty way).
    fn decode(&self, entry: u64) -> Option<(usize, u64)> {
        (entry != 0).then(|| {
            let list = (entry >> SEQ_BITS & 1) as usize;
            let later = self.pushes[list].wrapping_sub(entry).wrapping_sub(1);
            (list, later & SEQ_MASK)
        })
    }

    /// Flips the `gone` bit of the push made `later` pushes before the last
    /// one to `list`; returns whether it was set.
    fn swap_gone(&mut self, list: usize, later: u64, gone: bool) -> bool {
        let i = (self.pushes[list] - 1 - later) % self.capacity;
        let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
        let was = self.gone[list][word] & bit != 0;
        if gone {
            self.gone[list][word] |= bit;
        } else {
            self.gone[list][word] &= !bit;
        }
        was
    }

    /// Pushes to go before the entry expires (0: dead or empty).
    fn life(&self, entry: u64) -> u64 {
        self.decode(entry)
            .map_or(0, |(_, age)| self.capacity.saturating_sub(age))
    }

    /// The way of bucket `b` holding `tag`, live or not.
    fn way_of(&self, b: usize, tag: u64) -> Option<usize> {
        self.buckets[b].0.iter().position(|&e| e >> 32 == tag)
    }

    /// Clears way `way` of bucket `b`; a live entry is counted out, and its
    /// list returned.
    fn clear(&mut self, b: usize, way: usize) -> Option<usize> {
        let entry = std::mem::take(&mut self.buckets[b].0[way]);
        let (list, later) = self
            .decode(entry)
            .filter(|&(_, later)| later < self.capacity)?;
        self.swap_gone(list, later, true);
        self.len[list] -= 1;
        Some(list)
    }

    /// Starts loading `fp`'s bucket into the cache, so that a `take` or
    /// `push` of it soon after does not wait for memory.
    pub(crate) fn prefetch(&self, fp: u64) {
        let bucket: *const Bucket = &self.buckets[self.bucket(fp)];
        // SAFETY: SSE is part of every x86_64 target, and a prefetch only
        // hints the cache: it never faults nor reads into the program.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(bucket.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = bucket;
    }

    /// Remembers `fp` in list `list`, as its newest entry.
    pub(crate) fn push(&mut self, list: usize, fp: u64) {
        let b = self.bucket(fp);
        let tag = Self::tag(fp);
        // A sighting of the same fingerprint, else the way with least life.
        let way = self.way_of(b, tag).unwrap_or_else(|| {
            let ways = &self.buckets[b].0;
            (0..WAYS).min_by_key(|&w| self.life(ways[w])).unwrap()
        });
        self.clear(b, way);
        let seq = self.pushes[list] & SEQ_MASK;
        self.buckets[b].0[way] = tag << 32 | (list as u64) << SEQ_BITS | seq;
        self.pushes[list] += 1;
        // The push `capacity` before this one expires now, unless it was
        // counted out already; its bit is this push's from now on.
        let expired = self.pushes[list] > self.capacity;
        if !self.swap_gone(list, 0, false) && expired {
            self.len[list] -= 1;
        }
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
        assert_eq!(g.take(f[0]), None, "the oldest expired");
        assert_eq!(g.take(f[1]), Some(0));
        assert_eq!(g.take(f[1]), None);
        assert_eq!(g.take(f[6]), Some(1));
        assert_eq!((g.len(0), g.len(1)), (2, 0));
        g.push(0, f[4]); // expires f[1], taken already
        g.push(0, f[5]); // expires f[2]
        assert_eq!(g.take(f[2]), None);
        assert_eq!([g.take(f[3]), g.take(f[4]), g.take(f[5])], [Some(0); 3]);
        assert_eq!(g.take(fp(1 << 40)), None, "never pushed");
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
        assert_eq!(g.take(f[0]), Some(1));
    }

    #[test]
    fn a_full_bucket_gives_up_the_entry_with_least_life() {
        let mut g = GhostLists::new(64).unwrap();
        let b = g.bucket(fp(0));
        let (same, others): (Vec<u64>, Vec<u64>) =
            (0..2000).map(fp).partition(|&f| g.bucket(f) == b);
        g.push(1, same[0]);
        for &f in &others[..60] {
            g.push(1, f); // list 1 ages: same[0] has 4 pushes to live
        }
        for &f in &same[1..=WAYS] {
            g.push(0, f); // the last one finds the bucket full
        }
        assert_eq!(g.take(same[0]), None);
        assert!(same[1..=WAYS].iter().all(|&f| g.take(f) == Some(0)));
        assert_eq!(g.len(1), 60);
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
            .filter(|&i| g.take(fp(i)).is_some())
            .count();
        assert!(found >= 2 * n * 95 / 100, "{found} of {}", 2 * n);
        assert_eq!(
            (0..n as u64).filter(|&i| g.take(fp(i)).is_some()).count(),
            0
        );
    }
}
