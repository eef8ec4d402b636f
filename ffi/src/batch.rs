//! Batched calls of a manager: one engine step over many requests, each
//! call taking the manager's lock once, all or nothing.

use std::ops::Range;

use super::manager::{with, MlaManager};
use super::requests::MLA_MAX_COPIES_PER_APPEND;
use super::types::MlaBlockCopy;
use super::{
    guard, input, Failure, FfiResult, MlaBlockId, MlaRequestId, MlaStatus, MlaTokenId, Out, OutBuf,
};
use mla_cache::{BatchAppendOutcome, Error};

/// A copy one request of a batch must perform before writing its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct MlaBatchCopy {
    /// The request's index in the batch.
    pub request_index: usize,
    /// The copy, with the table position of its fresh block.
    pub copy: MlaBlockCopy,
}

/// Positions `start .. end` of a request (for its slot mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct MlaPositionRange {
    /// First position.
    pub start: usize,
    /// One past the last position.
    pub end: usize,
}

/// A caller-owned output array of exactly `len` elements.
///
/// # Safety
/// A non-null `ptr` must be valid for `len` writes, and not read or written
/// by anything else during the call.
unsafe fn output<'a, T>(ptr: *mut T, len: usize, what: &str) -> FfiResult<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    // The checks of an input array (non-null, aligned, in bounds) are those
    // of an output one.
    // SAFETY: forwarded; the slice is dropped unread.
    unsafe { input(ptr.cast_const(), len, what) }?;
    // SAFETY: checked above; the caller gives the array to this call.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// Appends tokens to each of `num_requests` requests `ids` under one lock:
/// `num_tokens[i]` tokens to request `ids[i]` (`num_tokens` NULL: one
/// each, a decode step), taken in order from `tokens`, whose length is
/// their sum. The outcome equals `mla_manager_append` of each request in
/// turn; a copy one request makes can spare another (the last holder of a
/// shared tail writes in place).
///
/// Outputs: the ids of blocks added to each table, request after request, go
/// to `new_block_ids` (`*num_new_block_ids` in all) and their count per
/// request to `new_block_counts` (`num_requests` entries); copies to
/// perform before writing go to `copies` (`*num_copies`), each naming its
/// request's index in the batch and its table position; the slot of every
/// appended token, request after request, goes to `slots` (`*num_slots`,
/// the sum of the token counts).
///
/// Capacities are checked before anything changes, against the most a
/// batch can return: `sum(ceil(num_tokens[i] / block_size))` new ids,
/// `num_requests * MLA_MAX_COPIES_PER_APPEND` copies and the token count in
/// slots; below that the call fails with `MLA_STATUS_BUFFER_TOO_SMALL`,
/// writing those to `*num_new_block_ids`, `*num_copies` and `*num_slots`.
///
/// All or nothing: every request is checked and the blocks of the whole
/// batch counted before anything changes. Failures
/// (`MLA_STATUS_UNKNOWN_REQUEST`, `MLA_STATUS_EMPTY_INPUT` for a count of
/// 0, `MLA_STATUS_OUT_OF_BLOCKS` for the batch's total,
/// `MLA_STATUS_REQUEST_TOO_LARGE`, `MLA_STATUS_INVALID_ARGUMENT` for a
/// request given twice) change no request and leave every output untouched
/// (but the three counts on `MLA_STATUS_BUFFER_TOO_SMALL`).
///
/// # Safety
/// `ids` must hold `num_requests` ids and `num_tokens` (unless NULL) as
/// many counts; `tokens` their sum of ids; each output array must have room
/// for its capacity (`new_block_counts` for `num_requests`); the counts
/// must be valid for writes.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_append_batch(
    manager: *mut MlaManager,
    ids: *const MlaRequestId,
    num_requests: usize,
    tokens: *const MlaTokenId,
    num_tokens: *const usize,
    new_block_ids: *mut MlaBlockId,
    new_block_ids_cap: usize,
    new_block_counts: *mut usize,
    num_new_block_ids: *mut usize,
    copies: *mut MlaBatchCopy,
    copies_cap: usize,
    num_copies: *mut usize,
    slots: *mut i64,
    slots_cap: usize,
    num_slots: *mut usize,
) -> MlaStatus {
    guard("mla_manager_append_batch", || {
        // SAFETY: per the contract, for every pointer below.
        let ids = unsafe { input(ids, num_requests, "ids") }?;
        let counts = match num_tokens.is_null() {
            true => vec![1; ids.len()],
            false => unsafe { input(num_tokens, num_requests, "num_tokens") }?.to_vec(),
        };
        let total = counts
            .iter()
            .try_fold(0usize, |sum, &n| sum.checked_add(n))
            .ok_or_else(|| Failure::invalid("the token counts overflow"))?;
        let tokens = unsafe { input(tokens, total, "tokens") }?;
        let new_ids = OutBuf::new(
            new_block_ids,
            new_block_ids_cap,
            num_new_block_ids,
            "new_block_ids",
        )?;
        let counts_out = unsafe { output(new_block_counts, num_requests, "new_block_counts") }?;
        let copies = OutBuf::new(copies, copies_cap, num_copies, "copies")?;
        let slots = OutBuf::new(slots, slots_cap, num_slots, "slots")?;
        let mut batch = Vec::with_capacity(ids.len());
        let mut rest = tokens;
        for (&id, &n) in ids.iter().zip(&counts) {
            let (these, after) = rest.split_at(n);
            batch.push((id, these));
            rest = after;
        }
        with(manager, |m| {
            let bs = m.config().block_size;
            let most_new = counts.iter().map(|n| n.div_ceil(bs)).sum::<usize>();
            let most_copies = num_requests.saturating_mul(MLA_MAX_COPIES_PER_APPEND);
            if most_new > new_ids.cap || most_copies > copies.cap || total > slots.cap {
                // SAFETY: per the contract.
                unsafe {
                    new_ids.set_len(most_new);
                    copies.set_len(most_copies);
                    slots.set_len(total);
                }
                return Err(Failure::new(
                    MlaStatus::BufferTooSmall,
                    format!(
                        "a batch appending {total} tokens to {num_requests} requests needs room \
                         for {most_new} new block ids, {most_copies} copies and {total} slots, \
                         got {}, {} and {}",
                        new_ids.cap, copies.cap, slots.cap
                    ),
                ));
            }
            let BatchAppendOutcome {
                requests,
                slot_mapping,
            } = m.append_batch(&batch)?;
            let added: Vec<MlaBlockId> = requests
                .iter()
                .flat_map(|o| o.new_block_ids.iter().copied())
                .collect();
            let copied: Vec<MlaBatchCopy> = requests
                .iter()
                .enumerate()
                .flat_map(|(i, o)| {
                    o.copies.iter().map(move |&c| MlaBatchCopy {
                        request_index: i,
                        copy: c.into(),
                    })
                })
                .collect();
            for (out, o) in counts_out.iter_mut().zip(&requests) {
                *out = o.new_block_ids.len();
            }
            // SAFETY: per the contract; the capacities were checked above.
            unsafe {
                new_ids.fill(&added)?;
                copies.fill(&copied)?;
                slots.fill(&slot_mapping)
            }
        })
    })
}

/// Fills the block tables and slot mapping of a batch as attention kernels
/// take them (FlashMLA, FlashInfer), under one lock: row `i` of
/// `block_tables` (row-major `int32 [num_requests][max_blocks]`) gets the
/// table of request `ids[i]`, padded with `pad`; `slots` gets the slots of
/// positions `positions[i]` of each request in turn (`positions` NULL: no
/// slots; `slots` may then be NULL). Requests may repeat.
///
/// On success and on `MLA_STATUS_BUFFER_TOO_SMALL` (a table longer than
/// `max_blocks`, or more slots than `slots_cap`), the sizes the batch needs
/// are written: the longest table to `*required_max_blocks` and the slot
/// count to `*num_slots` (untouched on other failures); on every failure
/// the arrays are untouched. Other
/// failures: `MLA_STATUS_UNKNOWN_REQUEST`, `MLA_STATUS_INVALID_ARGUMENT`
/// (a range outside its request's slots, block ids that do not fit
/// `int32_t`).
///
/// # Safety
/// `ids` must hold `num_requests` ids and `positions` (unless NULL) as many
/// ranges; `block_tables` must have room for `num_requests * max_blocks`
/// values and `slots` for `slots_cap`; the sizes must be valid for writes.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_fill_block_tables(
    manager: *const MlaManager,
    ids: *const MlaRequestId,
    num_requests: usize,
    block_tables: *mut i32,
    max_blocks: usize,
    pad: i32,
    positions: *const MlaPositionRange,
    slots: *mut i64,
    slots_cap: usize,
    required_max_blocks: *mut usize,
    num_slots: *mut usize,
) -> MlaStatus {
    guard("mla_manager_fill_block_tables", || {
        // SAFETY: per the contract, for every pointer below.
        let ids = unsafe { input(ids, num_requests, "ids") }?;
        let ranges: Vec<Range<usize>> = match positions.is_null() {
            true => Vec::new(),
            false => unsafe { input(positions, num_requests, "positions") }?
                .iter()
                .map(|r| r.start..r.end)
                .collect(),
        };
        let entries = num_requests
            .checked_mul(max_blocks)
            .ok_or_else(|| Failure::invalid("num_requests * max_blocks overflows"))?;
        let tables = unsafe { output(block_tables, entries, "block_tables") }?;
        let slots = unsafe { output(slots, slots_cap, "slots") }?;
        let widest = Out::new(required_max_blocks, "required_max_blocks")?;
        let count = Out::new(num_slots, "num_slots")?;
        with(manager, |m| {
            let sizes = match m.fill_block_tables(ids, tables, max_blocks, pad, &ranges, slots) {
                Ok(sizes) => sizes,
                Err(e) => {
                    if let Error::BatchBuffersTooSmall {
                        max_blocks,
                        num_slots,
                    } = e
                    {
                        // SAFETY: per the contract.
                        unsafe {
                            widest.set(max_blocks);
                            count.set(num_slots);
                        }
                    }
                    return Err(e.into());
                }
            };
            // SAFETY: per the contract.
            unsafe {
                widest.set(sizes.max_blocks);
                count.set(sizes.num_slots);
            }
            Ok(())
        })
    })
}

/// Frees the `num_requests` requests `ids` under one lock, as
/// `mla_manager_free` of each in turn would. All or nothing: an unknown
/// request (`MLA_STATUS_UNKNOWN_REQUEST`) or one given twice
/// (`MLA_STATUS_INVALID_ARGUMENT`) frees none.
///
/// # Safety
/// `ids` must hold `num_requests` ids (may be NULL when 0).
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_free_batch(
    manager: *mut MlaManager,
    ids: *const MlaRequestId,
    num_requests: usize,
) -> MlaStatus {
    guard("mla_manager_free_batch", || {
        // SAFETY: per the contract.
        let ids = unsafe { input(ids, num_requests, "ids") }?;
        with(manager, |m| Ok(m.free_batch(ids)?))
    })
}
