//! Cache configuration: geometry, storage format, model presets and the sizes
//! derived from them.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
pub use crate::policy::EvictionPolicyKind;

/// Storage format of one cached latent (one token of one layer).
///
/// The byte layouts are exact; see `docs/formats.md` (also the [`crate::codec`] docs).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    strum::IntoStaticStr,
    strum::EnumCount,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[repr(C)]
pub enum Dtype {
    /// 576 bf16 values: 1152 bytes for the DeepSeek geometry.
    #[default]
    Bf16 = 0,
    /// FlashMLA's fp8 layout: e4m3 NoPE with one fp32 scale per 128 values,
    /// bf16 RoPE: 656 bytes.
    Fp8DsMla = 1,
    /// 6-bit E2M3 NoPE with one UE8M0 scale per 32 values, bf16 RoPE: 528 bytes.
    Mxfp6 = 2,
    /// vLLM's NVFP4 layout: E2M1 NoPE with one e4m3 scale per 16 values,
    /// unscaled e4m3 RoPE: 352 bytes.
    Nvfp4DsMla = 3,
}

impl Dtype {
    /// Every format, in declaration order (of decreasing size): strum's
    /// `VARIANTS` as an array.
    pub const ALL: [Dtype; <Dtype as strum::EnumCount>::COUNT] =
        *<Self as strum::VariantArray>::VARIANTS
            .first_chunk()
            .expect("strum lists COUNT variants");

    /// The format's name as used by the CLI, Python and C surfaces.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Values per quantization group of the NoPE part (1 for bf16).
    pub fn group_size(self) -> usize {
        match self {
            Dtype::Bf16 => 1,
            Dtype::Fp8DsMla => 128,
            Dtype::Mxfp6 => 32,
            Dtype::Nvfp4DsMla => 16,
        }
    }

    /// What `kv_lora_rank` must be a multiple of: the group size, or for
    /// `nvfp4_ds_mla` four groups (its scales are stored as a 4-row transpose).
    pub fn rank_multiple(self) -> usize {
        match self {
            Dtype::Nvfp4DsMla => 4 * self.group_size(),
            _ => self.group_size(),
        }
    }

    /// Bytes one token of one layer takes, or an error if the dims do not fit
    /// the format (the NoPE width must be a positive multiple of the group
    /// size) or exceed [`CacheConfig::MAX_LATENT_WIDTH`].
    pub fn bytes_per_token(self, kv_lora_rank: usize, rope_dim: usize) -> Result<usize> {
        for (name, width) in [("kv_lora_rank", kv_lora_rank), ("rope_dim", rope_dim)] {
            if width > CacheConfig::MAX_LATENT_WIDTH {
                return Err(Error::InvalidArgument(format!(
                    "{name} {width} exceeds {}",
                    CacheConfig::MAX_LATENT_WIDTH
                )));
            }
        }
        if kv_lora_rank == 0 {
            return Err(Error::InvalidConfig("kv_lora_rank must be positive".into()));
        }
        let group = self.group_size();
        let multiple = self.rank_multiple();
        if kv_lora_rank % multiple != 0 {
            return Err(Error::InvalidConfig(format!(
                "{} needs kv_lora_rank to be a multiple of {multiple}, got {kv_lora_rank}",
                self.name()
            )));
        }
        // Both widths are bounded above, so none of this can overflow.
        let rope = 2 * rope_dim;
        Ok(match self {
            Dtype::Bf16 => 2 * kv_lora_rank + rope,
            Dtype::Fp8DsMla => kv_lora_rank + 4 * (kv_lora_rank / group) + rope,
            Dtype::Mxfp6 => kv_lora_rank * 6 / 8 + kv_lora_rank / group + rope,
            Dtype::Nvfp4DsMla => kv_lora_rank / 2 + rope_dim + kv_lora_rank / group,
        })
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" | "auto" => Ok(Dtype::Bf16),
            "fp8_ds_mla" | "fp8" => Ok(Dtype::Fp8DsMla),
            "mxfp6" => Ok(Dtype::Mxfp6),
            "nvfp4_ds_mla" => Ok(Dtype::Nvfp4DsMla),
            _ => Err(Error::InvalidConfig(format!(
                "unknown dtype {s:?} (expected bf16, fp8_ds_mla, mxfp6 or nvfp4_ds_mla)"
            ))),
        }
    }
}

/// Finds the variant of the name (case ignored) strum derives, listing the
/// names in the error.
pub(crate) fn from_name<T>(s: &str, what: &str) -> Result<T>
where
    T: strum::VariantArray + Copy + Into<&'static str>,
{
    let names = || T::VARIANTS.iter().map(|&v| v.into());
    T::VARIANTS
        .iter()
        .copied()
        .find(|&v| s.eq_ignore_ascii_case(v.into()))
        .ok_or_else(|| {
            Error::InvalidConfig(format!(
                "unknown {what} {s:?} (expected {})",
                names().collect::<Vec<&str>>().join(", ")
            ))
        })
}

/// How block hashes are computed.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    strum::IntoStaticStr,
    strum::EnumCount,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[repr(C)]
pub enum BlockHashKind {
    /// Seeded 128-bit xxh3 over the tokens' bytes (the library's own, fastest).
    #[default]
    Xxh3 = 0,
    /// vLLM 0.33's `sha256_cbor`: SHA-256 of the canonical CBOR of
    /// `(parent, tokens, extra_keys)`, so hashes agree with vLLM's.
    Sha256Cbor = 1,
    /// vLLM 0.33's `xxhash_cbor`: the same CBOR, hashed with 128-bit xxh3.
    XxhashCbor = 2,
}

impl BlockHashKind {
    /// Every kind, in declaration order: strum's `VARIANTS` as an array.
    pub const ALL: [BlockHashKind; <BlockHashKind as strum::EnumCount>::COUNT] =
        *<Self as strum::VariantArray>::VARIANTS
            .first_chunk()
            .expect("strum lists COUNT variants");

    /// The kind's name as used by the CLI, Python and C surfaces.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl FromStr for BlockHashKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        from_name(s, "block hash")
    }
}

/// The geometry of DeepSeek-V3.2's lightning-indexer key cache, which lives
/// beside the latent under the same block ids.
///
/// Per token and layer it stores `head_dim` e4m3 key values and one fp32
/// power-of-two scale; a block holds all its tokens' keys first, then all
/// their scales (see `docs/formats.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexerGeometry {
    /// Width of one indexer key (128 for DeepSeek-V3.2).
    pub head_dim: usize,
}

impl IndexerGeometry {
    /// DeepSeek-V3.2's indexer: 128-wide keys.
    pub const DEEPSEEK_V32: IndexerGeometry = IndexerGeometry { head_dim: 128 };

    /// Bytes one token takes in one layer: the keys and one fp32 scale.
    pub fn bytes_per_token(&self) -> usize {
        self.head_dim + 4
    }

    /// Checks that the keys are a positive multiple of 4 values wide, so a
    /// block's scales stay 4-byte aligned, and no wider than a latent may be.
    pub fn validate(&self) -> Result<()> {
        if self.head_dim == 0 || self.head_dim % 4 != 0 {
            return Err(Error::InvalidConfig(format!(
                "indexer head_dim must be a positive multiple of 4, got {}",
                self.head_dim
            )));
        }
        if self.head_dim > CacheConfig::MAX_LATENT_WIDTH {
            return Err(Error::InvalidConfig(format!(
                "indexer head_dim {} exceeds {}",
                self.head_dim,
                CacheConfig::MAX_LATENT_WIDTH
            )));
        }
        Ok(())
    }
}

/// The attention geometry of an MLA model, as published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelGeometry {
    /// Preset name (`deepseek-v3`, ...).
    pub name: &'static str,
    /// Transformer layers (each caches one latent per token).
    pub num_layers: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Width of the compressed KV latent (`c_kv`).
    pub kv_lora_rank: usize,
    /// Width of the compressed query, if the model compresses queries.
    pub q_lora_rank: Option<usize>,
    /// Per-head non-RoPE query/key width.
    pub qk_nope_head_dim: usize,
    /// Per-head decoupled RoPE width (shared by all heads in MLA's cache).
    pub qk_rope_head_dim: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
    /// The sparse-attention indexer's key cache, if the model has one.
    pub indexer: Option<IndexerGeometry>,
}

impl ModelGeometry {
    /// DeepSeek-V2 (236B).
    pub const DEEPSEEK_V2: ModelGeometry = ModelGeometry {
        name: "deepseek-v2",
        num_layers: 60,
        hidden_size: 5120,
        num_heads: 128,
        kv_lora_rank: 512,
        q_lora_rank: Some(1536),
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        indexer: None,
    };
    /// DeepSeek-V2-Lite (16B).
    pub const DEEPSEEK_V2_LITE: ModelGeometry = ModelGeometry {
        name: "deepseek-v2-lite",
        num_layers: 27,
        hidden_size: 2048,
        num_heads: 16,
        kv_lora_rank: 512,
        q_lora_rank: None,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        indexer: None,
    };
    /// DeepSeek-V3 (also R1 and V3.1, which share its attention geometry).
    pub const DEEPSEEK_V3: ModelGeometry = ModelGeometry {
        name: "deepseek-v3",
        num_layers: 61,
        hidden_size: 7168,
        num_heads: 128,
        kv_lora_rank: 512,
        q_lora_rank: Some(1536),
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        indexer: None,
    };
    /// DeepSeek-V3.2: DeepSeek-V3's attention plus the sparse-attention
    /// indexer's key cache.
    pub const DEEPSEEK_V32: ModelGeometry = ModelGeometry {
        name: "deepseek-v3.2",
        indexer: Some(IndexerGeometry::DEEPSEEK_V32),
        ..Self::DEEPSEEK_V3
    };
    /// Kimi-K2 (DeepSeek-V3 architecture with 64 heads).
    pub const KIMI_K2: ModelGeometry = ModelGeometry {
        name: "kimi-k2",
        num_layers: 61,
        hidden_size: 7168,
        num_heads: 64,
        kv_lora_rank: 512,
        q_lora_rank: Some(1536),
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        indexer: None,
    };

    /// Every preset.
    pub const ALL: [ModelGeometry; 5] = [
        Self::DEEPSEEK_V2,
        Self::DEEPSEEK_V2_LITE,
        Self::DEEPSEEK_V3,
        Self::DEEPSEEK_V32,
        Self::KIMI_K2,
    ];

    /// Finds a preset by name; `deepseek-r1` and `deepseek-v3.1` map to
    /// `deepseek-v3`. Case and `_`/`-` are ignored.
    pub fn preset(name: &str) -> Result<ModelGeometry> {
        let key = name.to_ascii_lowercase().replace('_', "-");
        let found = match key.as_str() {
            "deepseek-v2" => Self::DEEPSEEK_V2,
            "deepseek-v2-lite" => Self::DEEPSEEK_V2_LITE,
            "deepseek-v3" | "deepseek-r1" | "deepseek-v3.1" => Self::DEEPSEEK_V3,
            "deepseek-v3.2" => Self::DEEPSEEK_V32,
            "kimi-k2" => Self::KIMI_K2,
            _ => {
                let names: Vec<&str> = Self::ALL.iter().map(|g| g.name).collect();
                return Err(Error::InvalidConfig(format!(
                    "unknown model preset {name:?} (expected one of {}, deepseek-r1, deepseek-v3.1)",
                    names.join(", ")
                )));
            }
        };
        Ok(found)
    }

    /// Elements an MLA layer caches per token: `kv_lora_rank + qk_rope_head_dim`.
    pub fn mla_elements_per_token(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Per-head width `d_h` of the equivalent standard-attention model (the
    /// DeepSeek-V2 paper compares against MHA with `d_h = qk_nope_head_dim`).
    pub fn head_dim(&self) -> usize {
        self.qk_nope_head_dim
    }

    /// Elements a multi-head-attention cache would hold per token and layer:
    /// `2 x heads x head_dim` (32,768 for DeepSeek-V2).
    pub fn mha_elements_per_token(&self) -> usize {
        2 * self.num_heads * self.head_dim()
    }

    /// Elements a grouped-query cache with `groups` KV heads would hold per
    /// token and layer: `2 x groups x head_dim` (MLA's 576 equal 2.25 groups).
    pub fn gqa_elements_per_token(&self, groups: usize) -> usize {
        2 * groups * self.head_dim()
    }
}

/// Everything the block manager and the stores need to know.
///
/// Fields are public; [`CacheConfig::validate`] (called by every constructor
/// that takes a config) rejects combinations that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// Physical blocks in the cache (shared by all layers).
    pub num_blocks: usize,
    /// Tokens per block (FlashMLA needs 64).
    pub block_size: usize,
    /// Layers cached per token.
    pub num_layers: usize,
    /// Width of the compressed latent `c_kv` (512 for the DeepSeek family).
    pub kv_lora_rank: usize,
    /// Width of the decoupled RoPE key (64 for the DeepSeek family).
    pub rope_dim: usize,
    /// Storage format.
    pub dtype: Dtype,
    /// The indexer key cache kept beside the latent under the same block
    /// ids (DeepSeek-V3.2), or `None`.
    pub indexer: Option<IndexerGeometry>,
    /// Share full blocks between requests by prefix hash.
    pub enable_prefix_caching: bool,
    /// Order in which cached free blocks are evicted.
    pub eviction: EvictionPolicyKind,
    /// Seed of the block hash chain; `None` draws a random one. With an
    /// engine-compatible [`CacheConfig::block_hash`] it plays vLLM's
    /// `PYTHONHASHSEED`: `NONE_HASH` is the hash of its decimal string, and
    /// `None` means vLLM's default (`"vllm-none-hash"` for `sha256_cbor`, a
    /// random seed for `xxhash_cbor`).
    pub hash_seed: Option<u64>,
    /// How block hashes are computed (default: the library's own xxh3).
    pub block_hash: BlockHashKind,
    /// Compare token ids on every prefix hit (no collision risk at all).
    pub verify_tokens: bool,
    /// Most blocks that may be pinned at once; `None` means half the cache.
    pub pin_budget_blocks: Option<usize>,
    /// Record [`crate::CacheEvent`]s for `take_events`.
    pub enable_events: bool,
    /// Most events kept until `take_events` drains them; past it new events
    /// are dropped and counted in [`crate::CacheStats::events_dropped`], so an
    /// undrained queue cannot grow without bound.
    pub max_pending_events: usize,
    /// Cap a prefix hit at `len - 1` tokens on admission, so the last prompt
    /// token is recomputed to produce logits (vLLM's rule).
    pub cap_hit_at_last_token: bool,
}

impl CacheConfig {
    /// Default block size (FlashMLA's).
    pub const DEFAULT_BLOCK_SIZE: usize = 64;
    /// Default of [`CacheConfig::max_pending_events`] (vLLM's event queue size).
    pub const DEFAULT_MAX_PENDING_EVENTS: usize = 100_000;
    /// Most blocks a cache may have (block ids are 32-bit, one value reserved).
    pub const MAX_NUM_BLOCKS: usize = u32::MAX as usize - 1;
    /// Largest `block_size` accepted.
    pub const MAX_BLOCK_SIZE: usize = 1 << 16;
    /// Largest `num_layers` accepted.
    pub const MAX_NUM_LAYERS: usize = 1 << 12;
    /// Largest `kv_lora_rank` and `rope_dim` accepted.
    pub const MAX_LATENT_WIDTH: usize = 1 << 16;

    /// A DeepSeek-geometry config (512 + 64, 1 layer, bf16) with `num_blocks`
    /// blocks of 64 tokens.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            num_blocks,
            block_size: Self::DEFAULT_BLOCK_SIZE,
            num_layers: 1,
            kv_lora_rank: 512,
            rope_dim: 64,
            dtype: Dtype::Bf16,
            indexer: None,
            enable_prefix_caching: true,
            eviction: EvictionPolicyKind::default(),
            hash_seed: None,
            block_hash: BlockHashKind::Xxh3,
            verify_tokens: false,
            pin_budget_blocks: None,
            enable_events: false,
            max_pending_events: Self::DEFAULT_MAX_PENDING_EVENTS,
            cap_hit_at_last_token: true,
        }
    }

    /// A config for a model preset (see [`ModelGeometry::preset`]).
    pub fn preset(model: &str, num_blocks: usize, dtype: Dtype) -> Result<Self> {
        let g = ModelGeometry::preset(model)?;
        Ok(Self::for_model(&g, num_blocks, dtype))
    }

    /// A config for a model geometry.
    pub fn for_model(model: &ModelGeometry, num_blocks: usize, dtype: Dtype) -> Self {
        Self {
            num_layers: model.num_layers,
            kv_lora_rank: model.kv_lora_rank,
            rope_dim: model.qk_rope_head_dim,
            dtype,
            indexer: model.indexer,
            ..Self::new(num_blocks)
        }
    }

    /// Checks that the configuration describes a usable cache: every field
    /// within its bound, and every size derived from them (up to
    /// [`CacheConfig::total_bytes`] and the slot numbers) representable, so
    /// that no later computation on a valid config overflows or divides by zero.
    pub fn validate(&self) -> Result<()> {
        let bounded = |name: &str, value: usize, max: usize| {
            if value == 0 {
                Err(Error::InvalidConfig(format!("{name} must be positive")))
            } else if value > max {
                Err(Error::InvalidConfig(format!(
                    "{name} {value} exceeds {max}"
                )))
            } else {
                Ok(())
            }
        };
        bounded("num_blocks", self.num_blocks, Self::MAX_NUM_BLOCKS)?;
        bounded("block_size", self.block_size, Self::MAX_BLOCK_SIZE)?;
        bounded("num_layers", self.num_layers, Self::MAX_NUM_LAYERS)?;
        bounded("kv_lora_rank", self.kv_lora_rank, Self::MAX_LATENT_WIDTH)?;
        if self.rope_dim > Self::MAX_LATENT_WIDTH {
            return Err(Error::InvalidConfig(format!(
                "rope_dim {} exceeds {}",
                self.rope_dim,
                Self::MAX_LATENT_WIDTH
            )));
        }
        if self.max_pending_events == 0 {
            return Err(Error::InvalidConfig(
                "max_pending_events must be positive".into(),
            ));
        }
        let per_token = self
            .dtype
            .bytes_per_token(self.kv_lora_rank, self.rope_dim)?;
        if let Some(indexer) = &self.indexer {
            indexer.validate()?;
        }
        // Bounded widths: the latent's and the indexer's bytes per token fit easily.
        let per_token = per_token + self.indexer_bytes_per_token_per_layer();
        let tokens = checked_mul(self.num_blocks, self.block_size, "num_blocks x block_size")?;
        if tokens > i64::MAX as usize {
            return Err(Error::InvalidConfig(
                "num_blocks x block_size overflows a slot number".into(),
            ));
        }
        let per_block = checked_mul(per_token, self.block_size, "bytes per block")?;
        let per_block = checked_mul(per_block, self.num_layers, "bytes per block")?;
        let total = checked_mul(per_block, self.num_blocks, "the cache's total bytes")?;
        if total > isize::MAX as usize {
            return Err(Error::InvalidConfig(format!(
                "the cache's total bytes ({total}) exceed the address space"
            )));
        }
        if let Some(budget) = self.pin_budget_blocks {
            if budget > self.num_blocks {
                return Err(Error::InvalidConfig(format!(
                    "pin_budget_blocks {budget} exceeds num_blocks {}",
                    self.num_blocks
                )));
            }
        }
        Ok(())
    }

    // The sizes below never overflow on a config that `validate` accepted,
    // which every constructor taking a config checks first.

    /// Elements cached per token and layer (`kv_lora_rank + rope_dim`).
    pub fn elements_per_token(&self) -> usize {
        self.kv_lora_rank + self.rope_dim
    }

    /// Bytes one token's latent takes in one layer. Panics on an invalid
    /// config; call [`CacheConfig::validate`] first.
    pub fn latent_bytes_per_token_per_layer(&self) -> usize {
        self.dtype
            .bytes_per_token(self.kv_lora_rank, self.rope_dim)
            .expect("validated config")
    }

    /// Bytes one token's indexer key takes in one layer (0 without an indexer).
    pub fn indexer_bytes_per_token_per_layer(&self) -> usize {
        self.indexer.map_or(0, |i| i.bytes_per_token())
    }

    /// Bytes one token takes in one layer: the latent and the indexer key.
    /// Panics on an invalid config; call [`CacheConfig::validate`] first.
    pub fn bytes_per_token_per_layer(&self) -> usize {
        self.latent_bytes_per_token_per_layer() + self.indexer_bytes_per_token_per_layer()
    }

    /// Bytes one token takes over all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token_per_layer() * self.num_layers
    }

    /// Bytes one block takes in one layer (latent and indexer parts).
    pub fn bytes_per_block_per_layer(&self) -> usize {
        self.bytes_per_token_per_layer() * self.block_size
    }

    /// Bytes one block takes over all layers.
    pub fn bytes_per_block(&self) -> usize {
        self.bytes_per_block_per_layer() * self.num_layers
    }

    /// Bytes the whole cache takes over all layers.
    pub fn total_bytes(&self) -> usize {
        self.bytes_per_block() * self.num_blocks
    }

    /// Tokens the cache can hold.
    pub fn num_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// How many blocks (all layers) fit in `bytes`.
    pub fn blocks_for_bytes(&self, bytes: u64) -> usize {
        let blocks = bytes / self.bytes_per_block() as u64;
        usize::try_from(blocks).unwrap_or(usize::MAX)
    }

    /// Pinned-block budget in effect.
    pub fn pin_budget(&self) -> usize {
        self.pin_budget_blocks.unwrap_or(self.num_blocks / 2)
    }
}

/// `a * b`, or an [`Error::InvalidConfig`] naming the product when it overflows.
pub(crate) fn checked_mul(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::InvalidConfig(format!("{what} overflows ({a} x {b})")))
}

impl Default for CacheConfig {
    /// 1,024 blocks of the DeepSeek geometry.
    fn default() -> Self {
        Self::new(1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_sizes_match_the_design() {
        assert_eq!(Dtype::Bf16.bytes_per_token(512, 64).unwrap(), 1152);
        assert_eq!(Dtype::Fp8DsMla.bytes_per_token(512, 64).unwrap(), 656);
        assert_eq!(Dtype::Mxfp6.bytes_per_token(512, 64).unwrap(), 528);
        assert_eq!(Dtype::Nvfp4DsMla.bytes_per_token(512, 64).unwrap(), 352);
        assert!(Dtype::Nvfp4DsMla.bytes_per_token(48, 64).is_err());
    }

    #[test]
    fn deepseek_v3_fp8_is_40016_bytes_per_token() {
        let c = CacheConfig::preset("deepseek-r1", 16, Dtype::Fp8DsMla).unwrap();
        assert_eq!(c.bytes_per_token(), 61 * 656);
        assert_eq!(c.bytes_per_token(), 40_016);
        assert_eq!(c.bytes_per_block(), 40_016 * 64);
        assert_eq!(c.blocks_for_bytes(40_016 * 64 * 3 + 5), 3);
    }

    #[test]
    fn deepseek_v32_counts_the_indexer_beside_the_latent() {
        let c = CacheConfig::preset("deepseek-v3.2", 16, Dtype::Fp8DsMla).unwrap();
        assert_eq!(c.num_layers, 61);
        assert_eq!(c.indexer, Some(IndexerGeometry { head_dim: 128 }));
        assert_eq!(c.latent_bytes_per_token_per_layer(), 656);
        assert_eq!(c.indexer_bytes_per_token_per_layer(), 132);
        assert_eq!(c.bytes_per_token(), (656 + 132) * 61);
        assert_eq!(c.bytes_per_token(), 48_068);
        assert_eq!(c.bytes_per_block_per_layer(), 64 * 788);
        assert_eq!(c.bytes_per_block_per_layer() - 64 * 656, 8_448);
        let v3 = CacheConfig::preset("deepseek-v3.1", 16, Dtype::Fp8DsMla).unwrap();
        assert_eq!(v3.indexer, None);
        assert_eq!(v3.bytes_per_token(), 40_016);
        let mut bad = c.clone();
        bad.indexer = Some(IndexerGeometry { head_dim: 130 });
        assert!(bad.validate().unwrap_err().to_string().contains("indexer"));
    }

    #[test]
    fn invalid_configs_are_errors_with_a_message() {
        let mut c = CacheConfig::new(0);
        assert!(c.validate().unwrap_err().to_string().contains("num_blocks"));
        c.num_blocks = 4;
        c.block_size = 0;
        assert!(c.validate().unwrap_err().to_string().contains("block_size"));
        c.block_size = 64;
        c.kv_lora_rank = 500;
        c.dtype = Dtype::Fp8DsMla;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("multiple of 128"));
        c.dtype = Dtype::Bf16;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn mha_and_gqa_comparisons() {
        let v2 = ModelGeometry::DEEPSEEK_V2;
        assert_eq!(v2.mla_elements_per_token(), 576);
        assert_eq!(v2.mha_elements_per_token(), 32_768);
        assert_eq!(v2.gqa_elements_per_token(8), 2 * 8 * 128);
        assert!(ModelGeometry::preset("gpt-4").is_err());
    }
}
