//! What a simulation measured: [`SimReport`], serializable for scripts and
//! printable as a table for people.

use std::fmt;

use serde::Serialize;

use super::config::SimConfig;
use super::units::{format_bytes, thousands};
use mla_cache::tier::{TierHits, TierStats};
use mla_cache::CacheStats;

/// Summary of a distribution of durations, in milliseconds. Percentiles are
/// nearest-rank: the `ceil(p/100 x n)`-th smallest value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Values.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Distribution {
    /// Summarizes durations given in nanoseconds (sorts them).
    pub fn of_ns(values: &mut [u64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_unstable();
        let n = values.len();
        let ms = |ns: u64| ns as f64 / 1e6;
        let rank = |p: usize| values[(p * n).div_ceil(100).max(1) - 1];
        let sum: u128 = values.iter().map(|&v| v as u128).sum();
        Self {
            count: n,
            mean: sum as f64 / n as f64 / 1e6,
            p50: ms(rank(50)),
            p99: ms(rank(99)),
            max: ms(values[n - 1]),
        }
    }
}

/// Cost of the block manager itself, measured around its calls only.
/// Wall-clock figures: they vary from run to run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ManagerCost {
    /// Manager calls (admit attempts, appends, frees).
    pub calls: u64,
    /// Seconds spent inside them.
    pub seconds: f64,
    /// Microseconds of manager time per completed request.
    pub us_per_request: f64,
    /// Calls per second of manager time.
    pub calls_per_s: f64,
}

/// Everything a simulation measured. All figures but `manager` and `wall_s`
/// are exact functions of the workload and the configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// Name of the workload.
    pub workload: String,
    /// What was simulated.
    pub config: SimConfig,
    /// Tokens the cache holds.
    pub cache_tokens: usize,
    /// Bytes the cache takes, all layers.
    pub cache_bytes: u64,
    /// Bytes one token takes, all layers.
    pub bytes_per_token: usize,
    /// Requests in the workload.
    pub requests: usize,
    /// Requests admitted and finished.
    pub completed: usize,
    /// Requests dropped because they can never fit the cache.
    pub never_fit: usize,
    /// Prompt tokens of the admitted requests.
    pub prompt_tokens: u64,
    /// Of which served from the prefix cache.
    pub hit_tokens: u64,
    /// `hit_tokens / prompt_tokens`.
    pub token_hit_rate: f64,
    /// `hit_tokens` by tier: device, host memory, remote.
    pub tier_hits: TierHits,
    /// The lower tiers' counters, when there are any.
    pub tiers: Option<TierStats>,
    /// Admitted requests with at least one cached token.
    pub hit_requests: usize,
    /// `hit_requests / completed`.
    pub request_hit_rate: f64,
    /// Output tokens appended.
    pub output_tokens: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Blocks copied on write.
    pub cow_copies: u64,
    /// Highest fraction of blocks held by requests.
    pub peak_usage: f64,
    /// Time-weighted mean fraction of blocks held by requests.
    pub mean_usage: f64,
    /// Arrival to admission.
    pub queue_delay_ms: Distribution,
    /// Arrival to the first output token (end of prefill).
    pub ttft_ms: Distribution,
    /// Simulated time from the first arrival to the last free, in seconds.
    pub simulated_s: f64,
    /// The manager's own cost.
    pub manager: ManagerCost,
    /// Wall-clock seconds of the whole simulation.
    pub wall_s: f64,
    /// The manager's final counters.
    pub stats: CacheStats,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn percent(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

fn ms(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.1} s", x / 1e3)
    } else {
        format!("{x:.0} ms")
    }
}

impl fmt::Display for SimReport {
    /// A table for people.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let row = |f: &mut fmt::Formatter<'_>, k: &str, v: String| writeln!(f, "  {k:<22} {v}");
        writeln!(
            f,
            "workload: {} ({} requests)",
            self.workload,
            thousands(self.requests as u64)
        )?;
        row(
            f,
            "cache",
            format!(
                "{} {}, {} blocks x {} = {} tokens, {} ({} B/token)",
                c.model,
                c.dtype,
                thousands(c.num_blocks as u64),
                c.block_size,
                thousands(self.cache_tokens as u64),
                format_bytes(self.cache_bytes),
                thousands(self.bytes_per_token as u64)
            ),
        )?;
        let prefill = if c.prefill_ns_per_token == 0 {
            "instantaneous prefill".to_string()
        } else {
            format!(
                "prefill {:.0} tokens/s",
                1e9 / c.prefill_ns_per_token as f64
            )
        };
        row(
            f,
            "timing",
            format!(
                "{} ms per output token, {prefill}, eviction {}",
                c.tpot_ns as f64 / 1e6,
                c.eviction
            ),
        )?;
        writeln!(f)?;
        row(
            f,
            "prefix hit rate",
            format!(
                "{} of prompt tokens ({} / {})",
                percent(self.token_hit_rate),
                thousands(self.hit_tokens),
                thousands(self.prompt_tokens)
            ),
        )?;
        row(
            f,
            "",
            format!(
                "{} of requests ({} / {})",
                percent(self.request_hit_rate),
                thousands(self.hit_requests as u64),
                thousands(self.completed as u64)
            ),
        )?;
        if let Some(t) = &self.tiers {
            let share = |tokens: usize| {
                format!(
                    "{} ({})",
                    percent(ratio(tokens as u64, self.prompt_tokens)),
                    thousands(tokens as u64)
                )
            };
            let h = &self.tier_hits;
            row(f, "  from device", share(h.device_tokens))?;
            if c.host_blocks > 0 {
                row(
                    f,
                    "  from host memory",
                    format!(
                        "{}, {} blocks, {}",
                        share(h.host_tokens),
                        thousands(c.host_blocks as u64),
                        c.write_policy
                    ),
                )?;
            }
            if let Some(r) = &t.remote {
                row(
                    f,
                    "  from remote",
                    format!(
                        "{}, {} blocks written, {} timeouts, {} errors, {} rejected",
                        share(h.remote_tokens),
                        thousands(r.put_blocks),
                        thousands(r.timeouts),
                        thousands(r.errors),
                        thousands(r.rejected)
                    ),
                )?;
            }
        }
        row(
            f,
            "evictions",
            format!("{} blocks", thousands(self.evictions)),
        )?;
        row(f, "copy-on-write copies", thousands(self.cow_copies))?;
        row(
            f,
            "usage",
            format!(
                "peak {}, mean {}",
                percent(self.peak_usage),
                percent(self.mean_usage)
            ),
        )?;
        let d = &self.queue_delay_ms;
        row(
            f,
            "queueing delay",
            format!("p50 {}, p99 {}, max {}", ms(d.p50), ms(d.p99), ms(d.max)),
        )?;
        if c.prefill_ns_per_token > 0 {
            let d = &self.ttft_ms;
            row(
                f,
                "time to first token",
                format!("p50 {}, p99 {}, max {}", ms(d.p50), ms(d.p99), ms(d.max)),
            )?;
        }
        row(
            f,
            "never fit",
            format!("{} requests", thousands(self.never_fit as u64)),
        )?;
        row(
            f,
            "simulated",
            format!(
                "{:.0} s of traffic, {} requests, {} output tokens",
                self.simulated_s,
                thousands(self.completed as u64),
                thousands(self.output_tokens)
            ),
        )?;
        let m = &self.manager;
        row(
            f,
            "manager cost",
            format!(
                "{:.1} µs per request, {:.2} M calls/s ({} calls in {:.3} s)",
                m.us_per_request,
                m.calls_per_s / 1e6,
                thousands(m.calls),
                m.seconds
            ),
        )?;
        row(f, "wall time", format!("{:.2} s", self.wall_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<u64> = (1..=100).map(|x| x * 1_000_000).collect();
        let d = Distribution::of_ns(&mut v);
        assert_eq!((d.p50, d.p99, d.max, d.mean), (50.0, 99.0, 100.0, 50.5));
        let d = Distribution::of_ns(&mut [3_000_000, 1_000_000]);
        assert_eq!((d.p50, d.p99, d.count), (1.0, 3.0, 2));
        assert_eq!(Distribution::of_ns(&mut []), Distribution::default());
    }
}
