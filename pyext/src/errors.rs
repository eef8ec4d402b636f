//! The one mapping from the crate's [`Error`] to Python exceptions.
//!
//! | Rust                                    | Python                         |
//! |-----------------------------------------|--------------------------------|
//! | `OutOfBlocks`                           | `mla_cache.OutOfBlocks` (`MemoryError`) |
//! | `UnknownRequest`                        | `KeyError`                     |
//! | `PinBudgetExceeded`                     | `mla_cache.PinBudgetExceeded` (`RuntimeError`) |
//! | `BlocksInUse`                           | `RuntimeError`                 |
//! | `Storage`                               | `mla_cache.StorageError` (`RuntimeError`) |
//! | `OutOfMemory`                           | `MemoryError`                  |
//! | every other variant (bad input)         | `ValueError`                   |

use pyo3::create_exception;
use pyo3::exceptions::{PyKeyError, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

use mla_cache::{Error, RequestId};

create_exception!(
    mla_cache,
    OutOfBlocks,
    PyMemoryError,
    "Not enough free blocks right now; nothing was allocated. Free or finish\nrequests and retry."
);
create_exception!(
    mla_cache,
    PinBudgetExceeded,
    PyRuntimeError,
    "Pinning would exceed the pinned-block budget (`CacheConfig.pin_budget`)."
);
create_exception!(
    mla_cache,
    StorageError,
    PyRuntimeError,
    "A storage backend failed or is unavailable (no GPU, no driver, ...)."
);

/// Converts `e`, naming request ids as the caller knows them (`name`).
pub(crate) fn to_py_named(e: Error, name: &dyn Fn(RequestId) -> String) -> PyErr {
    match e {
        Error::OutOfBlocks { .. } => OutOfBlocks::new_err(e.to_string()),
        Error::UnknownRequest(id) => PyKeyError::new_err(format!("unknown request {}", name(id))),
        Error::DuplicateRequest(id) => {
            PyValueError::new_err(format!("request {} is already admitted", name(id)))
        }
        Error::PinBudgetExceeded { .. } => PinBudgetExceeded::new_err(e.to_string()),
        Error::BlocksInUse(_) => PyRuntimeError::new_err(e.to_string()),
        Error::Storage(_) => StorageError::new_err(e.to_string()),
        Error::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
        Error::InvalidConfig(_)
        | Error::RequestTooLarge { .. }
        | Error::EmptyInput(_)
        | Error::InvalidArgument(_)
        | Error::InvalidBlock(_)
        | Error::BatchBuffersTooSmall { .. }
        | Error::NotPinned => PyValueError::new_err(e.to_string()),
    }
}

/// Converts an error that names no request.
pub(crate) fn to_py(e: Error) -> PyErr {
    to_py_named(e, &|id| id.to_string())
}
