//! Edge cases of the quantized formats: zero, huge and subnormal values, the
//! top of each range, and non-finite input, as the `codec` docs define them.

use half::{bf16, f16};
use mla_cache::codec::minifloat::e4m3_to_f32;
use mla_cache::codec::{Codec, Values};
use mla_cache::Dtype;

const RANK: usize = 512;
const ROPE: usize = 64;

struct Encoded {
    bytes: Vec<u8>,
    decoded: Vec<f32>,
}

fn encode(dtype: Dtype, nope: &[f32], rope: &[f32]) -> Encoded {
    let c = Codec::new(dtype, RANK, ROPE).unwrap();
    let mut bytes = vec![0u8; c.bytes_per_token()];
    c.encode(nope.into(), rope.into(), &mut bytes).unwrap();
    let mut decoded = vec![0f32; RANK + ROPE];
    c.decode_f32(&bytes, &mut decoded).unwrap();
    Encoded { bytes, decoded }
}

fn fp8_scale(bytes: &[u8], tile: usize) -> f32 {
    f32::from_le_bytes(bytes[512 + 4 * tile..][..4].try_into().unwrap())
}

fn mxfp6_scale_byte(bytes: &[u8], group: usize) -> u8 {
    bytes[384 + group]
}

#[test]
fn all_zero_tiles_take_the_smallest_scale_and_zero_codes() {
    let e = encode(Dtype::Fp8DsMla, &[0.0; RANK], &[0.0; ROPE]);
    assert!(e.bytes[..512].iter().all(|&b| b == 0));
    for t in 0..4 {
        assert_eq!(
            fp8_scale(&e.bytes, t),
            2f32.powi(-13),
            "1e-4 rounds up to 2^-13"
        );
    }
    assert!(e.decoded.iter().all(|&v| v == 0.0));
    let e = encode(Dtype::Mxfp6, &[0.0; RANK], &[0.0; ROPE]);
    assert!(
        e.bytes[..400].iter().all(|&b| b == 0),
        "codes and scale bytes (2^-127) are all zero"
    );
    assert!(e.decoded.iter().all(|&v| v == 0.0));
}

#[test]
fn negative_zero_keeps_its_sign() {
    let e = encode(Dtype::Fp8DsMla, &[-0.0; RANK], &[-0.0; ROPE]);
    assert!(e.bytes[..512].iter().all(|&b| b == 0x80));
    assert!(e.decoded.iter().all(|v| v.to_bits() == (-0.0f32).to_bits()));
    let e = encode(Dtype::Mxfp6, &[-0.0; RANK], &[0.0; ROPE]);
    assert!(e.decoded[..RANK]
        .iter()
        .all(|v| v.to_bits() == (-0.0f32).to_bits()));
}

#[test]
fn one_huge_value_sets_its_tile_scale_only() {
    let mut nope = vec![1.0f32; RANK];
    nope[130] = 1e6; // tile 1 of fp8, group 4 of mxfp6
    let e = encode(Dtype::Fp8DsMla, &nope, &[0.0; ROPE]);
    assert_eq!(fp8_scale(&e.bytes, 1), 4096.0); // 1e6 / 448 = 2232 -> 2^12
    assert_eq!(fp8_scale(&e.bytes, 0), 2f32.powi(-8)); // 1 / 448 -> 2^-8
    assert_eq!(e.decoded[130], 240.0 * 4096.0); // 1e6 / 4096 = 244.14 -> 240 (step 16)
    assert!((e.decoded[130] - 1e6).abs() / 1e6 < 1.0 / 16.0);
    // 1 / 4096 is below half the smallest subnormal step (2^-9 x 4096 = 8).
    assert!(e.decoded[128..256]
        .iter()
        .enumerate()
        .all(|(i, &v)| i == 2 || v == 0.0));
    assert!(e.decoded[..128]
        .iter()
        .chain(&e.decoded[256..RANK])
        .all(|&v| v == 1.0));

    let e = encode(Dtype::Mxfp6, &nope, &[0.0; ROPE]);
    assert_eq!(mxfp6_scale_byte(&e.bytes, 4), 127 + 18); // 1e6 / 7.5 = 133333 -> 2^18
    assert_eq!(mxfp6_scale_byte(&e.bytes, 0), 127 - 2); // 1 / 7.5 -> 2^-2
    assert_eq!(e.decoded[130], 7.5 * 2f32.powi(17)); // 3.81 -> 3.75 x 2^18
    assert!(e.decoded[128..160]
        .iter()
        .enumerate()
        .all(|(i, &v)| i == 2 || v == 0.0));
    assert!(e.decoded[..128]
        .iter()
        .chain(&e.decoded[160..RANK])
        .all(|&v| v == 1.0));
}

#[test]
fn the_top_of_each_range_is_exact_and_one_step_past_it_doubles_the_scale() {
    let mut nope = vec![0.0f32; RANK];
    nope[0] = 448.0;
    nope[1] = -448.0;
    nope[128] = 449.0;
    let e = encode(Dtype::Fp8DsMla, &nope, &[0.0; ROPE]);
    assert_eq!(
        (e.bytes[0], e.bytes[1], fp8_scale(&e.bytes, 0)),
        (0x7E, 0xFE, 1.0)
    );
    assert_eq!(fp8_scale(&e.bytes, 1), 2.0);
    assert_eq!(e.decoded[128], 448.0); // 224.5 -> 224 (step 16 below 256)

    let mut nope = vec![0.0f32; RANK];
    nope[0] = 7.5;
    nope[32] = 7.6;
    let e = encode(Dtype::Mxfp6, &nope, &[0.0; ROPE]);
    assert_eq!(
        (e.bytes[0] & 0x3F, mxfp6_scale_byte(&e.bytes, 0)),
        (0x1F, 127)
    );
    assert_eq!(mxfp6_scale_byte(&e.bytes, 1), 128);
    assert_eq!(e.decoded[32], 7.5); // 3.8 -> 3.75, times 2
}

#[test]
fn values_within_a_step_of_f32_max_may_decode_to_infinity() {
    // f32::MAX / 448 gives the scale 2^120; MAX / 2^120 = 255.99 rounds to
    // the e4m3 value 256, and 256 x 2^120 = 2^128 overflows f32. Documented.
    let mut nope = vec![0.0f32; RANK];
    nope[0] = f32::MAX;
    nope[1] = 3.0e38;
    let e = encode(Dtype::Fp8DsMla, &nope, &[0.0; ROPE]);
    assert_eq!(fp8_scale(&e.bytes, 0), 2f32.powi(120));
    assert_eq!(e.decoded[0], f32::INFINITY);
    assert_eq!(e.decoded[1], 224.0 * 2f32.powi(120));
    let e = encode(Dtype::Mxfp6, &nope, &[0.0; ROPE]);
    assert_eq!(mxfp6_scale_byte(&e.bytes, 0), 127 + 126);
    assert_eq!(e.decoded[0], f32::INFINITY);
}

#[test]
fn subnormal_inputs() {
    // fp8: the scale never drops below 2^-13, so f32 subnormals encode as 0.
    let tiny = f32::from_bits(0x0000_1234);
    let e = encode(Dtype::Fp8DsMla, &[tiny; RANK], &[tiny; ROPE]);
    assert!(e.bytes[..512].iter().all(|&b| b == 0));
    assert_eq!(fp8_scale(&e.bytes, 0), 2f32.powi(-13));
    // RoPE keeps them as bf16 (0x1234 << 0 in f32 rounds to bf16 0x0000).
    assert_eq!(e.decoded[RANK], 0.0);

    // mxfp6: the smallest scale is 2^-127, so multiples of 2^-130 up to
    // 7.5 x 2^-127 survive exactly, subnormal scale and all.
    let step = 2f32.powi(-130);
    let nope: Vec<f32> = (0..RANK)
        .map(|i| step * (i % 8) as f32 * if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let e = encode(Dtype::Mxfp6, &nope, &[0.0; ROPE]);
    assert!((0..16).all(|g| mxfp6_scale_byte(&e.bytes, g) == 0));
    assert_eq!(&e.decoded[..RANK], &nope[..]);
    // bf16 subnormal input behaves the same.
    let c = Codec::new(Dtype::Mxfp6, RANK, ROPE).unwrap();
    let nope_bf16: Vec<bf16> = nope.iter().map(|&v| bf16::from_f32(v)).collect();
    let mut bytes = vec![0u8; c.bytes_per_token()];
    c.encode(
        Values::Bf16(&nope_bf16),
        Values::F32(&[0.0; ROPE]),
        &mut bytes,
    )
    .unwrap();
    assert_eq!(bytes, e.bytes);
    // f16 subnormals are normal f32 values: 2^-24 in a group with 2^-20.
    let mut halves = vec![f16::ZERO; RANK];
    halves[0] = f16::from_bits(1); // 2^-24
    halves[1] = f16::from_f32(2f32.powi(-20));
    c.encode(Values::F16(&halves), Values::F32(&[0.0; ROPE]), &mut bytes)
        .unwrap();
    let mut out = vec![0f32; RANK + ROPE];
    c.decode_f32(&bytes, &mut out).unwrap();
    assert_eq!(mxfp6_scale_byte(&bytes, 0), 127 - 22); // 2^-20 / 7.5 -> 2^-22
    assert_eq!((out[0], out[1]), (2f32.powi(-24), 2f32.powi(-20)));
}

#[test]
fn nan_encodes_as_zero_and_infinities_saturate_without_moving_the_scale() {
    let mut nope = vec![1.0f32; RANK];
    nope[0] = f32::NAN;
    nope[1] = f32::INFINITY;
    nope[2] = f32::NEG_INFINITY;
    nope[3] = 2.0;
    let mut rope = vec![0.5f32; ROPE];
    rope[0] = f32::NAN;
    rope[1] = f32::NEG_INFINITY;

    let e = encode(Dtype::Fp8DsMla, &nope, &rope);
    assert_eq!(fp8_scale(&e.bytes, 0), 2f32.powi(-7)); // from amax 2
    assert_eq!(&e.bytes[..3], &[0x00, 0x7E, 0xFE]);
    assert_eq!(&e.decoded[..4], &[0.0, 3.5, -3.5, 2.0]);
    // RoPE is stored as bf16: NaN canonical, Inf kept.
    assert_eq!(u16::from_le_bytes([e.bytes[528], e.bytes[529]]), 0x7FFF);
    assert_eq!(e.decoded[RANK + 1], f32::NEG_INFINITY);

    let e = encode(Dtype::Mxfp6, &nope, &rope);
    assert_eq!(mxfp6_scale_byte(&e.bytes, 0), 127 - 1); // 2 / 7.5 -> 2^-1
    assert_eq!(&e.decoded[..4], &[0.0, 3.75, -3.75, 2.0]);
    assert_eq!(u16::from_le_bytes([e.bytes[400], e.bytes[401]]), 0x7FFF);

    // bf16 keeps non-finite values as they are.
    let e = encode(Dtype::Bf16, &nope, &rope);
    assert!(e.decoded[0].is_nan());
    assert_eq!(
        (e.decoded[1], e.decoded[2]),
        (f32::INFINITY, f32::NEG_INFINITY)
    );

    // A tile with no finite value: the smallest scale, NaN -> 0, Inf -> top.
    let mut nope = vec![f32::NAN; RANK];
    nope[5] = f32::INFINITY;
    let e = encode(Dtype::Fp8DsMla, &nope, &rope);
    assert_eq!(fp8_scale(&e.bytes, 0), 2f32.powi(-13));
    assert_eq!(e.decoded[5], 448.0 * 2f32.powi(-13));
    assert!(e.decoded[..RANK].iter().all(|v| !v.is_nan()));
    let e = encode(Dtype::Mxfp6, &nope, &rope);
    assert_eq!(mxfp6_scale_byte(&e.bytes, 0), 0);
    assert_eq!(e.decoded[5], 7.5 * 2f32.powi(-127));
}

#[test]
fn codes_the_encoder_never_writes_decode_to_nan() {
    let c = Codec::new(Dtype::Fp8DsMla, RANK, ROPE).unwrap();
    let mut bytes = vec![0u8; c.bytes_per_token()];
    bytes[0] = 0x7F;
    bytes[1] = 0xFF;
    bytes[512..516].copy_from_slice(&1f32.to_le_bytes());
    let mut out = vec![0f32; RANK + ROPE];
    c.decode_f32(&bytes, &mut out).unwrap();
    assert!(out[0].is_nan() && out[1].is_nan() && out[2] == 0.0);
    let mut narrow = vec![bf16::ZERO; RANK + ROPE];
    c.decode_bf16(&bytes, &mut narrow).unwrap();
    assert_eq!(narrow[0].to_bits(), 0x7FFF);

    let c = Codec::new(Dtype::Mxfp6, RANK, ROPE).unwrap();
    let mut bytes = vec![0u8; c.bytes_per_token()];
    bytes[384] = 255;
    c.decode_f32(&bytes, &mut out).unwrap();
    assert!(out[..32].iter().all(|v| v.is_nan()));
    assert!(out[32..RANK].iter().all(|&v| v == 0.0));
}

/// nvfp4_ds_mla: the scale code of 16-value group `group` (a 4-row
/// transpose after the codes and the RoPE values).
fn nvfp4_scale_byte(bytes: &[u8], group: usize) -> u8 {
    bytes[320 + 8 * (group % 4) + group / 4]
}

/// nvfp4_ds_mla: the E2M1 code of NoPE value `i`.
fn nvfp4_code(bytes: &[u8], i: usize) -> u8 {
    (bytes[i / 2] >> (4 * (i % 2))) & 0xF
}

#[test]
fn nvfp4_zeros_take_the_scale_floor_and_negative_zero_keeps_its_sign() {
    let e = encode(Dtype::Nvfp4DsMla, &[0.0; RANK], &[0.0; ROPE]);
    assert!(e.bytes[..320].iter().all(|&b| b == 0), "codes and RoPE");
    // max(0 / 6, 2^-9) = 2^-9, the smallest e4m3 subnormal (code 0x01).
    assert!(e.bytes[320..].iter().all(|&b| b == 0x01));
    assert!(e.decoded.iter().all(|&v| v.to_bits() == 0));
    let e = encode(Dtype::Nvfp4DsMla, &[-0.0; RANK], &[-0.0; ROPE]);
    assert!(e.bytes[..256].iter().all(|&b| b == 0x88));
    assert!(e.bytes[256..320].iter().all(|&b| b == 0x80));
    assert!(e.decoded.iter().all(|v| v.to_bits() == (-0.0f32).to_bits()));
}

#[test]
fn nvfp4_scale_is_amax_over_6_rounded_to_e4m3_and_stored_transposed() {
    // Group g's largest magnitude is 6 times the e4m3 value of code
    // 0x28 + g, so its scale is that code, at the group's own byte.
    let scale_of = |g: usize| e4m3_to_f32(0x28 + g as u8);
    let mut nope = vec![0f32; RANK];
    for g in 0..32 {
        nope[16 * g + g % 16] = -6.0 * scale_of(g);
    }
    let e = encode(Dtype::Nvfp4DsMla, &nope, &[0.0; ROPE]);
    let codec = Codec::new(Dtype::Nvfp4DsMla, RANK, ROPE).unwrap();
    let layout = codec.layout();
    assert_eq!((layout.rope_offset, layout.scales_offset), (256, 320));
    for g in 0..32 {
        assert_eq!(nvfp4_scale_byte(&e.bytes, g), 0x28 + g as u8, "group {g}");
        // The largest value is -6 * scale: code 0xF, decoded exactly.
        assert_eq!(nvfp4_code(&e.bytes, 16 * g + g % 16), 0xF);
        assert_eq!(e.decoded[16 * g + g % 16], nope[16 * g + g % 16]);
    }
    // amax / 6 rounds to nearest e4m3: 6 * 1.0625 lies halfway between 1.0
    // and 1.125 (even: 1.0), a little more rounds up, and the top saturates.
    for (amax, scale) in [
        (6.0 * 1.0625f32, 1.0f32),
        (6.0 * 1.07, 1.125),
        (6.0 * 464.0, 448.0),
        (f32::MAX, 448.0),
        (f32::INFINITY, 448.0),
        (6.0 * 2f32.powi(-10), 2f32.powi(-9)),
    ] {
        let mut nope = vec![0f32; RANK];
        nope[3] = amax;
        let e = encode(Dtype::Nvfp4DsMla, &nope, &[0.0; ROPE]);
        let got = e4m3_to_f32(nvfp4_scale_byte(&e.bytes, 0));
        assert_eq!(got, scale, "amax {amax}");
        assert!((1..32).all(|g| nvfp4_scale_byte(&e.bytes, g) == 0x01));
    }
}

#[test]
fn nvfp4_codes_use_the_f32_reciprocal_of_the_scale() {
    // amax 11.25 gives the scale 1.875, whose f32 reciprocal is a little
    // above 1 / 1.875: 2.34375, 4.6875 and 9.375 are ties (1.25, 2.5, 5)
    // under x / scale, rounding down to even, but x * (1 / scale) lies
    // just above them and rounds up.
    let mut nope = vec![0f32; RANK];
    nope[..4].copy_from_slice(&[11.25, 2.34375, 4.6875, -9.375]);
    let e = encode(Dtype::Nvfp4DsMla, &nope, &[0.0; ROPE]);
    assert_eq!(nvfp4_scale_byte(&e.bytes, 0), 0x3F, "1.875");
    let codes: Vec<u8> = (0..4).map(|i| nvfp4_code(&e.bytes, i)).collect();
    assert_eq!(
        codes,
        [0x7, 0x3, 0x5, 0xF],
        "6, 1.5, 3, -6 (not 6, 1, 2, -4)"
    );
    assert_eq!(e.decoded[..4], [11.25, 2.8125, 5.625, -11.25]);
}

#[test]
fn nvfp4_e2m1_rounds_to_nearest_even_and_saturates() {
    // Scale 1 (amax 6): the codes are the values themselves.
    let mut nope = vec![0f32; RANK];
    let inputs = [
        6.0f32, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, -0.2, 1e-45,
    ];
    nope[..inputs.len()].copy_from_slice(&inputs);
    let e = encode(Dtype::Nvfp4DsMla, &nope, &[0.0; ROPE]);
    let codes: Vec<u8> = (0..inputs.len()).map(|i| nvfp4_code(&e.bytes, i)).collect();
    // 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    assert_eq!(codes, [7, 0, 1, 2, 2, 4, 4, 6, 6, 7, 8, 0]);
    // Past the group's own range a value saturates at 6 * scale.
    let mut nope = vec![0f32; RANK];
    nope[..2].copy_from_slice(&[1.0, -f32::INFINITY]);
    let e = encode(Dtype::Nvfp4DsMla, &nope, &[0.0; ROPE]);
    assert_eq!(
        nvfp4_scale_byte(&e.bytes, 0),
        0x7E,
        "Inf sets the scale to 448"
    );
    assert_eq!(nvfp4_code(&e.bytes, 1), 0xF);
    assert_eq!(e.decoded[1], -6.0 * 448.0);
}

#[test]
fn nvfp4_nan_is_ignored_by_the_scale_and_encodes_as_plus_six() {
    let mut nope = vec![0f32; RANK];
    nope[..3].copy_from_slice(&[f32::NAN, 3.0, -f32::NAN]);
    let mut rope = [0f32; ROPE];
    rope[..4].copy_from_slice(&[f32::NAN, -f32::NAN, f32::INFINITY, -1e6]);
    let e = encode(Dtype::Nvfp4DsMla, &nope, &rope);
    // amax is 3 (NaN ignored): scale 0.5, code of 3 is 6 (0x7).
    assert_eq!(nvfp4_scale_byte(&e.bytes, 0), 0x30, "0.5");
    let codes: Vec<u8> = (0..3).map(|i| nvfp4_code(&e.bytes, i)).collect();
    assert_eq!(codes, [0x7, 0x7, 0x7]);
    assert_eq!(e.decoded[..3], [3.0, 3.0, 3.0]);
    // RoPE: NaN stays NaN (with its sign), infinities saturate at 448.
    assert_eq!(e.bytes[256..260], [0x7F, 0xFF, 0x7E, 0xFE]);
    assert!(e.decoded[RANK].is_nan() && e.decoded[RANK + 1].is_nan());
    assert_eq!(e.decoded[RANK + 2..RANK + 4], [448.0, -448.0]);
}

#[test]
fn nvfp4_subnormal_inputs_and_the_smallest_rope_values() {
    // Subnormal f32 NoPE values: scale 2^-9, codes 0 (they are far below
    // 0.25 * 2^-9), signs kept.
    let mut nope = vec![0f32; RANK];
    nope[..2].copy_from_slice(&[1e-40, -3e-39]);
    let mut rope = [0f32; ROPE];
    // e4m3's smallest subnormal 2^-9, half of it (a tie: rounds to 0) and
    // three quarters of it (rounds up).
    rope[..3].copy_from_slice(&[2f32.powi(-9), 2f32.powi(-10), 1.5 * 2f32.powi(-10)]);
    let e = encode(Dtype::Nvfp4DsMla, &nope, &rope);
    assert_eq!(nvfp4_scale_byte(&e.bytes, 0), 0x01);
    assert_eq!(e.bytes[0], 0x80);
    assert_eq!(e.bytes[256..259], [0x01, 0x00, 0x01]);
    // A group of values at the scale floor: 0.75 * 2^-9 / 2^-9 rounds to 1.
    let mut nope = vec![0f32; RANK];
    nope[0] = 0.75 * 2f32.powi(-9);
    let e = encode(Dtype::Nvfp4DsMla, &nope, &[0.0; ROPE]);
    assert_eq!(nvfp4_code(&e.bytes, 0), 0x2);
    assert_eq!(e.decoded[0], 2f32.powi(-9));
}

#[test]
fn nvfp4_nan_scale_codes_decode_to_nan() {
    let mut bytes = vec![0x22u8; 352];
    bytes[320] = 0x7F; // group 0's scale
    bytes[256] = 0xFF; // RoPE 0
    let c = Codec::new(Dtype::Nvfp4DsMla, RANK, ROPE).unwrap();
    let mut out = vec![0f32; RANK + ROPE];
    c.decode_f32(&bytes, &mut out).unwrap();
    assert!(out[..16].iter().all(|v| v.is_nan()));
    assert!(out[16..RANK].iter().all(|v| !v.is_nan()));
    assert!(out[RANK].is_nan());
}
