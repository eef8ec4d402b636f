//! Request ids from Python: `int` ids map to themselves, `str` ids are
//! interned to numbers in a disjoint range, so the two never collide.
//!
//! ```text
//!   int id  0 ..= 2^63 - 1   ->  the same u64
//!   str id                   ->  2^63 + n, n counting up, never reused
//! ```
//! A `str` id is interned while its request is admitted: admission (or fork)
//! interns it on success, `free` releases it. Both hold the interner's lock
//! across the manager call, so a concurrent admit and free of one name
//! cannot leave the interner and the manager disagreeing.

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};
use rustc_hash::FxHashMap;

use mla_cache::{RequestId, Result};

/// First number given to a `str` id; `int` ids must stay below it.
const STR_BASE: RequestId = 1 << 63;

/// A request id as the caller wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Key {
    /// An `int` id (below 2^63).
    Int(RequestId),
    /// A `str` id.
    Str(String),
}

impl Key {
    /// Reads an `int` or `str` request id.
    pub(crate) fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(Key::Str(s.to_str()?.to_owned()));
        }
        if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
            return match obj.extract::<u64>() {
                Ok(v) if v < STR_BASE => Ok(Key::Int(v)),
                _ => Err(PyValueError::new_err(format!(
                    "an int request id must be in 0..2**63, got {obj}"
                ))),
            };
        }
        Err(PyTypeError::new_err(format!(
            "a request id must be an int or a str, got {}",
            obj.get_type().name()?
        )))
    }
}

#[derive(Debug, Default)]
struct Names {
    ids: FxHashMap<String, RequestId>,
    names: FxHashMap<RequestId, String>,
    next: RequestId,
}

/// The interner of `str` request ids of one manager.
#[derive(Debug, Default)]
pub(crate) struct RequestIds(Mutex<Names>);

impl RequestIds {
    fn lock(&self) -> MutexGuard<'_, Names> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of an admitted request; `KeyError` for an unknown `str` id.
    pub(crate) fn get(&self, key: &Key) -> PyResult<RequestId> {
        match key {
            Key::Int(id) => Ok(*id),
            Key::Str(s) => self.lock().ids.get(s).copied().ok_or_else(|| unknown(key)),
        }
    }

    /// Runs `f` with the number for a request `key` being created; a new
    /// `str` id stays interned only if `f` succeeds.
    pub(crate) fn create<R>(&self, key: &Key, f: impl FnOnce(RequestId) -> Result<R>) -> Result<R> {
        match key {
            Key::Int(id) => f(*id),
            Key::Str(s) => {
                let mut names = self.lock();
                if let Some(&id) = names.ids.get(s) {
                    return f(id);
                }
                let id = STR_BASE + names.next;
                let out = f(id)?;
                names.next += 1;
                names.ids.insert(s.clone(), id);
                names.names.insert(id, s.clone());
                Ok(out)
            }
        }
    }

    /// Runs `f` with the number of request `key`, which `f` ends; a `str` id
    /// is released if `f` succeeds. `None` when a `str` id is unknown.
    pub(crate) fn remove<R>(
        &self,
        key: &Key,
        f: impl FnOnce(RequestId) -> Result<R>,
    ) -> Option<Result<R>> {
        match key {
            Key::Int(id) => Some(f(*id)),
            Key::Str(s) => {
                let mut names = self.lock();
                let id = *names.ids.get(s)?;
                let out = f(id);
                if out.is_ok() {
                    names.ids.remove(s);
                    names.names.remove(&id);
                }
                Some(out)
            }
        }
    }

    /// Runs `f` with the numbers of requests `keys`, which `f` ends
    /// together; their `str` ids are released if `f` succeeds. `KeyError`
    /// for an unknown `str` id, before `f` runs.
    pub(crate) fn remove_all<R>(
        &self,
        keys: &[Key],
        f: impl FnOnce(&[RequestId]) -> Result<R>,
    ) -> PyResult<Result<R>> {
        let mut names = self.lock();
        let ids = keys
            .iter()
            .map(|key| match key {
                Key::Int(id) => Ok(*id),
                Key::Str(s) => names.ids.get(s).copied().ok_or_else(|| unknown(key)),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let out = f(&ids);
        if out.is_ok() {
            for (key, id) in keys.iter().zip(&ids) {
                if let Key::Str(s) = key {
                    names.ids.remove(s);
                    names.names.remove(id);
                }
            }
        }
        Ok(out)
    }

    /// How the caller wrote request `id` (for error messages).
    pub(crate) fn name(&self, id: RequestId) -> String {
        if id < STR_BASE {
            return id.to_string();
        }
        match self.lock().names.get(&id) {
            Some(s) => quoted(s),
            None => id.to_string(),
        }
    }

    /// `str` ids interned now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().ids.len()
    }
}

/// The `KeyError` for a request id that is not admitted.
pub(crate) fn unknown(key: &Key) -> PyErr {
    match key {
        Key::Int(id) => PyKeyError::new_err(format!("unknown request {id}")),
        Key::Str(s) => PyKeyError::new_err(format!("unknown request {}", quoted(s))),
    }
}

/// A `str` id as Python would show it.
fn quoted(s: &str) -> String {
    format!("'{s}'")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mla_cache::Error;

    #[test]
    fn str_ids_are_interned_on_success_and_released_on_removal() {
        let ids = RequestIds::default();
        let a = Key::Str("a".into());
        let failed: Result<()> = ids.create(&a, |_| Err(Error::EmptyInput("x")));
        assert!(failed.is_err());
        assert_eq!(ids.len(), 0, "a failed creation interns nothing");
        let n = ids.create(&a, Ok).unwrap();
        assert!(n >= STR_BASE);
        assert_eq!(ids.create(&Key::Int(5), Ok).unwrap(), 5);
        assert_eq!(ids.name(n), "'a'");
        assert!(ids.remove(&a, Ok).unwrap().is_ok());
        assert_eq!(ids.len(), 0);
        assert!(ids.remove(&a, Ok).is_none());
        // A released name gets a fresh number next time.
        assert_ne!(ids.create(&a, Ok).unwrap(), n);
    }
}
