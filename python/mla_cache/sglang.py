"""A radix-cache backend for SGLang 0.5.23, backed by :class:`mla_cache.PrefixCache`.

SGLang's token allocator owns the KV slots; this cache only indexes the pages
requests computed and tells the allocator which pages to free. One page is
one mla_cache block (``page_size`` = block size) and a page's block id is
``slot // page_size``, the page id SGLang's paged allocator hands out.

Selecting it: installing ``mla_cache`` registers the backend with SGLang's
plug-in loader (entry point ``sglang.srt.plugins``), so an unmodified SGLang
takes ``--radix-cache-backend mla_cache``. :func:`register` does the same by
hand (``SGLANG_PLUGINS`` may filter plug-ins).

How :class:`RadixCache` meets SGLang's ``BasePrefixCache`` contract:

- ``match_prefix`` returns the longest cached run of whole pages; its node
  (:class:`PrefixNode`) names the cached block ids on that path.
- ``lock``/``inc_lock_ref`` lock those blocks (never evicted while locked),
  ``unlock``/``dec_lock_ref`` release them; ``protected_size`` counts locked
  cached tokens and ``evictable_size`` unlocked ones, exactly.
- ``checkpoint(req, up_to=n)`` inserts the request's full pages of its first
  ``n`` tokens, frees through the allocator the request's pages that another
  request cached first, rewrites the request's row onto the cached pages,
  advances ``req.kv.cache_protected_len`` and moves the request's lock.
- ``evict`` / ``evict_for_alloc`` take unlocked pages by the eviction policy
  (leaves before their ancestors) and free them through the allocator.
- ``take_events`` returns SGLang's own ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared`` with mla_cache's 64-bit block hashes.

SGLang is imported by this module only: ``import mla_cache`` never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared as SglAllBlocksCleared,
)
from sglang.srt.disaggregation.kv_events import (
    BlockRemoved as SglBlockRemoved,
)
from sglang.srt.disaggregation.kv_events import (
    BlockStored as SglBlockStored,
)
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams

from ._native import (
    EVICTION_POLICIES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheConfig,
    PrefixCache,
)

__all__ = ["BACKEND_NAME", "PrefixNode", "RadixCache", "register"]

BACKEND_NAME = "mla_cache"
"""The name ``--radix-cache-backend`` takes."""


EVENT_HASH_SEED = 0
"""Seed of the block hash chain (fixed, so hashes agree across processes)."""

SIMULATED_NUM_BLOCKS = 1 << 20
"""Block ids a cache without an allocator accepts (SGLang's simulated trees)."""


@dataclass(frozen=True, eq=False)
class PrefixNode:
    """A cached prefix: what ``match_prefix``, ``insert`` and ``checkpoint``
    leave in ``req.last_node``, and what the lock calls take. It names the
    cached block ids of the prefix's pages, in order; the root is empty."""

    block_ids: Tuple[int, ...]
    """Cached block (page) ids of the prefix, one per page."""

    def __len__(self) -> int:
        return len(self.block_ids)


class RadixCache(BasePrefixCache):
    """SGLang's radix cache contract over an mla_cache :class:`PrefixCache`.

    Built from SGLang's ``CacheInitParams``: ``page_size`` is the block size,
    the block ids are the allocator's pages (``0 ..= size // page_size``),
    ``eviction_policy`` one of :data:`EVICTION_POLICIES`. Hybrid SWA/Mamba
    models, hierarchical caching and EAGLE's bigram keys are not supported.
    Raises ``ValueError`` for settings it cannot serve.
    """

    def __init__(self, params: CacheInitParams) -> None:
        if params.is_eagle:
            raise ValueError("mla_cache's SGLang backend does not support EAGLE bigram keys")
        policy = params.eviction_policy.lower()
        if policy not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction policy {params.eviction_policy!r} is not one of {EVICTION_POLICIES}"
            )
        self.disable: bool = params.disable
        """Whether prefix sharing is off (``--disable-radix-cache``)."""
        self.req_to_token_pool = params.req_to_token_pool
        """SGLang's per-request rows of KV slots."""
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        """SGLang's allocator: owns the pages, frees what this cache gives back."""
        self.page_size: int = params.page_size
        """Tokens per page (the block size)."""
        self.eviction_policy: str = policy
        """The eviction policy's name."""
        self.enable_kv_cache_events: bool = params.enable_kv_cache_events and not self.disable
        """Whether ``take_events`` reports stores and removals."""
        self.lora_names = params.kv_event_lora_names
        """SGLang's table of LoRA names for events, by ``extra_key``."""
        allocator = self.token_to_kv_pool_allocator
        device = getattr(allocator, "device", "cpu") if allocator is not None else "cpu"
        self.device = torch.device(device if isinstance(device, (str, torch.device)) else "cpu")
        """Where match results' KV indices live (the allocator's device)."""
        num_blocks = (
            allocator.size // self.page_size + 1
            if isinstance(getattr(allocator, "size", None), int)
            else SIMULATED_NUM_BLOCKS
        )
        self.cache = PrefixCache(
            CacheConfig(
                num_blocks,
                block_size=self.page_size,
                eviction=policy,
                enable_events=self.enable_kv_cache_events,
                # One seed for every scheduler process: a KV-aware router
                # sees the same hash for the same prefix on every rank.
                hash_seed=EVENT_HASH_SEED,
            )
        )
        """The mla_cache prefix index over the allocator's page ids."""
        self.root_node = PrefixNode(())
        """The empty prefix."""
        # The ids the cache holds, for all_values_flatten (PrefixCache lists
        # none): every insert adds its path, every evict and reset removes.
        self._cached: set = set()
        self._offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        if params.enable_metrics:
            self.init_metrics_collector()

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: Optional[Any] = None,
        page_size: int = 1,
        enable_kv_cache_events: bool = False,
        **_ignored: Any,
    ) -> "RadixCache":
        """A cache without memory pools (SGLang's ``create_simulated``): any
        block id below :data:`SIMULATED_NUM_BLOCKS` is accepted."""
        return cls(
            CacheInitParams(
                disable=disable,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=mock_allocator,
                page_size=page_size,
                enable_kv_cache_events=enable_kv_cache_events,
            )
        )

    # ----- matching and inserting -----

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """The longest cached prefix of ``params.key`` in whole pages
        (``device_prefix_len`` tokens) and its node. Takes no lock; refreshes
        the prefix's recency."""
        tokens, extra = self._key(params.key)
        if self.disable or len(tokens) == 0:
            return self._match_result(0, self.root_node)
        found = self.cache.match_prefix(tokens, extra_keys=extra)
        node = PrefixNode(tuple(int(b) for b in found.block_ids))
        return self._match_result(len(node) * self.page_size, node)

    def touch_prefix(self, key: Any) -> None:
        """Refreshes the recency of ``key``'s cached pages (a match whose
        result is dropped)."""
        self.match_prefix(MatchPrefixParams(key=key))

    def insert(self, params: InsertParams) -> InsertResult:
        """Indexes the full pages of ``params.key`` held at the KV indices
        ``params.value`` (the key's tokens when ``None``, as in SGLang).
        ``prefix_len`` is how many leading tokens were cached before; as in
        SGLang the caller frees its own copies of those pages."""
        if self.disable:
            return InsertResult(prefix_len=0)
        tokens, extra = self._key(params.key)
        value = (
            params.value
            if params.value is not None
            else torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        )
        if len(value) < len(tokens):
            raise ValueError(f"insert: {len(value)} KV indices for {len(tokens)} tokens")
        outcome = self._insert(tokens, extra, self._block_ids(value[: len(tokens)]))
        node = PrefixNode(tuple(int(b) for b in outcome.block_ids))
        return InsertResult(
            prefix_len=outcome.num_cached_blocks * self.page_size,
            total_len=len(tokens),
            last_device_node=node,
        )

    def checkpoint(self, req: Any, *, up_to: int, **_kwargs: Any) -> None:
        """Caches the full pages of the request's first ``up_to`` tokens (its
        row in ``req_to_token_pool``): frees the request's pages another
        request cached first, points the row at the cached pages, advances
        ``req.kv.cache_protected_len`` to the cached length and moves
        ``req.lock`` / ``req.last_node`` to the new prefix."""
        if self.disable:
            return
        kv = req.kv
        tokens, extra = self._key_of(req, req.full_untruncated_fill_ids[:up_to])
        n = len(tokens)
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
        outcome = self._insert(tokens, extra, self._block_ids(row[:n]))
        self._free_blocks(outcome.duplicate_block_ids)
        node = PrefixNode(tuple(int(b) for b in outcome.block_ids))
        start = kv.cache_protected_len
        if n > start:
            slots = self.path_device_indices(node)[start:n]
            self.req_to_token_pool.write((kv.req_pool_idx, slice(start, n)), slots.to(row.dtype))
        kv.cache_protected_len = max(start, n)
        kv.cache_inserted_len = max(kv.cache_inserted_len, n)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    # ----- locks -----

    def inc_lock_ref(self, node: PrefixNode) -> IncLockRefResult:
        """Locks the node's pages; ``delta`` is minus the tokens that stopped
        being evictable. Raises if a page is no longer cached."""
        if self.disable or not node.block_ids:
            return IncLockRefResult(delta=0)
        before = self.cache.evictable_blocks
        self.cache.lock(np.asarray(node.block_ids, dtype=np.int64))
        return IncLockRefResult(delta=(self.cache.evictable_blocks - before) * self.page_size)

    def dec_lock_ref(
        self, node: PrefixNode, params: Optional[DecLockRefParams] = None
    ) -> DecLockRefResult:
        """Releases one lock on the node's pages; ``delta`` is the tokens that
        became evictable."""
        if self.disable or not node.block_ids:
            return DecLockRefResult(delta=0)
        before = self.cache.evictable_blocks
        self.cache.unlock(np.asarray(node.block_ids, dtype=np.int64))
        return DecLockRefResult(delta=(self.cache.evictable_blocks - before) * self.page_size)

    # ----- eviction -----

    def evict(self, params: EvictParams) -> EvictResult:
        """Evicts unlocked pages until ``params.num_tokens`` tokens are freed
        or none is left, freeing them through the allocator."""
        if self.disable or params.num_tokens <= 0:
            return EvictResult()
        pages = -(-params.num_tokens // self.page_size)
        evicted = self.cache.evict(pages)
        self._cached.difference_update(evicted.tolist())
        self._free_blocks(evicted)
        return EvictResult(num_tokens_evicted=len(evicted) * self.page_size)

    # ----- sizes and views -----

    def evictable_size(self) -> int:
        """Tokens of cached pages no lock holds."""
        return self.cache.evictable_blocks * self.page_size

    def protected_size(self) -> int:
        """Tokens of cached pages some lock holds."""
        return self.cache.protected_blocks * self.page_size

    def total_size(self) -> int:
        """Tokens of every cached page."""
        return int(self.cache.stats()["cached_blocks"]) * self.page_size

    def supports_prefix_sharing(self) -> bool:
        """Whether prefixes are shared (not ``disable``)."""
        return not self.disable

    def path_device_indices(self, node: PrefixNode) -> torch.Tensor:
        """The KV indices (slots) of the node's pages, in order."""
        blocks = torch.as_tensor(node.block_ids, dtype=torch.int64, device=self.device)
        return (blocks[:, None] * self.page_size + self._offsets).reshape(-1)

    def all_values_flatten(self) -> torch.Tensor:
        """The KV indices of every cached page."""
        return self.path_device_indices(PrefixNode(tuple(sorted(self._cached))))

    def dfs_weight_order(self, node_handles: Sequence[PrefixNode]) -> List[int]:
        """Request indices in SGLang's ``dfs-weight`` order over the prefixes'
        pages: a depth-first walk taking the page shared by the most requests
        first, each prefix's requests after those of its extensions."""
        weight: dict = {}
        for node in node_handles:
            for i in range(1, len(node.block_ids) + 1):
                weight[node.block_ids[:i]] = weight.get(node.block_ids[:i], 0) + 1

        def order(i: int) -> Tuple[Tuple[int, int], ...]:
            ids = node_handles[i].block_ids
            path = tuple((-weight[ids[: j + 1]], ids[j]) for j in range(len(ids)))
            return path + ((0, 0),)  # after every extension: weights sort below 0

        return sorted(range(len(node_handles)), key=order)

    def reset(self) -> None:
        """Forgets every cached page and frees it (SGLang's ``flush_cache``
        clears the allocator next); reports ``AllBlocksCleared``. Raises
        while a lock is held (SGLang resets only when idle)."""
        self._free_blocks(self.cache.reset())
        self._cached.clear()

    def pretty_print(self) -> None:
        """Prints the cache's sizes (SGLang calls this when allocation fails)."""
        print(
            f"mla_cache prefix cache: #tokens: {self.total_size()} "
            f"(evictable {self.evictable_size()}, protected {self.protected_size()}, "
            f"page_size {self.page_size}, policy {self.eviction_policy})"
        )

    def take_events(self) -> List[Any]:
        """Stores, removals and resets since the last call, oldest first, as
        SGLang's own event classes (empty unless events are enabled)."""
        return [self._event(e) for e in self.cache.take_events()]

    # ----- helpers -----

    def _match_result(self, length: int, node: PrefixNode) -> MatchResult:
        return MatchResult(
            device_prefix_len=length,
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
        )

    def _key(self, key: Any) -> Tuple[np.ndarray, dict]:
        """A SGLang ``RadixKey``'s page-aligned tokens (``limit`` applied)
        and its namespace."""
        if getattr(key, "is_bigram", False):
            raise ValueError("mla_cache's SGLang backend does not support EAGLE bigram keys")
        raw = key.raw_token_ids() if hasattr(key, "raw_token_ids") else key.token_ids
        return self._aligned(raw), self._namespace(key.extra_key, getattr(key, "cache_salt", None))

    def _key_of(self, req: Any, token_ids: Iterable[int]) -> Tuple[np.ndarray, dict]:
        """A request's page-aligned tokens and namespace."""
        return self._aligned(token_ids), self._namespace(req.extra_key, req.cache_salt)

    def _aligned(self, token_ids: Any) -> np.ndarray:
        tokens = np.asarray(token_ids, dtype=np.int64)
        return tokens[: len(tokens) // self.page_size * self.page_size]

    @staticmethod
    def _namespace(extra_key: Optional[str], cache_salt: Optional[str]) -> dict:
        """SGLang's ``extra_key`` (LoRA id and more) and ``cache_salt``, each
        isolating prefixes from the first page."""
        extra: dict = {}
        if extra_key is not None:
            extra["adapter"] = extra_key
        if cache_salt:
            extra["salt"] = cache_salt
        return extra

    def _insert(self, tokens: np.ndarray, extra: dict, block_ids: np.ndarray) -> Any:
        """``PrefixCache.insert``, remembering the ids now cached."""
        outcome = self.cache.insert(tokens, block_ids, extra_keys=extra)
        self._cached.update(outcome.block_ids.tolist())
        return outcome

    def _block_ids(self, kv_indices: torch.Tensor) -> np.ndarray:
        """The page id of each full page of a run of KV indices."""
        return (kv_indices[:: self.page_size] // self.page_size).to("cpu", torch.int64).numpy()

    def _free_blocks(self, block_ids: Any) -> None:
        """Gives pages back to SGLang's allocator."""
        ids = np.asarray(block_ids, dtype=np.int64)
        if len(ids) == 0 or self.token_to_kv_pool_allocator is None:
            return
        # Whole pages from slot 0 of each: the allocator's fixed-shape free
        # (no dedup of the token slots), as SGLang's own radix cache frees.
        self.token_to_kv_pool_allocator.free_segment(
            self.path_device_indices(PrefixNode(tuple(ids.tolist()))), start_pos=0
        )

    def _event(self, event: Any) -> Any:
        """One mla_cache event as SGLang's event class."""
        if isinstance(event, BlockStored):
            extra_key = event.adapter
            return SglBlockStored(
                block_hashes=list(event.block_hashes),
                parent_block_hash=event.parent_block_hash,
                token_ids=list(event.token_ids),
                block_size=event.block_size,
                lora_id=None,
                medium="GPU",
                lora_name=self.lora_names.get(extra_key) if extra_key else None,
            )
        if isinstance(event, BlockRemoved):
            return SglBlockRemoved(block_hashes=list(event.block_hashes), medium="GPU")
        if isinstance(event, AllBlocksCleared):
            return SglAllBlocksCleared()
        raise TypeError(f"unknown cache event {event!r}")


def _factory(ctx: Any) -> RadixCache:
    """SGLang's registry calls this to build the cache (a ``TreeCacheBuildContext``)."""
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        raise ValueError("mla_cache's SGLang backend serves full-attention (MLA) models only")
    if ctx.enable_hierarchical_cache:
        raise ValueError("mla_cache's SGLang backend does not support --enable-hierarchical-cache")
    return RadixCache(ctx.params)


def register() -> None:
    """Registers the backend under :data:`BACKEND_NAME` in SGLang's
    registry (``--radix-cache-backend mla_cache``) and mla_cache's eviction
    policies as ``--radix-eviction-policy`` choices. Idempotent; SGLang's
    plug-in loader calls it through the ``sglang.srt.plugins`` entry point."""
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )
    from sglang.srt.mem_cache.registry import (
        get_radix_cache_factory,
        register_radix_cache_backend,
    )

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, _factory)
    add_radix_eviction_policy_choices(
        [p for p in EVICTION_POLICIES if p not in RADIX_EVICTION_POLICY_CHOICES]
    )
