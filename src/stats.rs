//! Counters and gauges of a block manager.

/// A snapshot of a manager's state and counters since creation (C callers
/// get it as `MlaCacheStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Blocks in the cache.
    pub num_blocks: u64,
    /// Blocks no request holds (unhashed or cached-evictable).
    pub free_blocks: u64,
    /// Blocks held by requests or pins.
    pub used_blocks: u64,
    /// Blocks in the prefix index (in use or free).
    pub cached_blocks: u64,
    /// Blocks pinned by `pin`.
    pub pinned_blocks: u64,
    /// Requests admitted and not freed.
    pub num_requests: u64,
    /// Prompt tokens looked up on admission.
    pub prefix_query_tokens: u64,
    /// Prompt tokens served from the cache on admission.
    pub prefix_hit_tokens: u64,
    /// Admissions.
    pub prefix_query_requests: u64,
    /// Admissions with at least one cached token.
    pub prefix_hit_requests: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Blocks copied on write.
    pub cow_copies: u64,
    /// Blocks inserted into the prefix index.
    pub blocks_stored: u64,
    /// Free blocks in the prefix index: what the eviction policy may evict
    /// (SGLang's `evictable_size`, in blocks). The other free blocks were
    /// never hashed and are reused first.
    pub evictable_blocks: u64,
    /// Events dropped because `max_pending_events` were waiting for `take_events`.
    pub events_dropped: u64,
}

impl CacheStats {
    /// Fraction of blocks in use, `0.0..=1.0`.
    pub fn usage(&self) -> f64 {
        self.used_blocks as f64 / self.num_blocks as f64
    }

    /// Fraction of looked-up prompt tokens that hit, `0.0..=1.0`.
    pub fn hit_rate(&self) -> f64 {
        if self.prefix_query_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prefix_query_tokens as f64
        }
    }
}
