import pytest

import mla_cache
from mla_cache import CacheConfig


def test_defaults_and_every_field_as_keyword():
    c = CacheConfig()
    assert c.to_dict() == {
        "num_blocks": 1024,
        "block_size": 64,
        "num_layers": 1,
        "kv_lora_rank": 512,
        "rope_dim": 64,
        "dtype": "bf16",
        "enable_prefix_caching": True,
        "eviction": "arc",
        "hash_seed": None,
        "verify_tokens": False,
        "pin_budget_blocks": None,
        "enable_events": False,
        "cap_hit_at_last_token": True,
        "max_pending_events": 100_000,
        "block_hash": "xxh3",
        "indexer_head_dim": None,
    }
    fields = dict(
        num_blocks=8,
        block_size=16,
        num_layers=3,
        kv_lora_rank=256,
        rope_dim=32,
        dtype="mxfp6",
        enable_prefix_caching=False,
        eviction="lru",
        hash_seed=99,
        verify_tokens=True,
        pin_budget_blocks=2,
        enable_events=True,
        cap_hit_at_last_token=False,
        max_pending_events=7,
        block_hash="sha256_cbor",
        indexer_head_dim=64,
    )
    c = CacheConfig(**fields)
    assert c.to_dict() == fields
    for k, v in fields.items():
        assert getattr(c, k) == v
    assert CacheConfig(**c.to_dict()) == c


def test_preset_and_derived_sizes():
    c = CacheConfig.preset("deepseek-v3", num_blocks=4096, dtype="fp8_ds_mla")
    assert (c.num_layers, c.kv_lora_rank, c.rope_dim, c.dtype) == (61, 512, 64, "fp8_ds_mla")
    assert c.bytes_per_token_per_layer == 656
    assert c.bytes_per_token == 61 * 656 == 40_016
    assert c.bytes_per_block == 40_016 * 64
    assert c.bytes_per_block_per_layer == 656 * 64
    assert c.total_bytes == 40_016 * 64 * 4096
    assert c.num_tokens == 4096 * 64
    assert c.elements_per_token == 576
    assert c.blocks_for_bytes(40_016 * 64 * 3 + 5) == 3
    assert c.blocks_for_bytes(0) == 0
    assert CacheConfig.preset("kimi-k2", dtype="mxfp6").bytes_per_token_per_layer == 528
    assert CacheConfig.preset("deepseek-v2").bytes_per_token == 60 * 1152
    assert "deepseek-v3" in CacheConfig.presets()
    # Overrides reach any other field.
    c = CacheConfig.preset("deepseek-r1", num_blocks=8, enable_events=True, block_size=128)
    assert (c.num_layers, c.enable_events, c.block_size, c.num_blocks) == (61, True, 128, 8)


def test_repr_is_readable_and_evaluates_back():
    c = CacheConfig.preset("deepseek-v3", num_blocks=16, dtype="fp8_ds_mla", hash_seed=5)
    r = repr(c)
    assert r.startswith("CacheConfig(num_blocks=16, block_size=64, num_layers=61")
    assert "dtype='fp8_ds_mla'" in r and "hash_seed=5" in r
    assert "verify_tokens" not in r  # defaults are left out
    assert eval(r, {"CacheConfig": CacheConfig}) == c


def test_replace_returns_a_validated_copy():
    c = CacheConfig(8)
    d = c.replace(num_blocks=9, dtype="fp8")
    assert (c.num_blocks, c.dtype) == (8, "bf16")
    assert (d.num_blocks, d.dtype) == (9, "fp8_ds_mla")
    with pytest.raises(TypeError):
        c.replace(no_such_field=1)
    with pytest.raises(ValueError):
        c.replace(block_size=0)


def test_immutable():
    c = CacheConfig(8)
    with pytest.raises(AttributeError):
        c.num_blocks = 9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_blocks=0), "num_blocks"),
        (dict(num_blocks=2**31), "int32"),
        (dict(block_size=0), "block_size"),
        (dict(num_layers=0), "num_layers"),
        (dict(dtype="fp8_ds_mla", kv_lora_rank=500), "multiple of 128"),
        (dict(dtype="int4"), "unknown dtype"),
        (dict(eviction="fifo"), "unknown eviction"),
        (dict(num_blocks=4, pin_budget_blocks=5), "pin_budget_blocks"),
        (dict(num_blocks=-1), "non-negative"),
        (dict(hash_seed=-3), "non-negative"),
        (dict(num_blocks=2**70), "non-negative"),
    ],
)
def test_invalid_configs_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CacheConfig(**kwargs)


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError):
        CacheConfig("8")
    with pytest.raises(TypeError):
        CacheConfig(8.0)
    with pytest.raises(TypeError):
        CacheConfig(True)
    with pytest.raises(ValueError, match="unknown model preset"):
        CacheConfig.preset("gpt-4")


def test_numpy_integers_are_accepted():
    import numpy as np

    assert CacheConfig(np.int64(8), block_size=np.uint16(4)).num_blocks == 8


def test_help_reads_well():
    doc = mla_cache.CacheConfig.__doc__
    assert "num_blocks" in doc and "replace" in doc
    assert "Admits" in mla_cache.BlockManager.admit.__doc__


def test_block_hash_kinds_are_named_and_unknown_ones_refused():
    for kind in ("xxh3", "sha256_cbor", "xxhash_cbor"):
        c = CacheConfig(8, block_hash=kind)
        assert c.block_hash == kind
        assert f"block_hash='{kind}'" in repr(c) or kind == "xxh3"
    with pytest.raises(ValueError, match="block hash"):
        CacheConfig(8, block_hash="sha256")
