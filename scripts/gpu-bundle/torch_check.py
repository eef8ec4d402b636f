"""The GPU check's part in PyTorch (run by run.sh with the bundle's wheel):

1. For every format, a round trip through DLPack on torch's current stream:
   mla_cache writes a layer on the GPU, torch reads it (``torch.from_dlpack``)
   and must see the bytes the CPU codec writes; torch writes a layer, and
   mla_cache's gather must decode it as the CPU codec does, bit for bit.
2. Bandwidth: ``write``, ``gather`` and ``copy_blocks`` beside torch's own
   device-to-device copy of the same bytes, in the same run (CUDA events).
   A kernel's bandwidth counts the bytes it reads and writes; the copy moves
   as many bytes as the kernel writes (read once, written once). The ratio
   is the kernel's bandwidth over the copy's.

Writes OUT/torch_check.txt and OUT/torch_check.json; exits 1 on a mismatch.
Usage: python3 torch_check.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

import mla_cache

FORMATS = ("bf16", "fp8_ds_mla", "mxfp6", "nvfp4_ds_mla")
BLOCK = 64


def config(dtype: str, blocks: int) -> mla_cache.CacheConfig:
    return mla_cache.CacheConfig(blocks, block_size=BLOCK, num_layers=2, dtype=dtype)


def round_trip(dtype: str) -> list[str]:
    """The DLPack round trip; returns what differs (nothing when it passes)."""
    blocks, tokens = 64, 8 * BLOCK
    cfg = config(dtype, blocks)
    gpu, host = mla_cache.LatentStore(cfg, "cuda:0"), mla_cache.LatentStore(cfg, "cpu")
    torch.manual_seed(0)
    stream = torch.cuda.current_stream()
    c_kv = torch.randn(tokens, cfg.kv_lora_rank, dtype=torch.bfloat16, device="cuda")
    k_pe = torch.randn(tokens, cfg.rope_dim, dtype=torch.bfloat16, device="cuda")
    slots = torch.randperm(blocks * BLOCK, device="cuda")[:tokens].to(torch.int64)
    gpu.write(0, c_kv, k_pe, slots, stream=stream.cuda_stream)
    host.write(0, c_kv.cpu(), k_pe.cpu(), slots.cpu().numpy())
    problems = []
    # torch reads the layer mla_cache wrote.
    layer0 = torch.from_dlpack(gpu.layer_view(0))
    want0 = torch.from_numpy(host.layer_buffer(0).copy())
    if not torch.equal(layer0.cpu(), want0):
        problems.append(f"{dtype}: the layer torch reads differs from the CPU codec's bytes")
    # torch writes a layer; mla_cache decodes it.
    layer1 = torch.from_dlpack(gpu.layer_view(1))
    layer1.copy_(want0.to("cuda"))
    table = torch.arange(blocks, dtype=torch.int32, device="cuda")
    out = torch.empty(blocks * BLOCK, cfg.elements_per_token, dtype=torch.float32, device="cuda")
    gpu.gather(1, table, blocks * BLOCK, out=out, stream=stream.cuda_stream)
    want = host.gather(0, np.arange(blocks, dtype=np.int32), blocks * BLOCK)
    if not np.array_equal(out.cpu().numpy().view(np.uint32), want.view(np.uint32)):
        problems.append(f"{dtype}: mla_cache's gather of torch's bytes differs from the CPU codec's")
    return problems


def timed(fn, iters: int = 50) -> float:
    """Mean milliseconds of ``fn`` on torch's current stream."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def copy_ms(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src))


def bandwidth(dtype: str) -> list[dict]:
    tokens = 16_384
    blocks = 2 * tokens // BLOCK
    cfg = config(dtype, blocks)
    gpu = mla_cache.LatentStore(cfg, "cuda:0")
    s = torch.cuda.current_stream().cuda_stream
    bpt = cfg.latent_bytes_per_token_per_layer
    c_kv = torch.randn(tokens, cfg.kv_lora_rank, dtype=torch.bfloat16, device="cuda")
    k_pe = torch.randn(tokens, cfg.rope_dim, dtype=torch.bfloat16, device="cuda")
    slots = torch.arange(tokens, dtype=torch.int64, device="cuda")
    table = torch.arange(tokens // BLOCK, dtype=torch.int32, device="cuda")
    out = torch.empty(tokens, cfg.elements_per_token, dtype=torch.bfloat16, device="cuda")
    n = tokens // BLOCK
    pairs = np.stack([np.arange(n), np.arange(n, 2 * n)], axis=1).astype(np.int64)
    rows = []
    for op, fn, read, written in (
        ("write", lambda: gpu.write(0, c_kv, k_pe, slots, stream=s),
         tokens * (cfg.elements_per_token * 2 + 8), tokens * bpt),
        ("gather", lambda: gpu.gather(0, table, tokens, out=out, stream=s),
         tokens * bpt + n * 4, tokens * cfg.elements_per_token * 2),
        ("copy_blocks", lambda: gpu.copy_blocks(pairs, stream=s),
         cfg.num_layers * n * BLOCK * bpt, cfg.num_layers * n * BLOCK * bpt),
    ):
        ms = timed(fn)
        ref = copy_ms(written)
        kernel_gbs = (read + written) / ms / 1e6
        copy_gbs = 2 * written / ref / 1e6
        rows.append({"format": dtype, "op": op, "tokens": tokens, "ms": ms, "gb_s": kernel_gbs,
                     "torch_copy_ms": ref, "torch_copy_gb_s": copy_gbs, "ratio": kernel_gbs / copy_gbs})
    return rows


def main() -> int:
    out = Path(sys.argv[1])
    lines = [f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}"]
    problems = []
    for dtype in FORMATS:
        found = round_trip(dtype)
        problems += found
        lines.append(f"dlpack round trip {dtype}: {'ok' if not found else 'FAIL'}")
    rows = [r for dtype in FORMATS for r in bandwidth(dtype)]
    lines.append(f"{'format':14} {'op':12} {'GB/s':>8} {'torch copy GB/s':>16} {'ratio':>6}")
    for r in rows:
        lines.append(f"{r['format']:14} {r['op']:12} {r['gb_s']:8.1f} {r['torch_copy_gb_s']:16.1f} {r['ratio']:6.2f}")
    lines += problems
    (out / "torch_check.txt").write_text("\n".join(lines) + "\n")
    (out / "torch_check.json").write_text(json.dumps({"problems": problems, "bandwidth": rows}, indent=1))
    print("\n".join(lines))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
