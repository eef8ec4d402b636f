//! Python integers to Rust sizes, with `ValueError` for negative or huge
//! values and `TypeError` for non-integers (never `OverflowError`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;

/// An integer in `0..=u64::MAX`: Python ints and objects with `__index__`
/// (numpy integer scalars); `bool` is refused.
pub(crate) fn u64_of(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err("expected an integer, got bool"));
    }
    match obj.extract::<u64>() {
        Ok(v) => Ok(v),
        Err(_) if obj.hasattr("__index__")? => Err(PyValueError::new_err(format!(
            "expected a non-negative integer below 2**64, got {obj}"
        ))),
        Err(_) => Err(PyTypeError::new_err(format!(
            "expected an integer, got {}",
            obj.get_type().name()?
        ))),
    }
}

/// A non-negative size (`usize`).
pub(crate) fn size(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    usize::try_from(u64_of(obj)?)
        .map_err(|_| PyValueError::new_err(format!("{obj} does not fit in a size")))
}

/// An optional non-negative size: `None` stays `None`.
pub(crate) fn opt_size(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if obj.is_none() {
        Ok(None)
    } else {
        size(obj).map(Some)
    }
}

/// An optional `u64`: `None` stays `None`.
pub(crate) fn opt_u64(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    if obj.is_none() {
        Ok(None)
    } else {
        u64_of(obj).map(Some)
    }
}
