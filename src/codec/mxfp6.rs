//! `mxfp6`: OCP MX FP6 (E2M3) codes with one UE8M0 scale per 32 values
//! (layout in `docs/formats.md`, section `mxfp6`).

use super::element::{Decoded, Element};
use super::minifloat::{ceil_log2, e2m3_from_f32, e2m3_to_f32, finite_amax, pow2, E2M3_MAX};

/// Values per group (one scale each).
pub const GROUP: usize = 32;
/// Packed bytes per group.
const GROUP_BYTES: usize = GROUP * 6 / 8;
/// Smallest scale, `2^-127` (UE8M0 byte 0; an f32 subnormal).
pub const MIN_SCALE: f32 = f32::from_bits(0x0040_0000);

/// Exponent `e` of a group's scale `2^e`:
/// `ceil(log2(max(amax / 7.5, 2^-127)))`, with `amax / 7.5` an f32 division
/// rounded to nearest and the `ceil(log2)` exact. Lies in `-127..=126`, so the
/// scale byte `e + 127` is never 255 (NaN).
pub fn group_exponent(amax: f32) -> i32 {
    ceil_log2((amax / E2M3_MAX).max(MIN_SCALE))
}

/// The scale a UE8M0 byte stands for; 255 is NaN.
pub fn ue8m0_to_f32(byte: u8) -> f32 {
    match byte {
        0 => MIN_SCALE,
        255 => f32::NAN,
        b => f32::from_bits(u32::from(b) << 23),
    }
}

/// Quantizes `c_kv` (a multiple of [`GROUP`] values) into `dst`
/// (`3 * c_kv.len() / 4 + c_kv.len() / GROUP` bytes).
pub(super) fn encode_nope<T: Element>(c_kv: &[T], dst: &mut [u8]) {
    let (packed, scales) = dst.split_at_mut(c_kv.len() / GROUP * GROUP_BYTES);
    let mut x = [0f32; GROUP];
    let mut codes = [0u8; GROUP];
    for ((src, packed), scale) in c_kv
        .chunks_exact(GROUP)
        .zip(packed.chunks_exact_mut(GROUP_BYTES))
        .zip(scales.iter_mut())
    {
        T::widen(src, &mut x);
        let e = group_exponent(finite_amax(&x));
        // Multiplying by 2^-e (a normal f32) equals dividing by 2^e.
        let inv = pow2(-e);
        for (c, &v) in codes.iter_mut().zip(x.iter()) {
            *c = e2m3_from_f32(v * inv);
        }
        for (four, three) in codes.chunks_exact(4).zip(packed.chunks_exact_mut(3)) {
            let word = u32::from(four[0])
                | u32::from(four[1]) << 6
                | u32::from(four[2]) << 12
                | u32::from(four[3]) << 18;
            three.copy_from_slice(&word.to_le_bytes()[..3]);
        }
        *scale = (e + 127) as u8;
    }
}

/// Dequantizes `out.len()` values from `src`: `e2m3(code) * 2^(byte - 127)`.
pub(super) fn decode_nope<O: Decoded>(src: &[u8], out: &mut [O]) {
    let (packed, scales) = src.split_at(out.len() / GROUP * GROUP_BYTES);
    for ((packed, &scale), out) in packed
        .chunks_exact(GROUP_BYTES)
        .zip(scales)
        .zip(out.chunks_exact_mut(GROUP))
    {
        let scale = ue8m0_to_f32(scale);
        for (three, out) in packed.chunks_exact(3).zip(out.chunks_exact_mut(4)) {
            let word = u32::from_le_bytes([three[0], three[1], three[2], 0]);
            for (k, o) in out.iter_mut().enumerate() {
                *o = O::from_f32(e2m3_to_f32((word >> (6 * k)) as u8 & 0x3F) * scale);
            }
        }
    }
}
