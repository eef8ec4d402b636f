//! Calls that hash a prompt's prefix: their `extra_keys`/`salt` arguments
//! read once, and the GIL released while long prompts are hashed.

use pyo3::prelude::*;

use super::extra_keys;
use mla_cache::{ExtraKeys, TokenId};

/// Calls hashing at least this many tokens release the GIL.
pub(super) const DETACH_MIN_TOKENS: usize = 1024;

/// Runs `f`, without the GIL when it hashes `n` tokens or more.
pub(crate) fn hashing<T: Send>(py: Python<'_>, n: usize, f: impl FnOnce() -> T + Send) -> T {
    if n >= DETACH_MIN_TOKENS {
        py.detach(f)
    } else {
        f()
    }
}

/// Runs `f` with the keys of a prefix call on `tokens` (see [`hashing`]).
pub(crate) fn keyed<T: Send>(
    py: Python<'_>,
    tokens: &[TokenId],
    extra_keys: Option<&Bound<'_, PyAny>>,
    salt: Option<String>,
    f: impl FnOnce(&ExtraKeys) -> T + Send,
) -> PyResult<T> {
    let keys = extra_keys::extract(extra_keys, salt)?;
    Ok(hashing(py, tokens.len(), || f(&keys)))
}
