"""SGLang's ``SchedulePolicy`` orders its waiting queue the same way over
mla_cache's backend as over its own RadixCache."""

from typing import List

import pytest
from conftest import BACKENDS
from driver import Engine
from sglang.srt.managers.schedule_policy import SchedulePolicy

from test_conformance import prompt


def waiting_order(cls, policy: str) -> List[tuple]:
    """Caches three conversations, then lets ``policy`` order six waiting
    requests; returns ``(rid, prefix_len)`` in the order it chose."""
    e = Engine(cls, num_pages=128, page_size=4)
    e.run(e.request("sys", prompt(32), max_new_tokens=1))
    e.run(e.request("sys-x", prompt(32) + prompt(16, 300), max_new_tokens=1))
    e.run(e.request("other", prompt(24, 5000), max_new_tokens=1))
    waiting = [
        e.request("w-none", prompt(30, 9000)),
        e.request("w-sys8", prompt(8) + prompt(20, 700)),
        e.request("w-other", prompt(24, 5000) + prompt(3, 800)),
        e.request("w-sys", prompt(32) + prompt(10, 1200)),
        e.request("w-sys-x", prompt(32) + prompt(16, 300) + [1, 2]),
        e.request("w-sys-x2", prompt(32) + prompt(16, 300) + [3, 4, 5]),
    ]
    SchedulePolicy(policy, e.tree, False, False, False).calc_priority(waiting)
    return [(r.rid, r.prefix_len) for r in waiting]


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "fcfs"])
def test_waiting_queue_order(policy):
    orders = {name: waiting_order(cls, policy) for name, cls in BACKENDS.items()}
    assert orders["mla_cache"] == orders["sglang"]
    if policy == "lpm":
        assert orders["sglang"][0] in (("w-sys-x", 48), ("w-sys-x2", 48))
