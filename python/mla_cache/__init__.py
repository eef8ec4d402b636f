"""Paged KV cache for Multi-head Latent Attention (DeepSeek-V2/V3/R1, Kimi-K2).

MLA caches one latent per token and layer: ``kv_lora_rank`` compressed values
(``c_kv``, 512 for DeepSeek) plus ``rope_dim`` decoupled RoPE key values (64).

- :class:`CacheConfig`: geometry, storage format and cache policy, with model
  presets (``CacheConfig.preset("deepseek-v3", num_blocks=..., dtype=...)``).
- :class:`BlockManager`: block allocation, prefix sharing by chained block
  hashes, copy-on-write for forked requests, pinning, and eviction by ARC
  (the default, best on real traffic) or LRU (vLLM's order); thread-safe.
- :class:`PrefixCache`: the same prefix cache over block ids the caller
  allocates and frees (SGLang's model): insert, match, lock, evict.
- :class:`LatentStore`: the latents of every layer on the host or a GPU in
  ``bf16``, ``fp8_ds_mla``, ``mxfp6`` or ``nvfp4_ds_mla``: quantizing writes, decoding gathers,
  block copies, and zero-copy access (numpy views, DLPack, raw pointers).
- :class:`ChunkTransfers`: the remote tier moving chunks of an engine's own
  host buffer (behind the engines' offload plug-ins).
- :class:`TieredCache`: a manager and its store with a host-memory tier
  and a remote Valkey/Redis tier below (``docs/tiers.md``).
- Events (:class:`BlockStored`, :class:`BlockRemoved`,
  :class:`AllBlocksCleared`) for KV-aware routers, mirroring vLLM's, and
  :class:`EventPublisher`, which sends them over ZeroMQ in vLLM's wire format.
- Engine adapters: :mod:`mla_cache.vllm_scheduler` (vLLM 0.33/0.34's
  schedulers on :mod:`mla_cache.vllm`'s ``KVCacheManager``, selected with
  ``--scheduler-cls``; it imports vLLM) and
  :mod:`mla_cache.sglang` (a radix-cache backend SGLang 0.5.23 selects with
  ``--radix-cache-backend mla_cache``; it imports SGLang); the remote tier
  under the engines' own host caches: :mod:`mla_cache.vllm_tier` (a vLLM
  secondary offload tier) and :mod:`mla_cache.sglang_storage` (an SGLang
  HiCache storage backend). Each is imported on its own.
- :data:`EVICTION_POLICIES`: every eviction policy's name.

Errors: :class:`OutOfBlocks` (a ``MemoryError``) when blocks run short,
``KeyError`` for unknown requests, ``ValueError``/``TypeError`` for bad input.
"""

import os
from importlib.metadata import PackageNotFoundError, version


def _locate_nvrtc() -> None:
    """Points a CUDA build at NVIDIA's NVRTC wheel (``nvidia-cuda-nvrtc-cu12``)
    when it is installed and ``MLA_CACHE_NVRTC`` is not set."""
    if "MLA_CACHE_NVRTC" in os.environ:
        return
    try:
        import nvidia.cuda_nvrtc as nvrtc
    except ImportError:
        return
    for root in nvrtc.__path__:
        lib = os.path.join(root, "lib")
        if os.path.isdir(lib):
            os.environ["MLA_CACHE_NVRTC"] = lib
            return


_locate_nvrtc()

from ._native import (
    EVICTION_POLICIES,
    Admission,
    AllBlocksCleared,
    AppendOutcome,
    BlockManager,
    BlockRemoved,
    BlockStored,
    CacheConfig,
    CacheEvent,
    ChunkTransfers,
    EventPublisher,
    ExtraKeys,
    Insertion,
    LatentStore,
    LayerBuffer,
    MultiModalKey,
    OutOfBlocks,
    PinBudgetExceeded,
    PrefixCache,
    PrefixMatch,
    StorageError,
    TierHits,
    TieredAdmission,
    TieredCache,
)

__all__ = [
    "EVICTION_POLICIES",
    "Admission",
    "AllBlocksCleared",
    "AppendOutcome",
    "BlockManager",
    "BlockRemoved",
    "BlockStored",
    "CacheConfig",
    "CacheEvent",
    "ChunkTransfers",
    "EventPublisher",
    "ExtraKeys",
    "Insertion",
    "LatentStore",
    "LayerBuffer",
    "MultiModalKey",
    "OutOfBlocks",
    "PinBudgetExceeded",
    "PrefixCache",
    "PrefixMatch",
    "StorageError",
    "TierHits",
    "TieredAdmission",
    "TieredCache",
]

try:
    __version__ = version("mla-cache")
except PackageNotFoundError:  # imported from a source tree
    __version__ = "0.0.0"
