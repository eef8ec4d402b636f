//! Turn density: how likely a block with a given turn count is to come
//! back, over how long those that do take, at each age, learned online.
//! `return_time` uses it, when cold blocks do not go first, to pick which
//! turn count gives up the next victim and whether a pool's young end is
//! spared.
//!
//! ```text
//!   release of a block with t turns                        ──▶ released[t] += 1
//!   its return at age a (a hit, or a store of its evicted hash) ──▶ returns[t][bucket(a)] += 1
//!   every 1,024 returns, per turn count t and age bucket b:
//!     density[t][b] = P(back in b or later) / mean wait, from the start of b, of those back in b or later
//!     P(back in b or later) = returns in b or later / (releases - returns before b)
//!   once 65,536 returns are counted, every count halves (recent traffic weighs more)
//!
//!   a ghost entry overwritten at age a (its block no longer watched)     ──▶ forgotten[bucket(a)] += 1
//!   trusted at age a, up to the horizon h, iff
//!     returns at a or later >= 1,000                                   (the run is old enough to have seen them)
//!     and 1 - forgotten before h / (releases - returns before h) >= 1/2 (most blocks not back are watched up to h)
//! ```
//!
//! In the spirit of hit density (LHD, Beckmann et al., NSDI'18) over a
//! prefix cache's own classes: a block worth keeping is one likely to come
//! back soon. Unlike LHD, the blocks that never come back add nothing to
//! the wait (how long they stay is what the caller decides), so a rare
//! return that comes fast scores as high as a likely one that comes late.
//! Buckets count "in b or later" (`ReturnAges::remaining` counts strictly
//! later ones). A turn count with fewer than 256 releases in the window reads the
//! table of all turn counts together. Until the first relearn every density
//! is 0, so ties decide (`return_time` breaks them toward more turns).
//! Returns are those the policy sees (hits, and stores of hashes its ghost
//! table still remembers), so a turn count whose blocks are evicted young
//! and come back after the ghost table forgot them looks less likely to
//! return than it is. [`TurnDensity::trusted`] tells when that is not the
//! case: the blocks are still watched (cached, or remembered by the ghost
//! table) up to the horizon, and enough returns at the age in question
//! have been seen; on a small cache whose ghost table forgets most blocks
//! before the horizon, or early in a run, it is not.

use super::return_ages::{bucket_end, bucket_of, bucket_start};

/// Age buckets (exact below 8, then 8 per doubling; ages from 245,760
/// count in the last).
const BUCKETS: usize = 128;
/// Returns between two rebuilds of the densities.
const RELEARN_PERIOD: u64 = 1024;
/// Returns counted before every count halves.
const WINDOW: u64 = 1 << 16;
/// Releases a turn count needs in the window to be judged on its own.
const MIN_RELEASES: u64 = 256;
/// Returns at an age or later (all turn counts) for densities there to be
/// trusted.
const MIN_LATER_RETURNS: u64 = 1000;
/// Share of the blocks not yet back that must still be watched at the
/// horizon for densities to be trusted.
const MIN_WATCHED: f64 = 0.5;

/// Releases, returns by age and the densities they give, per turn count;
/// and, over all turn counts, the blocks forgotten unreturned by age and
/// whether the densities can be trusted.
#[derive(Debug)]
pub(super) struct TurnDensity {
    /// Per turn count.
    released: Box<[u64]>,
    /// `turns x BUCKETS`, row-major.
    returns: Box<[u64]>,
    /// Returns counted (halved with the counts).
    window: u64,
    /// `turns x BUCKETS`, row-major.
    density: Box<[f32]>,
    /// Per age bucket, all turn counts: blocks whose ghost entry was
    /// overwritten at that age (no longer watched).
    forgotten: Box<[u64]>,
    /// Per age bucket, learned: returns at that age or later.
    later_returns: Box<[u64]>,
    /// Per age bucket, learned: the share of the blocks not back by then
    /// that are still watched.
    watched: Box<[f32]>,
}

impl TurnDensity {
    /// Nothing learned, for turn counts `0..turns`: every density 0.
    pub(super) fn new(turns: usize) -> Self {
        Self {
            released: vec![0; turns].into_boxed_slice(),
            returns: vec![0; turns * BUCKETS].into_boxed_slice(),
            window: 0,
            density: vec![0.0; turns * BUCKETS].into_boxed_slice(),
            forgotten: vec![0; BUCKETS].into_boxed_slice(),
            later_returns: vec![0; BUCKETS].into_boxed_slice(),
            watched: vec![0.0; BUCKETS].into_boxed_slice(),
        }
    }

    fn bucket(age: u32) -> usize {
        bucket_of(age).min(BUCKETS - 1)
    }

    /// A block with `turns` turns became evictable.
    pub(super) fn released(&mut self, turns: usize) {
        self.released[turns] += 1;
    }

    /// A block evicted unreturned is no longer watched: its ghost entry
    /// was overwritten `age` after its release.
    pub(super) fn unwatched(&mut self, age: u32) {
        self.forgotten[Self::bucket(age)] += 1;
    }

    /// A block released with `turns` turns came back `age` after its release.
    pub(super) fn returned(&mut self, turns: usize, age: u32) {
        self.returns[turns * BUCKETS + Self::bucket(age)] += 1;
        self.window += 1;
        if self.window % RELEARN_PERIOD == 0 {
            self.relearn();
        }
        if self.window >= WINDOW {
            let counts = self.returns.iter_mut().chain(self.released.iter_mut());
            for c in counts.chain(self.forgotten.iter_mut()) {
                *c /= 2;
            }
            self.window /= 2;
        }
    }

    fn relearn(&mut self) {
        let mut all = [0.0f32; BUCKETS];
        let mut all_returns = [0u64; BUCKETS];
        for row in self.returns.chunks_exact(BUCKETS) {
            for (sum, r) in all_returns.iter_mut().zip(row) {
                *sum += r;
            }
        }
        let released: u64 = self.released.iter().sum();
        learn(released, &all_returns, &mut all);
        // From the youngest bucket up, with the returns and forgotten blocks
        // before b: the returns at b or later, and the share still watched.
        let total: u64 = all_returns.iter().sum();
        let (mut returned, mut lost) = (0u64, 0u64);
        let buckets = self.watched.iter_mut().zip(&mut *self.later_returns);
        for ((watched, at_or_after), (&returns, &forgotten)) in
            buckets.zip(all_returns.iter().zip(&*self.forgotten))
        {
            let pending = released.saturating_sub(returned).max(1);
            *watched = (1.0 - lost as f64 / pending as f64).max(0.0) as f32;
            *at_or_after = total - returned;
            returned += returns;
            lost += forgotten;
        }
        let rows = self.density.chunks_exact_mut(BUCKETS);
        for ((density, returns), &released) in rows
            .zip(self.returns.chunks_exact(BUCKETS))
            .zip(&*self.released)
        {
            if released < MIN_RELEASES {
                density.copy_from_slice(&all);
            } else {
                learn(released, returns, density);
            }
        }
    }

    /// The density of a block with `turns` turns at this age (0 until
    /// learned).
    pub(super) fn density(&self, turns: usize, age: u32) -> f32 {
        self.density[turns * BUCKETS + Self::bucket(age)]
    }

    /// Whether densities at `age` can be trusted when blocks are taken as
    /// never back past `horizon`: enough returns at `age` or later were
    /// seen, and most blocks not back by the horizon are still watched
    /// there (see the module docs). Not before the first relearn.
    pub(super) fn trusted(&self, age: u32, horizon: u32) -> bool {
        self.later_returns[Self::bucket(age)] >= MIN_LATER_RETURNS
            && f64::from(self.watched[Self::bucket(horizon)]) >= MIN_WATCHED
    }

    /// The nonempty buckets of forgotten blocks as (largest age, count).
    #[cfg(test)]
    pub(super) fn forgotten(&self) -> Vec<(u64, u64)> {
        super::return_ages::nonempty_buckets(&self.forgotten)
    }

    /// The returns counted for each turn count.
    #[cfg(test)]
    pub(super) fn returns_by_turns(&self) -> Vec<u64> {
        self.returns
            .chunks_exact(BUCKETS)
            .map(|row| row.iter().sum())
            .collect()
    }
}

/// The densities of blocks `released` of which `returns` came back, by
/// age bucket.
fn learn(released: u64, returns: &[u64], density: &mut [f32]) {
    let total: u64 = returns.iter().sum();
    let released = released.max(total) as f64;
    // From the oldest bucket down: returns at or after b, and their summed
    // ages.
    let (mut later, mut ages) = (0u64, 0f64);
    for b in (0..returns.len()).rev() {
        later += returns[b];
        ages += returns[b] as f64 * bucket_end(b) as f64;
        let start = bucket_start(b) as f64;
        let at_risk = released - (total - later) as f64;
        density[b] = if later == 0 {
            0.0
        } else {
            let wait = (ages / later as f64 - start).max(1.0);
            (later as f64 / at_risk / wait) as f32
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Releases `n` blocks with `turns` turns, of which `back` come back
    /// at `age`.
    fn teach(d: &mut TurnDensity, turns: usize, n: usize, back: usize, age: u32) {
        for _ in 0..n {
            d.released(turns);
        }
        for _ in 0..back {
            d.returned(turns, age);
        }
    }

    #[test]
    fn blocks_that_come_back_sooner_and_more_often_are_denser() {
        let mut d = TurnDensity::new(4);
        assert_eq!(d.density(0, 10), 0.0, "nothing learned yet");
        // Turn count 0: 1,000 released, 900 back at age 50. Turn count 1:
        // 1,000 released, 300 back at age 50. Turn count 2: 1,000
        // released, 900 back at age 400. 2,100 returns: two relearns.
        teach(&mut d, 0, 1000, 900, 50);
        teach(&mut d, 1, 1000, 300, 50);
        teach(&mut d, 2, 1000, 900, 400);
        let (often, rarely, late) = (d.density(0, 0), d.density(1, 0), d.density(2, 0));
        assert!(often > rarely && often > late, "{often} {rarely} {late}");
        // Among those back at 50 (bucket 48 to 51), 0.9 of the released at
        // age 0, waiting 51 on average: 0.9 / 51.
        assert!((often - 0.9 / 51.0).abs() < 1e-6, "{often}");
        // Past its last return a block is never back: density 0.
        assert_eq!(d.density(0, 1000), 0.0);
        // Ageing towards the return raises the density.
        assert!(d.density(2, 300) > late);
    }

    #[test]
    fn a_turn_count_seldom_released_reads_the_table_of_all() {
        let mut d = TurnDensity::new(4);
        // 1,024 returns in all: one relearn, with both counted.
        teach(&mut d, 0, 2000, 1000, 50);
        teach(&mut d, 3, 10, 24, 5000);
        // Turn counts 1, 2 (nothing released) and 3 read the table of all.
        assert_eq!(d.density(3, 0), d.density(1, 0));
        assert_eq!(d.density(2, 4000), d.density(1, 4000));
        assert!(
            d.density(1, 4000) > 0.0,
            "turn count 3's returns count there"
        );
        assert_ne!(d.density(3, 0), d.density(0, 0));
    }

    #[test]
    fn densities_are_trusted_where_returns_were_seen_and_blocks_stay_watched() {
        let mut d = TurnDensity::new(1);
        assert!(!d.trusted(0, 100), "nothing learned yet");
        // 10,000 released; 1,024 back at age 500, 1,024 at age 5: two
        // relearns, the second with all of them.
        for _ in 0..10_000 {
            d.released(0);
        }
        teach(&mut d, 0, 0, 1024, 500);
        teach(&mut d, 0, 0, 1024, 5);
        assert!(d.trusted(400, 1000), "1,024 returns at 400 or later");
        assert!(d.trusted(480, 1000), "500's bucket (480 to 511) counts");
        assert!(!d.trusted(512, 1000), "none seen past 511");
        // 7,952 not back by age 1,000; 3,970 of them forgotten at age 600:
        // just over half still watched there. Returns at 2,000 relearn
        // without changing that.
        for _ in 0..3970 {
            d.unwatched(600);
        }
        assert!(d.trusted(400, 1000));
        teach(&mut d, 0, 0, 1024, 2000);
        assert!(d.trusted(400, 1000));
        // Ten more: just under half.
        for _ in 0..10 {
            d.unwatched(600);
        }
        teach(&mut d, 0, 0, 1024, 2000);
        assert!(!d.trusted(400, 1000));
        // Forgotten at 600 (bucket 576 to 639): a horizon in that bucket is
        // still watched, one past it is not.
        assert!(d.trusted(10, 639));
        assert!(!d.trusted(10, 640));
    }

    #[test]
    fn counts_halve_past_the_window() {
        let mut d = TurnDensity::new(1);
        for _ in 0..10 {
            d.unwatched(9);
        }
        teach(&mut d, 0, 1000, WINDOW as usize, 7);
        assert_eq!(d.window, WINDOW / 2);
        assert_eq!(d.returns[7], WINDOW / 2);
        assert_eq!(d.released[0], 500);
        assert_eq!(d.forgotten(), [(9, 5)]);
    }
}
