"""LatentStore on the host: writes, gathers, block copies, zero-copy views,
DLPack and raw-pointer inputs, errors."""

import gc

import ml_dtypes
import numpy as np
import pytest

import mla_cache
from mla_cache import BlockManager, CacheConfig, LatentStore

BS = 16


def config(dtype="bf16", num_layers=2, num_blocks=8):
    return CacheConfig(num_blocks, block_size=BS, num_layers=num_layers, dtype=dtype, hash_seed=1)


def latents(t, seed=0):
    return np.random.default_rng(seed).standard_normal((t, 576)).astype(np.float32)


@pytest.mark.parametrize("dtype", ["bf16", "fp8_ds_mla", "mxfp6", "nvfp4_ds_mla"])
def test_write_then_gather_round_trips(dtype):
    s = LatentStore(config(dtype))
    x = latents(20)
    slots = np.arange(BS, BS + 20)  # blocks 1 and 2
    s.write(1, x[:, :512], x[:, 512:], slots)
    g = s.gather(1, np.array([1, 2], dtype=np.int32), 20)
    assert g.shape == (20, 576) and g.dtype == np.float32
    rel = np.sqrt(((g - x) ** 2).mean() / (x**2).mean())
    assert rel < {"bf16": 0.005, "fp8_ds_mla": 0.035, "mxfp6": 0.05, "nvfp4_ds_mla": 0.11}[dtype]
    gb = s.gather(1, [1, 2], 20, dtype="bfloat16")
    assert gb.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(gb.astype(np.float32), g.astype(ml_dtypes.bfloat16).astype(np.float32))
    # Layer 0 was not touched.
    assert not s.layer_buffer(0).any()


@pytest.mark.parametrize("in_dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_inputs_of_every_float_type_and_layout(in_dtype):
    s = LatentStore(config("bf16"))
    x = latents(5).astype(in_dtype)
    s.write(0, x[:, :512], x[:, 512:], [0, 1, 2, 3, 4])
    expected = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(s.gather(0, [0], 5), expected)
    # Column-strided inputs are copied; reversed rows too.
    wide = np.zeros((5, 1152), dtype=in_dtype)
    wide[:, ::2] = x
    s.write(0, wide[:, :1024:2], wide[:, 1024::2], np.arange(5) + BS)
    s.write(0, x[::-1, :512], x[::-1, 512:], np.arange(5)[::-1] + 2 * BS)
    np.testing.assert_array_equal(s.gather(0, [1], 5), expected)
    np.testing.assert_array_equal(s.gather(0, [2], 5), expected)


def test_negative_slots_are_skipped():
    s = LatentStore(config())
    x = latents(3)
    s.write(0, x[:, :512], x[:, 512:], np.array([5, -1, 7]))
    buf = s.layer_buffer(0)
    assert buf[0, 5].any() and not buf[0, 6].any() and buf[0, 7].any()


def test_bf16_bytes_are_exact():
    s = LatentStore(config("bf16"))
    x = latents(2).astype(ml_dtypes.bfloat16)
    s.write(0, x[:, :512], x[:, 512:], [3, 4])
    raw = s.layer_buffer(0)[0, 3:5]  # [2, 1152] bytes
    np.testing.assert_array_equal(raw.view(np.uint16), x.view(np.uint16))


def test_gather_into_out():
    s = LatentStore(config())
    x = latents(4)
    s.write(0, x[:, :512], x[:, 512:], [0, 1, 2, 3])
    out = np.full((4, 576), np.nan, dtype=np.float32)
    assert s.gather(0, [0], 4, out=out) is out
    np.testing.assert_allclose(out, x, rtol=1e-2, atol=1e-2)
    bf = np.zeros((4, 576), dtype=ml_dtypes.bfloat16)
    s.gather(0, [0], 4, out=bf, dtype="bfloat16")
    with pytest.raises(ValueError, match="rows"):
        s.gather(0, [0], 3, out=out)
    with pytest.raises(ValueError, match="disagrees"):
        s.gather(0, [0], 4, out=out, dtype="bfloat16")
    ro = out.copy()
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        s.gather(0, [0], 4, out=ro)
    with pytest.raises(ValueError, match="contiguous"):
        s.gather(0, [0], 4, out=np.zeros((4, 1152), np.float32)[:, ::2])
    with pytest.raises(TypeError):
        s.gather(0, [0], 4, out=np.zeros((4, 576), np.float16))
    with pytest.raises(ValueError, match="dtype"):
        s.gather(0, [0], 4, dtype="int8")


def test_copy_blocks_copies_every_layer():
    s = LatentStore(config())
    for layer in range(2):
        x = latents(BS, seed=layer)
        s.write(layer, x[:, :512], x[:, 512:], np.arange(BS) + 2 * BS)
    s.copy_blocks([(2, 5)])
    s.copy_blocks(np.array([[2, 6]], dtype=np.int64))
    for layer in range(2):
        buf = s.layer_buffer(layer)
        np.testing.assert_array_equal(buf[5], buf[2])
        np.testing.assert_array_equal(buf[6], buf[2])
    with pytest.raises(ValueError, match="both"):
        s.copy_blocks([(1, 2), (2, 3)])
    with pytest.raises(ValueError):
        s.copy_blocks([(1, 99)])
    with pytest.raises(ValueError):
        s.copy_blocks([(1, -1)])
    with pytest.raises(ValueError, match="src, dst"):
        s.copy_blocks([(1, 2, 3)])
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        s.copy_blocks(np.zeros((2, 3), dtype=np.int32))


def test_manager_and_store_together():
    c = config("fp8_ds_mla")
    m, s = BlockManager(c), LatentStore(c)
    prompt = np.arange(20)
    m.admit("a", prompt)
    x = latents(20)
    s.write(0, x[:, :512], x[:, 512:], m.slot_mapping("a", 0, 20))
    m.fork("a", "b")
    out = m.append("b", [7])
    s.copy_blocks(out.copies)
    g_a = s.gather(0, m.block_table("a"), 20)
    g_b = s.gather(0, m.block_table("b"), 20)
    np.testing.assert_array_equal(g_a, g_b)
    assert m.block_table("a")[1] != m.block_table("b")[1]


def test_layer_buffer_is_a_zero_copy_view_that_keeps_the_store_alive():
    s = LatentStore(config("mxfp6"))
    buf = s.layer_buffer(1)
    assert buf.shape == (8, BS, 528) and buf.dtype == np.uint8 and buf.flags.writeable
    assert buf.ctypes.data == s.data_ptr(1)
    x = latents(1)
    del s
    gc.collect()
    buf[0, 0, 0] = 7  # still mapped
    assert buf[0, 0, 0] == 7
    assert isinstance(buf.base, LatentStore)


def test_layer_view_exports_dlpack():
    s = LatentStore(config("fp8_ds_mla"))
    x = latents(2)
    s.write(0, x[:, :512], x[:, 512:], [0, 1])
    before = s.layer_buffer(0).copy()
    v = s.layer_view(0)
    assert isinstance(v, mla_cache.LayerBuffer)
    assert v.shape == (8, BS, 656) and v.strides == (BS * 656, 656, 1)
    assert (v.dtype, v.format, v.device, v.layer, v.nbytes) == ("uint8", "fp8_ds_mla", "cpu", 0, 8 * BS * 656)
    assert v.__dlpack_device__() == (1, 0)
    assert v.data_ptr() == s.data_ptr(0)
    a = np.from_dlpack(v)
    assert a.shape == v.shape and a.dtype == np.uint8 and a.ctypes.data == v.data_ptr()
    assert np.shares_memory(a, s.layer_buffer(0))
    del s, v
    gc.collect()
    np.testing.assert_array_equal(a, before)  # the capsule keeps the store alive
    # An unconsumed capsule frees itself.
    LatentStore(config()).layer_view(1).__dlpack__()
    with pytest.raises(BufferError):
        LatentStore(config()).layer_view(0).__dlpack__(copy=True)
    with pytest.raises(BufferError):
        LatentStore(config()).layer_view(0).__dlpack__(dl_device=(2, 0))


class DLPackOnly:
    """An array seen only through the DLPack protocol (as a torch tensor is)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_and_raw_tuple_inputs():
    s = LatentStore(config())
    x = latents(4)
    c, k = x[:, :512].copy(), x[:, 512:].copy()
    slots = np.arange(4, dtype=np.int64)
    s.write(0, DLPackOnly(c), DLPackOnly(k), DLPackOnly(slots))
    expected = s.gather(0, [0], 4)
    s.write(
        1,
        (c.ctypes.data, c.shape, "float32"),
        (k.ctypes.data, list(k.shape), np.float32),
        (slots.ctypes.data, (4,), "int64"),
    )
    table = np.zeros(1, dtype=np.int32)
    out = np.zeros((4, 576), dtype=np.float32)
    s.gather(1, (table.ctypes.data, (1,), "int32"), 4, out=(out.ctypes.data, (4, 576), "torch.float32"))
    np.testing.assert_array_equal(out, expected)
    s.gather(1, DLPackOnly(table), 4, out=DLPackOnly(out))
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(TypeError, match="int64"):
        s.write(0, c, k, (slots.ctypes.data, (4,), "int32"))
    with pytest.raises(TypeError):
        s.write(0, (c.ctypes.data, c.shape, "float64"), k, slots)


def test_store_argument_errors():
    s = LatentStore(config())
    x = latents(2)
    c, k = x[:, :512], x[:, 512:]
    with pytest.raises(ValueError, match="layer 2 out of range"):
        s.write(2, c, k, [0, 1])
    with pytest.raises(ValueError, match="shape"):
        s.write(0, x[:, :500], k, [0, 1])
    with pytest.raises(ValueError, match="expected"):
        s.write(0, c, k, [0, 1, 2])
    with pytest.raises(ValueError, match="out of range"):
        s.write(0, c, k, [0, 8 * BS])
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        s.write(0, c.astype(np.float64), k, [0, 1])
    with pytest.raises(TypeError):
        s.write(0, c.astype(np.int32), k, [0, 1])
    with pytest.raises(ValueError, match="2-D"):
        s.write(0, c[0], k, [0])
    with pytest.raises(TypeError):
        s.write(0, c.tolist(), k, [0, 1])
    with pytest.raises(ValueError, match="outside"):
        s.write(0, c, k, [0, 2**63])
    with pytest.raises(ValueError, match="overlaps"):
        s.write(0, s.layer_buffer(0)[0, :2, :1024].view(ml_dtypes.bfloat16), k, [0, 1])
    with pytest.raises(ValueError, match="overlaps"):
        s.gather(0, [0], 2, out=s.layer_buffer(1)[0, :2, :].view(np.float32)[:, :576])
    with pytest.raises(ValueError, match="block_table has 1 entries"):
        s.gather(0, [0], BS + 1)
    with pytest.raises(ValueError, match="invalid block id"):
        s.gather(0, [99], 1)
    with pytest.raises(ValueError, match="outside"):
        s.gather(0, [-1], 1)
    with pytest.raises(ValueError):
        s.layer_buffer(2)
    with pytest.raises(ValueError, match="unknown device"):
        LatentStore(config(), "tpu")


def test_cuda_without_support_is_a_clear_error():
    with pytest.raises(mla_cache.StorageError, match="cuda:0"):
        LatentStore(config(), "cuda:0")
    assert issubclass(mla_cache.StorageError, RuntimeError)


def test_repr_and_properties():
    s = LatentStore(config("mxfp6"))
    assert s.device == "cpu" and s.config.dtype == "mxfp6"
    assert repr(s).startswith("LatentStore(device='cpu', num_layers=2")
    assert "LayerBuffer(layer=1" in repr(s.layer_view(1))
