"""BlockManager's batched calls and request queries: all or nothing, equal
to the single calls, writing into the caller's numpy arrays."""

import numpy as np
import pytest

from mla_cache import BlockManager, OutOfBlocks

from conftest import small_config

BS = 4


def toks(a, b):
    return list(range(a, b))


def state(m, ids):
    return m.stats(), [
        (m.block_table(i).tolist(), m.num_tokens(i)) if i in ids else None for i in ids
    ]


def test_append_batch_equals_the_appends_in_turn():
    batched, single = BlockManager(small_config(32)), BlockManager(small_config(32))
    for m in (batched, single):
        m.admit("a", toks(0, 6))
        m.fork("a", "b")  # a shared partial tail: one copy, then in place
        m.admit(3, toks(50, 54))
    outcomes, slots = batched.append_batch(["a", "b", 3], [7, 8, 9, 10, 11], num_tokens=[1, 1, 3])
    assert slots.dtype == np.int64 and slots.shape == (5,)
    expected = []
    for rid, t, o in zip(["a", "b", 3], [[7], [8], [9, 10, 11]], outcomes):
        start = single.num_tokens(rid)
        s = single.append(rid, t)
        assert o.new_block_ids.tolist() == s.new_block_ids.tolist()
        assert o.copies == s.copies
        expected += single.slot_mapping(rid, start, start + len(t)).tolist()
    assert slots.tolist() == expected
    assert [len(o.copies) for o in outcomes] == [1, 0, 0]
    assert batched.stats() == single.stats()
    # Default: one token each.
    _, slots = batched.append_batch(["a", 3], np.array([1, 2], dtype=np.int64))
    assert slots.shape == (2,)
    batched._check_invariants()


def test_a_failing_batch_changes_nothing():
    m = BlockManager(small_config(3))
    m.admit(1, toks(0, 4))
    m.admit(2, toks(10, 14))
    before = m.stats(), m.block_table(1).tolist(), m.block_table(2).tolist()
    with pytest.raises(OutOfBlocks):
        m.append_batch([1, 2], [5, 6])  # two blocks needed, one free
    with pytest.raises(KeyError):
        m.append_batch([1, "nobody"], [5, 6])
    with pytest.raises(ValueError, match="twice"):
        m.append_batch([1, 1], [5, 6])
    with pytest.raises(ValueError, match="token counts"):
        m.append_batch([1, 2], [5, 6, 7])
    with pytest.raises(ValueError):
        m.append_batch([1, 2], [5], num_tokens=[1, 0])
    assert (m.stats(), m.block_table(1).tolist(), m.block_table(2).tolist()) == before
    m._check_invariants()


def test_fill_block_tables_writes_in_place():
    m = BlockManager(small_config(16))
    m.admit(1, toks(0, 9))  # 3 blocks
    m.admit("x", toks(20, 22))  # 1 block
    tables = np.zeros((2, 4), dtype=np.int32)
    slots = np.zeros(4, dtype=np.int64)
    sizes = m.fill_block_tables(["x", 1], tables, pad=-1, positions=[(0, 2), (7, 9)], slot_mapping=slots)
    assert sizes == (3, 4)
    assert tables[0].tolist() == m.block_table("x").tolist() + [-1, -1, -1]
    assert tables[1].tolist() == m.block_table(1).tolist() + [-1]
    assert slots.tolist() == m.slot_mapping("x", 0, 2).tolist() + m.slot_mapping(1, 7, 9).tolist()
    # Too narrow, too short: both sizes in the message, nothing written.
    narrow = np.full((2, 2), 7, dtype=np.int32)
    with pytest.raises(ValueError, match="3 blocks per table row and 4 slots"):
        m.fill_block_tables(["x", 1], narrow, positions=[(0, 2), (7, 9)], slot_mapping=slots[:1])
    assert (narrow == 7).all()
    with pytest.raises(TypeError):
        m.fill_block_tables([1], np.zeros((1, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        m.fill_block_tables([1, 1], np.zeros((4, 2), dtype=np.int32).T)
    with pytest.raises(KeyError):
        m.fill_block_tables([5], np.zeros((1, 4), dtype=np.int32))


def test_free_batch_releases_str_ids_all_or_nothing():
    m = BlockManager(small_config(16))
    m.admit("a", toks(0, 5))
    m.admit("b", toks(0, 5))
    m.admit(3, toks(9, 12))
    with pytest.raises(KeyError):
        m.free_batch(["a", 4])
    with pytest.raises(ValueError):
        m.free_batch(["a", "a"])
    assert m.stats()["num_requests"] == 3
    m.free_batch(["a", 3])
    assert m.stats()["num_requests"] == 1
    with pytest.raises(KeyError):
        m.num_tokens("a")
    m.admit("a", toks(0, 5))  # the name is free again
    m.free_batch(["a", "b"])
    assert m.num_free_blocks == 16


def test_queries():
    m = BlockManager(small_config(8))
    m.admit(1, toks(0, 9), decode_slots=3, chunked_prefill=True)
    assert m.num_computed_tokens(1) == 0 and m.capacity(1) == 3
    m.commit(1, 8)
    assert m.num_computed_tokens(1) == 8
    before = m.stats()
    check = m.would_admit(toks(0, 9))
    assert check == {"num_cached_tokens": 8, "new_blocks": 1, "available_blocks": 5, "fits": True}
    assert not m.would_admit(toks(0, 5), decode_slots=27)["fits"]
    with pytest.raises(ValueError):
        m.would_admit([])
    assert m.stats() == before
    with pytest.raises(KeyError):
        m.capacity(2)
