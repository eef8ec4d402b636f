//! Prefix-index events for KV-aware routers (vLLM's KV event stream).

use std::ffi::{c_char, CString};

use super::manager::{MlaManager, MANAGERS};
use super::{guard, Failure, MlaStatus, MlaTokenId, Out, Registry};
use mla_cache::publish::{WireEvent, MEDIUM_GPU};
use mla_cache::CacheEvent;

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MlaEventKind {
    /// Consecutive blocks of one chain entered the prefix index.
    BlockStored = 0,
    /// Blocks left the prefix index (evicted).
    BlockRemoved = 1,
    /// The whole prefix cache was reset.
    AllBlocksCleared = 2,
}

/// One event, as read by `mla_event_list_get`. Its pointers belong to the
/// event list and stay valid until `mla_event_list_destroy`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaEvent {
    /// What happened; decides which fields are meaningful.
    pub kind: MlaEventKind,
    /// External 64-bit hashes (the low 64 bits of the 128-bit chain hash)
    /// of the stored or removed blocks, in chain order.
    pub block_hashes: *const u64,
    /// Number of `block_hashes`.
    pub num_block_hashes: usize,
    /// BLOCK_STORED: whether the first stored block has a parent.
    pub has_parent: bool,
    /// BLOCK_STORED: external hash of the block before the first one, if `has_parent`.
    pub parent_block_hash: u64,
    /// BLOCK_STORED: the blocks' tokens, `block_size` per block.
    pub token_ids: *const MlaTokenId,
    /// Number of `token_ids`.
    pub num_token_ids: usize,
    /// BLOCK_STORED: tokens per block (0 for other kinds).
    pub block_size: usize,
    /// BLOCK_STORED: adapter the blocks were computed with, or NULL.
    pub adapter: *const c_char,
    /// Where the blocks live (vLLM's `medium`): `GPU` for the device tier,
    /// `CPU` for host memory, the remote tier's name for it.
    pub medium: *const c_char,
}

/// One event's owned data.
struct Owned {
    kind: MlaEventKind,
    hashes: Vec<u64>,
    parent: Option<u64>,
    tokens: Vec<MlaTokenId>,
    block_size: usize,
    adapter: Option<CString>,
    medium: CString,
}

/// Events taken from a manager (opaque); read with `mla_event_list_len` and
/// `mla_event_list_get`, release with `mla_event_list_destroy`.
pub struct MlaEventList {
    events: Vec<Owned>,
}

static EVENT_LISTS: Registry<MlaEventList> = Registry::new("MlaEventList");

fn own(e: WireEvent) -> Owned {
    // Media come from settings checked as C strings or constants: no NUL.
    let medium = CString::new(e.medium.as_bytes()).unwrap_or_default();
    match e.event {
        CacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            adapter,
        } => Owned {
            kind: MlaEventKind::BlockStored,
            hashes: block_hashes,
            parent: parent_block_hash,
            tokens: token_ids,
            block_size,
            // Adapter names reach the manager as C strings here, so they hold no NUL.
            adapter: adapter.and_then(|a| CString::new(a.as_bytes()).ok()),
            medium,
        },
        CacheEvent::BlockRemoved { block_hashes } => Owned {
            kind: MlaEventKind::BlockRemoved,
            hashes: block_hashes,
            parent: None,
            tokens: Vec::new(),
            block_size: 0,
            adapter: None,
            medium,
        },
        CacheEvent::AllBlocksCleared => Owned {
            kind: MlaEventKind::AllBlocksCleared,
            hashes: Vec::new(),
            parent: None,
            tokens: Vec::new(),
            block_size: 0,
            adapter: None,
            medium,
        },
    }
}

/// Takes the events recorded since the last call (none unless the
/// configuration enabled events) into a new event list, in the order they
/// happened. The list is independent of the manager.
///
/// # Safety
/// `out` must be valid for a write; `*out` receives the new handle.
///
/// Thread safety: thread-safe; each event goes to exactly one caller.
#[no_mangle]
pub unsafe extern "C" fn mla_manager_take_events(
    manager: *mut MlaManager,
    out: *mut *mut MlaEventList,
) -> MlaStatus {
    guard("mla_manager_take_events", || {
        let out = Out::new(out, "out")?;
        let events = MANAGERS.with(manager, |m| Ok(m.inner.take_events()))?;
        let gpu: std::sync::Arc<str> = MEDIUM_GPU.into();
        let events = events.into_iter().map(|event| WireEvent {
            event,
            medium: std::sync::Arc::clone(&gpu),
        });
        // SAFETY: per the contract.
        unsafe { out.set(event_list(events)) };
        Ok(())
    })
}

/// Registers a new list of `events`.
pub(super) fn event_list(events: impl Iterator<Item = WireEvent>) -> *mut MlaEventList {
    EVENT_LISTS.register(MlaEventList {
        events: events.map(own).collect(),
    })
}

/// Writes the number of events in the list.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_event_list_len(
    list: *const MlaEventList,
    out: *mut usize,
) -> MlaStatus {
    guard("mla_event_list_len", || {
        let out = Out::new(out, "out")?;
        let n = EVENT_LISTS.with(list, |l| Ok(l.events.len()))?;
        // SAFETY: per the contract.
        unsafe { out.set(n) };
        Ok(())
    })
}

/// Reads event `index` (`MLA_STATUS_INVALID_ARGUMENT` past the end). The
/// event's arrays and string live as long as the list.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_event_list_get(
    list: *const MlaEventList,
    index: usize,
    out: *mut MlaEvent,
) -> MlaStatus {
    guard("mla_event_list_get", || {
        let out = Out::new(out, "out")?;
        let event = EVENT_LISTS.with(list, |l| {
            let e = l.events.get(index).ok_or_else(|| {
                Failure::invalid(format!("event {index} of a list of {}", l.events.len()))
            })?;
            Ok(MlaEvent {
                kind: e.kind,
                block_hashes: e.hashes.as_ptr(),
                num_block_hashes: e.hashes.len(),
                has_parent: e.parent.is_some(),
                parent_block_hash: e.parent.unwrap_or(0),
                token_ids: e.tokens.as_ptr(),
                num_token_ids: e.tokens.len(),
                block_size: e.block_size,
                adapter: e.adapter.as_ref().map_or(std::ptr::null(), |a| a.as_ptr()),
                medium: e.medium.as_ptr(),
            })
        })?;
        // SAFETY: per the contract.
        unsafe { out.set(event) };
        Ok(())
    })
}

/// Destroys an event list and the data its events point to.
///
/// # Safety
/// Neither `list` nor pointers read from its events may be used afterwards.
///
/// Thread safety: must not race with other calls on the same list.
#[no_mangle]
pub unsafe extern "C" fn mla_event_list_destroy(list: *mut MlaEventList) -> MlaStatus {
    guard("mla_event_list_destroy", || EVENT_LISTS.destroy(list))
}
