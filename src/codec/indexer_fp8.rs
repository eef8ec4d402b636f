//! The indexer key cache of DeepSeek-V3.2's sparse attention: per token and
//! layer, `head_dim` float8 e4m3fn key codes and one fp32 power-of-two
//! scale. A block of `block_size` tokens stores every token's codes first
//! (token after token), then every token's scale (layout in
//! `docs/formats.md`, section "indexer keys").

use super::element::{Decoded, Element, Values};
use super::minifloat::{ceil_log2, e4m3_from_f32, e4m3_to_f32, finite_amax, pow2, E4M3_MAX};
use crate::config::IndexerGeometry;
use crate::error::{Error, Result};

/// Smallest `amax` the scale is computed from (vLLM's indexer writer's floor).
pub const MIN_AMAX: f32 = 1e-4;
/// Bytes of one scale (fp32).
pub const SCALE_BYTES: usize = 4;

/// Exponent `e` of a key's scale `2^e`: `ceil(log2(max(amax, 1e-4) / 448))`,
/// with the division an f32 division rounded to nearest and the
/// `ceil(log2)` exact. Lies in `-22..=120`.
pub fn scale_exponent(amax: f32) -> i32 {
    ceil_log2(amax.max(MIN_AMAX) / E4M3_MAX)
}

/// Encoder and decoder of one block of indexer keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerCodec {
    head_dim: usize,
    block_size: usize,
}

impl IndexerCodec {
    /// A codec for `geometry` in blocks of `block_size` tokens.
    pub fn new(geometry: IndexerGeometry, block_size: usize) -> Result<Self> {
        geometry.validate()?;
        if block_size == 0 {
            return Err(Error::InvalidConfig("block_size must be positive".into()));
        }
        Ok(Self {
            head_dim: geometry.head_dim,
            block_size,
        })
    }

    /// Values per key.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of one token's key and scale.
    pub fn bytes_per_token(&self) -> usize {
        self.head_dim + SCALE_BYTES
    }

    /// Bytes of one block (`block_size x (head_dim + 4)`).
    pub fn block_bytes(&self) -> usize {
        self.block_size * self.bytes_per_token()
    }

    /// Offset of token `offset`'s codes within a block.
    pub fn codes_offset(&self, offset: usize) -> usize {
        offset * self.head_dim
    }

    /// Offset of token `offset`'s scale within a block.
    pub fn scale_offset(&self, offset: usize) -> usize {
        self.block_size * self.head_dim + offset * SCALE_BYTES
    }

    /// Quantizes `key` (`head_dim` values) into token `offset` of `block`
    /// (`block_bytes()` bytes).
    pub fn encode(&self, key: Values<'_>, block: &mut [u8], offset: usize) -> Result<()> {
        self.check(key.len(), block.len(), offset)?;
        self.encode_unchecked(key, block, offset, &mut vec![0f32; self.head_dim]);
        Ok(())
    }

    /// Dequantizes token `offset` of `block` into `out` (`head_dim` values):
    /// `e4m3(code) x scale`.
    pub fn decode<O: Decoded>(&self, block: &[u8], offset: usize, out: &mut [O]) -> Result<()> {
        self.check(out.len(), block.len(), offset)?;
        self.decode_unchecked(block, offset, out);
        Ok(())
    }

    fn check(&self, values: usize, block: usize, offset: usize) -> Result<()> {
        if values != self.head_dim || block != self.block_bytes() || offset >= self.block_size {
            return Err(Error::InvalidArgument(format!(
                "indexer key: {values} values, a {block}-byte block and offset {offset}; \
                 expected {} values, {} bytes and an offset below {}",
                self.head_dim,
                self.block_bytes(),
                self.block_size
            )));
        }
        Ok(())
    }

    /// [`IndexerCodec::encode`] with the lengths already checked; `wide` is
    /// scratch space of `head_dim` values.
    pub(crate) fn encode_unchecked(
        &self,
        key: Values<'_>,
        block: &mut [u8],
        offset: usize,
        wide: &mut [f32],
    ) {
        match key {
            Values::Bf16(s) => Element::widen(s, wide),
            Values::F16(s) => Element::widen(s, wide),
            Values::F32(s) => Element::widen(s, wide),
        }
        let e = scale_exponent(finite_amax(wide));
        // Multiplying by 2^-e equals dividing by 2^e, rounding included.
        let inv = pow2(-e);
        let codes = self.codes_offset(offset);
        for (c, &v) in block[codes..codes + self.head_dim]
            .iter_mut()
            .zip(wide.iter())
        {
            *c = e4m3_from_f32(v * inv);
        }
        let at = self.scale_offset(offset);
        block[at..at + SCALE_BYTES].copy_from_slice(&pow2(e).to_le_bytes());
    }

    /// [`IndexerCodec::decode`] with the lengths already checked.
    pub(crate) fn decode_unchecked<O: Decoded>(&self, block: &[u8], offset: usize, out: &mut [O]) {
        let at = self.scale_offset(offset);
        let scale = f32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
        let codes = self.codes_offset(offset);
        for (o, &c) in out.iter_mut().zip(&block[codes..codes + self.head_dim]) {
            *o = O::from_f32(e4m3_to_f32(c) * scale);
        }
    }
}
