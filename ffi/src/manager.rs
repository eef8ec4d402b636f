//! The block manager: admission, prefix matching, appends, forks, pins.

use super::config::{info, CONFIGS};
use super::keys::{admit_options, extra_keys, MlaAdmitOptions, MlaExtraKeys};
use super::requests::{self, AdmitOutputs, GrowOutputs, RequestHandle};
use super::types::{MlaAdmitCheck, MlaBlockCopy, MlaCacheStats};
use super::{
    guard, input, Failure, FfiResult, MlaBlockId, MlaConfig, MlaConfigInfo, MlaRequestId,
    MlaStatus, MlaTokenId, Out, OutBuf, Registry,
};
use mla_cache::BlockManager;

/// A block manager (opaque): who holds which block, prefix sharing,
/// copy-on-write, pinning and eviction. Thread-safe: share one handle
/// between threads freely.
pub struct MlaManager {
    pub(crate) inner: BlockManager,
}

pub(crate) static MANAGERS: Registry<MlaManager> = Registry::new("MlaManager");

/// Runs `f` on the manager behind a live handle.
pub(crate) fn with<R>(
    m: *const MlaManager,
    f: impl FnOnce(&BlockManager) -> FfiResult<R>,
) -> FfiResult<R> {
    MANAGERS.with(m, |m| f(&m.inner))
}

impl RequestHandle for MlaManager {
    type Cache = BlockManager;

    fn with<R>(handle: *const Self, f: impl FnOnce(&BlockManager) -> FfiResult<R>) -> FfiResult<R> {
        with(handle, f)
    }
}

/// Creates a block manager for a configuration (copied: the configuration
/// handle may be destroyed or changed afterwards). Fails with
/// `MLA_STATUS_INVALID_CONFIG` if the configuration is invalid,
/// `MLA_STATUS_OUT_OF_MEMORY` if its per-block arrays cannot be allocated.
///
/// # Safety
/// `out` must be valid for a write; `*out` receives the new handle.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_create(
    config: *const MlaConfig,
    out: *mut *mut MlaManager,
) -> MlaStatus {
    guard("mla_manager_create", || {
        let out = Out::new(out, "out")?;
        let config = CONFIGS.with(config, |c| Ok(c.get()))?;
        let inner = BlockManager::new(config)?;
        let handle = MANAGERS.register(MlaManager { inner });
        // SAFETY: per the contract.
        unsafe { out.set(handle) };
        Ok(())
    })
}

/// Destroys a manager and every request and event it holds.
///
/// # Safety
/// `manager` must not be used after this call.
///
/// Thread safety: waits for calls in flight on this handle; calls made
/// after it fail with `MLA_STATUS_INVALID_HANDLE`.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_destroy(manager: *mut MlaManager) -> MlaStatus {
    guard("mla_manager_destroy", || MANAGERS.destroy(manager))
}

/// Reads the manager's configuration.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_get_config(
    manager: *const MlaManager,
    out: *mut MlaConfigInfo,
) -> MlaStatus {
    guard("mla_manager_get_config", || {
        let out = Out::new(out, "out")?;
        let config = with(manager, |m| Ok(info(m.config())))?;
        // SAFETY: per the contract.
        unsafe { out.set(config) };
        Ok(())
    })
}

/// Admits request `id` with its prompt, reusing the longest cached prefix
/// (capped at `num_tokens - 1` tokens by default) and reserving
/// `options->decode_slots` more slots. `options` may be NULL (defaults).
///
/// All or nothing: on success the request holds exactly
/// `ceil((num_tokens + decode_slots) / block_size)` blocks, written to
/// `block_ids` (their count to `*num_block_ids`), and `*num_cached_tokens`
/// leading prompt tokens are already cached. `block_ids_cap` below that
/// count fails with `MLA_STATUS_BUFFER_TOO_SMALL` (count written to
/// `*num_block_ids`). Other failures: `MLA_STATUS_OUT_OF_BLOCKS` (fits
/// later), `MLA_STATUS_REQUEST_TOO_LARGE` (never fits),
/// `MLA_STATUS_DUPLICATE_REQUEST`, `MLA_STATUS_EMPTY_INPUT`.
///
/// # Safety
/// `tokens` must hold `num_tokens` ids; `block_ids` must have room for
/// `block_ids_cap` ids; `options` must be NULL or valid (with valid strings);
/// the outputs must be valid for writes.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_admit(
    manager: *mut MlaManager,
    id: MlaRequestId,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    options: *const MlaAdmitOptions,
    block_ids: *mut MlaBlockId,
    block_ids_cap: usize,
    num_block_ids: *mut usize,
    num_cached_tokens: *mut usize,
) -> MlaStatus {
    guard("mla_manager_admit", || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let outs = AdmitOutputs::new(block_ids, block_ids_cap, num_block_ids, num_cached_tokens)?;
        let opts = unsafe { admit_options(options) }?;
        with(manager, |m| {
            unsafe {
                outs.run(m.config(), tokens.len(), &opts, || {
                    m.admit(id, tokens, &opts)
                })
            }?;
            Ok(())
        })
    })
}

/// Finds the longest run of cached full blocks at the start of `tokens`
/// under `keys` (NULL for none), without admitting anything or taking
/// references: the blocks may be evicted right after. Writes their ids and
/// count, and the tokens they cover to `*num_cached_tokens`. Too small a
/// buffer fails with `MLA_STATUS_BUFFER_TOO_SMALL` (count written).
///
/// # Safety
/// `tokens` must hold `num_tokens` ids; `block_ids` must have room for
/// `block_ids_cap` ids; `keys` must be NULL or valid; outputs valid for writes.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_match_prefix(
    manager: *const MlaManager,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    keys: *const MlaExtraKeys,
    block_ids: *mut MlaBlockId,
    block_ids_cap: usize,
    num_block_ids: *mut usize,
    num_cached_tokens: *mut usize,
) -> MlaStatus {
    guard("mla_manager_match_prefix", || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let keys = unsafe { extra_keys(keys) }?;
        let out = OutBuf::new(block_ids, block_ids_cap, num_block_ids, "block_ids")?;
        let cached_out = Out::new(num_cached_tokens, "num_cached_tokens")?;
        let found = with(manager, |m| Ok(m.match_prefix(tokens, &keys)))?;
        unsafe {
            out.fill(&found.block_ids)?;
            cached_out.set(found.num_tokens);
        }
        Ok(())
    })
}

/// Appends generated `tokens` to request `id`. Fills the reserved room
/// first and takes a new block only when it is full; a shared partial tail
/// is first replaced by a fresh block, and the `(src, dst)` copy the engine
/// must perform before writing is returned in `copies`.
///
/// The ids of blocks added to the end of the table go to `new_block_ids`.
/// Capacities are checked before anything changes, against the most a call
/// can return: `ceil(num_tokens / block_size)` new ids and
/// `MLA_MAX_COPIES_PER_APPEND` copies; below that the call fails with
/// `MLA_STATUS_BUFFER_TOO_SMALL`, writing the needed capacities to
/// `*num_new_block_ids` and `*num_copies`. Other failures:
/// `MLA_STATUS_UNKNOWN_REQUEST`, `MLA_STATUS_OUT_OF_BLOCKS`,
/// `MLA_STATUS_REQUEST_TOO_LARGE`, `MLA_STATUS_EMPTY_INPUT`.
///
/// # Safety
/// `tokens` must hold `num_tokens` ids; `new_block_ids` and `copies` must
/// have room for their capacities; the counts must be valid for writes.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_append(
    manager: *mut MlaManager,
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
            "mla_manager_append",
            manager,
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

/// Grows the block table of request `id` so it has room for `total_slots`
/// token positions (its tokens included) without adding tokens: lookahead
/// slots for speculative decoding, addressed with `mla_manager_slot_mapping`.
/// Never shrinks (no new block when the room is there). When the room
/// starts inside a partial tail shared with a fork, the tail is copied
/// first, as in `mla_manager_append`. A later append fills the room before
/// taking blocks; a fork shares only the blocks holding tokens. All or
/// nothing.
///
/// The ids of blocks added to the end of the table go to `new_block_ids`.
/// Capacities are checked before anything changes, against the most a call
/// can return: `ceil(total_slots / block_size)` new ids and
/// `MLA_MAX_COPIES_PER_APPEND` copies; below that the call fails with
/// `MLA_STATUS_BUFFER_TOO_SMALL`, writing the needed capacities to
/// `*num_new_block_ids` and `*num_copies`. Other failures:
/// `MLA_STATUS_UNKNOWN_REQUEST`, `MLA_STATUS_OUT_OF_BLOCKS`,
/// `MLA_STATUS_REQUEST_TOO_LARGE` (more blocks than the cache has; the
/// capacities are not checked then).
///
/// # Safety
/// `new_block_ids` and `copies` must have room for their capacities; the
/// counts must be valid for writes.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_reserve(
    manager: *mut MlaManager,
    id: MlaRequestId,
    total_slots: usize,
    new_block_ids: *mut MlaBlockId,
    new_block_ids_cap: usize,
    num_new_block_ids: *mut usize,
    copies: *mut MlaBlockCopy,
    copies_cap: usize,
    num_copies: *mut usize,
) -> MlaStatus {
    guard("mla_manager_reserve", || {
        let outs = GrowOutputs::new(
            new_block_ids,
            new_block_ids_cap,
            num_new_block_ids,
            copies,
            copies_cap,
            num_copies,
        )?;
        with(manager, |m| {
            let most_new = total_slots.div_ceil(m.config().block_size);
            // Past the cache's size the manager refuses (REQUEST_TOO_LARGE) anyway.
            let check = most_new <= m.config().num_blocks;
            let what = format!("reserving {total_slots} slots");
            // SAFETY: per the contract.
            unsafe { outs.run(most_new, check, what, || m.reserve(id, total_slots)) }
        })
    })
}

/// Reports that the first `num_computed_tokens` tokens of request `id` have
/// their KV written (chunked prefill); full blocks among them become
/// shareable. Progress only moves forward and cannot pass the request's
/// length (`MLA_STATUS_INVALID_ARGUMENT`).
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_manager_commit(
    manager: *mut MlaManager,
    id: MlaRequestId,
    num_computed_tokens: usize,
) -> MlaStatus {
    requests::commit("mla_manager_commit", manager, id, num_computed_tokens)
}

/// Creates request `child` sharing every block of `parent` that holds
/// tokens (parallel sampling, beam search); takes no new block. Fails with
/// `MLA_STATUS_UNKNOWN_REQUEST` or `MLA_STATUS_DUPLICATE_REQUEST`.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_manager_fork(
    manager: *mut MlaManager,
    parent: MlaRequestId,
    child: MlaRequestId,
) -> MlaStatus {
    requests::fork("mla_manager_fork", manager, parent, child)
}

/// Frees request `id`; its blocks are released tail first (deepest blocks
/// of a prefix chain are evicted first). `MLA_STATUS_UNKNOWN_REQUEST` if
/// it is not admitted.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_manager_free(manager: *mut MlaManager, id: MlaRequestId) -> MlaStatus {
    requests::free("mla_manager_free", manager, id)
}

/// Writes the block table of request `id` and its length. Too small a
/// buffer fails with `MLA_STATUS_BUFFER_TOO_SMALL` (length written).
///
/// # Safety
/// `block_ids` must have room for `block_ids_cap` ids; `num_block_ids` must
/// be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_block_table(
    manager: *const MlaManager,
    id: MlaRequestId,
    block_ids: *mut MlaBlockId,
    block_ids_cap: usize,
    num_block_ids: *mut usize,
) -> MlaStatus {
    // SAFETY: the same contract.
    unsafe {
        requests::block_table(
            "mla_manager_block_table",
            manager,
            id,
            block_ids,
            block_ids_cap,
            num_block_ids,
        )
    }
}

/// Writes the slot numbers (`block_id * block_size + offset`) of positions
/// `start .. end` of request `id` (positions may reach into its reserved
/// room) and their count. Too small a buffer fails with
/// `MLA_STATUS_BUFFER_TOO_SMALL` (count written); positions beyond the
/// request's slots with `MLA_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `slots` must have room for `slots_cap` values; `num_slots` must be
/// valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_slot_mapping(
    manager: *const MlaManager,
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
            "mla_manager_slot_mapping",
            manager,
            id,
            start,
            end,
            slots,
            slots_cap,
            num_slots,
        )
    }
}

/// Writes the number of tokens (prompt and appended) of request `id`.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_num_tokens(
    manager: *const MlaManager,
    id: MlaRequestId,
    out: *mut usize,
) -> MlaStatus {
    guard("mla_manager_num_tokens", || {
        let out = Out::new(out, "out")?;
        let n = with(manager, |m| Ok(m.num_tokens(id)?))?;
        // SAFETY: per the contract.
        unsafe { out.set(n) };
        Ok(())
    })
}

/// Writes the number of tokens of request `id` whose KV is written: its
/// length without `chunked_prefill`, else what `mla_manager_commit` reported
/// last (at least its cached prefix). `*out` is untouched on failure.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_num_computed_tokens(
    manager: *const MlaManager,
    id: MlaRequestId,
    out: *mut usize,
) -> MlaStatus {
    guard("mla_manager_num_computed_tokens", || {
        let out = Out::new(out, "out")?;
        let n = with(manager, |m| Ok(m.num_computed_tokens(id)?))?;
        // SAFETY: per the contract.
        unsafe { out.set(n) };
        Ok(())
    })
}

/// Writes how many tokens request `id` can take before it needs a new
/// block: the room left in its table (partial tail and reserved blocks).
/// `*out` is untouched on failure.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_capacity(
    manager: *const MlaManager,
    id: MlaRequestId,
    out: *mut usize,
) -> MlaStatus {
    guard("mla_manager_capacity", || {
        let out = Out::new(out, "out")?;
        let n = with(manager, |m| Ok(m.capacity(id)?))?;
        // SAFETY: per the contract.
        unsafe { out.set(n) };
        Ok(())
    })
}

/// A dry run of `mla_manager_admit`: writes what admitting `tokens` with
/// `options` (NULL: defaults) would take now (hit tokens, blocks to
/// allocate, blocks available, whether it fits), without admitting
/// anything, taking references or telling the eviction policy. Fails as
/// admission does for input it refuses (`MLA_STATUS_EMPTY_INPUT`,
/// `MLA_STATUS_REQUEST_TOO_LARGE`); `out->fits` says whether it would fail
/// with `MLA_STATUS_OUT_OF_BLOCKS`. `*out` is untouched on failure.
///
/// # Safety
/// `tokens` must hold `num_tokens` ids; `options` must be NULL or valid;
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe (another thread's calls may change the
/// answer right after).
#[no_mangle]
pub unsafe extern "C" fn mla_manager_would_admit(
    manager: *const MlaManager,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    options: *const MlaAdmitOptions,
    out: *mut MlaAdmitCheck,
) -> MlaStatus {
    guard("mla_manager_would_admit", || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let opts = unsafe { admit_options(options) }?;
        let out = Out::new(out, "out")?;
        let check = with(manager, |m| Ok(m.would_admit(tokens, &opts)?))?;
        unsafe { out.set(check.into()) };
        Ok(())
    })
}

/// Pins the cached full blocks of the prefix `tokens` under `keys` (NULL
/// for none): they are neither evicted nor reused until unpinned. Writes
/// the tokens pinned (0 when nothing is cached). Pins nest. Fails with
/// `MLA_STATUS_PIN_BUDGET_EXCEEDED` past the budget.
///
/// # Safety
/// `tokens` must hold `num_tokens` ids; `keys` must be NULL or valid;
/// `pinned_tokens` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_pin(
    manager: *mut MlaManager,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    keys: *const MlaExtraKeys,
    pinned_tokens: *mut usize,
) -> MlaStatus {
    guard("mla_manager_pin", || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let keys = unsafe { extra_keys(keys) }?;
        let out = Out::new(pinned_tokens, "pinned_tokens")?;
        let n = with(manager, |m| Ok(m.pin(tokens, &keys)?))?;
        unsafe { out.set(n) };
        Ok(())
    })
}

/// Releases one pin of the prefix `tokens` under `keys` (NULL for none):
/// the pin whose run ends deepest in it, exactly the blocks that
/// `mla_manager_pin` took; writes the tokens unpinned. Fails with
/// `MLA_STATUS_NOT_PINNED` when no pin lies on the prefix.
///
/// # Safety
/// As for `mla_manager_pin`.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_unpin(
    manager: *mut MlaManager,
    tokens: *const MlaTokenId,
    num_tokens: usize,
    keys: *const MlaExtraKeys,
    unpinned_tokens: *mut usize,
) -> MlaStatus {
    guard("mla_manager_unpin", || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let keys = unsafe { extra_keys(keys) }?;
        let out = Out::new(unpinned_tokens, "unpinned_tokens")?;
        let n = with(manager, |m| Ok(m.unpin(tokens, &keys)?))?;
        unsafe { out.set(n) };
        Ok(())
    })
}

/// A snapshot of the manager's gauges and counters
/// (`free_blocks + used_blocks == num_blocks` always holds).
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_stats(
    manager: *const MlaManager,
    out: *mut MlaCacheStats,
) -> MlaStatus {
    guard("mla_manager_stats", || {
        let out = Out::new(out, "out")?;
        let stats = with(manager, |m| Ok(m.stats().into()))?;
        // SAFETY: per the contract.
        unsafe { out.set(stats) };
        Ok(())
    })
}

/// Writes the number of blocks no request holds.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_num_free_blocks(
    manager: *const MlaManager,
    out: *mut usize,
) -> MlaStatus {
    guard("mla_manager_num_free_blocks", || {
        let out = Out::new(out, "out")?;
        let n = with(manager, |m| Ok(m.num_free_blocks()))?;
        // SAFETY: per the contract.
        unsafe { out.set(n) };
        Ok(())
    })
}

/// Writes the fraction of blocks in use, `0.0 ..= 1.0`.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_usage(manager: *const MlaManager, out: *mut f64) -> MlaStatus {
    guard("mla_manager_usage", || {
        let out = Out::new(out, "out")?;
        let usage = with(manager, |m| Ok(m.usage()))?;
        // SAFETY: per the contract.
        unsafe { out.set(usage) };
        Ok(())
    })
}

/// Drops every cached block from the prefix index. Refused with
/// `MLA_STATUS_BLOCKS_IN_USE` while any block is held (by requests or pins).
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_manager_reset_prefix_cache(manager: *mut MlaManager) -> MlaStatus {
    guard("mla_manager_reset_prefix_cache", || {
        with(manager, |m| Ok(m.reset_prefix_cache()?))
    })
}

/// Drops the `num_block_ids` blocks `block_ids` from the prefix index
/// (vLLM's `evict_blocks`: a KV connector reports their contents
/// unreadable), so no later lookup finds them; writes how many left the
/// index. A free block joins the never-hashed free list; a block in use
/// stays with its holders but is no longer shared. Blocks not in the index
/// are skipped. One `BlockRemoved` event per block; not counted as
/// evictions. Fails, changing nothing, with `MLA_STATUS_INVALID_BLOCK` for
/// an id outside the cache and `MLA_STATUS_INVALID_ARGUMENT` for a pinned
/// block (unpin its prefix first).
///
/// # Safety
/// `block_ids` must hold `num_block_ids` ids (may be NULL when 0);
/// `num_removed` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_evict_blocks(
    manager: *mut MlaManager,
    block_ids: *const MlaBlockId,
    num_block_ids: usize,
    num_removed: *mut usize,
) -> MlaStatus {
    guard("mla_manager_evict_blocks", || {
        // SAFETY: per the contract, for every pointer below.
        let block_ids = unsafe { input(block_ids, num_block_ids, "block_ids") }?;
        let out = Out::new(num_removed, "num_removed")?;
        let n = with(manager, |m| Ok(m.evict_blocks(block_ids)?))?;
        unsafe { out.set(n) };
        Ok(())
    })
}

/// Evicts up to `num_blocks` free cached blocks, chosen as allocation
/// chooses them (the policy's victims), ahead of allocating: they leave the
/// prefix index and join the never-hashed free list. Counted, logged and
/// announced like the evictions allocation makes. Writes how many were
/// evicted (fewer when fewer free blocks are cached).
///
/// # Safety
/// `num_evicted` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_evict(
    manager: *mut MlaManager,
    num_blocks: usize,
    num_evicted: *mut usize,
) -> MlaStatus {
    guard("mla_manager_evict", || {
        let out = Out::new(num_evicted, "num_evicted")?;
        let n = with(manager, |m| Ok(m.evict(num_blocks)))?;
        // SAFETY: per the contract.
        unsafe { out.set(n) };
        Ok(())
    })
}

/// Checks every bookkeeping invariant of the manager (for tests): returns
/// `MLA_STATUS_INTERNAL`, with the first violation as the message, if one
/// does not hold. Takes the manager's lock for a full scan.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_manager_check_invariants(manager: *const MlaManager) -> MlaStatus {
    guard("mla_manager_check_invariants", || {
        with(manager, |m| {
            m.check_invariants()
                .map_err(|e| Failure::new(MlaStatus::Internal, e))
        })
    })
}
