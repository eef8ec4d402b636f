"""The adapter keys blocks by vLLM's own digests (``request.block_hashes``,
computed by vLLM's block hasher in ``Request``): lookups and admissions take
them as they are, so LoRA, cache salt and multimodal inputs separate prefixes
exactly as in vLLM's manager, partial hashes cache and hit only as far as
vLLM hashed, and events carry vLLM's external hashes. Under ``sha256_cbor``
the block manager's own token hashing names a prefix as the digests do."""

from __future__ import annotations

import random
from typing import Any, List, Optional

import pytest
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager as Stock

import mla_cache
import mla_cache.vllm as ours
from harness import make_request, make_scheduler

BS = 16
PROMPT = list(range(100, 100 + 5 * BS + 3))


def image(identifier: str, offset: int, length: int) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=offset, length=length),
    )


def request(rid: str, prompt: List[int], **extra: Any):
    return make_request(rid, prompt, max_tokens=4, block_size=BS, **extra)


def managers(**kw):
    """vLLM's manager and the adapter, built alike."""
    config = make_scheduler(False).kv_cache_manager.kv_cache_config
    return [
        cls(kv_cache_config=config, max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS, **kw)
        for cls in (Stock, ours.KVCacheManager)
    ]


LORA = LoRARequest("sql", 1, "/adapters/sql")
BASE = dict(lora_request=LORA, cache_salt="tenant-a", mm_features=[image("img-a", 20, 10)])

PROBES = [
    # (what differs from the cached request, its keywords, expected hit)
    ("nothing", BASE, 5 * BS),
    ("another salt", {**BASE, "cache_salt": "tenant-b"}, 0),
    ("no LoRA", {**BASE, "lora_request": None}, 0),
    ("another LoRA", {**BASE, "lora_request": LoRARequest("chat", 2, "/adapters/chat")}, 0),
    ("another image in block 1", {**BASE, "mm_features": [image("img-b", 20, 10)]}, BS),
    ("the image elsewhere", {**BASE, "mm_features": [image("img-a", 40, 10)]}, BS),
]


@pytest.mark.parametrize("what, keywords, expected", PROBES, ids=[p[0] for p in PROBES])
def test_extra_keys_separate_prefixes_as_in_vllm(what, keywords, expected):
    hits = []
    for km in managers():
        cached = request("a", PROMPT, **BASE)
        assert km.allocate_slots(cached, cached.num_tokens) is not None
        probe = request("b", PROMPT + [7], **keywords)
        hits.append(km.get_computed_blocks(probe)[1])
    assert hits == [expected, expected], f"{what}: stock {hits[0]}, adapter {hits[1]}"


def test_a_miss_on_the_first_block_and_a_hit_after_it():
    for km in managers():
        cached = request("a", PROMPT)
        assert km.allocate_slots(cached, cached.num_tokens) is not None
        assert km.get_computed_blocks(request("m", [1] + PROMPT[1:]))[1] == 0
        assert km.get_computed_blocks(request("h", PROMPT[: 3 * BS] + [1] * BS))[1] == 3 * BS


def test_partial_hashes_cache_and_hit_only_as_far_as_vllm_hashed():
    """A request whose digests stop short (a lagging or switched-off hasher)
    caches only its hashed blocks, and a probe is found only as far as its
    own digests go."""
    hits = []
    for km in managers():
        cached = request("a", PROMPT)
        del cached.block_hashes[3:]
        assert km.allocate_slots(cached, cached.num_tokens) is not None
        full = km.get_computed_blocks(request("b", PROMPT + [7]))[1]
        short = request("c", PROMPT + [7])
        del short.block_hashes[2:]
        none = request("d", PROMPT + [7])
        none.block_hashes.clear()
        hits.append((full, km.get_computed_blocks(short)[1], km.get_computed_blocks(none)[1]))
    assert hits[0] == hits[1] == (3 * BS, 2 * BS, 0)


def test_events_carry_vllms_external_hashes_and_lora():
    events = []
    for km in managers(enable_kv_cache_events=True):
        r = request("a", PROMPT, **BASE)
        assert km.allocate_slots(r, r.num_tokens) is not None
        km.evict_blocks(km.get_block_ids("a")[0][4:5])
        events.append(km.take_events())
    stock, adapter = events
    assert [type(e).__name__ for e in adapter] == ["BlockStored", "BlockRemoved"]
    expected = [kv_cache_utils.maybe_convert_block_hash(h) for h in r.block_hashes]
    assert adapter[0].block_hashes == expected
    assert adapter[1].block_hashes == expected[4:]
    stored = [e for e in stock if type(e).__name__ == "BlockStored"]
    assert [h for e in stored for h in e.block_hashes] == expected
    assert (adapter[0].lora_id, adapter[0].lora_name) == (stored[0].lora_id, stored[0].lora_name) == (1, "sql")
    assert adapter[0].token_ids == PROMPT[: 5 * BS]


def vllm_digests(tokens: List[int], lora: Optional[LoRARequest], salt: Optional[str]) -> List[bytes]:
    """vLLM's sha256_cbor digests of the prompt's full blocks."""
    kv_cache_utils.init_none_hash(sha256_cbor)
    r = make_request("x", tokens, block_size=BS, lora_request=lora, cache_salt=salt)
    parent = None
    out = []
    for start in range(0, len(tokens) - BS + 1, BS):
        extra, _ = kv_cache_utils.generate_block_hash_extra_keys(r, start, start + BS, 0)
        parent = kv_cache_utils.hash_block_tokens(sha256_cbor, parent, tokens[start : start + BS], extra)
        out.append(parent)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_own_hashing_and_vllms_digests_name_a_prefix_alike(monkeypatch, seed):
    """Mixed use: under ``sha256_cbor`` a request admitted by vLLM's digests is
    found by the block manager's own hashing of the same tokens and keys, and
    the other way round."""
    monkeypatch.setenv("PYTHONHASHSEED", str(seed))
    # vLLM's NONE_HASH is process-wide: put the other tests' one back after.
    for name in ("NONE_HASH", "_NONE_HASH_SEED"):
        monkeypatch.setattr(kv_cache_utils, name, getattr(kv_cache_utils, name))
    rng = random.Random(seed)
    tokens = [rng.randrange(0, 150_000) for _ in range(rng.randrange(2 * BS, 8 * BS))]
    lora = LORA if rng.random() < 0.5 else None
    salt = rng.choice([None, "tenant-a"])
    digests = vllm_digests(tokens, lora, salt)
    keys = mla_cache.ExtraKeys(
        adapter=lora.lora_name if lora else None, adapter_path=lora.lora_path if lora else None, salt=salt
    )
    config = mla_cache.CacheConfig(num_blocks=64, block_size=BS, block_hash="sha256_cbor", hash_seed=seed)
    by_digests = mla_cache.BlockManager(config)
    by_digests.admit("a", tokens, block_hashes=digests, extra_keys=keys)
    found = by_digests.match_prefix(tokens, extra_keys=keys)
    assert found.num_tokens == len(digests) * BS
    by_tokens = mla_cache.BlockManager(config)
    by_tokens.admit("a", tokens, extra_keys=keys)
    assert by_tokens.match_block_hashes(digests).num_tokens == len(digests) * BS
    by_tokens._check_invariants()
    by_digests._check_invariants()


def test_block_objects_read_like_vllms():
    """``ref_cnt``, ``block_hash``, ``is_null`` of the blocks in a request's
    table, and ``block_pool.free_block_queue.num_free_blocks``, as vLLM's own
    code reads them, through sharing, a deferred free and its return."""
    seen = []
    for km in managers():
        a = request("a", PROMPT)
        assert km.allocate_slots(a, a.num_tokens) is not None
        a.num_computed_tokens = a.num_tokens
        b = request("b", PROMPT[: 3 * BS] + [1] * 20)
        blocks, hit, _ = km.get_computed_blocks(b)
        assert km.allocate_slots(b, b.num_tokens - hit, hit, blocks) is not None

        def view(rid):
            return [(blk.ref_cnt, blk.block_hash, blk.is_null) for blk in km.get_blocks(rid).blocks[0]]

        state = [view("a"), view("b"), km.block_pool.free_block_queue.num_free_blocks]
        popped = km.pop_blocks_for_free(a)
        state.append([blk.ref_cnt for blk in popped])  # still held by the in-flight step
        km.block_pool.free_blocks(reversed(popped))
        state.append([blk.ref_cnt for blk in popped])
        state.append(km.block_pool.free_block_queue.num_free_blocks)
        state.append((km.block_pool.null_block.is_null, km.block_pool.null_block.block_hash))
        seen.append(state)
    stock, adapter = seen
    assert adapter == stock
    hashed = [h for _, h, _ in adapter[0]]
    assert hashed[:5] == [d + (0).to_bytes(4, "big") for d in a.block_hashes] and hashed[5] is None
    assert [r for r, _, _ in adapter[1]][:3] == [2, 2, 2]
    assert adapter[4] == [1, 1, 1, 0, 0, 0]
