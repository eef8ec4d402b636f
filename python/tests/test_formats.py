"""Byte-level checks of fp8_ds_mla and mxfp6 against an independent numpy +
ml_dtypes reading of the layouts in docs/formats.md: decode the stored bytes, compare
with gather and with the inputs, and re-encode the inputs by the spec."""

import ml_dtypes
import numpy as np
import pytest

from mla_cache import CacheConfig, LatentStore

BS = 16
T = 2 * BS


def inputs(seed=0):
    """Gaussian data with a few large channels, as in the accuracy figures of docs/formats.md."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, 576)).astype(np.float32)
    x[:, rng.choice(512, 6, replace=False)] *= 30.0
    x[3, :128] = 0.0  # an all-zero tile
    x[4, 0] = 1e-30  # a tiny value
    return x


def stored(dtype, x):
    s = LatentStore(CacheConfig(4, block_size=BS, dtype=dtype, hash_seed=0))
    s.write(0, x[:, :512], x[:, 512:], np.arange(T))
    raw = s.layer_buffer(0)[:2].reshape(T, -1).copy()
    return raw, s.gather(0, [0, 1], T)


def pow2_scale(amax, maximum, floor):
    v = np.maximum((amax / np.float32(maximum)).astype(np.float32), np.float32(floor))
    return np.exp2(np.ceil(np.log2(v.astype(np.float64)))).astype(np.float32)


def rel_rms(a, b):
    return float(np.sqrt(((a - b) ** 2).mean() / (b**2).mean()))


def test_fp8_ds_mla_bytes():
    x = inputs()
    raw, gathered = stored("fp8_ds_mla", x)
    assert raw.shape == (T, 656)
    codes = raw[:, :512].view(ml_dtypes.float8_e4m3fn)
    scales = raw[:, 512:528].view("<f4")  # [T, 4]
    rope = raw[:, 528:656].view(ml_dtypes.bfloat16)
    # Scales are powers of two, per 128-value tile, as the spec computes them.
    amax = np.abs(x[:, :512]).reshape(T, 4, 128).max(axis=2)
    np.testing.assert_array_equal(scales, pow2_scale(amax, 448.0, 1e-4))
    # Codes are round-to-nearest-even e4m3 of x / scale (exact division).
    expected_codes = (x[:, :512].reshape(T, 4, 128) / scales[:, :, None]).reshape(T, 512)
    np.testing.assert_array_equal(
        codes.view(np.uint8), expected_codes.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    )
    np.testing.assert_array_equal(rope.view(np.uint16), x[:, 512:].astype(ml_dtypes.bfloat16).view(np.uint16))
    decoded = np.concatenate(
        [
            (codes.astype(np.float32).reshape(T, 4, 128) * scales[:, :, None]).reshape(T, 512),
            rope.astype(np.float32),
        ],
        axis=1,
    )
    np.testing.assert_array_equal(decoded, gathered)
    assert rel_rms(decoded[:, :512], x[:, :512]) < 0.035


def e2m3_value(code):
    """E2M3 (1 sign, 2 exponent bits with bias 1, 3 mantissa bits), from the OCP MX spec."""
    sign = np.where(code & 0x20, -1.0, 1.0)
    e = (code >> 3) & 0x3
    m = (code & 0x7).astype(np.float64)
    value = np.where(e == 0, m / 8.0, np.exp2(e - 1.0) * (1.0 + m / 8.0))
    return (sign * value).astype(np.float32)


def unpack6(packed):
    """Element i occupies bits [6i, 6i + 6) of a little-endian bit stream."""
    bits = np.unpackbits(packed, axis=-1, bitorder="little")  # [T, 3072]
    bits = bits.reshape(packed.shape[0], 512, 6).astype(np.uint8)
    return (bits << np.arange(6, dtype=np.uint8)).sum(axis=-1).astype(np.uint8)


def test_mxfp6_bytes():
    x = inputs(1)
    raw, gathered = stored("mxfp6", x)
    assert raw.shape == (T, 528)
    codes = unpack6(raw[:, :384])
    exps = raw[:, 384:400].astype(np.int32)  # UE8M0, one per 32 values
    scales = np.exp2(exps - 127.0).astype(np.float32)
    rope = raw[:, 400:528].view(ml_dtypes.bfloat16)
    amax = np.abs(x[:, :512]).reshape(T, 16, 32).max(axis=2)
    np.testing.assert_array_equal(scales, pow2_scale(amax, 7.5, 2.0**-127))
    # The independent decoder agrees with ml_dtypes' float6_e2m3fn.
    all_codes = np.arange(64, dtype=np.uint8)
    np.testing.assert_array_equal(e2m3_value(all_codes), all_codes.view(ml_dtypes.float6_e2m3fn).astype(np.float32))
    expected_codes = (x[:, :512].reshape(T, 16, 32) / scales[:, :, None]).reshape(T, 512)
    np.testing.assert_array_equal(codes, expected_codes.astype(ml_dtypes.float6_e2m3fn).view(np.uint8))
    np.testing.assert_array_equal(rope.view(np.uint16), x[:, 512:].astype(ml_dtypes.bfloat16).view(np.uint16))
    decoded = np.concatenate(
        [(e2m3_value(codes).reshape(T, 16, 32) * scales[:, :, None]).reshape(T, 512), rope.astype(np.float32)],
        axis=1,
    )
    np.testing.assert_array_equal(decoded, gathered)
    assert rel_rms(decoded[:, :512], x[:, :512]) < 0.05


@pytest.mark.parametrize("dtype, bound", [("fp8_ds_mla", 0.035), ("mxfp6", 0.05), ("nvfp4_ds_mla", 0.11)])
def test_error_bounds_on_gaussian_data(dtype, bound):
    x = np.random.default_rng(5).standard_normal((T, 576)).astype(np.float32)
    _, gathered = stored(dtype, x)
    assert rel_rms(gathered[:, :512], x[:, :512]) < bound
