//! The C ABI (`include/mla_cache.h`, generated from this module by cbindgen).
//!
//! Conventions shared by every function:
//! - every function returns an [`MlaStatus`] (a few string getters excepted);
//!   on failure [`mla_last_error`] gives a message for the calling thread and
//!   nothing was changed;
//! - objects are opaque handles with explicit create/destroy; a handle is
//!   looked up in a registry of live handles before use, so a null, destroyed
//!   or foreign pointer is reported (`MLA_STATUS_NULL_POINTER`,
//!   `MLA_STATUS_INVALID_HANDLE`) instead of being dereferenced;
//! - output buffers belong to the caller and come with a capacity; when it
//!   is too small the call fails with `MLA_STATUS_BUFFER_TOO_SMALL`, writes
//!   the length it needs and changes nothing;
//! - every body runs under `catch_unwind`: a panic becomes `MLA_STATUS_PANIC`;
//! - handles are `Send + Sync` like the Rust types they wrap: any thread may
//!   call any function on them, except that destroying a handle while other
//!   threads still use it is an error of the caller (the calls in flight
//!   finish first; later ones get `MLA_STATUS_INVALID_HANDLE`, unless the
//!   address was reused by a new handle of the same type).

use std::collections::BTreeSet;
use std::ffi::{c_char, CStr};
use std::marker::PhantomData;
use std::sync::{PoisonError, RwLock};

pub mod batch;
pub mod config;
pub mod events;
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
pub use manager::*;
pub use publisher::*;
pub use requests::MLA_MAX_COPIES_PER_APPEND;
pub use status::*;
pub use store::*;
pub use tier::*;
pub use types::*;

// Spelled out for cbindgen; the calls into the crate only compile while
// they equal `crate::BlockId`, `crate::TokenId` and `crate::RequestId`.
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

/// Live handles of one type, keyed by address. A call holds the read lock
/// while it uses the handle, so `destroy` waits for calls in flight. (A
/// B-tree rather than a hash set: its nodes are referenced from their start,
/// so leak checkers see the registry as reachable.)
pub(crate) struct Registry<T> {
    live: RwLock<BTreeSet<usize>>,
    kind: &'static str,
    _type: PhantomData<fn() -> T>,
}

impl<T: Sync> Registry<T> {
    pub(crate) const fn new(kind: &'static str) -> Self {
        Self {
            live: RwLock::new(BTreeSet::new()),
            kind,
            _type: PhantomData,
        }
    }

    /// Moves `value` to the heap and registers it; returns the handle.
    pub(crate) fn register(&self, value: T) -> *mut T {
        let ptr = Box::into_raw(Box::new(value));
        self.live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ptr as usize);
        ptr
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
        let live = self.live.read().unwrap_or_else(PoisonError::into_inner);
        if !live.contains(&(ptr as usize)) {
            return Err(self.not_live(ptr));
        }
        // SAFETY: registered pointers come from `Box::into_raw` and stay valid
        // until `destroy` removes them, which needs the write lock we exclude.
        f(unsafe { &*ptr })
    }

    /// Unregisters and drops the handle `ptr`.
    pub(crate) fn destroy(&self, ptr: *mut T) -> FfiResult<()> {
        if ptr.is_null() {
            return Err(Failure::null(self.kind));
        }
        let removed = self
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(ptr as usize));
        if !removed {
            return Err(self.not_live(ptr));
        }
        // SAFETY: it was registered, hence a `Box::into_raw` pointer, and no
        // other call can reach it any more.
        drop(unsafe { Box::from_raw(ptr) });
        Ok(())
    }

    fn not_live(&self, ptr: *const T) -> Failure {
        Failure::new(
            MlaStatus::InvalidHandle,
            format!(
                "{ptr:p} is not a live {} (destroyed, or never created)",
                self.kind
            ),
        )
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
