//! The caller's block digests (vLLM's `request.block_hashes`: `bytes`) as
//! the manager's block hashes.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::errors;
use crate::{manager, BlockHash};

/// The block hashes of `obj`, a list or other iterable of `bytes` digests
/// ([`manager::BlockManager::engine_block_hash`] of each): `TypeError` for
/// an item that is not `bytes`, `ValueError` for a digest the manager refuses.
pub(super) fn block_hashes(
    manager: &manager::BlockManager,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Vec<BlockHash>> {
    let one = |(i, item): (usize, Bound<'_, PyAny>)| {
        let bytes = item.cast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "block hash {i} must be bytes, got {}",
                item.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
        manager
            .engine_block_hash(bytes.as_bytes())
            .map_err(errors::to_py)
    };
    if let Ok(list) = obj.cast::<PyList>() {
        return list.iter().enumerate().map(one).collect();
    }
    obj.try_iter()?
        .enumerate()
        .map(|(i, item)| one((i, item?)))
        .collect()
}
