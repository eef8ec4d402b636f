"""vLLM 0.33's real scheduler, driven the same way with vLLM's KV cache manager
and with ``mla_cache.vllm.KVCacheManager``, must make the same decisions step
by step: tokens scheduled per request, draft tokens verified, prefix hits,
preemptions, finished requests, free blocks and prefix-cache stats."""

from __future__ import annotations

import random

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

import mla_cache.vllm as ours
from mla_cache import CacheConfig
from harness import Driver, RequestStatus, decisions, make_request, make_scheduler

BS = 16


def both(build, scenario):
    """Runs ``scenario(driver)`` on a scheduler from ``build(adapter)`` with each
    manager; returns the two drivers (stock first)."""
    drivers = []
    for adapter in (False, True):
        d = build(adapter)
        scenario(d)
        drivers.append(d)
    return drivers


def assert_same(stock: Driver, adapter: Driver) -> None:
    a, b = decisions(stock.records), decisions(adapter.records)
    for step, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"step {step}: stock {x} != adapter {y}"
    assert len(a) == len(b)


def shared_prefix_requests(n: int, seed: int, prompt_blocks=(2, 9), max_tokens=(1, 24)):
    """Requests over a few shared system prompts, with private tails."""
    rng = random.Random(seed)
    systems = [[rng.randrange(3, 1000) for _ in range(BS * rng.randint(1, 4))] for _ in range(3)]
    out = []
    for i in range(n):
        prompt = list(rng.choice(systems)) + [
            rng.randrange(3, 1000) for _ in range(rng.randint(1, BS * prompt_blocks[1]))
        ]
        out.append((i // 2, f"r{i}", prompt, rng.randint(*max_tokens)))
    return out


def arrivals(specs, **kw):
    by_step = {}
    for step, rid, prompt, max_tokens in specs:
        by_step.setdefault(step, []).append(make_request(rid, prompt, max_tokens=max_tokens, **kw))
    return by_step


def test_the_scheduler_builds_the_adapter_with_its_own_keywords():
    s = make_scheduler(True)
    km = s.kv_cache_manager
    assert isinstance(km, ours.KVCacheManager)
    assert km.block_pool.num_gpu_blocks == 1000
    # vLLM's null block is counted and never free.
    assert km.block_pool.get_num_free_blocks() == 999
    assert km.block_pool.null_block.is_null


@pytest.mark.parametrize(
    "spec, name",
    [
        (FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=64, dtype=torch.bfloat16), "8 KV heads"),
        (
            SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, sliding_window=128),
            "SlidingWindowSpec",
        ),
    ],
)
def test_layouts_mla_does_not_have_fail_at_construction(spec, name):
    with pytest.raises(ours.UnsupportedLayout, match=name):
        make_scheduler(True, kv_cache_spec=spec)


def test_full_attention_with_one_head_is_accepted():
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    assert isinstance(make_scheduler(True, kv_cache_spec=spec).kv_cache_manager, ours.KVCacheManager)


def test_same_schedule_with_shared_prefixes():
    specs = shared_prefix_requests(24, seed=1)
    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=1000, max_num_batched_tokens=256)),
        lambda d: d.run(arrivals(specs)),
    )
    assert_same(stock, adapter)
    assert sum(sum(r.new_hits.values()) for r in stock.records) > 0, "no prefix hit exercised"


def test_same_preemptions_under_block_pressure():
    specs = shared_prefix_requests(20, seed=2, max_tokens=(20, 60))
    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=40, max_num_batched_tokens=128)),
        lambda d: d.run(arrivals(specs)),
    )
    assert any(r.preempted for r in stock.records), "no preemption exercised"
    assert_same(stock, adapter)


def test_the_null_block_is_never_handed_out():
    specs = shared_prefix_requests(20, seed=3, max_tokens=(20, 60))
    d = Driver(make_scheduler(True, num_blocks=40, max_num_batched_tokens=128))
    d.run(arrivals(specs))
    used = {b for ids in d.block_ids.values() for b in ids}
    assert 0 not in used
    assert max(used) == 39, "every block but the null one should have been used"


def test_same_schedule_without_prefix_caching_and_no_stats():
    specs = shared_prefix_requests(12, seed=4)
    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, enable_prefix_caching=False)),
        lambda d: d.run(arrivals(specs)),
    )
    assert_same(stock, adapter)
    assert all(not r.new_hits or not any(r.new_hits.values()) for r in adapter.records)
    assert all(r.prefix_stats in ((), (0,) * 6) for r in adapter.records)


def test_same_spec_decode_acceptance_and_rejection():
    specs = shared_prefix_requests(8, seed=5, max_tokens=(10, 30))
    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_speculative_tokens=3), num_spec=3),
        lambda d: d.run(arrivals(specs)),
    )
    assert_same(stock, adapter)
    verified = [r for r in stock.records if r.spec]
    assert verified, "no draft tokens verified"


def test_same_spec_decode_under_pressure():
    specs = shared_prefix_requests(12, seed=6, max_tokens=(20, 40))
    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=30, num_speculative_tokens=3), num_spec=3),
        lambda d: d.run(arrivals(specs)),
    )
    assert any(r.preempted for r in stock.records), "no preemption exercised"
    assert_same(stock, adapter)


def test_same_priority_preemption():
    def scenario(d: Driver):
        low = make_request("low", list(range(3, 3 + 5 * BS)), max_tokens=60, priority=10)
        high = make_request("high", list(range(500, 500 + 5 * BS)), max_tokens=60, priority=0, arrival_time=1.0)
        d.run({0: [low], 3: [high]})

    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=14, policy="priority")), scenario
    )
    assert "low" in {p for r in stock.records for p in r.preempted}
    assert "high" not in {p for r in stock.records for p in r.preempted}
    assert_same(stock, adapter)


def test_same_abort_mid_prefill():
    def scenario(d: Driver):
        d.scheduler.add_request(make_request("long", list(range(3, 3 + 20 * BS)), max_tokens=4))
        d.scheduler.add_request(make_request("short", list(range(3, 3 + 3 * BS)), max_tokens=4))
        d.step()  # the first chunk of "long"
        assert d.scheduler.requests["long"].num_computed_tokens < 20 * BS
        d.scheduler.finish_requests("long", RequestStatus.FINISHED_ABORTED)
        d.run({0: [make_request("after", list(range(3, 3 + 4 * BS)), max_tokens=4)]})

    stock, adapter = both(lambda a: Driver(make_scheduler(a, max_num_batched_tokens=64)), scenario)
    assert_same(stock, adapter)
    # Everything is back: only cached blocks remain, and all are free.
    assert adapter.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 999


def test_async_frees_wait_for_the_in_flight_step(tmp_path):
    """With async scheduling and a KV consumer, vLLM defers a finished
    request's free until the in-flight step that writes its blocks is done."""

    def scenario(d: Driver):
        s = d.scheduler
        assert s.defer_block_free
        s.add_request(make_request("a", list(range(3, 3 + 4 * BS)), max_tokens=30))
        d.update(d.schedule())
        in_flight = d.schedule()  # "a" decodes in this step, not yet processed
        a_blocks = set(d.block_ids["a"])
        s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
        s.add_request(make_request("b", list(range(600, 600 + 4 * BS)), max_tokens=4))
        waiting = d.schedule()
        # "b" needs blocks only "a" can give back: it waits for the fence.
        assert "b" not in waiting.num_scheduled_tokens
        d.update(in_flight)
        d.update(waiting)
        later = d.schedule()
        assert "b" in later.num_scheduled_tokens
        assert a_blocks & set(d.block_ids["b"]), "the test should reuse a's blocks"
        d.update(later)
        d.run({})

    stock, adapter = both(
        lambda a: Driver(
            make_scheduler(
                a, num_blocks=8, async_scheduling=True, enable_prefix_caching=False,
                connector_storage=str(tmp_path / ("ours" if a else "stock")),
            )
        ),
        scenario,
    )
    assert_same(stock, adapter)


def test_same_recovery_from_a_connector_load_failure(tmp_path):
    """An external hit whose load fails: the scheduler evicts the bad block
    and recomputes the request from before it."""
    prompt = list(range(3, 3 + 6 * BS + 5))

    def scenario(d: Driver):
        conn = d.scheduler.connector
        # The connector's own record that it holds the prompt's first 6 blocks.
        conn._generate_foldername_debug(torch.tensor(prompt[: 6 * BS]), [], create_folder=True)
        d.scheduler.add_request(make_request("x", prompt, max_tokens=4))
        out = d.schedule()
        assert out.num_scheduled_tokens["x"] == 5, "the external hit should be used"
        mo = d.model_output(out)
        mo.kv_connector_output = KVConnectorOutput(invalid_block_ids={d.block_ids["x"][2]})
        d.update(out, mo)
        d.run({})

    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, connector_storage=str(tmp_path / ("ours" if a else "stock")))),
        scenario,
    )
    assert_same(stock, adapter)
    assert sum(r.scheduled.get("x", 0) for r in stock.records) > 5, "no recompute happened"


def test_same_async_schedule():
    specs = shared_prefix_requests(16, seed=7, max_tokens=(5, 30))

    def scenario(d: Driver):
        by_step = arrivals(specs)
        pending = None
        for s in range(400):
            for r in by_step.get(s, ()):
                d.scheduler.add_request(r)
            if s > max(by_step) and not d.scheduler.has_unfinished_requests():
                if pending is not None:
                    d.update(pending)
                return
            out = d.schedule()  # the next step is scheduled before the last one's output
            if pending is not None:
                d.update(pending)
            pending = out
        raise AssertionError("did not finish")

    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=60, async_scheduling=True, max_num_batched_tokens=128)),
        scenario,
    )
    assert_same(stock, adapter)


def adapter_with_events():
    km = make_scheduler(True).kv_cache_manager
    return ours.KVCacheManager(
        km.kv_cache_config,
        max_model_len=4096,
        scheduler_block_size=BS,
        hash_block_size=BS,
        enable_kv_cache_events=True,
        # A fixed hash seed (the default is random per manager), so another
        # surface computes the same hashes.
        cache_config=CacheConfig.preset("deepseek-v3", num_blocks=999, hash_seed=7),
    )


def test_events_go_out_through_vllms_publisher_and_decode_as_its_classes(tmp_path):
    import msgspec
    import zmq
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher

    km = adapter_with_events()
    tokens = list(range(3, 3 + 3 * BS + 2))
    r = make_request("e", tokens, max_tokens=4)
    assert km.allocate_slots(r, r.num_tokens) is not None
    km.evict_blocks(km.get_block_ids("e")[0][2:3])
    events = km.take_events()
    assert [type(e) for e in events] == [BlockStored, BlockRemoved]

    endpoint = f"ipc://{tmp_path}/events"
    pub = ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        frames = None
        for _ in range(50):  # a subscriber joins late: publish until one arrives
            pub.publish(KVEventBatch(ts=1.0, events=events))
            if sub.poll(100):
                frames = sub.recv_multipart()
                break
        assert frames is not None, "nothing published"
    finally:
        pub.shutdown()
        sub.close(linger=0)
    batch = msgspec.msgpack.Decoder(type=KVEventBatch).decode(frames[2])
    stored, removed = batch.events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    # vLLM's own 64-bit external hashes of the request's digests.
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    assert stored.block_hashes == [maybe_convert_block_hash(h) for h in r.block_hashes[:3]]
    assert all(0 <= h < 1 << 64 for h in stored.block_hashes)
    assert stored.token_ids == tokens[: 3 * BS] and stored.parent_block_hash is None
    assert stored.kv_cache_spec_kind == "mla_attention"
    assert removed.block_hashes == stored.block_hashes[2:]


@pytest.mark.parametrize("prompt_len", [32, 33, 34, 35, 48])
def test_mtp_reprefill_tail_is_not_cached_as_in_vllm(prompt_len):
    """Multi-module MTP (``num_prefill_lookahead``) may prefill a request's
    last tokens again: both managers leave them out of the cache."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager as Stock

    config = make_scheduler(False).kv_cache_manager.kv_cache_config
    hits = []
    for cls in (Stock, ours.KVCacheManager):
        km = cls(
            kv_cache_config=config,
            max_model_len=4096,
            scheduler_block_size=BS,
            hash_block_size=BS,
            num_prefill_lookahead=3,
        )
        prompt = list(range(3, 3 + prompt_len))
        r = make_request("a", prompt, max_tokens=4)
        assert km.allocate_slots(r, r.num_tokens) is not None
        probe = make_request("b", prompt + [7] * BS, max_tokens=4)
        hits.append(km.get_computed_blocks(probe)[1])
    assert hits[0] == hits[1], f"stock {hits[0]} != adapter {hits[1]}"
    # The last 2 tokens wait: a full block right at the end is not cached yet.
    assert hits[0] == BS * ((prompt_len - 2) // BS)


@pytest.mark.parametrize("prompt_len, probe_len", [(48, 64), (64, 80), (64, 50), (20, 40)])
def test_eagle_hits_drop_their_last_block_as_in_vllm(prompt_len, probe_len):
    """With ``use_eagle`` a hit gives up its last block (EAGLE recomputes it)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager as Stock

    config = make_scheduler(False).kv_cache_manager.kv_cache_config
    hits = []
    for cls in (Stock, ours.KVCacheManager):
        km = cls(
            kv_cache_config=config,
            max_model_len=4096,
            scheduler_block_size=BS,
            hash_block_size=BS,
            use_eagle=True,
        )
        base = list(range(3, 3 + max(prompt_len, probe_len)))
        r = make_request("a", base[:prompt_len], max_tokens=4)
        assert km.allocate_slots(r, r.num_tokens) is not None
        hits.append(km.get_computed_blocks(make_request("b", base[:probe_len], max_tokens=4))[1])
    assert hits[0] == hits[1], f"stock {hits[0]} != adapter {hits[1]}"
    matched = min(prompt_len // BS, (probe_len - 1) // BS)
    assert hits[0] == BS * max(matched - 1, 0)


def test_same_schedule_when_requests_skip_the_prefix_cache_and_after_a_reset():
    """A request asking for prompt logprobs skips the cache (no hit, no
    stats); ``reset_prefix_cache`` empties it."""
    prompt = list(range(3, 3 + 5 * BS))

    def scenario(d: Driver):
        d.run({0: [make_request("a", prompt, max_tokens=3)]})
        d.run({0: [make_request("b", prompt + [9], max_tokens=3, prompt_logprobs=1)]})
        d.run({0: [make_request("c", prompt + [9], max_tokens=3)]})
        assert d.scheduler.reset_prefix_cache()
        d.run({0: [make_request("d", prompt + [9], max_tokens=3)]})

    stock, adapter = both(lambda a: Driver(make_scheduler(a)), scenario)
    assert_same(stock, adapter)
    hits = {r: h for rec in adapter.records for r, h in rec.new_hits.items()}
    assert hits == {"a": 0, "b": 0, "c": 5 * BS, "d": 0}


def test_kv_cache_blocks_handed_out_follow_the_block_list_as_vllms_do():
    """``get_blocks`` hands out one ``KVCacheBlocks`` per admission, over the
    request's live block list: as the request grows, is preempted and
    admitted again, every object handed out earlier shows what vLLM's
    show (a live one its grown list, a freed admission's its last list)."""
    specs = shared_prefix_requests(20, seed=2, max_tokens=(20, 60))

    def scenario(d: Driver):
        km = d.scheduler.kv_cache_manager
        handed: dict = {}
        d.views = []
        by_step = arrivals(specs)
        for s in range(500):
            for r in by_step.get(s, ()):
                d.scheduler.add_request(r)
            if s > max(by_step) and not d.scheduler.has_unfinished_requests():
                return
            out = d.schedule()
            for rid in out.num_scheduled_tokens:
                v = km.get_blocks(rid)
                handed.setdefault(rid, []).append((v, len(v.get_block_ids()[0])))
            d.update(out)
            # Per object handed out: its length then and now.
            d.views.append(
                sorted((rid, [(then, len(v.get_block_ids()[0])) for v, then in views]) for rid, views in handed.items())
            )
        raise AssertionError("requests did not finish")

    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=40, max_num_batched_tokens=128)), scenario
    )
    assert any(r.preempted for r in stock.records), "no re-admission exercised"
    lens = [pair for step in stock.views for _, pairs in step for pair in pairs]
    assert any(then < now for then, now in lens), "no request grew after a hand-out"
    assert any(then > now for then, now in lens) or any(
        len({now for _, now in pairs}) > 1 for step in stock.views for _, pairs in step
    ), "no hand-out outlived its admission"
    assert_same(stock, adapter)
    for step, (x, y) in enumerate(zip(stock.views, adapter.views)):
        assert x == y, f"step {step}: stock {x} != adapter {y}"


def test_same_admissions_with_a_watermark_under_pressure():
    """vLLM keeps a watermark of free blocks when it admits a waiting or
    preempted request beside scheduled ones (read from the request's status)."""
    specs = shared_prefix_requests(20, seed=8, max_tokens=(20, 60))
    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=40, max_num_batched_tokens=128, watermark=0.2)),
        lambda d: d.run(arrivals(specs)),
    )
    assert_same(stock, adapter)
    # The watermark held some admission back: the same run without it
    # schedules differently.
    plain = Driver(make_scheduler(True, num_blocks=40, max_num_batched_tokens=128))
    plain.run(arrivals(shared_prefix_requests(20, seed=8, max_tokens=(20, 60))))
    assert decisions(plain.records) != decisions(adapter.records), "the watermark changed nothing"


def test_a_refused_admission_changes_nothing():
    """An admission whose hit's free blocks leave too few free is refused
    before anything changes: the free blocks, the cache and the request's hit
    stay as they were, with either manager."""
    shared = list(range(3, 3 + 4 * BS))

    def scenario(d: Driver):
        km = d.scheduler.kv_cache_manager
        d.run({0: [make_request("a", shared + [7], max_tokens=2)]})  # caches 4 blocks, frees them
        d.scheduler.add_request(make_request("big", list(range(500, 500 + 12 * BS)), max_tokens=30))
        d.step()
        late = make_request("late", shared + list(range(900, 900 + 3 * BS)), max_tokens=4)
        blocks, hit = km.get_computed_blocks(late)[:2]
        before = (km.block_pool.get_num_free_blocks(), km.get_block_ids("late"))
        # The hit's 4 blocks are free (cached): they count as taken.
        assert km.allocate_slots(late, late.num_tokens - hit, hit, blocks) is None
        after = (km.block_pool.get_num_free_blocks(), km.get_block_ids("late"))
        d.refused = (hit, before, after, km.get_computed_blocks(late)[1])
        d.run({})

    stock, adapter = both(lambda a: Driver(make_scheduler(a, num_blocks=19)), scenario)
    assert stock.refused == adapter.refused
    hit, before, after, hit_again = adapter.refused
    assert hit == 4 * BS and before == after and hit_again == hit
    assert_same(stock, adapter)


def test_same_readmission_after_preemption_with_its_prefix_hit():
    """A preempted request is admitted again with the hit its own cached
    blocks give (counted as a preempted request in the stats)."""

    def scenario(d: Driver):
        a = make_request("a", list(range(3, 3 + 5 * BS)), max_tokens=60)
        b = make_request("b", list(range(500, 500 + 5 * BS)), max_tokens=60)
        d.run({0: [a], 1: [b]})

    stock, adapter = both(lambda a: Driver(make_scheduler(a, num_blocks=16)), scenario)
    assert any(r.preempted for r in stock.records), "no preemption exercised"
    # (preempted requests, their tokens, their hit tokens) in the stats.
    readmitted = [r.prefix_stats[3:] for r in stock.records if r.prefix_stats and r.prefix_stats[3]]
    assert readmitted and all(hits > 0 for _, _, hits in readmitted), "no re-admission with a hit"
    assert_same(stock, adapter)


@pytest.mark.parametrize("probe_len", [3 * BS, 3 * BS + 1, 4 * BS, 4 * BS + 1, 5 * BS - 1])
def test_same_hits_that_end_on_a_block_boundary(probe_len):
    """A cached prefix that ends exactly where the prompt (or its last
    token) does: the hit stops a token short, on a block boundary."""
    first = list(range(3, 3 + 5 * BS + 3))

    def scenario(d: Driver):
        d.run({0: [make_request("a", first, max_tokens=2)]})
        d.run({0: [make_request("b", first[:probe_len], max_tokens=3)]})

    stock, adapter = both(lambda a: Driver(make_scheduler(a)), scenario)
    assert_same(stock, adapter)
    hit = {r: h for rec in adapter.records for r, h in rec.new_hits.items()}["b"]
    assert hit == (probe_len - 1) // BS * BS


def test_a_held_request_waiting_again_gets_the_watermark_and_the_whole_sequence_check():
    """After an asynchronous KV load the scheduler calls ``allocate_slots`` for
    a request whose blocks the manager already holds, its status back to
    WAITING: vLLM applies the watermark and ``full_sequence_must_fit`` there as
    to an admission, and no watermark to a running request."""
    outcomes = []
    for adapter in (False, True):
        # 12 usable blocks (and the null one), a watermark of int(0.25 * 13) = 3.
        m = make_scheduler(adapter, num_blocks=13, watermark=0.25).kv_cache_manager
        held = make_request("held", list(range(3, 3 + 2 * BS)), max_tokens=8)
        assert m.allocate_slots(held, BS, delay_cache_blocks=True) is not None
        filler = make_request("filler", list(range(500, 500 + 9 * BS)))
        assert m.allocate_slots(filler, 9 * BS, has_scheduled_reqs=False) is not None
        row = []
        for status in (RequestStatus.RUNNING, RequestStatus.WAITING):
            held.status = status
            for kw in ({}, {"has_scheduled_reqs": False}, {"full_sequence_must_fit": True}):
                for new_tokens in (1, BS + 1):
                    got = m.allocate_slots(held, new_tokens, **kw)
                    row.append(None if got is None else got.get_block_ids())
        outcomes.append((row, m.block_pool.get_num_free_blocks()))
    assert outcomes[0] == outcomes[1]
    row = outcomes[0][0]
    assert None in row and ([],) in row, f"the checks did not both pass and refuse: {row}"


HIT_LIMITS = hasattr(Request, "get_max_cache_hit_length")
"""Whether this vLLM (0.34) bounds hits per request (``prefix_cache_hit_limit``)."""
only_with_hit_limits = pytest.mark.skipif(not HIT_LIMITS, reason="vLLM 0.34's per-request hit limits")


def test_same_schedule_when_a_request_sets_skip_reading_prefix_cache():
    """A request whose sampling params skip the prefix cache gets no hit and
    is not counted in the stats; the next one hits."""
    prompt = list(range(3, 3 + 4 * BS))

    def scenario(d: Driver):
        d.run({0: [make_request("a", prompt, max_tokens=3)]})
        d.run({0: [make_request("b", prompt + [7], max_tokens=3, sampling={"skip_reading_prefix_cache": True})]})
        d.run({0: [make_request("c", prompt + [7], max_tokens=3)]})

    stock, adapter = both(lambda a: Driver(make_scheduler(a)), scenario)
    assert_same(stock, adapter)
    hits = {r: h for rec in adapter.records for r, h in rec.new_hits.items()}
    assert hits == {"a": 0, "b": 0, "c": 4 * BS}


@only_with_hit_limits
def test_same_capped_hits_for_requests_that_score_their_prompt():
    """vLLM 0.34 lets a prompt-logprob request that allows cache reads read up
    to its first scored token (``prompt_logprob_start``) and no further; by
    default it reads nothing. Hits, schedule and stats match vLLM's own manager."""
    prompt = list(range(3, 3 + 6 * BS))
    start = 2 * BS + 5

    def scenario(d: Driver):
        d.run({0: [make_request("a", prompt, max_tokens=3)]})
        d.run({0: [make_request("b", prompt + [9], max_tokens=3, prompt_logprobs=1,
                                sampling={"prompt_logprob_start": start, "skip_reading_prefix_cache": False})]})
        d.run({0: [make_request("c", prompt + [9], max_tokens=3, prompt_logprobs=1)]})
        d.run({0: [make_request("d", prompt + [9], max_tokens=3)]})

    stock, adapter = both(lambda a: Driver(make_scheduler(a)), scenario)
    assert_same(stock, adapter)
    hits = {r: h for rec in adapter.records for r, h in rec.new_hits.items()}
    assert hits == {"a": 0, "b": 2 * BS, "c": 0, "d": 6 * BS}


@only_with_hit_limits
def test_the_cached_token_probe_matches_vllms_and_changes_nothing():
    """``get_num_cached_tokens`` (vLLM 0.34's probe for cache-aware admission)
    answers as vLLM's manager does, for plain, capped (not applied by the
    probe) and skipping requests, and takes no block, reference or event."""
    prompt = list(range(3, 3 + 5 * BS))
    probes = [
        make_request("p1", prompt + [1], max_tokens=2),
        make_request("p2", prompt[: 3 * BS], max_tokens=2),
        make_request("p3", prompt[:BS] + [5] * BS, max_tokens=2),
        make_request("p4", prompt + [1], max_tokens=2, prompt_logprobs=1,
                     sampling={"prompt_logprob_start": BS + 1, "skip_reading_prefix_cache": False}),
        make_request("p5", prompt + [1], max_tokens=2, sampling={"skip_reading_prefix_cache": True}),
    ]
    answers = []
    for adapter in (False, True):
        d = Driver(make_scheduler(adapter))
        d.run({0: [make_request("a", prompt, max_tokens=3)]})
        km = d.scheduler.kv_cache_manager
        free = km.block_pool.get_num_free_blocks()
        km.take_events()
        answers.append([km.get_num_cached_tokens(r) for r in probes])
        assert km.block_pool.get_num_free_blocks() == free
        assert km.take_events() == []
    assert answers[0] == answers[1] == [5 * BS, 2 * BS, BS, 5 * BS, 0]


@only_with_hit_limits
def test_same_cache_aware_admission():
    """vLLM 0.34's cache-aware admission reorders the waiting queue's head by
    cached prefix (asking the manager's probe): the same order, schedule and
    stats with either manager, and the order did change."""
    specs = shared_prefix_requests(30, seed=11, max_tokens=(4, 30))

    def build(adapter):
        return Driver(make_scheduler(adapter, num_blocks=200, max_num_seqs=3,
                                     cache_aware_admission_window=8,
                                     cache_aware_admission_threshold=0.0))

    stock, adapter = both(build, lambda d: d.run(arrivals(specs)))
    assert_same(stock, adapter)
    admitted = [r for rec in adapter.records for r in rec.new_hits]
    arrived = [rid for _, rid, _, _ in specs]
    assert sorted(admitted, key=arrived.index) == [r for r in arrived if r in admitted]
    assert admitted != [r for r in arrived if r in admitted]


@pytest.mark.parametrize("inflight", [None, 1])
def test_same_schedule_with_asynchronous_kv_loads(tmp_path, inflight):
    """External hits loaded asynchronously: each such request waits for its
    load (reported received one step later), then its blocks are cached and
    it runs, beside local prefix hits; on vLLM 0.34 also with at most
    ``inflight`` loads at once (``max_num_inflight_kv_loads``)."""
    if inflight is not None and not HIT_LIMITS:
        pytest.skip("vLLM 0.34's max_num_inflight_kv_loads")
    rng = random.Random(3)
    stored = [[rng.randrange(3, 1000) for _ in range(k * BS)] for k in (3, 5, 2)]
    specs = []
    for i in range(12):
        base = stored[i % 3] if i % 4 != 3 else stored[0][: 2 * BS]
        specs.append((i // 3, f"q{i}", base + [rng.randrange(3, 1000) for _ in range(rng.randint(1, 2 * BS))],
                      rng.randint(2, 12)))

    def scenario(d: Driver):
        conn = d.scheduler.connector
        for tokens in stored:
            conn._generate_foldername_debug(torch.tensor(tokens), [], create_folder=True)
        by_step = arrivals(specs)
        waited = set()
        for s in range(400):
            for r in by_step.get(s, ()):
                d.scheduler.add_request(r)
            if s > max(by_step) and not d.scheduler.has_unfinished_requests():
                break
            out = d.schedule()
            # Each load is reported received once, the step after it started.
            loading = {r.request_id for r in d.scheduler.requests.values()
                       if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS} - waited
            waited |= loading
            mo = d.model_output(out)
            mo.kv_connector_output = KVConnectorOutput(finished_recving=loading)
            d.update(out, mo)
        else:
            raise AssertionError("did not finish")
        d.waited = waited

    extra = {} if inflight is None else {"max_num_inflight_kv_loads": inflight}
    stock, adapter = both(
        lambda a: Driver(make_scheduler(a, num_blocks=120, async_loads=True,
                                        connector_storage=str(tmp_path / f"{a}"), **extra)),
        scenario,
    )
    assert_same(stock, adapter)
    assert stock.waited and stock.waited == adapter.waited, "no asynchronous load happened"
