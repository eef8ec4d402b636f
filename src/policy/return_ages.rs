//! Return ages: how long after its last use a block came back, learned
//! online, and what that predicts: a horizon past which a block is taken as
//! not coming back, and how long a returning block of a given age still has
//! to wait. `return_time` counts ages in requests, `residency` in releases.
//!
//! ```text
//!   record(age) ──▶ counts[bucket(age)] += 1      (exact below 8, then 8 buckets per doubling)
//!   every `relearn_period` records: horizon = 1.5 x the `percentile`-th age,
//!                                   oldest return = end of the last nonempty bucket,
//!                                   remaining[b] = mean age of later returns - start of b
//!   past `window` records the counts halve (recent traffic weighs more)
//! ```

/// Age buckets: exact below 8, then 8 per doubling, up to `u32::MAX`.
pub(super) const AGE_BUCKETS: usize = 240;

/// The age bucket of `age`.
pub(super) fn bucket_of(age: u32) -> usize {
    if age < 8 {
        return age as usize;
    }
    let log = 31 - age.leading_zeros();
    let frac = (age >> (log - 3)) & 7;
    (log as usize - 2) * 8 + frac as usize
}

/// The smallest age in bucket `b`.
pub(super) fn bucket_start(b: usize) -> u64 {
    b.checked_sub(1).map_or(0, |before| bucket_end(before) + 1)
}

/// The largest age in bucket `b`.
pub(super) fn bucket_end(b: usize) -> u64 {
    if b < 8 {
        return b as u64;
    }
    let log = (b / 8 + 2) as u32;
    let frac = (b % 8) as u64;
    ((9 + frac) << (log - 3)) - 1
}

/// How a [`ReturnAges`] learns.
#[derive(Debug, Clone, Copy)]
pub(super) struct Learning {
    /// Buckets used (at most [`AGE_BUCKETS`]): older ages count in the last.
    pub(super) buckets: usize,
    /// Returns between two rebuilds of the predictions.
    pub(super) relearn_period: u64,
    /// Returns counted before the counts halve.
    pub(super) window: u64,
    /// The horizon is 1.5 x this percentile of the return ages.
    pub(super) percentile: u64,
}

/// The ages at which blocks came back, and what they predict.
#[derive(Debug)]
pub(super) struct ReturnAges {
    /// Per bucket (`learning.buckets` of them, on the heap: policies are
    /// built on the stack of whoever boxes them).
    counts: Box<[u64]>,
    total: u64,
    /// Expected age until a block of each age bucket returns, among blocks
    /// that return.
    remaining: Box<[u64]>,
    horizon: u32,
    /// The largest age learned (its bucket's end).
    oldest_return: u32,
    learning: Learning,
}

impl ReturnAges {
    /// Nothing learned yet: no horizon (`u32::MAX`).
    pub(super) fn new(learning: Learning) -> Self {
        assert!((1..=AGE_BUCKETS).contains(&learning.buckets));
        assert!(learning.relearn_period > 0 && learning.percentile <= 100);
        Self {
            counts: vec![0; learning.buckets].into_boxed_slice(),
            total: 0,
            remaining: vec![0; learning.buckets].into_boxed_slice(),
            horizon: u32::MAX,
            oldest_return: u32::MAX,
            learning,
        }
    }

    /// A block came back `age` after its last use.
    pub(super) fn record(&mut self, age: u32) {
        self.counts[self.bucket(age)] += 1;
        self.total += 1;
        if self.total % self.learning.relearn_period == 0 {
            self.relearn();
        }
        if self.total >= self.learning.window {
            for c in &mut self.counts {
                *c /= 2;
            }
            self.total = self.counts.iter().sum();
        }
    }

    /// The bucket `age` counts in.
    fn bucket(&self, age: u32) -> usize {
        bucket_of(age).min(self.learning.buckets - 1)
    }

    fn relearn(&mut self) {
        let wanted = self.total - self.total * (100 - self.learning.percentile) / 100;
        let mut seen = 0;
        if let Some(b) = self.counts.iter().position(|&c| {
            seen += c;
            seen >= wanted
        }) {
            self.horizon = (bucket_end(b) * 3 / 2).min(u64::from(u32::MAX)) as u32;
        }
        if let Some(last) = self.counts.iter().rposition(|&c| c > 0) {
            self.oldest_return = bucket_end(last).min(u64::from(u32::MAX)) as u32;
        }
        // Remaining time at the start of each bucket, over later returns.
        let (mut n, mut sum) = (0u64, 0u64);
        for b in (0..self.learning.buckets).rev() {
            let start = bucket_start(b);
            self.remaining[b] = sum.checked_div(n).unwrap_or(0).saturating_sub(start);
            n += self.counts[b];
            sum += self.counts[b] * bucket_end(b);
        }
    }

    /// Past this age a block is taken as never returning (`u32::MAX` until
    /// the first relearn).
    pub(super) fn horizon(&self) -> u32 {
        self.horizon
    }

    /// The largest return age learned, as the end of its bucket
    /// (`u32::MAX` until the first relearn).
    pub(super) fn oldest_return(&self) -> u32 {
        self.oldest_return
    }

    /// Expected age until a returning block of this age comes back.
    pub(super) fn remaining(&self, age: u32) -> u64 {
        self.remaining[self.bucket(age)]
    }

    /// The nonempty buckets as (largest age, count).
    #[cfg(test)]
    pub(super) fn learned(&self) -> Vec<(u64, u64)> {
        nonempty_buckets(&self.counts)
    }
}

/// The nonempty buckets of per-bucket `counts` as (largest age, count).
#[cfg(test)]
pub(super) fn nonempty_buckets(counts: &[u64]) -> Vec<(u64, u64)> {
    (0..counts.len())
        .filter(|&b| counts[b] > 0)
        .map(|b| (bucket_end(b), counts[b]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_buckets_cover_every_age_in_order() {
        let mut last = 0;
        for age in (0..5000).chain([1 << 20, u32::MAX / 2, u32::MAX - 1, u32::MAX]) {
            let b = bucket_of(age);
            assert!(b >= last && b < AGE_BUCKETS, "{age}");
            assert!(u64::from(age) <= bucket_end(b), "{age}");
            assert!(b == 0 || u64::from(age) > bucket_end(b - 1), "{age}");
            last = b;
        }
        assert_eq!(bucket_end(AGE_BUCKETS - 1), u64::from(u32::MAX));
    }

    #[test]
    fn the_horizon_is_one_and_a_half_times_the_percentile() {
        let mut ages = ReturnAges::new(Learning {
            buckets: AGE_BUCKETS,
            relearn_period: 100,
            window: 1000,
            percentile: 99,
        });
        assert_eq!(ages.horizon(), u32::MAX, "nothing learned yet");
        assert_eq!(ages.oldest_return(), u32::MAX);
        // 98 returns at age 100, two at 10,000: the 99th percentile is in
        // the bucket of 10,000 (9,216 to 10,239).
        for age in [100; 98].into_iter().chain([10_000; 2]) {
            ages.record(age);
        }
        assert_eq!(ages.horizon(), 10_239 * 3 / 2);
        // At the 95th percentile the far returns do not count.
        let mut ages = ReturnAges::new(Learning {
            percentile: 95,
            ..ages.learning
        });
        for age in [100; 98].into_iter().chain([10_000; 2]) {
            ages.record(age);
        }
        assert_eq!(ages.horizon(), 103 * 3 / 2);
        // The oldest return learned counts whatever the percentile.
        assert_eq!(ages.oldest_return(), 10_239);
        // A returning block of age 0 waits 100 x 0.98 + 10,239 x 0.02 on average.
        assert_eq!(ages.remaining(0), (103 * 98 + 10_239 * 2) / 100);
    }

    #[test]
    fn fewer_buckets_count_older_ages_in_the_last() {
        let mut ages = ReturnAges::new(Learning {
            buckets: 128,
            relearn_period: 10,
            window: 1000,
            percentile: 95,
        });
        for _ in 0..10 {
            ages.record(u32::MAX);
        }
        // The last of 128 buckets ends at 262,143.
        assert_eq!(ages.learned(), [(262_143, 10)]);
        assert_eq!(ages.horizon(), 262_143 * 3 / 2);
        assert_eq!(ages.remaining(1 << 30), ages.remaining(300_000));
    }

    #[test]
    fn counts_halve_past_the_window() {
        let mut ages = ReturnAges::new(Learning {
            buckets: AGE_BUCKETS,
            relearn_period: 10,
            window: 20,
            percentile: 99,
        });
        for _ in 0..20 {
            ages.record(5);
        }
        assert_eq!(ages.learned(), [(5, 10)]);
    }
}
