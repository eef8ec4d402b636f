"""vLLM's own schedulers on mla_cache's block manager, for an unmodified vLLM
0.33 or 0.34::

    vllm serve deepseek-ai/DeepSeek-V3 \\
        --scheduler-cls mla_cache.vllm_scheduler.MlaAsyncScheduler

(``LLM(..., scheduler_cls=...)`` takes the same dotted path or the class.)
:class:`MlaAsyncScheduler` is vLLM's ``AsyncScheduler`` (vLLM schedules
asynchronously by default) and :class:`MlaScheduler` its synchronous
``Scheduler``; each is vLLM's class unchanged except that the KV cache
manager it builds is :class:`mla_cache.vllm.KVCacheManager`, taking the same
keywords. A model whose KV cache is not MLA's one latent group, a KV
connector that reaches into vLLM's block pool, or a vLLM outside the tested
versions fails at start-up with an error naming it.
"""

from __future__ import annotations

import threading
from typing import Any

import vllm
from vllm.v1.core.sched import scheduler as _scheduler_module
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from .vllm import KVCacheManager

__all__ = ["MlaAsyncScheduler", "MlaScheduler", "TESTED_VLLM_VERSIONS", "UnsupportedVllm"]

TESTED_VLLM_VERSIONS = ("0.33", "0.34")
"""The vLLM releases (major.minor) whose scheduler the adapter is tested in."""

_POOL_CONNECTORS = ("SimpleCPUOffloadConnector",)
"""KV connectors that take and free vLLM's GPU blocks themselves (reference
counts, ``touch``, cached-block lookups by id): they need vLLM's own pool."""

_build_lock = threading.Lock()


class UnsupportedVllm(RuntimeError):
    """vLLM, or its configuration, is one the adapter does not run in."""


def check_vllm_version(version: str) -> None:
    """Raises :class:`UnsupportedVllm` unless ``version`` is a tested release."""
    if ".".join(version.split(".")[:2]) not in TESTED_VLLM_VERSIONS:
        tested = ", ".join(f"{v}.*" for v in TESTED_VLLM_VERSIONS)
        raise UnsupportedVllm(f"mla_cache's scheduler is tested with vLLM {tested}; this is vLLM {version}")


def _check_connector(vllm_config: Any) -> None:
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    name = getattr(transfer, "kv_connector", None)
    if name in _POOL_CONNECTORS:
        raise UnsupportedVllm(
            f"the KV connector {name} manages vLLM's own GPU block pool; with mla_cache's "
            "scheduler use the OffloadingConnector (or none)"
        )


class _OnMlaCache:
    """Builds vLLM's scheduler with mla_cache's KV cache manager in place of
    vLLM's (the scheduler module's ``KVCacheManager``, read by
    ``Scheduler.__init__``, names ours while the scheduler is built)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_vllm_version(vllm.__version__)
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        _check_connector(vllm_config)
        with _build_lock:
            stock = _scheduler_module.KVCacheManager
            _scheduler_module.KVCacheManager = KVCacheManager
            try:
                super().__init__(*args, **kwargs)
            finally:
                _scheduler_module.KVCacheManager = stock


class MlaScheduler(_OnMlaCache, Scheduler):
    """vLLM's synchronous ``Scheduler`` on mla_cache's KV cache manager."""


class MlaAsyncScheduler(_OnMlaCache, AsyncScheduler):
    """vLLM's ``AsyncScheduler`` (vLLM's default) on mla_cache's KV cache
    manager."""
