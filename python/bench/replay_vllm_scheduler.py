"""Replays a Mooncake trace through vLLM 0.33's real ``Scheduler``, once with
vLLM's own KV cache manager and once with ``mla_cache.vllm.KVCacheManager``,
and reports side by side: the schedule digest (must match), and the CPU
time of ``schedule()`` plus ``update_from_output()`` and of the KV-manager
calls inside them.

Requests are the trace's first ``--requests`` lines, outputs capped at
``--max-output`` tokens, arriving at ``timestamp / --speedup`` on a step clock
of ``--step-ms`` per step. Each run builds its requests first (vLLM's block
hasher runs in ``Request``, as in an unmodified vLLM; ``--no-request-hashes``
leaves it out, what a fork could do, and the adapter then caches nothing —
vLLM's manager neither). Scheduler time is measured on an untimed manager;
KV-manager time on a second run whose manager methods are wrapped with
timers (the wrapper's own cost is included, the same for both; a second
figure leaves out what the timer measures around an empty call, times the
calls). Medians of ``--repeat`` rounds, the two managers alternating, and
the median of each round's own ratio (its two managers back to back).

Run with the vLLM engine venv (see ``scripts/engine-venv.sh vllm-0.34``):

    PYTHONPATH=python VLLM_TARGET_DEVICE=cpu $VENV/bin/python \\
        python/bench/replay_vllm_scheduler.py --requests 2000
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "engine_tests" / "vllm"))
sys.path.insert(0, str(ROOT / "python" / "bench"))

import harness  # noqa: E402
from replay_vllm_adapter import DEFAULT_TRACE, parse_trace  # noqa: E402

MANAGER_METHODS = (
    "get_computed_blocks",
    "allocate_slots",
    "free",
    "pop_blocks_for_free",
    "get_blocks",
    "get_block_ids",
    "cache_blocks",
    "new_step_starts",
    "take_events",
    "take_new_block_ids",
    "take_kv_cache_block_copies",
    "take_boundary_state_offloads",
    "make_prefix_cache_stats",
    "record_prefix_cache_stats",
    "estimate_cached_tokens",
    "remove_skipped_blocks",
    "finalize_partial_tail_offloads",
)
"""The manager methods the scheduler calls (timed in the KV-manager run)."""


def build_requests(trace, args, block_size: int):
    """vLLM ``Request`` objects of the trace's requests, with arrival steps."""
    out = []
    t0 = trace[0].timestamp
    for i, r in enumerate(trace):
        req = harness.make_request(
            f"r{i}", r.prompt_tokens(), max_tokens=max(1, min(r.output_length, args.max_output)),
            block_size=block_size,
        )
        if args.no_request_hashes:
            req.block_hashes.clear()
            req._block_hasher = None  # noqa: SLF001 - what a fork without vLLM's hasher does
        step = int((r.timestamp - t0) / args.speedup / args.step_ms)
        out.append((step, req))
    return out


def timed(fn: Any, acc: List[int]) -> Any:
    """``fn`` wrapped with a timer adding its time and calls to ``acc``."""
    clock = time.perf_counter_ns

    def wrapper(*a, **kw):
        t = clock()
        try:
            return fn(*a, **kw)
        finally:
            acc[0] += clock() - t
            acc[1] += 1

    return wrapper


def timed_manager(km: Any, meter: Dict[str, List[int]]) -> None:
    """Wraps the manager's methods (on the instance) with timers."""
    for name in MANAGER_METHODS:
        fn = getattr(km, name, None)
        if fn is not None:
            setattr(km, name, timed(fn, meter.setdefault(name, [0, 0])))


def timer_cost_ns(calls: int = 200_000) -> float:
    """What the timer adds to one call: the time it measures around a call
    that does nothing (median of 5 rounds)."""

    def nothing(request: Any, n: int, *, num_lookahead_tokens: int = 0) -> None:
        return None

    rounds = []
    for _ in range(5):
        acc = [0, 0]
        fn = timed(nothing, acc)
        for _ in range(calls):
            fn(None, 1, num_lookahead_tokens=0)
        rounds.append(acc[0] / calls)
    return statistics.median(rounds)


def run(adapter: bool, trace, args, timed: bool) -> Tuple[str, float, Dict[str, List[int]], Dict[str, int]]:
    """One replay: (schedule digest, seconds in schedule+update, KV meter, counts)."""
    s = harness.make_scheduler(
        adapter,
        num_blocks=args.blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
    )
    meter: Dict[str, List[int]] = {}
    if timed:
        timed_manager(s.kv_cache_manager, meter)
    driver = harness.Driver(s)
    arrivals = build_requests(trace, args, args.block_size)
    digest = hashlib.sha256()
    counts = {"steps": 0, "preemptions": 0, "hit_tokens": 0, "finished": 0}
    clock = time.perf_counter_ns
    spent = 0
    nxt = 0
    step = 0
    while nxt < len(arrivals) or s.has_unfinished_requests():
        while nxt < len(arrivals) and arrivals[nxt][0] <= step:
            s.add_request(arrivals[nxt][1])
            nxt += 1
        step += 1
        if step > args.max_steps:
            raise RuntimeError(f"not done after {args.max_steps} steps ({len(s.requests)} requests left)")
        t = clock()
        out = s.schedule()
        spent += clock() - t
        if not out.num_scheduled_tokens:
            continue
        mo = driver.model_output(out)
        t = clock()
        outputs = s.update_from_output(out, mo)
        spent += clock() - t
        counts["steps"] += 1
        counts["preemptions"] += len(out.preempted_req_ids or ())
        counts["hit_tokens"] += sum(r.num_computed_tokens for r in out.scheduled_new_reqs)
        fin = sorted(o.request_id for e in outputs.values() for o in e.outputs if o.finish_reason is not None)
        counts["finished"] += len(fin)
        digest.update(repr((sorted(out.num_scheduled_tokens.items()), sorted(out.preempted_req_ids or ()), fin)).encode())
    return digest.hexdigest()[:16], spent / 1e9, meter, counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--blocks", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-request-hashes", action="store_true")
    p.add_argument("--max-steps", type=int, default=200_000)
    args = p.parse_args()
    trace = parse_trace(args.trace.read_text())[: args.requests]
    # vLLM's front end refuses a request longer than max_model_len.
    fits = [r for r in trace if r.input_length + min(r.output_length, args.max_output) <= args.max_model_len]
    skipped, trace = len(trace) - len(fits), fits

    results: Dict[str, Dict[str, Any]] = {"vllm": {"sched": [], "kv": []}, "mla_cache": {"sched": [], "kv": []}}
    for _ in range(args.repeat):
        for adapter, name in ((False, "vllm"), (True, "mla_cache")):
            digest, spent, _, counts = run(adapter, trace, args, timed=False)
            _, _, meter, _ = run(adapter, trace, args, timed=True)
            r = results[name]
            r["digest"], r["counts"] = digest, counts
            r["sched"].append(spent)
            r["kv"].append(sum(v[0] for v in meter.values()) / 1e9)
            r["calls"] = sum(v[1] for v in meter.values())
            r["meter"] = meter
            print(f"  {name}: schedule+update {spent:.3f} s, KV-manager {r['kv'][-1]:.3f} s, {r['counts']}",
                  file=sys.stderr, flush=True)
    print(f"{len(trace)} requests ({skipped} longer than max_model_len left out), {args.blocks} blocks of {args.block_size}, speedup {args.speedup}, "
          f"request hashes {'off' if args.no_request_hashes else 'on'}; medians of {args.repeat}")
    for name, r in results.items():
        print(f"  {name:10s} digest {r['digest']}  {r['counts']}")
        print(f"  {'':10s} schedule()+update_from_output() {statistics.median(r['sched']):.3f} s, "
              f"KV-manager calls {statistics.median(r['kv']):.3f} s")
        top = sorted(r["meter"].items(), key=lambda kv: -kv[1][0])[:6]
        print("  " + " " * 10 + " " + ", ".join(
            f"{k} {v[0] / 1e9:.3f} s/{v[1]} ({v[0] / max(v[1], 1) / 1e3:.1f} us)" for k, v in top))
    v, m = results["vllm"], results["mla_cache"]
    # The timers' own share (what they measure around an empty call), left out.
    per_call = timer_cost_ns()
    net = {n: statistics.median(r["kv"]) - r["calls"] * per_call / 1e9 for n, r in results.items()}
    print(f"  timer inside each measured call {per_call:.0f} ns; KV-manager calls less it: vllm {net['vllm']:.3f} s "
          f"({v['calls']} calls), mla_cache {net['mla_cache']:.3f} s ({m['calls']} calls): "
          f"{net['vllm'] / net['mla_cache']:.2f}x less CPU")
    print(f"  same schedule: {v['digest'] == m['digest']}; KV-manager {statistics.median(v['kv']) / statistics.median(m['kv']):.2f}x "
          f"less CPU; schedule+update {statistics.median(v['sched']) / statistics.median(m['sched']):.2f}x faster")
    # Each round's own ratio (its two managers ran back to back), less
    # exposed to a machine whose speed drifts between rounds.
    kv_rounds = [a / b for a, b in zip(v["kv"], m["kv"])]
    sched_rounds = [a / b for a, b in zip(v["sched"], m["sched"])]
    print(f"  per round: KV-manager {', '.join(f'{x:.2f}x' for x in kv_rounds)} (median {statistics.median(kv_rounds):.2f}x); "
          f"schedule+update {', '.join(f'{x:.2f}x' for x in sched_rounds)} (median {statistics.median(sched_rounds):.2f}x)")
    if v["digest"] != m["digest"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
