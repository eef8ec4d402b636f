//! Round trips through every format and input type, quantization error on
//! Gaussian data with outlier channels, and the batch helpers.

mod common;

use half::{bf16, f16};
use mla_cache::codec::{Codec, ElemType, Values};
use mla_cache::Dtype;
use rand::Rng;

const RANK: usize = 512;
const ROPE: usize = 64;
const WIDTH: usize = RANK + ROPE;

fn codec(dtype: Dtype) -> Codec {
    Codec::new(dtype, RANK, ROPE).unwrap()
}

#[test]
fn layouts_match_the_design() {
    let fp8 = codec(Dtype::Fp8DsMla).layout();
    assert_eq!(
        (
            fp8.bytes_per_token,
            fp8.scales_offset,
            fp8.num_scales,
            fp8.scale_bytes,
            fp8.rope_offset
        ),
        (656, 512, 4, 4, 528)
    );
    let mx = codec(Dtype::Mxfp6).layout();
    assert_eq!(
        (
            mx.bytes_per_token,
            mx.scales_offset,
            mx.num_scales,
            mx.scale_bytes,
            mx.rope_offset
        ),
        (528, 384, 16, 1, 400)
    );
    // vLLM's order: codes, then the e4m3 RoPE values, then the scales.
    let nv = codec(Dtype::Nvfp4DsMla).layout();
    assert_eq!(
        (
            nv.bytes_per_token,
            nv.nope_bytes,
            nv.scales_offset,
            nv.num_scales,
            nv.scale_bytes,
            nv.rope_offset
        ),
        (352, 256, 320, 32, 1, 256)
    );
    let b = codec(Dtype::Bf16).layout();
    assert_eq!(
        (b.bytes_per_token, b.num_scales, b.rope_offset),
        (1152, 0, 1024)
    );
}

#[test]
fn bf16_input_in_bf16_format_is_bit_exact() {
    let mut rng = common::rng(10);
    let c = codec(Dtype::Bf16);
    for _ in 0..50 {
        // Any bits at all, NaN payloads and subnormals included.
        let row: Vec<bf16> = (0..WIDTH).map(|_| bf16::from_bits(rng.gen())).collect();
        let mut bytes = vec![0u8; c.bytes_per_token()];
        c.encode(row[..RANK].into(), row[RANK..].into(), &mut bytes)
            .unwrap();
        let mut back = vec![bf16::ZERO; WIDTH];
        c.decode_bf16(&bytes, &mut back).unwrap();
        assert!(row
            .iter()
            .zip(&back)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut wide = vec![0f32; WIDTH];
        c.decode_f32(&bytes, &mut wide).unwrap();
        // Widening is a 16-bit shift, so NaN payloads survive too.
        assert!(row
            .iter()
            .zip(&wide)
            .all(|(a, b)| u32::from(a.to_bits()) << 16 == b.to_bits()));
    }
}

#[test]
fn f32_and_f16_input_in_bf16_format_round_to_nearest_even() {
    let mut rng = common::rng(11);
    let c = codec(Dtype::Bf16);
    let values = common::gaussian_rows(&mut rng, 1, WIDTH, &[], 3.0);
    let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
    for input in [Values::F32(&values), Values::F16(&halves)] {
        let wide = common::widen(input);
        let mut bytes = vec![0u8; c.bytes_per_token()];
        c.encode(
            input.window(0, RANK).unwrap(),
            input.window(RANK, ROPE).unwrap(),
            &mut bytes,
        )
        .unwrap();
        let mut back = vec![bf16::ZERO; WIDTH];
        c.decode_bf16(&bytes, &mut back).unwrap();
        for (w, b) in wide.iter().zip(&back) {
            assert_eq!(bf16::from_f32(*w).to_bits(), b.to_bits());
        }
    }
}

/// Encodes rows of the DeepSeek geometry and returns the decoded NoPE values.
fn round_trip_nope(dtype: Dtype, rows: &[f32]) -> Vec<f32> {
    let c = codec(dtype);
    let mut decoded = Vec::with_capacity(rows.len());
    let mut bytes = vec![0u8; c.bytes_per_token()];
    let mut out = vec![0f32; WIDTH];
    for row in rows.chunks(RANK) {
        c.encode(row.into(), Values::F32(&[0.5; ROPE]), &mut bytes)
            .unwrap();
        c.decode_f32(&bytes, &mut out).unwrap();
        decoded.extend_from_slice(&out[..RANK]);
    }
    decoded
}

#[test]
fn relative_rms_error_on_gaussian_data_with_outlier_channels() {
    let mut rng = common::rng(12);
    // 2,048 tokens; 6 of the 512 channels are 20x larger than the rest.
    let rows = common::gaussian_rows(&mut rng, 2048, RANK, &[5, 77, 130, 260, 391, 500], 20.0);
    // (format, the error it is expected to have, the bound)
    let bound = [
        (Dtype::Fp8DsMla, 0.027, 0.032),
        (Dtype::Mxfp6, 0.040, 0.048),
        (Dtype::Nvfp4DsMla, 0.09, 0.11),
    ];
    for (dtype, expected, limit) in bound {
        let err = common::relative_rms(&round_trip_nope(dtype, &rows), &rows);
        println!(
            "{dtype}: relative RMS error {:.2}% (expected: about {:.1}%)",
            100.0 * err,
            100.0 * expected
        );
        assert!(
            err < limit,
            "{dtype}: relative RMS error {err} above {limit}"
        );
        assert!(
            err > 0.5 * expected,
            "{dtype}: error {err} is implausibly small"
        );
    }
    // Without outliers the error is smaller still.
    let plain = common::gaussian_rows(&mut rng, 512, RANK, &[], 1.0);
    for (dtype, limit) in [
        (Dtype::Fp8DsMla, 0.045),
        (Dtype::Mxfp6, 0.045),
        (Dtype::Nvfp4DsMla, 0.11),
    ] {
        let err = common::relative_rms(&round_trip_nope(dtype, &plain), &plain);
        println!(
            "{dtype}: relative RMS error without outliers {:.2}%",
            100.0 * err
        );
        assert!(err < limit, "{dtype}: {err} above {limit}");
    }
}

#[test]
fn quantized_values_are_within_half_a_step_of_the_input() {
    let mut rng = common::rng(13);
    let rows = common::gaussian_rows(&mut rng, 64, RANK, &[9], 30.0);
    for (dtype, group, top, mantissa_bits) in [
        (Dtype::Fp8DsMla, 128, 448f32, 3),
        (Dtype::Mxfp6, 32, 7.5, 3),
    ] {
        let decoded = round_trip_nope(dtype, &rows);
        for (x, d) in rows.chunks(group).zip(decoded.chunks(group)) {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = (amax / top).log2().ceil().exp2();
            for (&a, &b) in x.iter().zip(d) {
                // Half a unit in the last place of |a| (or of the subnormal step).
                let exponent = (a.abs() / scale)
                    .log2()
                    .floor()
                    .max(if dtype == Dtype::Mxfp6 { 0.0 } else { -6.0 });
                let half_step = (exponent - mantissa_bits as f32).exp2() * scale / 2.0;
                assert!(
                    (a - b).abs() <= half_step * 1.0001,
                    "{dtype}: {a} -> {b}, half step {half_step}"
                );
            }
        }
    }
}

/// Re-encoding decoded values reproduces them exactly. (The bytes may differ:
/// when the tile maximum rounds down onto a power-of-two boundary, the
/// second encoding picks half the scale and twice the codes.)
#[test]
fn re_encoding_a_decoded_latent_gives_the_same_values() {
    let mut rng = common::rng(14);
    for dtype in Dtype::ALL {
        let c = codec(dtype);
        for row in common::gaussian_rows(&mut rng, 16, WIDTH, &[1, 2], 50.0).chunks(WIDTH) {
            let mut bytes = vec![0u8; c.bytes_per_token()];
            c.encode(row[..RANK].into(), row[RANK..].into(), &mut bytes)
                .unwrap();
            let mut wide = vec![0f32; WIDTH];
            c.decode_f32(&bytes, &mut wide).unwrap();
            let mut narrow = vec![bf16::ZERO; WIDTH];
            c.decode_bf16(&bytes, &mut narrow).unwrap();
            for again in [Values::F32(&wide), Values::Bf16(&narrow)] {
                let mut bytes2 = vec![0u8; c.bytes_per_token()];
                c.encode(
                    again.window(0, RANK).unwrap(),
                    again.window(RANK, ROPE).unwrap(),
                    &mut bytes2,
                )
                .unwrap();
                let mut wide2 = vec![0f32; WIDTH];
                c.decode_f32(&bytes2, &mut wide2).unwrap();
                assert_eq!(wide, wide2, "{dtype} from {}", again.elem_type());
                if dtype == Dtype::Bf16 {
                    assert_eq!(bytes, bytes2);
                }
            }
        }
    }
}

#[test]
fn every_input_type_encodes_the_same_numbers_alike() {
    let mut rng = common::rng(15);
    // Values that bf16, f16 and f32 all hold exactly (8 significant bits).
    let values: Vec<f32> = (0..WIDTH)
        .map(|_| f32::from(rng.gen_range(-255i16..256)) / 8.0)
        .collect();
    let typed = common::TypedRows::new(&values);
    for dtype in Dtype::ALL {
        let c = codec(dtype);
        let mut reference = vec![0u8; c.bytes_per_token()];
        c.encode(values[..RANK].into(), values[RANK..].into(), &mut reference)
            .unwrap();
        for elem in ElemType::ALL {
            let v = typed.get(elem);
            let mut bytes = vec![0u8; c.bytes_per_token()];
            c.encode(
                v.window(0, RANK).unwrap(),
                v.window(RANK, ROPE).unwrap(),
                &mut bytes,
            )
            .unwrap();
            assert_eq!(bytes, reference, "{dtype} from {elem}");
        }
    }
}

#[test]
fn batch_helpers_match_one_latent_at_a_time() {
    let mut rng = common::rng(16);
    let tokens = 37;
    let c_kv = common::gaussian_rows(&mut rng, tokens, RANK, &[0], 8.0);
    let k_pe: Vec<bf16> = common::gaussian_rows(&mut rng, tokens, ROPE, &[], 1.0)
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    for dtype in Dtype::ALL {
        let c = codec(dtype);
        let bpt = c.bytes_per_token();
        let mut batch = vec![0u8; tokens * bpt];
        assert_eq!(
            c.encode_batch((&c_kv).into(), (&k_pe).into(), &mut batch)
                .unwrap(),
            tokens
        );
        let mut decoded = vec![0f32; tokens * WIDTH];
        assert_eq!(c.decode_batch(&batch, &mut decoded).unwrap(), tokens);
        for t in 0..tokens {
            let mut one = vec![0u8; bpt];
            c.encode(
                c_kv[t * RANK..][..RANK].into(),
                k_pe[t * ROPE..][..ROPE].into(),
                &mut one,
            )
            .unwrap();
            assert_eq!(one, batch[t * bpt..][..bpt]);
            let mut out = vec![0f32; WIDTH];
            c.decode_f32(&one, &mut out).unwrap();
            assert_eq!(out, decoded[t * WIDTH..][..WIDTH]);
        }
        // Mismatched lengths are errors that write nothing.
        let mut short = vec![7u8; (tokens - 1) * bpt];
        assert!(c
            .encode_batch((&c_kv).into(), (&k_pe).into(), &mut short)
            .is_err());
        assert!(short.iter().all(|&b| b == 7));
        assert!(c
            .encode_batch(
                (&c_kv).into(),
                (&k_pe).into(),
                &mut vec![0u8; tokens * bpt + 1]
            )
            .is_err());
        assert!(c
            .decode_batch(&batch, &mut vec![0f32; tokens * WIDTH - 1])
            .is_err());
    }
}

#[test]
fn wrong_lengths_are_errors_and_leave_the_output_alone() {
    for dtype in Dtype::ALL {
        let c = codec(dtype);
        let mut out = vec![9u8; c.bytes_per_token()];
        let nope = vec![1f32; RANK];
        let rope = vec![1f32; ROPE];
        assert!(c
            .encode(nope[1..].into(), (&rope).into(), &mut out)
            .is_err());
        assert!(c
            .encode((&nope).into(), rope[1..].into(), &mut out)
            .is_err());
        assert!(c
            .encode((&nope).into(), (&rope).into(), &mut out[1..])
            .is_err());
        assert!(out.iter().all(|&b| b == 9));
        let mut decoded = vec![3f32; WIDTH];
        assert!(c.decode_f32(&out[1..], &mut decoded).is_err());
        assert!(c.decode_f32(&out, &mut decoded[1..]).is_err());
        assert!(decoded.iter().all(|&v| v == 3.0));
    }
}

#[test]
fn other_geometries_work_and_bad_ones_are_rejected() {
    let mut rng = common::rng(17);
    for dtype in Dtype::ALL {
        let c = Codec::new(dtype, 256, 32).unwrap();
        assert_eq!(c.bytes_per_token(), dtype.bytes_per_token(256, 32).unwrap());
        let row = common::gaussian_rows(&mut rng, 1, 288, &[], 1.0);
        let mut bytes = vec![0u8; c.bytes_per_token()];
        c.encode(row[..256].into(), row[256..].into(), &mut bytes)
            .unwrap();
        let mut back = vec![0f32; 288];
        c.decode_f32(&bytes, &mut back).unwrap();
        let limit = if dtype == Dtype::Nvfp4DsMla {
            0.12
        } else {
            0.06
        };
        assert!(common::relative_rms(&back, &row) < limit, "{dtype}");
        let c = Codec::new(dtype, 512, 0).unwrap();
        let mut bytes = vec![0u8; c.bytes_per_token()];
        c.encode(Values::F32(&[1.0; 512]), Values::F32(&[]), &mut bytes)
            .unwrap();
    }
    assert!(Codec::new(Dtype::Fp8DsMla, 96, 64).is_err());
    assert!(Codec::new(Dtype::Mxfp6, 48, 64).is_err());
    // nvfp4_ds_mla's scale transpose needs a multiple of 4 groups of 16.
    assert!(Codec::new(Dtype::Nvfp4DsMla, 32, 64).is_err());
    assert!(Codec::new(Dtype::Nvfp4DsMla, 64, 64).is_ok());
    assert!(Codec::new(Dtype::Bf16, 0, 64).is_err());
}
