//! The C ABI's value types that stand for the core's, and every conversion
//! between the two: the one way types reach C.
//!
//! The core's types keep their Rust layout and may grow; the C types here
//! are frozen by the header. A conversion destructures the core value
//! without `..`, so a field added to the core does not compile until it is
//! either exported (a new field, an ABI change) or left out on purpose.
//! Enum values from C arrive as integers and are checked ([`from_c`]): an
//! unknown value is an error, never an invalid Rust enum.

use super::{Failure, FfiResult, MlaBlockId, MlaStatus};
use mla_cache::codec::ElemType;
use mla_cache::publish::PublisherStats;
use mla_cache::tier::remote::RemoteStats;
use mla_cache::tier::{HostTierStats, TierHits, TierStats};
use mla_cache::{AdmitCheck, BlockCopy, BlockHashKind, CacheStats, Dtype, EvictionPolicyKind};

/// Defines `From` both ways between a core enum and its C enum, which have
/// the same variants.
macro_rules! mirror_enum {
    ($core:ident <=> $c:ident { $($variant:ident),+ $(,)? }) => {
        impl From<$core> for $c {
            fn from(v: $core) -> Self {
                match v {
                    $($core::$variant => $c::$variant,)+
                }
            }
        }

        impl From<$c> for $core {
            fn from(v: $c) -> Self {
                match v {
                    $($c::$variant => $core::$variant,)+
                }
            }
        }
    };
}

/// Defines `From<core> for C` between structs whose fields have the same
/// names, every field converted with `Into`.
macro_rules! mirror_struct {
    ($core:ident => $c:ident { $($field:ident),+ $(,)? }) => {
        impl From<$core> for $c {
            fn from(v: $core) -> Self {
                let $core { $($field),+ } = v;
                Self { $($field: $field.into()),+ }
            }
        }
    };
}

/// Storage format of one cached latent (byte layouts in docs/formats.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MlaDtype {
    /// 576 bf16 values: 1152 bytes for the DeepSeek geometry.
    Bf16 = 0,
    /// FlashMLA's fp8 layout (e4m3 NoPE, one fp32 scale per 128 values, bf16
    /// RoPE): 656 bytes.
    Fp8DsMla = 1,
    /// 6-bit E2M3 NoPE, one UE8M0 scale per 32 values, bf16 RoPE: 528 bytes.
    Mxfp6 = 2,
    /// vLLM's NVFP4 layout (E2M1 NoPE, one e4m3 scale per 16 values, e4m3
    /// RoPE): 352 bytes.
    Nvfp4DsMla = 3,
}

mirror_enum!(Dtype <=> MlaDtype { Bf16, Fp8DsMla, Mxfp6, Nvfp4DsMla });

/// Which cached free blocks are evicted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MlaEvictionPolicyKind {
    /// Least recently freed first (vLLM's order).
    Lru = 0,
    /// Adaptive replacement: blocks seen once vs reused, with ghost lists
    /// (the default).
    Arc = 1,
}

mirror_enum!(EvictionPolicyKind <=> MlaEvictionPolicyKind { Lru, Arc });

/// How block hashes are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MlaBlockHashKind {
    /// The library's own seeded xxh3 (default).
    Xxh3 = 0,
    /// vLLM 0.33's `sha256_cbor`.
    Sha256Cbor = 1,
    /// vLLM 0.33's `xxhash_cbor`.
    XxhashCbor = 2,
}

mirror_enum!(BlockHashKind <=> MlaBlockHashKind {
    Xxh3,
    Sha256Cbor,
    XxhashCbor
});

/// Element type of a tensor given to or filled by a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MlaElemType {
    /// bfloat16.
    Bf16 = 0,
    /// IEEE binary16.
    F16 = 1,
    /// IEEE binary32.
    F32 = 2,
}

mirror_enum!(ElemType <=> MlaElemType { Bf16, F16, F32 });

/// The core enum `T` whose C value is `value` (`T`'s C enum as an integer);
/// an unknown value fails with `status`, naming it as `what`.
pub(crate) fn from_c<T, C>(value: u32, all: &[T], what: &str, status: MlaStatus) -> FfiResult<T>
where
    T: Copy + Into<C>,
    C: Into<u32>,
{
    all.iter()
        .copied()
        .find(|&v| {
            let c: C = v.into();
            c.into() == value
        })
        .ok_or_else(|| Failure::new(status, format!("unknown {what} value {value}")))
}

/// The C value of each C enum.
macro_rules! c_value {
    ($($c:ident),+) => {
        $(impl From<$c> for u32 {
            fn from(v: $c) -> u32 {
                v as u32
            }
        })+
    };
}

c_value!(
    MlaDtype,
    MlaEvictionPolicyKind,
    MlaBlockHashKind,
    MlaElemType
);

/// The format whose `MlaDtype` value is `value` (`MLA_STATUS_INVALID_CONFIG`
/// otherwise).
pub(crate) fn dtype_from(value: u32) -> FfiResult<Dtype> {
    from_c::<_, MlaDtype>(value, &Dtype::ALL, "dtype", MlaStatus::InvalidConfig)
}

/// The policy whose `MlaEvictionPolicyKind` value is `value`
/// (`MLA_STATUS_INVALID_CONFIG` otherwise).
pub(crate) fn eviction_from(value: u32) -> FfiResult<EvictionPolicyKind> {
    from_c::<_, MlaEvictionPolicyKind>(
        value,
        &EvictionPolicyKind::ALL,
        "eviction policy",
        MlaStatus::InvalidConfig,
    )
}

/// The kind whose `MlaBlockHashKind` value is `value`
/// (`MLA_STATUS_INVALID_CONFIG` otherwise).
pub(crate) fn block_hash_from(value: u32) -> FfiResult<BlockHashKind> {
    from_c::<_, MlaBlockHashKind>(
        value,
        &BlockHashKind::ALL,
        "block hash kind",
        MlaStatus::InvalidConfig,
    )
}

/// The element type whose `MlaElemType` value is `value`
/// (`MLA_STATUS_INVALID_ARGUMENT` otherwise).
pub(crate) fn elem_from(value: u32, what: &str) -> FfiResult<ElemType> {
    from_c::<_, MlaElemType>(
        value,
        &ElemType::ALL,
        &format!("{what}: element type"),
        MlaStatus::InvalidArgument,
    )
}

/// A block copy the engine must perform before writing new tokens
/// (copy-on-write of a shared partial block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct MlaBlockCopy {
    /// Block to copy from (still shared with other requests).
    pub src: MlaBlockId,
    /// Fresh block that replaces `src` in the appending request's table.
    pub dst: MlaBlockId,
    /// Where `dst` sits in that table (the index of its tail block);
    /// ignored by `mla_store_copy_blocks`.
    pub position: usize,
}

mirror_struct!(BlockCopy => MlaBlockCopy { src, dst, position });

/// What admitting a prompt would take now (`mla_manager_would_admit`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct MlaAdmitCheck {
    /// Leading prompt tokens a hit would serve.
    pub num_cached_tokens: usize,
    /// Blocks the admission would allocate (beyond the hits).
    pub new_blocks: usize,
    /// Blocks it could allocate now (free blocks minus the hits it would revive).
    pub available_blocks: usize,
    /// Whether the admission would succeed now (`new_blocks <= available_blocks`).
    pub fits: bool,
}

impl From<AdmitCheck> for MlaAdmitCheck {
    fn from(c: AdmitCheck) -> Self {
        let AdmitCheck {
            num_cached_tokens,
            new_blocks,
            available_blocks,
        } = c;
        Self {
            num_cached_tokens,
            new_blocks,
            available_blocks,
            fits: c.fits(),
        }
    }
}

/// A snapshot of a manager's state and counters since creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct MlaCacheStats {
    /// Blocks in the cache.
    pub num_blocks: u64,
    /// Blocks no request holds (unhashed or cached-evictable).
    pub free_blocks: u64,
    /// Blocks held by requests or pins.
    pub used_blocks: u64,
    /// Blocks in the prefix index (in use or free).
    pub cached_blocks: u64,
    /// Blocks pinned by `pin`.
    pub pinned_blocks: u64,
    /// Requests admitted and not freed.
    pub num_requests: u64,
    /// Prompt tokens looked up on admission.
    pub prefix_query_tokens: u64,
    /// Prompt tokens served from the cache on admission.
    pub prefix_hit_tokens: u64,
    /// Admissions.
    pub prefix_query_requests: u64,
    /// Admissions with at least one cached token.
    pub prefix_hit_requests: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Blocks copied on write.
    pub cow_copies: u64,
    /// Blocks inserted into the prefix index.
    pub blocks_stored: u64,
    /// Free blocks in the prefix index: what the eviction policy may evict
    /// (SGLang's `evictable_size`, in blocks). The other free blocks were
    /// never hashed and are reused first.
    pub evictable_blocks: u64,
    /// Events dropped because `max_pending_events` were waiting for
    /// `mla_manager_take_events`.
    pub events_dropped: u64,
}

mirror_struct!(CacheStats => MlaCacheStats {
    num_blocks,
    free_blocks,
    used_blocks,
    cached_blocks,
    pinned_blocks,
    num_requests,
    prefix_query_tokens,
    prefix_hit_tokens,
    prefix_query_requests,
    prefix_hit_requests,
    evictions,
    cow_copies,
    blocks_stored,
    evictable_blocks,
    events_dropped,
});

/// Prompt tokens served by each tier: a leading run from the device tier,
/// continued from host memory, then from the remote tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct MlaTierHits {
    /// Tokens already in the device tier.
    pub device_tokens: usize,
    /// Tokens loaded (for a lookup: loadable) from host memory.
    pub host_tokens: usize,
    /// Tokens loaded (for a lookup: loadable) from the remote tier.
    pub remote_tokens: usize,
}

mirror_struct!(TierHits => MlaTierHits {
    device_tokens,
    host_tokens,
    remote_tokens
});

/// Counters of the host tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct MlaHostTierStats {
    /// Blocks the tier can hold.
    pub capacity_blocks: u64,
    /// Blocks held now.
    pub blocks: u64,
    /// Blocks copied in.
    pub stores: u64,
    /// Blocks copied out (loads, uploads to the remote tier).
    pub loads: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
}

mirror_struct!(HostTierStats => MlaHostTierStats {
    capacity_blocks,
    blocks,
    stores,
    loads,
    evictions
});

/// Counters of the remote tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct MlaRemoteStats {
    /// Lookups sent (block gets and existence probes).
    pub lookups: u64,
    /// Blocks found and accepted.
    pub hit_blocks: u64,
    /// Blocks asked for and not found, or lost to a failure.
    pub miss_blocks: u64,
    /// Values refused: bad header, geometry, length or checksum.
    pub rejected: u64,
    /// Lookups that ran past the budget.
    pub timeouts: u64,
    /// Backend calls that failed (connection, timeout, server error).
    pub errors: u64,
    /// Jobs not queued because the queue was full.
    pub queue_full: u64,
    /// Blocks handed to the backend for writing.
    pub put_blocks: u64,
    /// Value bytes handed to the backend for writing.
    pub put_bytes: u64,
    /// Value bytes read and accepted.
    pub get_bytes: u64,
}

mirror_struct!(RemoteStats => MlaRemoteStats {
    lookups,
    hit_blocks,
    miss_blocks,
    rejected,
    timeouts,
    errors,
    queue_full,
    put_blocks,
    put_bytes,
    get_bytes,
});

/// Counters of a tiered cache and of its tiers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct MlaTierStats {
    /// Prompt tokens looked up by admissions.
    pub query_tokens: u64,
    /// Tokens served from the device tier by admissions.
    pub device_hit_tokens: u64,
    /// Tokens loaded from host memory by admissions.
    pub host_hit_tokens: u64,
    /// Tokens loaded from the remote tier by admissions.
    pub remote_hit_tokens: u64,
    /// Blocks copied down when computed or hit (write-through, selective).
    pub written_through: u64,
    /// Evicted blocks copied down before reuse (write-back).
    pub written_back: u64,
    /// Block copies that failed (the block is then not in the lower tier).
    pub copy_errors: u64,
    /// Events dropped because `max_pending_events` were waiting for
    /// `mla_tiered_take_events`.
    pub events_dropped: u64,
    /// Whether there is a host tier (else `host` is zero).
    pub has_host: bool,
    /// The host tier's counters.
    pub host: MlaHostTierStats,
    /// Whether there is a remote tier (else `remote` is zero).
    pub has_remote: bool,
    /// The remote tier's counters.
    pub remote: MlaRemoteStats,
}

impl From<TierStats> for MlaTierStats {
    fn from(s: TierStats) -> Self {
        let TierStats {
            query_tokens,
            device_hit_tokens,
            host_hit_tokens,
            remote_hit_tokens,
            written_through,
            written_back,
            copy_errors,
            events_dropped,
            host,
            remote,
        } = s;
        Self {
            query_tokens,
            device_hit_tokens,
            host_hit_tokens,
            remote_hit_tokens,
            written_through,
            written_back,
            copy_errors,
            events_dropped,
            has_host: host.is_some(),
            host: host.map(Into::into).unwrap_or_default(),
            has_remote: remote.is_some(),
            remote: remote.map(Into::into).unwrap_or_default(),
        }
    }
}

/// Counters of a publisher.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct MlaPublisherStats {
    /// Events accepted by `mla_publisher_publish`.
    pub events_accepted: u64,
    /// Events dropped because the queue was full (or the publisher stopped).
    pub events_dropped: u64,
    /// Events sent on the PUB socket.
    pub events_published: u64,
    /// Batches sent; the next batch's sequence number.
    pub batches_published: u64,
    /// Replay requests answered.
    pub replays_served: u64,
}

mirror_struct!(PublisherStats => MlaPublisherStats {
    events_accepted,
    events_dropped,
    events_published,
    batches_published,
    replays_served,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_values_round_trip_and_unknown_values_fail() {
        for d in Dtype::ALL {
            assert_eq!(dtype_from(MlaDtype::from(d) as u32).unwrap(), d);
        }
        for p in EvictionPolicyKind::ALL {
            assert_eq!(
                eviction_from(MlaEvictionPolicyKind::from(p) as u32).unwrap(),
                p
            );
        }
        for e in ElemType::ALL {
            assert_eq!(elem_from(MlaElemType::from(e) as u32, "m").unwrap(), e);
        }
        let err = dtype_from(4).unwrap_err();
        assert_eq!(err.status, MlaStatus::InvalidConfig);
        assert!(eviction_from(EvictionPolicyKind::ALL.len() as u32).is_err());
        for k in BlockHashKind::ALL {
            assert_eq!(
                block_hash_from(MlaBlockHashKind::from(k) as u32).unwrap(),
                k
            );
        }
        assert!(block_hash_from(3).is_err());
        let err = elem_from(3, "c_kv").unwrap_err();
        assert_eq!(err.status, MlaStatus::InvalidArgument);
        assert!(err.message.contains("c_kv"), "{}", err.message);
    }

    #[test]
    fn the_c_enums_keep_the_core_discriminants() {
        // The kernels and the remote tier's values use the core's numbers.
        for d in Dtype::ALL {
            assert_eq!(MlaDtype::from(d) as u32, d as u32);
        }
        for e in ElemType::ALL {
            assert_eq!(MlaElemType::from(e) as u32, e as u32);
        }
    }
}
