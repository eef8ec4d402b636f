import numpy as np
import pytest

import mla_cache
from mla_cache import BlockManager, ExtraKeys, MultiModalKey, OutOfBlocks

from conftest import small_config

BS = 4


def toks(a, b):
    return list(range(a, b))


def test_admit_returns_numpy_int32_blocks_and_holds_exactly_what_it_needs(manager):
    a = manager.admit(1, toks(0, 9), decode_slots=4)
    assert isinstance(a, mla_cache.Admission)
    assert a.block_ids.dtype == np.int32 and a.block_ids.shape == (4,)  # ceil(13 / 4)
    assert a.num_cached_tokens == 0
    assert manager.num_free_blocks == 12
    assert manager.usage == pytest.approx(4 / 16)
    assert "Admission(block_ids=array([0, 1, 2, 3]" in repr(a)
    manager._check_invariants()


def test_hit_is_capped_at_len_minus_one(manager):
    p = toks(0, 8)
    a = manager.admit(1, p)
    b = manager.admit(2, p)
    assert b.num_cached_tokens == 4
    assert b.block_ids[0] == a.block_ids[0] and b.block_ids[1] != a.block_ids[1]
    m = BlockManager(small_config(cap_hit_at_last_token=False))
    m.admit(1, p)
    assert m.admit(2, p).num_cached_tokens == 8


def test_match_prefix(manager):
    manager.admit("a", toks(0, 10))
    m = manager.match_prefix(np.arange(10))
    assert isinstance(m, mla_cache.PrefixMatch)
    assert m.num_tokens == 8 and m.block_ids.dtype == np.int32
    assert list(m.block_ids) == list(manager.block_table("a")[:2])
    assert manager.match_prefix(toks(1, 10)).num_tokens == 0
    assert "PrefixMatch(" in repr(m)


def test_append_fills_reserved_room_then_grows(manager):
    manager.admit(1, toks(0, 3), decode_slots=1)
    o = manager.append(1, 3)
    assert o.new_block_ids.dtype == np.int32 and len(o.new_block_ids) == 0 and o.copies == []
    o = manager.append(1, [4])
    assert len(o.new_block_ids) == 1
    assert manager.num_tokens(1) == 5
    assert "AppendOutcome(" in repr(o)


def test_fork_then_append_copies_the_shared_partial_tail(manager):
    manager.admit("parent", toks(0, 6))
    manager.fork("parent", "child")
    table = manager.block_table("child")
    assert list(table) == list(manager.block_table("parent")[:2])
    before = manager.num_free_blocks
    o = manager.append("child", [99])
    assert len(o.copies) == 1
    src, dst = o.copies[0]
    assert src == table[1] and dst == manager.block_table("child")[1]
    assert manager.num_free_blocks == before - 1
    assert manager.stats()["cow_copies"] == 1
    # The parent's tail is now its own: no copy.
    assert manager.append("parent", [7]).copies == []
    manager._check_invariants()


def test_commit_with_chunked_prefill(manager):
    p = toks(0, 12)
    manager.admit(1, p, chunked_prefill=True)
    assert manager.match_prefix(p).num_tokens == 0
    manager.commit(1, 8)
    assert manager.match_prefix(p).num_tokens == 8
    with pytest.raises(ValueError, match="backwards"):
        manager.commit(1, 4)
    with pytest.raises(ValueError):
        manager.commit(1, 13)
    with pytest.raises(KeyError):
        manager.commit(2, 1)


def test_free_releases_and_keeps_blocks_cached(manager):
    manager.admit(1, toks(0, 8))
    manager.free(1)
    assert manager.num_free_blocks == 16
    assert manager.match_prefix(toks(0, 8)).num_tokens == 8
    with pytest.raises(KeyError):
        manager.free(1)


def test_block_table_and_slot_mapping(manager):
    a = manager.admit(5, toks(0, 6), decode_slots=2)
    t = manager.block_table(5)
    assert t.dtype == np.int32 and list(t) == list(a.block_ids)
    s = manager.slot_mapping(5, 0, 8)
    assert s.dtype == np.int64
    expected = [t[p // BS] * BS + p % BS for p in range(8)]
    assert list(s) == expected
    assert len(manager.slot_mapping(5, 3, 3)) == 0
    with pytest.raises(ValueError):
        manager.slot_mapping(5, 0, 9)
    with pytest.raises(ValueError):
        manager.slot_mapping(5, 4, 2)
    with pytest.raises(ValueError):
        manager.slot_mapping(5, -1, 2)


def test_request_ids_int_and_str_never_collide(manager):
    manager.admit(0, [1, 2])
    manager.admit("0", [3, 4])
    manager.admit(2**63 - 1, [5])
    assert manager.num_tokens(0) == 2 and manager.num_tokens("0") == 2
    assert manager.stats()["num_requests"] == 3
    with pytest.raises(ValueError, match="already admitted"):
        manager.admit("0", [1])
    with pytest.raises(ValueError, match=r"0\.\.2\*\*63"):
        manager.admit(2**63, [1])
    with pytest.raises(ValueError):
        manager.admit(-1, [1])
    for bad in (1.0, None, b"x", True, (1,)):
        with pytest.raises(TypeError):
            manager.admit(bad, [1])
    manager.free("0")
    with pytest.raises(KeyError, match="'0'"):
        manager.block_table("0")
    # A freed str id can be admitted again.
    manager.admit("0", [9])
    manager.free("0")
    manager.free(0)
    manager.free(2**63 - 1)
    assert manager.num_free_blocks == 16


def test_failed_admission_of_a_str_id_leaves_no_trace(manager):
    manager.admit(1, toks(0, 40))  # 10 of 16 blocks
    with pytest.raises(OutOfBlocks):
        manager.admit("x", toks(100, 128))
    with pytest.raises(ValueError, match="cache has"):
        manager.admit("x", toks(0, 65))
    with pytest.raises(KeyError):
        manager.free("x")


def test_out_of_blocks_is_a_memory_error_and_changes_nothing(manager):
    manager.admit(1, toks(0, 40))  # 10 blocks
    assert issubclass(OutOfBlocks, MemoryError)
    with pytest.raises(OutOfBlocks, match="needed"):
        manager.admit(2, toks(100, 128))  # 7 blocks, 6 free
    assert manager.num_free_blocks == 6
    with pytest.raises(KeyError):
        manager.block_table(2)
    manager.admit(3, toks(100, 124))
    with pytest.raises(OutOfBlocks):
        manager.append(3, [1])
    with pytest.raises(ValueError, match="cache has 16"):
        manager.admit(4, toks(0, 100))
    manager._check_invariants()


def test_empty_input_is_a_value_error(manager):
    with pytest.raises(ValueError, match="empty"):
        manager.admit(1, [])
    manager.admit(1, [1])
    with pytest.raises(ValueError, match="empty"):
        manager.append(1, np.array([], dtype=np.int64))


def test_unknown_requests_are_key_errors(manager):
    for call in (
        lambda: manager.append(9, [1]),
        lambda: manager.block_table(9),
        lambda: manager.slot_mapping(9, 0, 1),
        lambda: manager.num_tokens(9),
        lambda: manager.fork(9, 10),
        lambda: manager.free("nine"),
        lambda: manager.commit("nine", 0),
    ):
        with pytest.raises(KeyError):
            call()
    manager.admit(1, [1])
    with pytest.raises(ValueError, match="already admitted"):
        manager.fork(9 - 8, 1)


def test_extra_keys_separate_chains(manager):
    p = toks(0, 9)
    manager.admit(1, p, extra_keys={"adapter": "lora-a"})
    assert manager.match_prefix(p).num_tokens == 0
    assert manager.match_prefix(p, extra_keys=ExtraKeys(adapter="lora-a")).num_tokens == 8
    assert manager.match_prefix(p, extra_keys={"adapter": "lora-b"}).num_tokens == 0
    manager.admit(2, p, salt="tenant")
    assert manager.match_prefix(p, salt="tenant").num_tokens == 8
    assert manager.match_prefix(p, extra_keys={"salt": "tenant"}).num_tokens == 8
    assert manager.match_prefix(p, salt="other").num_tokens == 0
    # An image in block 1 keeps block 0 shareable.
    img = ExtraKeys(mm=[MultiModalKey("cat", 5, 2)])
    manager.admit(3, p, extra_keys=img)
    assert manager.match_prefix(p, extra_keys={"mm": [("cat", 5, 2)]}).num_tokens == 8
    dog = manager.match_prefix(p, extra_keys={"mm": [(b"\x01\x02", 5, 2)]})
    assert dog.num_tokens == 4


def test_extra_keys_objects_and_errors():
    k = ExtraKeys(adapter="a", salt="s", mm=[("h", 1, 2), MultiModalKey(b"\xab", 0, 1)])
    assert k.adapter == "a" and k.salt == "s"
    assert k.mm == (MultiModalKey("h", 1, 2), MultiModalKey("ab", 0, 1))
    assert k.mm[1].hash == "ab" and (k.mm[0].offset, k.mm[0].length) == (1, 2)
    assert ExtraKeys() == ExtraKeys(adapter=None)
    assert "adapter=\"a\"" in repr(k) or "adapter='a'" in repr(k)
    m = BlockManager(small_config())
    with pytest.raises(ValueError, match="unknown extra key"):
        m.match_prefix([1], extra_keys={"lora": "x"})
    with pytest.raises(TypeError):
        m.match_prefix([1], extra_keys=["adapter"])
    with pytest.raises(ValueError, match="disagrees"):
        m.match_prefix([1], extra_keys={"salt": "a"}, salt="b")
    m.match_prefix([1], extra_keys={"salt": "a"}, salt="a")
    with pytest.raises(TypeError):
        MultiModalKey(3, 0, 1)
    with pytest.raises(ValueError):
        MultiModalKey("h", -1, 1)
    with pytest.raises(TypeError):
        ExtraKeys(mm=[("h", 1)])


def test_the_adapter_path_enters_only_vllm_compatible_hashes():
    p = toks(0, 8)
    a = ExtraKeys(adapter="a", adapter_path="/x")
    assert a.adapter_path == "/x" and "adapter_path=\"/x\"" in repr(a)
    assert ExtraKeys(adapter="a").adapter_path is None
    own = BlockManager(small_config())
    assert own.block_hashes(p, extra_keys=a) == own.block_hashes(p, extra_keys={"adapter": "a"})
    vllm = BlockManager(mla_cache.CacheConfig(16, block_size=4, block_hash="sha256_cbor"))
    assert vllm.block_hashes(p, extra_keys=a) != vllm.block_hashes(
        p, extra_keys={"adapter": "a", "adapter_path": "/y"}
    )


def test_pin_and_unpin(manager):
    p = toks(0, 8)
    manager.admit(1, p)
    manager.free(1)
    assert manager.pin(p) == 8
    assert manager.stats()["pinned_blocks"] == 2
    assert manager.num_free_blocks == 14
    # Pinned blocks survive a cache-filling request.
    manager.admit(2, toks(100, 156))
    assert manager.match_prefix(p).num_tokens == 8
    assert manager.unpin(p) == 8
    with pytest.raises(ValueError, match="not pinned"):
        manager.unpin(p)
    assert manager.pin(toks(500, 508)) == 0
    manager._check_invariants()


def test_pin_budget_exceeded():
    m = BlockManager(small_config(pin_budget_blocks=1))
    p = toks(0, 9)
    m.admit(1, p)
    with pytest.raises(mla_cache.PinBudgetExceeded):
        m.pin(p)
    assert issubclass(mla_cache.PinBudgetExceeded, RuntimeError)
    assert m.stats()["pinned_blocks"] == 0


def test_stats_dict(manager):
    manager.admit(1, toks(0, 8))
    manager.admit(2, toks(0, 8))
    s = manager.stats()
    assert s["num_blocks"] == 16 and s["used_blocks"] == 3 and s["free_blocks"] == 13
    assert s["cached_blocks"] == 2 and s["num_requests"] == 2
    assert (s["prefix_query_tokens"], s["prefix_hit_tokens"]) == (16, 4)
    assert (s["prefix_query_requests"], s["prefix_hit_requests"]) == (2, 1)
    assert s["usage"] == pytest.approx(3 / 16) and s["hit_rate"] == pytest.approx(0.25)
    assert s["evictions"] == 0 and s["blocks_stored"] == 2 and s["pinned_blocks"] == 0
    assert s["evictable_blocks"] == 0
    assert "BlockManager(num_blocks=16" in repr(manager)


def test_events_mirror_vllm(manager):
    manager.admit(1, toks(0, 9), extra_keys={"adapter": "a"})
    (stored,) = manager.take_events()
    assert isinstance(stored, mla_cache.BlockStored) and isinstance(stored, mla_cache.CacheEvent)
    assert len(stored.block_hashes) == 2 and stored.parent_block_hash is None
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in stored.block_hashes)
    assert stored.token_ids == toks(0, 8) and stored.block_size == 4 and stored.adapter == "a"
    assert manager.take_events() == []
    manager.append(1, toks(9, 12))
    (more,) = manager.take_events()
    assert more.parent_block_hash == stored.block_hashes[1]
    manager.free(1)
    manager.admit(2, toks(100, 164))  # fills the cache: evicts all three
    removed = [e for e in manager.take_events() if isinstance(e, mla_cache.BlockRemoved)]
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(
        stored.block_hashes + more.block_hashes
    )
    assert manager.stats()["evictions"] == 3
    assert "BlockStored(" in repr(stored)


def test_event_hashes_are_the_external_64_bit_ones():
    # The same prompt and seed as the Rust and C tests: the same values.
    manager = mla_cache.BlockManager(small_config(8, hash_seed=42, enable_events=True))
    manager.admit(1, toks(7, 20))
    manager.append(1, toks(20, 23))
    stored, more = manager.take_events()
    assert stored.block_hashes == [
        5565884646872614745,
        11616947711106753066,
        6371776174528016060,
    ]
    assert more.parent_block_hash == stored.block_hashes[2] and more.block_hashes[0] < 2**64
    manager.free(1)
    manager.admit(2, toks(100, 132))  # evicts all four
    events = manager.take_events()
    removed = [h for e in events if isinstance(e, mla_cache.BlockRemoved) for h in e.block_hashes]
    assert sorted(removed) == sorted(stored.block_hashes + more.block_hashes)


def test_reset_prefix_cache(manager):
    manager.admit(1, toks(0, 8))
    assert manager.reset_prefix_cache() is False
    manager.free(1)
    manager.take_events()
    assert manager.reset_prefix_cache() is True
    assert manager.match_prefix(toks(0, 8)).num_tokens == 0
    (cleared,) = manager.take_events()
    assert isinstance(cleared, mla_cache.AllBlocksCleared)


def test_no_events_unless_enabled():
    m = BlockManager(small_config())
    m.admit(1, toks(0, 8))
    assert m.take_events() == []


def test_prefix_caching_can_be_disabled():
    m = BlockManager(small_config(enable_prefix_caching=False))
    m.admit(1, toks(0, 9))
    assert m.admit(2, toks(0, 9)).num_cached_tokens == 0


def test_verify_tokens_config_works():
    m = BlockManager(small_config(verify_tokens=True))
    m.admit(1, toks(0, 9))
    assert m.admit(2, toks(0, 9)).num_cached_tokens == 8


def test_config_property(manager):
    assert manager.config.block_size == BS and manager.config.enable_events


def test_results_are_read_only(manager):
    a = manager.admit(1, [1])
    with pytest.raises(AttributeError):
        a.num_cached_tokens = 3


def test_reserve_grows_the_table_without_tokens(manager):
    manager.admit("a", toks(0, 5))
    out = manager.reserve("a", 11)  # room for 6 lookahead slots: 3 blocks
    assert isinstance(out, mla_cache.AppendOutcome)
    assert out.new_block_ids.dtype == np.int32 and len(out.new_block_ids) == 1
    assert len(out.copies) == 0
    assert manager.num_tokens("a") == 5
    assert manager.block_table("a").tolist()[-1] == out.new_block_ids[0]
    assert len(manager.slot_mapping("a", 5, 12)) == 7
    assert len(manager.reserve("a", 3).new_block_ids) == 0  # never shrinks
    with pytest.raises(ValueError, match="needs 17 blocks"):
        manager.reserve("a", 65)
    with pytest.raises(KeyError):
        manager.reserve("b", 4)
    manager.admit("big", toks(100, 149))  # 13 blocks: 0 left
    with pytest.raises(OutOfBlocks):
        manager.reserve("a", 13)
    # The reserved room is filled before a block is taken.
    assert len(manager.append("a", toks(5, 12)).new_block_ids) == 0
    manager._check_invariants()


def test_reserve_copies_a_tail_shared_with_a_fork(manager):
    manager.admit("p", toks(0, 6))
    manager.fork("p", "c")
    out = manager.reserve("c", 8)
    [(src, dst)] = out.copies
    assert src == manager.block_table("p")[1] and dst == manager.block_table("c")[1]
    manager._check_invariants()


def test_evict_blocks_drops_blocks_from_the_index(manager):
    a = manager.admit("a", toks(0, 9)).block_ids
    manager.take_events()
    # A set, as vLLM passes; the partial block is not cached and is skipped.
    assert manager.evict_blocks({int(a[1]), int(a[2])}) == 1
    assert [type(e).__name__ for e in manager.take_events()] == ["BlockRemoved"]
    assert manager.match_prefix(toks(0, 9)).num_tokens == 4
    assert manager.block_table("a").tolist() == a.tolist()  # still held
    assert manager.evict_blocks(np.array([a[1]], dtype=np.int64)) == 0
    with pytest.raises(ValueError, match="invalid block id 16"):
        manager.evict_blocks([a[0], 16])
    assert manager.pin(toks(0, 4)) == 4
    with pytest.raises(ValueError, match="pinned"):
        manager.evict_blocks([a[0]])
    assert manager.stats()["cached_blocks"] == 1
    manager._check_invariants()


def test_evict_and_evictable_blocks(manager):
    manager.admit("a", toks(0, 13))
    manager.free("a")
    s = manager.stats()
    assert (s["evictable_blocks"], s["cached_blocks"], s["free_blocks"]) == (3, 3, 16)
    assert manager.evict(2) == 2  # tail first, as allocation would
    assert manager.match_prefix(toks(0, 13)).num_tokens == 4
    assert manager.evict(5) == 1
    s = manager.stats()
    assert (s["evictable_blocks"], s["evictions"]) == (0, 3)
    with pytest.raises((OverflowError, ValueError)):
        manager.evict(-1)
    manager._check_invariants()


@pytest.mark.parametrize("policy", mla_cache.EVICTION_POLICIES)
def test_every_eviction_policy_keeps_a_reused_prefix_through_one_offs(policy):
    config = mla_cache.CacheConfig(num_blocks=8, block_size=BS, eviction=policy, hash_seed=3)
    assert config.eviction == policy
    manager = BlockManager(config)
    # A 3-block prefix used twice (a hit the second time), then one-off prompts
    # that need the rest of the cache: every policy evicts within the free
    # blocks, never a block in use, and counts what it evicts.
    for rid in (1, 2):
        manager.admit(rid, toks(0, 13))
        manager.free(rid)
    assert manager.stats()["prefix_hit_tokens"] == 12
    for rid in range(3, 9):
        manager.admit(rid, toks(1000 * rid, 1000 * rid + 17))
        assert len(manager.block_table(rid)) == 5
        manager.free(rid)
    s = manager.stats()
    assert s["evictions"] > 0 and s["free_blocks"] == 8
