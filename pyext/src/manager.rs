//! `BlockManager`: the Rust [`mla_cache::BlockManager`] with Python request
//! ids, token ids from lists or numpy arrays, and numpy results.

use numpy::{PyArray1, PyReadwriteArray1, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::config::CacheConfig;
use super::digests;
use super::errors;
use super::events;
use super::extra_keys;
use super::int_arrays::{self, tokens, PromptTokens};
use super::ints;
use super::outcomes::{Admission, AppendOutcome, PrefixMatch};
use super::prefix_calls::keyed;
use super::request_ids::{Key, RequestIds};
use super::requests::RequestApi;
use super::stats;
use mla_cache::{AdmitOptions, Error, RequestId, TokenId};

/// A paged MLA cache's bookkeeping: block allocation, prefix sharing by
/// chained block hashes, copy-on-write for forked requests, pinning and LRU
/// eviction. It holds no KV data: it hands out block ids and slot numbers for
/// the engine's (or ``LatentStore``'s) buffers.
///
/// Thread-safe: any number of Python threads may call one manager; calls
/// that hash long prompts release the GIL. A failing call raises and changes
/// nothing.
///
/// Request ids are ``int`` (``0 <= id < 2**63``) or ``str``. Token ids are a
/// list, tuple, 1-D numpy array of any integer dtype or 1-D integer buffer
/// (``array.array``, ``memoryview(b).cast("I")``), with values in
/// ``0 .. 2**32``; arrays and buffers convert in bulk. ``extra_keys`` is an ``ExtraKeys``, a dict with keys
/// ``"adapter"``, ``"salt"``, ``"mm"``, or ``None``; ``salt=`` is a shortcut
/// for its salt.
///
/// Raises ``OutOfBlocks`` (a ``MemoryError``) when blocks run short now,
/// ``KeyError`` for an unknown request, ``ValueError`` for bad input
/// (including a request larger than the whole cache) and ``TypeError`` for
/// arguments of the wrong type.
#[pyclass(frozen, module = "mla_cache")]
pub struct BlockManager {
    inner: mla_cache::BlockManager,
    config: Py<CacheConfig>,
    ids: RequestIds,
}

impl BlockManager {
    /// The Rust manager (for the engine adapters' native bases).
    pub(super) fn core(&self) -> &mla_cache::BlockManager {
        &self.inner
    }

    /// The request API over this manager.
    fn api(&self) -> RequestApi<'_, mla_cache::BlockManager> {
        RequestApi::new(&self.inner, &self.ids)
    }

    /// The ids of a batch's requests (`KeyError` for an unknown `str` id).
    fn batch_ids(&self, request_ids: &[Bound<'_, PyAny>]) -> PyResult<Vec<RequestId>> {
        request_ids
            .iter()
            .map(|r| self.ids.get(&Key::extract(r)?))
            .collect()
    }
}

#[pymethods]
impl BlockManager {
    #[new]
    fn new(config: Bound<'_, CacheConfig>) -> PyResult<Self> {
        let inner = mla_cache::BlockManager::new(config.get().0.clone()).map_err(errors::to_py)?;
        Ok(Self {
            inner,
            config: config.unbind(),
            ids: RequestIds::default(),
        })
    }

    /// The configuration.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<CacheConfig> {
        self.config.clone_ref(py)
    }

    /// Admits ``request_id`` with its prompt ``tokens``, reusing the longest
    /// cached prefix (capped at ``len(tokens) - 1`` tokens unless the config
    /// says otherwise) and reserving ``decode_slots`` more token slots.
    ///
    /// All or nothing: the request holds exactly
    /// ``ceil((len(tokens) + decode_slots) / block_size)`` blocks, or the call
    /// raises ``OutOfBlocks`` (fits later) or ``ValueError`` (never fits, a
    /// token outside ``0..2**32``, or the id is already admitted) and changes
    /// nothing.
    ///
    /// ``tokens`` is a sequence of ints or a 1-D array; a contiguous numpy
    /// array of ``int32``, ``uint32`` or ``int64`` is read in place as it is
    /// hashed (without the GIL from 1,024 tokens): no other thread may write
    /// to it during the call.
    ///
    /// With ``chunked_prefill=True`` the engine reports progress with
    /// ``commit``, and uncomputed blocks are never served to other requests;
    /// otherwise the whole prompt counts as computed at once, and its blocks
    /// are shared before their KV is written: engines that admit from
    /// several threads (or while a step runs) must use ``chunked_prefill``.
    ///
    /// ``block_hashes`` (a list of ``bytes``, one per full block of
    /// ``tokens``: vLLM's ``request.block_hashes``) keys the request by the
    /// engine's digests instead of hashing its tokens. With
    /// ``chunked_prefill`` only the hit is indexed at once; later blocks are
    /// indexed by ``commit(..., block_hashes=...)``. Only under
    /// ``block_hash="sha256_cbor"`` (32-byte digests) or ``"xxhash_cbor"``
    /// (16 bytes), where the manager's own chain is vLLM's, so both name a
    /// prefix alike; ``ValueError`` otherwise and for a wrong digest length
    /// or count, ``TypeError`` for an item that is not ``bytes``.
    #[pyo3(signature = (request_id, tokens, *, decode_slots = 0, extra_keys = None, salt = None, chunked_prefill = false, block_hashes = None))]
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = PromptTokens::extract)] tokens: PromptTokens<'_>,
        #[pyo3(from_py_with = ints::size)] decode_slots: usize,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
        chunked_prefill: bool,
        block_hashes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Admission> {
        if let Some(digests) = block_hashes {
            let tokens = tokens.into_vec()?;
            let hashes = digests::block_hashes(&self.inner, digests)?;
            let key = Key::extract(request_id)?;
            let opts = AdmitOptions {
                decode_slots,
                keys: extra_keys::extract(extra_keys, salt)?,
                chunked_prefill,
            };
            let admitted = self
                .ids
                .create(&key, |id| {
                    self.inner.admit_hashed(id, &tokens, &hashes, &opts)
                })
                .map_err(|e| self.api().err(e))?;
            return Ok(Admission::new(py, admitted));
        }
        let admitted = self.api().admit(
            py,
            request_id,
            tokens,
            decode_slots,
            extra_keys,
            salt,
            chunked_prefill,
        )?;
        Ok(Admission::new(py, admitted))
    }

    /// The longest cached prefix of ``tokens`` (whole blocks), without
    /// admitting anything or taking references: the blocks may be evicted
    /// right after. Not capped at ``len - 1``.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn match_prefix(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<PrefixMatch> {
        let found = keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.match_prefix(&tokens, k)
        })?;
        Ok(PrefixMatch::new(py, found))
    }

    /// The longest cached prefix named by ``block_hashes`` (the engine's
    /// ``bytes`` digests, as for ``admit``), without admitting anything or
    /// taking references; no tokens are needed. Digests past the first miss
    /// are not read. Raises as ``admit`` does for digests it refuses.
    fn match_block_hashes(
        &self,
        py: Python<'_>,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<PrefixMatch> {
        let found = digests::match_leading(&self.inner, block_hashes, usize::MAX)?;
        Ok(PrefixMatch::new(py, found))
    }

    /// External (64-bit) hashes of the full blocks of ``tokens``: the values
    /// events carry for them.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn block_hashes(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<Vec<u64>> {
        keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.block_hashes(&tokens, k)
        })
    }

    /// Appends generated ``tokens`` (a sequence, an array or one int) to
    /// ``request_id``. Fills the reserved room first and takes a new block
    /// only when it is full; a partial tail shared with a fork is first
    /// copied to a fresh block, returned in ``copies`` for the engine (or
    /// ``LatentStore.copy_blocks``) to perform before writing.
    fn append(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
    ) -> PyResult<AppendOutcome> {
        self.api().append(py, request_id, tokens)
    }

    /// Reports that the first ``num_computed_tokens`` tokens of
    /// ``request_id`` have their KV written (chunked prefill); full blocks
    /// among them become shareable. Progress only moves forward.
    ///
    /// A request admitted with ``block_hashes`` gives here the digests of
    /// the blocks this call makes full, one each, past those indexed before
    /// (``ValueError`` for another count, or for digests given to a request
    /// the manager hashes itself); without them its new blocks stay
    /// unindexed.
    #[pyo3(signature = (request_id, num_computed_tokens, *, block_hashes = None))]
    fn commit(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] num_computed_tokens: usize,
        block_hashes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        match block_hashes {
            None => self.api().commit(py, request_id, num_computed_tokens),
            Some(digests) => {
                let hashes = digests::block_hashes(&self.inner, digests)?;
                self.api().on(request_id, |m, id| {
                    m.commit_hashed(id, num_computed_tokens, &hashes)
                })
            }
        }
    }

    /// Creates request ``child`` sharing every block of ``parent`` that holds
    /// tokens (parallel sampling, beam search). Takes no new block: the first
    /// append to a shared partial tail copies it.
    fn fork(&self, parent: &Bound<'_, PyAny>, child: &Bound<'_, PyAny>) -> PyResult<()> {
        self.api().fork(parent, child)
    }

    /// Frees ``request_id``: its blocks are released tail first, so the
    /// deepest blocks of a prefix chain are evicted before its root. Its
    /// full blocks stay cached for later hits until evicted.
    fn free(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.api().free(py, request_id)
    }

    /// The block table of ``request_id`` (numpy int32), reserved room included.
    fn block_table(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyArray1<i32>>> {
        self.api().block_table(py, request_id)
    }

    /// Slot numbers (``block_id * block_size + offset``, numpy int64) of
    /// token positions ``start .. end`` of ``request_id``; positions may
    /// reach into its reserved room.
    fn slot_mapping(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] start: usize,
        #[pyo3(from_py_with = ints::size)] end: usize,
    ) -> PyResult<Py<PyArray1<i64>>> {
        self.api().slot_mapping(py, request_id, start, end)
    }

    /// Tokens (prompt and appended) of ``request_id``.
    fn num_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.api().num_tokens(request_id)
    }

    /// Tokens of ``request_id`` whose KV is written: its length without
    /// ``chunked_prefill``, else what ``commit`` reported last.
    fn num_computed_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.api().on(request_id, |m, id| m.num_computed_tokens(id))
    }

    /// Tokens ``request_id`` can take before it needs a new block (the room
    /// left in its partial tail and reserved blocks).
    fn capacity(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.api().on(request_id, |m, id| m.capacity(id))
    }

    /// A dry run of ``admit``: what admitting ``tokens`` would take now, as
    /// a dict of ``num_cached_tokens``, ``new_blocks`` (to allocate),
    /// ``available_blocks`` and ``fits`` (whether ``admit`` would succeed),
    /// without admitting anything. Raises as ``admit`` does for input it
    /// refuses (empty, larger than the cache).
    #[pyo3(signature = (tokens, *, decode_slots = 0, extra_keys = None, salt = None, chunked_prefill = false))]
    fn would_admit<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        #[pyo3(from_py_with = ints::size)] decode_slots: usize,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
        chunked_prefill: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let opts = AdmitOptions {
            decode_slots,
            keys: extra_keys::extract(extra_keys, salt)?,
            chunked_prefill,
        };
        let check = self
            .inner
            .would_admit(&tokens, &opts)
            .map_err(errors::to_py)?;
        let out = PyDict::new(py);
        out.set_item("num_cached_tokens", check.num_cached_tokens)?;
        out.set_item("new_blocks", check.new_blocks)?;
        out.set_item("available_blocks", check.available_blocks)?;
        out.set_item("fits", check.fits())?;
        Ok(out)
    }

    /// Appends tokens to many requests under one lock (one decode step):
    /// ``num_tokens[i]`` tokens to ``request_ids[i]`` (``None``: one each),
    /// taken in order from ``tokens``. Returns one ``AppendOutcome`` per
    /// request, equal to ``append`` of each in turn, and the slot of every
    /// appended token (numpy int64, request after request). All or
    /// nothing: an unknown or repeated request, an empty append or too few
    /// blocks for the whole batch raises and changes nothing.
    #[pyo3(signature = (request_ids, tokens, *, num_tokens = None))]
    fn append_batch(
        &self,
        py: Python<'_>,
        request_ids: Vec<Bound<'_, PyAny>>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        num_tokens: Option<Vec<usize>>,
    ) -> PyResult<(Vec<AppendOutcome>, Py<PyArray1<i64>>)> {
        let ids = self.batch_ids(&request_ids)?;
        let counts = num_tokens.unwrap_or_else(|| vec![1; ids.len()]);
        if counts.len() != ids.len() || counts.iter().sum::<usize>() != tokens.len() {
            return Err(PyValueError::new_err(format!(
                "{} token counts summing to {} for {} requests and {} tokens",
                counts.len(),
                counts.iter().sum::<usize>(),
                ids.len(),
                tokens.len()
            )));
        }
        let mut batch = Vec::with_capacity(ids.len());
        let mut rest = &tokens[..];
        for (&id, &n) in ids.iter().zip(&counts) {
            let (these, after) = rest.split_at(n);
            batch.push((id, these));
            rest = after;
        }
        let out = self
            .inner
            .append_batch(&batch)
            .map_err(|e| self.api().err(e))?;
        let outcomes = out
            .requests
            .into_iter()
            .map(|o| AppendOutcome::new(py, o))
            .collect::<PyResult<_>>()?;
        Ok((outcomes, PyArray1::from_vec(py, out.slot_mapping).unbind()))
    }

    /// Fills ``block_tables`` (a writable, C-contiguous numpy int32 array of
    /// ``len(request_ids)`` rows) in place with the requests' block tables,
    /// each row padded with ``pad``, as FlashMLA and FlashInfer take them;
    /// with ``positions`` (one ``(start, end)`` per request) it fills
    /// ``slot_mapping`` (writable int64) with their slots in turn. Under one
    /// lock. Returns ``(max_blocks, num_slots)``: the longest table and the
    /// slots written. Raises ``ValueError``, writing nothing, when a row is
    /// narrower than a table or ``slot_mapping`` too short (the message
    /// gives both sizes needed), ``KeyError`` for an unknown request.
    #[pyo3(signature = (request_ids, block_tables, *, pad = -1, positions = None, slot_mapping = None))]
    fn fill_block_tables(
        &self,
        request_ids: Vec<Bound<'_, PyAny>>,
        mut block_tables: PyReadwriteArray2<'_, i32>,
        pad: i32,
        positions: Option<Vec<(usize, usize)>>,
        slot_mapping: Option<PyReadwriteArray1<'_, i64>>,
    ) -> PyResult<(usize, usize)> {
        let ids = self.batch_ids(&request_ids)?;
        let width = block_tables.as_array().ncols();
        // An F-contiguous array is a slice too, in the wrong order.
        let tables = match block_tables.is_c_contiguous() {
            true => block_tables.as_slice_mut().ok(),
            false => None,
        }
        .ok_or_else(|| PyValueError::new_err("block_tables must be a C-contiguous int32 array"))?;
        let ranges: Vec<_> = positions
            .unwrap_or_default()
            .into_iter()
            .map(|(start, end)| start..end)
            .collect();
        let mut slot_mapping = slot_mapping;
        let slots = match slot_mapping.as_mut() {
            Some(s) => s.as_slice_mut().map_err(|_| {
                PyValueError::new_err("slot_mapping must be a contiguous int64 array")
            })?,
            None => &mut [],
        };
        let sizes = self
            .inner
            .fill_block_tables(&ids, tables, width, pad, &ranges, slots)
            .map_err(|e| self.api().err(e))?;
        Ok((sizes.max_blocks, sizes.num_slots))
    }

    /// Frees every request of ``request_ids`` under one lock, as ``free`` of
    /// each in turn. All or nothing: an unknown or repeated request raises
    /// and frees none.
    fn free_batch(&self, request_ids: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let keys = request_ids
            .iter()
            .map(Key::extract)
            .collect::<PyResult<Vec<_>>>()?;
        self.ids
            .remove_all(&keys, |ids| self.inner.free_batch(ids))?
            .map_err(|e| self.api().err(e))
    }

    /// Grows ``request_id``'s block table so it has room for ``total_slots``
    /// token positions (its tokens included) without adding tokens:
    /// lookahead slots for speculative decoding (vLLM's
    /// ``num_lookahead_tokens``, MTP draft tokens), addressed with
    /// ``slot_mapping``. Never shrinks. When the room starts inside a partial
    /// tail shared with a fork, the tail is copied first (``copies``).
    /// Returns an ``AppendOutcome``: the blocks added and the copies. A later
    /// ``append`` fills the room before taking blocks; ``fork`` shares only
    /// the blocks holding tokens. All or nothing: raises ``OutOfBlocks``
    /// (fits later) or ``ValueError`` (never fits).
    fn reserve(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] total_slots: usize,
    ) -> PyResult<AppendOutcome> {
        let outcome = self
            .api()
            .on(request_id, |m, id| m.reserve(id, total_slots))?;
        AppendOutcome::new(py, outcome)
    }

    /// Drops ``block_ids`` (any iterable of ints, a set or a numpy array)
    /// from the prefix index, as vLLM's ``evict_blocks`` does when a KV
    /// connector reports blocks unreadable: no later lookup finds them. A
    /// free block joins the never-hashed free list; a block in use stays with
    /// its holders but is no longer shared. Blocks not in the index are
    /// skipped. Returns how many left the index. Raises ``ValueError``,
    /// changing nothing, for an id outside the cache or a pinned block
    /// (unpin its prefix first).
    fn evict_blocks(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let blocks = int_arrays::block_ids(block_ids)?;
        self.inner.evict_blocks(&blocks).map_err(errors::to_py)
    }

    /// Evicts up to ``num_blocks`` free cached blocks, chosen as allocation
    /// chooses them (the policy's victims), ahead of allocating: they leave
    /// the prefix index and join the never-hashed free list. Returns how
    /// many were evicted (fewer when fewer free blocks are cached).
    fn evict(&self, #[pyo3(from_py_with = ints::size)] num_blocks: usize) -> usize {
        self.inner.evict(num_blocks)
    }

    /// Pins the cached full blocks of the prefix ``tokens``: they are neither
    /// evicted nor reused until ``unpin``. Returns the tokens pinned (0 when
    /// nothing of the prefix is cached). Pins nest. Raises
    /// ``PinBudgetExceeded`` past ``CacheConfig.pin_budget`` blocks.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn pin(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<usize> {
        keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.pin(&tokens, k)
        })?
        .map_err(errors::to_py)
    }

    /// Releases one pin of the prefix ``tokens``: the pin whose run ends
    /// deepest in it, exactly the blocks that ``pin`` took; returns the
    /// tokens unpinned. ``ValueError`` when no pin lies on the prefix.
    #[pyo3(signature = (tokens, *, extra_keys = None, salt = None))]
    fn unpin(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = tokens)] tokens: Vec<TokenId>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        salt: Option<String>,
    ) -> PyResult<usize> {
        keyed(py, &tokens, extra_keys, salt, |k| {
            self.inner.unpin(&tokens, k)
        })?
        .map_err(errors::to_py)
    }

    /// A snapshot of gauges and counters as a dict: ``num_blocks``,
    /// ``free_blocks``, ``used_blocks``, ``cached_blocks``, ``pinned_blocks``,
    /// ``num_requests``, ``prefix_query_tokens``, ``prefix_hit_tokens``,
    /// ``prefix_query_requests``, ``prefix_hit_requests``, ``evictions``,
    /// ``cow_copies``, ``blocks_stored``, ``evictable_blocks`` (free cached
    /// blocks, what eviction may take) (ints), ``usage`` and ``hit_rate``
    /// (floats in ``[0, 1]``).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats::to_dict(py, &self.inner.stats())
    }

    /// Events recorded since the last call, oldest first: ``BlockStored``,
    /// ``BlockRemoved`` and ``AllBlocksCleared`` (empty unless the config
    /// sets ``enable_events``).
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        events::to_py_list(py, self.inner.take_events())
    }

    /// Drops every cached block from the prefix index. Returns ``False``
    /// (and changes nothing) while any block is held by a request or a pin.
    fn reset_prefix_cache(&self) -> PyResult<bool> {
        match self.inner.reset_prefix_cache() {
            Ok(()) => Ok(true),
            Err(Error::BlocksInUse(_)) => Ok(false),
            Err(e) => Err(errors::to_py(e)),
        }
    }

    /// How many requests hold ``block_id`` (0 when free): vLLM's
    /// ``KVCacheBlock.ref_cnt``. ``ValueError`` for an id outside the cache.
    fn ref_count(&self, #[pyo3(from_py_with = ints::size)] block_id: usize) -> PyResult<u32> {
        let block = u32::try_from(block_id).unwrap_or(u32::MAX);
        self.inner.ref_count(block).map_err(errors::to_py)
    }

    /// Blocks no request holds.
    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    /// Fraction of blocks in use, ``0.0 ..= 1.0``.
    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    /// Checks every bookkeeping invariant (for tests); raises
    /// ``AssertionError`` describing the first violation.
    fn _check_invariants(&self) -> PyResult<()> {
        self.inner
            .check_invariants()
            .map_err(PyAssertionError::new_err)
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        format!(
            "BlockManager(num_blocks={}, free_blocks={}, cached_blocks={}, num_requests={})",
            s.num_blocks, s.free_blocks, s.cached_blocks, s.num_requests
        )
    }
}
