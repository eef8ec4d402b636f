"""mla_cache's shared remote tier (Valkey/Redis) as a HiCache storage
backend (L3) of unmodified SGLang 0.5.23, under SGLang's own radix cache
and host pool::

    python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 \\
      --enable-hierarchical-cache --hicache-mem-layout page_first \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{
        "backend_name": "mla_cache", "module_path": "mla_cache.sglang_storage",
        "class_name": "MlaHiCacheStorage", "interface_v1": 1,
        "remote": "redis://valkey:6379/", "namespace": "deepseek-v3-0324"}'

SGLang copies pages between the GPU and its host pool; this backend copies
host pages to and from the remote store, on SGLang's storage I/O threads.
Everything that touches the store (keys, values with their header and
checksum, batching, the worker thread, the bounded queue, counters) is
mla_cache's Rust remote tier (:class:`mla_cache.ChunkTransfers`, the same
calls as the vLLM tier); this class maps SGLang's zero-copy page calls to
it: one host page is one value.

MLA: the latent is the same on every tensor-parallel rank, so SGLang
writes from one rank (``is_storage_writer``), keys carry no rank, and
every rank reads. DeepSeek-V3.2's indexer keys travel in a side pool
through SGLang's v2 calls, which this backend does not implement: it
refuses such a pool when SGLang registers it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
)
from sglang.srt.observability.metrics_collector import StorageMetrics

from ._native import ChunkTransfers

__all__ = ["MlaHiCacheStorage"]

logger = logging.getLogger(__name__)

# Host pool layouts whose pages are contiguous (one page, all layers, is one
# value); ``layer_first`` spreads a page over every layer's slab.
_PAGE_CONTIGUOUS_LAYOUTS = ("page_first", "page_first_direct")


def _encoding(dtype: torch.dtype, row_bytes: int) -> str:
    """mla_cache's name of a host pool row of DeepSeek's 512 + 64 latent."""
    if dtype == torch.bfloat16 and row_bytes == 1152:
        return "bf16"
    if dtype.itemsize == 1 and row_bytes == 576:
        return "fp8_e4m3"
    if dtype.itemsize == 1 and row_bytes == 656:
        return "fp8_ds_mla"
    raise ValueError(
        f"MlaHiCacheStorage stores DeepSeek MLA latents (512 + 64 in bf16, fp8 or "
        f"fp8_ds_mla), not rows of {row_bytes} bytes of {dtype}"
    )


class MlaHiCacheStorage(HiCacheStorage):
    """A HiCache storage backend on mla_cache's remote tier.

    Settings, in ``--hicache-storage-backend-extra-config`` beside
    ``backend_name``, ``module_path``, ``class_name`` and ``interface_v1``
    (required: the backend moves host pages without copies): ``remote``, a
    Valkey/Redis URL (``redis://host:port/``, ``rediss://`` for TLS,
    ``redis://user:password@host:port/``) or ``cluster:url,url,...``;
    ``namespace``, naming the model and weights (engines share pages only
    under the same one; SGLang's model name, pipeline stage, host layout
    and page geometry are added to it); ``lookup_budget_ms`` (20), the
    longest one existence check may take before its pages count as misses.
    The namespace must also tell apart KV quantizations whose bytes look
    alike (fp8 e4m3 or e5m2, different KV scales): SGLang keeps both in
    ``uint8`` host rows.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        extra = dict(storage_config.extra_config or {})
        if not extra.get("interface_v1"):
            raise ValueError(
                'MlaHiCacheStorage moves host pages without copies: add "interface_v1": 1 '
                "to --hicache-storage-backend-extra-config"
            )
        missing = [k for k in ("remote", "namespace") if not extra.get(k)]
        if missing:
            raise ValueError(
                f"MlaHiCacheStorage needs {' and '.join(missing)} in "
                "--hicache-storage-backend-extra-config"
            )
        if not storage_config.is_mla_model:
            raise ValueError(
                "MlaHiCacheStorage stores one copy of each page for every rank: it needs an "
                "MLA model, whose latent is the same on every tensor-parallel rank"
            )
        if storage_config.dcp_size > 1 or storage_config.attn_cp_size > 1:
            raise ValueError(
                "MlaHiCacheStorage stores whole pages: context parallelism splits a page "
                "over ranks"
            )
        self._config = storage_config
        self._remote = str(extra["remote"])
        self._namespace = str(extra["namespace"])
        self._lookup_budget_ms = float(extra.get("lookup_budget_ms", 20.0))
        self._chunks: Optional[ChunkTransfers] = None
        self._page_size = 0
        self._page_gb = 0.0
        self._metrics = StorageMetrics()

    # -- attach -----------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        host = mem_pool_host
        layout = getattr(host, "layout", None)
        if layout not in _PAGE_CONTIGUOUS_LAYOUTS:
            raise ValueError(
                f"MlaHiCacheStorage stores a page as one value: it needs the host pool's "
                f"page_first or page_first_direct layout (--hicache-mem-layout), not {layout}"
            )
        buffer = getattr(host, "kv_buffer", None)
        if not isinstance(buffer, torch.Tensor) or buffer.device.type != "cpu":
            raise ValueError("MlaHiCacheStorage needs an MLA host pool with its buffer in host memory")
        row_bytes = host.kv_cache_dim * host.dtype.itemsize
        encoding = _encoding(host.dtype, row_bytes)
        self._page_size = host.page_size
        page_bytes = host.page_size * host.layer_num * row_bytes
        self._page_gb = page_bytes / 1e9
        # SGLang's own identity of the pages (model name with the host pool's
        # format tag, pipeline stage) and their layout in the host pool.
        identity = {
            "model": self._config.model_name,
            "pp": [self._config.pp_rank, self._config.pp_size],
            "layout": layout,
            "dtype": str(host.dtype),
            "row_bytes": row_bytes,
        }
        try:
            self._chunks = ChunkTransfers(
                self._remote,
                buffer.view(torch.uint8).reshape(-1).numpy(),
                chunk_bytes=page_bytes,
                chunk_stride=page_bytes,
                dtype=encoding,
                num_layers=host.layer_num,
                tokens_per_chunk=host.page_size,
                namespace=self._namespace + "\0" + json.dumps(identity, sort_keys=True),
                lookup_budget_ms=self._lookup_budget_ms,
                name="L3",
            )
        except ValueError as e:
            raise ValueError(f"MlaHiCacheStorage: {e}") from e

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if host_pool_name != PoolName.KV:
            raise ValueError(
                f"MlaHiCacheStorage moves the MLA KV pool only; the {host_pool_name} side pool "
                "(DeepSeek-V3.2's indexer keys, state pools) needs SGLang's v2 storage calls "
                "(batch_exists_v2, batch_get_v2, batch_set_v2), which it does not implement"
            )
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def _transfers(self) -> ChunkTransfers:
        if self._chunks is None:
            raise RuntimeError("MlaHiCacheStorage has no host pool registered")
        return self._chunks

    def _page_ids(self, host_indices: torch.Tensor) -> Any:
        """The host pages whose first token slots are every page_size-th index."""
        return (host_indices[:: self._page_size] // self._page_size).numpy()

    # -- SGLang's zero-copy calls ------------------------------------------

    def batch_exists(
        self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> int:
        """The leading pages of ``keys`` in the store: one round trip within
        the lookup budget; past it, or on a failure, none."""
        found = self._transfers().probe(keys)
        if not found:
            return 0
        return found.index(False) if False in found else len(found)

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        """Loads the pages into the host pool: the leading run that the store
        has, intact, is loaded (True); the rest are untouched."""
        start = time.perf_counter()
        done = self._transfers().load(keys, self._page_ids(host_indices))
        self._record(self._metrics.prefetch_pgs, self._metrics.prefetch_bandwidth, done, start)
        return [True] * done + [False] * (len(keys) - done)

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        """Stores the pages the store lacks; every page True, or every page
        False if any write failed (the pages written before the failure
        stay, each whole). Only the writer rank writes (the latent is the
        same on every rank); the others report success, as the writer
        stores the same pages."""
        if not self._config.is_storage_writer:
            return [True] * len(keys)
        start = time.perf_counter()
        ok = self._transfers().store(keys, self._page_ids(host_indices))
        self._record(self._metrics.backup_pgs, self._metrics.backup_bandwidth, len(keys) if ok else 0, start)
        return [ok] * len(keys)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def _record(self, pages: list, bandwidth: list, done: int, start: float) -> None:
        if done and self._config.enable_storage_metrics:
            pages.append(done)
            bandwidth.append(done * self._page_gb / max(time.perf_counter() - start, 1e-9))

    # -- SGLang's copying calls: refused (the backend needs interface_v1) ---

    def _copying_call(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError(
            'MlaHiCacheStorage implements SGLang\'s zero-copy page calls ("interface_v1": 1)'
        )

    get = batch_get = set = batch_set = _copying_call

    # -- upkeep -------------------------------------------------------------

    def clear(self) -> None:
        """Leaves the store alone: other engines share it (evict there with
        the server's ``maxmemory-policy``)."""
        logger.info("MlaHiCacheStorage.clear: the shared store is left as it is")

    def get_stats(self) -> StorageMetrics:
        """SGLang's storage metrics since the last call (pages and GB/s of
        each load and store, with ``--enable-storage-metrics``)."""
        metrics, self._metrics = self._metrics, StorageMetrics()
        return metrics

    def counters(self) -> dict[str, int]:
        """The remote tier's counters (``ChunkTransfers.stats``)."""
        return self._transfers().stats()

    def close(self) -> None:
        if self._chunks is not None:
            self._chunks.close()
