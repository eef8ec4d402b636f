//! The tiered cache: a block manager and its store with a host-memory tier
//! and a remote Valkey/Redis tier below.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use super::config::CONFIGS;
use super::events::{event_list, MlaEventList};
use super::keys::{admit_options, extra_keys};
use super::requests::{self, AdmitOutputs, RequestHandle};
use super::store::STORES;
use super::types::{MlaBlockCopy, MlaTierHits, MlaTierStats};
use super::{
    guard, input, opt_text, FfiResult, MlaAdmitOptions, MlaBlockId, MlaConfig, MlaExtraKeys,
    MlaRequestId, MlaStatus, MlaStore, MlaTokenId, Out, Registry,
};
use mla_cache::store::Stream;
use mla_cache::tier::{RemoteOptions, TierSettings, TieredCache};

/// A tiered cache (opaque): a block manager and its store (the device
/// tier, L1), a host-memory tier (L2) and a remote tier (L3). Allocate only
/// through it. Thread-safe.
pub struct MlaTieredCache {
    pub(super) inner: TieredCache,
}

pub(super) static TIERED: Registry<MlaTieredCache> = Registry::new("MlaTieredCache");

/// Settings of the lower tiers. All-zero (NULL strings) means no lower
/// tier, write-through, namespace `default`, a 20 ms lookup budget and a
/// queue of 64 jobs.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaTierOptions {
    /// Bytes of host memory for the host tier, rounded down to whole
    /// blocks; 0 for none.
    pub host_mem_bytes: u64,
    /// The remote tier, or NULL for none: `redis://host:port/`,
    /// `rediss://...` (TLS), `redis://user:password@host:port/` (ACL), or
    /// `cluster:` and comma-separated node URLs. Needs the library's
    /// `remote-redis` feature (else `MLA_STATUS_INVALID_CONFIG`) and a fixed
    /// hash seed in the configuration, the same on every node.
    pub remote: *const c_char,
    /// `write-through`, `write-through-selective:N` or `write-back`; NULL
    /// for write-through.
    pub write_policy: *const c_char,
    /// Names the deployment (model and weights) in remote keys; NULL for
    /// `default`. Only caches with the same namespace share blocks.
    pub remote_namespace: *const c_char,
    /// Longest a remote lookup waits, in microseconds; 0 for 20 ms.
    pub lookup_budget_us: u64,
    /// Remote jobs queued at most (beyond: lookups miss, writes are
    /// dropped); 0 for 64.
    pub queue_depth: usize,
    /// The engine's `CUstream`: block copies out of and into a CUDA store
    /// are enqueued on it and waited for. NULL: the legacy default stream.
    pub stream: *mut c_void,
    /// The remote tier's `medium` in events; NULL for `REMOTE`.
    pub remote_name: *const c_char,
}

/// Runs `f` on the tiered cache behind a live handle.
fn with<R>(c: *const MlaTieredCache, f: impl FnOnce(&TieredCache) -> FfiResult<R>) -> FfiResult<R> {
    TIERED.with(c, |c| f(&c.inner))
}

impl RequestHandle for MlaTieredCache {
    type Cache = TieredCache;

    fn with<R>(handle: *const Self, f: impl FnOnce(&TieredCache) -> FfiResult<R>) -> FfiResult<R> {
        with(handle, f)
    }
}

/// Takes every tier's events recorded since the last call (none unless the
/// configuration enabled events) into a new event list, oldest first, each
/// with its `medium`. On a tiered cache, take events here only.
///
/// # Safety
/// `out` must be valid for a write; `*out` receives the new handle.
///
/// Thread safety: thread-safe; each event goes to exactly one caller.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_take_events(
    cache: *mut MlaTieredCache,
    out: *mut *mut MlaEventList,
) -> MlaStatus {
    guard("mla_tiered_take_events", || {
        let out = Out::new(out, "out")?;
        let events = with(cache, |c| Ok(c.take_events()))?;
        // SAFETY: per the contract.
        unsafe { out.set(event_list(events.into_iter())) };
        Ok(())
    })
}

/// Reads the C options.
///
/// # Safety
/// A non-null `options` must point to valid options with valid strings.
unsafe fn settings(options: *const MlaTierOptions) -> FfiResult<TierSettings> {
    // SAFETY: per the contract.
    let Some(o) = (unsafe { options.as_ref() }) else {
        return Ok(TierSettings::default());
    };
    let defaults = RemoteOptions::default();
    // SAFETY: per the contract, for the three strings.
    let (remote, policy, namespace, name) = unsafe {
        (
            opt_text(o.remote, "options.remote")?,
            opt_text(o.write_policy, "options.write_policy")?,
            opt_text(o.remote_namespace, "options.remote_namespace")?,
            opt_text(o.remote_name, "options.remote_name")?,
        )
    };
    Ok(TierSettings {
        host_bytes: o.host_mem_bytes,
        remote: remote.map(str::to_owned),
        write_policy: policy.map_or(Ok(Default::default()), str::parse)?,
        remote_options: RemoteOptions {
            namespace: namespace.map_or(defaults.namespace, str::to_owned),
            lookup_budget: match o.lookup_budget_us {
                0 => defaults.lookup_budget,
                us => Duration::from_micros(us),
            },
            queue_depth: match o.queue_depth {
                0 => defaults.queue_depth,
                n => n,
            },
            name: name.map_or(defaults.name, str::to_owned),
        },
        stream: Stream(o.stream as usize),
    })
}

/// Creates a tiered cache: a block manager for `config` (copied) over
/// `store` (which must hold blocks of the same geometry), with the lower
/// tiers of `options` (NULL: none). The cache shares the store: the store's
/// memory lives until both handles are destroyed. A remote tier connects
/// lazily; an unreachable server costs hits, not errors. Fails with
/// `MLA_STATUS_INVALID_CONFIG` (bad configuration or options, a store of
/// another geometry, a remote tier without `remote-redis` support or
/// without a hash seed, prefix caching off with lower tiers),
/// `MLA_STATUS_INVALID_UTF8`.
///
/// # Safety
/// `options` must be NULL or valid (with valid strings); `out` must be valid
/// for a write; `*out` receives the new handle.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_create(
    config: *const MlaConfig,
    store: *const MlaStore,
    options: *const MlaTierOptions,
    out: *mut *mut MlaTieredCache,
) -> MlaStatus {
    guard("mla_tiered_create", || {
        let out = Out::new(out, "out")?;
        // SAFETY: per the contract.
        let settings = unsafe { settings(options) }?;
        let config = CONFIGS.with(config, |c| Ok(c.get()))?;
        let inner = STORES.with(store, |s| {
            Ok(settings.build(config, s.inner.config(), s.blocks.clone())?)
        })?;
        // SAFETY: `out` was checked; valid for a write per the contract.
        unsafe { out.set(TIERED.register(MlaTieredCache { inner })) };
        Ok(())
    })
}

/// Destroys a tiered cache (its remote tier's queued writes are dropped).
///
/// # Safety
/// `cache` must not be used after this call.
///
/// Thread safety: waits for calls in flight on this handle.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_destroy(cache: *mut MlaTieredCache) -> MlaStatus {
    guard("mla_tiered_destroy", || TIERED.destroy(cache))
}

/// Admits request `id` like `mla_manager_admit`, then loads the
/// continuation of its cached prefix from host memory and the remote tier
/// into its blocks before returning. `*num_cached_tokens` covers every
/// loaded token; `*hits` says how many each tier served. Buffers and
/// failures as `mla_manager_admit`.
///
/// # Safety
/// As `mla_manager_admit`; `hits` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_admit(
    cache: *mut MlaTieredCache,
    id: MlaRequestId,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    options: *const MlaAdmitOptions,
    block_ids: *mut MlaBlockId,
    block_ids_cap: usize,
    num_block_ids: *mut usize,
    num_cached_tokens: *mut usize,
    hits: *mut MlaTierHits,
) -> MlaStatus {
    guard("mla_tiered_admit", || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let outs = AdmitOutputs::new(block_ids, block_ids_cap, num_block_ids, num_cached_tokens)?;
        let hits_out = Out::new(hits, "hits")?;
        let opts = unsafe { admit_options(options) }?;
        with(cache, |c| {
            let config = c.manager().config();
            let admission =
                unsafe { outs.run(config, tokens.len(), &opts, || c.admit(id, tokens, &opts)) }?;
            unsafe { hits_out.set(admission.hits.into()) };
            Ok(())
        })
    })
}

/// Where the longest cached prefix of `tokens` under `keys` (NULL: none)
/// lies, without admitting or loading anything; the remote tier is probed
/// within the lookup budget. Not capped at the last token.
///
/// # Safety
/// `tokens` must hold `num_tokens` ids; `keys` must be NULL or valid; `hits`
/// must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_lookup(
    cache: *const MlaTieredCache,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    keys: *const MlaExtraKeys,
    hits: *mut MlaTierHits,
) -> MlaStatus {
    guard("mla_tiered_lookup", || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let keys = unsafe { extra_keys(keys) }?;
        let out = Out::new(hits, "hits")?;
        let found = with(cache, |c| Ok(c.lookup(tokens, &keys)))?;
        unsafe { out.set(found.into()) };
        Ok(())
    })
}

/// Appends generated tokens like `mla_manager_append` (same buffers and
/// failures); blocks it evicts are copied down first under write-back.
///
/// # Safety
/// As `mla_manager_append`.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_append(
    cache: *mut MlaTieredCache,
    id: MlaRequestId,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    new_block_ids: *mut MlaBlockId,
    new_block_ids_cap: usize,
    num_new_block_ids: *mut usize,
    copies: *mut MlaBlockCopy,
    copies_cap: usize,
    num_copies: *mut usize,
) -> MlaStatus {
    // SAFETY: the same contract.
    unsafe {
        requests::append(
            "mla_tiered_append",
            cache,
            id,
            tokens,
            num_tokens,
            new_block_ids,
            new_block_ids_cap,
            num_new_block_ids,
            copies,
            copies_cap,
            num_copies,
        )
    }
}

/// Reports that the first `num_computed_tokens` tokens of request `id`
/// have their KV written, like `mla_manager_commit`; under write-through
/// their full blocks go down.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_tiered_commit(
    cache: *mut MlaTieredCache,
    id: MlaRequestId,
    num_computed_tokens: usize,
) -> MlaStatus {
    requests::commit("mla_tiered_commit", cache, id, num_computed_tokens)
}

/// Creates request `child` sharing the blocks of `parent`, like
/// `mla_manager_fork`.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_tiered_fork(
    cache: *mut MlaTieredCache,
    parent: MlaRequestId,
    child: MlaRequestId,
) -> MlaStatus {
    requests::fork("mla_tiered_fork", cache, parent, child)
}

/// Frees request `id` like `mla_manager_free`; an unchunked request's
/// written blocks go down first under write-through.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_tiered_free(cache: *mut MlaTieredCache, id: MlaRequestId) -> MlaStatus {
    requests::free("mla_tiered_free", cache, id)
}

/// Writes the block table of request `id` and its length, like
/// `mla_manager_block_table`.
///
/// # Safety
/// `block_ids` must have room for `block_ids_cap` ids; `num_block_ids` must
/// be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_block_table(
    cache: *const MlaTieredCache,
    id: MlaRequestId,
    block_ids: *mut MlaBlockId,
    block_ids_cap: usize,
    num_block_ids: *mut usize,
) -> MlaStatus {
    // SAFETY: the same contract.
    unsafe {
        requests::block_table(
            "mla_tiered_block_table",
            cache,
            id,
            block_ids,
            block_ids_cap,
            num_block_ids,
        )
    }
}

/// Writes the slot numbers of positions `start .. end` of request `id`,
/// like `mla_manager_slot_mapping`.
///
/// # Safety
/// `slots` must have room for `slots_cap` values; `num_slots` must be valid
/// for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_slot_mapping(
    cache: *const MlaTieredCache,
    id: MlaRequestId,
    start: usize,
    end: usize,
    slots: *mut i64,
    slots_cap: usize,
    num_slots: *mut usize,
) -> MlaStatus {
    // SAFETY: the same contract.
    unsafe {
        requests::slot_mapping(
            "mla_tiered_slot_mapping",
            cache,
            id,
            start,
            end,
            slots,
            slots_cap,
            num_slots,
        )
    }
}

/// A snapshot of the tiered cache's counters and its tiers'.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_stats(
    cache: *const MlaTieredCache,
    out: *mut MlaTierStats,
) -> MlaStatus {
    guard("mla_tiered_stats", || {
        let out = Out::new(out, "out")?;
        let s = with(cache, |c| Ok(c.stats()))?;
        let stats = MlaTierStats::from(s);
        // SAFETY: per the contract.
        unsafe { out.set(stats) };
        Ok(())
    })
}

/// Waits up to `timeout_ms` until the remote tier has run every write
/// queued so far; `*done` says whether it did (true without a remote tier).
///
/// # Safety
/// `done` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_tiered_flush_remote(
    cache: *const MlaTieredCache,
    timeout_ms: u64,
    done: *mut bool,
) -> MlaStatus {
    guard("mla_tiered_flush_remote", || {
        let out = Out::new(done, "done")?;
        let flushed = with(cache, |c| {
            Ok(c.remote()
                .is_none_or(|r| r.flush(Duration::from_millis(timeout_ms))))
        })?;
        // SAFETY: per the contract.
        unsafe { out.set(flushed) };
        Ok(())
    })
}
