//! A running request's step: vLLM's counter check, growth, the commit of
//! its computed blocks, and the blocks handed to vLLM's per-step lists.

use super::*;

impl State {
    /// What `cache` would commit of a request with `cached` blocks committed
    /// and `appended` tokens handed over once it holds `held` blocks, read
    /// and checked (digests, tokens) without changing anything; `None` when
    /// no block more is full and hashed.
    pub(super) fn plan_commit<'py>(
        &self,
        request: &Bound<'py, PyAny>,
        cached: usize,
        appended: usize,
        num_tokens: usize,
        held: usize,
    ) -> PyResult<Option<Commit<'py>>> {
        if !self.rules.caching() {
            return Ok(None);
        }
        let py = request.py();
        let bs = self.rules.block_size();
        let digests = request.getattr(intern!(py, "block_hashes"))?;
        let digests = digests
            .cast_into::<PyList>()
            .map_err(|_| PyTypeError::new_err("request.block_hashes must be a list of bytes"))?;
        // Never past the slots held: tokens only fill room already allocated.
        let full = self
            .rules
            .committable_blocks(num_tokens, digests.len(), held);
        if full <= cached {
            return Ok(None);
        }
        let hashes = digests::block_hashes(self.core(), digests.get_slice(cached, full).as_any())?;
        let upto = full * bs;
        let tokens = if self.pass_tokens && upto > appended {
            let all = request.getattr(intern!(py, "all_token_ids"))?;
            let slice = PySlice::new(py, appended as isize, upto as isize, 1);
            Some(tokens(&all.get_item(slice)?)?)
        } else {
            None
        };
        Ok(Some(Commit {
            full,
            hashes,
            digests,
            tokens,
        }))
    }

    /// Carries out a planned commit.
    pub(super) fn apply_commit(
        &self,
        tracked: &Bound<'_, Tracked>,
        commit: Commit<'_>,
    ) -> PyResult<()> {
        let py = tracked.py();
        let bs = self.rules.block_size();
        let core = self.core();
        let mut t = tracked.try_borrow_mut()?;
        let upto = commit.full * bs;
        // A growth by append since the plan already handed the tokens over.
        if let (Some(new), true) = (&commit.tokens, t.appended < upto) {
            core.append(t.key, new).map_err(errors::to_py)?;
            t.appended = upto;
        }
        // Without events the commit reaches past the tokens the manager holds.
        core.commit_hashed(t.key, upto, &commit.hashes)
            .map_err(errors::to_py)?;
        let blocks = t.blocks.bind(py);
        for i in t.cached_blocks..commit.full {
            let digest = commit.digests.get_item(i)?.cast_into::<PyBytes>()?.unbind();
            block(&blocks.get_item(i)?)?.set_cached((i + 1) * bs, digest);
        }
        t.cached_blocks = commit.full;
        t.next_cache = self.rules.next_commit_at(commit.full);
        Ok(())
    }

    /// Appends freshly allocated blocks (block manager ids) to a tracked
    /// request's table; returns their block objects, marked uncached.
    pub(super) fn take_new<'py>(
        &self,
        tracked: &Bound<'py, Tracked>,
        ids: &[BlockId],
    ) -> PyResult<Bound<'py, PyList>> {
        let py = tracked.py();
        let objs = self.block_objs.bind(py);
        if let Some(bad) = ids
            .iter()
            .find(|&&b| vllm_rules::vllm_block_id(b) >= objs.len())
        {
            return Err(PyValueError::new_err(format!(
                "block id {bad} is outside the cache ({} blocks)",
                objs.len() - 1
            )));
        }
        let new = PyList::empty(py);
        for &b in ids {
            let obj = objs.get_item(vllm_rules::vllm_block_id(b))?;
            block(&obj)?.set_uncached();
            new.append(obj)?;
        }
        let t = tracked.try_borrow()?;
        let table = t.blocks.bind(py);
        for obj in new.iter() {
            table.append(obj)?;
        }
        Ok(new)
    }

    /// A tracked request's step (``allocate_slots`` without a new prefix
    /// hit): grows its table to the step's slots when they need blocks
    /// (``None``, nothing changed, when they do not fit: `VllmRules::step_fits`),
    /// then commits the step's hashed full blocks unless ``delay``. Until a
    /// block fills, a counter check.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step<'py>(
        &self,
        request: &Bound<'py, PyAny>,
        tracked: &Bound<'py, Tracked>,
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        num_external_computed_tokens: usize,
        delay: bool,
        reserved: usize,
        has_scheduled_reqs: bool,
        full: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = request.py();
        let span = self.span(
            request,
            num_external_computed_tokens,
            num_new_tokens,
            num_lookahead_tokens,
        )?;
        let (held, key, next_cache, cached, appended) = {
            let t = tracked.try_borrow()?;
            let held = t.blocks.bind(py).len();
            (held, t.key, t.next_cache, t.cached_blocks, t.appended)
        };
        let need = self.rules.new_blocks(span.slots, held);
        let may_watermark = has_scheduled_reqs && self.rules.watermark_blocks() > 0;
        if need > 0 || reserved > 0 || full || may_watermark {
            let check = StepCheck {
                new_blocks: need,
                held_blocks: held,
                free_blocks: self.core().num_free_blocks(),
                reserved_blocks: reserved,
                full_sequence_tokens: if full {
                    Some(request.getattr(intern!(py, "num_tokens"))?.extract()?)
                } else {
                    None
                },
            };
            // A tracked request is waiting again after an asynchronous KV
            // load: vLLM applies the watermark to it as to an admission. Its
            // status is read only where the watermark could refuse.
            let watermark = if full || !self.rules.step_fits(check, self.rules.watermark_blocks()) {
                self.watermark(request, has_scheduled_reqs)?
            } else {
                0
            };
            if !self.rules.step_fits(check, watermark) {
                return Ok(None);
            }
        }
        // The commit is planned (digests and tokens checked) before the
        // table grows, so bad input changes nothing.
        let upto = span.computed.saturating_add(num_new_tokens);
        let commit = if !delay && upto >= next_cache {
            let total: usize = request.getattr(intern!(py, "num_tokens"))?.extract()?;
            self.plan_commit(request, cached, appended, upto.min(total), held + need)?
        } else {
            None
        };
        let mut new = None;
        if need > 0 {
            let core = self.core();
            let slots = span.slots;
            let total: usize = request.getattr(intern!(py, "num_tokens"))?.extract()?;
            let grown = if self.pass_tokens && slots <= total {
                // Every slot holds a known token (a prefill chunk) that
                // events will carry: one call hands them over and takes the
                // blocks.
                let appended = tracked.try_borrow()?.appended;
                let all = request.getattr(intern!(py, "all_token_ids"))?;
                let chunk = tokens(&all.get_item(PySlice::new(
                    py,
                    appended as isize,
                    slots as isize,
                    1,
                ))?)?;
                let grown = core.append(key, &chunk);
                if grown.is_ok() {
                    tracked.try_borrow_mut()?.appended = slots;
                }
                grown
            } else {
                core.reserve(key, slots)
            };
            match grown {
                Ok(g) => new = Some(self.take_new(tracked, &g.new_block_ids)?),
                Err(Error::OutOfBlocks { .. }) => return Ok(None),
                Err(e) => return Err(errors::to_py(e)),
            }
        }
        if let Some(commit) = commit {
            self.apply_commit(tracked, commit)?;
        }
        match new {
            Some(blocks) => Ok(Some(self.result(&blocks)?)),
            None => Ok(Some(self.empty.bind(py).clone())),
        }
    }

    /// Starts tracking an admitted request: ``blocks`` (its block objects,
    /// ``cached_blocks`` of them committed), ``appended`` tokens given to
    /// the block manager under ``key``; its ``view`` is a ``KVCacheBlocks``
    /// over ``blocks``.
    pub(super) fn track<'py>(
        &self,
        request_id: &Bound<'py, PyAny>,
        key: RequestId,
        blocks: Bound<'py, PyList>,
        appended: usize,
        cached_blocks: usize,
    ) -> PyResult<Bound<'py, Tracked>> {
        let py = request_id.py();
        let view = self.blocks_class.bind(py).call1(((&blocks,),))?.unbind();
        let tracked = Bound::new(
            py,
            Tracked {
                key,
                blocks: blocks.unbind(),
                appended,
                cached_blocks,
                next_cache: self.rules.next_commit_at(cached_blocks),
                view,
            },
        )?;
        self.requests.bind(py).set_item(request_id, &tracked)?;
        Ok(tracked)
    }
}

/// A commit `State::plan_commit` checked: the full blocks to reach, their
/// block hashes, vLLM's digests, and the tokens to hand over first (events).
pub(super) struct Commit<'py> {
    full: usize,
    hashes: Vec<BlockHash>,
    digests: Bound<'py, PyList>,
    tokens: Option<Vec<TokenId>>,
}
