"""Run by test_indexer_layout.py in a subprocess with TRITON_INTERPRET=1 and no
visible CUDA device, so that vLLM's own Triton helper that quantizes and stores
DeepSeek-V3.2's indexer keys (NVIDIA layout) runs on the CPU. Writes the same
keys through mla_cache's host store and compares the two caches.

Triton's interpreter converts f32 to e4m3 unlike the GPU's cvt.rn.satfinite (it
drops the carry of a round-up across a power of two and truncates subnormals),
so rounding is not compared here (tests/indexer_keys.rs checks it against the
definition). Compared byte for byte: where every token's codes and scale lie,
every scale (Gaussian keys with outliers, zeros, tiny and huge values: vLLM's
log2-based scale against mla_cache's exact one), and the codes of keys that
are exactly representable after scaling, which any rounding leaves alone."""

import sys

import ml_dtypes
import numpy as np
import torch
from vllm.models.deepseek_v32.common import kernels as v32
from vllm.triton_utils import tl, triton

import mla_cache

BS, H, BLOCKS = 64, 128, 6


@triton.jit
def _store(keys_ptr, slots_ptr, codes_ptr, scales_ptr, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    t = tl.program_id(0)
    offsets = tl.arange(0, HEAD)
    vals = tl.load(keys_ptr + t * HEAD + offsets).to(tl.float32)
    slot = tl.load(slots_ptr + t)
    # vLLM's helper: (vals, mask, slot, cache, scale cache, block size, block
    # stride in bytes, offsets, head dim, shuffle, tiles, MX scales, FP8_MAX, fnuz).
    v32._fp8_quant_and_cache_write(
        vals, offsets < HEAD, slot, codes_ptr, scales_ptr,
        BLOCK, BLOCK * (HEAD + 4), offsets, HEAD, False, 16, 16, False, 448.0, False,
    )


def gaussian_keys(rng, tokens):
    keys = rng.standard_normal((tokens, H)).astype(np.float32)
    keys[:, rng.choice(H, 4, replace=False)] *= 40.0
    keys *= np.float32(2.0) ** rng.integers(-30, 30, size=(tokens, 1)).astype(np.float32)
    keys[3] = 0.0
    keys[5] *= 1e-6
    keys[9, 0] = 3e30
    return keys


def exact_keys(rng, tokens):
    """Keys whose scaled values are e4m3 values: codes times 2^k with one
    element of magnitude 448 * 2^k, so the scale is exactly 2^k."""
    codes = rng.integers(0, 0x7F, size=(tokens, H)).astype(np.uint8)  # no NaN
    codes |= rng.integers(0, 2, size=(tokens, H)).astype(np.uint8) << 7
    codes[:, 0] = 0x7E | (codes[:, 0] & 0x80)  # +-448
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    k = rng.integers(-20, 20, size=(tokens, 1)).astype(np.float32)
    return values * np.float32(2.0) ** k


def both_caches(keys, slots):
    cache = torch.zeros(BLOCKS * BS * (H + 4), dtype=torch.uint8)
    _store[(len(keys),)](
        torch.from_numpy(keys),
        torch.from_numpy(slots),
        cache.view(torch.float8_e4m3fn),
        cache.view(torch.float32),
        BS,
        H,
    )
    config = mla_cache.CacheConfig(BLOCKS, block_size=BS, dtype="fp8_ds_mla", indexer_head_dim=H)
    store = mla_cache.LatentStore(config)
    store.write_indexer(0, keys, slots)
    ours = store.indexer_buffer(0).reshape(BLOCKS, BS * (H + 4)).copy()
    return ours, cache.numpy().reshape(BLOCKS, BS * (H + 4))


def main():
    rng = np.random.default_rng(7)
    failures = []
    tokens = 300
    slots = rng.permutation(BLOCKS * BS)[:tokens].astype(np.int64)

    ours, theirs = both_caches(gaussian_keys(rng, tokens), slots)
    if not np.array_equal(ours[:, BS * H :], theirs[:, BS * H :]):
        failures.append("scales differ (Gaussian keys)")
    written = np.zeros(BLOCKS * BS, dtype=bool)
    written[slots] = True
    for name, cache in (("mla_cache", ours), ("vLLM", theirs)):
        codes = cache[:, : BS * H].reshape(BLOCKS * BS, H)
        scales = cache[:, BS * H :].reshape(BLOCKS * BS, 4)
        if codes[~written].any() or scales[~written].any():
            failures.append(f"{name} wrote outside the tokens' slots")
        if not scales[written].any(axis=1).all():
            failures.append(f"{name} left a written token without a scale")

    ours, theirs = both_caches(exact_keys(rng, tokens), slots)
    if not np.array_equal(ours, theirs):
        at = np.argwhere(ours != theirs)[0].tolist()
        failures.append(f"exactly representable keys: caches differ, first at {at}")

    for f in failures:
        print(f, file=sys.stderr)
    print(f"{tokens} tokens x 2: layout, scales and exact codes identical" if not failures else "")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
