"""Replays a Mooncake-format trace through the vLLM adapter (``mla_cache.vllm``).

Follows the model of time of ``mla-cache simulate`` exactly (see
``sim/src/engine.rs``): integer nanoseconds, one FIFO queue with head-of-line
blocking, admission with the prompt and ``output_length`` decode slots, an
unchunked prefill on one serial lane, one decoded token every ``tpot``, the
request freed after its last token; at equal times, token and free events
come before arrivals. A request goes through the adapter as vLLM's scheduler
would send it: ``get_computed_blocks`` then ``allocate_slots`` to admit it,
one ``allocate_slots`` per decoded token, ``free`` at the end. So every
figure but the cost matches ``mla-cache simulate --json`` with the same
settings; ``--compare`` runs the binary and checks that.

The cost is the time spent inside the adapter's calls (the Python layer, the
token lists it passes, and the Rust manager under it) per completed request.

Usage: python python/bench/replay_vllm_adapter.py [--trace FILE] [--blocks N]
       [--compare target/release/mla-cache] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import subprocess
import sys
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from mla_cache import CacheConfig
from mla_cache.vllm import KVCacheManager

NS_PER_MS = 1_000_000
HASH_BLOCK_TOKENS = 512
"""Tokens named by one hash id of the trace."""
GENERATED_TOKEN_BASE = 2**32 - HASH_BLOCK_TOKENS
"""First token id of output tokens past the prompt's hash blocks."""
MAX_HASH_ID = GENERATED_TOKEN_BASE // HASH_BLOCK_TOKENS - 1
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic_trace.jsonl"

# Figures that are exact functions of the trace and the settings.
EXACT_FIELDS = (
    "requests",
    "completed",
    "never_fit",
    "prompt_tokens",
    "hit_tokens",
    "token_hit_rate",
    "hit_requests",
    "request_hit_rate",
    "output_tokens",
    "evictions",
    "cow_copies",
    "peak_usage",
    "mean_usage",
    "queue_delay_ms",
    "ttft_ms",
    "simulated_s",
)


@dataclass(frozen=True)
class TraceRequest:
    """One line of a Mooncake trace."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: Tuple[int, ...]

    def token_at(self, pos: int) -> int:
        """Token id at position ``pos`` (prompt first, then output), as the
        simulator defines it."""
        block, offset = divmod(pos, HASH_BLOCK_TOKENS)
        if block < len(self.hash_ids):
            return self.hash_ids[block] * HASH_BLOCK_TOKENS + offset
        return GENERATED_TOKEN_BASE + offset

    def prompt_tokens(self) -> List[int]:
        """The prompt's token ids."""
        tokens: List[int] = []
        for h in self.hash_ids:
            tokens.extend(range(h * HASH_BLOCK_TOKENS, (h + 1) * HASH_BLOCK_TOKENS))
        del tokens[self.input_length :]
        return tokens


def parse_trace(text: str) -> List[TraceRequest]:
    """Requests of a JSONL trace, sorted by arrival (ties keep file order);
    malformed lines are skipped, as ``simulate`` does without ``--strict``."""
    requests = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
            r = TraceRequest(
                int(d["timestamp"]),
                int(d["input_length"]),
                int(d["output_length"]),
                tuple(int(h) for h in d["hash_ids"]),
            )
        except (ValueError, KeyError, TypeError):
            continue
        if r.timestamp < 0 or r.output_length < 0 or r.input_length <= 0:
            continue
        if len(r.hash_ids) != -(-r.input_length // HASH_BLOCK_TOKENS):
            continue
        if any(h < 0 or h > MAX_HASH_ID for h in r.hash_ids):
            continue
        requests.append(r)
    requests.sort(key=lambda r: r.timestamp)
    return requests


@dataclass
class Request:
    """What vLLM's manager reads of a request."""

    request_id: str
    all_token_ids: List[int]
    block_size: int
    num_computed_tokens: int = 0
    lora_request: None = None
    cache_salt: Optional[str] = None
    mm_features: Sequence[Any] = ()
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        """Prompt and output tokens."""
        return len(self.all_token_ids)

    block_hashes: List[bytes] = field(default_factory=list)
    """Digests of the full blocks, chained over the tokens as vLLM's block
    hasher chains them (kept current by ``add_tokens``, outside the timed
    calls, as vLLM's ``Request`` does)."""

    def __post_init__(self) -> None:
        self._hash_new_blocks()

    def add_token(self, token: int) -> None:
        """Appends one output token, hashing a block it completes."""
        self.all_token_ids.append(token)
        self._hash_new_blocks()

    def _hash_new_blocks(self) -> None:
        bs = self.block_size
        for i in range(len(self.block_hashes), len(self.all_token_ids) // bs):
            parent = self.block_hashes[-1] if self.block_hashes else b""
            block = array("I", self.all_token_ids[i * bs : (i + 1) * bs]).tobytes()
            self.block_hashes.append(hashlib.sha256(parent + block).digest())


@dataclass
class Meter:
    """Adapter calls and the time spent in them."""

    calls: int = 0
    ns: int = 0


def distribution(values: List[int]) -> Dict[str, float]:
    """The simulator's summary of durations in ns: count, mean, nearest-rank
    p50 and p99, max, in ms."""
    if not values:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    values = sorted(values)
    n = len(values)

    def rank(p: int) -> float:
        return values[max(-(-p * n // 100), 1) - 1] / 1e6

    return {
        "count": n,
        "mean": sum(values) / n / 1e6,
        "p50": rank(50),
        "p99": rank(99),
        "max": values[-1] / 1e6,
    }


@dataclass
class Settings:
    """The simulation settings (``mla-cache simulate``'s options)."""

    num_blocks: int
    model: str = "deepseek-v3"
    dtype: str = "fp8_ds_mla"
    block_size: int = 64
    tpot_ns: int = 40 * NS_PER_MS
    prefill_ns_per_token: int = 0
    seed: int = 0
    eviction: str = "lru"
    """The engines' own order (the adapters' default)."""

    def cache_config(self) -> CacheConfig:
        """The cache the simulator builds for these settings."""
        return CacheConfig.preset(
            self.model,
            num_blocks=self.num_blocks,
            dtype=self.dtype,
            block_size=self.block_size,
            hash_seed=self.seed,
            eviction=self.eviction,
        )

    def cli_args(self) -> List[str]:
        """The same settings as ``mla-cache simulate`` options."""
        tps = 0.0 if self.prefill_ns_per_token == 0 else 1e9 / self.prefill_ns_per_token
        return [
            "--model", self.model, "--dtype", self.dtype,
            "--blocks", str(self.num_blocks), "--block-size", str(self.block_size),
            "--tpot-ms", repr(self.tpot_ns / 1e6), "--prefill-tps", repr(tps),
            "--seed", str(self.seed), "--eviction", self.eviction,
        ]  # fmt: skip


@dataclass
class _Replay:
    """The state of one replay."""

    requests: List[TraceRequest]
    settings: Settings
    manager: KVCacheManager
    meter: Meter = field(default_factory=Meter)
    queue: Deque[int] = field(default_factory=deque)
    events: List[Tuple[int, int, int]] = field(default_factory=list)
    seq: int = 0
    head: Optional[Request] = None
    """The queue head, built once however often it is retried."""
    live: Dict[int, Request] = field(default_factory=dict)
    produced: Dict[int, int] = field(default_factory=dict)
    lane_free_ns: int = 0
    queue_delays: List[int] = field(default_factory=list)
    ttfts: List[int] = field(default_factory=list)
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_requests: int = 0
    output_tokens: int = 0
    never_fit: int = 0
    done: int = 0

    def timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        self.meter.ns += time.perf_counter_ns() - start
        self.meter.calls += 1
        return out

    def schedule(self, t: int, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, i))

    def try_admit(self, now: int) -> None:
        """Admits queue heads while they fit; drops those that never can."""
        m = self.manager
        bs = self.settings.block_size
        while self.queue:
            i = self.queue[0]
            r = self.requests[i]
            if -(-(r.input_length + r.output_length) // bs) > self.settings.num_blocks:
                self.never_fit += 1
                self.done += 1
                self.queue.popleft()
                continue
            if self.head is None:
                self.head = Request(str(i), r.prompt_tokens(), bs)
            req = self.head
            blocks, hit, _ = self.timed(m.get_computed_blocks, req)
            # The output's slots are reserved at admission (as lookahead), as
            # the simulator does.
            new = self.timed(
                m.allocate_slots, req, req.num_tokens - hit, hit, blocks,
                num_lookahead_tokens=r.output_length,
            )  # fmt: skip
            if new is None:
                if self.events:
                    return  # waits for the next free
                self.never_fit += 1  # nothing runs, so nothing will be freed
                self.done += 1
                self.queue.popleft()
                self.head = None
                continue
            req.num_computed_tokens = req.num_tokens
            self.live[i] = req
            self.produced[i] = 0
            self.prompt_tokens += r.input_length
            self.hit_tokens += hit
            self.hit_requests += hit > 0
            arrival = r.timestamp * NS_PER_MS
            self.queue_delays.append(now - arrival)
            start = max(now, self.lane_free_ns)
            self.lane_free_ns = start + (r.input_length - hit) * self.settings.prefill_ns_per_token
            self.ttfts.append(self.lane_free_ns - arrival)
            self.schedule(self.lane_free_ns, i)
            self.queue.popleft()
            self.head = None

    def step(self, t: int, i: int) -> None:
        """Request ``i`` decodes its next token, or finishes after its last."""
        r = self.requests[i]
        req = self.live[i]
        if self.produced[i] < r.output_length:
            req.add_token(r.token_at(r.input_length + self.produced[i]))
            new = self.timed(self.manager.allocate_slots, req, 1)
            assert new is not None, "decode slots were reserved at admission"
            req.num_computed_tokens += 1
            self.produced[i] += 1
            self.output_tokens += 1
        if self.produced[i] < r.output_length:
            self.schedule(t + self.settings.tpot_ns, i)
            return
        self.timed(self.manager.free, req)
        del self.live[i], self.produced[i]
        self.done += 1
        self.try_admit(t)


def replay(requests: List[TraceRequest], settings: Settings) -> Dict[str, Any]:
    """Replays ``requests`` through a fresh adapter; returns the figures
    under ``mla-cache simulate --json``'s names."""
    wall = time.perf_counter()
    config = settings.cache_config()
    # One block more than the simulator's: vLLM's null block.
    manager = KVCacheManager.from_config(config.replace(num_blocks=config.num_blocks + 1))
    sim = _Replay(requests, settings, manager)
    block_manager = sim.manager.manager
    arrivals = [r.timestamp * NS_PER_MS for r in requests]
    next_arrival = 0
    usage = peak = area = 0.0
    start_ns = now = arrivals[0] if arrivals else 0
    while True:
        event = sim.events[0][0] if sim.events else None
        arrival = arrivals[next_arrival] if next_arrival < len(arrivals) else None
        if event is None and arrival is None:
            break
        t = min(x for x in (event, arrival) if x is not None)
        area += usage * float(t - now)
        now = t
        if event == t:
            _, _, i = heapq.heappop(sim.events)
            sim.step(t, i)
        else:
            sim.queue.append(next_arrival)
            next_arrival += 1
            if len(sim.queue) == 1:
                sim.try_admit(now)
        usage = block_manager.usage
        peak = max(peak, usage)
    span = now - start_ns
    stats = block_manager.stats()
    completed = sim.done - sim.never_fit
    seconds = sim.meter.ns / 1e9
    return {
        "requests": len(requests),
        "completed": completed,
        "never_fit": sim.never_fit,
        "prompt_tokens": sim.prompt_tokens,
        "hit_tokens": sim.hit_tokens,
        "token_hit_rate": sim.hit_tokens / sim.prompt_tokens if sim.prompt_tokens else 0.0,
        "hit_requests": sim.hit_requests,
        "request_hit_rate": sim.hit_requests / completed if completed else 0.0,
        "output_tokens": sim.output_tokens,
        "evictions": stats["evictions"],
        "cow_copies": stats["cow_copies"],
        "peak_usage": peak,
        "mean_usage": area / span if span else usage,
        "queue_delay_ms": distribution(sim.queue_delays),
        "ttft_ms": distribution(sim.ttfts),
        "simulated_s": span / 1e9,
        "manager": {
            "calls": sim.meter.calls,
            "seconds": seconds,
            "us_per_request": seconds * 1e6 / completed if completed else 0.0,
            "calls_per_s": sim.meter.calls / seconds if seconds else 0.0,
        },
        "wall_s": time.perf_counter() - wall,
    }


def simulate(binary: str, trace: Path, settings: Settings) -> Dict[str, Any]:
    """``mla-cache simulate --json`` on the same trace and settings."""
    cmd = [binary, "simulate", "--json", "--trace", str(trace), *settings.cli_args()]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    report: Dict[str, Any] = json.loads(out)
    return report


def differences(a: Dict[str, Any], b: Dict[str, Any]) -> List[str]:
    """The exact figures on which two reports differ."""
    return [f"{k}: {a[k]!r} != {b[k]!r}" for k in EXACT_FIELDS if a[k] != b[k]]


def blocks_for_memory(settings: Settings, cache_mem: int) -> int:
    """Blocks ``cache_mem`` bytes hold (``simulate --cache-mem``)."""
    one = Settings(num_blocks=1, model=settings.model, dtype=settings.dtype,
                   block_size=settings.block_size).cache_config()  # fmt: skip
    return cache_mem // one.bytes_per_block


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--blocks", type=int, help="cache blocks (default: 40 GiB worth)")
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--dtype", default="fp8_ds_mla")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--tpot-ms", type=float, default=40.0)
    parser.add_argument("--prefill-tps", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", metavar="BIN", help="check against BIN simulate --json")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    def rounded(x: float) -> int:
        return int(math.floor(x + 0.5))  # Rust's f64::round for non-negative values

    settings = Settings(
        num_blocks=0, model=args.model, dtype=args.dtype, block_size=args.block_size,
        tpot_ns=rounded(args.tpot_ms * 1e6),
        prefill_ns_per_token=rounded(1e9 / args.prefill_tps) if args.prefill_tps > 0 else 0,
        seed=args.seed,
    )  # fmt: skip
    settings.num_blocks = args.blocks or blocks_for_memory(settings, 40 << 30)
    report = replay(parse_trace(args.trace.read_text()), settings)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        cost = report["manager"]
        print(f"replay of {args.trace.name} through mla_cache.vllm, {settings.num_blocks:,} blocks")
        print(f"  prefix hit rate   {100 * report['token_hit_rate']:.1f} % of prompt tokens "
              f"({report['hit_tokens']:,} / {report['prompt_tokens']:,})")  # fmt: skip
        print(f"                    {100 * report['request_hit_rate']:.1f} % of requests "
              f"({report['hit_requests']:,} / {report['completed']:,})")  # fmt: skip
        print(f"  evictions         {report['evictions']:,} blocks")
        print(f"  adapter cost      {cost['us_per_request']:.1f} µs per request "
              f"({cost['calls']:,} calls in {cost['seconds']:.2f} s)")  # fmt: skip
    if args.compare:
        sim = simulate(args.compare, args.trace, settings)
        diff = differences(report, sim)
        print(f"simulate: {sim['manager']['us_per_request']:.1f} µs per request (Rust manager alone); "
              + ("every exact figure agrees" if not diff else "DIFFERS: " + "; ".join(diff)),
              )  # fmt: skip
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
