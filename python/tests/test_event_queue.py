"""The manager's event queue is bounded by ``max_pending_events``."""

import pytest

from mla_cache import BlockManager, CacheConfig


def test_undrained_events_stop_at_the_cap_and_are_counted():
    m = BlockManager(
        CacheConfig(num_blocks=16, block_size=4, enable_events=True, max_pending_events=5)
    )
    for rid in range(20):
        m.admit(rid, [rid * 100 + t for t in range(9)])
        m.free(rid)
    events = m.take_events()
    assert len(events) == 5
    dropped = m.stats()["events_dropped"]
    assert dropped > 0
    m.admit(99, list(range(9)))
    assert len(m.take_events()) >= 1
    assert m.stats()["events_dropped"] == dropped


def test_a_cap_of_zero_is_refused():
    with pytest.raises(ValueError):
        CacheConfig(max_pending_events=0)
    assert CacheConfig().max_pending_events == 100_000
