"""vLLM v1's ``KVCacheManager`` (vLLM 0.33 and 0.34), backed by mla_cache.

:class:`KVCacheManager` takes the keywords vLLM's ``Scheduler`` constructs its
own manager with and has every method and attribute the scheduler, its
async (deferred-free) path, spec decode, the KV connectors and the stats code
read, for one MLA KV cache group (``MLAAttentionSpec``, or
``FullAttentionSpec`` with one KV head). vLLM builds it through
:mod:`mla_cache.vllm_scheduler` (``--scheduler-cls``), with no change to
vLLM; what differs between the vLLM versions is detected, not configured.

It reads of vLLM's ``Request`` only what vLLM's manager reads
(``request_id``, ``all_token_ids``, ``num_tokens``, ``num_computed_tokens``,
``block_hashes``, ``status``, ``lora_request``, ``num_preemptions``, and the
hit bound: 0.34's ``prefix_cache_hit_limit`` or 0.33's
``skip_reading_prefix_cache``), and imports vLLM only to hand back vLLM's
own results (``KVCacheBlocks``), event and stats objects when vLLM is
installed. Without vLLM, :meth:`KVCacheManager.from_config` builds one from a
:class:`~mla_cache.CacheConfig`. The scheduling rules themselves (block need,
watermark, reserved blocks, full-sequence fit, hit bounds, commit points,
the null-block shift) are the Rust crate's ``vllm_rules``.

vLLM's semantics, kept:

- **Null block.** ``num_blocks`` counts vLLM's null block 0, never handed
  out (the worker pads with it); the block manager holds the other
  ``num_blocks - 1`` and its ids are shifted by one.
- **Caching timing.** A request's full blocks become shareable (``commit``)
  up to ``min(tokens, len(request.block_hashes) * hash_block_size)`` (less
  multi-module MTP's re-prefill tail, ``num_prefill_lookahead - 1``): the
  tokens vLLM has hashed, whichever call brought them (``allocate_slots``
  or ``cache_blocks``), so hash-lookahead (EAGLE/MTP) blocks wait for their
  lookahead tokens as in vLLM. A decode step that needs no new block is a
  counter check.
- **vLLM's digests are the keys.** Blocks are looked up, admitted and
  committed by ``request.block_hashes`` (``BlockManager.match_block_hashes``,
  ``admit``/``commit`` with ``block_hashes=``): the adapter never hashes
  tokens, LoRA, salt and media are in vLLM's digests, and events carry vLLM's
  own external hashes. Nothing past the blocks vLLM has hashed is cached or
  found (with vLLM's hasher off, nothing is, as in vLLM). Token ids reach the
  block manager only when events, which carry them, are on.
- **Deferred frees.** ``pop_blocks_for_free`` detaches a request and returns
  its blocks; they stay allocated until the scheduler passes them to
  ``block_pool.free_blocks``, once no in-flight step can write them.
- **Admission gates.** ``watermark``, ``reserved_blocks`` and
  ``full_sequence_must_fit`` only check that blocks fit, as vLLM does.
- **Hit bounds.** A request's hit never reaches its last token, nor past
  its own limit (vLLM 0.34's ``prefix_cache_hit_limit``: 0 when it skips the
  cache, its first scored token when it asks for prompt logprobs), nor the
  caller's ``max_cache_hit_length``.
- **Stats.** Prefix-cache stats are recorded only while caching is on and the
  request reads the cache.

Differences: two physical blocks are never cached under one hash (vLLM keeps
both).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ._native import BlockManager, CacheConfig, ExtraKeys, KVCacheBlock, VllmManagerBase
from . import kv_events

__all__ = [
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheManager",
    "PrefixCacheStats",
    "UnsupportedLayout",
]

_MLA_SPECS = ("MLAAttentionSpec", "FullAttentionSpec")
"""vLLM KV cache spec classes whose one-head form is MLA's latent cache."""


class UnsupportedLayout(ValueError):
    """The KV cache config has a layout MLA does not have."""


@dataclass(slots=True)
class KVCacheBlocks:
    """Blocks of a request, per KV cache group (one for MLA): the interface
    between the scheduler and the manager, as in vLLM."""

    blocks: Tuple[Sequence[KVCacheBlock], ...]
    """``blocks[group][i]``: the ``i``-th block of a group."""

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        """Concatenates two results group by group."""
        return KVCacheBlocks(
            tuple(list(itertools.chain(a, b)) for a, b in zip(self.blocks, other.blocks))
        )

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Optional[Sequence[int]] = None
    ) -> Optional[Tuple[List[int], ...]]:
        """Block ids per group (the groups in ``group_ids``, or all); ``None``
        when ``allow_none`` and every selected group is empty."""
        groups = self.blocks if group_ids is None else tuple(self.blocks[g] for g in group_ids)
        if allow_none and not any(groups):
            return None
        if len(groups) == 1:
            return ([b.block_id for b in groups[0]],)
        return tuple([b.block_id for b in g] for g in groups)

    def get_unhashed_block_ids(self) -> List[int]:
        """Ids of the blocks not (yet) cached, of the one group."""
        if len(self.blocks) != 1:
            raise ValueError("only one KV cache group is supported")
        return self.get_unhashed_block_ids_all_groups()[0]

    def get_unhashed_block_ids_all_groups(self) -> List[List[int]]:
        """Ids of the blocks not (yet) cached, per group, null blocks left out."""
        return [
            [b.block_id for b in g if b.block_hash_num_tokens is None and b.block_id != 0]
            for g in self.blocks
        ]

    def new_empty(self) -> "KVCacheBlocks":
        """A result with the same groups and no blocks."""
        return KVCacheBlocks(tuple(() for _ in self.blocks))


@dataclass
class PrefixCacheStats:
    """Prefix cache hits since the last ``make_prefix_cache_stats``, with the
    fields of vLLM's ``PrefixCacheStats`` (token counts). Used when vLLM is
    not installed; with vLLM, its own class is returned."""

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
    hits_by_source: Dict[Any, int] = field(default_factory=dict)
    """Hits split by cache tier (connector stats only; empty here)."""

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


def _blocks_class() -> type:
    """vLLM's ``KVCacheBlocks`` when vLLM is installed (the scheduler and the
    KV connectors get vLLM's own results), else ours."""
    try:
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks as VllmBlocks
    except ImportError:
        return KVCacheBlocks
    return VllmBlocks


def _waiting_statuses() -> Tuple[Any, ...]:
    """vLLM's ``RequestStatus.WAITING`` and ``PREEMPTED`` (the statuses its
    watermark applies to) when vLLM is installed; without vLLM no request
    has them."""
    try:
        from vllm.v1.request import RequestStatus
    except ImportError:
        return ()
    return (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def _request_hit_limits() -> bool:
    """Whether vLLM's requests carry a prefix-cache hit limit
    (``prefix_cache_hit_limit``, vLLM 0.34) rather than vLLM 0.33's
    ``skip_reading_prefix_cache``; without vLLM, whether requests may."""
    try:
        from vllm.v1.request import Request
    except ImportError:
        return False
    return hasattr(Request, "get_max_cache_hit_length")


def _stats_class() -> type:
    """vLLM's ``PrefixCacheStats`` when vLLM is installed, else ours."""
    try:
        from vllm.v1.metrics.stats import PrefixCacheStats as VllmStats
    except ImportError:
        return PrefixCacheStats
    return VllmStats


class _PoppedBlocks(List[KVCacheBlock]):
    """The blocks ``pop_blocks_for_free`` returns: still allocated under
    ``key`` until they come back to ``block_pool.free_blocks`` (as they are,
    or through ``reversed``)."""

    def __init__(self, key: int, blocks: List[KVCacheBlock]) -> None:
        super().__init__(blocks)
        self.key = key

    def __reversed__(self) -> Iterator[KVCacheBlock]:
        return _ReversedPopped(self)

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        if isinstance(index, slice):
            return _PoppedBlocks(self.key, item)
        return item


class _ReversedPopped(Iterator[KVCacheBlock]):
    """``reversed`` of popped blocks, still naming their allocation."""

    def __init__(self, popped: _PoppedBlocks) -> None:
        self.popped = popped
        self._it = list.__reversed__(popped)

    def __next__(self) -> KVCacheBlock:
        return next(self._it)


def check_layout(kv_cache_config: Any) -> Any:
    """The one KV cache group's spec of a vLLM ``KVCacheConfig`` if it is
    MLA's layout; raises :class:`UnsupportedLayout` naming it otherwise."""
    groups = list(kv_cache_config.kv_cache_groups)
    if len(groups) != 1:
        names = ", ".join(type(g.kv_cache_spec).__name__ for g in groups)
        raise UnsupportedLayout(
            f"mla_cache serves one MLA KV cache group; got {len(groups)} groups ({names})"
        )
    spec = groups[0].kv_cache_spec
    name = type(spec).__name__
    if name not in _MLA_SPECS:
        raise UnsupportedLayout(f"mla_cache serves MLA's latent cache; got a {name} group")
    heads = getattr(spec, "num_kv_heads", 1)
    if heads != 1:
        raise UnsupportedLayout(f"mla_cache serves MLA's latent cache; got {name} with {heads} KV heads")
    for attr in ("sliding_window", "attention_chunk_size"):
        if getattr(spec, attr, None) is not None:
            raise UnsupportedLayout(f"mla_cache serves full attention; got {name} with {attr}")
    return spec


class _RequestBlocks(Mapping):
    """vLLM's ``req_to_blocks``, read only: each admitted request's block
    table (a tuple of block objects) by request id."""

    def __init__(self, owner: "KVCacheManager") -> None:
        self._owner = owner

    def __getitem__(self, request_id: str) -> Tuple[KVCacheBlock, ...]:
        return tuple(self._owner._requests[request_id].blocks)

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner._requests)

    def __len__(self) -> int:
        return len(self._owner._requests)


class _GroupView:
    """The face of vLLM's per-group manager that the scheduler, connectors
    and tests read (``coordinator.single_type_managers[0]``)."""

    def __init__(self, owner: "KVCacheManager", spec: Any) -> None:
        self.kv_cache_spec = spec
        """The group's vLLM spec."""
        self.block_size = owner.block_size
        """Tokens per block."""
        self.block_pool = owner.block_pool
        """The pool the group allocates from."""
        self.req_to_blocks = _RequestBlocks(owner)
        """Each admitted request's blocks, read only."""
        self.kv_cache_group_id = 0
        """The group's index."""
        self.retains_longer_hit = False
        """Full attention keeps exactly the hit it uses."""
        self.records_new_block_ids = False
        """MLA's uniform-precision cache needs no zeroing of new blocks."""


class _Coordinator:
    """The members of vLLM's KV cache coordinator the scheduler reads."""

    def __init__(self, owner: "KVCacheManager", spec: Any) -> None:
        self._owner = owner
        self.single_type_managers = (_GroupView(owner, spec),)
        """One view per group (one here)."""
        self.enable_partial_hash_hits = False
        """Hits are whole blocks."""
        self.eagle_group_ids: frozenset = frozenset({0}) if owner.use_eagle else frozenset()
        """Groups that drop their last hit block for EAGLE."""
        self.num_reprefillable_tokens = owner.num_reprefillable_tokens
        """Tokens at a request's computed end that multi-module MTP may
        prefill again (never cached)."""
        self.block_pool = owner.block_pool
        """The pool."""

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[Any] = (), **_: Any
    ) -> int:
        """Blocks a request needs beyond those it holds to have ``num_tokens``
        slots (hit blocks counted as held)."""
        return self._owner._blocks_to_allocate(request_id, num_tokens, new_computed_blocks)


class _FreeBlockQueue:
    """What vLLM's tests and connectors read of its ``FreeKVCacheBlockQueue``:
    the count of free blocks (the queue's order lives in the block manager)."""

    def __init__(self, owner: "KVCacheManager") -> None:
        self._owner = owner

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds, the null block left out."""
        return self._owner._manager.num_free_blocks


class BlockPool:
    """The members of vLLM's ``BlockPool`` the scheduler and the bundled KV
    connectors read: counts, usage, events, and the deferred free."""

    def __init__(self, owner: "KVCacheManager") -> None:
        self._owner = owner
        self.num_gpu_blocks: int = owner.num_blocks
        """Blocks, vLLM's null block 0 included."""
        self.enable_caching: bool = owner.enable_caching
        """Whether blocks are shared by prefix."""
        self.null_block: KVCacheBlock = owner._block_objs[0]
        """vLLM's null block (never handed out)."""
        self.blocks: List[KVCacheBlock] = owner._block_objs
        """Every block object, by id."""
        self.hash_block_size: int = owner.hash_block_size
        """Tokens per hash of ``request.block_hashes``."""
        self.free_block_queue = _FreeBlockQueue(owner)
        """The count vLLM's free block queue keeps (``num_free_blocks``)."""

    def get_num_free_blocks(self) -> int:
        """Blocks that allocation can take (free, cached or not)."""
        return self._owner._manager.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of blocks (the null block left out) in use."""
        return self._owner._manager.usage

    def free_blocks(self, blocks: Iterable[KVCacheBlock], evict_first: bool = False) -> None:
        """Returns blocks ``pop_blocks_for_free`` handed out (as they are or
        reversed; they go back tail first either way). Raises ``ValueError``
        (nothing changes) for blocks from anywhere else, and for
        ``evict_first`` (vLLM 0.34's order for a connector's own GPU blocks:
        the block manager's policy orders evictions, and no connector that
        frees its own blocks runs on this pool)."""
        if evict_first:
            raise ValueError("free_blocks(evict_first=True) is not supported: the eviction policy orders evictions")
        key = getattr(blocks, "key", None)
        if key is None and isinstance(blocks, _ReversedPopped):
            key = blocks.popped.key
        if key is None:
            if not list(blocks):
                return
            raise ValueError("free_blocks takes the blocks pop_blocks_for_free returned")
        self._owner._release(key)

    def take_events(self) -> list:
        """The manager's events (see ``KVCacheManager.take_events``)."""
        return self._owner.take_events()

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drops blocks from the prefix cache (``KVCacheManager.evict_blocks``)."""
        self._owner.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Drops every cached block (``KVCacheManager.reset_prefix_cache``)."""
        return self._owner._reset()


def _lora_key(lora: Any) -> str:
    """The manager's adapter key: the name, and the path when there is one,
    so re-pointing a name at other weights does not reuse their KV."""
    path = getattr(lora, "lora_path", None)
    return lora.lora_name if not path else f"{lora.lora_name}\x00{path}"


class KVCacheManager(VllmManagerBase):
    """vLLM v1's ``KVCacheManager`` over an mla_cache ``BlockManager``.

    Takes the scheduler's own constructor keywords. ``kv_cache_config`` is
    vLLM's ``KVCacheConfig`` (one MLA group, else :class:`UnsupportedLayout`);
    ``cache_config`` (an mla_cache extension) sets the model's latent shape
    (default: the ``deepseek-v3`` preset), its block count and block size
    coming from vLLM's config. Parallel decode/prefill context
    (``dcp_world_size``/``pcp_world_size`` > 1) and a ``hash_block_size``
    other than the block size are refused with ``ValueError``.

    The calls the scheduler makes every step (the whole ``allocate_slots``:
    a waiting or preempted request's admission with its prefix hit, a
    running request's counter check, growth, commit; ``get_computed_blocks``,
    ``get_blocks``, ``get_block_ids``, ``free``, ``cache_blocks``,
    ``take_events``, ``make_prefix_cache_stats``,
    ``record_prefix_cache_stats``, ``usage``, the per-step
    hand-offs) are the native base class's (``VllmManagerBase``): no Python
    frame of the adapter's. Like vLLM's own manager, it is driven from the
    scheduler's thread.
    """

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: Optional[int] = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        *,
        cache_config: Optional[CacheConfig] = None,
    ) -> None:
        spec = check_layout(kv_cache_config)
        block_size = getattr(spec, "block_size", scheduler_block_size)
        if scheduler_block_size != block_size or hash_block_size != block_size:
            raise ValueError(
                f"block sizes differ (spec {block_size}, scheduler {scheduler_block_size}, "
                f"hash {hash_block_size}); mla_cache needs one block size"
            )
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ValueError("decode/prefill context parallelism is not supported")
        if watermark < 0.0:
            raise ValueError("watermark must be non-negative")
        num_blocks = int(kv_cache_config.num_blocks)
        if num_blocks < 2:
            raise ValueError("num_blocks must count the null block and at least one more")
        if cache_config is None:
            # vLLM's own order by default: its users expect vLLM's decisions.
            cache_config = CacheConfig.preset("deepseek-v3", num_blocks=num_blocks - 1, eviction="lru")
        if cache_config.verify_tokens:
            raise ValueError("the adapter keys blocks by vLLM's block hashes: verify_tokens is not supported")
        # Blocks are keyed by vLLM's digests (request.block_hashes), which the
        # block manager takes under an engine kind: sha256_cbor's 32 bytes
        # (vLLM's sha256 and sha256_cbor), or xxhash_cbor's 16 (vLLM's xxhash
        # and xxhash_cbor, when the given config names it).
        kind = cache_config.block_hash if cache_config.block_hash != "xxh3" else "sha256_cbor"
        config = cache_config.replace(
            num_blocks=num_blocks - 1,
            block_size=block_size,
            enable_prefix_caching=enable_caching,
            enable_events=enable_kv_cache_events,
            block_hash=kind,
        )
        self._manager = BlockManager(config)
        self.kv_cache_config = kv_cache_config
        """vLLM's config the manager was built from."""
        self.num_blocks: int = num_blocks
        """Blocks, vLLM's null block included."""
        self.block_size: int = block_size
        """Tokens per block."""
        self.hash_block_size: int = hash_block_size
        """Tokens per entry of ``request.block_hashes``."""
        self.max_model_len: int = max_model_len
        """Most slots a request may hold."""
        self.enable_caching: bool = enable_caching
        """Whether blocks are shared by prefix."""
        self.enable_kv_cache_events: bool = enable_kv_cache_events
        """Whether ``take_events`` reports events."""
        self.use_eagle: bool = use_eagle
        """Whether a hit drops its last block (EAGLE recomputes it)."""
        self.num_reprefillable_tokens: int = max(0, num_prefill_lookahead - 1)
        """The last computed tokens multi-module MTP may prefill again: they
        are not cached until later tokens follow, as in vLLM."""
        self.log_stats: bool = log_stats
        """Whether prefix cache stats are kept."""
        self.metrics_collector = metrics_collector
        """vLLM's block residency metrics (not fed: blocks live in Rust)."""
        self.num_kv_cache_groups: int = 1
        """KV cache groups (MLA's one latent cache)."""
        self.watermark_blocks: int = int(watermark * num_blocks)
        """Blocks kept free when admitting waiting or preempted requests."""
        self.mamba_shared_prefix_checkpoint: bool = False
        """No Mamba groups."""
        self.retained_hit_group_ids: Tuple[int, ...] = ()
        """No group keeps a longer hit than it uses."""
        self._stats_cls = _stats_class()
        self._blocks_cls = _blocks_class()
        """The class of the results (vLLM's `KVCacheBlocks` when installed)."""
        self.prefix_cache_stats = self._stats_cls() if log_stats else None
        """Stats of the current period (``None`` without ``log_stats``)."""
        self._block_objs = [KVCacheBlock(b, self._manager) for b in range(num_blocks)]
        self._bind(
            self._manager,
            self._block_objs,
            self._blocks_cls(((),)),
            self._blocks_cls,
            self._stats_cls,
            block_size=block_size,
            max_model_len=max_model_len,
            num_reprefillable_tokens=self.num_reprefillable_tokens,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
            watermark_blocks=self.watermark_blocks,
            waiting_statuses=_waiting_statuses(),
            request_hit_limits=_request_hit_limits(),
        )
        self._pending_free: set = set()
        self._loras: Dict[str, Tuple[str, int]] = {}
        self.block_pool = BlockPool(self)
        """vLLM's block pool face (KV connectors bind to it)."""
        self.coordinator = _Coordinator(self, spec)
        """vLLM's coordinator face (the scheduler reads it)."""

    @classmethod
    def from_config(
        cls,
        config: CacheConfig,
        *,
        max_model_len: Optional[int] = None,
        enable_caching: bool = True,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        use_eagle: bool = False,
    ) -> "KVCacheManager":
        """A manager without vLLM: ``config.num_blocks`` blocks, vLLM's null
        block among them, one MLA group of ``config.block_size``."""
        return cls(
            _StandaloneConfig(config.num_blocks, config.block_size),
            max_model_len=max_model_len if max_model_len is not None else 1 << 40,
            scheduler_block_size=config.block_size,
            hash_block_size=config.block_size,
            enable_caching=enable_caching and config.enable_prefix_caching,
            use_eagle=use_eagle,
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
            cache_config=config,
        )

    @property
    def manager(self) -> BlockManager:
        """The block manager (its ids are vLLM's minus one)."""
        return self._manager

    # ----- lookups -----------------------------------------------------------

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: Optional[int] = None
    ) -> Tuple[KVCacheBlocks, int, int, bool]:
        """``get_computed_blocks`` plus ``hit_diverged`` (never: one group)."""
        return (*self.get_computed_blocks(request, max_cache_hit_length), False)

    def estimate_cached_tokens(self, request: Any) -> int:
        """Tokens of the request in cached (committed) full blocks."""
        tracked = self._requests.get(request.request_id)
        return 0 if tracked is None else tracked.cached_blocks * self.block_size

    # ----- freeing -----------------------------------------------------------

    def pop_blocks_for_free(self, request: Any) -> List[KVCacheBlock]:
        """Detaches the request and returns its blocks in table order, still
        allocated: pass them (or ``reversed`` of them) to
        ``block_pool.free_blocks`` once no in-flight step writes them."""
        tracked = self._requests.pop(request.request_id, None)
        if tracked is None:
            return []
        self._pending_free.add(tracked.key)
        return _PoppedBlocks(tracked.key, tracked.blocks)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: Optional[int] = None
    ) -> None:
        """Nothing: full attention skips no blocks."""

    def finalize_partial_tail_offloads(self, request: Any) -> List[Tuple[int, int, int]]:
        """No Mamba boundary states: always empty."""
        return []

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drops the given blocks (vLLM ids) from the prefix cache, as vLLM
        does when a KV connector reports them unreadable; requests holding
        them keep them. Raises ``ValueError`` (nothing changes) for an id
        outside the cache or the null block."""
        ids = list(block_ids)
        if any(not 0 < b < self.num_blocks for b in ids):
            raise ValueError(f"block ids must be in 1..{self.num_blocks - 1}: {ids}")
        self._manager.evict_blocks([b - 1 for b in ids])
        for b in ids:
            self._block_objs[b].block_hash_num_tokens = None

    def reset_prefix_cache(self) -> bool:
        """Drops every cached block; ``False`` (nothing changes) while any
        block is in use."""
        done = self._reset()
        if done and self.log_stats:
            self.prefix_cache_stats.reset = True
        return done

    # ----- reads -------------------------------------------------------------

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> Tuple[List[int], ...]:
        """The ids of the blocks covering the first ``num_computed_tokens``."""
        (ids,) = self.get_block_ids(request_id)
        return (ids[: -(-num_computed_tokens // self.block_size)],)

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int) -> KVCacheBlocks:
        """The first ``num_computed_tokens`` (block aligned) of a lookup
        result; ``ValueError`` when unaligned or longer than the result."""
        n, rest = divmod(num_computed_tokens, self.block_size)
        if rest or n > len(blocks.blocks[0]):
            raise ValueError(f"cannot truncate {len(blocks.blocks[0])} blocks to {num_computed_tokens} tokens")
        return self._blocks_cls((list(blocks.blocks[0][:n]),)) if n else self.empty_kv_cache_blocks

    def get_num_common_prefix_blocks(self, running_request_id: str) -> List[int]:
        """Always 0 per group (vLLM 0.33 keeps this for out-of-tree
        schedulers; cascade attention was removed)."""
        return [0] * self.num_kv_cache_groups

    # ----- per-step hand-offs ------------------------------------------------

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Nothing: no zeroing (``start_token`` must still be block aligned)."""
        if start_token % self.block_size:
            raise ValueError("start_token must be block aligned")

    # ----- internals ---------------------------------------------------------

    def _take_events(self) -> list:
        """``take_events`` (the native base's) while events are on: the
        block manager's events as vLLM's own ``BlockStored``,
        ``BlockRemoved``, ``AllBlocksCleared`` when vLLM is installed (so its
        publisher sends them), else :mod:`mla_cache.kv_events`."""
        events = kv_events.convert(self._manager.take_events(), self._lora_of)
        return _to_vllm_events(events, self.coordinator.single_type_managers[0].kv_cache_spec)

    def _blocks_to_allocate(self, request_id: str, num_tokens: int, hit: Sequence[Any]) -> int:
        tracked = self._requests.get(request_id)
        held = len(tracked.blocks) if tracked is not None else len(hit)
        return max(-(-num_tokens // self.block_size) - held, 0)

    def _release(self, key: int) -> None:
        """Frees a popped allocation (once)."""
        if key not in self._pending_free:
            raise ValueError("these blocks were already freed")
        self._pending_free.discard(key)
        self._manager.free(key)

    def _reset(self) -> bool:
        done = self._manager.reset_prefix_cache()
        if done:
            for b in self._block_objs:
                b.block_hash_num_tokens = None
        return done

    def _lora_keys(self, request: Any) -> Optional[ExtraKeys]:
        """The request's LoRA adapter as the block manager's key, for the
        events it records (vLLM's digests already cover LoRA, salt and media)."""
        lora = request.lora_request
        if lora is None:
            return None
        adapter = _lora_key(lora)
        self._loras.setdefault(adapter, (lora.lora_name, lora.lora_int_id))
        return ExtraKeys(adapter=adapter)

    def _lora_of(self, adapter: Optional[str]) -> Tuple[Optional[str], Optional[int]]:
        """``(lora_name, lora_id)`` of an adapter key."""
        if adapter is None:
            return None, None
        return self._loras[adapter]


class _StandaloneConfig:
    """The two fields of vLLM's ``KVCacheConfig`` a manager built without
    vLLM needs: a block count and one MLA group."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.kv_cache_groups = [_StandaloneGroup(MLAAttentionSpec(block_size))]


@dataclass
class MLAAttentionSpec:
    """Stands for vLLM's ``MLAAttentionSpec`` when vLLM is not installed."""

    block_size: int
    """Tokens per block."""
    num_kv_heads: int = 1
    """One latent per token."""


@dataclass
class _StandaloneGroup:
    kv_cache_spec: MLAAttentionSpec


def _to_vllm_events(events: List[kv_events.KVCacheEvent], spec: Any) -> list:
    """The events as vLLM's own ``vllm.distributed.kv_events`` objects when
    vLLM is installed (its publisher encodes only those), else unchanged."""
    if not events:
        return events
    try:
        from vllm.distributed import kv_events as vk
    except ImportError:
        return events
    kind = "mla_attention" if type(spec).__name__ == "MLAAttentionSpec" else "full_attention"
    out: list = []
    for e in events:
        if isinstance(e, kv_events.BlockStored):
            out.append(
                vk.BlockStored(
                    block_hashes=list(e.block_hashes),
                    parent_block_hash=e.parent_block_hash,
                    token_ids=list(e.token_ids),
                    block_size=e.block_size,
                    lora_id=e.lora_id,
                    medium=e.medium,
                    lora_name=e.lora_name,
                    group_idx=0,
                    kv_cache_spec_kind=kind,
                )
            )
        elif isinstance(e, kv_events.BlockRemoved):
            out.append(vk.BlockRemoved(block_hashes=list(e.block_hashes), medium=e.medium, group_idx=0))
        else:
            out.append(vk.AllBlocksCleared())
    return out
