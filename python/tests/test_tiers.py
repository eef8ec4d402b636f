"""TieredCache: blocks go down to host memory (and a remote Valkey/Redis
server when one is configured) and come back byte for byte."""

import os
import time

import numpy as np
import pytest

import mla_cache
from mla_cache import CacheConfig, LatentStore, TieredCache

BS = 16
PROMPT = 3 * BS + 1  # 3 full blocks, all loadable under the last-token cap


def config(dtype="fp8_ds_mla", num_blocks=8):
    return CacheConfig(num_blocks, block_size=BS, num_layers=3, dtype=dtype, hash_seed=42)


def prompt(seed, n=PROMPT):
    return np.arange(n, dtype=np.int64) + seed * 100_000


def tiered(dtype="fp8_ds_mla", **kw):
    c = config(dtype)
    store = LatentStore(c)
    kw.setdefault("host_mem", 16 * c.bytes_per_block)
    return TieredCache(c, store, **kw), store


def run_prefill(cache, store, rid, seed, n=PROMPT):
    """Admits chunked, writes the latents of what was not loaded, commits."""
    a = cache.admit(rid, prompt(seed, n), chunked_prefill=True)
    x = np.random.default_rng(seed).standard_normal((n, 576)).astype(np.float32)
    slots = cache.slot_mapping(rid, 0, n)
    for layer in range(3):
        store.write(layer, x[:, :512], x[:, 512:], slots)
    cache.commit(rid, n)
    return a


def block_bytes(store, blocks):
    """The stored bytes of `blocks` in every layer, through the zero-copy views."""
    return [np.stack([store.layer_buffer(layer)[b].copy() for layer in range(3)]) for b in blocks]


def flush_device(cache, store, rid):
    """An unrelated 8-block request evicts (and overwrites) every block."""
    run_prefill(cache, store, rid, 900 + rid, 8 * BS)
    cache.free(rid)


@pytest.mark.parametrize("dtype", ["bf16", "fp8_ds_mla", "mxfp6", "nvfp4_ds_mla"])
def test_blocks_round_trip_device_host_device(dtype):
    cache, store = tiered(dtype)
    a = run_prefill(cache, store, "first", 7)
    original = block_bytes(store, a.block_ids[:3])
    assert all(b.any() for b in original)
    assert cache.stats()["host"]["blocks"] == 3
    cache.free("first")
    flush_device(cache, store, 1)
    assert cache.lookup(prompt(7)).host_tokens == 3 * BS

    b = cache.admit("again", prompt(7))
    assert (b.hits.device_tokens, b.hits.host_tokens, b.hits.remote_tokens) == (0, 3 * BS, 0)
    assert b.num_cached_tokens == 3 * BS and b.hits.total == 3 * BS
    for got, want in zip(block_bytes(store, b.block_ids[:3]), original):
        np.testing.assert_array_equal(got, want)
    # Loaded blocks are committed: the next request hits them on the device.
    c = cache.admit("third", prompt(7))
    assert c.hits.device_tokens == 3 * BS
    s = cache.stats()
    assert s["host_hit_tokens"] == 3 * BS and s["copy_errors"] == 0
    assert s["remote"] is None and s["manager"]["num_requests"] == 2


def test_lookup_reports_each_tier_without_loading():
    cache, store = tiered()
    run_prefill(cache, store, 1, 7)
    hits = cache.lookup(prompt(7))
    assert (hits.device_tokens, hits.host_tokens, hits.remote_tokens) == (3 * BS, 0, 0)
    cache.free(1)
    flush_device(cache, store, 2)
    hits = cache.lookup(prompt(7))
    assert (hits.device_tokens, hits.host_tokens) == (0, 3 * BS)
    assert cache.stats()["host_hit_tokens"] == 0, "a lookup loads nothing"


def test_write_back_copies_only_evicted_blocks():
    cache, store = tiered(write_policy="write-back")
    assert cache.write_policy == "write-back"
    a = run_prefill(cache, store, 1, 7)
    original = block_bytes(store, a.block_ids[:3])
    cache.free(1)
    assert cache.stats()["host"]["blocks"] == 0
    flush_device(cache, store, 2)
    assert cache.stats()["written_back"] == 3
    b = cache.admit(3, prompt(7))
    assert b.hits.host_tokens == 3 * BS
    for got, want in zip(block_bytes(store, b.block_ids[:3]), original):
        np.testing.assert_array_equal(got, want)


def test_write_through_selective_copies_hot_blocks():
    cache, store = tiered(write_policy="write-through-selective:2")
    run_prefill(cache, store, 1, 7)
    assert cache.stats()["host"]["blocks"] == 0
    cache.admit(2, prompt(7))
    assert cache.stats()["host"]["blocks"] == 0
    cache.admit(3, prompt(7))
    assert cache.stats()["host"]["blocks"] == 3
    assert cache.stats()["written_through"] == 3


def test_unchunked_requests_go_down_after_the_first_append():
    cache, store = tiered()
    cache.admit("r", prompt(7), decode_slots=16)
    x = np.random.default_rng(1).standard_normal((PROMPT, 576)).astype(np.float32)
    for layer in range(3):
        store.write(layer, x[:, :512], x[:, 512:], cache.slot_mapping("r", 0, PROMPT))
    assert cache.stats()["host"]["blocks"] == 0, "the prefill has not run yet"
    out = cache.append("r", [5])
    assert len(out.new_block_ids) == 0 and out.copies == []
    assert cache.stats()["host"]["blocks"] == 3
    cache.fork("r", "child")
    assert cache.num_tokens("child") == PROMPT + 1
    np.testing.assert_array_equal(cache.block_table("r")[:4], cache.block_table("child"))
    cache.free("child")
    cache.free("r")


def test_errors_and_settings():
    c = config()
    store = LatentStore(c)
    with pytest.raises(ValueError, match="write policy"):
        TieredCache(c, store, host_mem=1 << 20, write_policy="write-around")
    with pytest.raises(ValueError, match="holds no block"):
        TieredCache(c, store, host_mem=10)
    with pytest.raises(ValueError, match="differ"):
        TieredCache(config(num_blocks=9), store)
    with pytest.raises(ValueError, match="hash_seed"):
        nos = CacheConfig(8, block_size=BS, num_layers=3, dtype="fp8_ds_mla")
        TieredCache(nos, LatentStore(nos), remote="redis://127.0.0.1:1/")
    with pytest.raises(ValueError, match="lookup_budget_ms"):
        TieredCache(c, store, lookup_budget_ms=-1)
    with pytest.raises(TypeError):
        TieredCache(c, "not a store")
    cache = TieredCache(c, store, host_mem=4 * c.bytes_per_block)
    assert cache.stats()["host"]["capacity_blocks"] == 4 and cache.store is store
    with pytest.raises(KeyError):
        cache.free("nobody")
    with pytest.raises(mla_cache.OutOfBlocks):
        cache.admit(1, prompt(1, 6 * BS))
        cache.admit(2, prompt(2, 6 * BS))
    assert "TieredCache(write_policy=write-through" in repr(cache)
    assert cache.flush_remote(0.1) is True


def test_an_unreachable_remote_server_only_costs_hits():
    cache, store = tiered(remote="redis://127.0.0.1:1/", lookup_budget_ms=500)
    run_prefill(cache, store, 1, 7)
    cache.free(1)
    flush_device(cache, store, 2)
    hits = cache.admit(3, prompt(7)).hits
    assert (hits.host_tokens, hits.remote_tokens) == (3 * BS, 0)
    cache.free(3)
    r = cache.stats()["remote"]
    assert r is not None and r["hit_blocks"] == 0


def redis_url():
    url = os.environ.get("MLA_CACHE_REDIS_URL")
    if not url:
        if os.environ.get("MLA_CACHE_REQUIRE_REDIS") == "1":
            pytest.fail("MLA_CACHE_REQUIRE_REDIS=1 but MLA_CACHE_REDIS_URL is not set (scripts/redis.sh start)")
        pytest.skip("no Valkey/Redis server (scripts/redis.sh start)")
    return url


def test_two_nodes_share_blocks_through_redis():
    url = redis_url()
    ns = f"pytest-{os.getpid()}-{time.time_ns()}"
    a, store_a = tiered(remote=url, namespace=ns, lookup_budget_ms=2000, host_mem=0)
    b, store_b = tiered(remote=url, namespace=ns, lookup_budget_ms=2000)
    first = run_prefill(a, store_a, 1, 7)
    assert a.flush_remote(10.0)
    assert a.stats()["remote"]["put_blocks"] == 3
    got = b.admit(1, prompt(7))
    assert (got.hits.device_tokens, got.hits.host_tokens, got.hits.remote_tokens) == (0, 0, 3 * BS)
    for x, y in zip(block_bytes(store_b, got.block_ids[:3]), block_bytes(store_a, first.block_ids[:3])):
        np.testing.assert_array_equal(x, y)
    s = b.stats()
    assert s["remote"]["hit_blocks"] == 3 and s["host"]["blocks"] == 3
    # Another namespace sees nothing.
    other, _ = tiered(remote=url, namespace=ns + "-other", lookup_budget_ms=2000)
    assert other.lookup(prompt(7)).remote_tokens == 0


def test_take_events_reports_every_tier_with_its_medium():
    c = CacheConfig(8, block_size=BS, num_layers=3, hash_seed=42, enable_events=True)
    store = LatentStore(c)
    cache = TieredCache(c, store, host_mem=2 * c.bytes_per_block)
    run_prefill(cache, store, 1, 1)
    cache.free(1)
    events = cache.take_events()
    got = [(e.medium, type(e).__name__, e.block_hashes) for e in events]
    h = got[0][2]
    assert len(h) == 3
    # Host memory holds 2 blocks: the third evicts the first.
    assert got == [
        ("GPU", "BlockStored", h),
        ("CPU", "BlockStored", h[:2]),
        ("CPU", "BlockRemoved", h[:1]),
        ("CPU", "BlockStored", h[2:]),
    ]
    assert cache.take_events() == []
    assert cache.stats()["events_dropped"] == 0
