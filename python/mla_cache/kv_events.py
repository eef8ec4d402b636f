"""KV cache events in the shape serving engines publish to KV-aware routers.

vLLM (``vllm.distributed.kv_events``) and SGLang publish ``BlockStored``,
``BlockRemoved`` and ``AllBlocksCleared`` with the fields below. The engine
adapters (:mod:`mla_cache.vllm`, :mod:`mla_cache.sglang`) translate the block
manager's own events into these, so a router written for the engine reads
them unchanged. Block hashes are mla_cache's external hashes (the low 64
bits of its seeded 128-bit xxh3 chain: unsigned 64-bit ints, which the
engines' msgpack publishers can send), not the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

from ._native import AllBlocksCleared as _NativeCleared
from ._native import BlockRemoved as _NativeRemoved
from ._native import BlockStored as _NativeStored
from ._native import CacheEvent

MEDIUM_GPU = "GPU"
"""The ``medium`` the adapters report: blocks live in the engine's device cache."""


@dataclass(frozen=True)
class BlockStored:
    """Consecutive blocks of one hash chain became shareable."""

    block_hashes: List[int]
    """Hashes of the stored blocks, in chain order."""
    parent_block_hash: Optional[int]
    """Hash of the block before the first one; ``None`` for a chain's root."""
    token_ids: List[int]
    """The blocks' token ids, ``block_size`` per block."""
    block_size: int
    """Tokens per block."""
    lora_id: Optional[int]
    """Integer id of the LoRA adapter the blocks were computed with."""
    medium: Optional[str]
    """Where the blocks live (``"GPU"``)."""
    lora_name: Optional[str]
    """Name of the LoRA adapter the blocks were computed with."""
    group_idx: int = 0
    """KV cache group (MLA models have one)."""


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted to make room)."""

    block_hashes: List[int]
    """Hashes of the removed blocks."""
    medium: Optional[str]
    """Where the blocks lived (``"GPU"``)."""
    group_idx: int = 0
    """KV cache group (MLA models have one)."""


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KVCacheEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]
"""Any event an adapter's ``take_events`` returns."""

LoraLookup = Callable[[Optional[str]], Tuple[Optional[str], Optional[int]]]
"""Maps the manager's adapter key to ``(lora_name, lora_id)``."""


def convert(events: List[CacheEvent], lora: LoraLookup) -> List[KVCacheEvent]:
    """Translates the block manager's events, oldest first; ``lora`` names the
    adapter behind each stored chain."""
    out: List[KVCacheEvent] = []
    for e in events:
        if isinstance(e, _NativeStored):
            name, lora_id = lora(e.adapter)
            out.append(
                BlockStored(
                    block_hashes=e.block_hashes,
                    parent_block_hash=e.parent_block_hash,
                    token_ids=e.token_ids,
                    block_size=e.block_size,
                    lora_id=lora_id,
                    medium=MEDIUM_GPU,
                    lora_name=name,
                )
            )
        elif isinstance(e, _NativeRemoved):
            out.append(BlockRemoved(block_hashes=e.block_hashes, medium=MEDIUM_GPU))
        elif isinstance(e, _NativeCleared):
            out.append(AllBlocksCleared())
        else:
            raise TypeError(f"unknown cache event {e!r}")
    return out
