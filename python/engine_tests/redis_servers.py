"""The Valkey/Redis servers the engine tests run against (a single node and a
3-node cluster on 127.0.0.1, started by scripts/redis.sh), and the faults
they inject: a server that accepts and never answers, a node killed and
restarted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest


def servers() -> dict[str, str]:
    """``{"single": url, "cluster": "cluster:url,url,url"}``; skips (or fails,
    with MLA_CACHE_REQUIRE_REDIS) when scripts/redis.sh has not started them."""
    single = os.environ.get("MLA_CACHE_REDIS_URL")
    cluster = os.environ.get("MLA_CACHE_REDIS_CLUSTER")
    if not single or not cluster:
        if os.environ.get("MLA_CACHE_REQUIRE_REDIS"):
            pytest.fail("MLA_CACHE_REDIS_URL/_CLUSTER are unset (start scripts/redis.sh)")
        pytest.skip("no Valkey/Redis servers (start scripts/redis.sh)")
    return {"single": single, "cluster": "cluster:" + cluster}


def cluster_ports() -> list[str]:
    return [port(u) for u in os.environ["MLA_CACHE_REDIS_CLUSTER"].split(",")]


def port(url: str) -> str:
    return url.rstrip("/").rsplit(":", 1)[1]


def kill(server_port: str) -> None:
    """Kills a server of scripts/redis.sh at once (SIGKILL)."""
    pid = int(Path(os.environ["MLA_CACHE_REDIS_DIR"], server_port, "redis.pid").read_text())
    os.kill(pid, signal.SIGKILL)


def restart(server_port: str) -> None:
    """Starts a killed server again with its configuration, and waits for it."""
    conf = Path(os.environ["MLA_CACHE_REDIS_DIR"], server_port, "redis.conf")
    subprocess.run(["redis-server", str(conf)], check=True)
    wait(lambda: _cli(server_port, "ping").strip() == "PONG")


def cluster_ok(ports: list[str]) -> bool:
    return all("cluster_state:ok" in _cli(p, "cluster", "info") for p in ports)


def wait(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _cli(server_port: str, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", server_port, *args], capture_output=True, text=True).stdout


class SilentServer:
    """A listener on 127.0.0.1 that accepts connections and never answers."""

    def __enter__(self) -> str:
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._server.settimeout(0.1)
        self._accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        return f"redis://127.0.0.1:{self._server.getsockname()[1]}/"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self._accepted.append(self._server.accept()[0])
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._server.close()
        for c in self._accepted:
            c.close()
