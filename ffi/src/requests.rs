//! The request API's C plumbing, shared by `mla_manager_*` and
//! `mla_tiered_*`: output buffers checked before anything changes, then the
//! call, then its outcome written out.

use std::fmt::Display;

use super::types::MlaBlockCopy;
use super::{
    guard, input, Failure, FfiResult, MlaBlockId, MlaRequestId, MlaStatus, MlaTokenId, Out, OutBuf,
};
use mla_cache::{AdmitOptions, Admitted, AppendOutcome, CacheConfig, RequestCache};

/// Most copies one `mla_manager_append` or `mla_manager_reserve` returns
/// (only the tail block of a request can be shared and partial).
pub const MLA_MAX_COPIES_PER_APPEND: usize = 1;

/// The outputs of an admission: the block table and the cached tokens.
pub(crate) struct AdmitOutputs {
    block_ids: OutBuf<MlaBlockId>,
    num_cached_tokens: Out<usize>,
}

impl AdmitOutputs {
    /// Checks the output pointers.
    pub(crate) fn new(
        block_ids: *mut MlaBlockId,
        block_ids_cap: usize,
        num_block_ids: *mut usize,
        num_cached_tokens: *mut usize,
    ) -> FfiResult<Self> {
        Ok(Self {
            block_ids: OutBuf::new(block_ids, block_ids_cap, num_block_ids, "block_ids")?,
            num_cached_tokens: Out::new(num_cached_tokens, "num_cached_tokens")?,
        })
    }

    /// Checks the block-id capacity against the blocks the admission takes
    /// (when it can fit the cache at all: otherwise the admission's own
    /// error comes first), runs `admit`, writes its outcome and returns it.
    ///
    /// # Safety
    /// The pointers given to [`AdmitOutputs::new`] must be valid for their
    /// capacities.
    pub(crate) unsafe fn run<A: Admitted>(
        &self,
        config: &CacheConfig,
        num_tokens: usize,
        options: &AdmitOptions,
        admit: impl FnOnce() -> mla_cache::Result<A>,
    ) -> FfiResult<A> {
        if let Some(slots) = num_tokens.checked_add(options.decode_slots) {
            let needed = slots.div_ceil(config.block_size);
            if needed <= config.num_blocks {
                // SAFETY: per the contract.
                unsafe { self.block_ids.reserve(needed) }?;
            }
        }
        let admission = admit()?;
        // SAFETY: per the contract.
        unsafe {
            self.block_ids.fill(admission.block_ids())?;
            self.num_cached_tokens.set(admission.num_cached_tokens());
        }
        Ok(admission)
    }
}

/// The outputs of an append or a reserve: new block ids and copies.
pub(crate) struct GrowOutputs {
    new_block_ids: OutBuf<MlaBlockId>,
    copies: OutBuf<MlaBlockCopy>,
}

impl GrowOutputs {
    /// Checks the output pointers.
    pub(crate) fn new(
        new_block_ids: *mut MlaBlockId,
        new_block_ids_cap: usize,
        num_new_block_ids: *mut usize,
        copies: *mut MlaBlockCopy,
        copies_cap: usize,
        num_copies: *mut usize,
    ) -> FfiResult<Self> {
        Ok(Self {
            new_block_ids: OutBuf::new(
                new_block_ids,
                new_block_ids_cap,
                num_new_block_ids,
                "new_block_ids",
            )?,
            copies: OutBuf::new(copies, copies_cap, num_copies, "copies")?,
        })
    }

    /// When `check`, fails with `MLA_STATUS_BUFFER_TOO_SMALL` (writing the
    /// capacities needed) unless the buffers hold `most_new` block ids and
    /// [`MLA_MAX_COPIES_PER_APPEND`] copies; then runs `grow` (`what` names
    /// it in the message) and writes its outcome.
    ///
    /// # Safety
    /// The pointers given to [`GrowOutputs::new`] must be valid for their
    /// capacities.
    pub(crate) unsafe fn run(
        &self,
        most_new: usize,
        check: bool,
        what: impl Display,
        grow: impl FnOnce() -> mla_cache::Result<AppendOutcome>,
    ) -> FfiResult<()> {
        let (ids, copies) = (&self.new_block_ids, &self.copies);
        if check && (most_new > ids.cap || copies.cap < MLA_MAX_COPIES_PER_APPEND) {
            // SAFETY: per the contract.
            unsafe {
                ids.set_len(most_new);
                copies.set_len(MLA_MAX_COPIES_PER_APPEND);
            }
            return Err(Failure::new(
                MlaStatus::BufferTooSmall,
                format!(
                    "{what} needs room for {most_new} new block ids and \
                     {MLA_MAX_COPIES_PER_APPEND} copy, got {} and {}",
                    ids.cap, copies.cap
                ),
            ));
        }
        let outcome = grow()?;
        // SAFETY: per the contract.
        unsafe {
            ids.fill(&outcome.new_block_ids)?;
            copies.fill(&outcome.copies)
        }
    }

    /// [`GrowOutputs::run`] for appending `num_tokens` tokens to a request
    /// of a cache with `block_size`-token blocks.
    ///
    /// # Safety
    /// As for [`GrowOutputs::run`].
    pub(crate) unsafe fn append(
        &self,
        num_tokens: usize,
        block_size: usize,
        append: impl FnOnce() -> mla_cache::Result<AppendOutcome>,
    ) -> FfiResult<()> {
        let most_new = num_tokens.div_ceil(block_size);
        let what = format!("appending {num_tokens} tokens");
        // SAFETY: forwarded.
        unsafe { self.run(most_new, num_tokens > 0, what, append) }
    }
}

/// A C handle whose object runs requests (`MlaManager`, `MlaTieredCache`):
/// each request call of `mla_manager_*` and `mla_tiered_*` is one body
/// below, generic over it; the `extern "C"` functions only name it (cbindgen
/// reads them, so they stay written out).
pub(crate) trait RequestHandle {
    /// The object behind the handle.
    type Cache: RequestCache;
    /// Runs `f` on the object behind the live handle `handle`.
    fn with<R>(handle: *const Self, f: impl FnOnce(&Self::Cache) -> FfiResult<R>) -> FfiResult<R>;
}

/// The body of `mla_manager_append` and `mla_tiered_append` (`name`).
///
/// # Safety
/// As `mla_manager_append`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn append<H: RequestHandle>(
    name: &'static str,
    handle: *const H,
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
    guard(name, || {
        // SAFETY: per the contract, for every pointer below.
        let tokens = unsafe { input(tokens, num_tokens, "tokens") }?;
        let outs = GrowOutputs::new(
            new_block_ids,
            new_block_ids_cap,
            num_new_block_ids,
            copies,
            copies_cap,
            num_copies,
        )?;
        H::with(handle, |c| unsafe {
            let block_size = c.manager().config().block_size;
            outs.append(tokens.len(), block_size, || c.append(id, tokens))
        })
    })
}

/// The body of `mla_manager_commit` and `mla_tiered_commit` (`name`).
pub(crate) fn commit<H: RequestHandle>(
    name: &'static str,
    handle: *const H,
    id: MlaRequestId,
    num_computed_tokens: usize,
) -> MlaStatus {
    guard(name, || {
        H::with(handle, |c| Ok(c.commit(id, num_computed_tokens)?))
    })
}

/// The body of `mla_manager_fork` and `mla_tiered_fork` (`name`).
pub(crate) fn fork<H: RequestHandle>(
    name: &'static str,
    handle: *const H,
    parent: MlaRequestId,
    child: MlaRequestId,
) -> MlaStatus {
    guard(name, || H::with(handle, |c| Ok(c.fork(parent, child)?)))
}

/// The body of `mla_manager_free` and `mla_tiered_free` (`name`).
pub(crate) fn free<H: RequestHandle>(
    name: &'static str,
    handle: *const H,
    id: MlaRequestId,
) -> MlaStatus {
    guard(name, || H::with(handle, |c| Ok(c.free(id)?)))
}

/// The body of `mla_manager_block_table` and `mla_tiered_block_table`
/// (`name`).
///
/// # Safety
/// As `mla_manager_block_table`.
pub(crate) unsafe fn block_table<H: RequestHandle>(
    name: &'static str,
    handle: *const H,
    id: MlaRequestId,
    block_ids: *mut MlaBlockId,
    block_ids_cap: usize,
    num_block_ids: *mut usize,
) -> MlaStatus {
    guard(name, || {
        let out = OutBuf::new(block_ids, block_ids_cap, num_block_ids, "block_ids")?;
        let table = H::with(handle, |c| Ok(c.manager().block_table(id)?))?;
        // SAFETY: per the contract.
        unsafe { out.fill(&table) }
    })
}

/// The body of `mla_manager_slot_mapping` and `mla_tiered_slot_mapping`
/// (`name`).
///
/// # Safety
/// As `mla_manager_slot_mapping`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn slot_mapping<H: RequestHandle>(
    name: &'static str,
    handle: *const H,
    id: MlaRequestId,
    start: usize,
    end: usize,
    slots: *mut i64,
    slots_cap: usize,
    num_slots: *mut usize,
) -> MlaStatus {
    guard(name, || {
        let out = OutBuf::new(slots, slots_cap, num_slots, "slots")?;
        let mapping = H::with(handle, |c| Ok(c.manager().slot_mapping(id, start..end)?))?;
        // SAFETY: per the contract.
        unsafe { out.fill(&mapping) }
    })
}
