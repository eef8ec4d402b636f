//! The request API shared by `BlockManager` and `TieredCache`: Python
//! request ids and token ids in, numpy arrays and outcome objects out, errors
//! naming the caller's request ids.

use numpy::PyArray1;
use pyo3::prelude::*;

use super::errors;
use super::extra_keys;
use super::int_arrays::{self, Elem, PromptTokens};
use super::outcomes::{block_array, AppendOutcome};
use super::prefix_calls::DETACH_MIN_TOKENS;
use super::request_ids::{self, Key, RequestIds};
use mla_cache::tier::TieredCache;
use mla_cache::{AdmitOptions, Error, RequestCache, RequestId, Result, TokenId};

/// What the Python API adds to a [`RequestCache`]: whether a call runs
/// without the GIL.
pub(super) trait Requests: RequestCache {
    /// Whether a call on `num_tokens` tokens runs without the GIL.
    fn detaches(&self, num_tokens: usize) -> bool;
}

impl Requests for mla_cache::BlockManager {
    /// Only long hashes are worth releasing the GIL for.
    fn detaches(&self, num_tokens: usize) -> bool {
        num_tokens >= DETACH_MIN_TOKENS
    }
}

impl Requests for TieredCache {
    /// Lower tiers copy blocks and wait on the network: always.
    fn detaches(&self, _num_tokens: usize) -> bool {
        true
    }
}

/// The request API over `inner`, with the handle's request ids.
pub(super) struct RequestApi<'a, R> {
    inner: &'a R,
    ids: &'a RequestIds,
}

impl<'a, R: Requests> RequestApi<'a, R> {
    /// The API of the handle holding `inner` and `ids`.
    pub(super) fn new(inner: &'a R, ids: &'a RequestIds) -> Self {
        Self { inner, ids }
    }

    /// `e` as a Python exception, naming `str` request ids as given.
    pub(super) fn err(&self, e: Error) -> PyErr {
        errors::to_py_named(e, &|id| self.ids.name(id))
    }

    /// Runs `f`, without the GIL when the object says so for `num_tokens`.
    fn run<T: Send>(&self, py: Python<'_>, num_tokens: usize, f: impl FnOnce() -> T + Send) -> T {
        if self.inner.detaches(num_tokens) {
            py.detach(f)
        } else {
            f()
        }
    }

    /// The id `request_id` stands for, if admitted.
    fn id(&self, request_id: &Bound<'_, PyAny>) -> PyResult<RequestId> {
        self.ids.get(&Key::extract(request_id)?)
    }

    /// `admit(request_id, tokens, decode_slots=, extra_keys=, salt=,
    /// chunked_prefill=)`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        tokens: PromptTokens<'_>,
        decode_slots: usize,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
        chunked_prefill: bool,
    ) -> PyResult<R::Admission> {
        let key = Key::extract(request_id)?;
        let opts = AdmitOptions {
            decode_slots,
            keys: extra_keys::extract(extra_keys, salt)?,
            chunked_prefill,
        };
        let admitted = match tokens {
            PromptTokens::Converted(tokens) => self.run(py, tokens.len(), || {
                self.ids
                    .create(&key, |id| self.inner.admit_owned(id, tokens, &opts))
            }),
            PromptTokens::I32(a) => self.admit_array(py, &key, a.as_slice()?, &opts),
            PromptTokens::U32(a) => self.admit_array(py, &key, a.as_slice()?, &opts),
            PromptTokens::I64(a) => self.admit_array(py, &key, a.as_slice()?, &opts),
        };
        admitted.map_err(|e| self.err(e))
    }

    /// An admission of the prompt `values`, converted as it is hashed.
    fn admit_array<T: Elem>(
        &self,
        py: Python<'_>,
        key: &Key,
        values: &[T],
        opts: &AdmitOptions,
    ) -> Result<R::Admission>
    where
        TokenId: TryFrom<T>,
    {
        self.run(py, values.len(), || {
            self.ids.create(key, |id| {
                self.inner.admit_filled(
                    id,
                    values.len(),
                    &mut |out, upto| int_arrays::fill_tokens(values, out, upto),
                    opts,
                )
            })
        })
    }

    /// `append(request_id, tokens)`.
    pub(super) fn append(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        tokens: Vec<TokenId>,
    ) -> PyResult<AppendOutcome> {
        let id = self.id(request_id)?;
        let outcome = self
            .run(py, tokens.len(), || self.inner.append(id, &tokens))
            .map_err(|e| self.err(e))?;
        AppendOutcome::new(py, outcome)
    }

    /// `commit(request_id, num_computed_tokens)`.
    pub(super) fn commit(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        num_computed_tokens: usize,
    ) -> PyResult<()> {
        let id = self.id(request_id)?;
        self.run(py, 0, || self.inner.commit(id, num_computed_tokens))
            .map_err(|e| self.err(e))
    }

    /// `fork(parent, child)`.
    pub(super) fn fork(&self, parent: &Bound<'_, PyAny>, child: &Bound<'_, PyAny>) -> PyResult<()> {
        let parent = self.id(parent)?;
        let child = Key::extract(child)?;
        self.ids
            .create(&child, |c| self.inner.fork(parent, c))
            .map_err(|e| self.err(e))
    }

    /// `free(request_id)`.
    pub(super) fn free(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = Key::extract(request_id)?;
        match self.run(py, 0, || self.ids.remove(&key, |id| self.inner.free(id))) {
            Some(done) => done.map_err(|e| self.err(e)),
            None => Err(request_ids::unknown(&key)),
        }
    }

    /// `block_table(request_id)` as numpy int32.
    pub(super) fn block_table(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyArray1<i32>>> {
        let id = self.id(request_id)?;
        let table = self
            .inner
            .manager()
            .block_table(id)
            .map_err(|e| self.err(e))?;
        Ok(block_array(py, table))
    }

    /// `slot_mapping(request_id, start, end)` as numpy int64.
    pub(super) fn slot_mapping(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        start: usize,
        end: usize,
    ) -> PyResult<Py<PyArray1<i64>>> {
        let id = self.id(request_id)?;
        let slots = self
            .inner
            .manager()
            .slot_mapping(id, start..end)
            .map_err(|e| self.err(e))?;
        Ok(PyArray1::from_vec(py, slots).unbind())
    }

    /// `num_tokens(request_id)`.
    pub(super) fn num_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = self.id(request_id)?;
        self.inner.manager().num_tokens(id).map_err(|e| self.err(e))
    }

    /// Runs `f` on `request_id`'s id, mapping its error (for the calls only
    /// one of the handles has).
    pub(super) fn on<T>(
        &self,
        request_id: &Bound<'_, PyAny>,
        f: impl FnOnce(&R, RequestId) -> Result<T>,
    ) -> PyResult<T> {
        let id = self.id(request_id)?;
        f(self.inner, id).map_err(|e| self.err(e))
    }
}
