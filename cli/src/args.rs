//! Value parsers shared by the commands.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use mla_cache::{Dtype, EvictionPolicyKind, ModelGeometry};
use mla_cache_sim::units::parse_bytes;

/// A byte size such as `40GiB`, `512MiB` or `80GB`.
pub fn bytes(s: &str) -> Result<u64, String> {
    parse_bytes(s)
}

/// A write policy of the lower cache tiers.
pub fn write_policy(s: &str) -> Result<mla_cache::tier::WritePolicy, String> {
    s.parse().map_err(|e: mla_cache::Error| e.to_string())
}

/// A storage format; the help lists every one.
pub fn dtype() -> impl TypedValueParser<Value = Dtype> {
    PossibleValuesParser::new(Dtype::ALL.map(Dtype::name)).try_map(|s| s.parse::<Dtype>())
}

/// An eviction policy; the help lists every one the library offers.
pub fn eviction() -> impl TypedValueParser<Value = EvictionPolicyKind> {
    PossibleValuesParser::new(EvictionPolicyKind::ALL.map(EvictionPolicyKind::name))
        .try_map(|s| s.parse::<EvictionPolicyKind>())
}

/// A model preset (aliases such as `deepseek-r1` accepted).
pub fn model(s: &str) -> Result<ModelGeometry, String> {
    ModelGeometry::preset(s).map_err(|e| e.to_string())
}

/// A finite, non-negative number.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("expected a non-negative number, got {s:?}")),
    }
}
