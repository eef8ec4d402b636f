"""A drop-in for SGLang's ``RadixCache`` (the SGLang 0.5.3 interface), backed by mla_cache.

:class:`RadixCache` has the methods SGLang's scheduler calls on its radix
cache, with ``page_size`` equal to the block size. KV indices are SGLang's
per-token slots, ``block_id * page_size + offset``, as numpy ``int64``
arrays (``torch.from_numpy`` wraps them without a copy).

The block manager owns allocation, so the adapter also hands out the slots
of new tokens (:meth:`RadixCache.alloc_extend`, :meth:`RadixCache.alloc_decode`)
where SGLang asks its token allocator, and :meth:`RadixCache.available_size`
replaces the allocator's. How the calls map:

- ``match_prefix`` is ``BlockManager.match_prefix`` of the page-aligned key:
  whole cached blocks, no references; the node it returns names that prefix.
- ``inc_lock_ref`` / ``dec_lock_ref`` pin and unpin the node's prefix (pins
  hold references, so a locked prefix is never evicted or reused).
- ``alloc_extend`` admits a request with exactly its matched prefix and
  slots for ``fill_ids``, then appends later chunks; ``alloc_decode``
  appends decoded tokens. Requests are admitted with ``chunked_prefill``.
- ``cache_unfinished_req`` commits ``fill_ids`` (their full blocks become
  shareable) and moves the request's lock to the new prefix;
  ``cache_finished_req`` commits the tokens whose KV was computed, frees the
  request tail first and drops its lock.

Differences from SGLang's tree: sharing is by whole blocks (SGLang shares at
``page_size`` granularity too); two blocks never hold one prefix, so a
request keeps its own KV when another computed the same prefix meanwhile
(its ``prefix_indices`` never change under it); eviction takes free cached
blocks least recently freed first and tail first (SGLang: leaves by last
access), and allocation evicts by itself when the never-cached free blocks
run out, so ``evict`` ahead of it is optional; every call is thread-safe.
As in SGLang, ``available_size() + evictable_size()`` is what can be
allocated now.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from ._native import BlockManager, CacheConfig
from .kv_events import KVCacheEvent, convert

__all__ = ["MatchResult", "PrefixNode", "RadixCache", "RadixKey", "ReqLike"]

Indices = npt.NDArray[np.int64]
"""Per-token KV indices (slots)."""


@dataclass(frozen=True)
class RadixKey:
    """A lookup key as SGLang builds it: token ids and a namespace
    (``extra_key``: LoRA id and cache salt) that isolates prefixes."""

    token_ids: Sequence[int]
    """Token ids."""
    extra_key: Optional[str] = None
    """Namespace; keys of different namespaces never share blocks."""


class KeyLike(Protocol):
    """Anything with a key's attributes (SGLang's own ``RadixKey`` too)."""

    token_ids: Sequence[int]
    extra_key: Optional[str]


@dataclass(frozen=True)
class PrefixNode:
    """A cached prefix: what ``match_prefix`` returns as the last node, and
    what the lock calls take. The root is the empty prefix."""

    token_ids: Sequence[int]
    """The prefix's tokens (whole blocks)."""
    extra_key: Optional[str]
    """Its namespace."""
    block_ids: Sequence[int]
    """The blocks holding it when it was matched."""

    def __len__(self) -> int:
        return len(self.token_ids)


class MatchResult(NamedTuple):
    """The outcome of ``match_prefix``, as in SGLang."""

    device_indices: Indices
    """KV indices of the cached prefix."""
    last_device_node: PrefixNode
    """The prefix's node (lock it to keep the prefix)."""
    last_host_node: PrefixNode
    """The same node (no host tier)."""
    host_hit_length: int = 0
    """Always 0 (no host tier)."""


class ReqLike(Protocol):
    """The attributes of SGLang's ``Req`` the cache reads and writes."""

    rid: str
    origin_input_ids: Sequence[int]
    output_ids: Sequence[int]
    fill_ids: Sequence[int]
    prefix_indices: Any
    last_node: PrefixNode
    extra_key: Optional[str]
    req_pool_idx: int


class ReqToTokenPoolLike(Protocol):
    """The part of SGLang's ``ReqToTokenPool`` the cache uses."""

    def free(self, free_index: int) -> None:
        """Releases a request's row."""


@dataclass
class _Tracked:
    """What the adapter remembers of an admitted request."""

    num_tokens: int
    """Tokens given to the manager (their slots are allocated)."""
    committed: int
    """Tokens committed as computed."""


class RadixCache:
    """SGLang's ``RadixCache`` interface over an mla_cache ``BlockManager``.

    ``config`` sets the cache: ``page_size`` is its ``block_size`` and the
    token capacity ``num_blocks * block_size``. Pins back the tree locks, so
    the pin budget is raised to the whole cache. ``req_to_token_pool``, when
    given, has a finished request's row freed as SGLang's cache does.
    ``disable`` turns prefix sharing off (SGLang's ``--disable-radix-cache``).
    """

    def __init__(
        self,
        config: CacheConfig,
        *,
        req_to_token_pool: Optional[ReqToTokenPoolLike] = None,
        disable: bool = False,
        enable_kv_cache_events: bool = False,
    ) -> None:
        config = config.replace(
            enable_prefix_caching=config.enable_prefix_caching and not disable,
            enable_events=enable_kv_cache_events,
            pin_budget_blocks=config.num_blocks,
        )
        self._manager = BlockManager(config)
        self.page_size: int = config.block_size
        """Tokens per page (the block size)."""
        self.disable: bool = not config.enable_prefix_caching
        """Whether prefix sharing is off."""
        self.req_to_token_pool: Optional[ReqToTokenPoolLike] = req_to_token_pool
        """Rows of KV indices per request, freed when a request finishes."""
        self.root_node: PrefixNode = PrefixNode((), None, ())
        """The empty prefix."""
        self._offsets = np.arange(self.page_size, dtype=np.int64)
        self._requests: Dict[str, _Tracked] = {}
        self._lock = threading.Lock()

    @property
    def manager(self) -> BlockManager:
        """The block manager (for a ``LatentStore`` and stats)."""
        return self._manager

    def reset(self) -> None:
        """Drops every cached prefix. Raises ``RuntimeError`` while any
        request or lock holds blocks."""
        with self._lock:
            if not self._manager.reset_prefix_cache():
                raise RuntimeError("cannot reset the cache while blocks are in use")

    def match_prefix(self, key: KeyLike, **kwargs: Any) -> MatchResult:
        """The longest cached prefix of ``key`` in whole pages: its KV
        indices and its node. Takes no references: lock the node
        (``inc_lock_ref``) to keep it."""
        tokens = key.token_ids
        aligned = len(tokens) // self.page_size * self.page_size
        if self.disable or aligned == 0:
            return self._empty_match()
        found = self._manager.match_prefix(tokens[:aligned], salt=key.extra_key)
        if found.num_tokens == 0:
            return self._empty_match()
        blocks = found.block_ids.tolist()
        node = PrefixNode(list(tokens[: found.num_tokens]), key.extra_key, blocks)
        return MatchResult(self._slots(found.block_ids), node, node)

    def insert(self, key: KeyLike, value: Optional[Indices] = None) -> int:
        """Makes the page-aligned ``key`` shareable when ``value`` holds the
        KV indices where a live request computed it: commits that request
        (searched among live requests by its first blocks). Returns how many
        of the key's tokens were cached before. Raises ``ValueError`` when no
        live request holds ``value`` for ``key``: mla_cache shares only KV
        its requests computed."""
        aligned = len(key.token_ids) // self.page_size * self.page_size
        if self.disable or aligned == 0:
            return 0
        tokens = key.token_ids[:aligned]
        if value is None or len(value) < aligned:
            raise ValueError("insert needs the KV indices of every token of the key")
        blocks = [int(i) // self.page_size for i in value[:aligned : self.page_size]]
        with self._lock:
            before = self._manager.match_prefix(tokens, salt=key.extra_key).num_tokens
            for rid, tracked in self._requests.items():
                if tracked.num_tokens < aligned:
                    continue
                if self._manager.block_table(rid)[: len(blocks)].tolist() == blocks:
                    self._commit(rid, tracked, aligned)
                    break
            else:
                raise ValueError("no live request holds these KV indices")
        return before

    def alloc_extend(self, req: ReqLike) -> Indices:
        """KV indices for ``req.fill_ids`` past ``req.prefix_indices``
        (SGLang's ``out_cache_loc`` of an extend). The first call admits the
        request, reusing exactly its matched prefix (``req.last_node``);
        later calls (next chunks, or tokens after a retraction's re-match)
        append. Raises ``OutOfBlocks`` (nothing changed) when they do not
        fit now, ``ValueError`` when they never can, ``RuntimeError`` if the
        matched prefix was evicted since ``match_prefix`` (lock it first)."""
        rid = req.rid
        fill = req.fill_ids
        with self._lock:
            tracked = self._requests.get(rid)
            if tracked is not None:
                return self._extend(rid, tracked, fill)
            hit = len(req.prefix_indices)
            head = hit + 1
            admission = self._manager.admit(
                rid,
                fill[:head],
                decode_slots=max(len(fill), head) - head,
                salt=req.extra_key,
                chunked_prefill=True,
            )
            expected = list(req.last_node.block_ids)
            n = hit // self.page_size
            if admission.num_cached_tokens != hit or admission.block_ids[:n].tolist() != expected:
                self._manager.free(rid)
                raise RuntimeError(f"request {rid}: its matched prefix was evicted; lock it first")
            if len(fill) > head:
                self._manager.append(rid, fill[head:])
            self._requests[rid] = _Tracked(num_tokens=max(len(fill), head), committed=hit)
            return self._manager.slot_mapping(rid, hit, len(fill))

    def alloc_decode(self, req: ReqLike) -> Indices:
        """KV indices for the request's tokens whose KV is not allocated yet
        (``origin_input_ids + output_ids``, the last sampled token in a decode
        step). Raises ``OutOfBlocks`` (nothing changed) when they do not fit."""
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        with self._lock:
            return self._extend(req.rid, self._requests[req.rid], tokens)

    def available_size(self) -> int:
        """Tokens of free pages outside the cache (the allocator's
        ``available_size`` in SGLang). Free cached pages are in
        ``evictable_size()``; allocation takes them too, evicting, so the sum
        of the two can be allocated now."""
        s = self._manager.stats()
        return int(s["free_blocks"] - s["evictable_blocks"]) * self.page_size

    def cache_unfinished_req(self, req: ReqLike, chunked: bool = False) -> None:
        """After a prefill step: commits ``req.fill_ids`` so their full pages
        are shared, sets ``req.prefix_indices`` to their KV indices and moves
        the request's lock to ``req.last_node``, the node of the committed
        pages."""
        rid = req.rid
        fill = req.fill_ids
        with self._lock:
            tracked = self._requests[rid]
            self._commit(rid, tracked, len(fill))
            indices = self._manager.slot_mapping(rid, 0, len(fill))
            aligned = len(fill) // self.page_size * self.page_size
            if self.disable or aligned == 0:
                node = self.root_node
            else:
                table = self._manager.block_table(rid)[: aligned // self.page_size].tolist()
                node = PrefixNode(list(fill[:aligned]), req.extra_key, table)
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.prefix_indices = indices
        req.last_node = node

    def cache_finished_req(self, req: ReqLike) -> None:
        """When a request finishes: commits its computed tokens (all but the
        last sampled one), frees its blocks tail first (full ones stay cached),
        frees its row in ``req_to_token_pool`` and drops its lock."""
        rid = req.rid
        computed = len(req.origin_input_ids) + len(req.output_ids) - 1
        with self._lock:
            self._commit(rid, self._requests.pop(rid), computed)
            self._manager.free(rid)
        if self.req_to_token_pool is not None:
            self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    def retract_req(self, req: ReqLike) -> None:
        """Retracts (preempts) a request: frees its blocks tail first, its
        committed pages staying cached for its re-admission, and drops its
        lock. SGLang's ``ScheduleBatch.release_req`` calls this in place of
        freeing the request's tokens and unlocking its node."""
        with self._lock:
            if self._requests.pop(req.rid, None) is not None:
                self._manager.free(req.rid)
        self.dec_lock_ref(req.last_node)

    def evict(self, num_tokens: int) -> None:
        """Evicts free cached pages until ``num_tokens`` tokens are freed or
        none is left, as SGLang's ``evict``: they leave the cache and move
        from ``evictable_size()`` to ``available_size()``. Least recently
        freed first and tail first; locked pages and pages requests hold are
        never evicted. Allocation evicts by itself, so SGLang's
        ``evict``-then-check-``available_size()`` works, and so does not
        calling this."""
        if num_tokens > 0:
            self._manager.evict(-(-num_tokens // self.page_size))

    def inc_lock_ref(self, node: PrefixNode) -> int:
        """Locks a prefix: its blocks are neither evicted nor reused until
        ``dec_lock_ref``. Returns minus the tokens that stopped being
        evictable. Raises ``RuntimeError`` if the prefix was evicted since
        it was matched."""
        if self.disable or len(node) == 0:
            return 0
        with self._lock:
            before = self._manager.num_free_blocks
            pinned = self._manager.pin(node.token_ids, salt=node.extra_key)
            if pinned != len(node):
                if pinned:
                    self._manager.unpin(node.token_ids, salt=node.extra_key)
                raise RuntimeError("the prefix was evicted since it was matched")
            return (self._manager.num_free_blocks - before) * self.page_size

    def dec_lock_ref(self, node: PrefixNode) -> int:
        """Unlocks a prefix locked by ``inc_lock_ref``; returns the tokens
        that became evictable."""
        if self.disable or len(node) == 0:
            return 0
        with self._lock:
            before = self._manager.num_free_blocks
            self._manager.unpin(node.token_ids, salt=node.extra_key)
            return (self._manager.num_free_blocks - before) * self.page_size

    def evictable_size(self) -> int:
        """Tokens of cached pages that neither a request nor a lock holds:
        what ``evict`` (or allocation) may take, as in SGLang."""
        return int(self._manager.stats()["evictable_blocks"]) * self.page_size

    def protected_size(self) -> int:
        """Tokens of locked pages."""
        return int(self._manager.stats()["pinned_blocks"]) * self.page_size

    def total_size(self) -> int:
        """Tokens of every cached page (in use or free)."""
        return int(self._manager.stats()["cached_blocks"]) * self.page_size

    def take_events(self) -> List[KVCacheEvent]:
        """Events since the last call, oldest first (empty unless
        ``enable_kv_cache_events``): ``BlockStored`` per committed chain,
        ``BlockRemoved`` per eviction, ``AllBlocksCleared`` on reset."""
        return convert(self._manager.take_events(), lambda adapter: (adapter, None))

    def _empty_match(self) -> MatchResult:
        """The match of nothing: no indices, the root node."""
        return MatchResult(np.empty(0, dtype=np.int64), self.root_node, self.root_node)

    def _slots(self, block_ids: npt.NDArray[np.int32]) -> Indices:
        """Every slot of the given blocks, in order."""
        return (block_ids.astype(np.int64)[:, None] * self.page_size + self._offsets).ravel()

    def _extend(self, rid: str, tracked: _Tracked, tokens: Sequence[int]) -> Indices:
        """Appends a request's tokens past those it holds; returns their slots."""
        start = tracked.num_tokens
        if len(tokens) > start:
            self._manager.append(rid, tokens[start:])
            tracked.num_tokens = len(tokens)
        return self._manager.slot_mapping(rid, start, tracked.num_tokens)

    def _commit(self, rid: str, tracked: _Tracked, num_tokens: int) -> None:
        """Commits up to ``num_tokens`` of a request's allocated tokens."""
        upto = min(num_tokens, tracked.num_tokens)
        # Only full pages become shareable: a commit inside a page changes nothing.
        if upto // self.page_size > tracked.committed // self.page_size:
            self._manager.commit(rid, upto)
            tracked.committed = upto
