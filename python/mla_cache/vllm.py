"""A drop-in for vLLM v1's ``KVCacheManager`` (vLLM 0.33), backed by mla_cache.

:class:`KVCacheManager` has the methods vLLM's scheduler calls on its own
manager and takes vLLM's ``Request`` objects, reading only what vLLM's manager
reads: ``request_id``, ``all_token_ids``, ``num_tokens``,
``num_computed_tokens``, ``lora_request``, ``cache_salt``, ``mm_features``
(and ``num_preemptions`` for stats, ``skip_reading_prefix_cache`` when
present). It returns :class:`KVCacheBlocks`, which the scheduler uses like
vLLM's (``get_block_ids()``, ``blocks``, ``+``). Neither vLLM nor torch is
imported.

How the calls map onto the block manager (one KV cache group, full attention):

- ``get_computed_blocks`` is ``BlockManager.match_prefix`` of the first
  ``num_tokens - 1`` tokens: no references are taken, as in vLLM.
- The first ``allocate_slots`` of a request admits it: ``admit`` with the
  prompt up to just past the hit (so the manager reuses exactly the blocks
  the scheduler accepted), reserving every slot the step needs, then
  ``append`` of the rest of the step's tokens into that reserved room. Later
  calls ``reserve`` the step's slots (lookahead and draft tokens included,
  all or nothing), then ``append`` the tokens it adds (a chunk, a decoded
  token) into that room.
  Requests are admitted with ``chunked_prefill``: ``commit`` makes blocks
  shareable when the step computing them is scheduled, which is when vLLM
  caches them (``cache_blocks``, or at once unless ``delay_cache_blocks``).
- ``free`` is ``BlockManager.free``: tail first, blocks stay cached.
- ``evict_blocks`` is ``BlockManager.evict_blocks``: the blocks leave the
  prefix index; requests holding them keep them.

Differences from vLLM's manager: two physical blocks are never cached under
one hash (vLLM keeps both and announces both); the free queue is LRU with
never-cached blocks reused first and finished requests freed tail first;
block hashes are mla_cache's, computed in Rust (``request.block_hashes`` is
not read); every call is thread-safe. Slots reserved for lookahead or
draft tokens stay with the request until it is freed (as in vLLM, where
they stay in its block list).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from itertools import chain
from typing import Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

from ._native import BlockManager, CacheConfig, ExtraKeys, MultiModalKey, OutOfBlocks
from .kv_events import KVCacheEvent, convert

__all__ = [
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheManager",
    "PrefixCacheStats",
    "RequestLike",
]


class LoRARequestLike(Protocol):
    """The attributes of vLLM's ``LoRARequest`` the manager reads."""

    lora_name: str
    lora_int_id: int
    lora_path: str


class PlaceholderRangeLike(Protocol):
    """Where a multimodal input's placeholder tokens sit in the prompt."""

    offset: int
    length: int


class MultiModalFeatureLike(Protocol):
    """The attributes of vLLM's ``MultiModalFeatureSpec`` the manager reads."""

    identifier: str
    mm_position: PlaceholderRangeLike


class RequestLike(Protocol):
    """The attributes of vLLM's ``Request`` the manager reads."""

    request_id: str
    all_token_ids: Sequence[int]
    num_tokens: int
    num_computed_tokens: int
    lora_request: Optional[LoRARequestLike]
    cache_salt: Optional[str]
    mm_features: Sequence[MultiModalFeatureLike]


class PreemptionCountLike(Protocol):
    """A request that knows how often it was preempted (for stats)."""

    num_tokens: int
    num_preemptions: int


class KVCacheBlock:
    """One block of the cache, as the scheduler sees it: its ``block_id``.
    The manager keeps one object per block id."""

    __slots__ = ("block_id",)

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id

    @property
    def is_null(self) -> bool:
        """Always ``False``: MLA's full attention needs no null block."""
        return False

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id})"


@dataclass
class KVCacheBlocks:
    """Blocks allocated to a request, per KV cache group (one for MLA): the
    interface between the scheduler and the manager, as in vLLM."""

    blocks: Tuple[Sequence[KVCacheBlock], ...]
    """``blocks[group][i]``: the ``i``-th block of a group."""

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        """Concatenates two results group by group."""
        return KVCacheBlocks(tuple(list(chain(a, b)) for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Optional[Sequence[int]] = None
    ) -> Optional[Tuple[List[int], ...]]:
        """Block ids per group (the groups in ``group_ids``, or all); ``None``
        when ``allow_none`` and every selected group is empty."""
        groups = self.blocks if group_ids is None else tuple(self.blocks[g] for g in group_ids)
        if allow_none and all(len(g) == 0 for g in groups):
            return None
        return tuple([b.block_id for b in g] for g in groups)

    def new_empty(self) -> "KVCacheBlocks":
        """A result with the same groups and no blocks."""
        return KVCacheBlocks(tuple(() for _ in self.blocks))


@dataclass
class PrefixCacheStats:
    """Prefix cache hits since the last ``make_prefix_cache_stats``, with the
    fields of vLLM's ``PrefixCacheStats`` (token counts)."""

    reset: bool = False
    """Whether ``reset_prefix_cache`` succeeded in the period."""
    requests: int = 0
    """Requests admitted for the first time."""
    queries: int = 0
    """Their tokens."""
    hits: int = 0
    """Their tokens found in the cache."""
    preempted_requests: int = 0
    """Requests admitted again after a preemption."""
    preempted_queries: int = 0
    """Their tokens."""
    preempted_hits: int = 0
    """Their tokens found in the cache."""

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Counts one admission."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


@dataclass
class _Tracked:
    """What the adapter remembers of an admitted request."""

    num_tokens: int
    """Tokens given to the manager (their slots are allocated)."""
    committed: int
    """Tokens committed as computed (full blocks among them are shareable)."""
    num_blocks: int
    """Length of the block table."""


def _lora_key(lora: LoRARequestLike) -> str:
    """The manager's adapter key: the name, and the path when there is one,
    so re-pointing a name at other weights does not reuse their KV."""
    path = getattr(lora, "lora_path", None)
    return lora.lora_name if not path else f"{lora.lora_name}\x00{path}"


class KVCacheManager:
    """vLLM v1's ``KVCacheManager`` interface over an mla_cache ``BlockManager``.

    ``config`` sets the cache (``num_blocks`` is what vLLM calls
    ``num_gpu_blocks``, ``block_size`` its block size); ``enable_caching``
    and ``enable_kv_cache_events`` override the config's prefix caching and
    events. ``max_model_len`` caps the slots of a request. With
    ``log_stats``, admissions recorded with ``record_prefix_cache_stats`` are
    returned by ``make_prefix_cache_stats``.
    """

    def __init__(
        self,
        config: CacheConfig,
        *,
        max_model_len: Optional[int] = None,
        enable_caching: bool = True,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
    ) -> None:
        config = config.replace(
            enable_prefix_caching=config.enable_prefix_caching and enable_caching,
            enable_events=enable_kv_cache_events,
        )
        self._manager = BlockManager(config)
        self.block_size: int = config.block_size
        """Tokens per block."""
        self.max_model_len: Optional[int] = max_model_len
        """Most slots a request may hold (``None``: no cap)."""
        self.enable_caching: bool = config.enable_prefix_caching
        """Whether blocks are shared by prefix."""
        self.enable_kv_cache_events: bool = enable_kv_cache_events
        """Whether ``take_events`` reports events."""
        self.log_stats: bool = log_stats
        """Whether prefix cache stats are kept."""
        self.num_kv_cache_groups: int = 1
        """KV cache groups (MLA's one latent cache)."""
        self.empty_kv_cache_blocks: KVCacheBlocks = KVCacheBlocks(((),))
        """The result with no blocks (shared, immutable)."""
        self.prefix_cache_stats: Optional[PrefixCacheStats] = (
            PrefixCacheStats() if log_stats else None
        )
        """Stats of the current period (``None`` without ``log_stats``)."""
        self._blocks = [KVCacheBlock(b) for b in range(config.num_blocks)]
        self._requests: Dict[str, _Tracked] = {}
        self._loras: Dict[str, Tuple[str, int]] = {}
        self._lock = threading.Lock()

    @property
    def manager(self) -> BlockManager:
        """The block manager (for slot mappings and a ``LatentStore``)."""
        return self._manager

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, ``0.0 ..= 1.0``."""
        return self._manager.usage

    def make_prefix_cache_stats(self) -> Optional[PrefixCacheStats]:
        """The stats since the last call, starting a new period; ``None``
        without ``log_stats``."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def record_prefix_cache_stats(self, request: PreemptionCountLike, num_hits: int) -> None:
        """Counts an admission that found ``num_hits`` tokens cached (the
        scheduler calls this once it admits a request)."""
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(
                request.num_tokens, num_hits, request.num_preemptions > 0
            )

    def get_computed_blocks(
        self, request: RequestLike, max_cache_hit_length: Optional[int] = None
    ) -> Tuple[KVCacheBlocks, int, int]:
        """The cached full blocks of the longest cached prefix of the request,
        at most ``max_cache_hit_length`` tokens and never more than
        ``num_tokens - 1`` (the last token is recomputed for its logits, and
        admission passes the manager one token past the hit): ``(blocks,
        num_computed_tokens, 0)``. Takes no references: pass the blocks to
        ``allocate_slots`` before anything else allocates. The third value is
        vLLM's shared-prefix boundary of sparse groups, always 0 here."""
        if not self.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
            return self.empty_kv_cache_blocks, 0, 0
        limit = request.num_tokens - 1
        if max_cache_hit_length is not None:
            limit = min(limit, max_cache_hit_length)
        if limit < self.block_size:
            return self.empty_kv_cache_blocks, 0, 0
        found = self._manager.match_prefix(
            request.all_token_ids[:limit], extra_keys=self._extra_keys(request)
        )
        if found.num_tokens == 0:
            return self.empty_kv_cache_blocks, 0, 0
        return self._wrap(found.block_ids.tolist()), found.num_tokens, 0

    def allocate_slots(
        self,
        request: RequestLike,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Optional[KVCacheBlocks] = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        *,
        decode_slots: int = 0,
    ) -> Optional[KVCacheBlocks]:
        """Allocates slots for ``num_new_tokens`` tokens to compute (and
        ``num_lookahead_tokens`` speculative ones) after the request's
        computed tokens, its new prefix hit (``num_new_computed_tokens``
        tokens in ``new_computed_blocks``, from ``get_computed_blocks``) and
        ``num_external_computed_tokens`` loaded by a KV connector. Returns the
        newly allocated blocks, or ``None`` (nothing changed) when they do not
        fit now.

        The first call admits the request, all or nothing; with
        ``full_sequence_must_fit`` it reserves room for all ``num_tokens``
        tokens, so later chunks never wait, and ``decode_slots`` (an
        mla_cache extension) reserves that many more for generated tokens.
        Then the blocks covering the request's known tokens become shareable
        unless ``delay_cache_blocks`` (``cache_blocks`` does it later).

        Slots past the request's known tokens (``num_lookahead_tokens``,
        draft tokens scheduled for verification) are reserved without tokens
        (``BlockManager.reserve``); the blocks stay with the request, and
        later tokens fill them first.

        Raises ``ValueError`` for a request that can never fit or for
        arguments vLLM also rejects, and ``RuntimeError`` if the hit was
        evicted since ``get_computed_blocks``.
        """
        if num_new_tokens == 0 and num_new_computed_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be positive when no computed tokens are adopted")
        if num_encoder_tokens:
            raise ValueError("encoder-decoder models are not supported (MLA models are decoder-only)")
        total_computed = (
            request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        )
        slots = total_computed + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            total_computed = min(total_computed, self.max_model_len)
            slots = min(slots, self.max_model_len)
        known = min(total_computed + num_new_tokens, request.num_tokens)
        with self._lock:
            tracked = self._requests.get(request.request_id)
            if tracked is None:
                if full_sequence_must_fit:
                    whole = request.num_tokens
                    if self.max_model_len is not None:
                        whole = min(whole, self.max_model_len)
                    slots = max(slots, whole)
                new_ids = self._admit(
                    request, num_new_computed_tokens, new_computed_blocks, known, slots + decode_slots
                )
            elif num_new_computed_tokens:
                raise ValueError("a running request takes no new prefix hits")
            else:
                new_ids = self._grow(request, tracked, known, slots)
            if new_ids is None:
                return None
            if not delay_cache_blocks:
                self._commit(request.request_id, known)
        return self._wrap(new_ids)

    def free(self, request: RequestLike) -> None:
        """Frees the request's blocks, tail first, so the deepest blocks of a
        prefix go before its root; full blocks stay cached until evicted.
        A request holding no blocks is ignored."""
        with self._lock:
            if self._requests.pop(request.request_id, None) is not None:
                self._manager.free(request.request_id)

    def cache_blocks(self, request: RequestLike, num_computed_tokens: int) -> None:
        """Makes the full blocks among the request's first
        ``num_computed_tokens`` tokens shareable (after a delayed KV load)."""
        if self.enable_caching:
            with self._lock:
                self._commit(request.request_id, num_computed_tokens)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks (empty for an unknown request)."""
        with self._lock:
            if request_id not in self._requests:
                return self.empty_kv_cache_blocks
            table = self._manager.block_table(request_id).tolist()
        return self._wrap(table)

    def get_block_ids(self, request_id: str) -> Tuple[List[int], ...]:
        """The request's block ids, per group."""
        ids = self.get_blocks(request_id).get_block_ids()
        assert ids is not None
        return ids

    def get_num_common_prefix_blocks(self, running_request_id: str) -> List[int]:
        """Blocks common to all running requests, per group: always 0, as in
        vLLM 0.33 (cascade attention was removed)."""
        return [0] * self.num_kv_cache_groups

    def reset_prefix_cache(self) -> bool:
        """Drops every cached block; ``False`` (nothing changes) while any
        block is in use."""
        with self._lock:
            done = self._manager.reset_prefix_cache()
        if done and self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return done

    def take_events(self) -> List[KVCacheEvent]:
        """Events since the last call, oldest first (empty unless
        ``enable_kv_cache_events``): ``BlockStored``, ``BlockRemoved``,
        ``AllBlocksCleared`` with vLLM's fields."""
        return convert(self._manager.take_events(), self._lora_of)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drops the given blocks from the prefix cache, as vLLM does when a
        KV connector reports them unreadable: no later request hits them. A
        free one is reused before any cached block; one that requests hold
        stays theirs (the scheduler fails or recomputes those requests), and
        is freed as uncached. Blocks not cached are skipped. Raises
        ``ValueError`` (nothing changes) for an id outside the cache, where
        vLLM asserts, or for a block pinned through ``manager.pin``."""
        with self._lock:
            self._manager.evict_blocks(block_ids)

    def _extra_keys(self, request: RequestLike) -> Optional[ExtraKeys]:
        """The keys beyond token ids that decide sharing: LoRA, salt, media."""
        lora = request.lora_request
        adapter = None
        if lora is not None:
            adapter = _lora_key(lora)
            self._loras.setdefault(adapter, (lora.lora_name, lora.lora_int_id))
        mm = [
            MultiModalKey(f.identifier, f.mm_position.offset, f.mm_position.length)
            for f in request.mm_features or ()
        ]
        if adapter is None and not request.cache_salt and not mm:
            return None
        return ExtraKeys(adapter=adapter, salt=request.cache_salt or None, mm=mm)

    def _lora_of(self, adapter: Optional[str]) -> Tuple[Optional[str], Optional[int]]:
        """``(lora_name, lora_id)`` of an adapter key."""
        if adapter is None:
            return None, None
        name, lora_id = self._loras[adapter]
        return name, lora_id

    def _admit(
        self,
        request: RequestLike,
        hit: int,
        hit_blocks: Optional[KVCacheBlocks],
        known: int,
        slots: int,
    ) -> Optional[List[int]]:
        """Admits a request with exactly the hit the scheduler accepted and
        ``slots`` slots; returns its fresh blocks, or ``None`` if they do not
        fit. The prompt goes in up to one token past the hit, so the manager
        reuses no more than the hit; the rest fills the reserved room."""
        bs = self.block_size
        expected = [] if hit_blocks is None else hit_blocks.blocks[0]
        if hit % bs or len(expected) * bs != hit:
            raise ValueError(f"a hit of {hit} tokens does not match {len(expected)} blocks")
        head = hit + 1
        # Adopting a hit with nothing to compute still admits one token past it.
        known = max(known, head)
        tokens = request.all_token_ids
        rid = request.request_id
        try:
            admission = self._manager.admit(
                rid,
                tokens[:head],
                decode_slots=max(slots, known) - head,
                extra_keys=self._extra_keys(request),
                chunked_prefill=True,
            )
        except OutOfBlocks:
            return None
        table: List[int] = admission.block_ids.tolist()
        n = hit // bs
        if admission.num_cached_tokens != hit or table[:n] != [b.block_id for b in expected]:
            self._manager.free(rid)
            raise RuntimeError(
                f"request {rid}: the prefix hit changed since get_computed_blocks"
            )
        if known > head:
            self._manager.append(rid, tokens[head:known])
        self._requests[rid] = _Tracked(num_tokens=known, committed=hit, num_blocks=len(table))
        return table[n:]

    def _grow(
        self, request: RequestLike, tracked: _Tracked, known: int, slots: int
    ) -> Optional[List[int]]:
        """Reserves a running request's ``slots`` (all or nothing), then
        appends its new known tokens into that room; returns its new blocks,
        or ``None`` (nothing changed) if they do not fit."""
        rid = request.request_id
        new_ids: List[int] = []
        if -(-max(slots, known) // self.block_size) > tracked.num_blocks:
            try:
                reserved = self._manager.reserve(rid, max(slots, known))
            except OutOfBlocks:
                return None
            new_ids = reserved.new_block_ids.tolist()
        if known > tracked.num_tokens:
            # Fills reserved room: takes no block (and copies none: no forks here).
            self._manager.append(rid, request.all_token_ids[tracked.num_tokens : known])
            tracked.num_tokens = known
        tracked.num_blocks += len(new_ids)
        return new_ids

    def _commit(self, request_id: str, num_computed_tokens: int) -> None:
        """Commits up to ``num_computed_tokens`` of the request's known tokens."""
        tracked = self._requests.get(request_id)
        if tracked is None:
            return
        upto = min(num_computed_tokens, tracked.num_tokens)
        # Only full blocks become shareable: a commit inside a block changes nothing.
        if upto // self.block_size > tracked.committed // self.block_size:
            self._manager.commit(request_id, upto)
            tracked.committed = upto

    def _wrap(self, block_ids: List[int]) -> KVCacheBlocks:
        """Block ids as a ``KVCacheBlocks`` of the shared block objects."""
        if not block_ids:
            return self.empty_kv_cache_blocks
        blocks = self._blocks
        return KVCacheBlocks(([blocks[b] for b in block_ids],))
