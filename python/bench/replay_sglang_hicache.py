"""Replays a Mooncake-format trace through SGLang 0.5.23's HiCache storage
path: its cache controller's storage calls (``_storage_hit_query``,
``_page_transfer``, ``_page_backup``) over its MLA host pool, with
mla_cache's backend (``mla_cache.sglang_storage``), SGLang's ``HiCacheFile``,
or no storage, then a second, cold process on the same storage.

The tiers above storage (SGLang's device cache and host pool) are one LRU of
``--upper-pages`` pages; a request hits its leading pages there, then asks
storage for the rest (SGLang's prefetch: one existence check per 128 pages,
then the load), computes what is left and writes every new page back
(HiCache's write-back to storage). One trace block (512 tokens) is one
page; a page holds ``--page-tokens`` tokens of ``--layers`` layers of
DeepSeek's latent in bf16 (kept small so the whole trace fits in memory:
hit rates do not depend on it, throughput does: see
``bench_chunk_tier.py`` for full-size pages).

Usage (the SGLang venv's python, servers of scripts/redis.sh running):
    python python/bench/replay_sglang_hicache.py --remote redis://127.0.0.1:16379/ \\
        --file-dir /tmp/hicache [--upper-pages 4096] [--requests N] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine_tests" / "sglang"))
import storage_driver as d  # noqa: E402
from replay_vllm_adapter import parse_trace  # noqa: E402
from sglang.srt.managers.cache_controller import PrefetchOperation, StorageOperation  # noqa: E402

TRACE = HERE.parents[1] / "data" / "mooncake_synthetic_trace.jsonl"


def tokens_of(hash_ids: tuple[int, ...]) -> list[int]:
    """Tokens whose pages chain exactly as the trace's blocks: one page per
    hash id, its tokens a function of the id."""
    return [(h * d.PAGE + j) % 1_000_000_007 for h in hash_ids for j in range(d.PAGE)]


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else 0.0


class Replay:
    def __init__(self, backend: Optional[str], settings: dict, upper_pages: int) -> None:
        self.upper: OrderedDict[str, None] = OrderedDict()
        self.upper_pages = upper_pages
        self.ctrl = d.Controller(backend, settings, d.make_host("bf16", pages=512)) if backend else None
        self.page_bytes = d.PAGE * d.LAYERS * 1152
        self.m = dict(prompt_pages=0, upper_hit_pages=0, storage_hit_pages=0, computed_pages=0,
                      load_bytes=0, load_s=0.0, store_bytes=0, store_s=0.0)
        self.lookups: list[float] = []

    def request(self, hash_ids: tuple[int, ...]) -> None:
        tokens = tokens_of(hash_ids)
        hashes = d.get_storage_hash_str(tokens, None, page_size=d.PAGE)
        n = len(hashes)
        upper = 0
        while upper < n and hashes[upper] in self.upper:
            self.upper.move_to_end(hashes[upper])
            upper += 1
        loaded = 0
        if self.ctrl is not None and upper < n:
            c = self.ctrl.c
            op = PrefetchOperation("r", tokens[upper * d.PAGE:], last_hash=hashes[upper - 1] if upper else None)
            start = time.perf_counter()
            hit_hashes, hit_tokens = c._storage_hit_query(op)
            self.lookups.append(time.perf_counter() - start)
            if hit_hashes:
                op.hash_value = hit_hashes
                op.host_indices = self.ctrl.host.alloc(hit_tokens)
                start = time.perf_counter()
                loaded = c._page_transfer(op)
                self.m["load_s"] += time.perf_counter() - start
                self.m["load_bytes"] += loaded * self.page_bytes
                self.ctrl.host.free(op.host_indices)
        new = list(range(upper + loaded, n))
        if self.ctrl is not None and new:
            indices = self.ctrl.host.alloc(len(new) * d.PAGE)
            buf = self.ctrl.host.kv_buffer.view(torch.uint8).view(-1, self.page_bytes)
            for i, page in enumerate(new):
                rng = np.random.default_rng(int(hashes[page][:15], 16))
                buf[indices[i * d.PAGE].item() // d.PAGE].copy_(
                    torch.from_numpy(rng.integers(0, 256, self.page_bytes, dtype=np.uint8)))
            op = StorageOperation(indices, tokens[new[0] * d.PAGE:], hash_value=[hashes[p] for p in new],
                                  prefix_keys=None)
            start = time.perf_counter()
            self.ctrl.c._page_backup(op)
            self.m["store_s"] += time.perf_counter() - start
            self.m["store_bytes"] += op.completed_tokens // d.PAGE * self.page_bytes
            self.ctrl.host.free(indices)
        for h in hashes:
            self.upper[h] = None
            self.upper.move_to_end(h)
        while len(self.upper) > self.upper_pages:
            self.upper.popitem(last=False)
        self.m["prompt_pages"] += n
        self.m["upper_hit_pages"] += upper
        self.m["storage_hit_pages"] += loaded
        self.m["computed_pages"] += len(new)

    def report(self) -> dict[str, Any]:
        m = dict(self.m)
        m["hit_rate"] = (m["upper_hit_pages"] + m["storage_hit_pages"]) / max(m["prompt_pages"], 1)
        m["load_gb_s"] = m["load_bytes"] / m["load_s"] / 1e9 if m["load_s"] else 0.0
        m["store_gb_s"] = m["store_bytes"] / m["store_s"] / 1e9 if m["store_s"] else 0.0
        m["lookup_p50_ms"] = percentile(self.lookups, 50) * 1e3
        m["lookup_p99_ms"] = percentile(self.lookups, 99) * 1e3
        if self.ctrl is not None:
            counters = getattr(self.ctrl.backend, "counters", None)
            if counters is not None:
                m["counters"] = counters()
            self.ctrl.close()
        return m


def run(backend: Optional[str], settings: dict, upper_pages: int, trace: list) -> dict[str, Any]:
    replay = Replay(backend, settings, upper_pages)
    for r in trace:
        replay.request(r.hash_ids)
    return replay.report()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--remote", required=True)
    ap.add_argument("--file-dir", type=Path, default=None)
    ap.add_argument("--upper-pages", type=int, default=4096)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # one run, for the cold process
    ap.add_argument("--namespace", help=argparse.SUPPRESS)
    args = ap.parse_args()
    trace = parse_trace(args.trace.read_text())[: args.requests]
    file_dir = args.file_dir or Path(tempfile.mkdtemp(prefix="hicache-"))
    ns = args.namespace or f"replay-{uuid.uuid4().hex}"
    runs = {
        "none": (None, {}),
        "file": ("file", {"file_storage_path": str(file_dir)}),
        "mla_cache": ("dynamic", d.mla_settings(args.remote, ns)),
    }
    if args.only:
        print(json.dumps(run(*runs[args.only], args.upper_pages, trace)))
        return
    results = {name: run(*spec, args.upper_pages, trace) for name, spec in runs.items()}
    # A second, cold process: nothing above storage, everything from storage.
    for name in ("file", "mla_cache"):
        out = subprocess.run(
            [sys.executable, __file__, "--trace", str(args.trace), "--remote", args.remote,
             "--file-dir", str(file_dir), "--upper-pages", str(args.upper_pages), "--only", name,
             "--namespace", ns] + (["--requests", str(args.requests)] if args.requests else []),
            capture_output=True, text=True, check=True)
        results[f"{name} (cold process)"] = json.loads(out.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{len(trace)} requests, upper tiers {args.upper_pages} pages, page {d.PAGE} tokens x {d.LAYERS} layers bf16")
    print(f"{'storage':26} {'hit %':>6} {'upper':>7} {'L3':>7} {'load GB':>8} {'GB/s':>6} {'store GB':>8} {'GB/s':>6} {'lookup p50/p99 ms':>18}")
    for name, m in results.items():
        print(f"{name:26} {100 * m['hit_rate']:6.2f} {m['upper_hit_pages']:7} {m['storage_hit_pages']:7} "
              f"{m['load_bytes'] / 1e9:8.2f} {m['load_gb_s']:6.2f} {m['store_bytes'] / 1e9:8.2f} {m['store_gb_s']:6.2f} "
              f"{m['lookup_p50_ms']:8.3f}/{m['lookup_p99_ms']:.3f}")


if __name__ == "__main__":
    main()
