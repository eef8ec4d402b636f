//! Cache configurations: presets, fields, derived sizes.

use std::ffi::c_char;
use std::sync::{Mutex, PoisonError};

use super::types::{
    block_hash_from, dtype_from, eviction_from, MlaBlockHashKind, MlaDtype, MlaEvictionPolicyKind,
};
use super::{guard, text, MlaStatus, Out, Registry};
use mla_cache::{CacheConfig, Dtype, IndexerGeometry, ModelGeometry};

/// A cache configuration under construction (opaque). Create it with
/// `mla_config_create` or `mla_config_from_preset`, adjust it with the
/// `mla_config_set_*` functions, pass it to `mla_manager_create` (which
/// copies it) and destroy it with `mla_config_destroy`.
pub struct MlaConfig {
    inner: Mutex<CacheConfig>,
}

impl MlaConfig {
    /// A copy of the configuration.
    pub(crate) fn get(&self) -> CacheConfig {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update(&self, f: impl FnOnce(&mut CacheConfig)) {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

pub(crate) static CONFIGS: Registry<MlaConfig> = Registry::new("MlaConfig");

/// Every field of a configuration, as read by `mla_config_get`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaConfigInfo {
    /// Physical blocks in the cache (shared by all layers).
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Layers cached per token.
    pub num_layers: usize,
    /// Width of the compressed latent `c_kv`.
    pub kv_lora_rank: usize,
    /// Width of the decoupled RoPE key.
    pub rope_dim: usize,
    /// Storage format.
    pub dtype: MlaDtype,
    /// Order in which cached free blocks are evicted.
    pub eviction: MlaEvictionPolicyKind,
    /// Full blocks are shared between requests by prefix hash.
    pub enable_prefix_caching: bool,
    /// Whether `hash_seed` is set (otherwise a random seed is drawn).
    pub has_hash_seed: bool,
    /// Seed of the block hash chain, when `has_hash_seed`.
    pub hash_seed: u64,
    /// Token ids are compared on every prefix hit.
    pub verify_tokens: bool,
    /// Whether `pin_budget_blocks` is set (otherwise half the cache).
    pub has_pin_budget_blocks: bool,
    /// Most blocks pinned at once, when `has_pin_budget_blocks`.
    pub pin_budget_blocks: usize,
    /// Events are recorded for `mla_manager_take_events`.
    pub enable_events: bool,
    /// A prefix hit on admission is capped at `len - 1` tokens.
    pub cap_hit_at_last_token: bool,
    /// How block hashes are computed.
    pub block_hash: MlaBlockHashKind,
    /// Most events waiting to be taken; more are dropped and counted.
    pub max_pending_events: usize,
    /// Width of the indexer keys kept beside the latent (DeepSeek-V3.2:
    /// 128); 0 when the cache has no indexer.
    pub indexer_head_dim: usize,
}

/// Sizes derived from a valid configuration, as read by `mla_config_sizes`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaConfigSizes {
    /// Elements cached per token and layer (`kv_lora_rank + rope_dim`).
    pub elements_per_token: usize,
    /// Bytes of one token in one layer (latent and indexer key).
    pub bytes_per_token_per_layer: usize,
    /// Bytes of one token over all layers.
    pub bytes_per_token: usize,
    /// Bytes of one block in one layer.
    pub bytes_per_block_per_layer: usize,
    /// Bytes of one block over all layers.
    pub bytes_per_block: usize,
    /// Bytes of the whole cache over all layers.
    pub total_bytes: usize,
    /// Tokens the cache holds.
    pub num_tokens: usize,
    /// Pinned-block budget in effect.
    pub pin_budget: usize,
    /// Bytes of one token's indexer key in one layer (0 without an indexer).
    pub indexer_bytes_per_token_per_layer: usize,
}

/// The published attention geometry of a model, as read by `mla_model_geometry`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaModelGeometry {
    /// Transformer layers.
    pub num_layers: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Width of the compressed KV latent.
    pub kv_lora_rank: usize,
    /// Width of the compressed query; 0 when queries are not compressed.
    pub q_lora_rank: usize,
    /// Per-head non-RoPE query/key width.
    pub qk_nope_head_dim: usize,
    /// Per-head decoupled RoPE width.
    pub qk_rope_head_dim: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
    /// Width of the sparse-attention indexer's keys; 0 without an indexer.
    pub indexer_head_dim: usize,
}

fn create(config: CacheConfig, out: Out<*mut MlaConfig>) {
    let handle = CONFIGS.register(MlaConfig {
        inner: Mutex::new(config),
    });
    // SAFETY: checked by the caller's `Out::new`; valid per its contract.
    unsafe { out.set(handle) };
}

/// Creates a configuration of `num_blocks` blocks with the DeepSeek latent
/// geometry (512 + 64), one layer, bf16, blocks of 64 tokens, prefix
/// caching on. Validation happens on use (`mla_config_validate`).
///
/// # Safety
/// `out` must be valid for a write; `*out` receives the new handle.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_config_create(
    num_blocks: usize,
    out: *mut *mut MlaConfig,
) -> MlaStatus {
    guard("mla_config_create", || {
        create(CacheConfig::new(num_blocks), Out::new(out, "out")?);
        Ok(())
    })
}

/// Creates a configuration for a model preset (`"deepseek-v2"`,
/// `"deepseek-v2-lite"`, `"deepseek-v3"`, `"deepseek-r1"`,
/// `"deepseek-v3.2"`, `"kimi-k2"`; case and `_`/`-` ignored) with
/// `num_blocks` blocks and storage format `dtype` (an `MlaDtype` value).
/// Fails with `MLA_STATUS_INVALID_CONFIG` for an unknown name or dtype.
///
/// # Safety
/// `model` must be a NUL-terminated string; `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_config_from_preset(
    model: *const c_char,
    num_blocks: usize,
    dtype: u32,
    out: *mut *mut MlaConfig,
) -> MlaStatus {
    guard("mla_config_from_preset", || {
        // SAFETY: per the contract.
        let model = unsafe { text(model, "model") }?;
        let out = Out::new(out, "out")?;
        let config = CacheConfig::preset(model, num_blocks, dtype_from(dtype)?)?;
        create(config, out);
        Ok(())
    })
}

/// Destroys a configuration. Managers created from it are unaffected.
///
/// # Safety
/// `config` must not be used after this call.
///
/// Thread safety: must not race with other calls on the same handle.
#[no_mangle]
pub unsafe extern "C" fn mla_config_destroy(config: *mut MlaConfig) -> MlaStatus {
    guard("mla_config_destroy", || CONFIGS.destroy(config))
}

fn set(name: &str, config: *mut MlaConfig, f: impl FnOnce(&mut CacheConfig)) -> MlaStatus {
    guard(name, || {
        CONFIGS.with(config, |c| {
            c.update(f);
            Ok(())
        })
    })
}

/// Sets the number of blocks. Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_num_blocks(config: *mut MlaConfig, value: usize) -> MlaStatus {
    set("mla_config_set_num_blocks", config, |c| {
        c.num_blocks = value
    })
}

/// Sets the tokens per block (FlashMLA needs 64). Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_block_size(config: *mut MlaConfig, value: usize) -> MlaStatus {
    set("mla_config_set_block_size", config, |c| {
        c.block_size = value
    })
}

/// Sets the number of cached layers. Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_num_layers(config: *mut MlaConfig, value: usize) -> MlaStatus {
    set("mla_config_set_num_layers", config, |c| {
        c.num_layers = value
    })
}

/// Sets the width of the compressed latent (512 for DeepSeek).
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_kv_lora_rank(config: *mut MlaConfig, value: usize) -> MlaStatus {
    set("mla_config_set_kv_lora_rank", config, |c| {
        c.kv_lora_rank = value
    })
}

/// Sets the width of the RoPE key (64 for DeepSeek). Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_rope_dim(config: *mut MlaConfig, value: usize) -> MlaStatus {
    set("mla_config_set_rope_dim", config, |c| c.rope_dim = value)
}

/// Keeps indexer keys of `head_dim` values beside the latent under the same
/// block ids (DeepSeek-V3.2: 128); 0 keeps none. Checked on use
/// (`mla_config_validate`). Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_indexer_head_dim(
    config: *mut MlaConfig,
    head_dim: usize,
) -> MlaStatus {
    set("mla_config_set_indexer_head_dim", config, |c| {
        c.indexer = (head_dim > 0).then_some(IndexerGeometry { head_dim })
    })
}

/// Sets the storage format (an `MlaDtype` value; others fail with
/// `MLA_STATUS_INVALID_CONFIG`). Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_dtype(config: *mut MlaConfig, dtype: u32) -> MlaStatus {
    guard("mla_config_set_dtype", || {
        CONFIGS.with(config, |c| {
            let dtype = dtype_from(dtype)?;
            c.update(|c| c.dtype = dtype);
            Ok(())
        })
    })
}

/// Sets the eviction policy (an `MlaEvictionPolicyKind` value; others fail
/// with `MLA_STATUS_INVALID_CONFIG`). Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_eviction(config: *mut MlaConfig, policy: u32) -> MlaStatus {
    guard("mla_config_set_eviction", || {
        CONFIGS.with(config, |c| {
            let policy = eviction_from(policy)?;
            c.update(|c| c.eviction = policy);
            Ok(())
        })
    })
}

/// Turns prefix caching (sharing of full blocks) on or off.
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_enable_prefix_caching(
    config: *mut MlaConfig,
    value: bool,
) -> MlaStatus {
    set("mla_config_set_enable_prefix_caching", config, |c| {
        c.enable_prefix_caching = value
    })
}

/// Sets the hash seed (`has_seed` true) or asks for a random one (false).
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_hash_seed(
    config: *mut MlaConfig,
    has_seed: bool,
    seed: u64,
) -> MlaStatus {
    set("mla_config_set_hash_seed", config, |c| {
        c.hash_seed = has_seed.then_some(seed)
    })
}

/// Compares token ids on every prefix hit (no collision risk at all).
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_verify_tokens(config: *mut MlaConfig, value: bool) -> MlaStatus {
    set("mla_config_set_verify_tokens", config, |c| {
        c.verify_tokens = value
    })
}

/// Sets the pinned-block budget (`has_budget` true) or restores the default
/// of half the cache (false). Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_pin_budget_blocks(
    config: *mut MlaConfig,
    has_budget: bool,
    blocks: usize,
) -> MlaStatus {
    set("mla_config_set_pin_budget_blocks", config, |c| {
        c.pin_budget_blocks = has_budget.then_some(blocks)
    })
}

/// Sets how block hashes are computed (an `MlaBlockHashKind` value; others
/// fail with `MLA_STATUS_INVALID_CONFIG`). `MLA_BLOCK_HASH_KIND_SHA256_CBOR`
/// and `..._XXHASH_CBOR` give vLLM 0.33's hashes, `hash_seed` playing its
/// `PYTHONHASHSEED`. Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_block_hash(config: *mut MlaConfig, kind: u32) -> MlaStatus {
    guard("mla_config_set_block_hash", || {
        CONFIGS.with(config, |c| {
            let kind = block_hash_from(kind)?;
            c.update(|c| c.block_hash = kind);
            Ok(())
        })
    })
}

/// Records events for `mla_manager_take_events`. Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_enable_events(config: *mut MlaConfig, value: bool) -> MlaStatus {
    set("mla_config_set_enable_events", config, |c| {
        c.enable_events = value
    })
}

/// Sets the most events waiting to be taken (`mla_manager_take_events`,
/// `mla_tiered_take_events`); more are dropped and counted in
/// `events_dropped`. Must be positive (checked on validation).
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_max_pending_events(
    config: *mut MlaConfig,
    value: usize,
) -> MlaStatus {
    set("mla_config_set_max_pending_events", config, |c| {
        c.max_pending_events = value
    })
}

/// Caps a prefix hit on admission at `len - 1` tokens (default true), so
/// the last prompt token is recomputed for its logits.
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_set_cap_hit_at_last_token(
    config: *mut MlaConfig,
    value: bool,
) -> MlaStatus {
    set("mla_config_set_cap_hit_at_last_token", config, |c| {
        c.cap_hit_at_last_token = value
    })
}

pub(crate) fn info(c: &CacheConfig) -> MlaConfigInfo {
    MlaConfigInfo {
        num_blocks: c.num_blocks,
        block_size: c.block_size,
        num_layers: c.num_layers,
        kv_lora_rank: c.kv_lora_rank,
        rope_dim: c.rope_dim,
        dtype: c.dtype.into(),
        eviction: c.eviction.into(),
        enable_prefix_caching: c.enable_prefix_caching,
        has_hash_seed: c.hash_seed.is_some(),
        hash_seed: c.hash_seed.unwrap_or(0),
        verify_tokens: c.verify_tokens,
        has_pin_budget_blocks: c.pin_budget_blocks.is_some(),
        pin_budget_blocks: c.pin_budget_blocks.unwrap_or(0),
        enable_events: c.enable_events,
        cap_hit_at_last_token: c.cap_hit_at_last_token,
        block_hash: c.block_hash.into(),
        max_pending_events: c.max_pending_events,
        indexer_head_dim: c.indexer.map_or(0, |i| i.head_dim),
    }
}

/// Reads every field (valid or not).
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_config_get(
    config: *const MlaConfig,
    out: *mut MlaConfigInfo,
) -> MlaStatus {
    guard("mla_config_get", || {
        let out = Out::new(out, "out")?;
        let c = CONFIGS.with(config, |c| Ok(c.get()))?;
        // SAFETY: per the contract.
        unsafe { out.set(info(&c)) };
        Ok(())
    })
}

/// Checks that the configuration describes a usable cache; the message of
/// `MLA_STATUS_INVALID_CONFIG` names the offending field. Every field is
/// bounded (`num_blocks` < 2^32 - 1, `block_size` <= 65,536, `num_layers`
/// <= 4,096, `kv_lora_rank` and `rope_dim` <= 65,536) and so is every size
/// derived from them (the whole cache's bytes fit the address space).
/// Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_config_validate(config: *const MlaConfig) -> MlaStatus {
    guard("mla_config_validate", || {
        CONFIGS.with(config, |c| Ok(c.get().validate()?))
    })
}

/// Sizes derived from a valid configuration (fails like `mla_config_validate`,
/// whose bounds on every field keep each size representable). On failure
/// `*out` is untouched.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_config_sizes(
    config: *const MlaConfig,
    out: *mut MlaConfigSizes,
) -> MlaStatus {
    guard("mla_config_sizes", || {
        let out = Out::new(out, "out")?;
        let c = CONFIGS.with(config, |c| Ok(c.get()))?;
        c.validate()?;
        let sizes = MlaConfigSizes {
            elements_per_token: c.elements_per_token(),
            bytes_per_token_per_layer: c.bytes_per_token_per_layer(),
            bytes_per_token: c.bytes_per_token(),
            bytes_per_block_per_layer: c.bytes_per_block_per_layer(),
            bytes_per_block: c.bytes_per_block(),
            total_bytes: c.total_bytes(),
            num_tokens: c.num_tokens(),
            pin_budget: c.pin_budget(),
            indexer_bytes_per_token_per_layer: c.indexer_bytes_per_token_per_layer(),
        };
        // SAFETY: per the contract.
        unsafe { out.set(sizes) };
        Ok(())
    })
}

/// How many blocks (all layers) of a valid configuration fit in `bytes`
/// (fails like `mla_config_validate`). On failure `*out` is untouched.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_config_blocks_for_bytes(
    config: *const MlaConfig,
    bytes: u64,
    out: *mut usize,
) -> MlaStatus {
    guard("mla_config_blocks_for_bytes", || {
        let out = Out::new(out, "out")?;
        let c = CONFIGS.with(config, |c| Ok(c.get()))?;
        c.validate()?;
        // SAFETY: per the contract.
        unsafe { out.set(c.blocks_for_bytes(bytes)) };
        Ok(())
    })
}

/// Parses a storage format name (`"bf16"`, `"fp8_ds_mla"`, `"fp8"`,
/// `"mxfp6"`, `"nvfp4_ds_mla"`; case ignored) into an `MlaDtype`.
///
/// # Safety
/// `name` must be a NUL-terminated string; `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_dtype_from_name(name: *const c_char, out: *mut MlaDtype) -> MlaStatus {
    guard("mla_dtype_from_name", || {
        // SAFETY: per the contract.
        let name = unsafe { text(name, "name") }?;
        let out = Out::new(out, "out")?;
        let dtype: Dtype = name.parse()?;
        // SAFETY: per the contract.
        unsafe { out.set(dtype.into()) };
        Ok(())
    })
}

/// The name of an `MlaDtype` (`"fp8_ds_mla"`), or NULL for another value.
///
/// The string is static. Thread safety: thread-safe.
#[no_mangle]
pub extern "C" fn mla_dtype_name(dtype: u32) -> *const c_char {
    match dtype_from(dtype) {
        Ok(Dtype::Bf16) => c"bf16".as_ptr(),
        Ok(Dtype::Fp8DsMla) => c"fp8_ds_mla".as_ptr(),
        Ok(Dtype::Mxfp6) => c"mxfp6".as_ptr(),
        Ok(Dtype::Nvfp4DsMla) => c"nvfp4_ds_mla".as_ptr(),
        Err(_) => std::ptr::null(),
    }
}

/// Bytes one token of one layer takes in `dtype` for the given latent
/// widths: `MLA_STATUS_INVALID_CONFIG` if the widths do not fit the format,
/// `MLA_STATUS_INVALID_ARGUMENT` if one exceeds 65,536
/// (`CacheConfig::MAX_LATENT_WIDTH`). On failure `*out` is untouched.
///
/// # Safety
/// `out` must be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_dtype_bytes_per_token(
    dtype: u32,
    kv_lora_rank: usize,
    rope_dim: usize,
    out: *mut usize,
) -> MlaStatus {
    guard("mla_dtype_bytes_per_token", || {
        let out = Out::new(out, "out")?;
        let bytes = dtype_from(dtype)?.bytes_per_token(kv_lora_rank, rope_dim)?;
        // SAFETY: per the contract.
        unsafe { out.set(bytes) };
        Ok(())
    })
}

/// The published geometry of a model preset (names as for
/// `mla_config_from_preset`).
///
/// # Safety
/// `model` must be a NUL-terminated string (or NULL, an error); `out` must
/// be valid for a write.
///
/// Thread safety: thread-safe.
#[no_mangle]
pub unsafe extern "C" fn mla_model_geometry(
    model: *const c_char,
    out: *mut MlaModelGeometry,
) -> MlaStatus {
    guard("mla_model_geometry", || {
        // SAFETY: per the contract.
        let model = unsafe { text(model, "model") }?;
        let out = Out::new(out, "out")?;
        let g = ModelGeometry::preset(model)?;
        let geometry = MlaModelGeometry {
            num_layers: g.num_layers,
            hidden_size: g.hidden_size,
            num_heads: g.num_heads,
            kv_lora_rank: g.kv_lora_rank,
            q_lora_rank: g.q_lora_rank.unwrap_or(0),
            qk_nope_head_dim: g.qk_nope_head_dim,
            qk_rope_head_dim: g.qk_rope_head_dim,
            v_head_dim: g.v_head_dim,
            indexer_head_dim: g.indexer.map_or(0, |i| i.head_dim),
        };
        // SAFETY: per the contract.
        unsafe { out.set(geometry) };
        Ok(())
    })
}
