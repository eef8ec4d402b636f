"""Replays a Mooncake-format trace through SGLang 0.5.23's own memory objects
with mla_cache's backend (``mla_cache.sglang.RadixCache``).

The model of time is ``mla-cache simulate``'s, as in
``replay_vllm_adapter.py`` (whose trace parsing and settings it reuses): one
FIFO queue with head-of-line blocking, admission of the prompt with
``output_length`` decode slots reserved, instantaneous prefill, one token
every ``tpot``, the request released after its last token. A request goes
through SGLang's objects as SGLang's scheduler sends it: ``Req`` matched by
``init_next_round_input``, its node locked, its row in ``ReqToTokenPool``
filled by the paged allocator's ``alloc_extend`` (after the backend evicts
the shortfall), ``checkpoint_kv_cache`` after the prefill and
``release_kv_cache`` at the end. Run with the SGLang venv's python
(``scripts/engine-venv.sh sglang``); ``--compare`` checks the prefix figures
against ``mla-cache simulate --json`` on the same trace and settings.

Usage: python python/bench/replay_sglang_backend.py --trace FILE --blocks N
       [--compare target/release/mla-cache] [--json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import warnings
from array import array
from collections import deque
from pathlib import Path
from typing import Any, Dict, List

warnings.filterwarnings("ignore", message="Only CUDA")

import torch  # noqa: E402
from replay_vllm_adapter import (  # noqa: E402
    NS_PER_MS,
    Settings,
    TraceRequest,
    parse_trace,
    simulate,
)
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish, reset_context  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from mla_cache.sglang import RadixCache  # noqa: E402

PREFIX_FIELDS = (
    "requests",
    "completed",
    "never_fit",
    "prompt_tokens",
    "hit_tokens",
    "token_hit_rate",
    "hit_requests",
    "request_hit_rate",
)
"""Figures that must equal ``simulate``'s."""

MAX_RUNNING = 4096
"""Request rows in the pool."""


class Replay:
    """SGLang's allocator, rows and the backend, fed one trace."""

    def __init__(self, requests: List[TraceRequest], settings: Settings) -> None:
        args = ServerArgs(model_path="dummy", device="cpu", page_size=settings.block_size)
        reset_context()
        publish(args, role="replay", ranks=SpawnRanks(world_rank=0, dp_rank=None))
        self.requests = requests
        self.settings = settings
        ps = settings.block_size
        longest = max((r.input_length + r.output_length for r in requests), default=1)
        self.allocator = PagedTokenToKVPoolAllocator(
            settings.num_blocks * ps, ps, torch.int64, "cpu", None, need_sort=False
        )
        self.pool = ReqToTokenPool(MAX_RUNNING, longest + ps, "cpu", False)
        self.tree = RadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=self.pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=ps,
                eviction_policy="lru",
            )
        )
        self.queue: deque = deque()
        self.events: list = []
        self.seq = 0
        self.live: Dict[int, Req] = {}
        self.prompt_tokens = self.hit_tokens = self.hit_requests = 0
        self.never_fit = self.done = self.evicted_pages = 0

    def pages(self, tokens: int) -> int:
        return -(-tokens // self.settings.block_size)

    def try_admit(self, now: int) -> None:
        """Admits queue heads while they fit; drops those that never can."""
        ps = self.settings.block_size
        while self.queue:
            i = self.queue[0]
            r = self.requests[i]
            need = self.pages(r.input_length + r.output_length)
            if need > self.settings.num_blocks:
                self.never_fit += 1
                self.done += 1
                self.queue.popleft()
                continue
            params = SamplingParams(max_new_tokens=max(r.output_length, 1), ignore_eos=True)
            params.normalize(None)
            req = Req(str(i), "", array("q", r.prompt_tokens()), params)
            req.init_next_round_input(self.tree)
            hit = req.prefix_len
            lock = self.tree.lock(req.last_node)
            need -= hit // ps
            free = self.allocator.available_size() // ps
            if need > free + self.tree.evictable_size() // ps:
                self.tree.unlock(lock)
                if self.events:
                    return  # waits for the next release
                self.never_fit += 1  # nothing runs, so nothing will be released
                self.done += 1
                self.queue.popleft()
                continue
            if need > free:
                evicted = self.tree.evict(EvictParams(num_tokens=(need - free) * ps))
                self.evicted_pages += evicted.num_tokens_evicted // ps
            req.lock = lock
            self.allocate(req, hit, r.input_length + r.output_length)
            req.extend_end = r.input_length
            checkpoint_kv_cache(req, self.tree)  # the prefill ran (instantly)
            self.live[i] = req
            self.prompt_tokens += r.input_length
            self.hit_tokens += hit
            self.hit_requests += hit > 0
            self.schedule_pages(now, i)
            self.queue.popleft()

    def schedule_pages(self, now: int, i: int) -> None:
        """Output token ``k`` (from 1) comes ``tpot * (k - 1)`` after the
        prefill. Events: each ``k`` that fills a page (it is cached then, as
        the simulator caches a block once computed), and the last token."""
        r = self.requests[i]
        ps = self.settings.block_size
        out = max(r.output_length, 1)
        first = ps - r.input_length % ps  # the k that fills the prompt's last page
        for k in [*range(first, out, ps), out]:
            self.seq += 1
            heapq.heappush(self.events, (now + (k - 1) * self.settings.tpot_ns, self.seq, i, k))

    def allocate(self, req: Req, hit: int, seq_len: int) -> None:
        """Slots for the prompt past the hit and every decode token, written
        into a new row after the hit's cached pages."""
        assert self.pool.alloc([req]) is not None, "out of request rows"
        prefix = self.tree.prefix_device_indices(req) if hit else torch.empty(0, dtype=torch.int64)
        last = torch.tensor([int(prefix[-1]) if hit else -1], dtype=torch.int64)
        lens = torch.tensor([hit], dtype=torch.int64)
        seq = torch.tensor([seq_len], dtype=torch.int64)
        out = self.allocator.alloc_extend(lens, lens, seq, seq, last, seq_len - hit)
        assert out is not None, "the admission check reserved these pages"
        row = req.kv.req_pool_idx
        self.pool.write((row, slice(0, hit)), prefix.to(torch.int32))
        self.pool.write((row, slice(hit, seq_len)), out.to(torch.int32))
        req.kv.kv_allocated_len = seq_len
        req.kv.kv_committed_len = len(req.origin_input_ids)

    def produced(self, i: int, k: int) -> bool:
        """Request ``i`` has computed its first ``k`` output tokens: a full
        page is cached (``checkpoint``), or after the last token the request
        is released into the cache. Returns whether it was released."""
        r = self.requests[i]
        req = self.live[i]
        end = r.input_length + min(k, r.output_length)
        req.output_ids = array("q", (r.token_at(p) for p in range(r.input_length, end)))
        req.kv.kv_committed_len = end
        if k < r.output_length:
            req.refresh_fill_ids()
            self.tree.checkpoint(req, up_to=end)
            return False
        del self.live[i]
        release_kv_cache(req, self.tree, checkpoint=True)
        self.done += 1
        return True

    def run(self) -> Dict[str, Any]:
        arrivals = [r.timestamp * NS_PER_MS for r in self.requests]
        nxt = 0
        while self.events or nxt < len(arrivals):
            event = self.events[0][0] if self.events else None
            if event is not None and (nxt == len(arrivals) or event <= arrivals[nxt]):
                t, _, i, k = heapq.heappop(self.events)
                if self.produced(i, k):
                    self.try_admit(t)
            else:
                self.queue.append(nxt)
                nxt += 1
                if len(self.queue) == 1:
                    self.try_admit(arrivals[nxt - 1])
        completed = self.done - self.never_fit
        return {
            "requests": len(self.requests),
            "completed": completed,
            "never_fit": self.never_fit,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "hit_requests": self.hit_requests,
            "request_hit_rate": self.hit_requests / completed if completed else 0.0,
            "evictions": self.evicted_pages,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--blocks", type=int, required=True)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--tpot-ms", type=int, default=40)
    parser.add_argument("--compare", metavar="BIN", help="check against BIN simulate --json")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = Settings(
        num_blocks=args.blocks, block_size=args.block_size, tpot_ns=args.tpot_ms * NS_PER_MS
    )
    report = Replay(parse_trace(args.trace.read_text()), settings).run()
    print(json.dumps(report, indent=2) if args.json else
          f"replay of {args.trace.name} through SGLang's objects with mla_cache.sglang: "
          f"{100 * report['token_hit_rate']:.2f} % of prompt tokens hit "
          f"({report['hit_tokens']:,} / {report['prompt_tokens']:,}), "
          f"{report['evictions']:,} pages evicted")  # fmt: skip
    if args.compare:
        sim = simulate(args.compare, args.trace, settings)
        diff = [f"{k}: {report[k]!r} != {sim[k]!r}" for k in PREFIX_FIELDS if report[k] != sim[k]]
        verdict = "every prefix figure agrees" if not diff else "DIFFERS: " + "; ".join(diff)
        print(f"simulate: {100 * sim['token_hit_rate']:.2f} % hit, "
              f"{sim['evictions']:,} evictions; {verdict}")  # fmt: skip
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
