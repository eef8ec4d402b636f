"""mla_cache.PrefixCache: a prefix cache over block ids the caller owns."""

import numpy as np
import pytest

import mla_cache
from conftest import small_config

BS = 4


def toks(a, b):
    return list(range(a, b))


@pytest.fixture
def cache():
    c = mla_cache.PrefixCache(small_config(16))
    yield c
    c._check_invariants()


def test_insert_match_and_duplicates(cache):
    first = cache.insert(toks(0, 14), np.array([3, 5, 7, 9], dtype=np.int64))
    assert first.num_cached_blocks == 0 and first.duplicate_block_ids.tolist() == []
    assert first.block_ids.dtype == np.int32 and first.block_ids.tolist() == [3, 5, 7]
    found = cache.match_prefix(np.arange(14, dtype=np.uint16))
    assert found.block_ids.tolist() == [3, 5, 7] and found.num_tokens == 12
    # The same prefix in the caller's other ids: 1 and 2 are duplicates to free.
    second = cache.insert(toks(0, 16), (1, 5, 2, 4))
    assert second.num_cached_blocks == 3
    assert second.duplicate_block_ids.tolist() == [1, 2]
    assert second.block_ids.tolist() == [3, 5, 7, 4]
    assert "Insertion(num_cached_blocks=3" in repr(second)
    assert cache.match_prefix(toks(0, 16), salt="tenant").num_tokens == 0
    assert (cache.evictable_blocks, cache.protected_blocks) == (4, 0)


def test_bad_input_raises_and_changes_nothing(cache):
    cache.insert(toks(0, 8), [0, 1])
    before = cache.stats()
    with pytest.raises(ValueError):
        cache.insert(toks(0, 12), [0, 1])  # too few ids
    with pytest.raises(ValueError):
        cache.insert(toks(50, 58), [2, 2])  # an id twice
    with pytest.raises(ValueError):
        cache.insert(toks(50, 58), [2, 16])  # outside the cache
    with pytest.raises(ValueError):
        cache.insert(toks(50, 58), [2, 0])  # 0 holds another block
    with pytest.raises(TypeError):
        cache.insert(toks(50, 58), ["a", "b"])
    with pytest.raises(ValueError):
        cache.insert(toks(50, 58), [-1, 2])
    with pytest.raises(ValueError):
        cache.unlock([0])  # never locked
    with pytest.raises(ValueError):
        cache.lock([16])
    assert cache.stats() == before
    with pytest.raises(ValueError):
        mla_cache.PrefixCache(small_config(4, enable_prefix_caching=False))


def test_locks_protect_and_eviction_hands_ids_back_children_first(cache):
    cache.insert(toks(0, 12), [0, 1, 2])
    cache.insert(toks(50, 58), [3, 4])
    path = cache.match_prefix(toks(0, 8)).block_ids
    cache.lock(path)
    assert (cache.evictable_blocks, cache.protected_blocks) == (3, 2)
    evicted = cache.evict(10)
    assert evicted.dtype == np.int32 and sorted(evicted.tolist()) == [2, 3, 4]
    assert cache.evict(1).tolist() == []
    cache.unlock(path)
    assert (cache.evictable_blocks, cache.protected_blocks) == (2, 0)
    assert cache.evict(10).tolist() == [1, 0]
    s = cache.stats()
    assert s["evictions"] == 5 and s["cached_blocks"] == 0 and s["free_blocks"] == 0


def test_pins_reset_and_events_with_64_bit_hashes():
    cache = mla_cache.PrefixCache(
        small_config(8, hash_seed=42, enable_events=True, pin_budget_blocks=2)
    )
    prompt = toks(7, 19)
    cache.insert(prompt, [4, 5, 6])
    # The values the Rust, C and BlockManager tests assert for this prompt.
    hashes = [5565884646872614745, 11616947711106753066, 6371776174528016060]
    assert cache.block_hashes(prompt) == hashes
    assert cache.pin(prompt[:8]) == 8
    with pytest.raises(mla_cache.PinBudgetExceeded):
        cache.pin(prompt)
    with pytest.raises(RuntimeError):
        cache.reset()
    assert cache.unpin(prompt) == 8
    assert sorted(cache.reset().tolist()) == [4, 5, 6]
    stored, cleared = cache.take_events()
    assert isinstance(stored, mla_cache.BlockStored) and stored.block_hashes == hashes
    assert stored.parent_block_hash is None and stored.token_ids == prompt
    assert isinstance(cleared, mla_cache.AllBlocksCleared)
    assert all(0 <= h < 2**64 for h in stored.block_hashes)
    cache._check_invariants()


def test_a_random_workload_hands_every_id_back_exactly_once():
    rng = np.random.default_rng(5)
    cache = mla_cache.PrefixCache(small_config(32, eviction="arc"))
    free = set(range(32))
    held = []  # locked paths
    for _ in range(400):
        symbols = rng.integers(0, 3, size=rng.integers(1, 5))
        tokens = np.repeat(symbols, BS)
        r = rng.random()
        if r < 0.4 and len(free) >= len(symbols):
            ids = [free.pop() for _ in symbols]
            out = cache.insert(tokens, ids)
            free.update(out.duplicate_block_ids.tolist())
            assert not free & set(out.block_ids.tolist())
        elif r < 0.6:
            path = cache.match_prefix(tokens).block_ids
            cache.lock(path)
            held.append(path)
        elif r < 0.75 and held:
            cache.unlock(held.pop(int(rng.integers(len(held)))))
        else:
            got = cache.evict(int(rng.integers(1, 4))).tolist()
            assert not free & set(got), "an id handed back twice"
            free.update(got)
        cache._check_invariants()
    for path in held:
        cache.unlock(path)
    free.update(cache.evict(32).tolist())
    assert free == set(range(32)) and cache.stats()["cached_blocks"] == 0
