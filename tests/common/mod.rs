//! Test data shared by the codec and store tests.
#![allow(dead_code)]

use half::{bf16, f16};
use mla_cache::codec::{ElemType, Values};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A seeded generator.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// A standard normal sample (Box-Muller).
pub fn normal(rng: &mut StdRng) -> f32 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// `tokens` rows of `width` Gaussian values; the channels in `outliers` are
/// scaled by `outlier_gain` (activations with a few large channels).
pub fn gaussian_rows(
    rng: &mut StdRng,
    tokens: usize,
    width: usize,
    outliers: &[usize],
    outlier_gain: f32,
) -> Vec<f32> {
    let mut v = Vec::with_capacity(tokens * width);
    for _ in 0..tokens {
        for c in 0..width {
            let g = if outliers.contains(&c) {
                outlier_gain
            } else {
                1.0
            };
            v.push(normal(rng) * g);
        }
    }
    v
}

/// The same values in every input type; the f32 values are first rounded to
/// bf16 so that all three hold identical numbers.
pub struct TypedRows {
    /// bf16 copy.
    pub bf16: Vec<bf16>,
    /// f16 copy (may round differently; used as its own input).
    pub f16: Vec<f16>,
    /// f32 copy.
    pub f32: Vec<f32>,
}

impl TypedRows {
    /// Converts `values` into every input type.
    pub fn new(values: &[f32]) -> Self {
        Self {
            bf16: values.iter().map(|&v| bf16::from_f32(v)).collect(),
            f16: values.iter().map(|&v| f16::from_f32(v)).collect(),
            f32: values.to_vec(),
        }
    }

    /// The copy of type `elem`.
    pub fn get(&self, elem: ElemType) -> Values<'_> {
        match elem {
            ElemType::Bf16 => Values::Bf16(&self.bf16),
            ElemType::F16 => Values::F16(&self.f16),
            ElemType::F32 => Values::F32(&self.f32),
        }
    }
}

/// The input values as f32 (exact widening), whatever their type.
pub fn widen(values: Values<'_>) -> Vec<f32> {
    match values {
        Values::Bf16(s) => s.iter().map(|v| v.to_f32()).collect(),
        Values::F16(s) => s.iter().map(|v| v.to_f32()).collect(),
        Values::F32(s) => s.to_vec(),
    }
}

/// Relative RMS error `sqrt(sum (a - b)^2 / sum b^2)`.
pub fn relative_rms(approx: &[f32], exact: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&a, &b) in approx.iter().zip(exact) {
        num += (f64::from(a) - f64::from(b)).powi(2);
        den += f64::from(b).powi(2);
    }
    (num / den).sqrt()
}
