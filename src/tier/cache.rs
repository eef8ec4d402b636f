//! [`TieredCache`]: a block manager and its device store (L1), with a host
//! tier (L2) and a remote tier (L3) below.
//!
//! ```text
//!   admit(tokens)                                  write policy
//!     L1 hits ──▶ L2 continuation ──▶ L3 continuation     │
//!     (manager)   (host memory)       (shared store)      ▼
//!     loads copy L2/L3 blocks into fresh L1 blocks   L1 ──▶ L2 ──▶ L3
//!     then commit them: never served before loaded   (through, selective, back)
//! ```
//!
//! A request is admitted to the manager chunked, so the blocks it will load
//! are not computed and no other request can hit them. The loads run, then
//! `commit` makes them computed and shareable, all before `admit` returns.
//! A failed or slow lower tier only shortens the loaded run.
//!
//! Write-back needs the evicted blocks' bytes: allocation happens under the
//! tier's `alloc` lock, which also drains the manager's eviction log, so the
//! evicted blocks of a call are copied out by that call before the new
//! owner's engine can write them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::event_log::{Changes, EventLog};
use super::host::{HostStored, HostTier, HostTierStats};
use super::remote::{RemoteStats, RemoteTier, HEADER_LEN};
use super::transfer::BlockTransfer;
use super::write_policy::WritePolicy;
use crate::error::{Error, Result};
use crate::hash::{BlockHash, ExtraKeys};
use crate::ids::{BlockId, RequestId, TokenId};
use crate::manager::{AdmitOptions, AppendOutcome, BlockManager};
use crate::publish::{WireEvent, MEDIUM_CPU};
use crate::store::Stream;
use crate::sync::Mutex;
use crate::tier::remote::BlockFormat;

/// The lower tiers of a [`TieredCache`] and when blocks go down to them.
#[derive(Debug, Default)]
pub struct TierOptions {
    /// When device blocks are copied down.
    pub write_policy: WritePolicy,
    /// The host-memory tier (L2), if any.
    pub host: Option<HostTier>,
    /// The remote tier (L3), if any.
    pub remote: Option<RemoteTier>,
    /// The engine's stream: block copies out of and into the device tier
    /// are enqueued on it, after the work the engine enqueued before the
    /// call (host device tiers ignore it).
    pub stream: Stream,
}

/// Prompt tokens served by each tier: a leading run from the device tier,
/// continued from host memory, then from the remote tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[repr(C)]
pub struct TierHits {
    /// Tokens already in the device tier.
    pub device_tokens: usize,
    /// Tokens loaded (or, for a lookup, loadable) from host memory.
    pub host_tokens: usize,
    /// Tokens loaded (or loadable) from the remote tier.
    pub remote_tokens: usize,
}

impl TierHits {
    /// Tokens served by all tiers together.
    pub fn total(&self) -> usize {
        self.device_tokens + self.host_tokens + self.remote_tokens
    }
}

/// The outcome of [`TieredCache::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieredAdmission {
    /// The request's block table.
    pub block_ids: Vec<BlockId>,
    /// Leading prompt tokens whose KV is in the device tier now (hits and
    /// completed loads): the engine computes from here.
    pub num_cached_tokens: usize,
    /// Where those tokens came from.
    pub hits: TierHits,
}

/// Counters of a [`TieredCache`], with its tiers' own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    /// Prompt tokens looked up by admissions.
    pub query_tokens: u64,
    /// Tokens served per tier by admissions.
    pub device_hit_tokens: u64,
    /// Tokens loaded from host memory by admissions.
    pub host_hit_tokens: u64,
    /// Tokens loaded from the remote tier by admissions.
    pub remote_hit_tokens: u64,
    /// Blocks copied down from the device tier (write-through or selective).
    pub written_through: u64,
    /// Evicted blocks copied down before reuse (write-back).
    pub written_back: u64,
    /// Block copies that failed (the block is then simply not in the lower tier).
    pub copy_errors: u64,
    /// Events dropped because `max_pending_events` were waiting for
    /// [`TieredCache::take_events`] (the manager counts its own queue's).
    pub events_dropped: u64,
    /// The host tier's counters.
    pub host: Option<HostTierStats>,
    /// The remote tier's counters.
    pub remote: Option<RemoteStats>,
}

#[derive(Debug, Clone, Copy)]
struct RequestState {
    /// Computed blocks already considered for write-through.
    written: usize,
    /// Leading blocks whose bytes the engine has written (or the tier
    /// loaded): only these may be copied down.
    settled: usize,
    /// The caller asked for unchunked prefill: every token counts as
    /// computed once admitted or appended.
    unchunked: bool,
}

#[derive(Debug, Default)]
struct Counters {
    query_tokens: AtomicU64,
    device_hit_tokens: AtomicU64,
    host_hit_tokens: AtomicU64,
    remote_hit_tokens: AtomicU64,
    written_through: AtomicU64,
    written_back: AtomicU64,
    copy_errors: AtomicU64,
}

/// A [`BlockManager`] with its device store and lower tiers. `Send + Sync`.
///
/// Allocate only through this type (`admit`, `append`): it copies evicted
/// blocks out before handing them over. Without lower tiers every call is
/// the manager's own.
pub struct TieredCache {
    manager: BlockManager,
    device: Arc<dyn BlockTransfer>,
    policy: WritePolicy,
    stream: Stream,
    host: Option<HostTier>,
    remote: Option<RemoteTier>,
    /// Serializes allocating calls with the draining of their evictions.
    alloc: Mutex<()>,
    requests: Mutex<FxHashMap<RequestId, RequestState>>,
    /// Device-tier hits per block, for write-through-selective.
    hit_counts: Mutex<FxHashMap<BlockHash, u32>>,
    counters: Counters,
    events: EventLog,
    /// The host tier's `medium` in events.
    host_medium: Arc<str>,
    /// The remote tier's `medium` in events (its configured name).
    remote_medium: Arc<str>,
}

impl std::fmt::Debug for TieredCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredCache")
            .field("manager", &self.manager)
            .field("policy", &self.policy)
            .field("host", &self.host)
            .field("remote", &self.remote)
            .finish()
    }
}

impl TieredCache {
    /// A tiered cache over `manager` and its device store `device`. The
    /// tiers must hold blocks of the device's size; a remote tier needs a
    /// fixed `hash_seed` (shared by every node) and prefix caching.
    pub fn new(
        manager: BlockManager,
        device: Arc<dyn BlockTransfer>,
        options: TierOptions,
    ) -> Result<Self> {
        let config = manager.config();
        let bytes = device.block_bytes();
        let bad = |m: String| Err(Error::InvalidConfig(m));
        let tiered = options.host.is_some() || options.remote.is_some();
        if tiered && !config.enable_prefix_caching {
            return bad("lower cache tiers need prefix caching".into());
        }
        if let Some(host) = &options.host {
            if host.block_bytes() != bytes {
                return bad(format!(
                    "host tier blocks are {} bytes, device blocks {bytes}",
                    host.block_bytes()
                ));
            }
        }
        if let Some(remote) = &options.remote {
            if remote.options().name.is_empty() {
                return bad("the remote tier's name must not be empty".into());
            }
            if *remote.format() != BlockFormat::new(config, bytes) {
                return bad("the remote tier's block format differs from the device tier's".into());
            }
            if config.hash_seed.is_none() {
                return bad("a remote tier needs a fixed hash_seed, the same on every node".into());
            }
        }
        manager.set_eviction_log(tiered);
        let remote_medium = options
            .remote
            .as_ref()
            .map_or("", |r| r.options().name.as_str())
            .into();
        Ok(Self {
            events: EventLog::new(&manager),
            host_medium: MEDIUM_CPU.into(),
            remote_medium,
            manager,
            device,
            policy: options.write_policy,
            stream: options.stream,
            host: options.host,
            remote: options.remote,
            alloc: Mutex::new(()),
            requests: Mutex::new(FxHashMap::default()),
            hit_counts: Mutex::new(FxHashMap::default()),
            counters: Counters::default(),
        })
    }

    /// The block manager (for reads: tables, slot mappings, stats).
    pub fn manager(&self) -> &BlockManager {
        &self.manager
    }

    /// The host tier, if any.
    pub fn host(&self) -> Option<&HostTier> {
        self.host.as_ref()
    }

    /// The remote tier, if any.
    pub fn remote(&self) -> Option<&RemoteTier> {
        self.remote.as_ref()
    }

    /// The write policy.
    pub fn write_policy(&self) -> WritePolicy {
        self.policy
    }

    fn tiered(&self) -> bool {
        self.host.is_some() || self.remote.is_some()
    }

    /// Where the longest cached prefix of `tokens` lies, without admitting
    /// or loading anything: the device tier's leading run, its continuation
    /// in host memory, then in the remote tier (probed within the lookup
    /// budget). Not capped at the last token.
    pub fn lookup(&self, tokens: &[TokenId], keys: &ExtraKeys) -> TierHits {
        let bs = self.manager.config().block_size;
        let hashes = self.manager.chain_hashes(tokens, keys);
        let l1 = self.manager.cached_run(tokens, &hashes).len();
        let l2 = self
            .host
            .as_ref()
            .map_or(0, |h| h.leading_run(&hashes[l1..]));
        let l3 = self
            .remote
            .as_ref()
            .map_or(0, |r| r.probe(&hashes[l1 + l2..]));
        TierHits {
            device_tokens: l1 * bs,
            host_tokens: l2 * bs,
            remote_tokens: l3 * bs,
        }
    }

    /// Admits request `id` like [`BlockManager::admit`], then continues the
    /// device tier's hit with blocks loaded from host memory and the remote
    /// tier (capped like the manager's hits), before returning. With
    /// `opts.chunked_prefill` the engine commits from `num_cached_tokens`
    /// on; without, the whole prompt counts as computed, as in the manager.
    pub fn admit(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        opts: &AdmitOptions,
    ) -> Result<TieredAdmission> {
        if !self.tiered() {
            let a = self.manager.admit(id, tokens, opts)?;
            self.count_admission(tokens.len(), a.num_cached_tokens, 0, 0);
            return Ok(TieredAdmission {
                hits: TierHits {
                    device_tokens: a.num_cached_tokens,
                    ..TierHits::default()
                },
                block_ids: a.block_ids,
                num_cached_tokens: a.num_cached_tokens,
            });
        }
        let config = self.manager.config();
        let bs = config.block_size;
        let chunked = AdmitOptions {
            chunked_prefill: true,
            ..opts.clone()
        };
        // The chain and the hit cap of the admission serve the loads below.
        let prompt = self.manager.prepare(tokens, &chunked)?;
        let admission = {
            let _alloc = self.alloc.lock();
            let a = self.manager.admit_prepared(id, tokens, &chunked, &prompt);
            let evicted = self.manager.take_evicted_chain();
            drop(_alloc);
            self.on_evicted(&evicted);
            a?
        };
        let (hashes, limit) = (&prompt.chain.hashes, prompt.hit_limit);
        let blocks = &admission.block_ids;
        let l1 = admission.num_cached_tokens / bs;
        if let WritePolicy::WriteThroughSelective { min_hits } = self.policy {
            self.count_hits(&hashes[..l1], &blocks[..l1], min_hits);
        }

        let mut loaded = l1;
        if let Some(host) = &self.host {
            while loaded < limit {
                let b = blocks[loaded];
                match host.read(hashes[loaded], |bytes| {
                    self.device.write_block(b, bytes, self.stream)
                }) {
                    Ok(true) => loaded += 1,
                    Ok(false) => break,
                    Err(_) => {
                        self.counters.copy_errors.fetch_add(1, Relaxed);
                        break;
                    }
                }
            }
        }
        let l2 = loaded - l1;
        let mut host_changes = Changes::default();
        if let Some(remote) = self.remote.as_ref().filter(|_| loaded < limit) {
            for value in remote.get(&hashes[loaded..limit]) {
                let (h, b, payload) = (hashes[loaded], blocks[loaded], &value[HEADER_LEN..]);
                if self.device.write_block(b, payload, self.stream).is_err() {
                    self.counters.copy_errors.fetch_add(1, Relaxed);
                    break;
                }
                if let Some(host) = &self.host {
                    let stored = host.insert(h, |buf| {
                        buf.copy_from_slice(payload);
                        Ok(())
                    });
                    if let Ok(Some(s)) = stored {
                        note_host_store(&mut host_changes, h, s);
                    }
                }
                loaded += 1;
            }
        }
        self.events
            .record(&self.manager, &self.host_medium, host_changes);
        let l3 = loaded - l1 - l2;

        let state = RequestState {
            written: loaded,
            settled: loaded,
            unchunked: !opts.chunked_prefill,
        };
        self.requests.lock().insert(id, state);
        let computed = if opts.chunked_prefill {
            loaded * bs
        } else {
            tokens.len()
        };
        if computed > admission.num_cached_tokens {
            self.manager.commit(id, computed)?;
        }
        self.count_admission(tokens.len(), l1 * bs, l2 * bs, l3 * bs);
        Ok(TieredAdmission {
            block_ids: admission.block_ids,
            num_cached_tokens: loaded * bs,
            hits: TierHits {
                device_tokens: l1 * bs,
                host_tokens: l2 * bs,
                remote_tokens: l3 * bs,
            },
        })
    }

    /// Appends generated tokens, like [`BlockManager::append`]; blocks it
    /// evicts are copied down first under write-back. For a request
    /// admitted unchunked, an append also tells that the step producing the
    /// tokens has written every earlier token's KV: those blocks are now
    /// copied down under write-through.
    pub fn append(&self, id: RequestId, tokens: &[TokenId]) -> Result<AppendOutcome> {
        if !self.tiered() {
            return self.manager.append(id, tokens);
        }
        let before = self.manager.num_tokens(id)?;
        let outcome = {
            let _alloc = self.alloc.lock();
            let out = self.manager.append(id, tokens);
            let evicted = self.manager.take_evicted_chain();
            drop(_alloc);
            self.on_evicted(&evicted);
            out?
        };
        if self.is_unchunked(id) {
            self.manager.commit(id, self.manager.num_tokens(id)?)?;
            self.settle(id, before / self.manager.config().block_size);
        }
        self.write_through(id)?;
        Ok(outcome)
    }

    /// Reports tokens whose KV the engine has written, like
    /// [`BlockManager::commit`]; under write-through their full blocks go down.
    pub fn commit(&self, id: RequestId, num_computed_tokens: usize) -> Result<()> {
        self.manager.commit(id, num_computed_tokens)?;
        if self.tiered() {
            self.settle(id, num_computed_tokens / self.manager.config().block_size);
            self.write_through(id)?;
        }
        Ok(())
    }

    /// Forks `parent` into `child`, like [`BlockManager::fork`].
    pub fn fork(&self, parent: RequestId, child: RequestId) -> Result<()> {
        self.manager.fork(parent, child)?;
        let mut requests = self.requests.lock();
        if let Some(&state) = requests.get(&parent) {
            requests.insert(child, state);
        }
        Ok(())
    }

    /// Frees request `id`, like [`BlockManager::free`]. For a request
    /// admitted unchunked, every token but the last counts as written (the
    /// last one's KV is computed by a step that never runs), and under
    /// write-through those blocks go down before the blocks are released.
    pub fn free(&self, id: RequestId) -> Result<()> {
        if self.tiered() && self.is_unchunked(id) {
            let len = self.manager.num_tokens(id)?;
            self.settle(id, len.saturating_sub(1) / self.manager.config().block_size);
            self.write_through(id)?;
        }
        self.manager.free(id)?;
        self.requests.lock().remove(&id);
        Ok(())
    }

    /// Events of every tier recorded since the last call, oldest first,
    /// each with its `medium`: the manager's as `"GPU"`, the host tier's as
    /// `"CPU"`, the remote tier's with its name (empty unless
    /// [`CacheConfig::enable_events`](crate::CacheConfig::enable_events)).
    /// Take events from here, not from the manager, on a tiered cache.
    pub fn take_events(&self) -> Vec<WireEvent> {
        self.events.take(&self.manager)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TierStats {
        let c = &self.counters;
        TierStats {
            query_tokens: c.query_tokens.load(Relaxed),
            device_hit_tokens: c.device_hit_tokens.load(Relaxed),
            host_hit_tokens: c.host_hit_tokens.load(Relaxed),
            remote_hit_tokens: c.remote_hit_tokens.load(Relaxed),
            written_through: c.written_through.load(Relaxed),
            written_back: c.written_back.load(Relaxed),
            copy_errors: c.copy_errors.load(Relaxed),
            events_dropped: self.events.dropped(),
            host: self.host.as_ref().map(HostTier::stats),
            remote: self.remote.as_ref().map(RemoteTier::stats),
        }
    }

    fn count_admission(&self, query: usize, l1: usize, l2: usize, l3: usize) {
        let c = &self.counters;
        c.query_tokens.fetch_add(query as u64, Relaxed);
        c.device_hit_tokens.fetch_add(l1 as u64, Relaxed);
        c.host_hit_tokens.fetch_add(l2 as u64, Relaxed);
        c.remote_hit_tokens.fetch_add(l3 as u64, Relaxed);
    }

    /// Handles blocks the device tier just evicted (their bytes still intact).
    fn on_evicted(&self, evicted: &[(BlockHash, BlockId)]) {
        if evicted.is_empty() {
            return;
        }
        match self.policy {
            WritePolicy::WriteBack => {
                let n = self.copy_down(evicted);
                self.counters.written_back.fetch_add(n, Relaxed);
            }
            WritePolicy::WriteThroughSelective { .. } => {
                let mut counts = self.hit_counts.lock();
                for (h, _) in evicted {
                    counts.remove(h);
                }
            }
            WritePolicy::WriteThrough => {}
        }
    }

    /// Counts device-tier hits; blocks reaching `min_hits` go down.
    fn count_hits(&self, hashes: &[BlockHash], blocks: &[BlockId], min_hits: u32) {
        let mut hot = Vec::new();
        {
            let mut counts = self.hit_counts.lock();
            for (&h, &b) in hashes.iter().zip(blocks) {
                let c = counts.entry(h).or_insert(0);
                *c += 1;
                if *c == min_hits {
                    hot.push((h, b));
                }
            }
        }
        let n = self.copy_down(&hot);
        self.counters.written_through.fetch_add(n, Relaxed);
    }

    fn is_unchunked(&self, id: RequestId) -> bool {
        self.requests.lock().get(&id).is_some_and(|r| r.unchunked)
    }

    /// Records that request `id`'s first `blocks` blocks hold their bytes.
    fn settle(&self, id: RequestId, blocks: usize) {
        if let Some(r) = self.requests.lock().get_mut(&id) {
            r.settled = r.settled.max(blocks);
        }
    }

    /// Under write-through, copies down request `id`'s computed, settled
    /// blocks not copied yet.
    fn write_through(&self, id: RequestId) -> Result<()> {
        if self.policy != WritePolicy::WriteThrough {
            return Ok(());
        }
        let Some((written, settled)) = self
            .requests
            .lock()
            .get(&id)
            .map(|r| (r.written, r.settled))
        else {
            return Ok(());
        };
        if settled <= written {
            return Ok(());
        }
        let mut fresh = self.manager.computed_chain(id, written)?;
        fresh.truncate(settled - written);
        if fresh.is_empty() {
            return Ok(());
        }
        if let Some(r) = self.requests.lock().get_mut(&id) {
            r.written = r.written.max(written + fresh.len());
        }
        let n = self.copy_down(&fresh);
        self.counters.written_through.fetch_add(n, Relaxed);
        Ok(())
    }

    /// Copies device blocks to the host tier and, for those new there (or
    /// all, without one), to the remote tier. Returns the blocks copied.
    fn copy_down(&self, blocks: &[(BlockHash, BlockId)]) -> u64 {
        let mut puts = Vec::new();
        let mut host_changes = Changes::default();
        let mut copied = 0;
        for &(h, b) in blocks {
            let value = match (&self.host, &self.remote) {
                (Some(host), remote) => {
                    match host.insert(h, |buf| self.device.read_block(b, buf, self.stream)) {
                        Ok(None) => continue,
                        Ok(Some(stored)) => {
                            note_host_store(&mut host_changes, h, stored);
                            copied += 1;
                            let Some(remote) = remote else { continue };
                            let mut value = None;
                            let read = host.read(h, |bytes| {
                                value = Some(remote.format().encode::<Error>(h, |p| {
                                    p.copy_from_slice(bytes);
                                    Ok(())
                                })?);
                                Ok(())
                            });
                            match (read, value) {
                                (Ok(true), Some(v)) => v,
                                _ => continue,
                            }
                        }
                        Err(_) => {
                            self.counters.copy_errors.fetch_add(1, Relaxed);
                            continue;
                        }
                    }
                }
                (None, Some(remote)) => match remote
                    .format()
                    .encode(h, |p| self.device.read_block(b, p, self.stream))
                {
                    Ok(v) => {
                        copied += 1;
                        v
                    }
                    Err(_) => {
                        self.counters.copy_errors.fetch_add(1, Relaxed);
                        continue;
                    }
                },
                (None, None) => continue,
            };
            puts.push((h, value));
        }
        self.events
            .record(&self.manager, &self.host_medium, host_changes);
        if let Some(remote) = &self.remote {
            let mut remote_changes = Changes::default();
            for &(h, _) in &puts {
                remote_changes.stored(h);
            }
            if remote.put(puts) {
                self.events
                    .record(&self.manager, &self.remote_medium, remote_changes);
            }
        }
        copied
    }
}

/// Notes a block the host tier stored, after the block it evicted for it.
fn note_host_store(changes: &mut Changes, hash: BlockHash, stored: HostStored) {
    if let Some(evicted) = stored.evicted {
        changes.removed(evicted);
    }
    changes.stored(hash);
}
