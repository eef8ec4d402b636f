"""The SGLang adapter driven the way SGLang's scheduler drives its RadixCache,
checked against the behaviour SGLang's radix cache tests describe."""

from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np
import pytest

from mla_cache import OutOfBlocks
from mla_cache.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from mla_cache.sglang import MatchResult, PrefixNode, RadixCache, RadixKey

from conftest import small_config

PS = 4


@dataclass
class Req:
    """Stand-in for SGLang's Req with the attributes its cache uses."""

    rid: str
    origin_input_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    extra_key: Optional[str] = None
    req_pool_idx: int = 0
    fill_ids: List[int] = field(default_factory=list)
    prefix_indices: Any = None
    last_node: Optional[PrefixNode] = None


class Pool:
    """Stand-in for ReqToTokenPool: records freed rows."""

    def __init__(self) -> None:
        self.freed: List[int] = []

    def free(self, free_index: int) -> None:
        self.freed.append(free_index)


def make(num_blocks=16, **kw):
    return RadixCache(small_config(num_blocks, PS), **kw)


def admit(cache, req, chunk=None):
    """SGLang's path for a new request: init_next_round_input (match on all
    but the last token), PrefillAdder (lock), prepare_for_extend (alloc),
    then cache_unfinished_req after the forward pass."""
    req.fill_ids = req.origin_input_ids + req.output_ids
    m = cache.match_prefix(RadixKey(req.fill_ids[:-1], req.extra_key))
    req.prefix_indices, req.last_node = m.device_indices, m.last_device_node
    cache.inc_lock_ref(req.last_node)
    if chunk is not None:
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + chunk]
    out = cache.alloc_extend(req)
    cache.cache_unfinished_req(req, chunked=chunk is not None)
    return out, len(m.device_indices)


def decode(cache, req, token):
    req.output_ids.append(token)
    return cache.alloc_decode(req)


def test_match_returns_page_aligned_per_token_indices_and_a_node():
    c = make()
    req = Req("a", list(range(10)))
    out, hit = admit(c, req)
    assert hit == 0 and out.dtype == np.int64
    assert out.tolist() == list(range(10))  # blocks 0, 1, 2: slots b * 4 + offset
    m = c.match_prefix(RadixKey(list(range(10))))
    assert isinstance(m, MatchResult)
    assert m.device_indices.tolist() == list(range(8))
    assert m.last_device_node is m.last_host_node and m.host_hit_length == 0
    assert len(m.last_device_node) == 8
    # Shorter than a page: nothing; a mismatch in the second page: one page.
    assert len(c.match_prefix(RadixKey([0, 1, 2])).device_indices) == 0
    assert c.match_prefix(RadixKey([0, 1, 2, 3, 9, 9, 9, 9])).device_indices.tolist() == [0, 1, 2, 3]
    assert c.match_prefix(RadixKey([])).last_device_node is c.root_node


def test_second_request_reuses_the_prefix_slots():
    c = make()
    a = Req("a", list(range(10)))
    admit(c, a)
    b = Req("b", list(range(8)) + [50, 51, 52])
    out, hit = admit(c, b)
    assert hit == 8
    assert b.prefix_indices[:8].tolist() == list(range(8))
    assert len(out) == 3 and out[0] // PS not in (0, 1, 2)


def test_extra_key_namespaces_are_disjoint():
    c = make()
    admit(c, Req("a", list(range(9)), extra_key="lora1"))
    assert len(c.match_prefix(RadixKey(list(range(9)), "lora1")).device_indices) == 8
    assert len(c.match_prefix(RadixKey(list(range(9)), "lora2")).device_indices) == 0
    assert len(c.match_prefix(RadixKey(list(range(9)))).device_indices) == 0


def test_locks_protect_and_sizes_add_up():
    c = make(num_blocks=8)
    a = Req("a", list(range(9)))
    admit(c, a)
    assert c.protected_size() == 8  # a's lock on its two committed pages
    assert c.total_size() == 8
    a.output_ids.append(100)
    c.cache_finished_req(a)
    # As SGLang's check_memory requires when idle: available + evictable
    # == total - protected.
    assert c.protected_size() == 0 and c.evictable_size() == 8
    assert c.available_size() == 24
    node = c.match_prefix(RadixKey(list(range(9)))).last_device_node
    assert c.inc_lock_ref(node) == -8
    assert c.inc_lock_ref(node) == 0  # nested
    assert c.available_size() == 24 and c.protected_size() == 8
    assert c.evictable_size() == 0
    # Filling the cache evicts around the locked pages.
    b = Req("b", list(range(100, 124)))
    admit(c, b)
    assert len(c.match_prefix(RadixKey(list(range(9)))).device_indices) == 8
    assert c.dec_lock_ref(node) == 0
    assert c.dec_lock_ref(node) == 8
    with pytest.raises(OutOfBlocks):
        admit(c, Req("c", list(range(300, 316))))  # 4 pages, 2 free
    c.manager._check_invariants()


def test_chunked_prefill_commits_each_chunk_and_moves_the_lock():
    c = make()
    req = Req("a", list(range(14)))
    out, _ = admit(c, req, chunk=6)
    assert len(out) == 6 and len(req.last_node) == 4
    assert len(c.match_prefix(RadixKey(list(range(14)))).device_indices) == 4
    assert c.protected_size() == 4
    req.fill_ids = req.origin_input_ids[:12]
    out = c.alloc_extend(req)
    assert len(out) == 6
    c.cache_unfinished_req(req, chunked=True)
    assert len(req.last_node) == 12 and len(req.prefix_indices) == 12
    assert c.protected_size() == 12
    assert len(c.match_prefix(RadixKey(list(range(14)))).device_indices) == 12
    c.manager._check_invariants()


def test_decode_and_finish_cache_generated_tokens_but_not_the_last():
    pool = Pool()
    c = make(req_to_token_pool=pool, enable_kv_cache_events=True)
    req = Req("a", list(range(6)), req_pool_idx=3)
    admit(c, req)
    slots = [decode(c, req, t).tolist() for t in (100, 101, 102)]
    assert [len(s) for s in slots] == [1, 1, 1]
    table = c.manager.block_table("a").tolist()
    assert slots[0] == [table[1] * PS + 2]  # position 6 is offset 2 of page 1
    req.output_ids.append(103)  # sampled, never computed
    c.cache_finished_req(req)
    assert pool.freed == [3]
    assert c.manager.num_free_blocks == 16
    # Tokens 0..8 were computed: two pages cached; the unfinished third is not.
    full = list(range(6)) + [100, 101, 102, 103]
    assert len(c.match_prefix(RadixKey(full)).device_indices) == 8
    stored = [e for e in c.take_events() if isinstance(e, BlockStored)]
    assert [e.token_ids for e in stored] == [[0, 1, 2, 3], [4, 5, 100, 101]]


def test_retract_frees_and_readmission_hits_committed_pages():
    c = make(num_blocks=6)
    a = Req("a", list(range(12)))
    b = Req("b", list(range(100, 112)))
    admit(c, a)
    admit(c, b)
    with pytest.raises(OutOfBlocks):
        decode(c, a, 7)  # the fourth page of a does not fit
    a.output_ids.pop()
    c.retract_req(b)
    b.output_ids, b.prefix_indices, b.last_node = [], None, None
    decode(c, a, 7)
    a.output_ids.append(8)
    c.cache_finished_req(a)
    _, hit = admit(c, b)
    assert hit == 8
    c.manager._check_invariants()


def test_eviction_is_lru_tail_first_and_reported():
    c = make(num_blocks=4, enable_kv_cache_events=True)
    a = Req("a", list(range(16)))
    admit(c, a)
    a.output_ids.append(99)
    c.cache_finished_req(a)
    c.take_events()
    b = Req("b", list(range(200, 205)))
    admit(c, b)
    assert len(c.match_prefix(RadixKey(list(range(16)))).device_indices) == 8
    removed = [e for e in c.take_events() if isinstance(e, BlockRemoved)]
    assert len(removed) == 2
    assert len(c.match_prefix(RadixKey(list(range(16)))).device_indices) == 8


def test_evict_frees_evictable_pages_as_sglang_does():
    c = make(num_blocks=8, enable_kv_cache_events=True)
    a = Req("a", list(range(16)))
    admit(c, a)
    a.output_ids.append(99)
    c.cache_finished_req(a)  # 4 pages cached, none locked
    c.take_events()
    assert (c.available_size(), c.evictable_size()) == (16, 16)
    # SGLang's ScheduleBatch.check_decode_mem: evict when the allocator is
    # short, then check the allocator alone.
    need = 20
    if c.available_size() < need:
        c.evict(need)
    assert c.available_size() >= need
    # evict(20) frees at least 20 tokens: 5 pages wanted, the 4 there go,
    # deepest first.
    assert (c.available_size(), c.evictable_size(), c.total_size()) == (32, 0, 0)
    removed = [e for e in c.take_events() if isinstance(e, BlockRemoved)]
    assert len(removed) == 4
    # Locked pages are not evicted; evict(n) takes whole pages, leaves first.
    b = Req("b", list(range(100, 117)))
    admit(c, b)
    b.output_ids.append(7)
    c.cache_finished_req(b)
    node = c.match_prefix(RadixKey(list(range(100, 108)))).last_device_node
    c.inc_lock_ref(node)
    assert (c.evictable_size(), c.protected_size()) == (8, 8)
    c.evict(1)
    assert len(c.match_prefix(RadixKey(list(range(100, 117)))).device_indices) == 12
    assert c.evictable_size() == 4
    c.evict(100)
    assert len(c.match_prefix(RadixKey(list(range(100, 117)))).device_indices) == 8
    assert c.evictable_size() == 0 and c.available_size() == 24
    c.dec_lock_ref(node)
    assert c.evictable_size() == 8
    c.manager._check_invariants()


def test_stale_node_cannot_be_locked_or_admitted():
    c = make(num_blocks=4)
    a = Req("a", list(range(9)))
    admit(c, a)
    a.output_ids.append(1)
    c.cache_finished_req(a)
    node = c.match_prefix(RadixKey(list(range(9)))).last_device_node
    x = Req("x", list(range(100, 116)))
    admit(c, x)  # evicts a's pages
    with pytest.raises(RuntimeError, match="evicted"):
        c.inc_lock_ref(node)
    x.output_ids.append(1)
    c.cache_finished_req(x)
    b = Req("b", list(range(9)), fill_ids=list(range(9)), last_node=node)
    b.prefix_indices = np.arange(8)
    with pytest.raises(RuntimeError, match="evicted"):
        c.alloc_extend(b)
    c.manager._check_invariants()


def test_insert_commits_the_request_holding_the_indices():
    c = make()
    req = Req("a", list(range(10)))
    req.fill_ids = req.origin_input_ids
    req.prefix_indices, req.last_node = np.empty(0), c.root_node
    out = c.alloc_extend(req)
    assert len(c.match_prefix(RadixKey(list(range(10)))).device_indices) == 0
    assert c.insert(RadixKey(list(range(10))), out) == 0
    assert len(c.match_prefix(RadixKey(list(range(10)))).device_indices) == 8
    assert c.insert(RadixKey(list(range(10))), out) == 8
    with pytest.raises(ValueError, match="no live request"):
        c.insert(RadixKey(list(range(50, 58))), np.arange(40, 48))
    with pytest.raises(ValueError, match="every token"):
        c.insert(RadixKey(list(range(8))))


def test_reset_only_when_idle():
    c = make(enable_kv_cache_events=True)
    a = Req("a", list(range(9)))
    admit(c, a)
    with pytest.raises(RuntimeError):
        c.reset()
    a.output_ids.append(1)
    c.cache_finished_req(a)
    c.reset()
    assert isinstance(c.take_events()[-1], AllBlocksCleared)
    assert c.total_size() == 0


def test_disabled_cache_shares_nothing():
    c = make(disable=True)
    a = Req("a", list(range(9)))
    admit(c, a)
    assert len(c.match_prefix(RadixKey(list(range(9)))).device_indices) == 0
    assert c.inc_lock_ref(a.last_node) == 0


def test_scheduler_loop_with_shared_system_prompt():
    pool = Pool()
    c = make(num_blocks=20, req_to_token_pool=pool)
    system = list(range(1000, 1008))
    waiting = [Req(f"r{i}", system + [i] * (2 + i % 6), req_pool_idx=i) for i in range(10)]
    running: List[Req] = []
    hits = 0
    step = 0
    while waiting or running:
        step += 1
        assert step < 300
        for r in list(running):
            if r not in running:  # retracted earlier in this step
                continue
            if len(r.output_ids) == 3:
                r.output_ids.append(0)
                c.cache_finished_req(r)
                running.remove(r)
                continue
            try:
                decode(c, r, 5000 + step)
            except OutOfBlocks:
                r.output_ids.pop()
                victim = running.pop()
                c.retract_req(victim)
                victim.output_ids, victim.last_node = [], None
                waiting.insert(0, victim)
        while waiting:
            r = waiting[0]
            try:
                _, hit = admit(c, r)
            except OutOfBlocks:
                c.dec_lock_ref(r.last_node)
                break
            hits += hit
            running.append(waiting.pop(0))
        c.manager._check_invariants()
        assert c.available_size() + c.evictable_size() == c.manager.num_free_blocks * PS
    assert hits >= 8 * 5
    assert sorted(pool.freed) == list(range(10))
    assert c.manager.num_free_blocks == 20 and c.protected_size() == 0
