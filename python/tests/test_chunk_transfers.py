"""mla_cache.ChunkTransfers from Python: closing while another thread waits
on the server, and arguments refused before anything is queued. (Round
trips against real servers are tested inside the engines.)"""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

import mla_cache

LAYERS, TOKENS = 2, 4
CHUNK = LAYERS * TOKENS * 1152


class SilentServer:
    """Accepts connections on 127.0.0.1 and never answers."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.stop = threading.Event()
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        return f"redis://127.0.0.1:{self.sock.getsockname()[1]}/"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                self.accepted.append(self.sock.accept()[0])
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()
        for c in self.accepted:
            c.close()


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
