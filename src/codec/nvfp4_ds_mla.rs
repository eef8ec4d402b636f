//! `nvfp4_ds_mla`: vLLM's NVFP4 layout for DeepSeek-V3.2. Per 16 NoPE values
//! one float8 e4m3 scale and 16 E2M1 codes packed two per byte; the RoPE
//! values as unscaled e4m3 (layout in `docs/formats.md`, section
//! `nvfp4_ds_mla`).
//!
//! A token is `[R/2 packed codes][P e4m3 RoPE][R/16 e4m3 scales]`, the scales
//! stored transposed: the scale of group `s` lies at byte
//! `(R/64) * (s % 4) + s / 4` of the scale section (`8 * (s & 3) + (s >> 2)`
//! for `R = 512`).

use super::element::{Decoded, Element};
use super::minifloat::{
    amax_ignoring_nan, e2m1_from_f32, e2m1_to_f32, e4m3_from_f32, e4m3_satfinite_from_f32,
    e4m3_to_f32, E2M1_MAX,
};

/// Values per group (one scale each).
pub const GROUP: usize = 16;
/// Packed bytes per group.
const GROUP_BYTES: usize = GROUP / 2;
/// Smallest scale, `2^-9` (the smallest e4m3 subnormal).
pub const MIN_SCALE: f32 = 0.001_953_125;

/// The e4m3 scale code of a group whose largest magnitude is `amax`:
/// `e4m3(max(amax / 6, 2^-9))`, with `amax / 6` an f32 division rounded to
/// nearest and the e4m3 rounding to nearest even, saturating at 448.
pub fn group_scale(amax: f32) -> u8 {
    e4m3_from_f32((amax / E2M1_MAX).max(MIN_SCALE))
}

/// Byte of the scale section holding the scale of group `group`, for
/// `groups` groups (a multiple of 4): a 4-row transpose.
pub fn scale_byte(group: usize, groups: usize) -> usize {
    groups / 4 * (group % 4) + group / 4
}

/// Quantizes `c_kv` (a multiple of 4 * [`GROUP`] values) into `codes`
/// (`c_kv.len() / 2` bytes) and `scales` (`c_kv.len() / 16` bytes).
pub(super) fn encode_nope<T: Element>(c_kv: &[T], codes: &mut [u8], scales: &mut [u8]) {
    let groups = c_kv.len() / GROUP;
    let mut x = [0f32; GROUP];
    let mut codes_of_group = [0u8; GROUP];
    for (g, (src, packed)) in c_kv
        .chunks_exact(GROUP)
        .zip(codes.chunks_exact_mut(GROUP_BYTES))
        .enumerate()
    {
        T::widen(src, &mut x);
        let scale = group_scale(amax_ignoring_nan(&x));
        // The f32 reciprocal of the scale, then a product (not a division).
        let inv = 1.0 / e4m3_to_f32(scale);
        for (c, &v) in codes_of_group.iter_mut().zip(x.iter()) {
            *c = e2m1_from_f32(v * inv);
        }
        for (byte, pair) in packed.iter_mut().zip(codes_of_group.chunks_exact(2)) {
            *byte = pair[0] | pair[1] << 4;
        }
        scales[scale_byte(g, groups)] = scale;
    }
}

/// Writes the RoPE values `k_pe` as e4m3 codes into `dst` (`k_pe.len()`
/// bytes), NaN kept as NaN.
pub(super) fn encode_rope<T: Element>(k_pe: &[T], dst: &mut [u8]) {
    let mut x = [0f32; GROUP];
    for (src, out) in k_pe.chunks(GROUP).zip(dst.chunks_mut(GROUP)) {
        let x = &mut x[..src.len()];
        T::widen(src, x);
        for (o, &v) in out.iter_mut().zip(x.iter()) {
            *o = e4m3_satfinite_from_f32(v);
        }
    }
}

/// Dequantizes `out.len()` values from `codes` and `scales`:
/// `e2m1(code) * e4m3(scale)`; a NaN scale gives NaN.
pub(super) fn decode_nope<O: Decoded>(codes: &[u8], scales: &[u8], out: &mut [O]) {
    let groups = out.len() / GROUP;
    for (g, (packed, out)) in codes
        .chunks_exact(GROUP_BYTES)
        .zip(out.chunks_exact_mut(GROUP))
        .enumerate()
    {
        let scale = e4m3_to_f32(scales[scale_byte(g, groups)]);
        // The group's 16 possible values, by code.
        let mut values = [0f32; 16];
        for (code, v) in (0u8..).zip(values.iter_mut()) {
            *v = if scale.is_nan() {
                f32::NAN
            } else {
                e2m1_to_f32(code) * scale
            };
        }
        for (&byte, pair) in packed.iter().zip(out.chunks_exact_mut(2)) {
            pair[0] = O::from_f32(values[usize::from(byte & 0xF)]);
            pair[1] = O::from_f32(values[usize::from(byte >> 4)]);
        }
    }
}

/// Decodes `out.len()` e4m3 RoPE codes from `src`.
pub(super) fn decode_rope<O: Decoded>(src: &[u8], out: &mut [O]) {
    for (o, &c) in out.iter_mut().zip(src) {
        *o = O::from_f32(e4m3_to_f32(c));
    }
}
