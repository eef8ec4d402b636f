"""The trace replay through the vLLM adapter reproduces `mla-cache simulate`
exactly: same admissions, hits, evictions, queueing and usage."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "mla-cache"
TRACE = ROOT / "data" / "mooncake_synthetic_trace.jsonl"


def load_replay():
    spec = importlib.util.spec_from_file_location(
        "replay_vllm_adapter", ROOT / "python" / "bench" / "replay_vllm_adapter.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve names through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def binary():
    if not BINARY.exists():
        subprocess.run(
            ["cargo", "build", "--release", "--bin", "mla-cache"], cwd=ROOT, check=True
        )
    return str(BINARY)


@pytest.fixture(scope="module")
def replay():
    return load_replay()


@pytest.mark.parametrize(
    "lines, blocks, tpot_ns, prefill_ns",
    [
        (400, 3000, 40_000_000, 0),  # evictions under pressure
        (250, 700, 20_000_000, 5_000),  # a full cache: queueing, a prefill lane, requests too large
    ],
)
def test_replay_agrees_with_simulate(tmp_path, binary, replay, lines, blocks, tpot_ns, prefill_ns):
    subset = tmp_path / "trace.jsonl"
    with TRACE.open() as f:
        subset.write_text("".join(next(f) for _ in range(lines)))
    settings = replay.Settings(
        num_blocks=blocks, tpot_ns=tpot_ns, prefill_ns_per_token=prefill_ns, seed=3
    )
    ours = replay.replay(replay.parse_trace(subset.read_text()), settings)
    theirs = replay.simulate(binary, subset, settings)
    assert replay.differences(ours, theirs) == []
    assert ours["hit_tokens"] > 0 and ours["evictions"] > 0
    assert ours["completed"] + ours["never_fit"] == lines
    assert ours["manager"]["calls"] > 0


def test_replay_counts_what_the_trace_implies(replay):
    text = "\n".join(
        json.dumps(d)
        for d in [
            {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 3]},
            {"timestamp": 5, "input_length": 1030, "output_length": 2, "hash_ids": [1, 2, 4]},
            {"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [7, 8]},
        ]
    )
    requests = replay.parse_trace(text)
    assert len(requests) == 2  # the third has the wrong number of hash ids
    r = replay.replay(requests, replay.Settings(num_blocks=64))
    assert r["hit_tokens"] == 1024 and r["hit_requests"] == 1
    assert r["output_tokens"] == 5 and r["completed"] == 2
    assert r["queue_delay_ms"]["max"] == 0.0
