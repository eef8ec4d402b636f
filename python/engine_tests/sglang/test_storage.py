"""mla_cache's remote tier as SGLang 0.5.23's HiCache storage backend (L3),
built by SGLang's own backend factory from the dynamic-backend settings,
over SGLang's MLA host pool, called through SGLang's cache controller's
storage methods, against real Valkey/Redis servers (a single node and a
3-node cluster, started by scripts/redis.sh), compared with SGLang's
``HiCacheFile`` backend on the same calls."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis_servers as rs
import storage_driver as d
import torch
from sglang.srt.mem_cache.hicache_storage import PoolName

from mla_cache import EVICTION_POLICIES

HERE = Path(__file__).parent


@pytest.fixture
def remotes():
    return rs.servers()


def namespace() -> str:
    return f"ns-{uuid.uuid4().hex}"


def store_in_another_process(settings: dict, dtype: str, seed: int, n: int, layout: str = "page_first") -> None:
    out = subprocess.run(
        [sys.executable, str(HERE / "storage_driver.py"), json.dumps(settings), dtype, str(seed), str(n), layout],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "stored" in out.stdout, out.stderr[-3000:]


def queries(prompts: list[list[int]]) -> list[list[int]]:
    """The stored prompts, each one's first pages with a new tail, and a new
    prompt: full, partial and no hits."""
    fresh = [40000 + i for i in range(4 * d.PAGE)]
    return prompts + [p[: 2 * d.PAGE] + fresh[: 2 * d.PAGE] for p in prompts] + [fresh]


@pytest.mark.parametrize(
    "server, dtype, layout",
    [(s, t, "page_first") for s in ("single", "cluster") for t in ("bf16", "fp8", "fp8_ds_mla")]
    + [("single", "bf16", "page_first_direct")],
)
def test_pages_one_process_stored_load_byte_exact_in_another_as_from_hicache_file(
    remotes, tmp_path, dtype, server, layout
):
    ns = namespace()
    prompts = d.requests(seed=3, n=6)
    store_in_another_process(d.mla_settings(remotes[server], ns), dtype, seed=3, n=6, layout=layout)
    reference = d.Controller("file", {"file_storage_path": str(tmp_path)}, d.make_host(dtype, layout=layout))
    written = d.store(reference, prompts)
    ours = d.Controller("dynamic", d.mla_settings(remotes[server], ns), d.make_host(dtype, layout=layout))
    try:
        for q in queries(prompts):
            hashes, hit_tokens = ours.hit_query(q)
            assert (hashes, hit_tokens) == reference.hit_query(q)
            (got_pages, got_at), (want_pages, want_at) = ours.prefetch(q), reference.prefetch(q)
            assert got_pages == want_pages == hit_tokens // d.PAGE
            if got_pages:
                got = d.pages_bytes(ours.host, got_at)
                assert got == d.pages_bytes(reference.host, want_at)
                stored = next(w for p, w in zip(prompts, written) if p[:hit_tokens] == q[:hit_tokens])
                assert got == stored[: len(got)]
                ours.host.free(got_at)
                reference.host.free(want_at)
        counters = ours.backend.counters()
        assert counters["rejected"] == counters["errors"] == counters["timeouts"] == 0
        assert counters["get_bytes"] > 0
    finally:
        ours.close()
        reference.close()


def test_another_model_format_or_namespace_never_hits(remotes):
    ns = namespace()
    prompts = d.requests(seed=5, n=2)
    writer = d.Controller("dynamic", d.mla_settings(remotes["single"], ns), d.make_host("bf16"))
    try:
        d.store(writer, prompts)
    finally:
        writer.close()
    readers = {
        "same": d.Controller("dynamic", d.mla_settings(remotes["single"], ns), d.make_host("bf16")),
        "namespace": d.Controller("dynamic", d.mla_settings(remotes["single"], namespace()), d.make_host("bf16")),
        "model": d.Controller("dynamic", d.mla_settings(remotes["single"], ns), d.make_host("bf16"), model="moonshotai/Kimi-K2"),
        "format": d.Controller("dynamic", d.mla_settings(remotes["single"], ns), d.make_host("fp8")),
        "layout": d.Controller(
            "dynamic", d.mla_settings(remotes["single"], ns), d.make_host("bf16", layout="page_first_direct")
        ),
    }
    try:
        hits = {name: r.hit_query(prompts[0])[1] for name, r in readers.items()}
    finally:
        for r in readers.values():
            r.close()
    assert hits == {"same": len(prompts[0]), "namespace": 0, "model": 0, "format": 0, "layout": 0}


def test_only_the_writer_rank_writes_and_every_rank_reads(remotes):
    ns = namespace()
    prompts = d.requests(seed=7, n=2)
    settings = d.mla_settings(remotes["single"], ns)
    other = d.Controller("dynamic", settings, d.make_host("bf16"), tp_rank=1, tp_size=2)
    try:
        assert other.c.backup_skip  # SGLang's own rule: rank 1 of an MLA model does not write
        d.store(other, prompts)  # called anyway: reports success, writes nothing
        assert other.backend.counters()["put_blocks"] == 0
        assert other.hit_query(prompts[0])[1] == 0
        writer = d.Controller("dynamic", settings, d.make_host("bf16"), tp_rank=0, tp_size=2)
        try:
            written = d.store(writer, prompts)
        finally:
            writer.close()
        pages, at = other.prefetch(prompts[1])
        assert pages == 4 and d.pages_bytes(other.host, at) == written[1]
    finally:
        other.close()


def _attach(settings: dict, **kwargs):
    return d.Controller("dynamic", settings, kwargs.pop("host", None) or d.make_host("bf16"), **kwargs)


def test_settings_it_cannot_serve_are_refused_naming_the_cause(remotes):
    url = remotes["single"]
    with pytest.raises(ValueError, match="interface_v1"):
        _attach({**d.mla_settings(url, "n"), "interface_v1": 0})
    with pytest.raises(ValueError, match="remote and namespace"):
        _attach({k: v for k, v in d.mla_settings(url, "n").items() if k not in ("remote", "namespace")})
    with pytest.raises(ValueError, match="MLA model"):
        _attach(d.mla_settings(url, "n"), is_mla=False)
    with pytest.raises(ValueError, match="page_first"):
        _attach(d.mla_settings(url, "n"), host=d.make_host("bf16", layout="layer_first"))
    ctrl = _attach(d.mla_settings(url, "n"))
    try:
        # DeepSeek-V3.2's indexer keys arrive as a side pool: refused, naming the calls missing.
        with pytest.raises(ValueError, match="batch_get_v2"):
            ctrl.backend.register_mem_host_pool_v2(d.make_host("bf16"), PoolName.INDEXER)
        with pytest.raises(NotImplementedError, match="interface_v1"):
            ctrl.backend.get("k")
    finally:
        ctrl.close()


def _timed(f, *args):
    start = time.monotonic()
    out = f(*args)
    return out, time.monotonic() - start


def test_a_server_that_never_answers_costs_misses_not_stalls():
    prompt = d.requests(seed=9, n=1)[0]
    with rs.SilentServer() as url:
        ctrl = _attach(d.mla_settings(url, "silent", lookup_budget_ms=20))
        try:
            (hashes, hit), took = _timed(ctrl.hit_query, prompt)
            assert hit == 0 and took < 0.5, f"an existence check took {took:.3f} s"
            # The write-back runs on SGLang's backup thread: it fails within
            # the server timeouts and SGLang goes on.
            indices = ctrl.host.alloc(len(prompt))
            written, took = _timed(ctrl.backup, prompt, indices)
            assert written == 0 and took < 5.0
            counters = ctrl.backend.counters()
            assert counters["timeouts"] + counters["errors"] >= 1, counters
        finally:
            ctrl.close()


def test_a_killed_and_restarted_server_costs_misses_then_serves_again(remotes):
    url = remotes["single"]
    port = rs.port(url)
    ns = namespace()
    prompts = d.requests(seed=11, n=1)
    ctrl = _attach(d.mla_settings(url, ns))
    try:
        rs.kill(port)
        time.sleep(0.2)
        (_, hit), took = _timed(ctrl.hit_query, prompts[0])
        assert hit == 0 and took < 0.5
        indices = ctrl.host.alloc(len(prompts[0]))
        assert ctrl.backup(prompts[0], indices) == 0
        ctrl.host.free(indices)
        assert ctrl.backend.counters()["errors"] >= 1
    finally:
        rs.restart(port)
    time.sleep(0.6)  # past the backend's reconnection pause
    try:
        written = d.store(ctrl, prompts)
    finally:
        ctrl.close()
    reader = _attach(d.mla_settings(url, ns))
    try:
        pages, at = reader.prefetch(prompts[0])
        assert pages == 4 and d.pages_bytes(reader.host, at) == written[0]
    finally:
        reader.close()


def test_a_cluster_losing_a_primary_costs_misses_then_recovers(remotes):
    ports = rs.cluster_ports()
    ns = namespace()
    prompts = d.requests(seed=13, n=2)
    writer = _attach(d.mla_settings(remotes["cluster"], ns))
    try:
        d.store(writer, prompts)
    finally:
        writer.close()
    victim = ports[1]
    rs.kill(victim)
    try:
        rs.wait(lambda: not rs.cluster_ok([ports[0]]), timeout=30)
        ctrl = _attach(d.mla_settings(remotes["cluster"], ns))
        try:
            (_, hit), took = _timed(ctrl.hit_query, prompts[0])
            assert hit == 0 and took < 0.5
            assert ctrl.backend.counters()["errors"] >= 1
        finally:
            ctrl.close()
    finally:
        rs.restart(victim)
        rs.wait(lambda: rs.cluster_ok(ports), timeout=60)
    time.sleep(0.6)
    writer = _attach(d.mla_settings(remotes["cluster"], ns))
    try:
        written = d.store(writer, prompts)
    finally:
        writer.close()
    reader = _attach(d.mla_settings(remotes["cluster"], ns))
    try:
        pages, at = reader.prefetch(prompts[1])
        assert pages == 4 and d.pages_bytes(reader.host, at) == written[1]
    finally:
        reader.close()


def test_sglangs_command_line_offers_every_registered_policy_with_the_backend():
    script = (
        "import argparse, json, warnings; warnings.filterwarnings('ignore')\n"
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "from mla_cache import EVICTION_POLICIES\n"
        "load_plugins()\n"
        "parser = argparse.ArgumentParser()\n"
        "ServerArgs.add_cli_args(parser)\n"
        "print(json.dumps([parser.parse_args(['--model-path', 'm', '--radix-cache-backend',\n"
        "    'mla_cache', '--radix-eviction-policy', p]).radix_eviction_policy\n"
        "    for p in EVICTION_POLICIES]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == list(EVICTION_POLICIES)
