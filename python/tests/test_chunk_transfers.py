"""mla_cache.ChunkTransfers from Python: closing while another thread waits
on the server, and arguments refused before anything is queued. (Round
trips against real servers are tested inside the engines.)"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import mla_cache

# The listener that never answers, shared with the engine tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine_tests"))
from redis_servers import SilentServer  # noqa: E402

LAYERS, TOKENS = 2, 4
CHUNK = LAYERS * TOKENS * 1152


def transfers(remote: str, region: np.ndarray) -> mla_cache.ChunkTransfers:
    return mla_cache.ChunkTransfers(
        remote, region, chunk_bytes=CHUNK, dtype="bf16", num_layers=LAYERS,
        tokens_per_chunk=TOKENS, namespace="t",
    )


def test_closing_while_another_thread_waits_on_the_server_neither_hangs_nor_frees_early():
    region = np.zeros((4, CHUNK), dtype=np.uint8)
    with SilentServer() as url:
        t = transfers(url, region)
        done: list[int] = []
        loader = threading.Thread(target=lambda: done.append(t.load([b"k"], [0])))
        loader.start()
        threading.Event().wait(0.1)  # the load is waiting on the silent server
        t.close()  # returns at once: the load still holds the transfers
        loader.join(timeout=30)
        assert not loader.is_alive(), "the load never returned"
        assert done == [0]
        with pytest.raises(RuntimeError, match="closed"):
            t.load([b"k"], [0])
        t.close()  # idempotent


def test_bad_arguments_are_refused():
    region = np.zeros((4, CHUNK), dtype=np.uint8)
    with SilentServer() as url:
        t = transfers(url, region)
        try:
            with pytest.raises(ValueError):
                t.load([b"a", "b"], [0])
            with pytest.raises(ValueError):
                t.store(["a"], [4])
            with pytest.raises(TypeError):
                t.load([1], [0])
            assert t.in_flight == 0
        finally:
            t.close()
    with pytest.raises(ValueError, match="576 bytes a token"):
        mla_cache.ChunkTransfers(
            "redis://127.0.0.1:1/", region, chunk_bytes=CHUNK, dtype="fp8_e4m3",
            num_layers=LAYERS, tokens_per_chunk=TOKENS, namespace="t",
        )
