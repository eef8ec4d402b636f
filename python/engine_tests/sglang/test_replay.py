"""Generated workloads (``chat``, ``agents``) through SGLang's objects with
the backend give ``mla-cache simulate``'s prefix figures and evictions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "python" / "bench"))

from replay_sglang_backend import PREFIX_FIELDS, Replay  # noqa: E402
from replay_vllm_adapter import Settings, parse_trace  # noqa: E402

BINARY = Path(os.environ.get("MLA_CACHE_BIN", ROOT / "target" / "release" / "mla-cache"))
"""The simulator (``scripts/engine-tests.sh`` builds it)."""


# Exact where both share the same blocks. They part when a request computes
# a block another one cached meanwhile: the backend frees its copy and keeps
# the cached one, locked, as SGLang does, where the simulator's block manager
# keeps the private copy and may evict the cached one (docs/adapters.md):
# chat, 40 conversations, 2000 blocks hits 64 tokens more than simulate.
@pytest.mark.parametrize(
    "workload, conversations, blocks",
    [("chat", 40, 300), ("agents", 6, 400)],
)
def test_replay_matches_simulate(tmp_path, workload, conversations, blocks):
    trace = tmp_path / "trace.jsonl"
    cmd = [str(BINARY), "simulate", "--json", "--workload", workload,
           "--conversations", str(conversations), "--blocks", str(blocks),
           "--save-trace", str(trace), "--eviction", Settings.eviction]  # fmt: skip
    sim = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    ours = Replay(parse_trace(trace.read_text()), Settings(num_blocks=blocks)).run()
    assert {k: ours[k] for k in PREFIX_FIELDS} == {k: sim[k] for k in PREFIX_FIELDS}
    assert ours["evictions"] == sim["evictions"]
    assert sim["hit_tokens"] > 0 and sim["completed"] > 0
