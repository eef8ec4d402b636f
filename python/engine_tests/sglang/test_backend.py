"""mla_cache's SGLang backend as SGLang selects and uses it: the registry and
plug-in loader, SGLang's event classes and publisher encoding, bad input."""

import subprocess
import sys
import time
from importlib.metadata import entry_points

import msgspec
import pytest
import torch
from conftest import BACKENDS
from driver import Engine, publish_server_args
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
)
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache

import mla_cache.sglang as backend
from test_conformance import prompt


def build_context(params: CacheInitParams, **flags) -> TreeCacheBuildContext:
    """What SGLang's KV cache builder hands the registry (no model, no workers)."""
    fields = dict(is_hybrid_swa=False, is_hybrid_ssm=False, enable_hierarchical_cache=False)
    fields.update(flags)
    return TreeCacheBuildContext(
        server_args=None,
        params=params,
        disable_radix_cache=params.disable,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
        **fields,
    )


def engine_params(**changes) -> CacheInitParams:
    e = Engine(BACKENDS["sglang"], num_pages=16, page_size=4)
    fields = dict(
        disable=False,
        req_to_token_pool=e.pool,
        token_to_kv_pool_allocator=e.allocator,
        page_size=4,
    )
    fields.update(changes)
    return CacheInitParams(**fields)


def test_the_radix_cache_backend_flag_selects_it_through_sglangs_registry():
    backend.register()
    backend.register()  # idempotent
    params = engine_params()
    publish_server_args(page_size=4, radix_cache_backend="mla_cache")
    cache = create_tree_cache(build_context(params))
    assert isinstance(cache, backend.RadixCache) and isinstance(cache, BasePrefixCache)
    assert cache.page_size == 4 and cache.supports_prefix_sharing()


def test_installing_mla_cache_registers_the_backend_with_sglangs_plugin_loader():
    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("mla_cache") == "mla_cache.sglang:register"
    script = (
        "import warnings; warnings.filterwarnings('ignore')\n"
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang.srt.mem_cache.registry import registered_radix_cache_backends\n"
        "load_plugins()\n"
        "print(registered_radix_cache_backends())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "'mla_cache'" in out.stdout


@pytest.mark.parametrize(
    "flags", [{"is_hybrid_swa": True}, {"is_hybrid_ssm": True}, {"enable_hierarchical_cache": True}]
)
def test_models_it_cannot_serve_are_refused(flags):
    backend.register()
    params = engine_params()
    publish_server_args(page_size=4, radix_cache_backend="mla_cache")
    with pytest.raises(ValueError, match="mla_cache"):
        create_tree_cache(build_context(params, **flags))


def test_unsupported_settings_are_refused():
    with pytest.raises(ValueError, match="EAGLE"):
        backend.RadixCache(engine_params(is_eagle=True))
    with pytest.raises(ValueError, match="eviction policy"):
        backend.RadixCache(engine_params(eviction_policy="lfu"))
    cache = backend.RadixCache(engine_params())
    with pytest.raises(ValueError, match="KV indices"):
        cache.insert(InsertParams(key=RadixKey(prompt(8)), value=torch.arange(4)))
    assert cache.total_size() == 0


def stored_pages(events):
    """``(pages stored, pages removed, resets)`` of an event list, the
    stored pages as token tuples."""
    stored, removed, resets = [], 0, 0
    for e in events:
        if isinstance(e, BlockStored):
            assert len(e.token_ids) == len(e.block_hashes) * e.block_size
            size = e.block_size
            stored += [tuple(e.token_ids[i : i + size]) for i in range(0, len(e.token_ids), size)]
        elif isinstance(e, BlockRemoved):
            removed += len(e.block_hashes)
        else:
            assert isinstance(e, AllBlocksCleared)
            resets += 1
    return sorted(stored), removed, resets


def pages(tokens):
    return [tuple(tokens[i : i + 4]) for i in range(0, len(tokens) - 3, 4)]


def event_run():
    e = Engine(backend.RadixCache, num_pages=13, page_size=4, enable_kv_cache_events=True)
    assert e.tree.take_events() == []
    e.run(e.request("a", prompt(24), max_new_tokens=1))
    e.run(e.request("b", prompt(16) + prompt(9, 50), max_new_tokens=1))
    first = e.tree.take_events()
    e.run(e.request("c", prompt(36, 900), max_new_tokens=1))  # evicts 5 pages
    second = e.tree.take_events()
    e.flush()
    return first, second, e.tree.take_events()


def test_events_are_sglangs_own_classes_naming_the_pages_cached_and_evicted():
    first, second, cleared = event_run()
    assert all(isinstance(e, KVCacheEvent) for e in first + second + cleared)
    assert stored_pages(first) == (sorted(pages(prompt(24)) + pages(prompt(8, 50))), 0, 0)
    assert stored_pages(second) == (sorted(pages(prompt(36, 900))), 5, 0)
    assert stored_pages(cleared) == ([], 0, 1)


def test_events_chain_by_parent_hash_and_fit_sglangs_msgpack_publisher():
    first, second, cleared = event_run()
    stored = [e for e in first if isinstance(e, BlockStored)]
    hashes = [h for e in first + second for h in getattr(e, "block_hashes", [])]
    assert hashes and all(0 <= h < 2**64 for h in hashes)
    # "b" continues "a"'s first four pages: its chain's parent is one of them.
    assert stored[0].parent_block_hash is None
    assert stored[1].parent_block_hash == stored[0].block_hashes[3]
    removed = [h for e in second if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert set(removed) <= set(hashes)
    # What SGLang's ZMQ publisher sends: a msgpack EventBatch.
    batch = EventBatch(ts=time.time(), events=first + second + cleared)
    wire = msgspec.msgpack.Encoder().encode(batch)
    back = msgspec.msgpack.Decoder(type=EventBatch).decode(wire)
    assert len(back.events) == len(batch.events)


def test_sizes_and_views_sglang_reads():
    cache = backend.RadixCache.create_simulated(page_size=4)
    assert cache.all_values_flatten().numel() == 0
    cache.insert(InsertParams(key=RadixKey(prompt(10)), value=torch.arange(40, 50)))
    assert (cache.total_size(), cache.evictable_size(), cache.protected_size()) == (8, 8, 0)
    assert sorted(cache.all_values_flatten().tolist()) == list(range(40, 48))
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(prompt(10))))
    assert match.device_prefix_len == 8 and match.best_match_node is match.last_device_node
    lock = cache.lock(match.last_device_node)
    assert (cache.evictable_size(), cache.protected_size()) == (0, 8)
    assert cache.evict(EvictParams(num_tokens=8)).num_tokens_evicted == 0
    cache.unlock(lock)
    assert cache.path_device_indices(match.last_device_node).tolist() == list(range(40, 48))
    cache.pretty_print()


def test_two_caches_name_a_prefix_with_the_same_hashes():
    runs = [event_run()[0] for _ in range(2)]
    hashes = [[h for e in run if isinstance(e, BlockStored) for h in e.block_hashes] for run in runs]
    assert hashes[0] and hashes[0] == hashes[1]
