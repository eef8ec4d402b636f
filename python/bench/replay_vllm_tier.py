"""Replays a Mooncake trace through vLLM's real ``Scheduler`` with a small
device cache, four ways: no offload; vLLM's CPU tier alone (the
``OffloadingConnector`` with ``TieringOffloadingSpec`` and no secondary
tier); vLLM's CPU tier with mla_cache's remote tier below it
(``mla_cache.vllm_tier.MlaRemoteTier``); and a second, cold engine (a new
device cache and CPU tier) on the same store. Reports the prefix hit rate
and the recomputed prompt tokens of each, and what ``mla-cache simulate``
predicts for the same sizes.

Requests are the trace's first ``--requests`` lines, outputs capped at
``--max-output`` tokens, arriving at ``timestamp / --speedup`` on a step
clock of ``--step-ms`` per step (as ``replay_vllm_scheduler.py``). A
stand-in worker completes vLLM's offloading jobs at once (the copies
between the GPU and vLLM's CPU tier are not made; the tier's own transfers
between the CPU tier and the store move real bytes), and the runs with the
tier are held to the step clock in wall time. One block is one MLA
layer of 64 bf16 latents (73,728 bytes), to keep the store's memory small.

Run with the vLLM engine venv, servers of scripts/redis.sh running:

    PYTHONPATH=python VLLM_TARGET_DEVICE=cpu $VENV/bin/python \\
        python/bench/replay_vllm_tier.py --remote redis://127.0.0.1:6379/ \\
        --compare target/release/mla-cache
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "engine_tests" / "vllm"))
sys.path.insert(0, str(ROOT / "python" / "bench"))

import harness  # noqa: E402
from replay_vllm_adapter import DEFAULT_TRACE, parse_trace  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata,
)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402

BLOCK = 64
ROW = -(-BLOCK * 1152 // 4096) * 4096
"""Bytes of one block in vLLM's CPU tier (a 4 KiB-aligned row)."""


def offloading(cpu_blocks: int, tiers: list[dict]) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": cpu_blocks * ROW,
            "secondary_tiers": tiers,
        },
    )


def worker_output(driver: harness.Driver, out) -> Any:
    """The model's output, with every offloading job reported done."""
    output = driver.model_output(out)
    meta = out.kv_connector_metadata
    if meta is not None:
        completed = {job_id: 1 for job_id in (*meta.load_jobs, *meta.store_jobs)}
        recving = {job.req_id for job in meta.load_jobs.values() if not job.sync}
        output.kv_connector_output = KVConnectorOutput(
            finished_recving=recving,
            kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=completed),
        )
    return output


def replay(trace, args, transfer: Optional[KVTransferConfig], paced: bool = False) -> dict[str, Any]:
    """One replay; ``paced`` holds each step to ``--step-ms`` of wall time at
    least, so the tier's transfers run against the trace's own clock (an
    unpaced replay runs many steps in the time of one)."""
    s = harness.make_scheduler(
        False,
        num_blocks=args.blocks,
        block_size=BLOCK,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        kv_transfer_config=transfer,
    )
    driver = harness.Driver(s)
    t0 = trace[0].timestamp
    arrivals = [
        (int((r.timestamp - t0) / args.speedup / args.step_ms),
         harness.make_request(f"r{i}", r.prompt_tokens(), max_tokens=max(1, min(r.output_length, args.max_output)),
                              block_size=BLOCK))
        for i, r in enumerate(trace)
    ]
    manager = s.connector.connector_scheduler.manager if transfer is not None else None
    hits: dict[str, int] = {}
    prompt_tokens = sum(len(req.prompt_token_ids) for _, req in arrivals)
    nxt = step = 0
    start = time.monotonic()
    while nxt < len(arrivals) or s.has_unfinished_requests() or s.finished_req_ids:
        if paced:
            time.sleep(max(0.0, start + step * args.step_ms / 1e3 - time.monotonic()))
        while nxt < len(arrivals) and arrivals[nxt][0] <= step:
            s.add_request(arrivals[nxt][1])
            nxt += 1
        step += 1
        out = driver.schedule()
        for r in out.scheduled_new_reqs:
            hits.setdefault(r.req_id, r.num_computed_tokens)
        driver.update(out, worker_output(driver, out))
    stats = {}
    if manager is not None:
        for tier in getattr(manager, "secondary_tiers", ()):
            if hasattr(tier, "stats"):
                tier.drain_jobs()
                stats = tier.stats()
        manager.shutdown()
    hit = sum(hits.values())
    return {
        "prompt_tokens": prompt_tokens,
        "hit_tokens": hit,
        "hit_rate": hit / prompt_tokens,
        "recomputed_tokens": prompt_tokens - hit,
        "steps": step,
        "tier": stats,
    }


def simulate(binary: str, trace_file: Path, args, host_blocks: int, remote: bool) -> float:
    """``mla-cache simulate``'s prompt hit rate for the same sizes (a
    one-layer bf16 model is not a preset: the tiers are sized in blocks of
    DeepSeek-V3 bf16 instead, the same block counts)."""
    block_bytes = BLOCK * 61 * 1152
    cmd = [binary, "simulate", "--trace", str(trace_file), "--blocks", str(args.blocks),
           "--block-size", str(BLOCK), "--dtype", "bf16", "--json"]
    if host_blocks:
        cmd += ["--host-mem", str(host_blocks * block_bytes)]
    if remote:
        cmd += ["--remote", f"sim:{1 << 40}"]
    report = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return report["token_hit_rate"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--remote", required=True)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--blocks", type=int, default=2048, help="device cache blocks")
    p.add_argument("--cpu-blocks", type=int, default=8192, help="vLLM's CPU tier, in blocks")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--compare", metavar="MLA_CACHE_BIN", help="also run mla-cache simulate on the same sizes")
    args = p.parse_args()
    lines = args.trace.read_text().splitlines()
    trace = parse_trace("\n".join(lines))[: args.requests]
    trace = [r for r in trace if r.input_length + min(r.output_length, args.max_output) <= args.max_model_len]
    namespace = f"replay-{uuid.uuid4().hex}"
    tier = {"type": "MlaRemoteTier", "module_path": "mla_cache.vllm_tier", "remote": args.remote,
            "namespace": namespace}
    runs = {
        "no offload": None,
        "CPU tier": offloading(args.cpu_blocks, []),
        "CPU + mla_cache tier": offloading(args.cpu_blocks, [tier]),
        "second engine, cold": offloading(args.cpu_blocks, [tier]),
    }
    results = {}
    for name, transfer in runs.items():
        results[name] = replay(trace, args, transfer, paced="mla_cache" in name or "second" in name)
        print(f"  {name}: {results[name]}", file=sys.stderr, flush=True)
    predicted = {}
    if args.compare:
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for r in trace:
                f.write(json.dumps({"timestamp": r.timestamp, "input_length": r.input_length,
                                    "output_length": min(r.output_length, args.max_output),
                                    "hash_ids": list(r.hash_ids)}) + "\n")
        predicted = {
            "no offload": simulate(args.compare, Path(f.name), args, 0, False),
            "CPU tier": simulate(args.compare, Path(f.name), args, args.cpu_blocks, False),
            "CPU + mla_cache tier": simulate(args.compare, Path(f.name), args, args.cpu_blocks, True),
        }
    print(f"{len(trace)} requests, device {args.blocks} blocks of {BLOCK}, CPU tier {args.cpu_blocks} blocks, "
          f"outputs capped at {args.max_output}")
    print(f"{'':24} {'hit %':>7} {'recomputed tokens':>18} {'simulate hit %':>15} {'tier get/put GB':>16}")
    for name, r in results.items():
        sim = f"{100 * predicted[name]:.2f}" if name in predicted else "-"
        t = r["tier"]
        moved = f"{t.get('get_bytes', 0) / 1e9:.2f}/{t.get('put_bytes', 0) / 1e9:.2f}" if t else "-"
        print(f"{name:24} {100 * r['hit_rate']:7.2f} {r['recomputed_tokens']:18,} {sim:>15} {moved:>16}")


if __name__ == "__main__":
    main()
