//! Status codes, the thread-local last error, version information.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use super::{Failure, FfiResult};
use mla_cache::Error;

/// Major version of the library this header belongs to.
pub const MLA_CACHE_VERSION_MAJOR: u32 = 0;
/// Minor version of the library this header belongs to.
pub const MLA_CACHE_VERSION_MINOR: u32 = 2;
/// Patch version of the library this header belongs to.
pub const MLA_CACHE_VERSION_PATCH: u32 = 0;

/// Outcome of a call. Every value but `MLA_STATUS_OK` comes with a message
/// from `mla_last_error()`, and means the call changed nothing.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumCount, strum::VariantArray,
)]
#[strum(
    serialize_all = "SCREAMING_SNAKE_CASE",
    prefix = "MLA_STATUS_",
    suffix = "\0"
)]
#[repr(i32)]
pub enum MlaStatus {
    /// Success.
    Ok = 0,
    /// A required pointer argument is null.
    NullPointer = 1,
    /// A handle is not live: destroyed, never created, or of another type.
    InvalidHandle = 2,
    /// An argument is out of range or inconsistent (also: misaligned pointers).
    InvalidArgument = 3,
    /// A string argument is not valid UTF-8.
    InvalidUtf8 = 4,
    /// The configuration cannot describe a cache (also: unknown preset or dtype).
    InvalidConfig = 5,
    /// An output buffer is too small; the needed length was written to its
    /// length output.
    BufferTooSmall = 6,
    /// Not enough free blocks now; may succeed after requests are freed.
    OutOfBlocks = 7,
    /// The request needs more blocks than the whole cache has.
    RequestTooLarge = 8,
    /// No request with this id is admitted.
    UnknownRequest = 9,
    /// A request with this id is already admitted.
    DuplicateRequest = 10,
    /// A call that needs tokens got none.
    EmptyInput = 11,
    /// A block id outside the cache, or a block in the wrong state.
    InvalidBlock = 12,
    /// Pinning would exceed the pinned-block budget.
    PinBudgetExceeded = 13,
    /// Unpin of a prefix that is not pinned.
    NotPinned = 14,
    /// The operation needs an idle cache, and blocks are in use.
    BlocksInUse = 15,
    /// A storage backend failed or is unavailable (no GPU, no driver...).
    Storage = 16,
    /// The feature is not compiled into this build of the library.
    Unsupported = 17,
    /// A bookkeeping invariant does not hold (a bug in mla_cache).
    Internal = 18,
    /// mla_cache panicked; the message says where. The handle may be unusable.
    Panic = 19,
    /// Memory for a structure sized by the arguments (a manager's blocks, a
    /// store's or tier's buffers) could not be allocated; nothing was created.
    OutOfMemory = 20,
}

impl MlaStatus {
    /// Every status, in declaration order: strum's `VARIANTS` as an array.
    const ALL: [MlaStatus; <MlaStatus as strum::EnumCount>::COUNT] =
        *<Self as strum::VariantArray>::VARIANTS
            .first_chunk()
            .expect("strum lists COUNT variants");

    /// The constant's name as spelled in the header, NUL-terminated.
    fn name(self) -> &'static str {
        self.into()
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::InvalidConfig(_) => MlaStatus::InvalidConfig,
            Error::OutOfBlocks { .. } => MlaStatus::OutOfBlocks,
            Error::RequestTooLarge { .. } => MlaStatus::RequestTooLarge,
            Error::UnknownRequest(_) => MlaStatus::UnknownRequest,
            Error::DuplicateRequest(_) => MlaStatus::DuplicateRequest,
            Error::EmptyInput(_) => MlaStatus::EmptyInput,
            Error::InvalidArgument(_) => MlaStatus::InvalidArgument,
            Error::InvalidBlock(_) => MlaStatus::InvalidBlock,
            Error::PinBudgetExceeded { .. } => MlaStatus::PinBudgetExceeded,
            Error::NotPinned => MlaStatus::NotPinned,
            Error::BlocksInUse(_) => MlaStatus::BlocksInUse,
            Error::Storage(_) => MlaStatus::Storage,
            Error::BatchBuffersTooSmall { .. } => MlaStatus::BufferTooSmall,
            Error::OutOfMemory { .. } => MlaStatus::OutOfMemory,
        };
        Failure::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: String) {
    let message = CString::new(message.replace('\0', "\\0")).expect("NULs were replaced");
    // `try_with`: a call from a thread-local destructor finds no slot; the
    // status still says what happened.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = message);
}

thread_local! {
    /// Set while the thread runs a C call's body: its panics are silent.
    static IN_C_CALL: Cell<bool> = const { Cell::new(false) };
    /// Where the last silent panic happened (`file:line`).
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs, once, a panic hook that keeps panics inside C calls off stderr
/// (no message, no backtrace: the status and `mla_last_error` report them)
/// and hands every other panic to the hook that was there before.
fn install_silent_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_C_CALL.try_with(Cell::get).unwrap_or(false) {
                let location = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                let _ = PANIC_LOCATION.try_with(|slot| *slot.borrow_mut() = location);
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `body` as a C call: its panics are silent and caught.
fn catch_silently<R>(body: impl FnOnce() -> R) -> std::thread::Result<R> {
    install_silent_panic_hook();
    let outer = IN_C_CALL.with(|flag| flag.replace(true));
    let result = catch_unwind(AssertUnwindSafe(body));
    IN_C_CALL.with(|flag| flag.set(outer));
    result
}

/// Runs an FFI body: maps its failure or panic to a status and records the
/// message, prefixed with the function's name, as the thread's last error.
/// A panic prints nothing; its message and location go to the last error.
pub(crate) fn guard(function: &str, body: impl FnOnce() -> FfiResult<()>) -> MlaStatus {
    let failure = match catch_silently(body) {
        Ok(Ok(())) => return MlaStatus::Ok,
        Ok(Err(failure)) => failure,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("unknown payload");
            let at = PANIC_LOCATION
                .with(|slot| slot.borrow_mut().take())
                .map_or_else(String::new, |l| format!(" at {l}"));
            Failure::new(MlaStatus::Panic, format!("panic: {what}{at}"))
        }
    };
    set_last_error(format!("{function}: {}", failure.message));
    failure.status
}

/// Message of the last failing call on the calling thread ("" if none).
///
/// The string belongs to the library and stays valid until the next failing
/// call on this thread; copy it to keep it. Successful calls leave it as is.
///
/// Thread safety: thread-safe; each thread has its own message.
#[no_mangle]
pub extern "C" fn mla_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The constant name of a status (`"MLA_STATUS_OUT_OF_BLOCKS"`), or
/// `"MLA_STATUS_UNKNOWN"` for a value that is not an `MlaStatus`.
///
/// The string is static. Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_status_name(status: i32) -> *const c_char {
    let name = MlaStatus::ALL
        .iter()
        .find(|s| **s as i32 == status)
        .map_or("MLA_STATUS_UNKNOWN\0", |s| s.name());
    name.as_ptr().cast()
}

/// The library's version, `"MAJOR.MINOR.PATCH"`; compare with the header's
/// `MLA_CACHE_VERSION_*` macros to detect a mismatched library at run time.
///
/// The string is static. Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    fn last_error() -> String {
        // SAFETY: the library's own NUL-terminated string.
        unsafe { CStr::from_ptr(mla_last_error()) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn version_macros_match_the_package_version() {
        let v = format!(
            "{MLA_CACHE_VERSION_MAJOR}.{MLA_CACHE_VERSION_MINOR}.{MLA_CACHE_VERSION_PATCH}"
        );
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        // SAFETY: static NUL-terminated string.
        assert_eq!(
            unsafe { CStr::from_ptr(mla_version()) }.to_str().unwrap(),
            v
        );
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let status = guard("mla_test", || panic!("boom {}", 7));
        assert_eq!(status, MlaStatus::Panic);
        let message = last_error();
        assert!(
            message.starts_with("mla_test: panic: boom 7 at ffi/src/status.rs:"),
            "{message}"
        );
        let status = guard("mla_test", || Err(Error::NotPinned.into()));
        assert_eq!(status, MlaStatus::NotPinned);
        assert_eq!(last_error(), "mla_test: prefix is not pinned");
        assert_eq!(guard("mla_test", || Ok(())), MlaStatus::Ok);
        assert_eq!(last_error(), "mla_test: prefix is not pinned");
    }

    /// In a child process (this test run again): a panic inside a C call
    /// prints nothing, even with `RUST_BACKTRACE`; one outside still does.
    #[test]
    fn panics_in_c_calls_print_nothing() {
        if std::env::var_os("MLA_TEST_PANIC_CHILD").is_some() {
            assert_eq!(
                guard("mla_test", || panic!("quiet panic")),
                MlaStatus::Panic
            );
            assert!(last_error().contains("quiet panic"));
            assert!(std::panic::catch_unwind(|| panic!("loud panic")).is_err());
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "status::tests::panics_in_c_calls_print_nothing"])
            .args(["--nocapture", "--test-threads=1"])
            .env("MLA_TEST_PANIC_CHILD", "1")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("quiet panic"), "{stderr}");
        assert!(stderr.contains("loud panic"), "{stderr}");
    }

    #[test]
    fn status_names_cover_every_value() {
        for (i, s) in MlaStatus::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
            // SAFETY: static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(mla_status_name(i as i32)) };
            // Spelled as the header (cbindgen) defines the constant.
            let header = include_str!("../../include/mla_cache.h");
            let definition = format!("{} = {i},", name.to_str().unwrap());
            assert!(
                header.contains(&definition),
                "{definition} not in the header"
            );
        }
        // SAFETY: static NUL-terminated string.
        let unknown = unsafe { CStr::from_ptr(mla_status_name(-1)) };
        assert_eq!(unknown.to_str().unwrap(), "MLA_STATUS_UNKNOWN");
    }
}
