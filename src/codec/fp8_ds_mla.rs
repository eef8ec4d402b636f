//! `fp8_ds_mla`: FlashMLA's fp8 layout. Per 128-value tile, one fp32
//! power-of-two scale and 128 float8 e4m3fn codes (layout in
//! `docs/formats.md`, section `fp8_ds_mla`).

use super::element::{Decoded, Element};
use super::minifloat::{ceil_log2, e4m3_from_f32, e4m3_to_f32, finite_amax, pow2, E4M3_MAX};

/// Values per tile (one scale each).
pub const TILE: usize = 128;
/// Smallest scale before rounding up to a power of two (FlashMLA's margin).
pub const MIN_SCALE: f32 = 1e-4;

/// Exponent `e` of a tile's scale `2^e`:
/// `ceil(log2(max(amax / 448, 1e-4)))`, with `amax / 448` an f32 division
/// rounded to nearest and the `ceil(log2)` exact. Lies in `-13..=120`.
pub fn tile_exponent(amax: f32) -> i32 {
    ceil_log2((amax / E4M3_MAX).max(MIN_SCALE))
}

/// Quantizes `c_kv` (a multiple of [`TILE`] values) into `dst`
/// (`c_kv.len() + 4 * c_kv.len() / TILE` bytes).
pub(super) fn encode_nope<T: Element>(c_kv: &[T], dst: &mut [u8]) {
    let (codes, scales) = dst.split_at_mut(c_kv.len());
    let mut x = [0f32; TILE];
    for ((src, codes), scale) in c_kv
        .chunks_exact(TILE)
        .zip(codes.chunks_exact_mut(TILE))
        .zip(scales.chunks_exact_mut(4))
    {
        T::widen(src, &mut x);
        let e = tile_exponent(finite_amax(&x));
        // Multiplying by 2^-e equals dividing by 2^e, rounding included.
        let inv = pow2(-e);
        for (c, &v) in codes.iter_mut().zip(x.iter()) {
            *c = e4m3_from_f32(v * inv);
        }
        scale.copy_from_slice(&pow2(e).to_le_bytes());
    }
}

/// Dequantizes `out.len()` values from `src`: `e4m3(code) * scale`.
pub(super) fn decode_nope<O: Decoded>(src: &[u8], out: &mut [O]) {
    let (codes, scales) = src.split_at(out.len());
    for ((codes, scale), out) in codes
        .chunks_exact(TILE)
        .zip(scales.chunks_exact(4))
        .zip(out.chunks_exact_mut(TILE))
    {
        let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
        for (o, &c) in out.iter_mut().zip(codes) {
            *o = O::from_f32(e4m3_to_f32(c) * scale);
        }
    }
}
