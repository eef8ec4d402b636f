//! Scalar conversions between f32 and the small float types of the formats:
//! bf16, float8 e4m3fn, 6-bit E2M3, 4-bit E2M1, and power-of-two scales.
//!
//! Every function is branch-free on its data path (selects only), total (no
//! panics for any input) and defined bit for bit, so that a GPU kernel can
//! mirror it exactly. None of them flushes subnormals to zero.

/// Rounds an f32 to bf16 bits, nearest even; every NaN becomes `0x7FFF` (the
/// canonical NaN of CUDA's `__float2bfloat16_rn`). Overflow rounds to ±Inf
/// as IEEE rounding does.
#[inline(always)]
pub fn bf16_bits_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
    if (bits & 0x7FFF_FFFF) > 0x7F80_0000 {
        0x7FFF
    } else {
        rounded
    }
}

/// Largest finite float8 e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;
/// Largest E2M3 value.
pub const E2M3_MAX: f32 = 7.5;
/// Largest E2M1 value.
pub const E2M1_MAX: f32 = 6.0;

/// Rounds `q` to a float with `MAN` stored mantissa bits whose exponent field
/// is biased by `BIAS` (smallest normal `2^(1 - BIAS)`), saturating at `max`;
/// returns the magnitude code (exponent and mantissa fields, no sign).
/// `q` must not be NaN; ±Inf saturates.
#[inline(always)]
fn round_magnitude<const BIAS: u32, const MAN: u32>(q: f32, max: f32) -> u32 {
    let a = q.abs().min(max);
    let bits = a.to_bits();
    // Normal range: round the f32 mantissa to MAN bits (nearest even) and
    // rebias the exponent; a carry moves into the exponent as it should.
    let drop = 23 - MAN;
    let normal = (bits.wrapping_add((1 << (drop - 1)) - 1 + ((bits >> drop) & 1)) >> drop)
        .wrapping_sub((127 - BIAS) << MAN);
    // Subnormal range: adding 2^(24 - MAN - BIAS) makes the f32 adder round
    // `a` to a multiple of the subnormal quantum 2^(1 - MAN - BIAS); the low
    // bits are the code (2^MAN means the smallest normal, which is right).
    let magic = f32::from_bits((127 + 24 - MAN - BIAS) << 23);
    let subnormal = (a + magic).to_bits().wrapping_sub(magic.to_bits());
    let min_normal = f32::from_bits((128 - BIAS) << 23);
    if a < min_normal {
        subnormal
    } else {
        normal
    }
}

/// Encodes `q` as float8 e4m3fn, round to nearest even, saturating to ±448;
/// NaN encodes as `+0` (`0x00`), ±Inf as ±448. Never produces a NaN code.
#[inline(always)]
pub fn e4m3_from_f32(q: f32) -> u8 {
    let q = if q.is_nan() { 0.0 } else { q };
    let sign = (q.to_bits() >> 24) & 0x80;
    (sign | round_magnitude::<7, 3>(q, E4M3_MAX)) as u8
}

/// Encodes `q` as float8 e4m3fn as PTX `cvt.rn.satfinite.e4m3x2.f32` does:
/// like [`e4m3_from_f32`], except that NaN encodes as NaN (`0x7F` with the
/// input's sign bit).
#[inline(always)]
pub fn e4m3_satfinite_from_f32(q: f32) -> u8 {
    if q.is_nan() {
        0x7F | ((q.to_bits() >> 24) & 0x80) as u8
    } else {
        e4m3_from_f32(q)
    }
}

/// Decodes a float8 e4m3fn code (exact); `0x7F` and `0xFF` are NaN.
#[inline(always)]
pub fn e4m3_to_f32(code: u8) -> f32 {
    let c = u32::from(code);
    // Place exponent and mantissa fields in an f32 and rebias by 2^(127-7);
    // f32 subnormals take care of e4m3 subnormals.
    let magnitude = f32::from_bits((c & 0x7F) << 20) * f32::from_bits((127 + 120) << 23);
    let value = f32::from_bits(magnitude.to_bits() | ((c & 0x80) << 24));
    if c & 0x7F == 0x7F {
        f32::NAN
    } else {
        value
    }
}

/// Encodes `q` as a 6-bit E2M3 code (bits `[5]` sign, `[4:3]` exponent,
/// `[2:0]` mantissa), round to nearest even, saturating to ±7.5; NaN encodes
/// as `+0`, ±Inf as ±7.5.
#[inline(always)]
pub fn e2m3_from_f32(q: f32) -> u8 {
    let q = if q.is_nan() { 0.0 } else { q };
    let sign = (q.to_bits() >> 26) & 0x20;
    (sign | round_magnitude::<1, 3>(q, E2M3_MAX)) as u8
}

/// Decodes a 6-bit E2M3 code (exact); bits above the low 6 are ignored.
#[inline(always)]
pub fn e2m3_to_f32(code: u8) -> f32 {
    let c = u32::from(code);
    let magnitude = f32::from_bits((c & 0x1F) << 20) * f32::from_bits((127 + 126) << 23);
    f32::from_bits(magnitude.to_bits() | ((c & 0x20) << 26))
}

/// Encodes `q` as a 4-bit E2M1 code (bit 3 sign, bits 2:1 exponent, bit 0
/// mantissa) as PTX `cvt.rn.satfinite.e2m1x2.f32` does: round to nearest
/// even, saturating to ±6, the sign kept for zeros and underflows, and NaN
/// encoded as `+6` (`0x7`).
#[inline(always)]
pub fn e2m1_from_f32(q: f32) -> u8 {
    // A select, not a branch, so that loops over values vectorize.
    let q = if q.is_nan() { E2M1_MAX } else { q };
    let sign = (q.to_bits() >> 28) & 0x8;
    (sign | round_magnitude::<1, 1>(q, E2M1_MAX)) as u8
}

/// Decodes a 4-bit E2M1 code (exact); bits above the low 4 are ignored.
#[inline(always)]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let c = u32::from(code);
    let magnitude = f32::from_bits((c & 0x7) << 22) * f32::from_bits((127 + 126) << 23);
    f32::from_bits(magnitude.to_bits() | ((c & 0x8) << 28))
}

/// `ceil(log2(v))`, exactly, for a positive finite `v` (normal or subnormal).
/// Computed from the bits, not from a rounded `log2f`.
#[inline]
pub fn ceil_log2(v: f32) -> i32 {
    let bits = v.to_bits() & 0x7FFF_FFFF;
    let exponent = (bits >> 23) as i32;
    let mantissa = bits & 0x7F_FFFF;
    if exponent == 0 {
        // v = mantissa * 2^-149.
        -149 + (32 - mantissa.max(1).wrapping_sub(1).leading_zeros()) as i32
    } else {
        exponent - 127 + i32::from(mantissa != 0)
    }
}

/// `2^e` for `-126 <= e <= 127` (a normal f32).
#[inline]
pub fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Largest finite magnitude among `values`, ignoring NaN and ±Inf (0 if
/// there is none).
#[inline(always)]
pub fn finite_amax(values: &[f32]) -> f32 {
    // Eight independent lanes, so the loop compiles to packed compares and
    // selects without reassociating a float reduction.
    const LANES: usize = 8;
    #[inline(always)]
    fn finite_abs(v: f32) -> f32 {
        let a = v.abs();
        if a <= f32::MAX {
            a
        } else {
            0.0
        }
    }
    let mut lanes = [0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            let a = finite_abs(v);
            *m = if a > *m { a } else { *m };
        }
    }
    for (m, &v) in lanes.iter_mut().zip(rest) {
        let a = finite_abs(v);
        *m = if a > *m { a } else { *m };
    }
    lanes.iter().fold(0f32, |m, &a| if a > m { a } else { m })
}

/// Largest magnitude among `values`, ignoring NaN but not ±Inf (0 if there
/// is none), as a chain of IEEE `maxNum` starting from 0 computes it.
#[inline(always)]
pub fn amax_ignoring_nan(values: &[f32]) -> f32 {
    values
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m { v.abs() } else { m })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_every_code_round_trips() {
        for code in 0..=255u8 {
            let v = e4m3_to_f32(code);
            if code & 0x7F == 0x7F {
                assert!(v.is_nan());
            } else {
                assert_eq!(e4m3_from_f32(v), code, "code {code:#x} value {v}");
            }
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    }

    #[test]
    fn e2m3_every_code_round_trips() {
        for code in 0..64u8 {
            assert_eq!(e2m3_from_f32(e2m3_to_f32(code)), code);
        }
        assert_eq!(e2m3_to_f32(0x1F), 7.5);
        assert_eq!(e2m3_to_f32(0x01), 0.125);
        assert_eq!(e2m3_to_f32(0x08), 1.0);
        assert_eq!(e2m3_to_f32(0x3F), -7.5);
    }

    #[test]
    fn ties_round_to_even_and_saturate() {
        // 0.0625 lies halfway between 0 and 0.125: even is 0.
        assert_eq!(e2m3_from_f32(0.0625), 0);
        assert_eq!(e2m3_from_f32(0.1875), 2); // between 0.125 (1) and 0.25 (2)
        assert_eq!(e2m3_from_f32(7.25), 0x1E); // 7.0 and 7.5: even mantissa 6
        assert_eq!(e2m3_from_f32(100.0), 0x1F);
        assert_eq!(e2m3_from_f32(f32::NEG_INFINITY), 0x3F);
        assert_eq!(e4m3_from_f32(464.0), 0x7E);
        assert_eq!(e4m3_from_f32(1e30), 0x7E);
        assert_eq!(e4m3_from_f32(-f32::INFINITY), 0xFE);
        assert_eq!(e4m3_from_f32(f32::NAN), 0);
        assert_eq!(e4m3_from_f32(-0.0), 0x80);
        assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0); // half the smallest subnormal
    }

    #[test]
    fn e2m1_every_code_round_trips_and_rounds_like_the_ptx_conversion() {
        let values = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for code in 0..16u8 {
            let v = e2m1_to_f32(code);
            assert_eq!(v.abs(), values[usize::from(code & 7)]);
            assert_eq!(v.is_sign_negative(), code & 8 != 0);
            assert_eq!(e2m1_from_f32(v), code);
        }
        assert_eq!(e2m1_from_f32(0.25), 0); // tie: 0 is even
        assert_eq!(e2m1_from_f32(0.2500001), 1);
        assert_eq!(e2m1_from_f32(0.75), 2); // tie between 0.5 and 1: even is 1
        assert_eq!(e2m1_from_f32(1.25), 2); // tie: 1.0 is even
        assert_eq!(e2m1_from_f32(2.5), 4); // tie: 2.0 is even
        assert_eq!(e2m1_from_f32(3.5), 6); // tie: 4.0 is even
        assert_eq!(e2m1_from_f32(5.0), 6); // tie: 4.0 is even
        assert_eq!(e2m1_from_f32(5.0000005), 7);
        assert_eq!(e2m1_from_f32(-1e30), 0xF);
        assert_eq!(e2m1_from_f32(f32::INFINITY), 7);
        assert_eq!(e2m1_from_f32(f32::NAN), 7);
        assert_eq!(e2m1_from_f32(-f32::NAN), 7);
        assert_eq!(e2m1_from_f32(-0.1), 8);
        assert_eq!(e2m1_from_f32(-0.0), 8);
        assert_eq!(e2m1_from_f32(f32::from_bits(1)), 0);
    }

    #[test]
    fn satfinite_e4m3_keeps_nan() {
        assert_eq!(e4m3_satfinite_from_f32(f32::NAN), 0x7F);
        assert_eq!(e4m3_satfinite_from_f32(-f32::NAN), 0xFF);
        assert_eq!(e4m3_satfinite_from_f32(f32::INFINITY), 0x7E);
        assert_eq!(e4m3_satfinite_from_f32(-500.0), 0xFE);
        assert_eq!(e4m3_satfinite_from_f32(1.0), e4m3_from_f32(1.0));
    }

    #[test]
    fn ceil_log2_is_exact() {
        assert_eq!(ceil_log2(1.0), 0);
        assert_eq!(ceil_log2(1.0000001), 1);
        assert_eq!(ceil_log2(0.75), 0);
        assert_eq!(ceil_log2(1e-4), -13);
        assert_eq!(ceil_log2(2f32.powi(-127)), -127);
        assert_eq!(ceil_log2(f32::from_bits(1)), -149);
        assert_eq!(ceil_log2(f32::from_bits(3)), -147);
        assert_eq!(ceil_log2(f32::MAX), 128);
        assert_eq!(pow2(-126), f32::MIN_POSITIVE);
    }

    #[test]
    fn bf16_rounding_matches_half_except_nan() {
        // Ties to even, down (0x3F80_8000) and up (0x3F81_8000), overflow,
        // subnormals, infinity.
        let ties = [f32::from_bits(0x3F80_8000), f32::from_bits(0x3F81_8000)];
        for x in [
            1.0f32,
            ties[0],
            ties[1],
            -3.4e38,
            f32::MAX,
            1e-40,
            f32::INFINITY,
        ] {
            assert_eq!(
                bf16_bits_from_f32(x),
                half::bf16::from_f32(x).to_bits(),
                "{x}"
            );
        }
        assert_eq!(bf16_bits_from_f32(f32::NAN), 0x7FFF);
        assert_eq!(bf16_bits_from_f32(-f32::NAN), 0x7FFF);
    }

    #[test]
    fn amax_ignoring_nan_keeps_infinity() {
        assert_eq!(amax_ignoring_nan(&[1.0, -3.0, f32::NAN]), 3.0);
        assert_eq!(amax_ignoring_nan(&[1.0, f32::NEG_INFINITY]), f32::INFINITY);
        assert_eq!(amax_ignoring_nan(&[f32::NAN, -0.0]), 0.0);
        assert_eq!(amax_ignoring_nan(&[]), 0.0);
    }

    #[test]
    fn amax_ignores_non_finite() {
        assert_eq!(finite_amax(&[1.0, -3.0, f32::NAN, f32::NEG_INFINITY]), 3.0);
        assert_eq!(finite_amax(&[]), 0.0);
        let mut many = [1.0f32; 37];
        many[36] = -5.0;
        many[9] = f32::INFINITY;
        assert_eq!(finite_amax(&many), 5.0);
    }
}
