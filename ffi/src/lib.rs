//! The C ABI (`include/mla_cache.h`, generated from this crate by cbindgen).
//!
//! Conventions shared by every function:
//! - every function returns an [`MlaStatus`] (a few string getters excepted);
//!   on failure [`mla_last_error`] gives a message for the calling thread and
//!   nothing was changed: every `*out` is left untouched (only the length
//!   output of `MLA_STATUS_BUFFER_TOO_SMALL` is written);
//! - objects are opaque handles with explicit create/destroy; a handle is
//!   not an address but names a slot of a registry of live handles and its
//!   generation ([`Registry`]), so a null, destroyed (even once a new
//!   object took its slot), foreign or wrongly typed handle is reported
//!   (`MLA_STATUS_NULL_POINTER`, `MLA_STATUS_INVALID_HANDLE`: "stale
//!   handle" for a destroyed one) instead of being dereferenced;
//! - output buffers belong to the caller and come with a capacity; when it
//!   is too small the call fails with `MLA_STATUS_BUFFER_TOO_SMALL`, writes
//!   the length it needs and changes nothing;
//! - every body runs under `catch_unwind`: a panic becomes `MLA_STATUS_PANIC`
//!   and prints nothing (its message and location go to the last error);
//! - handles are `Send + Sync` like the Rust types they wrap: any thread may
//!   call any function on them, except that destroying a handle while other
//!   threads still use it is an error of the caller (the calls in flight
//!   finish first; later ones get `MLA_STATUS_INVALID_HANDLE`).

#![warn(missing_docs)]

use std::collections::VecDeque;
use std::ffi::{c_char, CStr};
use std::sync::{PoisonError, RwLock};

pub mod batch;
pub mod config;
pub mod events;
pub mod keys;
pub mod manager;
pub mod publisher;
mod requests;
pub mod status;
pub mod store;
pub mod tier;
pub mod types;

pub use batch::*;
pub use config::*;
pub use events::*;
pub use keys::{MlaAdmitOptions, MlaExtraKeys, MlaMultiModalKey};
pub use manager::*;
pub use publisher::*;
pub use requests::MLA_MAX_COPIES_PER_APPEND;
pub use status::*;
pub use store::*;
pub use tier::*;
pub use types::*;

// Spelled out for cbindgen; the calls into the crate only compile while
// they equal `mla_cache::BlockId`, `mla_cache::TokenId` and `mla_cache::RequestId`.
/// Index of a physical block, `0 .. num_blocks`, the same in every layer.
pub type MlaBlockId = u32;
/// A token id.
pub type MlaTokenId = u32;
/// The engine's id for a request (sequence).
pub type MlaRequestId = u64;

/// The error half of every FFI body: a status and its message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: MlaStatus,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: MlaStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn null(what: &str) -> Self {
        Self::new(MlaStatus::NullPointer, format!("{what} is null"))
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(MlaStatus::InvalidArgument, message)
    }
}

pub(crate) type FfiResult<T> = Result<T, Failure>;

/// Live handles of one type. A handle is not an address but a number that
/// names a slot of this registry and the slot's generation, tagged with the
/// type:
///
/// ```text
///   bits 63..48: type tag (from the type's name; never 0, never an address)
///   bits 47..32: generation of the slot (bumped on every destroy)
///   bits 31..0:  slot index
/// ```
///
/// so a destroyed handle stays detectably stale even after its slot holds a
/// new object, and a handle of another type or a raw pointer is refused.
/// A call holds the read lock while it uses the handle, so `destroy` waits
/// for calls in flight.
pub(crate) struct Registry<T> {
    slab: RwLock<Slab<T>>,
    kind: &'static str,
    tag: u64,
}

struct Slab<T> {
    slots: Vec<Slot<T>>,
    /// Free slots, oldest first: a slot is reused as late as possible.
    free: VecDeque<u32>,
}

struct Slot<T> {
    generation: u16,
    value: Option<Box<T>>,
}

// Handles hold 64 bits (see `Registry`).
const _: () = assert!(usize::BITS == 64, "the C ABI needs 64-bit pointers");

const INDEX_BITS: u32 = 32;
const GENERATION_BITS: u32 = 16;
const TAG_SHIFT: u32 = INDEX_BITS + GENERATION_BITS;

/// A 16-bit tag for the type named `kind` (FNV-1a), with its top bit set so
/// that no handle is null or a user-space address.
const fn tag_of(kind: &str) -> u64 {
    let bytes = kind.as_bytes();
    let mut hash: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < bytes.len() {
        hash = (hash ^ bytes[i] as u32).wrapping_mul(0x0100_0193);
        i += 1;
    }
    ((hash ^ (hash >> 16)) as u64 & 0xffff) | 0x8000
}

/// Where a handle points: slot index and generation, if its tag is `tag`.
fn decode(handle: usize, tag: u64) -> Option<(usize, u16)> {
    let bits = handle as u64;
    (bits >> TAG_SHIFT == tag).then_some((
        (bits & ((1 << INDEX_BITS) - 1)) as usize,
        ((bits >> INDEX_BITS) & ((1 << GENERATION_BITS) - 1)) as u16,
    ))
}

impl<T: Sync> Registry<T> {
    pub(crate) const fn new(kind: &'static str) -> Self {
        Self {
            slab: RwLock::new(Slab {
                slots: Vec::new(),
                free: VecDeque::new(),
            }),
            kind,
            tag: tag_of(kind),
        }
    }

    /// Moves `value` to the heap and registers it; returns the handle.
    pub(crate) fn register(&self, value: T) -> *mut T {
        let value = Box::new(value);
        let mut slab = self.slab.write().unwrap_or_else(PoisonError::into_inner);
        let index = match slab.free.pop_front() {
            Some(i) => i,
            None => {
                let i = u32::try_from(slab.slots.len()).expect("fewer than 2^32 live handles");
                slab.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                i
            }
        };
        let slot = &mut slab.slots[index as usize];
        slot.value = Some(value);
        let bits =
            self.tag << TAG_SHIFT | u64::from(slot.generation) << INDEX_BITS | u64::from(index);
        std::ptr::without_provenance_mut(bits as usize)
    }

    /// Runs `f` on the live handle `ptr`.
    pub(crate) fn with<R>(
        &self,
        ptr: *const T,
        f: impl FnOnce(&T) -> FfiResult<R>,
    ) -> FfiResult<R> {
        if ptr.is_null() {
            return Err(Failure::null(self.kind));
        }
        let slab = self.slab.read().unwrap_or_else(PoisonError::into_inner);
        let value = self.live(&slab, ptr as usize)?;
        f(value)
    }

    /// Unregisters and drops the handle `ptr`.
    pub(crate) fn destroy(&self, ptr: *mut T) -> FfiResult<()> {
        if ptr.is_null() {
            return Err(Failure::null(self.kind));
        }
        let mut slab = self.slab.write().unwrap_or_else(PoisonError::into_inner);
        self.live(&slab, ptr as usize)?;
        let (index, _) = decode(ptr as usize, self.tag).expect("checked live");
        let slot = &mut slab.slots[index];
        let value = slot.value.take();
        slot.generation = slot.generation.wrapping_add(1);
        slab.free.push_back(index as u32);
        drop(slab);
        drop(value);
        Ok(())
    }

    fn live<'a>(&self, slab: &'a Slab<T>, handle: usize) -> FfiResult<&'a T> {
        let Some((index, generation)) = decode(handle, self.tag) else {
            return Err(Failure::new(
                MlaStatus::InvalidHandle,
                format!(
                    "{handle:#x} is not a live {} (never created, or of another type)",
                    self.kind
                ),
            ));
        };
        match slab.slots.get(index) {
            Some(Slot {
                generation: g,
                value: Some(value),
            }) if *g == generation => Ok(value),
            Some(_) => Err(Failure::new(
                MlaStatus::InvalidHandle,
                format!(
                    "stale handle {handle:#x}: not a live {} (destroyed)",
                    self.kind
                ),
            )),
            None => Err(Failure::new(
                MlaStatus::InvalidHandle,
                format!("{handle:#x} is not a live {} (never created)", self.kind),
            )),
        }
    }
}

/// An input array of `len` elements; null is accepted when `len` is 0.
///
/// # Safety
/// A non-null `ptr` must point to `len` readable, initialized elements.
pub(crate) unsafe fn input<'a, T>(ptr: *const T, len: usize, what: &str) -> FfiResult<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Failure::null(what));
    }
    if !ptr.is_aligned() {
        return Err(Failure::invalid(format!("{what} is misaligned")));
    }
    if len
        .checked_mul(size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(Failure::invalid(format!(
            "{what}: length {len} is too large"
        )));
    }
    // SAFETY: non-null, aligned, in bounds per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A required NUL-terminated UTF-8 string.
///
/// # Safety
/// A non-null `ptr` must point to a NUL-terminated string.
pub(crate) unsafe fn text<'a>(ptr: *const c_char, what: &str) -> FfiResult<&'a str> {
    // SAFETY: forwarded.
    unsafe { opt_text(ptr, what) }?.ok_or_else(|| Failure::null(what))
}

/// An optional NUL-terminated UTF-8 string (null means none).
///
/// # Safety
/// A non-null `ptr` must point to a NUL-terminated string.
pub(crate) unsafe fn opt_text<'a>(ptr: *const c_char, what: &str) -> FfiResult<Option<&'a str>> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: NUL-terminated per the caller's contract.
    let bytes = unsafe { CStr::from_ptr(ptr) };
    bytes.to_str().map(Some).map_err(|e| {
        Failure::new(
            MlaStatus::InvalidUtf8,
            format!("{what} is not valid UTF-8: {e}"),
        )
    })
}

/// A checked, writable pointer to one output value.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// Checks `ptr` (non-null, aligned) without writing to it yet.
    pub(crate) fn new(ptr: *mut T, what: &str) -> FfiResult<Self> {
        if ptr.is_null() {
            return Err(Failure::null(what));
        }
        if !ptr.is_aligned() {
            return Err(Failure::invalid(format!("{what} is misaligned")));
        }
        Ok(Self(ptr))
    }

    /// Writes the value.
    ///
    /// # Safety
    /// The pointer given to [`Out::new`] must be valid for a write of `T`.
    pub(crate) unsafe fn set(&self, value: T) {
        // SAFETY: checked non-null and aligned; valid per the caller.
        unsafe { self.0.write(value) }
    }
}

/// A caller-owned output array with its capacity, and where to report the
/// length written (or needed).
pub(crate) struct OutBuf<T> {
    ptr: *mut T,
    cap: usize,
    len: Out<usize>,
    what: &'static str,
}

impl<T: Copy> OutBuf<T> {
    /// Checks the pointers; null `ptr` is accepted when `cap` is 0.
    pub(crate) fn new(
        ptr: *mut T,
        cap: usize,
        len: *mut usize,
        what: &'static str,
    ) -> FfiResult<Self> {
        if cap > 0 && ptr.is_null() {
            return Err(Failure::null(what));
        }
        if !ptr.is_aligned() {
            return Err(Failure::invalid(format!("{what} is misaligned")));
        }
        let len = Out::new(len, "the length output")?;
        Ok(Self {
            ptr,
            cap,
            len,
            what,
        })
    }

    /// Fails with `MLA_STATUS_BUFFER_TOO_SMALL`, reporting `needed` as the
    /// length, when the capacity is below `needed`.
    ///
    /// # Safety
    /// The length pointer must be valid for a write.
    pub(crate) unsafe fn reserve(&self, needed: usize) -> FfiResult<()> {
        if needed <= self.cap {
            return Ok(());
        }
        // SAFETY: per the caller.
        unsafe { self.set_len(needed) };
        Err(Failure::new(
            MlaStatus::BufferTooSmall,
            format!(
                "{} holds {} elements, {needed} are needed",
                self.what, self.cap
            ),
        ))
    }

    /// Writes the length output.
    ///
    /// # Safety
    /// The length pointer must be valid for a write.
    pub(crate) unsafe fn set_len(&self, len: usize) {
        // SAFETY: per the caller.
        unsafe { self.len.set(len) }
    }

    /// Converts and copies `values` out (after checking the capacity) and
    /// sets the length.
    ///
    /// # Safety
    /// `ptr` must be valid for `cap` writes and the length pointer for one.
    pub(crate) unsafe fn fill<S: Copy + Into<T>>(&self, values: &[S]) -> FfiResult<()> {
        // SAFETY: per the caller; `reserve` checked that `values` fit.
        unsafe {
            self.reserve(values.len())?;
            for (i, &v) in values.iter().enumerate() {
                self.ptr.add(i).write(v.into());
            }
            self.set_len(values.len());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_handle_type_has_its_own_tag() {
        let kinds = [
            "MlaConfig",
            "MlaManager",
            "MlaStore",
            "MlaTieredCache",
            "MlaEventList",
            "MlaPublisher",
        ];
        let tags: BTreeSet<u64> = kinds.iter().map(|k| tag_of(k)).collect();
        assert_eq!(tags.len(), kinds.len());
    }

    #[test]
    fn a_reused_slot_does_not_revive_its_old_handles() {
        let registry = Registry::<u32>::new("Test");
        let first = registry.register(1);
        registry.destroy(first).unwrap();
        let second = registry.register(2);
        assert_ne!(first, second);
        let stale = registry.with(first, |v| Ok(*v)).unwrap_err();
        assert_eq!(stale.status, MlaStatus::InvalidHandle);
        assert!(
            stale.message.starts_with("stale handle"),
            "{}",
            stale.message
        );
        assert_eq!(registry.with(second, |v| Ok(*v)).unwrap(), 2);
        assert!(registry.destroy(first).is_err());
        let other = Registry::<u32>::new("Other");
        assert!(other.with(second.cast_const(), |v| Ok(*v)).is_err());
        registry.destroy(second).unwrap();
    }
}
