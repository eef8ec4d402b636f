"""BlockManager keyed by the caller's block digests (vLLM's
``request.block_hashes``): admit / commit with ``block_hashes=`` and
``match_block_hashes``. Bad input raises and leaves the manager unchanged."""

import hashlib

import pytest

import mla_cache
from mla_cache import BlockManager, BlockStored

from conftest import small_config

BS = 4


def digests(n, tag="a", size=32):
    """``n`` distinct digests of ``size`` bytes (a stand-in engine hasher)."""
    return [hashlib.sha256(f"{tag}{i}".encode()).digest()[:size] for i in range(n)]


def external(d):
    """The 64-bit hash vLLM publishes for a digest."""
    return int.from_bytes(d, "big") & (2**64 - 1)


def snapshot(m):
    s = m.stats()
    return s, m.num_free_blocks


@pytest.fixture
def cbor():
    return BlockManager(small_config(block_hash="sha256_cbor", enable_events=True))


def test_admission_and_lookup_by_digests_share_blocks(cbor):
    d = digests(3)
    a = cbor.admit("a", list(range(12)), block_hashes=d)
    assert a.num_cached_tokens == 0
    found = cbor.match_block_hashes(d)
    assert found.num_tokens == 12 and list(found.block_ids) == list(a.block_ids)
    assert cbor.match_block_hashes(d[:2] + digests(1, "z")).num_tokens == 8
    assert cbor.match_block_hashes(digests(3, "z")).num_tokens == 0
    assert cbor.match_block_hashes([]).num_tokens == 0
    # A second request with the same digests (any tokens: the digests decide) hits.
    b = cbor.admit("b", list(range(100, 113)), block_hashes=d)
    assert b.num_cached_tokens == 12
    assert list(b.block_ids[:3]) == list(a.block_ids)
    cbor._check_invariants()


def test_events_carry_the_digests_external_hashes(cbor):
    d = digests(2)
    cbor.admit("a", list(range(9)), block_hashes=d)
    (stored,) = cbor.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [external(x) for x in d]
    assert stored.token_ids == list(range(8))


def test_chunked_commits_index_blocks_as_their_digests_come():
    m = BlockManager(small_config(block_hash="xxhash_cbor"))
    d = digests(4, size=16)
    m.admit("a", [1], decode_slots=15, chunked_prefill=True, block_hashes=[])
    assert m.match_block_hashes(d).num_tokens == 0
    # Past the one token given: the commit reaches into the reserved room.
    m.commit("a", 9, block_hashes=d[:2])
    assert m.match_block_hashes(d).num_tokens == 8
    assert m.num_tokens("a") == 9
    m.commit("a", 16, block_hashes=d[2:])
    assert m.match_block_hashes(d).num_tokens == 16
    m._check_invariants()
    m.free("a")
    assert m.match_block_hashes(d).num_tokens == 16  # cached until evicted
    m._check_invariants()


def test_commit_without_digests_leaves_caller_hashed_blocks_unindexed(cbor):
    d = digests(2)
    cbor.admit("a", list(range(8)), chunked_prefill=True, block_hashes=d)
    cbor.commit("a", 8)
    assert cbor.match_block_hashes(d).num_tokens == 0
    cbor.commit("a", 8, block_hashes=d)
    assert cbor.match_block_hashes(d).num_tokens == 8
    cbor._check_invariants()


@pytest.mark.parametrize(
    "config, kwargs, error, match",
    [
        ({}, {}, ValueError, "sha256_cbor"),  # the library's own xxh3 chain
        ({"block_hash": "sha256_cbor", "verify_tokens": True}, {}, ValueError, "verify_tokens"),
        ({"block_hash": "sha256_cbor"}, {"size": 16}, ValueError, "32 bytes"),
        ({"block_hash": "xxhash_cbor"}, {"size": 32}, ValueError, "16 bytes"),
        ({"block_hash": "sha256_cbor"}, {"count": 1}, ValueError, "1 block hashes for 2 full blocks"),
        ({"block_hash": "sha256_cbor"}, {"count": 3}, ValueError, "3 block hashes"),
        ({"block_hash": "sha256_cbor"}, {"items": ["not bytes", b"x" * 32]}, TypeError, "block hash 0 must be bytes, got str"),
        ({"block_hash": "sha256_cbor"}, {"items": 5}, TypeError, "not iterable"),
    ],
)
def test_bad_digests_are_refused_and_change_nothing(config, kwargs, error, match):
    m = BlockManager(small_config(**config))
    m.admit("held", [9] * 5)
    before = snapshot(m)
    items = kwargs.get("items", digests(kwargs.get("count", 2), size=kwargs.get("size", 32)))
    with pytest.raises(error, match=match):
        m.admit("a", list(range(9)), block_hashes=items)
    if kwargs.get("count") is None:
        with pytest.raises(error, match=match):
            m.match_block_hashes(items)
    assert snapshot(m) == before
    with pytest.raises(KeyError):
        m.num_tokens("a")
    m._check_invariants()


def test_a_lookup_reads_digests_only_up_to_its_first_miss(cbor):
    d = digests(2)
    cbor.admit("a", list(range(9)), block_hashes=d)
    assert cbor.match_block_hashes(d + digests(1, "z") + ["never read"]).num_tokens == 8
    with pytest.raises(TypeError, match="block hash 2 must be bytes"):
        cbor.match_block_hashes(d + ["read"])
    # Any other iterable is read whole.
    with pytest.raises(TypeError, match="block hash 3 must be bytes"):
        cbor.match_block_hashes(tuple(digests(3, "z") + ["read"]))


def test_bad_commits_are_refused_and_change_nothing(cbor):
    d = digests(4)
    cbor.admit("a", list(range(8)), decode_slots=8, chunked_prefill=True, block_hashes=d[:2])
    cbor.admit("own", list(range(8)), chunked_prefill=True)
    # Past the 8 tokens given, while events (which carry token ids) are on.
    with pytest.raises(ValueError, match="events carry token ids"):
        cbor.commit("a", 12, block_hashes=d[2:3])
    cbor.append("a", list(range(8, 16)))
    # A chunked admission indexes only its hit (none here): commits name
    # every full block from there.
    cbor.commit("a", 8, block_hashes=d[:2])
    before = snapshot(cbor), cbor.take_events()
    cases = [
        (("a", 12), {"block_hashes": d[2:]}, "2 block hashes for the 1 blocks this commit makes full"),
        (("a", 16), {"block_hashes": d[2:3]}, "1 block hashes for the 2"),
        (("a", 17), {"block_hashes": d[2:]}, "16 slots"),
        (("a", 4), {"block_hashes": []}, "backwards"),
        (("own", 8), {"block_hashes": d[:2]}, "without caller block hashes"),
    ]
    for args, kw, match in cases:
        with pytest.raises(ValueError, match=match):
            cbor.commit(*args, **kw)
    with pytest.raises(KeyError):
        cbor.commit("nobody", 4, block_hashes=[])
    assert (snapshot(cbor), cbor.take_events()) == (before[0], [])
    assert cbor.num_tokens("a") == 16
    cbor._check_invariants()
    cbor.commit("a", 16, block_hashes=d[2:])
    assert cbor.match_block_hashes(d).num_tokens == 16


def test_without_prefix_caching_digests_are_counted_and_ignored():
    m = BlockManager(small_config(block_hash="sha256_cbor", enable_prefix_caching=False))
    d = digests(2)
    m.admit("a", list(range(8)), block_hashes=d)
    assert m.match_block_hashes(d).num_tokens == 0
    with pytest.raises(ValueError, match="block hashes for 2 full blocks"):
        m.admit("b", list(range(8)), block_hashes=d[:1])
    m._check_invariants()


def test_the_adapter_refuses_verify_tokens():
    from mla_cache.vllm import KVCacheManager

    with pytest.raises(ValueError, match="verify_tokens"):
        KVCacheManager.from_config(small_config(verify_tokens=True))
    assert isinstance(KVCacheManager.from_config(small_config()).manager, BlockManager)
    assert KVCacheManager.from_config(small_config()).manager.config.block_hash == "sha256_cbor"
    assert mla_cache.BlockManager is BlockManager
