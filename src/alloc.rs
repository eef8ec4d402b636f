//! Fallible allocation of the arrays whose size the caller chooses (per
//! block, per token): a failed allocation is [`Error::OutOfMemory`], not an
//! abort.

use crate::error::{Error, Result};

/// A vector of `len` copies of `value`, or [`Error::OutOfMemory`] naming `what`.
pub(crate) fn filled<T: Clone>(len: usize, value: T, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        what,
        bytes: len.saturating_mul(size_of::<T>()),
    })?;
    v.resize(len, value);
    Ok(v)
}

/// `len` zero bytes from the allocator's zeroed memory (the OS backs the
/// pages only when written), or [`Error::OutOfMemory`] naming `what`.
pub(crate) fn zeroed_bytes(len: usize, what: &'static str) -> Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let out_of_memory = || Error::OutOfMemory { what, bytes: len };
    let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| out_of_memory())?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(out_of_memory());
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `len` bytes, all initialized (zero).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_size_is_an_error_not_an_abort() {
        let e = filled(usize::MAX / 2, 0u64, "the test array").unwrap_err();
        assert!(matches!(
            e,
            Error::OutOfMemory {
                what: "the test array",
                ..
            }
        ));
        assert_eq!(filled(3, 7u8, "three").unwrap(), vec![7, 7, 7]);
        assert!(zeroed_bytes(isize::MAX as usize, "the test bytes").is_err());
        assert_eq!(zeroed_bytes(4, "four").unwrap(), vec![0; 4]);
    }
}
