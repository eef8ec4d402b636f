"""CPU per request of vLLM 0.33's own ``KVCacheManager`` (with its default
block hashing) and of ``mla_cache.BlockManager``, on the same calls, in one run.

Each request is admitted and freed at once, one after another, in a cache of
``--blocks`` blocks that the workload overflows, so most admissions evict:

- vLLM: the ``Request``'s block hasher (SHA-256, as the engine builds it), then
  ``get_computed_blocks``, ``allocate_slots`` for the rest of the prompt, ``free``;
- mla_cache: ``admit`` (which hashes the prompt) and ``free``.

The prompts are built before the clock starts on both sides: a ``Request``
without its hasher for vLLM (the hasher is attached and run inside the timed
part), a numpy ``int32`` array for mla_cache (``--list`` passes the same
Python list vLLM reads instead). Both caches hold ``--blocks`` usable blocks
(vLLM's has one more, its null block), evict LRU and cap a hit at
``len - 1`` tokens; the run asserts that both report the same cached tokens
for every request. The time is the thread's CPU time (``time.thread_time_ns``)
over the timed part, with the prepared prompts frozen out of the garbage
collector's reach first (vLLM's ``freeze_gc_heap``, which its engine core
calls after start-up); each workload runs ``--repeat`` rounds, the two managers
alternating, and the median round is reported.

Workloads: the Mooncake trace (``--trace``, its prompts as
``replay_vllm_adapter.py`` builds them) and a generated long-prompt one
(``--long N`` requests of 12,000 tokens: one of 64 shared 4,096-token
prefixes, then a fresh tail).

Run with the vLLM engine venv (``scripts/engine-venv.sh vllm-0.34``), the module
built into ``python/`` (``maturin develop --release`` as
``scripts/engine-tests.sh vllm-0.34`` does):

    PYTHONPATH=python VLLM_TARGET_DEVICE=cpu $VENV/bin/python \\
        python/bench/bench_vllm_manager.py [--trace FILE] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "engine_tests" / "vllm"))
sys.path.insert(0, str(ROOT / "python" / "bench"))

import harness  # noqa: E402
import mla_cache  # noqa: E402
from replay_vllm_adapter import DEFAULT_TRACE, parse_trace  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.gc_utils import freeze_gc_heap  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

LONG_PROMPT = 12_000
LONG_SHARED = 4_096
LONG_PREFIXES = 64


def long_prompts(n: int) -> List[List[int]]:
    """``n`` 12,000-token prompts: a shared prefix (of 64), then a fresh tail."""
    out = []
    for i in range(n):
        prefix = (i * 2_654_435_761) % LONG_PREFIXES
        head = range(prefix * LONG_SHARED, (prefix + 1) * LONG_SHARED)
        start = (1 << 30) + i * LONG_PROMPT
        out.append(list(head) + list(range(start + LONG_SHARED, start + LONG_PROMPT)))
    return out


def vllm_round(prompts: Sequence[List[int]], blocks: int, bs: int, max_len: int) -> tuple:
    """(CPU ns, cached tokens per request) through vLLM's manager."""
    config = harness.make_scheduler(False, num_blocks=blocks + 1, block_size=bs,
                                    max_model_len=max_len).kv_cache_config
    km = KVCacheManager(config, max_model_len=max_len, scheduler_block_size=bs,
                        hash_block_size=bs, enable_caching=True)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(bs, sha256)
    params = SamplingParams(ignore_eos=True, max_tokens=1)
    params.update_from_generation_config({}, harness.EOS)
    requests = [Request(request_id=f"r{i}", prompt_token_ids=p, sampling_params=params,
                        pooling_params=None, block_hasher=None)
                for i, p in enumerate(prompts)]
    hits = []
    clock = time.thread_time_ns
    spent = 0
    for req in requests:
        t = clock()
        req._block_hasher = hasher  # noqa: SLF001 - the engine passes it at construction
        req.update_block_hashes()
        computed, hit, _ = km.get_computed_blocks(req)
        if km.allocate_slots(req, req.num_tokens - hit, hit, computed) is None:
            raise SystemExit(f"vLLM could not admit {req.request_id}")
        km.free(req)
        spent += clock() - t
        hits.append(hit)
    return spent, hits


def mla_round(prompts: Sequence, blocks: int, bs: int) -> tuple:
    """(CPU ns, cached tokens per request) through ``mla_cache.BlockManager``."""
    # vLLM's order, as vLLM's own manager (and the vLLM adapter by default).
    m = mla_cache.BlockManager(mla_cache.CacheConfig(num_blocks=blocks, block_size=bs, eviction="lru"))
    hits = []
    clock = time.thread_time_ns
    spent = 0
    for i, p in enumerate(prompts):
        t = clock()
        hit = m.admit(i, p).num_cached_tokens
        m.free(i)
        spent += clock() - t
        hits.append(hit)
    return spent, hits


def compare(name: str, prompts: List[List[int]], args) -> None:
    """Runs both managers ``--repeat`` times on ``prompts`` and prints the medians."""
    theirs = prompts if args.list else [np.asarray(p, dtype=np.int32) for p in prompts]
    # As vLLM's engine core does after start-up: the prepared workload is
    # frozen out of the collector's reach, so a round's collections walk
    # what the round allocates, not the whole trace.
    freeze_gc_heap()
    max_len = max(len(p) for p in prompts) + args.block_size
    runs: dict = {"vllm": [], "mla_cache": []}
    expected = None
    for _ in range(args.repeat):
        for who, run in (("vllm", lambda: vllm_round(prompts, args.blocks, args.block_size, max_len)),
                         ("mla_cache", lambda: mla_round(theirs, args.blocks, args.block_size))):
            spent, hits = run()
            if expected is None:
                expected = hits
            elif hits != expected:
                diff = next(i for i, (a, b) in enumerate(zip(hits, expected)) if a != b)
                raise SystemExit(f"{name}: {who} hit {hits[diff]} tokens of request {diff}, "
                                 f"the other {expected[diff]}")
            runs[who].append(spent / len(prompts))
    tokens = sum(len(p) for p in prompts)
    blocks_per_request = sum(len(p) // args.block_size for p in prompts) / len(prompts)
    hit_rate = sum(expected) / tokens
    v, m = statistics.median(runs["vllm"]), statistics.median(runs["mla_cache"])
    print(f"{name}: {len(prompts)} requests, {blocks_per_request:.0f} full blocks each, "
          f"{args.blocks} blocks, token hit rate {hit_rate:.4f} (same in both)")
    print(f"  vLLM KVCacheManager + hashing  {v / 1000:9.1f} us/request  "
          f"(rounds: {', '.join(f'{x / 1000:.1f}' for x in runs['vllm'])})")
    print(f"  mla_cache.BlockManager         {m / 1000:9.1f} us/request  "
          f"{m / blocks_per_request:6.0f} ns/block  "
          f"(rounds: {', '.join(f'{x / 1000:.1f}' for x in runs['mla_cache'])})")
    print(f"  ratio                          {v / m:9.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--requests", type=int, default=None,
                        help="the trace's first N requests (default: all)")
    parser.add_argument("--long", type=int, default=1000,
                        help="requests of the long-prompt workload (0: skip it)")
    parser.add_argument("--blocks", type=int, default=16_384)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--list", action="store_true",
                        help="pass mla_cache the Python lists instead of numpy arrays")
    args = parser.parse_args()

    workloads: List[tuple[str, Callable[[], List[List[int]]]]] = [
        ("mooncake trace", lambda: [r.prompt_tokens()
                                    for r in parse_trace(args.trace.read_text())[:args.requests]]),
    ]
    if args.long:
        workloads.append(("long prompts", lambda: long_prompts(args.long)))
    for name, make in workloads:
        compare(name, make(), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
