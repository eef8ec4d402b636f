//! Near returns: how often cold and warm blocks come back while LRU would
//! still hold them, which tells `return_time` whether to evict cold blocks
//! first.
//!
//! ```text
//!   release of a block          ──▶ releases[kind] += 1     (kind: cold or warm)
//!   return (a hit on a free block, or a store of an evicted hash)
//!     fewer than `capacity` releases after its own ──▶ near[kind] += 1
//!   cold first  iff  near[warm] / releases[warm] >= COLD_FIRST_RATIO x near[cold] / releases[cold]
//! ```
//!
//! LRU evicts in release order, so a block that returns before `capacity`
//! other releases is one LRU would (at most) still hold. Evicting cold
//! blocks first (residency's probation) loses exactly those of them: it
//! pays where cold blocks return near (prefixes forked soon after they
//! were first stored) and is free where they return far, after LRU would
//! have evicted them too (conversations whose users think longer than the
//! cache remembers), or never (one-off documents). Counting starts at the
//! first eviction (before it, every return is near) and halves every
//! [`WINDOW`] releases, so recent traffic decides.

/// Releases counted before the counts halve.
const WINDOW: u64 = 1 << 16;
/// How many times likelier than a cold block a warm one must return near
/// for cold blocks to go first: cold-first is a strict priority, and
/// costs more than the near returns it loses (it keeps old warm blocks).
const COLD_FIRST_RATIO: f64 = 5.0;

/// Near-return rates of cold and warm blocks (index 0: cold, 1: warm).
#[derive(Debug)]
pub(super) struct NearReturns {
    capacity: u64,
    releases: [u64; 2],
    near: [u64; 2],
    /// Set by the first eviction; nothing is counted before.
    counting: bool,
}

impl NearReturns {
    /// Counts for a cache of `capacity` blocks.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity as u64,
            releases: [0; 2],
            near: [0; 2],
            counting: false,
        }
    }

    /// The cache evicted a block: it is full, and returns start to tell.
    pub(super) fn on_evict(&mut self) {
        self.counting = true;
    }

    /// A block of this kind was released.
    pub(super) fn released(&mut self, cold: bool) {
        if !self.counting {
            return;
        }
        self.releases[usize::from(!cold)] += 1;
        if self.releases[0] + self.releases[1] >= WINDOW {
            for c in self.releases.iter_mut().chain(&mut self.near) {
                *c /= 2;
            }
        }
    }

    /// A block of this kind came back `releases_since` releases after its own.
    pub(super) fn returned(&mut self, cold: bool, releases_since: u64) {
        if self.counting && releases_since < self.capacity {
            self.near[usize::from(!cold)] += 1;
        }
    }

    /// Whether cold blocks should go first (see the module docs); so until
    /// the counts say otherwise.
    pub(super) fn cold_first(&self) -> bool {
        let rate = |k: usize| self.near[k] as f64 / self.releases[k].max(1) as f64;
        rate(1) >= COLD_FIRST_RATIO * rate(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_goes_first_until_cold_blocks_return_near_as_often_as_warm_ones() {
        let mut n = NearReturns::new(100);
        assert!(n.cold_first());
        // Before the first eviction nothing counts.
        for _ in 0..10 {
            n.released(true);
            n.returned(true, 1);
        }
        assert!(n.cold_first());
        n.on_evict();
        // Warm blocks return near 6 times in 10, cold ones 1 in 10.
        for i in 0..10 {
            n.released(true);
            n.released(false);
            n.returned(true, if i == 0 { 5 } else { 500 });
            if i < 6 {
                n.returned(false, 99);
            }
        }
        assert!(n.cold_first(), "6/10 >= 5 x 1/10");
        // Two more near cold returns: 6/10 < 5 x 3/10.
        n.returned(true, 0);
        n.returned(true, 0);
        assert!(!n.cold_first());
    }

    #[test]
    fn far_returns_do_not_count_and_old_counts_fade() {
        let mut n = NearReturns::new(10);
        n.on_evict();
        n.released(true);
        n.returned(true, 10);
        assert_eq!(n.near, [0, 0], "10 releases later LRU has evicted it");
        n.returned(true, 9);
        assert_eq!(n.near, [1, 0]);
        for _ in 0..WINDOW {
            n.released(false);
        }
        assert!(n.releases[0] + n.releases[1] < WINDOW);
        assert_eq!(n.near, [0, 0]);
    }
}
