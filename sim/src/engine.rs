//! The event-driven replay of a workload through a real
//! [`BlockManager`](crate::BlockManager).
//!
//! # Model of time
//!
//! Time is kept in integer nanoseconds, so another implementation that
//! follows these rules reproduces every figure exactly.
//!
//! - Request `i` (trace order) has id `i` and arrives at `timestamp` ms.
//!   It joins a FIFO queue; only the head may be admitted (head-of-line
//!   blocking, as in a first-come-first-served scheduler).
//! - The head is admitted with its prompt and `output_length` decode slots,
//!   so it holds its final `ceil((input + output) / block_size)` blocks from
//!   the start and never needs preemption. If they do not fit now it waits
//!   for the next free; if they can never fit it is dropped and counted.
//!   The whole prompt counts as computed at admission (an unchunked prefill:
//!   like vLLM, a block becomes shareable when the step computing it is
//!   scheduled).
//! - Prefill runs on one serial lane: it starts when the lane is free and
//!   takes `prefill_ns_per_token` for each uncached prompt token (0, the
//!   default, makes it instantaneous and isolates the cache's effect).
//! - The prefill produces output token 1; token `k` follows `(k - 1)` times
//!   `tpot_ns` later. Each token is appended to the manager when produced,
//!   and the request is freed right after its last token.
//! - At equal times, manager events (tokens, frees) come before arrivals,
//!   and events come in the order they were scheduled. After every free the
//!   queue head is retried.
//!
//! Output token ids follow [`TraceRequest::token_at`].
//!
//! # Lower tiers
//!
//! With a host tier or a remote tier, requests go through a
//! [`TieredCache`] over a bookkeeping-only device tier: hits, loads and
//! write policies are the real ones, blocks hold no bytes, and loads take
//! no simulated time. Before each admission the replay waits for the remote
//! tier's queued writes, so figures do not depend on thread timing (with a
//! real server they still depend on what else it holds).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use super::config::{SimConfig, NS_PER_MS};
use super::report::{Distribution, ManagerCost, SimReport};
use super::trace::TraceRequest;
use mla_cache::tier::{TierHits, TieredCache};
use mla_cache::{AdmitOptions, Error, RequestId, Result, TokenId};

/// Counts manager calls and the time spent inside them, nothing else.
#[derive(Default)]
struct Meter {
    calls: u64,
    elapsed: Duration,
}

impl Meter {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.elapsed += start.elapsed();
        self.calls += 1;
        out
    }
}

/// An admitted request's next action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    time: u64,
    seq: u64,
    request: usize,
}

/// Replays `requests` (in arrival order) through a fresh manager built from
/// `config`, calling `progress(done, total)` whenever a request finishes or
/// is dropped.
pub fn simulate(
    workload: &str,
    requests: &[TraceRequest],
    config: &SimConfig,
    mut progress: impl FnMut(usize, usize),
) -> Result<SimReport> {
    let wall = Instant::now();
    let cache = config.cache_config()?;
    let tiered = config.tiered_cache(cache.clone())?;
    let manager = tiered.manager();
    let mut sim = Sim {
        requests,
        config,
        cache: &tiered,
        meter: Meter::default(),
        queue: VecDeque::new(),
        head_tokens: None,
        events: BinaryHeap::new(),
        seq: 0,
        produced: vec![0; requests.len()],
        arrival_ns: requests.iter().map(|r| r.timestamp * NS_PER_MS).collect(),
        lane_free_ns: 0,
        queue_delays: Vec::with_capacity(requests.len()),
        ttfts: Vec::with_capacity(requests.len()),
        prompt_tokens: 0,
        hit_tokens: 0,
        tier_hits: TierHits::default(),
        hit_requests: 0,
        output_tokens: 0,
        never_fit: 0,
        done: 0,
    };
    let mut next_arrival = 0;
    let (mut usage, mut peak_usage, mut usage_area) = (0.0f64, 0.0f64, 0.0f64);
    let start_ns = sim.arrival_ns.first().copied().unwrap_or(0);
    let mut now = start_ns;
    loop {
        let event = sim.events.peek().map(|Reverse(e)| e.time);
        let arrival = sim.arrival_ns.get(next_arrival).copied();
        let t = match (event, arrival) {
            (None, None) => break,
            (Some(te), Some(ta)) => te.min(ta),
            (Some(t), None) | (None, Some(t)) => t,
        };
        usage_area += usage * (t - now) as f64;
        now = t;
        if event == Some(t) {
            let Reverse(e) = sim.events.pop().expect("peeked");
            if sim.step(e)? {
                progress(sim.done, requests.len());
            }
        } else {
            sim.queue.push_back(next_arrival);
            next_arrival += 1;
            if sim.queue.len() == 1 {
                let dropped = sim.try_admit(now)?;
                if dropped > 0 {
                    progress(sim.done, requests.len());
                }
            }
        }
        usage = manager.usage();
        peak_usage = peak_usage.max(usage);
    }
    let span = now - start_ns;
    let stats = manager.stats();
    let completed = sim.done - sim.never_fit;
    let manager_s = sim.meter.elapsed.as_secs_f64();
    Ok(SimReport {
        workload: workload.to_string(),
        config: config.clone(),
        cache_tokens: cache.num_tokens(),
        cache_bytes: cache.total_bytes() as u64,
        bytes_per_token: cache.bytes_per_token(),
        requests: requests.len(),
        completed,
        never_fit: sim.never_fit,
        prompt_tokens: sim.prompt_tokens,
        hit_tokens: sim.hit_tokens,
        token_hit_rate: ratio(sim.hit_tokens, sim.prompt_tokens),
        tier_hits: sim.tier_hits,
        tiers: (config.host_blocks > 0 || config.remote.is_some()).then(|| tiered.stats()),
        hit_requests: sim.hit_requests,
        request_hit_rate: ratio(sim.hit_requests as u64, completed as u64),
        output_tokens: sim.output_tokens,
        evictions: stats.evictions,
        cow_copies: stats.cow_copies,
        peak_usage,
        mean_usage: if span == 0 {
            usage
        } else {
            usage_area / span as f64
        },
        queue_delay_ms: Distribution::of_ns(&mut sim.queue_delays),
        ttft_ms: Distribution::of_ns(&mut sim.ttfts),
        simulated_s: span as f64 / 1e9,
        manager: ManagerCost {
            calls: sim.meter.calls,
            seconds: manager_s,
            us_per_request: if completed == 0 {
                0.0
            } else {
                manager_s * 1e6 / completed as f64
            },
            calls_per_s: if manager_s > 0.0 {
                sim.meter.calls as f64 / manager_s
            } else {
                0.0
            },
        },
        wall_s: wall.elapsed().as_secs_f64(),
        stats,
    })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

struct Sim<'a> {
    requests: &'a [TraceRequest],
    config: &'a SimConfig,
    cache: &'a TieredCache,
    meter: Meter,
    /// Waiting requests (trace indices), head first.
    queue: VecDeque<usize>,
    /// The head's prompt tokens, built once however often it is retried.
    head_tokens: Option<Vec<TokenId>>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    /// Output tokens produced so far, per request.
    produced: Vec<usize>,
    arrival_ns: Vec<u64>,
    lane_free_ns: u64,
    queue_delays: Vec<u64>,
    ttfts: Vec<u64>,
    prompt_tokens: u64,
    hit_tokens: u64,
    /// Prompt tokens served per tier.
    tier_hits: TierHits,
    hit_requests: usize,
    output_tokens: u64,
    never_fit: usize,
    /// Requests finished or dropped.
    done: usize,
}

impl Sim<'_> {
    fn schedule(&mut self, time: u64, request: usize) {
        self.seq += 1;
        self.events.push(Reverse(Event {
            time,
            seq: self.seq,
            request,
        }));
    }

    /// Admits queue heads while they fit; returns how many were dropped.
    fn try_admit(&mut self, now: u64) -> Result<usize> {
        let mut dropped = 0;
        while let Some(&i) = self.queue.front() {
            let r = &self.requests[i];
            let tokens = self.head_tokens.get_or_insert_with(|| r.prompt_tokens());
            let opts = AdmitOptions::decode_slots(r.output_length);
            let (cache, id) = (self.cache, i as RequestId);
            if let Some(remote) = cache.remote() {
                remote.flush(Duration::from_secs(60));
            }
            match self.meter.time(|| cache.admit(id, tokens, &opts)) {
                Ok(admission) => {
                    let cached = admission.num_cached_tokens;
                    self.tier_hits.device_tokens += admission.hits.device_tokens;
                    self.tier_hits.host_tokens += admission.hits.host_tokens;
                    self.tier_hits.remote_tokens += admission.hits.remote_tokens;
                    self.prompt_tokens += r.input_length as u64;
                    self.hit_tokens += cached as u64;
                    self.hit_requests += usize::from(cached > 0);
                    self.queue_delays.push(now - self.arrival_ns[i]);
                    let start = now.max(self.lane_free_ns);
                    let uncached = (r.input_length - cached) as u64;
                    self.lane_free_ns = start + uncached * self.config.prefill_ns_per_token;
                    self.ttfts.push(self.lane_free_ns - self.arrival_ns[i]);
                    let first_token = self.lane_free_ns;
                    self.schedule(first_token, i);
                }
                // Nothing runs, so nothing will ever be freed for it.
                Err(Error::OutOfBlocks { .. }) if !self.events.is_empty() => return Ok(dropped),
                Err(Error::OutOfBlocks { .. } | Error::RequestTooLarge { .. }) => {
                    self.never_fit += 1;
                    self.done += 1;
                    dropped += 1;
                }
                Err(e) => return Err(e),
            }
            self.queue.pop_front();
            self.head_tokens = None;
        }
        Ok(dropped)
    }

    /// Produces request `e.request`'s next token (freeing it after its
    /// last); returns whether the request finished.
    fn step(&mut self, e: Event) -> Result<bool> {
        let i = e.request;
        let r = &self.requests[i];
        let cache = self.cache;
        let id = i as RequestId;
        if self.produced[i] < r.output_length {
            let token = r.token_at(r.input_length + self.produced[i]);
            self.meter.time(|| cache.append(id, &[token]))?;
            self.produced[i] += 1;
            self.output_tokens += 1;
        }
        if self.produced[i] < r.output_length {
            self.schedule(e.time + self.config.tpot_ns, i);
            return Ok(false);
        }
        self.meter.time(|| cache.free(id))?;
        self.done += 1;
        self.try_admit(e.time)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{OnMalformed, Trace};
    use crate::SimRemoteTier;

    fn request(
        timestamp: u64,
        input_length: usize,
        output_length: usize,
        hash_ids: &[u64],
    ) -> TraceRequest {
        TraceRequest {
            timestamp,
            input_length,
            output_length,
            hash_ids: hash_ids.to_vec(),
        }
    }

    fn config(num_blocks: usize) -> SimConfig {
        SimConfig {
            num_blocks,
            ..SimConfig::default()
        }
    }

    fn run(requests: &[TraceRequest], config: &SimConfig) -> SimReport {
        simulate("test", requests, config, |_, _| {}).unwrap()
    }

    #[test]
    fn two_requests_sharing_three_of_four_blocks() {
        let reqs = [
            request(0, 2048, 4, &[1, 2, 3, 4]),
            request(1000, 2048, 4, &[1, 2, 3, 5]),
        ];
        let r = run(&reqs, &config(1024));
        assert_eq!(r.completed, 2);
        assert_eq!(r.prompt_tokens, 4096);
        assert_eq!(r.hit_tokens, 1536);
        assert_eq!(r.hit_requests, 1);
        assert_eq!(r.request_hit_rate, 0.5);
        assert_eq!(r.output_tokens, 8);
        assert_eq!(r.stats.prefix_hit_tokens, r.hit_tokens);
        assert_eq!(r.stats.prefix_query_tokens, r.prompt_tokens);
        assert_eq!(r.evictions, 0);
        assert_eq!(r.stats.used_blocks, 0, "everything freed");
        // 40 ms per token: the first request holds its 33 blocks for 120 ms.
        assert!((r.peak_usage - 33.0 / 1024.0).abs() < 1e-12);
        assert_eq!(r.simulated_s, 1.12);
        assert_eq!(r.queue_delay_ms.max, 0.0);
    }

    #[test]
    fn lower_tiers_serve_what_the_device_tier_evicted() {
        // 40 blocks of 64: request 3 repeats request 1's prompt after
        // request 2 evicted it from the device tier.
        let reqs = [
            request(0, 2048, 4, &[1, 2, 3, 4]),
            request(1000, 2048, 4, &[5, 6, 7, 8]),
            request(2000, 2048, 4, &[1, 2, 3, 4]),
        ];
        // Request 2 evicts request 1's blocks tail first: 7 roots stay.
        let device_only = run(&reqs, &config(40));
        assert_eq!(device_only.hit_tokens, 7 * 64);
        for (host_blocks, remote) in [
            (64, None),
            (0, Some(SimRemoteTier::InProcess { blocks: 64 })),
        ] {
            let tiered = SimConfig {
                host_blocks,
                remote: remote.clone(),
                ..config(40)
            };
            let r = run(&reqs, &tiered);
            // The last prompt token is recomputed: 31 of 32 blocks load.
            assert_eq!(r.hit_tokens, 31 * 64, "{host_blocks} {remote:?}");
            assert_eq!(r.tier_hits.total() as u64, r.hit_tokens);
            assert_eq!(r.tier_hits.device_tokens, 7 * 64);
            assert_eq!(r.tier_hits.host_tokens + r.tier_hits.remote_tokens, 24 * 64);
        }
    }

    #[test]
    fn a_full_cache_queues_head_of_line_and_evicts() {
        // 40 blocks: each request needs 33, so the second waits for the
        // first to finish (3 x 40 ms after arrival), then evicts its tail.
        let reqs = [
            request(0, 2048, 4, &[1, 2, 3, 4]),
            request(10, 2048, 4, &[1, 2, 3, 5]),
        ];
        let r = run(&reqs, &config(40));
        assert_eq!(r.completed, 2);
        assert_eq!(r.queue_delay_ms.max, 110.0);
        assert_eq!(r.queue_delay_ms.p50, 0.0);
        assert_eq!(r.hit_tokens, 1536);
        assert!(r.evictions > 0);
    }

    #[test]
    fn requests_larger_than_the_cache_are_counted_not_fatal() {
        let reqs = [
            request(0, 4096, 1, &[1, 2, 3, 4, 5, 6, 7, 8]),
            request(5, 100, 1, &[9]),
        ];
        let r = run(&reqs, &config(32));
        assert_eq!(r.never_fit, 1);
        assert_eq!(r.completed, 1);
    }

    #[test]
    fn prefill_time_delays_the_first_token_on_one_lane() {
        let reqs = [request(0, 1000, 1, &[1, 2]), request(0, 1000, 1, &[3, 4])];
        let cfg = SimConfig {
            prefill_ns_per_token: 1_000,
            ..config(1024)
        };
        let r = run(&reqs, &cfg);
        // 1 ms of prefill each, one after the other.
        assert_eq!(r.ttft_ms.p50, 1.0);
        assert_eq!(r.ttft_ms.max, 2.0);
    }

    #[test]
    fn the_same_workload_gives_the_same_figures() {
        let text: String = (0..200)
            .map(|i| {
                let ids: Vec<String> = (0..(i % 7 + 1)).map(|b| ((b * 3 + i) % 11).to_string()).collect();
                format!(
                    "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}\n",
                    i * 50,
                    ids.len() * 512 - 7,
                    i % 90,
                    ids.join(",")
                )
            })
            .collect();
        let t = Trace::parse(&text, OnMalformed::Fail).unwrap();
        let a = run(&t.requests, &config(200));
        let b = run(&t.requests, &config(200));
        assert_eq!(a.hit_tokens, b.hit_tokens);
        assert_eq!(a.evictions, b.evictions);
        assert_eq!(a.mean_usage, b.mean_usage);
        assert_eq!(a.queue_delay_ms, b.queue_delay_ms);
        assert_eq!(a.completed + a.never_fit, 200);
        assert_eq!(a.stats.used_blocks, 0);
    }
}
