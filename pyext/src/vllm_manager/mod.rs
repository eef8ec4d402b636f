//! `VllmManagerBase`: the native base class of `mla_cache.vllm.KVCacheManager`.
//! The calls vLLM's scheduler makes (the whole `allocate_slots`: a waiting
//! or preempted request's admission with its prefix hit, a running
//! request's counter check, growth and commit; `get_computed_blocks`,
//! `get_blocks`, `free`, `cache_blocks`, the per-step hand-offs and stats)
//! run here without a Python frame of the adapter's; the Python subclass
//! keeps deferred frees, event conversion and LoRA names.

mod admission;
mod steps;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PySlice, PyTuple};
use std::sync::atomic::{AtomicU64, Ordering};

use super::digests;
use super::errors;
use super::extra_keys;
use super::int_arrays::tokens;
use super::manager::BlockManager;
use super::vllm_block::KvCacheBlock;
use mla_cache::vllm_rules::{self, AdmissionCheck, StepCheck, VllmRules};
use mla_cache::{AdmitOptions, BlockHash, BlockId, Error, RequestId, TokenId};

/// What the adapter keeps of an admitted request (its entry in
/// ``KVCacheManager._requests``).
#[pyclass(module = "mla_cache._native", name = "TrackedRequest")]
pub struct Tracked {
    /// The request's id in the block manager (fresh per admission, so a
    /// re-admitted request never meets its own deferred free).
    #[pyo3(get)]
    key: RequestId,
    /// Its block table (vLLM's block objects; the list ``get_blocks`` hands
    /// out inside ``view``).
    #[pyo3(get)]
    blocks: Py<PyList>,
    /// Tokens given to the block manager.
    #[pyo3(get, set)]
    appended: usize,
    /// Full blocks committed (shareable).
    #[pyo3(get)]
    cached_blocks: usize,
    /// Computed tokens from which one more block may be committed.
    #[pyo3(get)]
    next_cache: usize,
    /// The ``KVCacheBlocks`` over ``blocks`` (live), handed out by ``get_blocks``.
    #[pyo3(get)]
    view: Py<PyAny>,
}

/// A block object of the pool (``block_objs``), to update.
fn block<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyRefMut<'py, KvCacheBlock>> {
    Ok(obj.cast::<KvCacheBlock>()?.try_borrow_mut()?)
}

/// What `_bind` sets: the manager, vLLM's objects and the adapter's settings.
struct State {
    manager: Py<BlockManager>,
    block_objs: Py<PyList>,
    empty: Py<PyAny>,
    blocks_class: Py<PyAny>,
    stats_class: Py<PyAny>,
    requests: Py<PyDict>,
    /// vLLM's `RequestStatus.WAITING` and `PREEMPTED` (the watermark's).
    waiting_statuses: Vec<Py<PyAny>>,
    /// The next admission's request id in the block manager.
    next_key: AtomicU64,
    /// vLLM's decisions, from the counts read here.
    rules: VllmRules,
    /// Whether requests carry vLLM 0.34's `prefix_cache_hit_limit` (else
    /// vLLM 0.33's `skip_reading_prefix_cache`).
    hit_limits: bool,
    pass_tokens: bool,
    log_stats: bool,
    events: bool,
}

impl State {
    /// The Rust block manager.
    fn core(&self) -> &mla_cache::BlockManager {
        self.manager.get().core()
    }

    /// The tracked entry of `request_id`, if admitted.
    fn tracked<'py>(
        &self,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, Tracked>>> {
        let py = request_id.py();
        match self.requests.bind(py).get_item(request_id)? {
            Some(t) => Ok(Some(t.cast_into::<Tracked>()?)),
            None => Ok(None),
        }
    }

    /// Commits the full blocks among the first `num_tokens` tokens that vLLM
    /// has hashed, under vLLM's digests (handing the manager their tokens
    /// first when events carry them), and marks their block objects cached.
    fn cache(
        &self,
        request: &Bound<'_, PyAny>,
        tracked: &Bound<'_, Tracked>,
        num_tokens: usize,
    ) -> PyResult<()> {
        let (cached, appended, held) = {
            let t = tracked.try_borrow()?;
            (
                t.cached_blocks,
                t.appended,
                t.blocks.bind(request.py()).len(),
            )
        };
        match self.plan_commit(request, cached, appended, num_tokens, held)? {
            Some(commit) => self.apply_commit(tracked, commit),
            None => Ok(()),
        }
    }

    /// The block manager's id of a vLLM block object (its ``block_id``
    /// less one): ``ValueError`` for the null block or an id outside the
    /// cache.
    fn cache_block_id(&self, obj: &Bound<'_, PyAny>) -> PyResult<BlockId> {
        let id: usize = obj.getattr(intern!(obj.py(), "block_id"))?.extract()?;
        vllm_rules::cache_block_id(id, self.block_objs.bind(obj.py()).len())
            .ok_or_else(|| PyValueError::new_err(format!("block id {id} is not a cache block")))
    }

    /// vLLM's counts for a step of ``request`` (`VllmRules::span`), from
    /// its computed tokens.
    fn span(
        &self,
        request: &Bound<'_, PyAny>,
        adopted: usize,
        new: usize,
        lookahead: usize,
    ) -> PyResult<vllm_rules::Span> {
        let computed: usize = request
            .getattr(intern!(request.py(), "num_computed_tokens"))?
            .extract()?;
        Ok(self.rules.span(computed, adopted, new, lookahead))
    }
}

/// The hot path of ``mla_cache.vllm.KVCacheManager`` (its base class; use
/// that class). Called from the scheduler's thread, as vLLM's own manager is.
#[pyclass(subclass, module = "mla_cache._native")]
pub struct VllmManagerBase {
    state: Option<State>,
}

impl VllmManagerBase {
    fn state(&self) -> PyResult<&State> {
        self.state
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("VllmManagerBase._bind was not called"))
    }
}

#[pymethods]
impl VllmManagerBase {
    /// Takes (and ignores) the subclass's constructor arguments; the
    /// subclass's ``__init__`` calls ``_bind``.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self { state: None }
    }

    /// Binds the block manager and vLLM's objects: ``block_objs`` (one block
    /// object per vLLM block id, the null block 0 first), the shared empty
    /// ``KVCacheBlocks``, the ``KVCacheBlocks`` and prefix-cache stats
    /// classes; ``waiting_statuses`` (vLLM's ``RequestStatus.WAITING`` and
    /// ``PREEMPTED``: a request whose ``status`` is one of them keeps
    /// ``watermark_blocks`` free when admitted beside scheduled ones);
    /// ``request_hit_limits``: requests carry vLLM 0.34's
    /// ``prefix_cache_hit_limit`` (else vLLM 0.33's
    /// ``skip_reading_prefix_cache``). ``ValueError`` (nothing bound) for a
    /// block size under 2 or fewer than two blocks; ``OverflowError`` for a
    /// negative watermark.
    #[pyo3(signature = (manager, block_objs, empty, blocks_class, stats_class, *, block_size, max_model_len, num_reprefillable_tokens, enable_caching, use_eagle, log_stats, enable_kv_cache_events, watermark_blocks = 0, waiting_statuses = Vec::new(), request_hit_limits = false))]
    #[allow(clippy::too_many_arguments)]
    fn _bind(
        &mut self,
        py: Python<'_>,
        manager: Py<BlockManager>,
        block_objs: Py<PyList>,
        empty: Py<PyAny>,
        blocks_class: Py<PyAny>,
        stats_class: Py<PyAny>,
        block_size: usize,
        max_model_len: usize,
        num_reprefillable_tokens: usize,
        enable_caching: bool,
        use_eagle: bool,
        log_stats: bool,
        enable_kv_cache_events: bool,
        watermark_blocks: usize,
        waiting_statuses: Vec<Py<PyAny>>,
        request_hit_limits: bool,
    ) -> PyResult<()> {
        let rules = VllmRules::new(
            block_size,
            max_model_len,
            num_reprefillable_tokens,
            watermark_blocks,
            enable_caching,
            use_eagle,
        )
        .map_err(errors::to_py)?;
        if block_objs.bind(py).len() < 2 {
            return Err(PyValueError::new_err(
                "block_objs must hold the null block and at least one more",
            ));
        }
        if let Some(bad) = block_objs
            .bind(py)
            .iter()
            .find(|b| !b.is_instance_of::<KvCacheBlock>())
        {
            return Err(PyTypeError::new_err(format!(
                "block_objs must be KVCacheBlock objects, got {}",
                bad.get_type().name()?
            )));
        }
        self.state = Some(State {
            manager,
            block_objs,
            empty,
            blocks_class,
            stats_class,
            requests: PyDict::new(py).unbind(),
            waiting_statuses,
            next_key: AtomicU64::new(0),
            rules,
            hit_limits: request_hit_limits,
            pass_tokens: enable_caching && enable_kv_cache_events,
            log_stats,
            events: enable_kv_cache_events,
        });
        Ok(())
    }

    /// Admitted requests by vLLM request id.
    #[getter]
    fn _requests(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        Ok(self.state()?.requests.clone_ref(py))
    }

    /// The result with no blocks (shared, immutable).
    #[getter]
    fn empty_kv_cache_blocks(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.state()?.empty.clone_ref(py))
    }

    /// Fraction of blocks in use, ``0.0 ..= 1.0`` (null block left out).
    #[getter]
    fn usage(&self) -> PyResult<f64> {
        Ok(self.state()?.core().usage())
    }

    /// Allocates slots for ``num_new_tokens`` tokens to compute (and
    /// ``num_lookahead_tokens`` speculative ones) after the request's
    /// computed tokens, its new prefix hit (``num_new_computed_tokens``
    /// tokens in ``new_computed_blocks``) and ``num_external_computed_tokens``
    /// loaded by a KV connector, as vLLM's manager does. A request that is
    /// not running is admitted with exactly that hit; a running one's table
    /// grows to the step's slots when they need blocks (until a block fills,
    /// a counter check). Returns the new blocks (or the shared empty
    /// result), or ``None`` (nothing changed) when they do not fit in the
    /// free blocks less ``reserved_blocks`` (and, for a waiting or preempted
    /// request when ``has_scheduled_reqs``, the watermark; an admission
    /// counts the hit's free blocks as taken); with ``full_sequence_must_fit``
    /// the whole sequence must fit too (checked, not reserved). Unless
    /// ``delay_cache_blocks``, the blocks of the step's hashed tokens become
    /// shareable. ``skip_zeroing_group_ids`` changes nothing (no zeroing).
    ///
    /// ``ValueError`` (nothing changed) where vLLM raises (nothing to
    /// compute or adopt), for encoder tokens, a new hit for a running
    /// request or a hit that does not match its blocks; ``RuntimeError``
    /// (nothing changed) if the hit was evicted since ``get_computed_blocks``.
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = 0, new_computed_blocks = None, num_lookahead_tokens = 0, num_external_computed_tokens = 0, delay_cache_blocks = false, num_encoder_tokens = 0, full_sequence_must_fit = false, reserved_blocks = 0, has_scheduled_reqs = true, skip_zeroing_group_ids = None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: Option<Bound<'py, PyAny>>,
        num_lookahead_tokens: usize,
        num_external_computed_tokens: usize,
        delay_cache_blocks: bool,
        num_encoder_tokens: usize,
        full_sequence_must_fit: bool,
        reserved_blocks: usize,
        has_scheduled_reqs: bool,
        skip_zeroing_group_ids: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = skip_zeroing_group_ids;
        let py = slf.py();
        let this = slf.try_borrow()?;
        let st = this.state()?;
        let none = || py.None().into_bound(py);
        if num_new_tokens == 0 && num_new_computed_tokens == 0 && num_external_computed_tokens == 0
        {
            return Err(PyValueError::new_err(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt",
            ));
        }
        if num_encoder_tokens != 0 {
            return Err(PyValueError::new_err(
                "encoder-decoder models are not supported (MLA models are decoder-only)",
            ));
        }
        let request_id = request.getattr(intern!(py, "request_id"))?;
        if let Some(tracked) = st.tracked(&request_id)? {
            if num_new_computed_tokens != 0 {
                return Err(PyValueError::new_err(
                    "a running request takes no new prefix hits",
                ));
            }
            let out = st.step(
                request,
                &tracked,
                num_new_tokens,
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                reserved_blocks,
                has_scheduled_reqs,
                full_sequence_must_fit,
            )?;
            return Ok(out.unwrap_or_else(none));
        }
        let span = st.span(
            request,
            num_new_computed_tokens.saturating_add(num_external_computed_tokens),
            num_new_tokens,
            num_lookahead_tokens,
        )?;
        let watermark = st.watermark(request, has_scheduled_reqs)?;
        let commit_upto = if delay_cache_blocks {
            None
        } else {
            let total: usize = request.getattr(intern!(py, "num_tokens"))?.extract()?;
            Some(span.computed.saturating_add(num_new_tokens).min(total))
        };
        match st.admit(
            slf.as_any(),
            request,
            &request_id,
            num_new_computed_tokens,
            new_computed_blocks.as_ref(),
            span.slots,
            reserved_blocks,
            watermark,
            full_sequence_must_fit,
            commit_upto,
        )? {
            Some(new) => st.result(&new),
            None => Ok(none()),
        }
    }

    /// Makes the request's full blocks among its first
    /// ``num_computed_tokens`` tokens shareable (those vLLM has hashed),
    /// whether or not the tokens came through ``allocate_slots``.
    fn cache_blocks(&self, request: &Bound<'_, PyAny>, num_computed_tokens: usize) -> PyResult<()> {
        let st = self.state()?;
        if !st.rules.caching() {
            return Ok(());
        }
        let request_id = request.getattr(intern!(request.py(), "request_id"))?;
        match st.tracked(&request_id)? {
            Some(tracked) => st.cache(request, &tracked, num_computed_tokens),
            None => Ok(()),
        }
    }

    /// Frees the request's blocks at once, tail first (full blocks stay
    /// cached until evicted). A request holding no blocks is ignored.
    fn free(&self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let st = self.state()?;
        let request_id = request.getattr(intern!(request.py(), "request_id"))?;
        if let Some(tracked) = st.tracked(&request_id)? {
            let key = tracked.try_borrow()?.key;
            st.core().free(key).map_err(errors::to_py)?;
            st.requests.bind(request.py()).del_item(&request_id)?;
        }
        Ok(())
    }

    /// The request's blocks (the live table; empty for an unknown one).
    fn get_blocks(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let st = self.state()?;
        if let Some(tracked) = st.tracked(request_id)? {
            let t = tracked.try_borrow()?;
            if !t.blocks.bind(py).is_empty() {
                return Ok(t.view.clone_ref(py));
            }
        }
        Ok(st.empty.clone_ref(py))
    }

    /// The request's block ids, per group (one).
    fn get_block_ids<'py>(&self, request_id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let py = request_id.py();
        let ids = PyList::empty(py);
        if let Some(tracked) = self.state()?.tracked(request_id)? {
            for b in tracked.try_borrow()?.blocks.bind(py).iter() {
                ids.append(b.getattr(intern!(py, "block_id"))?)?;
            }
        }
        PyTuple::new(py, [ids])
    }

    /// Whether a prefix lookup runs for the request: caching is on and the
    /// request reads the cache (vLLM 0.34: its ``prefix_cache_hit_limit`` is
    /// not 0; vLLM 0.33: it does not set ``skip_reading_prefix_cache``).
    fn prefix_cache_lookup_enabled(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.state()?.lookup_enabled(request)
    }

    /// The cached full blocks of the request's longest cached prefix, at
    /// most ``max_cache_hit_length`` tokens and within the request's own
    /// limit (its last token is computed again for its logits; vLLM 0.34's
    /// ``prefix_cache_hit_limit``); with ``use_eagle`` the last hit block is
    /// dropped. ``(blocks, num_computed_tokens, 0)``; no references are
    /// taken. Looked up by vLLM's digests (``request.block_hashes``), read
    /// only up to the first miss. The third value is vLLM's shared-prefix
    /// boundary of sparse groups, always 0 here.
    #[pyo3(signature = (request, max_cache_hit_length = None))]
    fn get_computed_blocks<'py>(
        &self,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<usize>,
    ) -> PyResult<(Bound<'py, PyAny>, usize, usize)> {
        let py = request.py();
        let st = self.state()?;
        let found = st.lookup(request, max_cache_hit_length)?;
        if found.is_empty() {
            return Ok((st.empty.bind(py).clone(), 0, 0));
        }
        let objs = st.block_objs.bind(py);
        let hit = PyList::empty(py);
        for &b in &found {
            hit.append(objs.get_item(vllm_rules::vllm_block_id(b))?)?;
        }
        let blocks = st.blocks_class.bind(py).call1(((hit,),))?;
        Ok((blocks, found.len() * st.rules.block_size(), 0))
    }

    /// Tokens of the request's longest cached prefix (its last token left
    /// out), or 0 when it does not read the cache: vLLM 0.34's probe for
    /// cache-aware admission, which, like vLLM's, does not apply the
    /// request's positive hit limit. No references, events or stats.
    fn get_num_cached_tokens(&self, request: &Bound<'_, PyAny>) -> PyResult<usize> {
        let st = self.state()?;
        if !st.lookup_enabled(request)? {
            return Ok(0);
        }
        Ok(st.find(request, None, None)?.len() * st.rules.block_size())
    }

    /// Nothing to do at a step's start.
    fn new_step_starts(&self) {}

    /// Always empty: MLA's uniform-precision cache needs no zeroing.
    fn take_new_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        PyList::empty(py)
    }

    /// Always ``([], [])``: full-block hits need no copy-on-write.
    fn take_kv_cache_block_copies<'py>(
        &self,
        py: Python<'py>,
    ) -> (Bound<'py, PyList>, Bound<'py, PyList>) {
        (PyList::empty(py), PyList::empty(py))
    }

    /// Always empty: no Mamba boundary states.
    fn take_boundary_state_offloads<'py>(&self, py: Python<'py>) -> Bound<'py, PyDict> {
        PyDict::new(py)
    }

    /// Events since the last call, oldest first (empty unless
    /// ``enable_kv_cache_events``; then ``KVCacheManager._take_events``).
    fn take_events<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        if !slf.try_borrow()?.state()?.events {
            return Ok(PyList::empty(slf.py()).into_any());
        }
        slf.call_method0(intern!(slf.py(), "_take_events"))
    }

    /// Counts an admission that found ``num_hits`` tokens cached in
    /// ``prefix_cache_stats`` (its ``record``); nothing without
    /// ``log_stats``, while caching is off or when the request skips the
    /// lookup.
    fn record_prefix_cache_stats(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_hits: i64,
    ) -> PyResult<()> {
        let py = slf.py();
        {
            let this = slf.try_borrow()?;
            let st = this.state()?;
            if !st.log_stats || !st.lookup_enabled(request)? {
                return Ok(());
            }
        }
        let preempted: i64 = request.getattr(intern!(py, "num_preemptions"))?.extract()?;
        let args = PyDict::new(py);
        args.set_item(
            intern!(py, "num_tokens"),
            request.getattr(intern!(py, "num_tokens"))?,
        )?;
        args.set_item(intern!(py, "num_hits"), num_hits)?;
        args.set_item(intern!(py, "preempted"), preempted > 0)?;
        slf.getattr(intern!(py, "prefix_cache_stats"))?
            .call_method(intern!(py, "record"), (), Some(&args))?;
        Ok(())
    }

    /// The prefix-cache stats since the last call (``prefix_cache_stats``),
    /// starting a new period; ``None`` without ``log_stats``.
    fn make_prefix_cache_stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        let fresh = {
            let this = slf.try_borrow()?;
            let st = this.state()?;
            if !st.log_stats {
                return Ok(None);
            }
            st.stats_class.bind(py).call0()?
        };
        let name = intern!(py, "prefix_cache_stats");
        let stats = slf.getattr(name)?;
        slf.setattr(name, fresh)?;
        Ok(Some(stats))
    }
}
