import pytest

import mla_cache


def small_config(num_blocks=16, block_size=4, **kw):
    """A small, deterministic config: 4-token blocks, fixed hash seed."""
    kw.setdefault("hash_seed", 7)
    return mla_cache.CacheConfig(num_blocks, block_size=block_size, **kw)


@pytest.fixture
def manager():
    return mla_cache.BlockManager(small_config(enable_events=True))
