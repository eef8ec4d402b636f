"""DeepSeek-V3.2's indexer keys beside the latent: the config's counting, the
store's writes and gathers checked against a decoder written here from the
layout, zero-copy buffers, copies and errors."""

import numpy as np
import pytest

from mla_cache import CacheConfig, LatentStore

BS = 16
H = 128


def config(**kw):
    return CacheConfig(8, block_size=BS, num_layers=2, dtype="fp8_ds_mla", indexer_head_dim=H, **kw)


def e4m3(codes):
    """float8 e4m3fn codes to float64, from the definition."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = (c & 7).astype(np.float64)
    value = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e - 7))
    return np.where((c & 0x7F) == 0x7F, np.nan, sign * value)


def decode_block(block, offset):
    """Token `offset` of one block's indexer bytes: codes first, then scales."""
    codes = block[offset * H : (offset + 1) * H]
    scale = block[BS * H + 4 * offset : BS * H + 4 * offset + 4].view(np.float32)[0]
    return e4m3(codes) * float(scale)


def test_the_v32_preset_counts_the_indexer_bytes():
    c = CacheConfig.preset("deepseek-v3.2", 16, "fp8_ds_mla")
    assert c.indexer_head_dim == 128 and c.num_layers == 61
    assert c.latent_bytes_per_token_per_layer == 656
    assert c.indexer_bytes_per_token_per_layer == 132
    assert c.bytes_per_token == 48_068
    assert CacheConfig.preset("deepseek-v3", 16, "fp8_ds_mla").bytes_per_token == 40_016
    assert "deepseek-v3.2" in CacheConfig.presets()
    assert c.to_dict()["indexer_head_dim"] == 128
    assert c.replace(indexer_head_dim=None).indexer_head_dim is None
    assert "indexer_head_dim=128" in repr(c)
    with pytest.raises(ValueError, match="indexer"):
        c.replace(indexer_head_dim=130)


def test_written_keys_decode_as_the_layout_says():
    s = LatentStore(config())
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((20, H)).astype(np.float32) * 3
    keys[4, 7] = 900.0  # an outlier
    slots = np.arange(BS, BS + 20)  # blocks 1 and 2
    s.write_indexer(1, keys, slots)
    buf = s.indexer_buffer(1)
    assert buf.shape == (8, BS, H + 4) and buf.dtype == np.uint8
    got = s.gather_indexer(1, np.array([1, 2], dtype=np.int32), 20)
    assert got.shape == (20, H) and got.dtype == np.float32
    for t in range(20):
        block = buf[1 + t // BS].reshape(-1)
        np.testing.assert_array_equal(got[t], decode_block(block, t % BS).astype(np.float32))
        # The scale is the power of two at or above max(amax, 1e-4) / 448.
        scale = block[BS * H + 4 * (t % BS) :][:4].view(np.float32)[0]
        amax = np.abs(keys[t]).max()
        assert scale >= np.float32(amax) / np.float32(448) > scale / 2
    rel = np.sqrt(((got - keys) ** 2).mean() / (keys**2).mean())
    assert rel < 0.05
    codes, scales = s.gather_indexer_quantized(1, [1, 2], 20)
    assert codes.shape == (20, H) and scales.shape == (20,)
    np.testing.assert_array_equal(codes[3], buf[1, :, :].reshape(-1)[3 * H : 4 * H])
    np.testing.assert_array_equal(e4m3(codes) * scales[:, None].astype(np.float64), got.astype(np.float64))
    # Layer 0 untouched; bfloat16 output equals the float32 rounded.
    assert not s.indexer_buffer(0).any()
    gb = s.gather_indexer(1, [1, 2], 20, dtype="bfloat16")
    np.testing.assert_array_equal(gb.astype(np.float32), got.astype(gb.dtype).astype(np.float32))


def test_the_buffer_is_zero_copy_and_copies_move_the_keys():
    s = LatentStore(config())
    keys = np.arange(BS * H, dtype=np.float32).reshape(BS, H) / 100
    s.write_indexer(0, keys, np.arange(BS))  # block 0
    view = s.indexer_view(0)
    assert view.format == "indexer_fp8" and view.shape == (8, BS, H + 4)
    from_dlpack = np.from_dlpack(view)
    buf = s.indexer_buffer(0)
    assert from_dlpack.ctypes.data == buf.ctypes.data == view.data_ptr()
    s.copy_blocks([(0, 5)])
    np.testing.assert_array_equal(buf[5], buf[0])
    np.testing.assert_array_equal(s.gather_indexer(0, [5], BS), s.gather_indexer(0, [0], BS))
    buf[0, 0, 0] ^= 0x01  # writes through the view reach the store
    assert s.gather_indexer(0, [0], 1)[0, 0] != s.gather_indexer(0, [5], 1)[0, 0]


def test_bad_calls_raise_and_change_nothing():
    s = LatentStore(config())
    keys = np.ones((2, H), dtype=np.float32)
    with pytest.raises(ValueError):
        s.write_indexer(2, keys, [0, 1])
    with pytest.raises(ValueError):
        s.write_indexer(0, keys[:, :64], [0, 1])
    with pytest.raises(ValueError):
        s.write_indexer(0, keys, [0, 8 * BS])
    inside = s.indexer_buffer(1)[0].reshape(-1)[: 2 * H * 4].view(np.float32).reshape(2, H)
    with pytest.raises(ValueError, match="overlaps the store's indexer keys"):
        s.write_indexer(0, inside, [0, 1])
    assert not s.indexer_buffer(0).any()
    plain = LatentStore(CacheConfig(8, block_size=BS))
    with pytest.raises(ValueError, match="no indexer"):
        plain.write_indexer(0, keys, [0, 1])
    with pytest.raises(ValueError, match="no indexer"):
        plain.indexer_buffer(0)
    with pytest.raises(ValueError, match="no indexer"):
        plain.gather_indexer(0, [0], 1)
