"""SGLang 0.5.23's scheduler, reduced to its memory side, on SGLang's own objects.

:class:`Engine` builds SGLang's paged token allocator, its ``ReqToTokenPool``
and a tree cache (SGLang's ``RadixCache`` or mla_cache's backend) from one
``CacheInitParams``, and drives them with the calls SGLang's scheduler makes,
through SGLang's own helpers where it has them: ``Req.init_next_round_input``
(match), ``tree_cache.lock`` (admission), ``alloc_paged_token_slots_extend`` /
``_decode`` (allocation, evicting first), ``checkpoint_kv_cache`` (after a
prefill chunk), ``release_kv_cache`` (finish, abort, retraction). After every
step :meth:`Engine.check` proves the pages are conserved: each page is free,
cached, or owned by one running request, exactly once.
"""

from __future__ import annotations

from array import array
from typing import Iterable, List, Optional, Set, Type

import torch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocation import (
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_token_slots,
)
from sglang.srt.mem_cache.allocator import (
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


def publish_server_args(**fields) -> ServerArgs:
    """Publishes SGLang's runtime settings (a CPU scheduler), as its launcher
    does before any scheduler code runs; returns them."""
    args = ServerArgs(model_path="dummy", device="cpu", **fields)
    reset_context()
    publish(args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    return args


class Engine:
    """One scheduler's KV memory: ``num_pages`` pages of ``page_size`` tokens
    (SGLang's allocator hands out pages ``1 ..= num_pages``), request rows,
    and a tree cache of class ``cache_class``."""

    def __init__(
        self,
        cache_class: Type,
        *,
        num_pages: int,
        page_size: int,
        max_requests: int = 16,
        max_context: int = 1024,
        disable: bool = False,
        enable_kv_cache_events: bool = False,
    ) -> None:
        publish_server_args(page_size=page_size)
        self.page_size = page_size
        self.num_pages = num_pages
        # SGLang's choice: the token allocator for page size 1, the paged one otherwise.
        if page_size == 1:
            self.allocator = TokenToKVPoolAllocator(num_pages, torch.int64, "cpu", None, False)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(
                num_pages * page_size, page_size, torch.int64, "cpu", None, need_sort=False
            )
        self.pool = ReqToTokenPool(max_requests, max_context, "cpu", False)
        self.tree = cache_class(
            CacheInitParams(
                disable=disable,
                req_to_token_pool=self.pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=page_size,
                enable_kv_cache_events=enable_kv_cache_events,
            )
        )
        self.running: List[Req] = []
        """Requests holding a row (admitted and not released)."""

    # ----- requests -----

    @staticmethod
    def request(
        rid: str, tokens: Iterable[int], max_new_tokens: int = 8, extra_key: Optional[str] = None
    ) -> Req:
        """A new SGLang ``Req`` for the prompt ``tokens``."""
        params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        params.normalize(None)
        req = Req(rid, "", array("q", tokens), params)
        req.extra_key = extra_key
        return req

    def match(self, req: Req) -> int:
        """``init_next_round_input``: the tokens of ``req`` the cache holds."""
        req.init_next_round_input(self.tree)
        return req.prefix_len

    def prefill(self, reqs: List[Req], chunk: Optional[int] = None) -> List[int]:
        """One prefill batch: new requests are matched and locked, a chunked
        one continues; each gets slots for up to ``chunk`` more tokens
        (page-aligned ends, as SGLang's chunking), runs, and is checkpointed
        (SGLang's ``stash_chunked_request`` or ``checkpoint_kv_cache``), or
        released when its first token finishes it. Returns each request's
        prefix length before the step."""
        prefix_lens = []
        for req in reqs:
            if req.kv.holds_kv:
                req.init_next_round_input()
            else:
                self.match(req)
                req.lock = self.tree.lock(req.last_node)
            prefix_lens.append(req.prefix_len)
            end = len(req.full_untruncated_fill_ids)
            if chunk is not None and req.prefix_len + chunk < end:
                end = (req.prefix_len + chunk) // self.page_size * self.page_size
            req.extend_end = end
        self._alloc_extend(reqs)
        for req in reqs:
            if req.extend_end < len(req.full_untruncated_fill_ids):
                checkpoint_kv_cache(req, self.tree)  # chunked: stash for the next round
                continue
            self._sample(req)
            if req.finished():
                self.release(req, checkpoint=True)
            else:
                checkpoint_kv_cache(req, self.tree)
        self.check()
        return prefix_lens

    def decode(self, reqs: List[Req]) -> None:
        """One decode step: a slot for each request's last sampled token,
        then its next token; finished requests are released into the cache."""
        seq_lens = torch.tensor([r.kv.kv_allocated_len for r in reqs], dtype=torch.int64)
        rows = torch.tensor([r.kv.req_pool_idx for r in reqs], dtype=torch.int64)
        if self.page_size == 1:
            out = alloc_token_slots(self.tree, len(reqs))
        else:
            last_loc = self.pool.req_to_token[rows, seq_lens - 1].to(torch.int64)
            out = alloc_paged_token_slots_decode(self.tree, seq_lens + 1, seq_lens + 1, last_loc)
        self.pool.write((rows, seq_lens), out.to(torch.int32))
        for req in reqs:
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
            self._sample(req)
            if req.finished():
                self.release(req, checkpoint=True)
        self.check()

    def release(self, req: Req, *, checkpoint: bool) -> None:
        """``release_kv_cache``: with ``checkpoint`` the cache keeps the
        request's full pages first (a finish); without, everything the
        request owns is freed (an abort)."""
        release_kv_cache(req, self.tree, checkpoint=checkpoint)
        self.running.remove(req)
        self.check()

    def retract(self, req: Req) -> None:
        """A decode retraction: release without checkpoint, reset the request."""
        self.release(req, checkpoint=False)
        req.reset_for_retract()

    def run(self, req: Req, chunk: Optional[int] = None) -> int:
        """A request from admission to its end, alone; returns its first hit."""
        hit = self.prefill([req], chunk)[0]
        while not req.finished():
            if req.extend_end is not None and req.extend_end < len(req.full_untruncated_fill_ids):
                self.prefill([req], chunk)
            else:
                self.decode([req])
        return hit

    def flush(self) -> None:
        """SGLang's ``flush_cache`` when idle: the tree, rows and allocator reset."""
        assert not self.running
        self.tree.reset()
        self.pool.clear()
        self.allocator.clear()
        self.check()

    # ----- the pages -----

    def sizes(self) -> tuple:
        """``(available, evictable, protected)`` tokens, as the scheduler reads them."""
        return (
            self.allocator.available_size(),
            self.tree.evictable_size(),
            self.tree.protected_size(),
        )

    def cached_pages(self) -> Set[int]:
        """Pages the tree holds."""
        if self.tree.total_size() == 0:
            return set()
        return {int(s) // self.page_size for s in self.tree.all_values_flatten().tolist()}

    def check(self) -> None:
        """Every page ``1 ..= num_pages`` is exactly one of: free in the
        allocator, cached in the tree, or owned by one running request
        (its row past ``cache_protected_len``); the tree's part of each row is
        cached; SGLang's idle-check sum ``available + evictable + protected +
        request-owned`` is the capacity."""
        free = [int(p) for p in self.allocator.get_all_free_pages().tolist()]
        assert len(free) == len(set(free)), "a page was freed twice"
        cached = self.cached_pages()
        assert len(cached) * self.page_size == self.tree.total_size()
        seen = set(free)
        assert not seen & cached, f"pages both free and cached: {sorted(seen & cached)}"
        seen |= cached
        owned_tokens = 0
        ps = self.page_size
        for req in self.running:
            row = self.pool.req_to_token[req.kv.req_pool_idx]
            protected, allocated = req.kv.cache_protected_len, req.kv.kv_allocated_len
            tree_part = {int(s) // ps for s in row[:protected].tolist()}
            assert tree_part <= cached, f"{req.rid}: row points at uncached pages"
            own = {int(s) // ps for s in row[protected:allocated].tolist()}
            assert not own & seen, f"{req.rid}: owns pages held elsewhere: {sorted(own & seen)}"
            seen |= own
            owned_tokens += len(own) * ps
        assert seen == set(range(1, self.num_pages + 1)), (
            f"leaked pages: {sorted(set(range(1, self.num_pages + 1)) - seen)}"
        )
        available, evictable, protected = self.sizes()
        assert evictable + protected == self.tree.total_size()
        assert available + evictable + protected + owned_tokens == self.num_pages * ps

    # ----- internals -----

    def _alloc_extend(self, reqs: List[Req]) -> None:
        """SGLang's ``alloc_for_extend`` for one batch: rows, the prefix read
        off the tree (or the row of a continuing chunk), paged slots for the
        rest, all written into the rows."""
        prefixes = []
        for req in reqs:
            if req.kv.holds_kv:
                prefixes.append(self.pool.req_to_token[req.kv.req_pool_idx, : req.prefix_len])
            elif req.prefix_len:
                prefixes.append(self.tree.prefix_device_indices(req))
            else:
                prefixes.append(torch.empty(0, dtype=torch.int64))
        new = [r for r in reqs if not r.kv.holds_kv]
        assert self.pool.alloc(reqs) is not None, "out of request rows"
        self.running.extend(new)
        prefix_lens = torch.tensor([r.prefix_len for r in reqs], dtype=torch.int64)
        seq_lens = torch.tensor([r.extend_end for r in reqs], dtype=torch.int64)
        last_loc = torch.tensor(
            [int(p[-1]) if len(p) else -1 for p in prefixes], dtype=torch.int64
        )
        extend = int((seq_lens - prefix_lens).sum())
        try:
            if self.page_size == 1:
                out = alloc_token_slots(self.tree, extend)
            else:
                out = alloc_paged_token_slots_extend(
                    self.tree, prefix_lens, prefix_lens, seq_lens, seq_lens, last_loc, extend
                )
        except RuntimeError:  # out of memory: the new requests go back to waiting
            for req in new:
                self.tree.unlock(req.lock)
                req.lock = None
                self.pool.free(req)
                self.running.remove(req)
            raise
        offset = 0
        for req, prefix in zip(reqs, prefixes):
            row, start, end = req.kv.req_pool_idx, req.prefix_len, req.extend_end
            self.pool.write((row, slice(0, start)), prefix.to(torch.int32))
            slots = out[offset : offset + end - start]
            self.pool.write((row, slice(start, end)), slots.to(torch.int32))
            offset += end - start
            req.kv.kv_allocated_len = req.kv.kv_committed_len = end

    @staticmethod
    def _sample(req: Req) -> None:
        """The forward pass's next token for ``req`` (a function of its length)."""
        req.output_ids.append(100_000 + len(req.origin_input_ids) + len(req.output_ids))
        req.update_finish_state()
