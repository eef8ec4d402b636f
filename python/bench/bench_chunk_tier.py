"""Throughput and lookup latency of mla_cache's remote tier under an engine's
host cache, on full-size DeepSeek-V3 pages, beside SGLang's ``HiCacheFile``
on the same pages and the server's own loopback throughput for values of
the same size (``redis-benchmark``).

The pages are SGLang 0.5.23's MLA host pool pages (page-first, 64 tokens x
61 layers; ``--dtype fp8_ds_mla``, the default: 2.56 MB, ``fp8``: 2.25 MB),
moved through SGLang's storage calls
(``batch_set_v1``/``batch_get_v1`` for mla_cache, the copying ``set``/``get``
for HiCacheFile) in batches of ``--batch`` pages; lookups are
``batch_exists`` over 128 pages (SGLang's batch), half of them present.

Usage (the SGLang venv's python, servers of scripts/redis.sh running):
    python python/bench/bench_chunk_tier.py --remote redis://127.0.0.1:16379/ [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine_tests" / "sglang"))
import storage_driver as d  # noqa: E402

PAGE_TOKENS = 64
LAYERS = 61


def page_keys(n: int, tag: str) -> list[str]:
    return [f"{tag}-{i:08d}" for i in range(n)]


def measure(ctrl: d.Controller, pages: int, batch: int, rounds: int) -> dict:
    host = ctrl.host
    page_bytes = host.page_size * host.layer_num * host.kv_cache_dim * host.dtype.itemsize
    indices = host.alloc(pages * host.page_size)
    host.kv_buffer.view(torch.uint8).view(-1)[: pages * page_bytes].copy_(
        torch.from_numpy(np.random.default_rng(0).integers(0, 256, pages * page_bytes, dtype=np.uint8)))
    c = ctrl.c
    tag = uuid.uuid4().hex
    keys = page_keys(pages, tag)
    store_s = load_s = 0.0
    for r in range(rounds):
        # Fresh keys each round, so every store writes.
        round_keys = [f"{k}-{r}" for k in keys]
        for i in range(0, pages, batch):
            at = indices[i * host.page_size:(i + batch) * host.page_size]
            start = time.perf_counter()
            assert c.page_set_func(round_keys[i:i + batch], at)
            store_s += time.perf_counter() - start
        for i in range(0, pages, batch):
            at = indices[i * host.page_size:(i + batch) * host.page_size]
            op = d.PrefetchOperation("b", [])
            start = time.perf_counter()
            got = c.page_get_func(op, round_keys[i:i + batch], at)
            load_s += time.perf_counter() - start
            assert got == len(round_keys[i:i + batch])
    probe = [f"{k}-0" for k in keys[:64]] + page_keys(64, "absent-" + tag)
    lookups = []
    for _ in range(200):
        start = time.perf_counter()
        ctrl.backend.batch_exists(probe)
        lookups.append(time.perf_counter() - start)
    moved = pages * rounds * page_bytes
    return {
        "page_bytes": page_bytes,
        "store_gb_s": moved / store_s / 1e9,
        "load_gb_s": moved / load_s / 1e9,
        "lookup_p50_ms": float(np.percentile(lookups, 50)) * 1e3,
        "lookup_p99_ms": float(np.percentile(lookups, 99)) * 1e3,
    }


def redis_benchmark(remote: str, value_bytes: int, n: int) -> dict:
    """The server's own throughput on loopback for one client: ``SET`` of
    new keys (as a tier writes), then ``GET`` of a present key."""
    host, port = remote.split("//", 1)[1].rstrip("/").rsplit(":", 1)

    def rate(test: str, *extra: str) -> float:
        out = subprocess.run(
            ["redis-benchmark", "-h", host, "-p", port, "-t", test, "-d", str(value_bytes),
             "-n", str(n), "-c", "1", "--csv", *extra],
            capture_output=True, text=True, check=True).stdout
        fields = [f.strip('"') for f in out.splitlines()[-1].split(",")]
        return float(fields[1]) * value_bytes / 1e9

    store = rate("set", "-r", "1000000000")
    rate("set")  # the key GET reads
    return {"store_gb_s": store, "load_gb_s": rate("get")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--remote", required=True)
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=sorted(d.DTYPES), default="fp8_ds_mla")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    host = lambda: d.make_host(args.dtype, pages=args.pages, page=PAGE_TOKENS, layers=LAYERS)  # noqa: E731
    results = {}
    ctrl = d.Controller("dynamic", d.mla_settings(args.remote, f"bench-{uuid.uuid4().hex}"), host())
    try:
        results["mla_cache"] = measure(ctrl, args.pages, args.batch, args.rounds)
    finally:
        ctrl.close()
    root = tempfile.mkdtemp(prefix="hicache-bench-")
    ctrl = d.Controller("file", {"file_storage_path": root}, host())
    try:
        results["HiCacheFile"] = measure(ctrl, args.pages, args.batch, args.rounds)
    finally:
        ctrl.close()
        shutil.rmtree(root, ignore_errors=True)
    page_bytes = results["mla_cache"]["page_bytes"]
    results["redis-benchmark"] = redis_benchmark(args.remote, page_bytes, 300)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"pages of {page_bytes / 1e6:.2f} MB ({PAGE_TOKENS} tokens x {LAYERS} layers {args.dtype}), "
          f"batches of {args.batch}, {args.pages * args.rounds} pages each way")
    print(f"{'':16} {'store GB/s':>10} {'load GB/s':>10} {'lookup p50/p99 ms (128 keys)':>30}")
    for name, m in results.items():
        lookup = f"{m['lookup_p50_ms']:.3f}/{m['lookup_p99_ms']:.3f}" if "lookup_p50_ms" in m else "-"
        print(f"{name:16} {m['store_gb_s']:10.2f} {m['load_gb_s']:10.2f} {lookup:>30}")
    server = results["redis-benchmark"]
    ours = results["mla_cache"]
    print(f"mla_cache / server: store {ours['store_gb_s'] / server['store_gb_s']:.2f}, "
          f"load {ours['load_gb_s'] / server['load_gb_s']:.2f}")


if __name__ == "__main__":
    main()
