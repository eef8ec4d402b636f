//! Whether blocks that came back before (ARC's reused) and that residency
//! evicts while still kept, before the horizon, come back again. Where
//! they rarely do, the cache holds every block that returns, so its
//! witnesses have seen the whole range of return ages, and a kept block
//! older than any return learned is stale: the horizon's margin (1.5 x the
//! 99th percentile) is for return ages the witnesses could not show,
//! evicted before they came back.
//! Blocks seen once are not counted: the one cold request in 32 residency
//! keeps is mostly one-off blocks, which never come back whatever the
//! horizon.

/// Evictions counted before their share of returns is trusted.
const MIN_EVICTIONS: u64 = 256;
/// The counts halve when the evictions counted reach this many, so recent
/// evictions weigh more.
const WINDOW: u64 = 4096;
/// "Rarely": fewer than one eviction in this many comes back (while the
/// ghost table remembers it).
const RARELY: u64 = 20;

/// Reused kept blocks evicted before the horizon, and how many of them
/// came back.
#[derive(Debug, Default)]
pub(super) struct KeptEvictions {
    evicted: u64,
    returned: u64,
}

impl KeptEvictions {
    /// A reused kept block was evicted before the horizon.
    pub(super) fn evicted(&mut self) {
        self.evicted += 1;
        if self.evicted >= WINDOW {
            self.evicted /= 2;
            self.returned /= 2;
        }
    }

    /// A block so evicted came back.
    pub(super) fn returned(&mut self) {
        self.returned += 1;
    }

    /// Whether such blocks rarely come back, over enough evictions to tell.
    pub(super) fn rarely_return(&self) -> bool {
        self.evicted >= MIN_EVICTIONS && self.returned * RARELY < self.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rarely_takes_enough_evictions_and_fewer_than_one_return_in_twenty() {
        let mut k = KeptEvictions::default();
        for _ in 0..MIN_EVICTIONS - 1 {
            k.evicted();
        }
        assert!(!k.rarely_return(), "too few evictions to tell");
        k.evicted();
        assert!(k.rarely_return());
        // 256 evictions: 12 returns are fewer than one in 20, 13 are not.
        for _ in 0..12 {
            k.returned();
        }
        assert!(k.rarely_return());
        k.returned();
        assert!(!k.rarely_return());
    }

    #[test]
    fn the_counts_halve_so_recent_evictions_weigh_more() {
        let mut k = KeptEvictions::default();
        // Half the first window's evictions came back...
        for _ in 0..WINDOW / 2 {
            k.evicted();
            k.returned();
        }
        for _ in 0..WINDOW / 2 - 1 {
            k.evicted();
        }
        assert!(!k.rarely_return());
        // ... then none of the next ones: after enough halvings they are rare.
        let evictions = (1..=4 * WINDOW).find(|_| {
            k.evicted();
            k.rarely_return()
        });
        assert!(evictions.is_some_and(|n| n > WINDOW), "{evictions:?}");
    }
}
