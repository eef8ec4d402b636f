from ._native import (
    EVICTION_POLICIES as EVICTION_POLICIES,
    Admission as Admission,
    AllBlocksCleared as AllBlocksCleared,
    AppendOutcome as AppendOutcome,
    BlockManager as BlockManager,
    BlockRemoved as BlockRemoved,
    BlockStored as BlockStored,
    CacheConfig as CacheConfig,
    CacheEvent as CacheEvent,
    ChunkTransfers as ChunkTransfers,
    ExtraKeys as ExtraKeys,
    Insertion as Insertion,
    LatentStore as LatentStore,
    LayerBuffer as LayerBuffer,
    MultiModalKey as MultiModalKey,
    OutOfBlocks as OutOfBlocks,
    PinBudgetExceeded as PinBudgetExceeded,
    PrefixCache as PrefixCache,
    PrefixMatch as PrefixMatch,
    StorageError as StorageError,
    TierHits as TierHits,
    TieredAdmission as TieredAdmission,
    TieredCache as TieredCache,
)

__version__: str
__all__: list[str]
