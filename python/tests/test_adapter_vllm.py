"""The vLLM adapter driven the way vLLM's scheduler drives its KVCacheManager,
checked against the behaviour vLLM's own prefix-caching tests describe."""

import hashlib
from dataclasses import dataclass, field
from typing import List, Optional

import pytest

import mla_cache
from mla_cache.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from mla_cache.vllm import KVCacheBlock, KVCacheBlocks, KVCacheManager

from conftest import small_config

BS = 4


@dataclass
class Lora:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass
class Position:
    offset: int
    length: int


@dataclass
class Feature:
    identifier: str
    mm_position: Position


@dataclass
class Request:
    """Stand-in for vLLM's Request with the attributes its manager reads."""

    request_id: str
    all_token_ids: List[int]
    num_computed_tokens: int = 0
    lora_request: Optional[Lora] = None
    cache_salt: Optional[str] = None
    mm_features: List[Feature] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def block_hashes(self) -> List[bytes]:
        """One 32-byte digest per full block, chained as vLLM's block hasher
        chains them, over the block's tokens and the keys vLLM hashes with
        (LoRA, the salt on the first block, overlapping media)."""
        out: List[bytes] = []
        parent = b""
        lora = None if self.lora_request is None else (self.lora_request.lora_name, self.lora_request.lora_path)
        for i in range(self.num_tokens // BS):
            start, end = i * BS, (i + 1) * BS
            mm = [
                (f.identifier, f.mm_position.offset - start)
                for f in self.mm_features
                if f.mm_position.offset < end and f.mm_position.offset + f.mm_position.length > start
            ]
            keys = (lora, self.cache_salt if i == 0 else None, mm)
            parent = hashlib.sha256(repr((parent, self.all_token_ids[start:end], keys)).encode()).digest()
            out.append(parent)
        return out


def make(num_blocks=16, **kw):
    """A manager with ``num_blocks`` usable blocks (vLLM's null block on top)."""
    return KVCacheManager.from_config(small_config(num_blocks + 1, BS), **kw)


def schedule_prefill(m, req, budget=None):
    """One waiting request through get_computed_blocks + allocate_slots, as the
    scheduler does; returns (new blocks, hit tokens) and advances the request."""
    blocks, hit, boundary = m.get_computed_blocks(req)
    assert boundary == 0
    n = req.num_tokens - hit if budget is None else min(budget, req.num_tokens - hit)
    new = m.allocate_slots(req, n, hit, blocks)
    if new is not None:
        req.num_computed_tokens = hit + n
    return new, hit


def decode(m, req, token):
    """One decode step: the sampled token joins the request, then its slot."""
    req.all_token_ids.append(token)
    new = m.allocate_slots(req, 1)
    if new is not None:
        req.num_computed_tokens += 1
    return new


def test_prefill_hits_full_blocks_of_an_earlier_request():
    m = make()
    a = Request("a", list(range(10)))  # 2 full blocks + 2 tokens
    new, hit = schedule_prefill(m, a)
    # Block 0 is vLLM's null block: never handed out.
    assert hit == 0 and new.get_block_ids() == ([1, 2, 3],)
    assert m.get_block_ids("a") == ([1, 2, 3],)
    # vLLM test_prefill: a request with the same prefix hits the full blocks.
    b = Request("b", list(range(8)) + [99, 98, 97])
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    new = m.allocate_slots(b, b.num_tokens - hit, hit, blocks)
    assert new.get_block_ids() == ([4],)
    assert (blocks + new).get_block_ids() == ([1, 2, 4],)
    assert m.usage == pytest.approx(4 / 16)
    m.manager._check_invariants()


def test_hit_is_capped_so_the_last_token_is_recomputed():
    m = make()
    schedule_prefill(m, Request("a", list(range(8))))
    blocks, hit, _ = m.get_computed_blocks(Request("b", list(range(8))))
    assert hit == 4  # not 8: the last token is recomputed for its logits
    blocks, hit, _ = m.get_computed_blocks(Request("c", list(range(9))))
    assert hit == 8
    assert m.get_computed_blocks(Request("d", list(range(9))), max_cache_hit_length=5)[1] == 4


def test_get_computed_blocks_takes_no_references():
    m = make(num_blocks=4)
    a = Request("a", list(range(8)))
    schedule_prefill(m, a)
    m.free(a)
    assert m.manager.num_free_blocks == 4
    blocks, hit, _ = m.get_computed_blocks(Request("b", list(range(9))))
    assert hit == 8 and m.manager.num_free_blocks == 4


def test_chunked_prefill_allocates_per_chunk_and_shares_only_scheduled_blocks():
    m = make()
    req = Request("a", list(range(14)))
    new, hit = schedule_prefill(m, req, budget=5)
    assert new.get_block_ids() == ([1, 2],)
    # Only the first full block was scheduled: others hit it, not the second.
    assert m.get_computed_blocks(Request("x", list(range(14))))[1] == 4
    new = m.allocate_slots(req, 5)
    req.num_computed_tokens += 5
    assert new.get_block_ids() == ([3],)
    assert m.get_computed_blocks(Request("x", list(range(14))))[1] == 8
    new = m.allocate_slots(req, 4)
    req.num_computed_tokens += 4
    assert new.get_block_ids() == ([4],)
    assert m.get_block_ids("a") == ([1, 2, 3, 4],)
    assert m.get_computed_blocks(Request("x", list(range(15))))[1] == 12
    m.manager._check_invariants()


def test_decode_fills_the_tail_then_takes_a_block_and_caches_it():
    m = make(enable_kv_cache_events=True)
    req = Request("a", list(range(6)))
    schedule_prefill(m, req)
    assert decode(m, req, 100).get_block_ids() == ([],)
    assert decode(m, req, 101).get_block_ids() == ([],)
    assert decode(m, req, 102).get_block_ids() == ([3],)
    # The block filled by decoding is cached: a follow-up turn hits it.
    follow = Request("b", req.all_token_ids[:8] + [7, 7])
    assert m.get_computed_blocks(follow)[1] == 8
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    assert [e.token_ids for e in stored] == [[0, 1, 2, 3], [4, 5, 100, 101]]
    assert stored[1].parent_block_hash == stored[0].block_hashes[0]
    assert stored[0].medium == "GPU" and stored[0].lora_name is None


def test_allocation_fails_without_change_then_preemption_frees_and_readmits():
    m = make(num_blocks=6)
    a = Request("a", list(range(12)))
    b = Request("b", list(range(100, 112)))
    schedule_prefill(m, a)
    too_big = Request("c", list(range(200, 216)))
    assert schedule_prefill(m, too_big)[0] is None  # 4 blocks needed, 3 free
    assert m.manager.num_free_blocks == 3 and m.get_block_ids("c") == ([],)
    schedule_prefill(m, b)  # fits exactly
    assert m.manager.num_free_blocks == 0
    # Decoding a needs a block: the scheduler preempts b and retries.
    a.all_token_ids.append(500)
    assert m.allocate_slots(a, 1) is None
    m.free(b)
    b.num_computed_tokens = 0
    b.num_preemptions += 1
    assert m.allocate_slots(a, 1).get_block_ids() == ([m.get_block_ids("a")[0][-1]],)
    a.num_computed_tokens += 1
    m.free(a)
    # Re-admitted, b finds its blocks that survived (tail first eviction).
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 8
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks) is not None
    m.manager._check_invariants()


def test_free_is_tail_first_so_roots_survive_eviction():
    m = make(num_blocks=4)
    a = Request("a", list(range(16)))
    schedule_prefill(m, a)
    m.free(a)
    b = Request("b", list(range(200, 205)))  # takes 2 blocks: the tail of a goes first
    schedule_prefill(m, b)
    assert m.get_computed_blocks(Request("c", list(range(17))))[1] == 8


def test_lora_and_cache_salt_isolate_prefixes():
    m = make()
    p = list(range(9))
    schedule_prefill(m, Request("base", p))
    schedule_prefill(m, Request("l1", p, lora_request=Lora("sql", 1)))
    assert m.get_computed_blocks(Request("l1b", p, lora_request=Lora("sql", 1)))[1] == 8
    assert m.get_computed_blocks(Request("l2", p, lora_request=Lora("chat", 2)))[1] == 0
    # The same name pointing at other weights does not share.
    assert m.get_computed_blocks(Request("l3", p, lora_request=Lora("sql", 1, "/w2")))[1] == 0
    assert m.get_computed_blocks(Request("s", p, cache_salt="tenant"))[1] == 0
    schedule_prefill(m, Request("s1", p, cache_salt="tenant"))
    assert m.get_computed_blocks(Request("s2", p, cache_salt="tenant"))[1] == 8
    assert m.get_computed_blocks(Request("s3", p, cache_salt="other"))[1] == 0


def test_multimodal_inputs_enter_the_hash_of_the_blocks_they_cover():
    m = make()
    p = list(range(13))
    schedule_prefill(m, Request("a", p, mm_features=[Feature("img0", Position(5, 2))]))
    same = Request("b", p, mm_features=[Feature("img0", Position(5, 2))])
    assert m.get_computed_blocks(same)[1] == 12
    other = Request("c", p, mm_features=[Feature("img1", Position(5, 2))])
    assert m.get_computed_blocks(other)[1] == 4  # the block before the image still hits


def test_no_duplicate_blocks_are_cached_or_announced():
    m = make(enable_kv_cache_events=True)
    p = list(range(9))
    # Both are admitted in one step before either is cached: vLLM would cache
    # both physical copies of the first blocks; here the second copy is not.
    a, b = Request("a", p), Request("b", p)
    new_a = m.allocate_slots(a, 9)
    new_b = m.allocate_slots(b, 9)
    assert set(new_a.get_block_ids()[0]).isdisjoint(new_b.get_block_ids()[0])
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    assert len(stored) == 1 and len(stored[0].block_hashes) == 2
    assert m.manager.stats()["cached_blocks"] == 2


def test_delay_cache_blocks_defers_sharing_until_cache_blocks():
    m = make()
    req = Request("a", list(range(9)))
    m.allocate_slots(req, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
    assert m.get_computed_blocks(Request("b", list(range(9))))[1] == 0
    req.num_computed_tokens = 8
    m.cache_blocks(req, 8)
    assert m.get_computed_blocks(Request("b", list(range(9))))[1] == 8


def test_full_sequence_must_fit_checks_the_whole_prompt_fits():
    """As in vLLM: the whole sequence must fit in the free blocks, but only
    the step's blocks are taken."""
    m = make(num_blocks=4)
    req = Request("a", list(range(15)))
    new = m.allocate_slots(req, 4, full_sequence_must_fit=True)
    assert len(new.get_block_ids()[0]) == 1
    # 3 blocks free: a 13-token request (4 blocks) does not fit as a whole...
    big = Request("b", list(range(100, 113)))
    assert m.allocate_slots(big, 4, full_sequence_must_fit=True) is None
    assert m.manager.num_free_blocks == 3
    # ...but its first chunk does without the check.
    assert len(m.allocate_slots(big, 4).get_block_ids()[0]) == 1


def test_lookahead_slots_are_allocated_as_vllm_does():
    """vLLM's test_allocate_with_lookahead: a step needs
    ceil((computed + new + lookahead) / block_size) blocks in all."""
    for new, lookahead, blocks in [(3, 2, 2), (3, 4, 2), (3, 6, 3)]:
        m = make(num_blocks=10)
        req = Request("a", [1, 2, 3])
        got = m.allocate_slots(req, new, num_lookahead_tokens=lookahead)
        assert len(got.get_block_ids()[0]) == blocks
        m.manager._check_invariants()


def test_speculative_decoding_reserves_draft_and_lookahead_slots():
    m = make(num_blocks=8)
    req = Request("a", list(range(4)))
    schedule_prefill(m, req)  # 1 block
    # A decode step verifying 2 draft tokens, with 2 lookahead slots for the
    # drafter: 4 computed + 1 + 2 drafts + 2 lookahead = 9 slots, 3 blocks.
    req.all_token_ids.append(100)
    new = m.allocate_slots(req, 3, num_lookahead_tokens=2)
    assert len(new.get_block_ids()[0]) == 2
    table = m.get_block_ids("a")[0]
    assert len(table) == 3 and 0 not in table
    # One draft accepted plus the bonus token: they fill the reserved room.
    req.num_computed_tokens = 5
    req.all_token_ids += [101, 102]
    assert m.allocate_slots(req, 2).get_block_ids() == ([],)
    req.num_computed_tokens = 7
    assert m.get_block_ids("a") == (table,)
    # The block the accepted tokens filled is cached for follow-ups.
    assert m.get_computed_blocks(Request("b", req.all_token_ids[:8] + [5]))[1] == 4
    m.manager._check_invariants()


def test_lookahead_that_does_not_fit_changes_nothing():
    m = make(num_blocks=4)
    req = Request("a", list(range(4)))
    schedule_prefill(m, req)
    schedule_prefill(m, Request("b", list(range(100, 108))))  # 1 block left
    req.all_token_ids.append(9)
    # 4 computed + 1 + 8 lookahead = 13 slots: 3 more blocks, 1 free.
    assert m.allocate_slots(req, 1, num_lookahead_tokens=8) is None
    assert len(m.get_block_ids("a")[0]) == 1 and m.manager.num_free_blocks == 1
    assert m.allocate_slots(req, 1, num_lookahead_tokens=3).get_block_ids() == ([4],)
    m.manager._check_invariants()


def test_evict_blocks_after_a_failed_kv_load():
    """vLLM's scheduler, on a KV load failure with the fail policy, evicts
    the failed block and every block after it from the prefix cache, then
    fails the requests holding them."""
    m = make(num_blocks=8, enable_kv_cache_events=True)
    a = Request("a", list(range(13)))
    schedule_prefill(m, a)  # blocks 0, 1, 2 cached, 3 partial
    m.take_events()
    table = m.get_block_ids("a")[0]
    m.evict_blocks(set(table[1:]))
    removed = [h for e in m.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert len(removed) == 2
    # Later requests hit only the block before the failure.
    assert m.get_computed_blocks(Request("b", list(range(13))))[1] == 4
    assert m.get_block_ids("a") == (table,)  # a still holds its blocks
    m.free(a)
    # Freed, the evicted blocks are reused before the cached one.
    new, hit = schedule_prefill(m, Request("c", list(range(500, 528))))
    assert hit == 0 and table[0] not in new.get_block_ids()[0]
    assert m.get_computed_blocks(Request("d", list(range(13))))[1] == 4
    # Free cached blocks can be evicted too; unknown ids are skipped, bad ones refused.
    m.free(Request("c", []))
    m.evict_blocks([table[0]])
    assert m.get_computed_blocks(Request("d", list(range(13))))[1] == 0
    m.evict_blocks(set())
    with pytest.raises(ValueError, match="block ids must be in"):
        m.evict_blocks({9})
    with pytest.raises(ValueError, match="block ids must be in"):
        m.evict_blocks({0})  # the null block
    m.manager._check_invariants()


def test_stale_hit_is_an_error_not_silent_reuse():
    m = make(num_blocks=4)
    a = Request("a", list(range(9)))
    schedule_prefill(m, a)
    m.free(a)
    b = Request("b", list(range(9)))
    blocks, hit, _ = m.get_computed_blocks(b)
    c = Request("c", list(range(100, 116)))
    schedule_prefill(m, c)  # evicts everything
    m.free(c)
    with pytest.raises(RuntimeError, match="prefix hit changed"):
        m.allocate_slots(b, b.num_tokens - hit, hit, blocks)
    assert m.get_blocks("b").get_block_ids() == ([],)
    m.manager._check_invariants()


def test_argument_errors():
    m = make()
    req = Request("a", list(range(9)))
    with pytest.raises(ValueError, match="num_new_tokens"):
        m.allocate_slots(req, 0)
    with pytest.raises(ValueError, match="encoder"):
        m.allocate_slots(req, 9, num_encoder_tokens=3)
    with pytest.raises(ValueError, match="does not match"):
        m.allocate_slots(req, 5, 4, None)
    with pytest.raises(ValueError):
        m.allocate_slots(Request("huge", list(range(100))), 100)
    m.allocate_slots(req, 9)
    with pytest.raises(ValueError, match="running request"):
        m.allocate_slots(req, 1, 4, KVCacheBlocks(([],)))


def test_reset_prefix_cache_only_when_idle_and_events():
    m = make(enable_kv_cache_events=True, log_stats=True)
    req = Request("a", list(range(13)))
    schedule_prefill(m, req)
    assert not m.reset_prefix_cache()
    m.free(req)
    m.free(req)  # freeing twice is harmless, as in vLLM
    assert m.reset_prefix_cache()
    events = m.take_events()
    assert isinstance(events[-1], AllBlocksCleared)
    assert m.get_computed_blocks(Request("b", list(range(13))))[1] == 0
    assert m.make_prefix_cache_stats().reset
    assert not m.make_prefix_cache_stats().reset


def test_eviction_is_reported_with_lora_names():
    m = make(num_blocks=3, enable_kv_cache_events=True)
    a = Request("a", list(range(9)), lora_request=Lora("sql", 7))
    schedule_prefill(m, a)
    m.free(a)
    stored = m.take_events()
    assert [(e.lora_name, e.lora_id) for e in stored] == [("sql", 7)]
    schedule_prefill(m, Request("b", list(range(50, 59))))
    removed = [e for e in m.take_events() if isinstance(e, BlockRemoved)]
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(stored[0].block_hashes)


def test_prefix_cache_stats_split_preempted_requests():
    m = make(log_stats=True)
    a = Request("a", list(range(9)))
    schedule_prefill(m, a)
    m.record_prefix_cache_stats(a, 0)
    b = Request("b", list(range(9)), num_preemptions=1)
    _, hit = schedule_prefill(m, b)
    m.record_prefix_cache_stats(b, hit)
    s = m.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits) == (1, 9, 0)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 9, 8)
    # A request without vLLM's fields: an error, nothing counted.
    with pytest.raises(AttributeError):
        m.record_prefix_cache_stats(object(), 3)
    assert m.prefix_cache_stats.requests == m.prefix_cache_stats.preempted_requests == 0
    assert make().make_prefix_cache_stats() is None
    off = make(log_stats=True, enable_caching=False)
    off.record_prefix_cache_stats(a, 0)
    assert off.make_prefix_cache_stats().requests == 0


def test_block_objects_and_results_behave_like_vllms():
    m = make()
    new, _ = schedule_prefill(m, Request("a", list(range(9))))
    assert [b.block_id for b in new.blocks[0]] == [1, 2, 3]
    assert not new.blocks[0][0].is_null
    assert m.block_pool.null_block.is_null and m.block_pool.null_block.block_id == 0
    assert m.empty_kv_cache_blocks.get_block_ids(allow_none=True) is None
    assert new.new_empty().get_block_ids() == ([],)
    assert new.get_block_ids(group_ids=[0]) == ([1, 2, 3],)
    # Two full blocks are cached, the third (one token) is not.
    assert new.get_unhashed_block_ids() == [3]
    assert m.get_num_common_prefix_blocks("a") == [0]
    assert m.get_block_ids("unknown") == ([],)


def test_caching_disabled_shares_nothing():
    m = make(enable_caching=False)
    schedule_prefill(m, Request("a", list(range(9))))
    assert m.get_computed_blocks(Request("b", list(range(9))))[1] == 0


def test_scheduler_loop_keeps_the_manager_consistent():
    """Many requests with shared prefixes through admission, chunked prefill,
    decode, preemption and finish; invariants hold and everything is freed."""
    m = make(num_blocks=24)
    system = list(range(1000, 1008))
    waiting = [Request(f"r{i}", system + [i] * (3 + i % 5)) for i in range(12)]
    running: List[Request] = []
    out_left = {r.request_id: 3 + i % 4 for i, r in enumerate(waiting)}
    hits = 0
    step = 0
    while waiting or running:
        step += 1
        assert step < 500
        for r in list(running):
            if r not in running:  # preempted earlier in this step
                continue
            if r.num_computed_tokens < r.num_tokens:
                new = m.allocate_slots(r, min(4, r.num_tokens - r.num_computed_tokens))
                if new is not None:
                    r.num_computed_tokens += min(4, r.num_tokens - r.num_computed_tokens)
                continue
            if out_left[r.request_id] == 0:
                m.free(r)
                running.remove(r)
                continue
            if decode(m, r, 7000 + step) is None:
                victim = running.pop()
                m.free(victim)
                victim.num_computed_tokens = 0
                victim.num_preemptions += 1
                waiting.insert(0, victim)
                continue
            out_left[r.request_id] -= 1
        while waiting:
            r = waiting[0]
            new, hit = schedule_prefill(m, r, budget=4)
            if new is None:
                break
            hits += hit
            running.append(waiting.pop(0))
        m.manager._check_invariants()
    assert hits > 0
    assert m.manager.num_free_blocks == 24


def test_deferred_free_returns_blocks_only_through_the_pool():
    """vLLM's async path: pop_blocks_for_free detaches a request but its
    blocks stay allocated until they come back to block_pool.free_blocks."""
    m = make(num_blocks=4)
    a = Request("a", list(range(8)))
    schedule_prefill(m, a)
    popped = m.pop_blocks_for_free(a)
    assert [b.block_id for b in popped] == [1, 2]
    assert m.get_block_ids("a") == ([],)
    assert m.manager.num_free_blocks == 2
    # The same request readmitted meanwhile (a preemption) gets other blocks.
    again = Request("a", list(range(100, 104)))
    new, hit = schedule_prefill(m, again)
    assert hit == 0 and not {1, 2} & set(new.get_block_ids()[0])
    assert m.manager.num_free_blocks == 1
    m.block_pool.free_blocks(reversed(popped))
    assert m.manager.num_free_blocks == 3
    # Freed blocks stay cached: a request with a's prefix hits them.
    assert m.get_computed_blocks(Request("b", list(range(9))))[1] == 8
    with pytest.raises(ValueError, match="already freed"):
        m.block_pool.free_blocks(popped)
    with pytest.raises(ValueError, match="pop_blocks_for_free"):
        m.block_pool.free_blocks([m.block_pool.blocks[3]])
    m.block_pool.free_blocks([])
    assert m.pop_blocks_for_free(Request("unknown", [])) == []
    m.manager._check_invariants()


def test_caching_waits_for_vllms_block_hashes():
    """Blocks become shareable only as far as vLLM has hashed the request
    (hash lookahead lags by a block), whichever call brought the tokens."""

    class Lagging(Request):
        @property
        def block_hashes(self) -> List[bytes]:
            return super().block_hashes[: max(0, self.num_tokens // BS - 1)]

    m = make()
    r = Lagging("a", list(range(12)))
    # Prefill with room for 4 more tokens (drafts verified next step).
    assert len(m.allocate_slots(r, 12, num_lookahead_tokens=4).get_block_ids()[0]) == 4
    r.num_computed_tokens = 12
    assert m.get_computed_blocks(Request("x", list(range(13))))[1] == 8
    # Tokens the scheduler never passed through allocate_slots (accepted
    # drafts, async output) are cached by cache_blocks.
    r.all_token_ids += [50, 51, 52, 53]
    m.cache_blocks(r, 16)
    assert m.get_computed_blocks(Request("y", list(range(12)) + [50, 51, 52, 53, 9]))[1] == 12
    assert m.estimate_cached_tokens(r) == 12


def snapshot(m, req):
    """What a failed native call must leave as it was."""
    t = m._requests[req.request_id]
    return (
        m.get_block_ids(req.request_id),
        t.appended,
        t.cached_blocks,
        t.next_cache,
        [b.block_hash for b in t.blocks],
        m.manager.stats(),
    )


class BadDigests(Request):
    """A request whose ``block_hashes`` the adapter must refuse."""

    digests: list = []

    @property
    def block_hashes(self):
        return self.digests


@pytest.mark.parametrize(
    "digests, error",
    [([b"short", b"short"], ValueError), (["not bytes", "not bytes"], TypeError), ((b"x" * 32,) * 2, TypeError)],
)
def test_bad_digests_raise_in_the_native_hot_path_and_change_nothing(digests, error):
    m = make()
    req = BadDigests("a", list(range(6)))
    # Admitted with no full block hashed, so nothing is committed yet.
    req.digests = []
    assert m.allocate_slots(req, 6) is not None
    req.num_computed_tokens = 6
    before = snapshot(m, req)
    req.digests = digests
    req.all_token_ids += [7, 8]
    with pytest.raises(error):
        m.cache_blocks(req, 8)
    with pytest.raises(error):
        m.allocate_slots(req, 2)  # the decode step's commit
    assert snapshot(m, req) == before
    with pytest.raises(error):
        m.allocate_slots(req, 2, num_lookahead_tokens=4)  # a step that grows the table
    assert snapshot(m, req) == before
    m.manager._check_invariants()


def test_native_base_refuses_bad_arguments_and_changes_nothing():
    m = make()
    req = Request("a", list(range(9)))
    schedule_prefill(m, req)
    before = snapshot(m, req)
    with pytest.raises(TypeError):
        m.allocate_slots(req, "1")
    with pytest.raises(ValueError, match="no new prefix hits"):
        m.allocate_slots(req, 1, BS, m.get_blocks("a"))
    with pytest.raises(TypeError):
        m.get_computed_blocks(req, max_cache_hit_length="8")
    with pytest.raises(AttributeError):
        m.free(object())
    assert snapshot(m, req) == before
    # The native per-step calls, as the scheduler makes them.
    assert m.take_new_block_ids() == [] and m.take_kv_cache_block_copies() == ([], [])
    assert m.take_boundary_state_offloads() == {} and m.take_events() == []
    assert m.make_prefix_cache_stats() is None and m.new_step_starts() is None


def admission_state(m):
    """What a failed admission must leave as it was."""
    return (
        sorted(m._requests.keys()),
        m.manager.num_free_blocks,
        m.manager.stats(),
        [b.block_hash for b in m.block_pool.blocks],
    )


class _Block:
    """A block object naming any block id."""

    def __init__(self, block_id):
        self.block_id = block_id


def test_admission_refuses_bad_input_and_changes_nothing():
    m = make()
    a = Request("a", list(range(13)))
    schedule_prefill(m, a)
    m.free(a)  # three cached blocks, free
    b = Request("b", list(range(12)) + [50, 51])
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 12
    before = admission_state(m)
    n = b.num_tokens - hit
    bad = [
        (ValueError, "must be greater than 0", (b, 0)),
        (ValueError, "encoder", (b, n, hit, blocks), {"num_encoder_tokens": 3}),
        (ValueError, "does not match", (b, n, hit + BS, blocks)),
        (ValueError, "does not match", (b, n, hit - 1, blocks)),
        (OverflowError, "num_new_computed_tokens", (b, n, -BS, None)),
        (ValueError, "not a cache block", (b, n, BS, KVCacheBlocks(([m.block_pool.null_block],)))),
        (ValueError, "not a cache block", (b, n, BS, KVCacheBlocks(([_Block(17)],)))),
        (TypeError, "must be a KVCacheBlocks", (b, n, hit, "not blocks")),
        (TypeError, None, (b, n, BS, KVCacheBlocks(([_Block("1")],)))),
        # Blocks that are not the hit: the block manager finds another one.
        (RuntimeError, "prefix hit changed", (b, n, BS, KVCacheBlocks(([_Block(3)],)))),
    ]
    for case in bad:
        error, match, args = case[0], case[1], case[2]
        kw = case[3] if len(case) > 3 else {}
        with pytest.raises(error, match=match):
            m.allocate_slots(*args, **kw)
        assert admission_state(m) == before, case
    # Digests the block manager refuses, of the hit or past it.
    for digests in ([b"short"] * 3, ["not bytes"] * 3, b.block_hashes[:3] + [b"short"]):
        bd = BadDigests("b", list(b.all_token_ids) + [60, 61])
        bd.digests = digests
        with pytest.raises((TypeError, ValueError)):
            m.allocate_slots(bd, bd.num_tokens - hit, hit, blocks)
        assert admission_state(m) == before, digests
    # The hit evicted since the lookup.
    assert m.reset_prefix_cache()
    before = admission_state(m)
    with pytest.raises(RuntimeError, match="prefix hit changed"):
        m.allocate_slots(b, n, hit, blocks)
    assert admission_state(m) == before
    m.manager._check_invariants()
    # The same request, right, is admitted afterwards.
    assert m.allocate_slots(b, b.num_tokens) is not None


def test_a_refused_admission_counts_the_hits_free_blocks():
    """vLLM's check: the new blocks and the hit's free ones must fit."""
    m = make(num_blocks=6)
    a = Request("a", list(range(13)))
    schedule_prefill(m, a)
    m.free(a)  # blocks 1-3 cached and free, 6 free in all
    b = Request("b", list(range(12)) + list(range(100, 112)))
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 12
    before = admission_state(m)
    # 3 new blocks (24 tokens) plus the 3 free hit blocks: 6, all there are.
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks, reserved_blocks=1) is None
    assert admission_state(m) == before
    new = m.allocate_slots(b, b.num_tokens - hit, hit, blocks)
    assert sorted(new.get_block_ids()[0]) == [4, 5, 6] and m.manager.num_free_blocks == 0


def test_an_unbound_native_base_raises_instead_of_crashing():
    base = mla_cache._native.VllmManagerBase()
    with pytest.raises(RuntimeError, match="_bind"):
        base.get_blocks("a")
    manager = mla_cache.BlockManager(small_config(8, BS))
    # A block of one token would be filled by the token past a hit.
    for block_size in (0, 1):
        with pytest.raises(ValueError, match="block size must be at least 2"):
            base._bind(manager, [None, None], None, KVCacheBlocks, dict, block_size=block_size,
                       max_model_len=64, num_reprefillable_tokens=0, enable_caching=True,
                       use_eagle=False, log_stats=False, enable_kv_cache_events=False)
    with pytest.raises(ValueError, match="null block"):
        base._bind(manager, [None], None, KVCacheBlocks, dict, block_size=BS, max_model_len=64,
                   num_reprefillable_tokens=0, enable_caching=True, use_eagle=False,
                   log_stats=False, enable_kv_cache_events=False)
    with pytest.raises(TypeError, match="KVCacheBlock objects, got NoneType"):
        base._bind(manager, [None, None], None, KVCacheBlocks, dict, block_size=BS, max_model_len=64,
                   num_reprefillable_tokens=0, enable_caching=True, use_eagle=False,
                   log_stats=False, enable_kv_cache_events=False)
    with pytest.raises(RuntimeError, match="_bind"):
        base.allocate_slots(Request("a", [1]), 1)


def test_get_blocks_is_one_live_view_per_admission():
    m = make()
    req = Request("a", list(range(BS)))
    schedule_prefill(m, req)
    view = m.get_blocks("a")
    assert m.get_blocks("a") is view and view.get_block_ids() == ([1],)
    decode(m, req, 100)  # the second block: the same view shows it
    assert m.get_blocks("a") is view and view.get_block_ids() == m.get_block_ids("a") == ([1, 2],)
    m.free(req)
    assert m.get_blocks("a") is m.empty_kv_cache_blocks
    req.num_computed_tokens = 0
    schedule_prefill(m, req)
    assert m.get_blocks("a") is not view, "a re-admission gets a view of its own"
    assert view.get_block_ids() == ([1, 2],), "an old view keeps its blocks, as vLLM's does"


def test_an_admission_short_of_blocks_through_its_free_hit_touches_nothing():
    """As vLLM counts them, a hit's free blocks leave the free pool when
    admitted: a request they make short is refused before anything changes
    (no admission, no lookup counted, the hit's place in the LRU kept)."""
    m = make(num_blocks=6)
    a = Request("a", list(range(12)))
    schedule_prefill(m, a)
    m.free(a)  # its 3 full blocks stay cached, free
    schedule_prefill(m, Request("h", list(range(100, 108))))  # 2 blocks held
    b = Request("b", list(range(12)) + [50] * 8)  # 5 blocks, a's 3 a hit
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 12 and m.manager.num_free_blocks == 4
    before = m.manager.stats()
    # 2 new blocks and the 3 free hit blocks: 5 > 4 free.
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks) is None
    assert m.manager.stats() == before and "b" not in m._requests
    assert m.get_computed_blocks(b)[1] == 12
