//! Latent storage formats: CPU reference encoders and decoders.
//!
//! A [`Codec`] turns one latent (one token of one layer: `kv_lora_rank`
//! NoPE values, then `rope_dim` RoPE values) into the bytes of a [`Dtype`]
//! and back. The layouts and the encoding rules are exact; they are
//! specified in `docs/formats.md`, included here.
//!
#![doc = include_str!("../../docs/formats.md")]

mod bf16_format;
mod element;
pub mod fp8_ds_mla;
pub mod indexer_fp8;
pub mod minifloat;
pub mod mxfp6;
pub mod nvfp4_ds_mla;

pub use element::{Decoded, ElemType, Element, Values};
pub use indexer_fp8::IndexerCodec;

use half::bf16;

use crate::config::{CacheConfig, Dtype};
use crate::error::{Error, Result};

/// Where the parts of one encoded latent lie, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLayout {
    /// Bytes of one encoded latent.
    pub bytes_per_token: usize,
    /// Bytes of NoPE codes, starting at offset 0.
    pub nope_bytes: usize,
    /// Offset of the first scale: `nope_bytes`, except in `nvfp4_ds_mla`,
    /// whose scales follow the RoPE values.
    pub scales_offset: usize,
    /// Number of scales (0 for `bf16`).
    pub num_scales: usize,
    /// Bytes per scale: 4 (f32) for `fp8_ds_mla`, 1 (UE8M0) for `mxfp6`,
    /// 1 (e4m3) for `nvfp4_ds_mla`.
    pub scale_bytes: usize,
    /// Offset of the RoPE values: bf16, except in `nvfp4_ds_mla` (e4m3,
    /// right after the NoPE codes).
    pub rope_offset: usize,
}

/// Encoder and decoder for one format and geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    dtype: Dtype,
    kv_lora_rank: usize,
    rope_dim: usize,
    layout: TokenLayout,
}

impl Codec {
    /// A codec for `dtype` with `kv_lora_rank` NoPE and `rope_dim` RoPE
    /// values; `kv_lora_rank` must be a positive multiple of the format's
    /// group size.
    pub fn new(dtype: Dtype, kv_lora_rank: usize, rope_dim: usize) -> Result<Self> {
        let bytes_per_token = dtype.bytes_per_token(kv_lora_rank, rope_dim)?;
        let groups = kv_lora_rank / dtype.group_size();
        let (nope_bytes, num_scales, scale_bytes) = match dtype {
            Dtype::Bf16 => (2 * kv_lora_rank, 0, 0),
            Dtype::Fp8DsMla => (kv_lora_rank, groups, 4),
            Dtype::Mxfp6 => (kv_lora_rank * 6 / 8, groups, 1),
            Dtype::Nvfp4DsMla => (kv_lora_rank / 2, groups, 1),
        };
        // (offset of the scales, offset of the RoPE values, bytes per RoPE value)
        let (scales_offset, rope_offset, rope_bytes) = match dtype {
            Dtype::Nvfp4DsMla => (nope_bytes + rope_dim, nope_bytes, 1),
            _ => (nope_bytes, nope_bytes + num_scales * scale_bytes, 2),
        };
        debug_assert_eq!(
            nope_bytes + num_scales * scale_bytes + rope_bytes * rope_dim,
            bytes_per_token
        );
        Ok(Self {
            dtype,
            kv_lora_rank,
            rope_dim,
            layout: TokenLayout {
                bytes_per_token,
                nope_bytes,
                scales_offset,
                num_scales,
                scale_bytes,
                rope_offset,
            },
        })
    }

    /// The codec of a cache configuration.
    pub fn for_config(config: &CacheConfig) -> Result<Self> {
        Self::new(config.dtype, config.kv_lora_rank, config.rope_dim)
    }

    /// The storage format.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// NoPE values per latent.
    pub fn kv_lora_rank(&self) -> usize {
        self.kv_lora_rank
    }

    /// RoPE values per latent.
    pub fn rope_dim(&self) -> usize {
        self.rope_dim
    }

    /// Values per latent (`kv_lora_rank + rope_dim`).
    pub fn elements_per_token(&self) -> usize {
        self.kv_lora_rank + self.rope_dim
    }

    /// Bytes of one encoded latent.
    pub fn bytes_per_token(&self) -> usize {
        self.layout.bytes_per_token
    }

    /// Byte layout of one encoded latent.
    pub fn layout(&self) -> TokenLayout {
        self.layout
    }

    /// Encodes one latent: `c_kv` has `kv_lora_rank` values, `k_pe` has
    /// `rope_dim` (element types may differ), `out` has `bytes_per_token`
    /// bytes.
    pub fn encode(&self, c_kv: Values<'_>, k_pe: Values<'_>, out: &mut [u8]) -> Result<()> {
        self.check_len("c_kv", c_kv.len(), self.kv_lora_rank)?;
        self.check_len("k_pe", k_pe.len(), self.rope_dim)?;
        self.check_len("encoded latent", out.len(), self.bytes_per_token())?;
        self.encode_unchecked(c_kv, k_pe, out);
        Ok(())
    }

    /// Decodes one latent of `bytes_per_token` bytes into
    /// `elements_per_token` f32 values (NoPE then RoPE).
    pub fn decode_f32(&self, src: &[u8], out: &mut [f32]) -> Result<()> {
        self.decode(src, out)
    }

    /// Decodes one latent into bf16 values (exact for every format).
    pub fn decode_bf16(&self, src: &[u8], out: &mut [bf16]) -> Result<()> {
        self.decode(src, out)
    }

    /// Decodes one latent into f32 or bf16 values.
    pub fn decode<O: Decoded>(&self, src: &[u8], out: &mut [O]) -> Result<()> {
        self.check_len("encoded latent", src.len(), self.bytes_per_token())?;
        self.check_len("decoded latent", out.len(), self.elements_per_token())?;
        self.decode_unchecked(src, out);
        Ok(())
    }

    /// Encodes `T` latents stored back to back: `c_kv` is `[T, kv_lora_rank]`,
    /// `k_pe` is `[T, rope_dim]`, `out` is `[T, bytes_per_token]`. Returns `T`.
    pub fn encode_batch(
        &self,
        c_kv: Values<'_>,
        k_pe: Values<'_>,
        out: &mut [u8],
    ) -> Result<usize> {
        let tokens = out.len() / self.bytes_per_token();
        self.check_len("encoded batch", out.len(), tokens * self.bytes_per_token())?;
        self.check_len("c_kv batch", c_kv.len(), tokens * self.kv_lora_rank)?;
        self.check_len("k_pe batch", k_pe.len(), tokens * self.rope_dim)?;
        let (rank, rope) = (self.kv_lora_rank, self.rope_dim);
        for (t, dst) in out.chunks_exact_mut(self.bytes_per_token()).enumerate() {
            // In range: lengths were checked above.
            if let (Some(c), Some(k)) = (c_kv.window(t * rank, rank), k_pe.window(t * rope, rope)) {
                self.encode_unchecked(c, k, dst);
            }
        }
        Ok(tokens)
    }

    /// Decodes `T` latents stored back to back into `[T, elements_per_token]`
    /// values. Returns `T`.
    pub fn decode_batch<O: Decoded>(&self, src: &[u8], out: &mut [O]) -> Result<usize> {
        let tokens = src.len() / self.bytes_per_token();
        self.check_len("encoded batch", src.len(), tokens * self.bytes_per_token())?;
        self.check_len(
            "decoded batch",
            out.len(),
            tokens * self.elements_per_token(),
        )?;
        for (s, o) in src
            .chunks_exact(self.bytes_per_token())
            .zip(out.chunks_exact_mut(self.elements_per_token()))
        {
            self.decode_unchecked(s, o);
        }
        Ok(tokens)
    }

    fn check_len(&self, what: &str, got: usize, expected: usize) -> Result<()> {
        if got == expected {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: expected {expected} {}, got {got} ({} {}+{})",
                if what.starts_with("encoded") {
                    "bytes"
                } else {
                    "values"
                },
                self.dtype,
                self.kv_lora_rank,
                self.rope_dim
            )))
        }
    }

    /// Encodes one latent; the lengths must already be right.
    pub(crate) fn encode_unchecked(&self, c_kv: Values<'_>, k_pe: Values<'_>, out: &mut [u8]) {
        match c_kv {
            Values::Bf16(s) => self.encode_nope(s, out),
            Values::F16(s) => self.encode_nope(s, out),
            Values::F32(s) => self.encode_nope(s, out),
        }
        match k_pe {
            Values::Bf16(s) => self.encode_rope(s, out),
            Values::F16(s) => self.encode_rope(s, out),
            Values::F32(s) => self.encode_rope(s, out),
        }
    }

    /// Writes the NoPE codes and scales of `c_kv` into the token `out`.
    fn encode_nope<T: Element>(&self, c_kv: &[T], out: &mut [u8]) {
        let l = self.layout;
        let nope = &mut out[..l.rope_offset];
        match self.dtype {
            Dtype::Bf16 => bf16_format::encode_nope(c_kv, nope),
            Dtype::Fp8DsMla => fp8_ds_mla::encode_nope(c_kv, nope),
            Dtype::Mxfp6 => mxfp6::encode_nope(c_kv, nope),
            Dtype::Nvfp4DsMla => {
                let (codes, rest) = out.split_at_mut(l.nope_bytes);
                nvfp4_ds_mla::encode_nope(c_kv, codes, &mut rest[self.rope_dim..]);
            }
        }
    }

    /// Writes the RoPE values `k_pe` into the token `out`.
    fn encode_rope<T: Element>(&self, k_pe: &[T], out: &mut [u8]) {
        let rope = &mut out[self.layout.rope_offset..];
        match self.dtype {
            Dtype::Nvfp4DsMla => nvfp4_ds_mla::encode_rope(k_pe, &mut rope[..self.rope_dim]),
            _ => T::write_bf16(k_pe, rope),
        }
    }

    /// Decodes one latent; the lengths must already be right.
    pub(crate) fn decode_unchecked<O: Decoded>(&self, src: &[u8], out: &mut [O]) {
        let l = self.layout;
        let (nope_out, rope_out) = out.split_at_mut(self.kv_lora_rank);
        let (nope, rope) = src.split_at(l.rope_offset);
        match self.dtype {
            Dtype::Bf16 => bf16_format::decode_nope(nope, nope_out),
            Dtype::Fp8DsMla => fp8_ds_mla::decode_nope(nope, nope_out),
            Dtype::Mxfp6 => mxfp6::decode_nope(nope, nope_out),
            Dtype::Nvfp4DsMla => {
                nvfp4_ds_mla::decode_nope(nope, &src[l.scales_offset..], nope_out);
            }
        }
        match self.dtype {
            Dtype::Nvfp4DsMla => nvfp4_ds_mla::decode_rope(rope, rope_out),
            _ => bf16_format::decode_bf16_run(rope, rope_out),
        }
    }
}
