"""nvfp4_ds_mla against vLLM 0.33's own NVFP4 code, where that code runs on CPU.

Runs in the vLLM venv (``scripts/engine-tests.sh vllm-0.34 -k nvfp4``).

vLLM writes this cache only on Blackwell GPUs: its CUDA op
``concat_and_cache_nvfp4_ds_mla`` and the Triton writer of DeepSeek-V3.2's fused
norm + RoPE kernel both round with the sm_100 instruction
``cvt.rn.satfinite.e2m1x2.f32``, so neither runs here. What runs on CPU is its
torch reference for NVFP4 (``ref_nvfp4_quant``, ``dequantize_to_dtype``,
``break_fp4_bytes`` in ``nvfp4_emulation_utils``). With a global scale of 1 it
computes the same per-16-value scale (``amax / 6`` rounded to e4m3) and codes
(``x * (1 / scale)`` rounded to nearest-even E2M1) as the cache writer, except
where the cache format adds a rule of its own: the scale floor ``2^-9``, NaN
(ignored by the scale, encoded as +6) and the sign of zero. The tests below
compare on bf16 inputs away from those cases, and check the floor apart.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
    break_fp4_bytes,
    dequantize_to_dtype,
    ref_nvfp4_quant,
)

from mla_cache import CacheConfig, LatentStore

BS = 16
# Group s's scale lies at byte 8 * (s % 4) + s // 4 of the scale section.
SCALE_BYTE = [8 * (s % 4) + s // 4 for s in range(32)]
ONE = torch.tensor(1.0, dtype=torch.float32)


def store_and_read(nope: torch.Tensor, rope: torch.Tensor):
    """Writes bf16 latents, returns the raw [T, 352] bytes and the f32 gather."""
    tokens = nope.shape[0]
    blocks = -(-tokens // BS)
    s = LatentStore(CacheConfig(blocks, block_size=BS, dtype="nvfp4_ds_mla", hash_seed=0))
    s.write(0, nope.float().numpy(), rope.float().numpy(), np.arange(tokens))
    raw = torch.from_numpy(s.layer_buffer(0).reshape(-1, 352)[:tokens].copy())
    gathered = torch.from_numpy(np.asarray(s.gather(0, list(range(blocks)), tokens)))
    return raw, gathered


def gaussian_latents(tokens: int, seed: int):
    """bf16 Gaussian latents with a few 30x channels; no zeros, NaN or tiny groups."""
    g = torch.Generator().manual_seed(seed)
    nope = torch.randn(tokens, 512, generator=g)
    nope[:, torch.randperm(512, generator=g)[:6]] *= 30.0
    rope = torch.randn(tokens, 64, generator=g) * 4.0
    return nope.to(torch.bfloat16), rope.to(torch.bfloat16)


def scales_in_group_order(raw: torch.Tensor) -> torch.Tensor:
    return raw[:, 320:352][:, SCALE_BYTE].contiguous()


def test_codes_and_scales_equal_vllm_reference_quantizer():
    nope, rope = gaussian_latents(64, seed=1)
    raw, _ = store_and_read(nope, rope)
    ref_values, ref_scales = ref_nvfp4_quant(nope.float(), ONE, 16)
    # Low nibble first, as vLLM unpacks NVFP4 bytes.
    ours = break_fp4_bytes(raw[:, :256].contiguous(), torch.float32)
    assert torch.equal(ours, ref_values)
    assert torch.equal(scales_in_group_order(raw).view(torch.float8_e4m3fn).float(), ref_scales)


def test_gather_equals_vllm_dequantization():
    nope, rope = gaussian_latents(48, seed=2)
    raw, gathered = store_and_read(nope, rope)
    codes = raw[:, :256].contiguous()
    expected = dequantize_to_dtype(codes, scales_in_group_order(raw), ONE, torch.float32, 16, swizzle=False)
    assert torch.equal(gathered[:, :512], expected)


def test_rope_is_unscaled_e4m3_as_torch_rounds_it():
    nope, rope = gaussian_latents(32, seed=3)
    raw, gathered = store_and_read(nope, rope)
    # |rope| stays far below 448, where torch's (non-saturating) cast agrees.
    expected = rope.float().to(torch.float8_e4m3fn)
    assert torch.equal(raw[:, 256:320], expected.view(torch.uint8))
    assert torch.equal(gathered[:, 512:], expected.float())


def test_scale_of_every_bf16_amax_equals_the_reference():
    # One group per positive finite bf16 value v (the group is [v, 0, ...]):
    # the cache's f32 division amax / 6 and the reference's amax * f32(1/6)
    # round to the same e4m3 scale for every bf16 amax above the floor.
    bits = torch.arange(0x0001, 0x7F80, dtype=torch.int32).to(torch.int16)
    amax = bits.view(torch.bfloat16).float()
    amax = amax[amax / 6 > 2.0**-9]
    groups = -(-amax.numel() // 32) * 32
    nope = torch.zeros(groups, 16)
    nope[: amax.numel(), 0] = amax
    nope = nope.reshape(-1, 512).to(torch.bfloat16)
    raw, _ = store_and_read(nope, torch.zeros(nope.shape[0], 64, dtype=torch.bfloat16))
    _, ref_scales = ref_nvfp4_quant(nope.float(), ONE, 16)
    ours = scales_in_group_order(raw).view(torch.float8_e4m3fn).float()
    n = amax.numel()
    assert torch.equal(ours.reshape(-1)[:n], ref_scales.reshape(-1)[:n])


def test_the_scale_floor_is_the_formats_own_rule():
    # An all-zero group: the reference's scale is 0, the cache's 2^-9 (code 1);
    # both decode to zeros.
    nope = torch.zeros(1, 512, dtype=torch.bfloat16)
    nope[0, 16:32] = 3.0
    raw, gathered = store_and_read(nope, torch.zeros(1, 64, dtype=torch.bfloat16))
    _, ref_scales = ref_nvfp4_quant(nope.float(), ONE, 16)
    ours = scales_in_group_order(raw).view(torch.float8_e4m3fn).float()
    assert ref_scales[0, 0] == 0.0 and ours[0, 0] == 2.0**-9
    assert ours[0, 1] == ref_scales[0, 1] == 0.5
    assert torch.equal(gathered[0, :512], nope[0].float())
