"""mla_cache's remote tier as vLLM's secondary offload tier, inside vLLM's own
``TieringOffloadingManager`` (built by ``TieringOffloadingSpec`` from the
tier's JSON settings), against real Valkey/Redis servers (a single node and
a 3-node cluster, started by scripts/redis.sh), compared with vLLM's ``fs``
tier on a local directory on the same calls."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis_servers as rs
import tier_driver as d

HERE = Path(__file__).parent


def mla_tier(remote: str, namespace: str, **extra) -> dict:
    return {
        "type": "MlaRemoteTier",
        "module_path": "mla_cache.vllm_tier",
        "remote": remote,
        "namespace": namespace,
        **extra,
    }


def fs_tier(root: Path) -> dict:
    return {"type": "fs", "root_dir": str(root), "n_read_threads": 2, "n_write_threads": 2}


def engine() -> str:
    return f"mla-tier-test-{uuid.uuid4().hex[:12]}"


def store_in_another_process(tiers: list[dict], dtype: str, seed: int, n: int) -> None:
    """A second engine process stores the chain ``keys(seed, n)``."""
    out = subprocess.run(
        [sys.executable, str(HERE / "tier_driver.py"), json.dumps(tiers), engine(), dtype, str(seed), str(n)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "stored" in out.stdout, out.stderr[-3000:]


@pytest.fixture
def remotes():
    return rs.servers()


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8_ds_mla"])
@pytest.mark.parametrize("mode", ["single", "cluster"])
def test_chunks_one_engine_stored_load_byte_exact_in_another_as_from_vllms_fs_tier(
    remotes, tmp_path, dtype, mode
):
    namespace = f"ns-{uuid.uuid4().hex}"
    tiers = {"fs": [fs_tier(tmp_path)], "mla": [mla_tier(remotes[mode], namespace)]}
    chain = d.keys(7, 8)
    outcome = {}
    for name, tier in tiers.items():
        # Six chunks stored by another engine process; then a hole at the
        # seventh for a chain stored later by this one.
        store_in_another_process(tier, dtype, 7, 6)
        reader = d.make_manager(tier, engine(), dtype)
        try:
            hits, got = d.load(reader, "r1", chain, dtype)
            assert [len(b) for b in got] == [d.chunk_bytes(dtype)] * hits
            assert got == [d.payload(k, dtype) for k in chain[:hits]], f"{name}: wrong bytes"
            # Chunks the reader stores itself and loads back after its CPU
            # tier dropped them (a fresh engine: the CPU tier is per engine).
            d.store(reader, "w", d.keys(9, 3), dtype)
        finally:
            reader.shutdown()
        again = d.make_manager(tier, engine(), dtype)
        try:
            outcome[name] = (hits, d.load(again, "r2", d.keys(9, 4), dtype))
        finally:
            again.shutdown()
    assert outcome["fs"][0] == outcome["mla"][0] == 6
    assert outcome["fs"][1] == outcome["mla"][1]
    assert outcome["mla"][1][0] == 3


def test_another_model_format_or_namespace_never_hits(remotes):
    namespace = f"ns-{uuid.uuid4().hex}"
    chain = d.keys(3, 4)
    writer = d.make_manager([mla_tier(remotes["single"], namespace)], engine())
    try:
        d.store(writer, "w", chain, "bfloat16")
    finally:
        writer.shutdown()
    for tiers, dtype, model in [
        ([mla_tier(remotes["single"], namespace)], "bfloat16", "deepseek-ai/DeepSeek-V2-Lite"),
        ([mla_tier(remotes["single"], namespace)], "bfloat16", "moonshotai/Kimi-K2-Instruct"),
        ([mla_tier(remotes["single"], namespace)], "fp8_ds_mla", "deepseek-ai/DeepSeek-V2-Lite"),
        ([mla_tier(remotes["single"], namespace + "-other-weights")], "bfloat16", "deepseek-ai/DeepSeek-V2-Lite"),
    ]:
        reader = d.make_manager(tiers, engine(), dtype, model=model)
        try:
            hits, _ = d.load(reader, "r", chain, dtype)
        finally:
            reader.shutdown()
        expected = 4 if (model, dtype, tiers[0]["namespace"]) == (
            "deepseek-ai/DeepSeek-V2-Lite",
            "bfloat16",
            namespace,
        ) else 0
        assert hits == expected, (model, dtype, tiers[0]["namespace"])


def test_layouts_that_are_not_one_copy_of_mla_latents_are_refused(remotes):
    tier = [mla_tier(remotes["single"], "refused")]
    # A GQA model's chunk: 2 KV heads of K and V, 128 wide, in bf16.
    with pytest.raises(ValueError, match="MLA latents"):
        d.make_manager(tier, engine(), "bfloat16", token_bytes=2 * 2 * 128 * 2)
    # float16 is not a format mla_cache stores MLA latents in.
    with pytest.raises(ValueError, match="MlaRemoteTier"):
        d.make_manager(tier, engine(), "float16", token_bytes=1152)
    # Two ranks, each with its own copy (vLLM's replicated layout is off).
    with pytest.raises(ValueError, match="replicated MLA layout"):
        d.make_manager(tier, engine(), "bfloat16", world_size=2)


def test_stored_chunks_are_reported_with_their_medium_through_vllms_events(remotes):
    chain = d.keys(11, 3)
    tier = mla_tier(remotes["single"], f"ns-{uuid.uuid4().hex}", enable_kv_events=True)
    m = d.make_manager([tier], engine(), events=True)
    try:
        d.store(m, "w", chain, "bfloat16")
        remote = [e for e in m.take_events() if e.locality is not None and e.locality.name == "REMOTE"]
    finally:
        m.shutdown()
    assert [list(e.keys) for e in remote] == [chain]
    assert all(e.medium.name == "CPU" and not e.removed for e in remote)


def _timed_load(manager, req, chain, dtype="bfloat16"):
    """``d.load`` with the longest single manager call (the scheduler's
    view of a stall)."""
    longest = 0.0
    original_lookup, original_end = manager.lookup, manager.on_schedule_end

    def timed(f):
        def call(*a, **k):
            nonlocal longest
            t = time.monotonic()
            try:
                return f(*a, **k)
            finally:
                longest = max(longest, time.monotonic() - t)

        return call

    manager.lookup, manager.on_schedule_end = timed(original_lookup), timed(original_end)
    try:
        return d.load(manager, req, chain, dtype), longest
    finally:
        manager.lookup, manager.on_schedule_end = original_lookup, original_end


def _tier(manager):
    (tier,) = manager.secondary_tiers
    return tier


def test_a_server_that_never_answers_costs_misses_not_stalls(remotes):
    with rs.SilentServer() as url:
        m = d.make_manager([mla_tier(url, "silent", lookup_budget_ms=20)], engine())
        try:
            (hits, _), longest = _timed_load(m, "r", d.keys(5, 4))
            assert hits == 0
            assert longest < 0.5, f"a manager call took {longest:.3f} s"
            d.store(m, "w", d.keys(5, 2), "bfloat16")  # the cascade fails; vLLM goes on
            stats = _tier(m).stats()
            assert stats["timeouts"] + stats["errors"] >= 1, stats
            assert stats["hit_blocks"] == 0
        finally:
            m.shutdown()


def test_a_killed_and_restarted_server_costs_misses_then_serves_again(remotes):
    url = remotes["single"]
    port = rs.port(url)
    chain = d.keys(21, 3)
    namespace = f"ns-{uuid.uuid4().hex}"
    m = d.make_manager([mla_tier(url, namespace)], engine())
    try:
        rs.kill(port)
        time.sleep(0.2)
        (hits, _), longest = _timed_load(m, "r1", chain)
        assert hits == 0 and longest < 0.5
        d.store(m, "w1", chain, "bfloat16")
        assert _tier(m).stats()["errors"] >= 1
    finally:
        m.shutdown()
        rs.restart(port)
    # Restarted (empty): a store goes through again and another engine loads it.
    time.sleep(0.6)  # past the backend's reconnection pause
    writer = d.make_manager([mla_tier(url, namespace)], engine())
    try:
        d.store(writer, "w2", chain, "bfloat16")
    finally:
        writer.shutdown()
    reader = d.make_manager([mla_tier(url, namespace)], engine())
    try:
        hits, got = d.load(reader, "r2", chain, "bfloat16")
    finally:
        reader.shutdown()
    assert hits == 3 and got == [d.payload(k, "bfloat16") for k in chain]


def test_a_cluster_losing_a_primary_costs_misses_then_recovers(remotes):
    """A primary killed (no replica takes over: the cluster is down), then
    restarted: misses and counted errors, never a stall or an exception;
    afterwards the cluster serves again."""
    ports = rs.cluster_ports()
    namespace = f"ns-{uuid.uuid4().hex}"
    chain = d.keys(31, 6)
    writer = d.make_manager([mla_tier(remotes["cluster"], namespace)], engine())
    try:
        d.store(writer, "w", chain, "bfloat16")
    finally:
        writer.shutdown()
    victim = ports[1]
    rs.kill(victim)
    try:
        # Once the survivors see the primary gone, the cluster refuses requests
        # (full slot coverage is required, the servers' default).
        rs.wait(lambda: not rs.cluster_ok([ports[0]]), timeout=30)
        m = d.make_manager([mla_tier(remotes["cluster"], namespace)], engine())
        try:
            (hits, got), longest = _timed_load(m, "r", chain)
            assert hits == 0 and longest < 0.5
            assert _tier(m).stats()["errors"] >= 1
        finally:
            m.shutdown()
    finally:
        rs.restart(victim)
        rs.wait(lambda: rs.cluster_ok(ports), timeout=60)
    time.sleep(0.6)
    writer = d.make_manager([mla_tier(remotes["cluster"], namespace)], engine())
    try:
        d.store(writer, "w2", chain, "bfloat16")
    finally:
        writer.shutdown()
    reader = d.make_manager([mla_tier(remotes["cluster"], namespace)], engine())
    try:
        hits, got = d.load(reader, "r2", chain, "bfloat16")
    finally:
        reader.shutdown()
    assert hits == len(chain) and got == [d.payload(k, "bfloat16") for k in chain]
