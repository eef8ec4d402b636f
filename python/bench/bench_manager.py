"""Per-call cost of the block manager from Python.

Measures, each call timed on its own and reported as the median:
- admit + free of a fully cached 4,096-token prompt (numpy int64 input);
- the same with a Python list input;
- match_prefix of the cached prompt;
- a one-token append to a running request (a new block every 64 tokens).

Usage: python python/bench/bench_manager.py [--reps N]
"""

import argparse
import statistics
import time

import numpy as np

import mla_cache

PROMPT_TOKENS = 4096


def median_ns(fn, reps):
    samples = []
    clock = time.perf_counter_ns
    for i in range(reps):
        start = clock()
        fn(i)
        samples.append(clock() - start)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20_000)
    args = parser.parse_args()

    config = mla_cache.CacheConfig.preset("deepseek-v3", num_blocks=4096, dtype="fp8_ds_mla", eviction="lru")
    manager = mla_cache.BlockManager(config)
    prompt = np.arange(PROMPT_TOKENS, dtype=np.int64)
    prompt_list = prompt.tolist()
    manager.admit("warm", prompt)
    manager.free("warm")  # the prompt's 64 blocks are now cached

    def admit_free(i):
        manager.admit(i, prompt)
        manager.free(i)

    def admit_free_list(i):
        manager.admit(i, prompt_list)
        manager.free(i)

    for _ in range(1000):  # warm up
        admit_free(0)
    results = {
        "admit+free, cached 4096-token prompt (numpy)": median_ns(admit_free, args.reps),
        "admit+free, cached 4096-token prompt (list)": median_ns(admit_free_list, args.reps // 4),
        "match_prefix, cached 4096-token prompt (numpy)": median_ns(
            lambda i: manager.match_prefix(prompt), args.reps
        ),
    }

    manager.admit("decode", prompt)
    results["append of one token"] = median_ns(lambda i: manager.append("decode", i), args.reps)
    manager.free("decode")
    manager._check_invariants()

    width = max(len(k) for k in results)
    for name, ns in results.items():
        print(f"{name:<{width}}  {ns / 1000:8.2f} us")
    hit = manager.stats()["hit_rate"]
    print(f"(prefix hit rate over the run: {hit:.3f}; target for admit+free: under 30 us)")


if __name__ == "__main__":
    main()
