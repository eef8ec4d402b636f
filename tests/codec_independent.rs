//! An independent decoder and reference quantizer, written from the format
//! definitions (`docs/formats.md`) with f64
//! arithmetic and bit-by-bit unpacking; it shares no code with the crate's
//! encoder. Both directions are compared bit for bit.

mod common;

use half::bf16;
use mla_cache::codec::{Codec, ElemType, Values};
use mla_cache::Dtype;
use proptest::prelude::*;
use rand::Rng;

const RANK: usize = 512;
const ROPE: usize = 64;

/// float8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN.
fn e4m3_value(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 3) & 0xF);
    let m = f64::from(b & 7);
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

/// E2M3: sign, 2 exponent bits (bias 1), 3 mantissa bits, no NaN or Inf.
fn e2m3_value(c: u8) -> f64 {
    let sign = if c & 0x20 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((c >> 3) & 3);
    let m = f64::from(c & 7);
    if e == 0 {
        sign * m / 8.0
    } else {
        sign * (1.0 + m / 8.0) * 2f64.powi(e - 1)
    }
}

/// E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit, no NaN or Inf.
fn e2m1_value(c: u8) -> f64 {
    let sign = if c & 0x8 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((c >> 1) & 3);
    let m = f64::from(c & 1);
    if e == 0 {
        sign * m / 2.0
    } else {
        sign * (1.0 + m / 2.0) * 2f64.powi(e - 1)
    }
}

/// nvfp4_ds_mla: where the scale of 16-value group `s` lies (bytes 320..352).
fn nvfp4_scale_at(s: usize) -> usize {
    320 + 8 * (s & 3) + (s >> 2)
}

/// bf16 from its bits: sign, 8 exponent bits (bias 127), 7 mantissa bits.
fn bf16_value(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((bits >> 7) & 0xFF);
    let m = f64::from(bits & 0x7F);
    match e {
        255 if m == 0.0 => sign * f64::INFINITY,
        255 => f64::NAN,
        0 => sign * m / 128.0 * 2f64.powi(-126),
        _ => sign * (1.0 + m / 128.0) * 2f64.powi(e - 127),
    }
}

fn le_u16(bytes: &[u8], i: usize) -> u16 {
    u16::from(bytes[2 * i]) | u16::from(bytes[2 * i + 1]) << 8
}

/// Bit `i` of a little-endian bit stream.
fn stream_bit(bytes: &[u8], i: usize) -> u8 {
    (bytes[i / 8] >> (i % 8)) & 1
}

/// Decodes one latent from the definition, in f64.
fn reference_decode(dtype: Dtype, bytes: &[u8]) -> Vec<f64> {
    let mut out = Vec::with_capacity(RANK + ROPE);
    let rope_at = match dtype {
        Dtype::Bf16 => {
            out.extend((0..RANK).map(|i| bf16_value(le_u16(bytes, i))));
            1024
        }
        Dtype::Fp8DsMla => {
            for i in 0..RANK {
                let t = i / 128;
                let s = &bytes[512 + 4 * t..512 + 4 * t + 4];
                let scale = f64::from(f32::from_bits(u32::from_le_bytes([s[0], s[1], s[2], s[3]])));
                out.push(e4m3_value(bytes[i]) * scale);
            }
            528
        }
        Dtype::Mxfp6 => {
            for i in 0..RANK {
                let mut code = 0u8;
                for k in 0..6 {
                    code |= stream_bit(bytes, 6 * i + k) << k;
                }
                let scale_byte = bytes[384 + i / 32];
                let scale = if scale_byte == 255 {
                    f64::NAN
                } else {
                    2f64.powi(i32::from(scale_byte) - 127)
                };
                out.push(e2m3_value(code) * scale);
            }
            400
        }
        Dtype::Nvfp4DsMla => {
            for i in 0..RANK {
                let code = (bytes[i / 2] >> (4 * (i % 2))) & 0xF;
                out.push(e2m1_value(code) * e4m3_value(bytes[nvfp4_scale_at(i / 16)]));
            }
            // The RoPE values are e4m3 codes, bytes 256..320.
            out.extend((0..ROPE).map(|i| e4m3_value(bytes[256 + i])));
            return out;
        }
    };
    let rope = &bytes[rope_at..];
    out.extend((0..ROPE).map(|i| bf16_value(le_u16(rope, i))));
    out
}

/// The positive magnitudes of a format, by code (codes 0..n).
fn grid(dtype: Dtype) -> Vec<f64> {
    match dtype {
        Dtype::Fp8DsMla => (0..0x7Fu8).map(e4m3_value).collect(),
        Dtype::Mxfp6 => (0..0x20u8).map(e2m3_value).collect(),
        Dtype::Nvfp4DsMla => (0..8u8).map(e2m1_value).collect(),
        Dtype::Bf16 => unreachable!(),
    }
}

/// The code of the grid value nearest to `t` (ties to the even code), with
/// saturation at the top.
fn nearest(grid: &[f64], t: f64) -> usize {
    let t = t.abs();
    if t >= grid[grid.len() - 1] {
        return grid.len() - 1;
    }
    let mut best = 0;
    for (code, &g) in grid.iter().enumerate() {
        let (d, db) = ((g - t).abs(), (grid[best] - t).abs());
        if d < db || (d == db && code % 2 == 0 && best % 2 == 1) {
            best = code;
        }
    }
    best
}

/// bf16 bits of an f32 by the codec's rule: nearest even, NaN -> 0x7FFF.
fn reference_bf16(x: f32) -> u16 {
    if x.is_nan() {
        0x7FFF
    } else {
        bf16::from_f32(x).to_bits()
    }
}

/// Encodes one latent (values already widened to f32; `rope_bf16` holds the
/// RoPE bits as the input type dictates) from the definition.
fn reference_encode(dtype: Dtype, nope: &[f32], nope_bf16: &[u16], rope_bf16: &[u16]) -> Vec<u8> {
    let mut out = Vec::new();
    match dtype {
        Dtype::Bf16 => out.extend(nope_bf16.iter().flat_map(|b| b.to_le_bytes())),
        Dtype::Nvfp4DsMla => unreachable!("see reference_encode_nvfp4"),
        Dtype::Fp8DsMla | Dtype::Mxfp6 => {
            let (group, max, floor) = if dtype == Dtype::Fp8DsMla {
                (128, 448f32, 1e-4f32)
            } else {
                (32, 7.5f32, (2f64.powi(-127)) as f32)
            };
            let grid = grid(dtype);
            let mut codes = Vec::new();
            let mut scales = Vec::new();
            for g in nope.chunks(group) {
                let amax = g
                    .iter()
                    .filter(|x| x.is_finite())
                    .fold(0f32, |m, x| m.max(x.abs()));
                let v = f64::from((amax / max).max(floor));
                let mut e = -160;
                while 2f64.powi(e) < v {
                    e += 1;
                }
                for &x in g {
                    let sign_bit = if x.is_nan() {
                        0
                    } else {
                        u8::from(x.is_sign_negative())
                    };
                    let t = if x.is_nan() {
                        0.0
                    } else {
                        f64::from(x) / 2f64.powi(e)
                    };
                    let code = nearest(&grid, t) as u8;
                    codes.push(code | sign_bit << if dtype == Dtype::Fp8DsMla { 7 } else { 5 });
                }
                scales.push(e);
            }
            if dtype == Dtype::Fp8DsMla {
                out.extend(&codes);
                for e in scales {
                    out.extend((2f64.powi(e) as f32).to_le_bytes());
                }
            } else {
                let mut packed = vec![0u8; RANK * 6 / 8];
                for (i, &c) in codes.iter().enumerate() {
                    for k in 0..6 {
                        let bit = 6 * i + k;
                        packed[bit / 8] |= ((c >> k) & 1) << (bit % 8);
                    }
                }
                out.extend(packed);
                out.extend(scales.iter().map(|&e| (e + 127) as u8));
            }
        }
    }
    out.extend(rope_bf16.iter().flat_map(|b| b.to_le_bytes()));
    out
}

/// The e4m3 code of `x` as PTX's `cvt.rn.satfinite` gives it: nearest, ties
/// to even, saturating at 448, NaN as NaN (`0x7F` with its sign).
fn reference_e4m3_satfinite(x: f32) -> u8 {
    let sign = u8::from(x.is_sign_negative()) << 7;
    if x.is_nan() {
        return 0x7F | sign;
    }
    nearest(&grid(Dtype::Fp8DsMla), f64::from(x)) as u8 | sign
}

/// Encodes one `nvfp4_ds_mla` latent from the definition: per 16 values the
/// scale `e4m3(max(f32(amax / 6), 2^-9))` (amax over the non-NaN values), the
/// codes `e2m1(f32(x * f32(1 / scale)))` (NaN as +6, the sign kept
/// otherwise), then the RoPE values as e4m3.
fn reference_encode_nvfp4(nope: &[f32], rope: &[f32]) -> Vec<u8> {
    let grid = grid(Dtype::Nvfp4DsMla);
    let mut out = vec![0u8; 352];
    for (s, g) in nope.chunks(16).enumerate() {
        let amax = g
            .iter()
            .filter(|x| !x.is_nan())
            .fold(0f64, |m, &x| m.max(f64::from(x).abs()));
        let pre = ((amax / 6.0) as f32).max(2f32.powi(-9));
        let scale = reference_e4m3_satfinite(pre);
        let inv = (1.0 / e4m3_value(scale)) as f32;
        for (k, &x) in g.iter().enumerate() {
            let code = if x.is_nan() {
                7
            } else {
                let q = (f64::from(x) * f64::from(inv)) as f32;
                nearest(&grid, f64::from(q)) as u8 | u8::from(x.is_sign_negative()) << 3
            };
            let i = 16 * s + k;
            out[i / 2] |= code << (4 * (i % 2));
        }
        out[nvfp4_scale_at(s)] = scale;
    }
    for (i, &x) in rope.iter().enumerate() {
        out[256 + i] = reference_e4m3_satfinite(x);
    }
    out
}

fn bf16_bits_of(values: Values<'_>) -> Vec<u16> {
    match values {
        Values::Bf16(s) => s.iter().map(|v| v.to_bits()).collect(),
        Values::F16(s) => s.iter().map(|v| reference_bf16(v.to_f32())).collect(),
        Values::F32(s) => s.iter().map(|&v| reference_bf16(v)).collect(),
    }
}

fn check_encode(dtype: Dtype, c_kv: Values<'_>, k_pe: Values<'_>) {
    let codec = Codec::new(dtype, RANK, ROPE).unwrap();
    let mut got = vec![0u8; codec.bytes_per_token()];
    codec.encode(c_kv, k_pe, &mut got).unwrap();
    let nope = common::widen(c_kv);
    let expected = if dtype == Dtype::Nvfp4DsMla {
        reference_encode_nvfp4(&nope, &common::widen(k_pe))
    } else {
        reference_encode(dtype, &nope, &bf16_bits_of(c_kv), &bf16_bits_of(k_pe))
    };
    assert_eq!(got.len(), expected.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
        panic!(
            "{dtype} {}: byte {i} is {:#04x}, reference {:#04x}",
            c_kv.elem_type(),
            got[i],
            expected[i]
        );
    }
}

fn same(a: f64, b: f32) -> bool {
    (a.is_nan() && b.is_nan())
        || (a == f64::from(b) && (a != 0.0 || a.is_sign_negative() == b.is_sign_negative()))
}

fn check_decode(dtype: Dtype, bytes: &[u8]) {
    let codec = Codec::new(dtype, RANK, ROPE).unwrap();
    let reference = reference_decode(dtype, bytes);
    let mut got = vec![0f32; RANK + ROPE];
    codec.decode_f32(bytes, &mut got).unwrap();
    let mut got_bf16 = vec![bf16::ZERO; RANK + ROPE];
    codec.decode_bf16(bytes, &mut got_bf16).unwrap();
    let rope_at = codec.layout().rope_offset;
    for i in 0..RANK + ROPE {
        // The exact value rounded once to f32 (a no-op for valid encodings).
        let r32 = reference[i] as f32;
        assert!(
            same(f64::from(r32), got[i]),
            "{dtype} value {i}: {} vs reference {}",
            got[i],
            reference[i]
        );
        // Stored bf16 values come back verbatim, NaN payloads included;
        // dequantized values are rounded from f32.
        let stored_bf16 = match (dtype, i < RANK) {
            (Dtype::Nvfp4DsMla, _) => None,
            (Dtype::Bf16, true) => Some(le_u16(bytes, i)),
            (_, false) => Some(le_u16(&bytes[rope_at..], i - RANK)),
            _ => None,
        };
        let expected = stored_bf16.unwrap_or_else(|| reference_bf16(r32));
        assert_eq!(got_bf16[i].to_bits(), expected, "{dtype} bf16 value {i}");
    }
}

#[test]
fn decoders_match_the_definition_on_arbitrary_bytes() {
    let mut rng = common::rng(1);
    for dtype in Dtype::ALL {
        let bpt = dtype.bytes_per_token(RANK, ROPE).unwrap();
        for _ in 0..200 {
            let bytes: Vec<u8> = (0..bpt).map(|_| rng.gen()).collect();
            check_decode(dtype, &bytes);
        }
    }
}

#[test]
fn encoders_match_the_reference_on_gaussian_data_in_every_input_type() {
    let mut rng = common::rng(2);
    for scale in [1e-6f32, 0.01, 1.0, 300.0] {
        let c = common::TypedRows::new(
            &common::gaussian_rows(&mut rng, 1, RANK, &[3, 200, 450], 40.0)
                .iter()
                .map(|v| v * scale)
                .collect::<Vec<_>>(),
        );
        let k = common::TypedRows::new(&common::gaussian_rows(&mut rng, 1, ROPE, &[], 1.0));
        for dtype in Dtype::ALL {
            for ce in ElemType::ALL {
                for ke in ElemType::ALL {
                    check_encode(dtype, c.get(ce), k.get(ke));
                }
            }
        }
    }
}

#[test]
fn encoded_gaussian_data_decodes_as_the_reference_says() {
    let mut rng = common::rng(3);
    let codec_rows = common::gaussian_rows(&mut rng, 8, RANK + ROPE, &[7, 300], 25.0);
    for dtype in Dtype::ALL {
        let codec = Codec::new(dtype, RANK, ROPE).unwrap();
        for row in codec_rows.chunks(RANK + ROPE) {
            let mut bytes = vec![0u8; codec.bytes_per_token()];
            codec
                .encode(row[..RANK].into(), row[RANK..].into(), &mut bytes)
                .unwrap();
            check_decode(dtype, &bytes);
        }
    }
}

fn any_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => any::<u32>().prop_map(f32::from_bits),
        4 => -1e4f32..1e4f32,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => (0u32..0x80_0000).prop_map(f32::from_bits),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn encoders_match_the_reference_on_any_f32_bits(
        nope in proptest::collection::vec(any_f32(), RANK),
        rope in proptest::collection::vec(any_f32(), ROPE),
    ) {
        for dtype in Dtype::ALL {
            check_encode(dtype, Values::F32(&nope), Values::F32(&rope));
        }
    }

    #[test]
    fn encoders_match_the_reference_on_any_bf16_and_f16_bits(
        nope in proptest::collection::vec(any::<u16>(), RANK),
        rope in proptest::collection::vec(any::<u16>(), ROPE),
    ) {
        let nb: Vec<bf16> = nope.iter().map(|&b| bf16::from_bits(b)).collect();
        let rb: Vec<bf16> = rope.iter().map(|&b| bf16::from_bits(b)).collect();
        let nh: Vec<half::f16> = nope.iter().map(|&b| half::f16::from_bits(b)).collect();
        let rh: Vec<half::f16> = rope.iter().map(|&b| half::f16::from_bits(b)).collect();
        for dtype in Dtype::ALL {
            check_encode(dtype, Values::Bf16(&nb), Values::Bf16(&rb));
            check_encode(dtype, Values::F16(&nh), Values::F16(&rh));
        }
    }
}
