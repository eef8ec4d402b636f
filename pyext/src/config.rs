//! `CacheConfig`: the Rust [`config::CacheConfig`], validated on creation and
//! immutable afterwards (derive a changed copy with `replace`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

use super::{errors, ints};
use mla_cache::config::{self, Dtype, EvictionPolicyKind, ModelGeometry};

/// Everything the block manager and the stores need to know: geometry,
/// storage format and cache policy. Immutable; ``replace(**changes)`` returns
/// a changed copy. Every argument but ``num_blocks`` is keyword-only.
///
/// - ``num_blocks``: physical blocks (shared by all layers), at most 2**31 - 1;
/// - ``block_size``: tokens per block (FlashMLA needs 64);
/// - ``num_layers``: layers cached per token;
/// - ``kv_lora_rank`` / ``rope_dim``: latent widths (512 / 64 for DeepSeek);
/// - ``dtype``: ``"bf16"``, ``"fp8_ds_mla"``, ``"mxfp6"`` or ``"nvfp4_ds_mla"``;
/// - ``enable_prefix_caching``: share full blocks between requests by hash;
/// - ``eviction``: order in which cached free blocks are reused: ``"arc"``
///   (the default, best on real traffic) or ``"lru"`` (vLLM's); every name
///   is in ``mla_cache.EVICTION_POLICIES``;
/// - ``hash_seed``: seed of the block hash chain, random when ``None``;
///   under an engine ``block_hash`` it plays vLLM's ``PYTHONHASHSEED``;
/// - ``block_hash``: ``"xxh3"`` (the library's own), or vLLM 0.33's
///   ``"sha256_cbor"`` / ``"xxhash_cbor"`` (hashes equal to vLLM's);
/// - ``verify_tokens``: compare token ids on every hit (no collision risk);
/// - ``pin_budget_blocks``: most blocks pinned at once (``None``: half);
/// - ``enable_events``: record events for ``BlockManager.take_events``;
/// - ``max_pending_events``: most events waiting for ``take_events``; more
///   are dropped and counted (``stats()["events_dropped"]``);
/// - ``cap_hit_at_last_token``: cap an admission's hit at ``len - 1`` tokens.
///
/// Raises ``ValueError`` for a configuration that cannot work.
#[pyclass(frozen, eq, module = "mla_cache")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig(pub(crate) config::CacheConfig);

#[pymethods]
impl CacheConfig {
    #[new]
    #[pyo3(signature = (
        num_blocks = 1024,
        *,
        block_size = 64,
        num_layers = 1,
        kv_lora_rank = 512,
        rope_dim = 64,
        dtype = "bf16",
        enable_prefix_caching = true,
        eviction = "arc",
        hash_seed = None,
        verify_tokens = false,
        pin_budget_blocks = None,
        enable_events = false,
        cap_hit_at_last_token = true,
        max_pending_events = 100_000,
        block_hash = "xxh3",
        indexer_head_dim = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = ints::size)] num_blocks: usize,
        #[pyo3(from_py_with = ints::size)] block_size: usize,
        #[pyo3(from_py_with = ints::size)] num_layers: usize,
        #[pyo3(from_py_with = ints::size)] kv_lora_rank: usize,
        #[pyo3(from_py_with = ints::size)] rope_dim: usize,
        dtype: &str,
        enable_prefix_caching: bool,
        eviction: &str,
        #[pyo3(from_py_with = ints::opt_u64)] hash_seed: Option<u64>,
        verify_tokens: bool,
        #[pyo3(from_py_with = ints::opt_size)] pin_budget_blocks: Option<usize>,
        enable_events: bool,
        cap_hit_at_last_token: bool,
        #[pyo3(from_py_with = ints::size)] max_pending_events: usize,
        block_hash: &str,
        #[pyo3(from_py_with = ints::opt_size)] indexer_head_dim: Option<usize>,
    ) -> PyResult<Self> {
        let config = config::CacheConfig {
            num_blocks,
            block_size,
            num_layers,
            kv_lora_rank,
            rope_dim,
            dtype: dtype.parse::<Dtype>().map_err(errors::to_py)?,
            indexer: indexer_head_dim.map(|head_dim| config::IndexerGeometry { head_dim }),
            enable_prefix_caching,
            eviction: eviction
                .parse::<EvictionPolicyKind>()
                .map_err(errors::to_py)?,
            hash_seed,
            block_hash: block_hash
                .parse::<config::BlockHashKind>()
                .map_err(errors::to_py)?,
            verify_tokens,
            pin_budget_blocks,
            enable_events,
            max_pending_events,
            cap_hit_at_last_token,
        };
        Self::checked(config)
    }

    /// A config for a model preset (``deepseek-v2``, ``deepseek-v2-lite``,
    /// ``deepseek-v3``, ``deepseek-r1``, ``deepseek-v3.2``, ``kimi-k2``), with
    /// the model's layer count and latent widths; ``overrides`` set any other
    /// field, as in the constructor.
    #[classmethod]
    #[pyo3(signature = (model, num_blocks = 1024, dtype = "bf16", **overrides))]
    fn preset<'py>(
        cls: &Bound<'py, PyType>,
        model: &str,
        #[pyo3(from_py_with = ints::size)] num_blocks: usize,
        dtype: &str,
        overrides: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dtype = dtype.parse::<Dtype>().map_err(errors::to_py)?;
        let config =
            config::CacheConfig::preset(model, num_blocks, dtype).map_err(errors::to_py)?;
        let base = Bound::new(cls.py(), Self::checked(config)?)?;
        match overrides {
            Some(kw) if !kw.is_empty() => Self::replace(&base, Some(kw)),
            _ => Ok(base.into_any()),
        }
    }

    /// Names of the model presets.
    #[staticmethod]
    fn presets() -> Vec<&'static str> {
        ModelGeometry::ALL.iter().map(|g| g.name).collect()
    }

    /// A copy with the given fields changed (validated like the constructor).
    #[pyo3(signature = (**changes))]
    fn replace<'py>(
        slf: &Bound<'py, Self>,
        changes: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fields = slf.get().to_dict(slf.py())?;
        if let Some(changes) = changes {
            fields.update(changes.as_mapping())?;
        }
        slf.get_type().call((), Some(&fields))
    }

    /// Every field as a dict (the constructor's keyword arguments).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.0;
        let d = PyDict::new(py);
        d.set_item("num_blocks", c.num_blocks)?;
        d.set_item("block_size", c.block_size)?;
        d.set_item("num_layers", c.num_layers)?;
        d.set_item("kv_lora_rank", c.kv_lora_rank)?;
        d.set_item("rope_dim", c.rope_dim)?;
        d.set_item("dtype", c.dtype.name())?;
        d.set_item("enable_prefix_caching", c.enable_prefix_caching)?;
        d.set_item("eviction", c.eviction.name())?;
        d.set_item("hash_seed", c.hash_seed)?;
        d.set_item("block_hash", c.block_hash.name())?;
        d.set_item("verify_tokens", c.verify_tokens)?;
        d.set_item("pin_budget_blocks", c.pin_budget_blocks)?;
        d.set_item("enable_events", c.enable_events)?;
        d.set_item("cap_hit_at_last_token", c.cap_hit_at_last_token)?;
        d.set_item("max_pending_events", c.max_pending_events)?;
        d.set_item("indexer_head_dim", c.indexer.map(|i| i.head_dim))?;
        Ok(d)
    }

    /// Physical blocks in the cache.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.0.num_blocks
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size
    }

    /// Layers cached per token.
    #[getter]
    fn num_layers(&self) -> usize {
        self.0.num_layers
    }

    /// Width of the compressed latent ``c_kv``.
    #[getter]
    fn kv_lora_rank(&self) -> usize {
        self.0.kv_lora_rank
    }

    /// Width of the decoupled RoPE key.
    #[getter]
    fn rope_dim(&self) -> usize {
        self.0.rope_dim
    }

    /// Storage format name: ``"bf16"``, ``"fp8_ds_mla"``, ``"mxfp6"`` or ``"nvfp4_ds_mla"``.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.0.dtype.name()
    }

    /// Width of the indexer keys cached beside the latent (``None``: no
    /// indexer; 128 for DeepSeek-V3.2).
    #[getter]
    fn indexer_head_dim(&self) -> Option<usize> {
        self.0.indexer.map(|i| i.head_dim)
    }

    /// Whether full blocks are shared between requests by prefix hash.
    #[getter]
    fn enable_prefix_caching(&self) -> bool {
        self.0.enable_prefix_caching
    }

    /// Eviction policy name.
    #[getter]
    fn eviction(&self) -> &'static str {
        self.0.eviction.name()
    }

    /// Seed of the block hash chain (``None``: random per manager).
    #[getter]
    fn hash_seed(&self) -> Option<u64> {
        self.0.hash_seed
    }

    /// How block hashes are computed (``"xxh3"``, ``"sha256_cbor"``, ``"xxhash_cbor"``).
    #[getter]
    fn block_hash(&self) -> &'static str {
        self.0.block_hash.name()
    }

    /// Whether token ids are compared on every prefix hit.
    #[getter]
    fn verify_tokens(&self) -> bool {
        self.0.verify_tokens
    }

    /// The pinned-block budget as set (``None``: half the cache).
    #[getter]
    fn pin_budget_blocks(&self) -> Option<usize> {
        self.0.pin_budget_blocks
    }

    /// Whether events are recorded for ``take_events``.
    #[getter]
    fn enable_events(&self) -> bool {
        self.0.enable_events
    }

    /// Most events waiting for ``take_events`` before new ones are dropped.
    #[getter]
    fn max_pending_events(&self) -> usize {
        self.0.max_pending_events
    }

    /// Whether an admission's hit is capped at ``len - 1`` tokens.
    #[getter]
    fn cap_hit_at_last_token(&self) -> bool {
        self.0.cap_hit_at_last_token
    }

    /// The pinned-block budget in effect.
    #[getter]
    fn pin_budget(&self) -> usize {
        self.0.pin_budget()
    }

    /// Elements cached per token and layer (``kv_lora_rank + rope_dim``).
    #[getter]
    fn elements_per_token(&self) -> usize {
        self.0.elements_per_token()
    }

    /// Bytes one token's latent takes in one layer.
    #[getter]
    fn latent_bytes_per_token_per_layer(&self) -> usize {
        self.0.latent_bytes_per_token_per_layer()
    }

    /// Bytes one token's indexer key takes in one layer (0 without one).
    #[getter]
    fn indexer_bytes_per_token_per_layer(&self) -> usize {
        self.0.indexer_bytes_per_token_per_layer()
    }

    /// Bytes one token takes in one layer (latent and indexer key).
    #[getter]
    fn bytes_per_token_per_layer(&self) -> usize {
        self.0.bytes_per_token_per_layer()
    }

    /// Bytes one token takes over all layers.
    #[getter]
    fn bytes_per_token(&self) -> usize {
        self.0.bytes_per_token()
    }

    /// Bytes one block takes in one layer.
    #[getter]
    fn bytes_per_block_per_layer(&self) -> usize {
        self.0.bytes_per_block_per_layer()
    }

    /// Bytes one block takes over all layers.
    #[getter]
    fn bytes_per_block(&self) -> usize {
        self.0.bytes_per_block()
    }

    /// Bytes the whole cache takes over all layers.
    #[getter]
    fn total_bytes(&self) -> usize {
        self.0.total_bytes()
    }

    /// Tokens the cache can hold.
    #[getter]
    fn num_tokens(&self) -> usize {
        self.0.num_tokens()
    }

    /// How many blocks (all layers) fit in ``n`` bytes.
    fn blocks_for_bytes(&self, #[pyo3(from_py_with = ints::u64_of)] n: u64) -> usize {
        self.0.blocks_for_bytes(n)
    }

    fn __repr__(&self) -> String {
        let c = &self.0;
        let d = config::CacheConfig::new(c.num_blocks);
        let mut s = format!(
            "CacheConfig(num_blocks={}, block_size={}, num_layers={}, kv_lora_rank={}, \
             rope_dim={}, dtype='{}'",
            c.num_blocks, c.block_size, c.num_layers, c.kv_lora_rank, c.rope_dim, c.dtype
        );
        let mut opt = |name: &str, differs: bool, value: String| {
            if differs {
                s.push_str(&format!(", {name}={value}"));
            }
        };
        let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
        let py_opt = |v: Option<String>| v.unwrap_or_else(|| "None".into());
        opt(
            "enable_prefix_caching",
            c.enable_prefix_caching != d.enable_prefix_caching,
            py_bool(c.enable_prefix_caching),
        );
        opt(
            "eviction",
            c.eviction != d.eviction,
            format!("'{}'", c.eviction),
        );
        opt(
            "hash_seed",
            c.hash_seed != d.hash_seed,
            py_opt(c.hash_seed.map(|v| v.to_string())),
        );
        opt(
            "block_hash",
            c.block_hash != d.block_hash,
            format!("'{}'", c.block_hash),
        );
        opt(
            "verify_tokens",
            c.verify_tokens != d.verify_tokens,
            py_bool(c.verify_tokens),
        );
        opt(
            "pin_budget_blocks",
            c.pin_budget_blocks != d.pin_budget_blocks,
            py_opt(c.pin_budget_blocks.map(|v| v.to_string())),
        );
        opt(
            "enable_events",
            c.enable_events != d.enable_events,
            py_bool(c.enable_events),
        );
        opt(
            "max_pending_events",
            c.max_pending_events != d.max_pending_events,
            c.max_pending_events.to_string(),
        );
        opt(
            "indexer_head_dim",
            c.indexer != d.indexer,
            py_opt(c.indexer.map(|i| i.head_dim.to_string())),
        );
        opt(
            "cap_hit_at_last_token",
            c.cap_hit_at_last_token != d.cap_hit_at_last_token,
            py_bool(c.cap_hit_at_last_token),
        );
        s.push(')');
        s
    }
}

impl CacheConfig {
    /// Validates `config`, plus the binding's own limit: block ids travel as
    /// numpy int32.
    fn checked(config: config::CacheConfig) -> PyResult<Self> {
        config.validate().map_err(errors::to_py)?;
        if config.num_blocks > i32::MAX as usize {
            return Err(PyValueError::new_err(format!(
                "num_blocks {} exceeds 2**31 - 1 (block ids are int32)",
                config.num_blocks
            )));
        }
        Ok(Self(config))
    }
}
