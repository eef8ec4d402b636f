//! A waiting or preempted request's admission under vLLM's rules: its
//! prefix hit (bounded by vLLM's hit limit or skip flag), the watermark,
//! the block manager's admission and the result vLLM expects.

use super::*;

impl State {
    /// vLLM's watermark for the request (`VllmRules::watermark`): it is
    /// waiting or was preempted when its ``status`` is one of those members.
    pub(super) fn watermark(
        &self,
        request: &Bound<'_, PyAny>,
        has_scheduled_reqs: bool,
    ) -> PyResult<usize> {
        if !has_scheduled_reqs || self.rules.watermark_blocks() == 0 {
            return Ok(0);
        }
        let py = request.py();
        let waiting = match request.getattr_opt(intern!(py, "status"))? {
            Some(status) => self.waiting_statuses.iter().any(|s| status.is(s.bind(py))),
            None => false,
        };
        Ok(self.rules.watermark(has_scheduled_reqs, waiting))
    }

    /// Admits a request that is not running with exactly the hit the
    /// scheduler accepted (``hit`` tokens in ``hit_blocks``, a
    /// ``KVCacheBlocks`` or ``None``) and ``slots`` slots, then commits its
    /// hashed full blocks among the first ``commit_upto`` tokens (``None``:
    /// no commit); returns its new block objects, or ``None``, nothing
    /// touched, when it does not fit with ``reserved`` blocks and
    /// ``watermark`` kept free (`VllmRules::admission_fits`; with ``full``
    /// the whole sequence must fit too).
    /// Everything is read and checked first: ``ValueError`` / ``TypeError``
    /// (nothing changed) for a hit that does not match its blocks or digests
    /// the block manager refuses, ``RuntimeError`` (nothing changed) if the
    /// hit is no longer cached since ``get_computed_blocks``. Should another
    /// user of the same block manager change the hit between that check and
    /// the admission, the admission is taken back (``RuntimeError``; blocks
    /// it evicted stay evicted).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit<'py>(
        &self,
        owner: &Bound<'py, PyAny>,
        request: &Bound<'py, PyAny>,
        request_id: &Bound<'py, PyAny>,
        hit: usize,
        hit_blocks: Option<&Bound<'py, PyAny>>,
        slots: usize,
        reserved: usize,
        watermark: usize,
        full: bool,
        commit_upto: Option<usize>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let py = request.py();
        let bs = self.rules.block_size();
        let expected = match hit_blocks {
            Some(blocks) if !blocks.is_none() => {
                let group = blocks
                    .getattr(intern!(py, "blocks"))
                    .and_then(|groups| groups.get_item(0))
                    .map_err(|_| {
                        PyTypeError::new_err("new_computed_blocks must be a KVCacheBlocks")
                    })?;
                PyList::new(py, group.try_iter()?.collect::<PyResult<Vec<_>>>()?)?
            }
            _ => PyList::empty(py),
        };
        if hit % bs != 0 || expected.len().saturating_mul(bs) != hit {
            return Err(PyValueError::new_err(format!(
                "a hit of {hit} tokens does not match {} blocks",
                expected.len()
            )));
        }
        let hit_ids = expected
            .iter()
            .map(|obj| self.cache_block_id(&obj))
            .collect::<PyResult<Vec<_>>>()?;
        let core = self.core();
        // One token past the hit, so the manager reuses exactly the hit.
        let head = hit + 1;
        let n = hit_ids.len();
        let slots = slots.max(head);
        let need = self.rules.blocks_for(slots);
        if need < self.block_objs.bind(py).len() {
            // vLLM's check (a request larger than the cache goes on to the
            // block manager's error).
            let mut free_hit = 0;
            for &b in &hit_ids {
                free_hit += usize::from(core.ref_count(b).map_err(errors::to_py)? == 0);
            }
            let check = AdmissionCheck {
                table_blocks: need,
                hit_blocks: n,
                free_hit_blocks: free_hit,
                free_blocks: core.num_free_blocks(),
                reserved_blocks: reserved,
                full_sequence_tokens: if full {
                    Some(request.getattr(intern!(py, "num_tokens"))?.extract()?)
                } else {
                    None
                },
            };
            if !self.rules.admission_fits(check, watermark) {
                return Ok(None);
            }
        }
        let all = request.getattr(intern!(py, "all_token_ids"))?;
        let prompt = tokens(&all.get_item(PySlice::new(py, 0, head as isize, 1))?)?;
        let digests = request.getattr(intern!(py, "block_hashes"))?;
        let hashes =
            digests::block_hashes(core, &digests.get_item(PySlice::new(py, 0, n as isize, 1))?)?;
        let found = core
            .match_hashes(hashes.iter().copied())
            .map_err(errors::to_py)?;
        let still_cached = |ids: &[BlockId]| ids.get(..n) == Some(&hit_ids[..]);
        if !still_cached(&found.block_ids) {
            return Err(PyRuntimeError::new_err(format!(
                "request {request_id}: the prefix hit changed since get_computed_blocks"
            )));
        }
        let commit = match commit_upto {
            Some(upto) => self.plan_commit(request, n, head, upto, need)?,
            None => None,
        };
        let keys = match request.getattr_opt(intern!(py, "lora_request"))? {
            Some(lora) if !lora.is_none() => {
                let keys = owner.call_method1(intern!(py, "_lora_keys"), (request,))?;
                extra_keys::extract(Some(&keys), None)?
            }
            _ => Default::default(),
        };
        let opts = AdmitOptions {
            decode_slots: slots - head,
            keys,
            chunked_prefill: true,
        };
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let admission = match core.admit_hashed(key, &prompt, &hashes, &opts) {
            Ok(a) => a,
            Err(Error::OutOfBlocks { .. }) => return Ok(None),
            Err(e) => return Err(errors::to_py(e)),
        };
        let undo = |e: PyErr| {
            self.unadmit(request_id, key);
            e
        };
        if admission.num_cached_tokens != hit || !still_cached(&admission.block_ids) {
            return Err(undo(PyRuntimeError::new_err(format!(
                "request {request_id}: the prefix hit changed since get_computed_blocks"
            ))));
        }
        let tracked = self
            .track(request_id, key, expected, head, n)
            .map_err(undo)?;
        let new = self
            .take_new(&tracked, &admission.block_ids[n..])
            .map_err(undo)?;
        if let Some(commit) = commit {
            self.apply_commit(&tracked, commit).map_err(undo)?;
        }
        Ok(Some(new))
    }

    /// Takes back an admission that failed after the block manager took it:
    /// frees its blocks and forgets its entry.
    pub(super) fn unadmit(&self, request_id: &Bound<'_, PyAny>, key: RequestId) {
        // The adapter's own request, just admitted: freeing it cannot fail,
        // and its entry is absent when tracking failed.
        let _ = self.core().free(key);
        let _ = self.requests.bind(request_id.py()).del_item(request_id);
    }

    /// The result of an ``allocate_slots`` that took ``new`` blocks.
    pub(super) fn result<'py>(&self, new: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyAny>> {
        let py = new.py();
        if new.is_empty() {
            return Ok(self.empty.bind(py).clone());
        }
        self.blocks_class.bind(py).call1(((new,),))
    }

    /// The request's own bound on its prefix hit, in tokens: vLLM 0.34's
    /// ``prefix_cache_hit_limit`` (``None``: unbounded; 0: the request skips
    /// the cache); on vLLM 0.33, 0 when it sets ``skip_reading_prefix_cache``.
    pub(super) fn hit_limit(&self, request: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let py = request.py();
        if self.hit_limits {
            let limit = request.getattr(intern!(py, "prefix_cache_hit_limit"))?;
            return if limit.is_none() {
                Ok(None)
            } else {
                Ok(Some(limit.extract()?))
            };
        }
        match request.getattr_opt(intern!(py, "skip_reading_prefix_cache"))? {
            Some(skip) if skip.is_truthy()? => Ok(Some(0)),
            _ => Ok(None),
        }
    }

    /// Whether a prefix lookup runs for the request: caching is on and the
    /// request does not skip the cache.
    pub(super) fn lookup_enabled(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.rules.caching() && self.hit_limit(request)? != Some(0))
    }

    /// The leading cached blocks (block manager ids) of the request's
    /// longest cached prefix within its own limit and ``bound`` (EAGLE's
    /// last block dropped); empty when the request does not read the cache.
    pub(super) fn lookup(
        &self,
        request: &Bound<'_, PyAny>,
        bound: Option<usize>,
    ) -> PyResult<Vec<BlockId>> {
        if !self.rules.caching() {
            return Ok(Vec::new());
        }
        match self.hit_limit(request)? {
            Some(0) => Ok(Vec::new()),
            limit => self.find(request, limit, bound),
        }
    }

    /// The leading cached blocks of the request's longest cached prefix
    /// within ``limit`` and ``bound`` (`VllmRules::max_cache_hit`), EAGLE's
    /// last block dropped. Looked up by vLLM's digests, read only up to the
    /// first miss; no references are taken.
    pub(super) fn find(
        &self,
        request: &Bound<'_, PyAny>,
        limit: Option<usize>,
        bound: Option<usize>,
    ) -> PyResult<Vec<BlockId>> {
        let py = request.py();
        let num_tokens: usize = request.getattr(intern!(py, "num_tokens"))?.extract()?;
        let max_hit = self.rules.max_cache_hit(num_tokens, limit, bound);
        let n = self.rules.lookup_blocks(max_hit);
        let hashes = request.getattr(intern!(py, "block_hashes"))?;
        if n == 0 || hashes.len()? == 0 {
            return Ok(Vec::new());
        }
        let mut found = digests::match_leading(self.core(), &hashes, n)?.block_ids;
        let n = self.rules.hit_blocks(found.len().min(n));
        found.truncate(n);
        Ok(found)
    }
}
