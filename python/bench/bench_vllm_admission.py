"""What the vLLM adapter adds to the block manager on an admission: CPU per
admission of a ``--tokens``-token prompt with no prefix hit, through
``mla_cache.vllm.KVCacheManager.allocate_slots`` inside vLLM 0.33's
scheduler (vLLM's ``Request`` and its block hashes, vLLM's ``KVCacheBlocks``),
and through the ``mla_cache.BlockManager`` beneath it on the same digests.

Two cases each: the admission alone (``delay_cache_blocks=True``; for the
block manager an ``admit`` of one token with the rest as decode slots, the
shape the adapter admits) and with the commit of the prompt's full blocks.
A round admits ``--requests`` prompts (they fit together), then frees them
and resets the cache; the median of ``--repeat`` rounds is reported.

Run with the vLLM engine venv (``scripts/engine-venv.sh vllm-0.34``):

    PYTHONPATH=python VLLM_TARGET_DEVICE=cpu $VENV/bin/python \\
        python/bench/bench_vllm_admission.py [--tokens 8000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine_tests" / "vllm"))

import harness  # noqa: E402

BLOCK_SIZE = 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8000)
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    blocks = -(-args.tokens // BLOCK_SIZE)
    s = harness.make_scheduler(
        True, num_blocks=blocks * args.requests + 1, block_size=BLOCK_SIZE, max_model_len=args.tokens + 64
    )
    km = s.kv_cache_manager
    reqs = [
        harness.make_request(
            f"r{i}", [3 + (i * 7919 + j) % 997 for j in range(args.tokens)], max_tokens=1, block_size=BLOCK_SIZE
        )
        for i in range(args.requests)
    ]
    core = km.manager
    clock = time.thread_time_ns

    def adapter(commit: bool) -> float:
        t = clock()
        for r in reqs:
            assert km.allocate_slots(r, r.num_tokens, delay_cache_blocks=not commit) is not None
        t = clock() - t
        for r in reqs:
            km.free(r)
        assert km.reset_prefix_cache()
        return t / len(reqs) / 1e3

    def manager(commit: bool) -> float:
        t = clock()
        for i, r in enumerate(reqs):
            key = 1 << 40 | i
            core.admit(key, [r.all_token_ids[0]], decode_slots=r.num_tokens - 1, chunked_prefill=True, block_hashes=[])
            if commit:
                core.commit(key, r.num_tokens, block_hashes=r.block_hashes)
        t = clock() - t
        for i in range(len(reqs)):
            core.free(1 << 40 | i)
        assert core.reset_prefix_cache()
        return t / len(reqs) / 1e3

    print(f"{args.requests} admissions of {args.tokens} tokens ({blocks} blocks), no hit; median of {args.repeat}")
    for commit in (False, True):
        a = statistics.median(adapter(commit) for _ in range(args.repeat))
        m = statistics.median(manager(commit) for _ in range(args.repeat))
        what = "with the commit" if commit else "admission alone"
        print(f"  {what:16s} adapter {a:7.1f} us, BlockManager {m:7.1f} us: "
              f"the adapter adds {(a - m) * 1e3 / blocks:.0f} ns per block")


if __name__ == "__main__":
    main()
