"""Type stubs of the native part of ``mla_cache`` (import ``mla_cache`` instead)."""

from typing import Any, Iterable, Literal, Mapping, Optional, Sequence, Tuple, Union, final

from typing_extensions import disjoint_base

import numpy as np
import numpy.typing as npt

RequestId = Union[int, str]
"""A request id: an ``int`` in ``0 .. 2**63`` or a ``str``."""

TokenIds = Union[Sequence[int], npt.NDArray[np.integer[Any]], memoryview, int]
"""Token ids: a list, tuple, 1-D numpy array of any integer dtype or object
exporting a 1-D integer buffer (``array.array``, ``memoryview(b).cast("I")``)
(values in ``0 .. 2**32``); ``append`` also takes one int."""

MultiModalKeyLike = Union["MultiModalKey", Tuple[Union[str, bytes], int, int]]
"""A ``MultiModalKey`` or a ``(hash, offset, length)`` tuple."""

ExtraKeysLike = Union["ExtraKeys", Mapping[str, Any], None]
"""An ``ExtraKeys``, a dict with some of ``"adapter"``, ``"salt"``, ``"mm"``, or ``None``."""

RawTensor = Tuple[int, Sequence[int], Any]
"""A C-contiguous tensor in the store's memory space: ``(data_ptr, shape, dtype)``,
``dtype`` a name (``"bfloat16"``, ``"float32"``, ``"int64"``, ...), a numpy dtype or
a torch dtype."""

TensorLike = Union[npt.NDArray[Any], RawTensor, Any]
"""A numpy array, any object with ``__dlpack__`` (torch, cupy, ...), or a raw tuple."""

IntVectorLike = Union[Sequence[int], npt.NDArray[np.integer[Any]], RawTensor, Any]
"""Integers: a list, tuple, numpy array, DLPack tensor or raw tuple (a GPU store
takes only device tensors and raw tuples)."""

DtypeName = Literal["bf16", "fp8_ds_mla", "mxfp6", "nvfp4_ds_mla"]

EVICTION_POLICIES: tuple[str, ...]
"""Every eviction policy's name, in the registry's order (the default first)."""

class OutOfBlocks(MemoryError):
    """Not enough free blocks right now; nothing was allocated. Free or finish
    requests and retry."""

class PinBudgetExceeded(RuntimeError):
    """Pinning would exceed the pinned-block budget (``CacheConfig.pin_budget``)."""

class StorageError(RuntimeError):
    """A storage backend failed or is unavailable (no GPU, no driver, ...)."""

@final
class CacheConfig:
    """Everything the block manager and the stores need to know: geometry,
    storage format and cache policy. Immutable; ``replace(**changes)`` returns
    a changed copy. Raises ``ValueError`` for a configuration that cannot work."""

    def __new__(
        cls,
        num_blocks: int = 1024,
        *,
        block_size: int = 64,
        num_layers: int = 1,
        kv_lora_rank: int = 512,
        rope_dim: int = 64,
        dtype: str = "bf16",
        enable_prefix_caching: bool = True,
        eviction: str = "arc",
        hash_seed: Optional[int] = None,
        verify_tokens: bool = False,
        pin_budget_blocks: Optional[int] = None,
        enable_events: bool = False,
        cap_hit_at_last_token: bool = True,
        max_pending_events: int = 100000,
        block_hash: str = "xxh3",
        indexer_head_dim: Optional[int] = None,
    ) -> "CacheConfig": ...
    @classmethod
    def preset(
        cls, model: str, num_blocks: int = 1024, dtype: str = "bf16", **overrides: Any
    ) -> "CacheConfig":
        """A config for a model preset (``deepseek-v2``, ``deepseek-v2-lite``,
        ``deepseek-v3``, ``deepseek-r1``, ``deepseek-v3.2``, ``kimi-k2``);
        ``overrides`` set any other field."""
    @staticmethod
    def presets() -> list[str]:
        """Names of the model presets."""
    def replace(self, **changes: Any) -> "CacheConfig":
        """A copy with the given fields changed (validated like the constructor)."""
    def to_dict(self) -> dict[str, Any]:
        """Every field as a dict (the constructor's keyword arguments)."""
    @property
    def num_blocks(self) -> int:
        """Physical blocks in the cache (shared by all layers)."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def num_layers(self) -> int:
        """Layers cached per token."""
    @property
    def kv_lora_rank(self) -> int:
        """Width of the compressed latent ``c_kv``."""
    @property
    def rope_dim(self) -> int:
        """Width of the decoupled RoPE key."""
    @property
    def dtype(self) -> DtypeName:
        """Storage format name."""
    @property
    def indexer_head_dim(self) -> Optional[int]:
        """Width of the indexer keys cached beside the latent (``None``: no indexer)."""
    @property
    def enable_prefix_caching(self) -> bool:
        """Whether full blocks are shared between requests by prefix hash."""
    @property
    def eviction(self) -> str:
        """Eviction policy name, one of ``EVICTION_POLICIES``: ``"arc"`` (the default) or ``"lru"``."""
    @property
    def hash_seed(self) -> Optional[int]:
        """Seed of the block hash chain (``None``: random per manager)."""
    @property
    def block_hash(self) -> str:
        """How block hashes are computed (``xxh3``, ``sha256_cbor``, ``xxhash_cbor``)."""
    @property
    def verify_tokens(self) -> bool:
        """Whether token ids are compared on every prefix hit."""
    @property
    def pin_budget_blocks(self) -> Optional[int]:
        """The pinned-block budget as set (``None``: half the cache)."""
    @property
    def enable_events(self) -> bool:
        """Whether events are recorded for ``take_events``."""
    @property
    def max_pending_events(self) -> int:
        """Most events waiting for ``take_events`` before new ones are dropped."""
    @property
    def cap_hit_at_last_token(self) -> bool:
        """Whether an admission's hit is capped at ``len - 1`` tokens."""
    @property
    def pin_budget(self) -> int:
        """The pinned-block budget in effect."""
    @property
    def elements_per_token(self) -> int:
        """Elements cached per token and layer (``kv_lora_rank + rope_dim``)."""
    @property
    def latent_bytes_per_token_per_layer(self) -> int:
        """Bytes one token's latent takes in one layer."""
    @property
    def indexer_bytes_per_token_per_layer(self) -> int:
        """Bytes one token's indexer key takes in one layer (0 without one)."""
    @property
    def bytes_per_token_per_layer(self) -> int:
        """Bytes one token takes in one layer (latent and indexer key)."""
    @property
    def bytes_per_token(self) -> int:
        """Bytes one token takes over all layers."""
    @property
    def bytes_per_block_per_layer(self) -> int:
        """Bytes one block takes in one layer."""
    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes over all layers."""
    @property
    def total_bytes(self) -> int:
        """Bytes the whole cache takes over all layers."""
    @property
    def num_tokens(self) -> int:
        """Tokens the cache can hold."""
    def blocks_for_bytes(self, n: int) -> int:
        """How many blocks (all layers) fit in ``n`` bytes."""

@final
class MultiModalKey:
    """A multimodal input whose placeholder tokens occupy ``offset .. offset +
    length`` of the prompt; its content ``hash`` enters the hash of every block
    those tokens overlap."""

    def __new__(cls, hash: Union[str, bytes], offset: int, length: int) -> "MultiModalKey": ...
    @property
    def hash(self) -> str:
        """Content hash of the input (bytes are stored hex-encoded)."""
    @property
    def offset(self) -> int:
        """First placeholder token."""
    @property
    def length(self) -> int:
        """Number of placeholder tokens."""

@final
class ExtraKeys:
    """Keys beyond the token ids that decide whether two blocks may be shared:
    ``adapter`` (enters every block), ``salt`` (tenant isolation: enters the
    first block and so every later one), ``mm`` (multimodal inputs)."""

    def __new__(
        cls,
        *,
        adapter: Optional[str] = None,
        salt: Optional[str] = None,
        mm: Optional[Iterable[MultiModalKeyLike]] = None,
        adapter_path: Optional[str] = None,
    ) -> "ExtraKeys": ...
    @property
    def adapter_path(self) -> Optional[str]:
        """The adapter's path (vLLM's LoRA key), or ``None``."""
    @property
    def adapter(self) -> Optional[str]:
        """The adapter name, or ``None``."""
    @property
    def salt(self) -> Optional[str]:
        """The cache salt, or ``None``."""
    @property
    def mm(self) -> Tuple[MultiModalKey, ...]:
        """The multimodal inputs."""

@final
class Admission:
    """The outcome of ``BlockManager.admit``."""

    @property
    def block_ids(self) -> npt.NDArray[np.int32]:
        """The request's block table, reserved room included."""
    @property
    def num_cached_tokens(self) -> int:
        """Leading prompt tokens whose KV is already cached."""

@final
class PrefixMatch:
    """The outcome of ``BlockManager.match_prefix`` and ``PrefixCache.match_prefix``."""

    @property
    def block_ids(self) -> npt.NDArray[np.int32]:
        """Cached blocks of the longest cached prefix."""
    @property
    def num_tokens(self) -> int:
        """Tokens those blocks cover."""

@final
class AppendOutcome:
    """The outcome of ``BlockManager.append`` and ``BlockManager.reserve``."""

    @property
    def new_block_ids(self) -> npt.NDArray[np.int32]:
        """Blocks added to the end of the request's table."""
    @property
    def copies(self) -> list[Tuple[int, int]]:
        """``(src, dst)`` block copies to perform before writing the new tokens."""

@disjoint_base
class CacheEvent:
    """Base class of every event from ``BlockManager.take_events`` and
    ``TieredCache.take_events``."""

    @property
    def medium(self) -> Optional[str]:
        """Where the blocks live (vLLM's ``medium``: ``"GPU"``, ``"CPU"``, a
        remote tier's name) for a tiered cache's events; ``None`` for a
        manager's (a publisher then uses its own)."""

@final
class BlockStored(CacheEvent):
    """Consecutive blocks of one hash chain entered the prefix index."""

    @property
    def block_hashes(self) -> list[int]:
        """External hashes of the stored blocks, in chain order (64-bit ints:
        the low 64 bits of the 128-bit chain hash)."""
    @property
    def parent_block_hash(self) -> Optional[int]:
        """External hash of the block before the first one; ``None`` for a
        chain's root."""
    @property
    def token_ids(self) -> list[int]:
        """The blocks' token ids, ``block_size`` per block."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def adapter(self) -> Optional[str]:
        """Adapter the blocks were computed with (vLLM's ``lora_name``)."""

@final
class BlockRemoved(CacheEvent):
    """Blocks left the prefix index (evicted to make room)."""

    @property
    def block_hashes(self) -> list[int]:
        """External hashes of the removed blocks (64-bit ints)."""

@final
class AllBlocksCleared(CacheEvent):
    """The whole prefix cache was reset."""

@final
class EventPublisher:
    """Publishes KV events over ZeroMQ in vLLM's wire format (multipart
    ``[topic, 8-byte big-endian seq, msgpack KVEventBatch]``), with vLLM's
    replay socket; the arguments are vLLM's ``KVEventsConfig`` fields plus
    batching. ``publish`` never blocks: a full queue drops and counts."""

    def __new__(
        cls,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: Optional[str] = None,
        buffer_steps: int = 10000,
        hwm: int = 100000,
        max_queue_size: int = 100000,
        topic: str = "",
        data_parallel_rank: int = 0,
        max_batch_events: int = 1024,
        max_batch_delay_s: float = 0.005,
        medium: str = "GPU",
    ) -> "EventPublisher": ...
    @property
    def endpoint(self) -> str:
        """The PUB endpoint in use (with the port the OS chose for port 0)."""
    @property
    def replay_endpoint(self) -> Optional[str]:
        """The replay (ROUTER) endpoint in use, or ``None``."""
    def publish(self, events: Sequence[CacheEvent], medium: Optional[str] = None) -> int:
        """Queues the events of ``take_events`` (oldest first), each with
        ``medium`` if given, else its own (a tiered cache's events), else the
        publisher's; returns how many were accepted: all, or none when the
        queue is full (they are counted as dropped)."""
    def flush(self, timeout_s: float = 5.0) -> bool:
        """Sends the queued events now; waits at most ``timeout_s`` seconds for
        them to go out and returns whether they did."""
    def stats(self) -> dict[str, int]:
        """Counters: ``events_accepted``, ``events_dropped``,
        ``events_published``, ``batches_published``, ``replays_served``."""
    def shutdown(self) -> None:
        """Sends what is queued, closes the sockets and stops the publishing
        thread; later ``publish`` calls drop their events."""

@final
class BlockManager:
    """A paged MLA cache's bookkeeping: block allocation, prefix sharing by
    chained block hashes, copy-on-write for forked requests, pinning and LRU
    eviction. Thread-safe; a failing call raises and changes nothing."""

    def __new__(cls, config: CacheConfig) -> "BlockManager": ...
    @property
    def config(self) -> CacheConfig:
        """The configuration."""
    def admit(
        self,
        request_id: RequestId,
        tokens: TokenIds,
        *,
        decode_slots: int = 0,
        extra_keys: ExtraKeysLike = None,
        salt: Optional[str] = None,
        chunked_prefill: bool = False,
        block_hashes: Optional[Iterable[bytes]] = None,
    ) -> Admission:
        """Admits a request with its prompt, reusing the longest cached prefix
        (capped at ``len(tokens) - 1``) and reserving ``decode_slots`` more slots.
        All or nothing: raises ``OutOfBlocks`` (fits later) or ``ValueError``
        (never fits, or already admitted). ``block_hashes``: the engine's
        digests of the full blocks (vLLM's ``request.block_hashes``), used
        instead of hashing the tokens (``block_hash`` ``sha256_cbor`` or
        ``xxhash_cbor`` only). A contiguous ``int32``/``uint32``/``int64``
        numpy prompt is read in place, without the GIL from 1,024 tokens: no
        other thread may write to it during the call."""
    def match_prefix(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> PrefixMatch:
        """The longest cached prefix of ``tokens``, without taking references."""
    def ref_count(self, block_id: int) -> int:
        """How many requests hold the block (0 when free)."""
    def match_block_hashes(self, block_hashes: Iterable[bytes]) -> PrefixMatch:
        """The longest cached prefix named by the engine's block digests."""
    def append(self, request_id: RequestId, tokens: TokenIds) -> AppendOutcome:
        """Appends generated tokens; returns new blocks and copy-on-write copies."""
    def commit(
        self, request_id: RequestId, num_computed_tokens: int, *, block_hashes: Optional[Iterable[bytes]] = None
    ) -> None:
        """Reports chunked-prefill progress; full computed blocks become shareable
        (those of a request admitted with ``block_hashes`` under the digests
        given here, one per block this call makes full)."""
    def fork(self, parent: RequestId, child: RequestId) -> None:
        """Creates ``child`` sharing every block of ``parent`` that holds tokens."""
    def free(self, request_id: RequestId) -> None:
        """Frees a request, tail first; its full blocks stay cached until evicted."""
    def block_table(self, request_id: RequestId) -> npt.NDArray[np.int32]:
        """The request's block table, reserved room included."""
    def slot_mapping(self, request_id: RequestId, start: int, end: int) -> npt.NDArray[np.int64]:
        """Slot numbers (``block_id * block_size + offset``) of positions ``start .. end``."""
    def num_tokens(self, request_id: RequestId) -> int:
        """Tokens (prompt and appended) of a request."""
    def reserve(self, request_id: RequestId, total_slots: int) -> AppendOutcome:
        """Grows the table to room for ``total_slots`` positions without tokens
        (lookahead slots); never shrinks; returns new blocks and copy-on-write copies."""
    def num_computed_tokens(self, request_id: RequestId) -> int:
        """Tokens of a request whose KV is written."""
    def capacity(self, request_id: RequestId) -> int:
        """Tokens a request can take before it needs a new block."""
    def would_admit(
        self,
        tokens: TokenIds,
        *,
        decode_slots: int = 0,
        extra_keys: ExtraKeysLike = None,
        salt: Optional[str] = None,
        chunked_prefill: bool = False,
    ) -> dict[str, Union[int, bool]]:
        """A dry run of ``admit``: ``num_cached_tokens``, ``new_blocks``,
        ``available_blocks`` and ``fits``, changing nothing."""
    def append_batch(
        self,
        request_ids: Sequence[RequestId],
        tokens: TokenIds,
        *,
        num_tokens: Optional[Sequence[int]] = None,
    ) -> Tuple[list[AppendOutcome], npt.NDArray[np.int64]]:
        """Appends ``num_tokens[i]`` tokens (default one) to each request under
        one lock, all or nothing; returns the outcomes and the new tokens' slots."""
    def fill_block_tables(
        self,
        request_ids: Sequence[RequestId],
        block_tables: npt.NDArray[np.int32],
        *,
        pad: int = ...,
        positions: Optional[Sequence[Tuple[int, int]]] = None,
        slot_mapping: Optional[npt.NDArray[np.int64]] = None,
    ) -> Tuple[int, int]:
        """Writes the block tables, padded with ``pad`` (default -1), and the
        slots of ``positions`` in place under one lock; returns
        ``(max_blocks, num_slots)``."""
    def free_batch(self, request_ids: Sequence[RequestId]) -> None:
        """Frees every request under one lock, all or nothing."""
    def evict_blocks(self, block_ids: Iterable[int]) -> int:
        """Drops the given blocks from the prefix index; returns how many left it."""
    def evict(self, num_blocks: int) -> int:
        """Evicts up to ``num_blocks`` free cached blocks, as allocation would; returns how many."""
    def pin(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> int:
        """Pins the cached full blocks of a prefix; returns the tokens pinned."""
    def unpin(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> int:
        """Releases the pin lying deepest on a prefix (exactly the blocks its ``pin`` took); returns the tokens unpinned."""
    def stats(self) -> dict[str, Union[int, float]]:
        """A snapshot of gauges and counters."""
    def block_hashes(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> list[int]:
        """External (64-bit) hashes of the full blocks of ``tokens``, as events carry them."""
    def take_events(self) -> list[CacheEvent]:
        """Events recorded since the last call, oldest first."""
    def reset_prefix_cache(self) -> bool:
        """Drops every cached block; ``False`` (no change) while blocks are in use."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds."""
    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
    def _check_invariants(self) -> None:
        """Checks every bookkeeping invariant (for tests); raises ``AssertionError``."""

BlockIds = Union[Iterable[int], npt.NDArray[np.integer[Any]]]
"""Block ids: any iterable of ints or a numpy array of any integer dtype."""

@final
class Insertion:
    """The outcome of ``PrefixCache.insert``."""

    @property
    def num_cached_blocks(self) -> int:
        """Leading full blocks that were cached before the call."""
    @property
    def duplicate_block_ids(self) -> npt.NDArray[np.int32]:
        """The caller's ids whose block was already cached under another id: free them."""
    @property
    def block_ids(self) -> npt.NDArray[np.int32]:
        """The id now cached for each full block."""

@final
class PrefixCache:
    """A prefix cache over block ids the caller allocates and frees (SGLang's
    model): ``insert`` indexes full blocks and reports duplicates to free,
    ``match_prefix`` finds the cached prefix, ``lock`` protects blocks,
    ``evict`` hands back unlocked blocks to free by the eviction policy.
    Thread-safe; a failing call raises and changes nothing."""

    def __new__(cls, config: CacheConfig) -> "PrefixCache": ...
    @property
    def config(self) -> CacheConfig:
        """The configuration."""
    def insert(
        self,
        tokens: TokenIds,
        block_ids: BlockIds,
        *,
        extra_keys: ExtraKeysLike = None,
        salt: Optional[str] = None,
    ) -> Insertion:
        """Indexes the full blocks of ``tokens`` held in ``block_ids`` (one per
        block; a partial tail's id is ignored); cached blocks keep their ids and
        the caller's duplicates are returned to free. ``ValueError`` for too
        few ids, an id given twice, outside the cache or cached under another hash."""
    def match_prefix(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> PrefixMatch:
        """The longest cached prefix of ``tokens``; the path counts as just used."""
    def lock(self, block_ids: BlockIds) -> None:
        """Locks blocks (SGLang's ``inc_lock_ref``): never evicted while locked."""
    def unlock(self, block_ids: BlockIds) -> None:
        """Releases one lock per block; ``ValueError`` for more unlocks than locks."""
    def evict(self, num_blocks: int) -> npt.NDArray[np.int32]:
        """Evicts up to ``num_blocks`` unlocked cached blocks (under LRU, children
        before parents); returns their ids for the caller to free."""
    @property
    def evictable_blocks(self) -> int:
        """Cached blocks nobody locks (SGLang's ``evictable_size``, in blocks)."""
    @property
    def protected_blocks(self) -> int:
        """Cached blocks held by a lock or a pin (SGLang's ``protected_size``, in blocks)."""
    def reset(self) -> npt.NDArray[np.int32]:
        """Drops every cached block; returns their ids to free. ``RuntimeError``
        while any block is locked or pinned."""
    def pin(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> int:
        """Pins the cached full blocks of a prefix; returns the tokens pinned."""
    def unpin(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> int:
        """Releases the pin lying deepest on a prefix; returns the tokens unpinned."""
    def block_hashes(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> list[int]:
        """External (64-bit) hashes of the full blocks of ``tokens``, as events carry them."""
    def stats(self) -> dict[str, Union[int, float]]:
        """Gauges and counters named as ``BlockManager.stats``; ``free_blocks``,
        ``used_blocks``, ``num_requests`` and ``cow_copies`` are 0."""
    def take_events(self) -> list[CacheEvent]:
        """Events recorded since the last call, oldest first."""
    def _check_invariants(self) -> None:
        """Checks every bookkeeping invariant (for tests); raises ``AssertionError``."""

@final
class LayerBuffer:
    """The memory of one layer of a ``LatentStore`` (``uint8``, ``[num_blocks,
    block_size, bytes_per_token]``), exported through DLPack; keeps the store alive."""

    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule (unversioned ``"dltensor"``) of the layer."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)``: 1 = CPU, 2 = CUDA."""
    def data_ptr(self) -> int:
        """Address of the layer's first byte."""
    @property
    def shape(self) -> Tuple[int, int, int]:
        """``(num_blocks, block_size, bytes_per_token)``."""
    @property
    def strides(self) -> Tuple[int, int, int]:
        """Strides in bytes."""
    @property
    def dtype(self) -> Literal["uint8"]:
        """Element type of the buffer."""
    @property
    def format(self) -> str:
        """Storage format of the latents in it (a ``DtypeName``), or
        ``"indexer_fp8"`` for a layer's indexer keys."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def layer(self) -> int:
        """The layer index."""
    @property
    def nbytes(self) -> int:
        """Bytes of the layer."""

@final
class LatentStore:
    """The cached latents of every layer on ``device`` (``"cpu"`` or ``"cuda:N"``),
    in the config's storage format. Raises ``StorageError`` when the device is
    unavailable."""

    def __new__(cls, config: CacheConfig, device: str = "cpu", *, huge_pages: bool = False) -> "LatentStore": ...
    @property
    def config(self) -> CacheConfig:
        """The configuration."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    def write(
        self,
        layer: int,
        c_kv: TensorLike,
        k_pe: TensorLike,
        slot_mapping: IntVectorLike,
        *,
        stream: int = 0,
    ) -> None:
        """Quantizes and stores ``c_kv [T, kv_lora_rank]`` and ``k_pe [T, rope_dim]``
        (bfloat16, float16 or float32) at ``slot_mapping [T]`` (int64; negative: skip)."""
    def gather(
        self,
        layer: int,
        block_table: IntVectorLike,
        num_tokens: int,
        *,
        dtype: Optional[Literal["float32", "bfloat16"]] = None,
        out: Optional[TensorLike] = None,
        stream: int = 0,
    ) -> Any:
        """Decodes the first ``num_tokens`` tokens of a sequence into
        ``[num_tokens, kv_lora_rank + rope_dim]`` values (into ``out`` if given)."""
    def copy_blocks(
        self, pairs: Union[Iterable[Tuple[int, int]], npt.NDArray[np.integer[Any]]], *, stream: int = 0
    ) -> None:
        """Copies whole blocks ``src -> dst`` in every layer."""
    def write_indexer(
        self,
        layer: int,
        keys: TensorLike,
        slot_mapping: IntVectorLike,
        *,
        stream: int = 0,
    ) -> None:
        """Quantizes and stores indexer keys ``[T, head_dim]`` (bfloat16, float16
        or float32) at ``slot_mapping [T]`` (int64; negative: skip)."""
    def gather_indexer(
        self,
        layer: int,
        block_table: IntVectorLike,
        num_tokens: int,
        *,
        dtype: Optional[Literal["float32", "bfloat16"]] = None,
        out: Optional[TensorLike] = None,
        stream: int = 0,
    ) -> Any:
        """Dequantizes the indexer keys of the first ``num_tokens`` tokens of a
        sequence into ``[num_tokens, head_dim]`` values (into ``out`` if given)."""
    def gather_indexer_quantized(
        self, layer: int, block_table: IntVectorLike, num_tokens: int
    ) -> Tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """The stored e4m3 codes ``[num_tokens, head_dim]`` and fp32 scales
        ``[num_tokens]`` of the indexer keys (host stores)."""
    def layer_buffer(self, layer: int) -> Union[npt.NDArray[np.uint8], LayerBuffer]:
        """A numpy ``uint8`` view of a layer (host) or a ``LayerBuffer`` (GPU)."""
    def indexer_buffer(self, layer: int) -> Union[npt.NDArray[np.uint8], LayerBuffer]:
        """A numpy ``uint8`` view of a layer's indexer keys (host) or a
        ``LayerBuffer`` (GPU): ``[num_blocks, block_size, head_dim + 4]``."""
    def indexer_view(self, layer: int) -> LayerBuffer:
        """A ``LayerBuffer`` of a layer's indexer keys, on any device."""
    def layer_view(self, layer: int) -> LayerBuffer:
        """A ``LayerBuffer`` of a layer, on any device."""
    def data_ptr(self, layer: int) -> int:
        """Address of the first byte of a layer."""

WritePolicyName = str
"""``"write-through"``, ``"write-through-selective:N"`` (N >= 1) or ``"write-back"``."""

@final
class TierHits:
    """Prompt tokens served by each tier: a leading run from the device tier,
    continued from host memory, then from the remote tier."""

    @property
    def device_tokens(self) -> int:
        """Tokens already in the device tier."""
    @property
    def host_tokens(self) -> int:
        """Tokens loaded (for a lookup: loadable) from host memory."""
    @property
    def remote_tokens(self) -> int:
        """Tokens loaded (for a lookup: loadable) from the remote tier."""
    @property
    def total(self) -> int:
        """Tokens served by all tiers together."""

@final
class TieredAdmission:
    """The outcome of ``TieredCache.admit``."""

    @property
    def block_ids(self) -> npt.NDArray[np.int32]:
        """The request's block table, reserved room included."""
    @property
    def num_cached_tokens(self) -> int:
        """Leading prompt tokens whose KV is in the device store now (hits and loads)."""
    @property
    def hits(self) -> TierHits:
        """Where those tokens came from."""

@final
class ChunkTransfers:
    """Loads and stores between mla_cache's remote tier (``remote``: a
    Valkey/Redis URL or ``"cluster:url,url"``) and an engine's host buffer of
    fixed-size chunks (``region``; chunk ``i`` is ``chunk_bytes`` at ``i *
    chunk_stride``). A chunk is ``num_layers`` x ``tokens_per_chunk`` MLA
    latents in ``dtype`` (a storage format, or ``"fp8_e4m3"``); caches share
    chunks under the same ``namespace``. ``probe`` waits at most
    ``lookup_budget_ms``; jobs are queued and reported by ``take_finished``,
    or run and waited for by ``load`` and ``store``."""

    def __new__(
        cls,
        remote: str,
        region: Any,
        *,
        chunk_bytes: int,
        dtype: str,
        num_layers: int,
        tokens_per_chunk: int,
        namespace: str,
        chunk_stride: Optional[int] = None,
        lookup_budget_ms: float = 20.0,
        queue_depth: int = 64,
        name: str = "REMOTE",
    ) -> "ChunkTransfers": ...
    @property
    def num_chunks(self) -> int:
        """Chunks in the region."""
    @property
    def in_flight(self) -> int:
        """Jobs queued or running."""
    def probe(self, keys: Iterable[Union[bytes, str]]) -> Optional[list[bool]]:
        """Whether each key is in the store; ``None`` past the budget or on a failure."""
    def submit_load(
        self, job: int, keys: Iterable[Union[bytes, str]], chunks: Iterable[int]
    ) -> None:
        """Queues a load of ``keys[i]`` into chunk ``chunks[i]``."""
    def submit_store(
        self, job: int, keys: Iterable[Union[bytes, str]], chunks: Iterable[int]
    ) -> None:
        """Queues a store of chunk ``chunks[i]`` as ``keys[i]``."""
    def load(self, keys: Iterable[Union[bytes, str]], chunks: Iterable[int]) -> int:
        """Loads ``keys[i]`` into chunk ``chunks[i]`` and waits; returns the
        leading chunks loaded."""
    def store(self, keys: Iterable[Union[bytes, str]], chunks: Iterable[int]) -> bool:
        """Stores chunk ``chunks[i]`` as ``keys[i]`` and waits; returns whether
        every chunk is in the store."""
    def take_finished(self) -> list[tuple[int, bool, int, int, int, float]]:
        """Finished jobs: ``(job, is_load, done, total, bytes, seconds)``."""
    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Waits until no job is queued or running; returns whether none is."""
    def stats(self) -> dict[str, int]:
        """The remote tier's counters."""
    def close(self) -> None:
        """Finishes the queued jobs, stops the worker and releases ``region``."""

@final
class TieredCache:
    """A block manager and its ``LatentStore`` (the device tier) with a host
    memory tier (``host_mem`` bytes) and a remote Valkey/Redis tier
    (``remote``: ``"redis://host:port/"``, ``"rediss://..."``,
    ``"redis://user:password@host:port/"`` or ``"cluster:url,url"``).
    ``admit`` loads the continuation of the device tier's hit from the lower
    tiers before returning. The remote tier needs ``config.hash_seed`` (the
    same on every node); nodes share blocks under the same ``namespace``.
    Thread-safe; allocate only through this object."""

    def __new__(
        cls,
        config: CacheConfig,
        store: LatentStore,
        *,
        host_mem: int = 0,
        remote: Optional[str] = None,
        write_policy: WritePolicyName = "write-through",
        namespace: str = "default",
        lookup_budget_ms: float = 20.0,
        queue_depth: int = 64,
        stream: int = 0,
        remote_name: str = "REMOTE",
    ) -> "TieredCache": ...
    @property
    def config(self) -> CacheConfig:
        """The configuration."""
    @property
    def store(self) -> LatentStore:
        """The device store."""
    @property
    def write_policy(self) -> str:
        """The write policy's name."""
    def admit(
        self,
        request_id: RequestId,
        tokens: TokenIds,
        *,
        decode_slots: int = 0,
        extra_keys: ExtraKeysLike = None,
        salt: Optional[str] = None,
        chunked_prefill: bool = False,
    ) -> TieredAdmission:
        """Admits like ``BlockManager.admit``, then loads the cached prefix's
        continuation from host memory and the remote tier before returning."""
    def lookup(
        self, tokens: TokenIds, *, extra_keys: ExtraKeysLike = None, salt: Optional[str] = None
    ) -> TierHits:
        """Where the longest cached prefix lies, without admitting or loading."""
    def append(self, request_id: RequestId, tokens: TokenIds) -> AppendOutcome:
        """Appends generated tokens like ``BlockManager.append``."""
    def commit(self, request_id: RequestId, num_computed_tokens: int) -> None:
        """Reports written KV (chunked prefill); written-through blocks go down."""
    def fork(self, parent: RequestId, child: RequestId) -> None:
        """Creates ``child`` sharing the blocks of ``parent``."""
    def free(self, request_id: RequestId) -> None:
        """Frees a request; its full blocks stay cached until evicted."""
    def block_table(self, request_id: RequestId) -> npt.NDArray[np.int32]:
        """The request's block table, reserved room included."""
    def slot_mapping(self, request_id: RequestId, start: int, end: int) -> npt.NDArray[np.int64]:
        """Slot numbers of positions ``start .. end``, for ``LatentStore.write``."""
    def num_tokens(self, request_id: RequestId) -> int:
        """Tokens (prompt and appended) of the request."""
    def take_events(self) -> list[CacheEvent]:
        """Every tier's events since the last call, oldest first, each with its
        ``medium`` (``"GPU"``, ``"CPU"``, the remote tier's name); empty unless
        the config enables events. On a tiered cache, take events here, not
        from ``manager``."""
    def flush_remote(self, timeout_s: float = 10.0) -> bool:
        """Waits until the remote tier ran every queued write; whether it did."""
    def stats(self) -> dict[str, Any]:
        """Counters: ``query_tokens``, ``device_hit_tokens``, ``host_hit_tokens``,
        ``remote_hit_tokens``, ``written_through``, ``written_back``,
        ``copy_errors``; ``host`` and ``remote`` (dicts or ``None``);
        ``manager`` (the device tier's ``BlockManager.stats()`` counters)."""

@final
class TrackedRequest:
    """What the vLLM adapter keeps of an admitted request (made by
    ``VllmManagerBase.allocate_slots`` when it admits one)."""

    @property
    def key(self) -> int:
        """The request's id in the block manager (fresh per admission)."""
    @property
    def blocks(self) -> list[Any]:
        """Its block table (vLLM's block objects)."""
    @property
    def appended(self) -> int:
        """Tokens given to the block manager."""
    @appended.setter
    def appended(self, value: int) -> None: ...
    @property
    def cached_blocks(self) -> int:
        """Full blocks committed (shareable)."""
    @property
    def next_cache(self) -> int:
        """Computed tokens from which one more block may be committed."""
    @property
    def view(self) -> Any:
        """The ``KVCacheBlocks`` over ``blocks``, handed out by ``get_blocks``."""

@final
class KVCacheBlock:
    """One block as vLLM's scheduler sees it (``mla_cache.vllm``'s pool keeps
    one per block id; block 0 is vLLM's null block)."""

    def __new__(cls, block_id: int, manager: Optional[BlockManager] = None) -> "KVCacheBlock": ...
    @property
    def block_id(self) -> int:
        """The block's id."""
    @property
    def block_hash_num_tokens(self) -> Optional[int]:
        """Tokens up to and including this block while it is a cached full
        block of a request; ``None`` otherwise."""
    @block_hash_num_tokens.setter
    def block_hash_num_tokens(self, value: Optional[int]) -> None: ...
    @property
    def digest(self) -> Optional[bytes]:
        """vLLM's digest of the block while it is cached."""
    @digest.setter
    def digest(self, value: Optional[bytes]) -> None: ...
    @property
    def is_null(self) -> bool:
        """Whether this is vLLM's null block (id 0)."""
    @property
    def block_hash(self) -> Optional[bytes]:
        """vLLM's ``BlockHashWithGroupId`` of a cached block (digest and group 0)."""
    @property
    def ref_cnt(self) -> int:
        """Requests holding the block, deferred frees included (0 for the null block)."""

@disjoint_base
class VllmManagerBase:
    """The hot path of ``mla_cache.vllm.KVCacheManager`` (its base class; use
    that class). Driven from the scheduler's thread, as vLLM's own manager."""

    def __new__(cls, *_args: Any, **_kwargs: Any) -> "VllmManagerBase": ...
    def _bind(
        self,
        manager: BlockManager,
        block_objs: list[Any],
        empty: Any,
        blocks_class: Any,
        stats_class: Any,
        *,
        block_size: int,
        max_model_len: int,
        num_reprefillable_tokens: int,
        enable_caching: bool,
        use_eagle: bool,
        log_stats: bool,
        enable_kv_cache_events: bool,
        watermark_blocks: int = 0,
        waiting_statuses: Sequence[Any] = ...,
        request_hit_limits: bool = False,
    ) -> None:
        """Binds the block manager and vLLM's objects; a request whose
        ``status`` is one of ``waiting_statuses`` keeps ``watermark_blocks``
        free when admitted; ``request_hit_limits``: requests carry vLLM
        0.34's ``prefix_cache_hit_limit``. ``ValueError`` (nothing bound) for
        a block size under 2 or fewer than two block objects,
        ``OverflowError`` for a negative watermark."""
    @property
    def _requests(self) -> dict[str, TrackedRequest]:
        """Admitted requests by vLLM request id."""
    @property
    def empty_kv_cache_blocks(self) -> Any:
        """The result with no blocks (shared, immutable)."""
    @property
    def usage(self) -> float:
        """Fraction of blocks in use, ``0.0 ..= 1.0`` (null block left out)."""
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: Any = None,
    ) -> Any:
        """vLLM's ``allocate_slots``: a waiting or preempted request's
        admission with exactly its prefix hit, or a running request's step (a
        counter check until a block fills); ``None`` (nothing changed) when
        the blocks do not fit. ``ValueError`` (nothing changed) for nothing to
        compute, encoder tokens, a new hit for a running request or a hit
        that does not match its blocks; ``RuntimeError`` (nothing changed) if
        the hit was evicted since ``get_computed_blocks``."""
    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Makes the request's hashed full blocks among its first
        ``num_computed_tokens`` tokens shareable."""
    def free(self, request: Any) -> None:
        """Frees the request's blocks at once (an unknown request is ignored)."""
    def get_blocks(self, request_id: Any) -> Any:
        """The request's ``KVCacheBlocks`` (the live table; empty if unknown)."""
    def get_block_ids(self, request_id: Any) -> Tuple[list[int]]:
        """The request's block ids, per group (one)."""
    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        """Whether a prefix lookup runs for the request."""
    def get_computed_blocks(self, request: Any, max_cache_hit_length: Optional[int] = None) -> Tuple[Any, int, int]:
        """The cached full blocks of the request's longest cached prefix
        within its hit limit and ``max_cache_hit_length``:
        ``(blocks, num_computed_tokens, 0)``."""
    def get_num_cached_tokens(self, request: Any) -> int:
        """Tokens of the request's longest cached prefix (vLLM 0.34's probe:
        no references, events or stats)."""
    def new_step_starts(self) -> None:
        """Nothing to do at a step's start."""
    def take_new_block_ids(self) -> list[int]:
        """Always empty (no zeroing)."""
    def take_kv_cache_block_copies(self) -> Tuple[list[Any], list[Any]]:
        """Always ``([], [])``."""
    def take_boundary_state_offloads(self) -> dict[str, list[Tuple[int, int, int]]]:
        """Always empty."""
    def take_events(self) -> list[Any]:
        """Events since the last call (empty unless events are on)."""
    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """Counts an admission's hit in ``prefix_cache_stats``; nothing without
        ``log_stats``, while caching is off or when the request skips the lookup."""
    def make_prefix_cache_stats(self) -> Any:
        """The prefix-cache stats since the last call; ``None`` without ``log_stats``."""
