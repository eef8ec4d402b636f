//! The caller's block digests (vLLM's `request.block_hashes`: `bytes`) as
//! the manager's block hashes.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::errors;
use mla_cache::BlockHash;

/// The block hashes of `obj`, a list or other iterable of `bytes` digests
/// ([`mla_cache::BlockManager::engine_block_hash`] of each): `TypeError` for
/// an item that is not `bytes`, `ValueError` for a digest the manager refuses.
pub(super) fn block_hashes(
    manager: &mla_cache::BlockManager,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Vec<BlockHash>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return list
            .iter()
            .enumerate()
            .map(|(i, item)| one(manager, i, &item))
            .collect();
    }
    obj.try_iter()?
        .enumerate()
        .map(|(i, item)| one(manager, i, &item?))
        .collect()
}

/// The longest cached prefix named by the first `limit` digests of `obj`,
/// a list read only up to the first miss (a lookup stops there, as vLLM's
/// does): a miss early in a long list costs no more than in a short one.
pub(super) fn match_leading(
    manager: &mla_cache::BlockManager,
    obj: &Bound<'_, PyAny>,
    limit: usize,
) -> PyResult<mla_cache::PrefixMatch> {
    let Ok(list) = obj.cast::<PyList>() else {
        let hashes = block_hashes(manager, obj)?;
        let hashes = hashes.into_iter().take(limit);
        return manager.match_hashes(hashes).map_err(errors::to_py);
    };
    let mut bad = None;
    let read =
        list.iter()
            .take(limit)
            .enumerate()
            .map_while(|(i, item)| match one(manager, i, &item) {
                Ok(h) => Some(h),
                Err(e) => {
                    bad = Some(e);
                    None
                }
            });
    let found = manager.match_hashes(read).map_err(errors::to_py)?;
    match bad {
        Some(e) => Err(e),
        None => Ok(found),
    }
}

/// Digest number `i`, `item`, as a block hash.
fn one(
    manager: &mla_cache::BlockManager,
    i: usize,
    item: &Bound<'_, PyAny>,
) -> PyResult<BlockHash> {
    let bytes = item.cast::<PyBytes>().map_err(|_| {
        let name = item.get_type().name();
        PyTypeError::new_err(format!(
            "block hash {i} must be bytes, got {}",
            name.map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    manager
        .engine_block_hash(bytes.as_bytes())
        .map_err(errors::to_py)
}
