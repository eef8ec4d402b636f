"""Drives a HiCache storage backend as SGLang 0.5.23's cache controller does.

The backend is built by SGLang's own ``StorageBackendFactory`` from the
``--hicache-storage-backend`` settings, over SGLang's own MLA host pool
(``MLATokenToKVPoolHost``, page-first, on CPU tensors), and called through
the controller's own storage methods (``_storage_hit_query``,
``_page_transfer``, ``_page_backup``, with the page get/set functions the
controller selects), run on a controller holding only the storage state.

Run as a script, it is a second SGLang process storing pages::

    python storage_driver.py BACKEND_JSON DTYPE SEED REQUESTS LAYOUT
"""

from __future__ import annotations

import json
import sys
import warnings
from queue import Queue
from typing import Any, Optional

import numpy as np
import torch

warnings.filterwarnings("ignore", message="Only CUDA")

from sglang.srt.managers.cache_controller import (  # noqa: E402
    HiCacheController,
    PrefetchOperation,
    StorageOperation,
)
from sglang.srt.mem_cache.device_pool_info import MLABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

PAGE = 16
LAYERS = 3
MODEL = "deepseek-ai/DeepSeek-V3"

# Host pool rows (dtype, elements a token) as SGLang's MLA pools keep them
# (fp8_ds_mla: DeepSeek-V3.2's packed fp8 rows, FlashMLA's layout).
DTYPES = {"bf16": (torch.bfloat16, 576), "fp8": (torch.uint8, 576), "fp8_ds_mla": (torch.uint8, 656)}


def make_host(dtype: str, pages: int = 64, layout: str = "page_first", *, page: int = PAGE,
              layers: int = LAYERS) -> MLATokenToKVPoolHost:
    """SGLang's MLA host pool of ``pages`` pages of ``page`` tokens (plus its
    reserved page)."""
    torch_dtype, dim = DTYPES[dtype]
    device_tokens = pages * page // 2
    buffers = tuple(torch.zeros(device_tokens + page, 1, dim, dtype=torch_dtype) for _ in range(layers))
    info = MLABufferInfo(
        buffers=buffers,
        data_ptrs=torch.tensor([b.data_ptr() for b in buffers]),
        layer_indices=tuple(range(layers)),
        device_layer_num=layers,
        page_size=page,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        kv_cache_dim=dim,
        dtype=torch_dtype,
        device=torch.device("cpu"),
    )
    return MLATokenToKVPoolHost(
        info,
        2.0,
        0,
        page,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=device_tokens,
        start_layer=0,
        end_layer=layers,
        target_layer_num=layers,
    )


def mla_settings(remote: str, namespace: str, **extra: Any) -> dict:
    """``--hicache-storage-backend dynamic`` settings selecting mla_cache."""
    return {
        "backend_name": "mla_cache",
        "module_path": "mla_cache.sglang_storage",
        "class_name": "MlaHiCacheStorage",
        "interface_v1": 1,
        "remote": remote,
        "namespace": namespace,
        **extra,
    }


def storage_config(extra: dict, *, model: str = MODEL, tp_rank: int = 0, tp_size: int = 1,
                   is_mla: bool = True) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=is_mla,
        enable_storage_metrics=True,
        is_page_first_layout=True,
        model_name=model,
        extra_config=dict(extra),
    )


class Controller:
    """SGLang's cache controller, holding only its storage state: the
    backend attached as ``attach_storage_backend`` attaches it (built by
    the factory, the host pool registered, the zero-copy page functions
    chosen for ``interface_v1``), and the controller's own storage calls."""

    def __init__(self, backend_name: str, extra: dict, host: MLATokenToKVPoolHost, **config: Any) -> None:
        c = object.__new__(HiCacheController)
        c.page_size = host.page_size
        c.mem_pool_host = c.storage_host_pool = host
        c.storage_config = storage_config(extra, **config)
        c.storage_backend_type = backend_name
        c.storage_backend = StorageBackendFactory.create_backend(backend_name, c.storage_config, host)
        c.storage_backend.register_mem_pool_host(host)
        c.storage_backend.on_host_pools_registered()
        zero_copy = backend_name == "dynamic" and bool(extra.get("interface_v1", 0))
        c.page_get_func = c._page_get_zero_copy if zero_copy else c._generic_page_get
        c.page_set_func = c._page_set_zero_copy if zero_copy else c._generic_page_set
        c.prefetch_sync_queue = Queue()
        self.c = c
        self.host = host

    @property
    def backend(self) -> Any:
        return self.c.storage_backend

    def close(self) -> None:
        if hasattr(self.backend, "close"):
            self.backend.close()

    def page_hashes(self, tokens: list[int]) -> list[str]:
        return get_storage_hash_str(tokens, None, page_size=self.c.page_size)

    def backup(self, tokens: list[int], host_indices: torch.Tensor) -> int:
        """The write-back of a request's pages from the host pool (tokens
        written)."""
        op = StorageOperation(host_indices, tokens, hash_value=self.page_hashes(tokens))
        self.c._page_backup(op)
        return op.completed_tokens

    def hit_query(self, tokens: list[int]) -> tuple[list[str], int]:
        """The prefetch thread's existence check: (hit page hashes, tokens)."""
        return self.c._storage_hit_query(PrefetchOperation("q", tokens))

    def prefetch(self, tokens: list[int]) -> tuple[int, Optional[torch.Tensor]]:
        """A whole prefetch: the existence check, host pages for the hits,
        the transfer. Returns (pages loaded, their host indices)."""
        op = PrefetchOperation("p", tokens)
        hashes, hit_tokens = self.c._storage_hit_query(op)
        if not hashes:
            return 0, None
        op.hash_value = hashes
        op.host_indices = self.host.alloc(hit_tokens)
        return self.c._page_transfer(op), op.host_indices


def requests(seed: int, n: int, pages: int = 4) -> list[list[int]]:
    """``n`` prompts of whole pages; each shares a prefix with the one before."""
    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    for i in range(n):
        shared = out[-1][: PAGE * int(rng.integers(0, pages))] if out else []
        fresh = rng.integers(0, 32000, size=pages * PAGE - len(shared)).tolist()
        out.append(shared + fresh)
    return out


def _pages(host: MLATokenToKVPoolHost) -> torch.Tensor:
    """The host pool's bytes, one row per page (page-first layouts keep a
    page, all its layers, contiguous)."""
    return host.kv_buffer.view(torch.uint8).reshape(-1).view(-1, host.get_size_per_token() * host.page_size)


def fill(host: MLATokenToKVPoolHost, indices: torch.Tensor, tokens: list[int]) -> None:
    """Writes the latents a model would compute for ``tokens`` (each page's
    a function of its prefix) into the pages at ``indices``."""
    pages = _pages(host)
    for i, slot in enumerate(indices[:: host.page_size].tolist()):
        seed = hash(tuple(tokens[: (i + 1) * host.page_size])) & 0xFFFFFFFF
        row = np.random.default_rng(seed).integers(0, 256, pages.shape[1], dtype=np.uint8)
        pages[slot // host.page_size].copy_(torch.from_numpy(row))


def pages_bytes(host: MLATokenToKVPoolHost, indices: torch.Tensor) -> bytes:
    """The bytes of the pages at ``indices``, in order."""
    return _pages(host)[indices[:: host.page_size] // host.page_size].numpy().tobytes()


def store(ctrl: Controller, prompts: list[list[int]]) -> list[bytes]:
    """Computes and writes back each prompt; returns each one's page bytes."""
    out = []
    for tokens in prompts:
        indices = ctrl.host.alloc(len(tokens))
        fill(ctrl.host, indices, tokens)
        assert ctrl.backup(tokens, indices) == len(tokens)
        out.append(pages_bytes(ctrl.host, indices))
        ctrl.host.free(indices)
    return out


if __name__ == "__main__":
    settings, dtype, seed, n, layout = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    ctrl = Controller("dynamic", settings, make_host(dtype, layout=layout))
    try:
        store(ctrl, requests(seed, n))
    finally:
        ctrl.close()
    print("stored")
