//! The remote tier's keys and values.
//!
//! Key: `mla:{namespace:016x}:{block hash:032x}`, where the namespace digest
//! covers the deployment's name and the block format, so differently
//! configured caches never read each other's blocks.
//!
//! Value: a 56-byte header, then one block (all layers, stored format: the
//! latent part of every layer, then the indexer part of every layer, if the
//! cache has one):
//!
//! ```text
//! offset size field
//!      0    4 magic "MLAB"
//!      4    2 version (2), little-endian like every field
//!      6    1 format (0 bf16, 1 fp8_ds_mla, 2 mxfp6, 3 nvfp4_ds_mla,
//!                    4 fp8_e4m3: an engine's 576 e4m3 values, scaled per tensor)
//!      7    1 zero
//!      8    4 layers
//!     12    4 tokens per block
//!     16    4 latent bytes per token per layer
//!     20    4 indexer bytes per token per layer (0: no indexer part)
//!     24   16 block hash
//!     40    8 payload length
//!     48    8 xxh3-64 of bytes [0, 48) followed by the payload
//!     56      payload
//! ```
//!
//! The latent and indexer parts travel in one value under one checksum, so
//! a block comes back whole or not at all.
//!
//! A value is accepted only if every field matches what the reader expects
//! and the checksum holds: a corrupted, truncated or foreign value is a miss.

use xxhash_rust::xxh3::Xxh3;

use crate::config::{CacheConfig, Dtype};
use crate::hash::BlockHash;

/// Bytes before the payload.
pub const HEADER_LEN: usize = 56;
const MAGIC: &[u8; 4] = b"MLAB";
const VERSION: u16 = 2;
/// Bytes of the fields that do not depend on the block.
const GEOMETRY_LEN: usize = 24;
const HASH_AT: usize = GEOMETRY_LEN;
const PAYLOAD_LEN_AT: usize = HASH_AT + 16;
const CHECKSUM_AT: usize = PAYLOAD_LEN_AT + 8;

/// How a value's latents are encoded: one of mla_cache's storage formats,
/// or an engine's own format that mla_cache moves but never decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// One of mla_cache's formats.
    Stored(Dtype),
    /// 576 e4m3 values a token with one scale for the whole tensor, kept by
    /// the engine (SGLang's and vLLM's plain `fp8` MLA cache): 576 bytes.
    Fp8E4m3,
}

impl Encoding {
    /// Header code: a [`Dtype`]'s position, then the engines' formats.
    fn code(self) -> u8 {
        match self {
            Encoding::Stored(dtype) => {
                Dtype::ALL.iter().position(|&d| d == dtype).expect("listed") as u8
            }
            Encoding::Fp8E4m3 => Dtype::ALL.len() as u8,
        }
    }

    /// Latent bytes per token of the DeepSeek geometry (512 + 64).
    fn deepseek_bytes_per_token(self) -> crate::error::Result<usize> {
        let deepseek = CacheConfig::new(0);
        match self {
            Encoding::Stored(dtype) => {
                dtype.bytes_per_token(deepseek.kv_lora_rank, deepseek.rope_dim)
            }
            Encoding::Fp8E4m3 => Ok(deepseek.kv_lora_rank + deepseek.rope_dim),
        }
    }
}

impl std::str::FromStr for Encoding {
    type Err = crate::error::Error;

    /// A [`Dtype`] name, or `fp8_e4m3`.
    fn from_str(s: &str) -> crate::error::Result<Self> {
        if s == "fp8_e4m3" {
            return Ok(Encoding::Fp8E4m3);
        }
        s.parse().map(Encoding::Stored)
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Encoding::Stored(dtype) => dtype.fmt(f),
            Encoding::Fp8E4m3 => f.write_str("fp8_e4m3"),
        }
    }
}

/// What a remote value holds: the geometry of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFormat {
    /// How the latents are encoded.
    pub encoding: Encoding,
    /// Layers per block.
    pub num_layers: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Latent bytes per token and layer.
    pub bytes_per_token: u32,
    /// Indexer-key bytes per token and layer (0 without an indexer).
    pub indexer_bytes_per_token: u32,
    /// Payload bytes (`num_layers x block_size x (bytes_per_token +
    /// indexer_bytes_per_token)`, or 0 for bookkeeping-only replays).
    pub payload_len: u64,
}

impl BlockFormat {
    /// The format of `config`'s blocks, with `payload_len` bytes each.
    pub fn new(config: &CacheConfig, payload_len: usize) -> Self {
        Self {
            encoding: Encoding::Stored(config.dtype),
            num_layers: config.num_layers as u32,
            block_size: config.block_size as u32,
            bytes_per_token: config.latent_bytes_per_token_per_layer() as u32,
            indexer_bytes_per_token: config.indexer_bytes_per_token_per_layer() as u32,
            payload_len: payload_len as u64,
        }
    }

    /// The format of an engine's chunk of `chunk_bytes`: `num_layers` layers
    /// of `tokens` MLA latents of the DeepSeek geometry (512 + 64) in
    /// `encoding`, no indexer keys. Refuses a chunk of any other size,
    /// naming what was expected.
    pub fn mla_chunk(
        encoding: Encoding,
        num_layers: u32,
        tokens: u32,
        chunk_bytes: usize,
    ) -> crate::error::Result<Self> {
        let bytes_per_token = encoding.deepseek_bytes_per_token()?;
        let expected = (num_layers as usize)
            .checked_mul(tokens as usize)
            .and_then(|n| n.checked_mul(bytes_per_token))
            .unwrap_or(0);
        if expected == 0 || chunk_bytes != expected {
            return Err(crate::error::Error::InvalidConfig(format!(
                "a chunk of {chunk_bytes} bytes is not {num_layers} layers x {tokens} tokens of \
                 MLA latents in {encoding} ({bytes_per_token} bytes a token: {expected} bytes)"
            )));
        }
        Ok(Self {
            encoding,
            num_layers,
            block_size: tokens,
            bytes_per_token: bytes_per_token as u32,
            indexer_bytes_per_token: 0,
            payload_len: chunk_bytes as u64,
        })
    }

    /// Bytes of a whole value.
    pub fn value_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }

    /// The header fields that do not depend on the block, bytes `[0, 24)`.
    fn geometry(&self) -> [u8; GEOMETRY_LEN] {
        let mut g = [0u8; GEOMETRY_LEN];
        g[..4].copy_from_slice(MAGIC);
        g[4..6].copy_from_slice(&VERSION.to_le_bytes());
        g[6] = self.encoding.code();
        g[8..12].copy_from_slice(&self.num_layers.to_le_bytes());
        g[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        g[16..20].copy_from_slice(&self.bytes_per_token.to_le_bytes());
        g[20..24].copy_from_slice(&self.indexer_bytes_per_token.to_le_bytes());
        g
    }

    /// The key prefix `mla:{digest}:` for a deployment named `namespace`.
    pub fn key_prefix(&self, namespace: &str) -> String {
        let mut h = Xxh3::new();
        h.update(namespace.as_bytes());
        h.update(&[0]);
        h.update(&self.geometry());
        h.update(&self.payload_len.to_le_bytes());
        format!("mla:{:016x}:", h.digest())
    }

    /// A value for block `hash`: header, then the payload that `fill` writes
    /// (`payload_len` bytes). The checksum is computed after `fill`.
    pub fn encode<E>(
        &self,
        hash: BlockHash,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Vec<u8>, E> {
        let mut value = vec![0u8; self.value_len()];
        value[..GEOMETRY_LEN].copy_from_slice(&self.geometry());
        value[HASH_AT..PAYLOAD_LEN_AT].copy_from_slice(&hash.0.to_le_bytes());
        value[PAYLOAD_LEN_AT..CHECKSUM_AT].copy_from_slice(&self.payload_len.to_le_bytes());
        fill(&mut value[HEADER_LEN..])?;
        let sum = checksum(&value);
        value[CHECKSUM_AT..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
        Ok(value)
    }

    /// Checks a value read for block `hash`; on success its payload is
    /// `value[HEADER_LEN..]`.
    pub fn check(&self, hash: BlockHash, value: &[u8]) -> Result<(), Rejected> {
        if value.len() < HEADER_LEN {
            return Err(Rejected::Truncated);
        }
        if value[..4] != MAGIC[..] || value[4..6] != VERSION.to_le_bytes() {
            return Err(Rejected::NotABlock);
        }
        if value[..GEOMETRY_LEN] != self.geometry() {
            return Err(Rejected::OtherFormat);
        }
        if value[HASH_AT..PAYLOAD_LEN_AT] != hash.0.to_le_bytes() {
            return Err(Rejected::OtherBlock);
        }
        if value[PAYLOAD_LEN_AT..CHECKSUM_AT] != self.payload_len.to_le_bytes()
            || value.len() != self.value_len()
        {
            return Err(Rejected::Truncated);
        }
        if value[CHECKSUM_AT..HEADER_LEN] != checksum(value).to_le_bytes() {
            return Err(Rejected::Checksum);
        }
        Ok(())
    }
}

/// Why a remote value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Shorter or longer than the header says, or than the format expects.
    Truncated,
    /// Wrong magic or version.
    NotABlock,
    /// Another format or geometry.
    OtherFormat,
    /// The header names another block.
    OtherBlock,
    /// The checksum does not match.
    Checksum,
}

/// xxh3-64 of the header before the checksum field and of the payload.
fn checksum(value: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(&value[..CHECKSUM_AT]);
    h.update(&value[HEADER_LEN..]);
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format() -> BlockFormat {
        let config = CacheConfig::preset("deepseek-v2-lite", 8, Dtype::Mxfp6).unwrap();
        BlockFormat::new(&config, 27 * 64 * 528)
    }

    #[test]
    fn a_value_round_trips_and_any_damage_is_rejected() {
        let f = format();
        let h = BlockHash(0x1234_5678_9abc_def0_1122_3344_5566_7788);
        let value = f
            .encode::<()>(h, |p| {
                for (i, b) in p.iter_mut().enumerate() {
                    *b = i as u8;
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(value.len(), HEADER_LEN + 27 * 64 * 528);
        assert_eq!(f.check(h, &value), Ok(()));
        assert_eq!(f.check(BlockHash(1), &value), Err(Rejected::OtherBlock));
        assert_eq!(
            f.check(h, &value[..value.len() - 1]),
            Err(Rejected::Truncated)
        );
        assert_eq!(f.check(h, &value[..10]), Err(Rejected::Truncated));
        for at in [0, 6, 9, 21, 40, 47, 50, HEADER_LEN, value.len() - 1] {
            let mut bad = value.clone();
            bad[at] ^= 0x10;
            assert!(f.check(h, &bad).is_err(), "flip at {at} accepted");
        }
        let other = BlockFormat {
            encoding: Encoding::Stored(Dtype::Fp8DsMla),
            ..f
        };
        assert_eq!(other.check(h, &value), Err(Rejected::OtherFormat));
        let with_indexer = BlockFormat {
            indexer_bytes_per_token: 132,
            ..f
        };
        assert_eq!(with_indexer.check(h, &value), Err(Rejected::OtherFormat));
        assert_ne!(f.key_prefix("a"), with_indexer.key_prefix("a"));
        assert_ne!(f.key_prefix("a"), f.key_prefix("b"));
        assert_ne!(f.key_prefix("a"), other.key_prefix("a"));
    }

    #[test]
    fn an_engine_fp8_chunk_is_576_bytes_a_token_and_no_stored_format() {
        let fp8 = BlockFormat::mla_chunk("fp8_e4m3".parse().unwrap(), 2, 16, 2 * 16 * 576).unwrap();
        // The same bytes as a bf16 chunk of half the tokens, never read as one.
        let bf16 =
            BlockFormat::mla_chunk(Encoding::Stored(Dtype::Bf16), 2, 8, 2 * 16 * 576).unwrap();
        assert_eq!(fp8.payload_len, bf16.payload_len);
        let h = BlockHash(7);
        let value = fp8
            .encode::<()>(h, |p| {
                p.fill(3);
                Ok(())
            })
            .unwrap();
        assert_eq!(fp8.check(h, &value), Ok(()));
        assert_eq!(bf16.check(h, &value), Err(Rejected::OtherFormat));
        assert_ne!(fp8.key_prefix("a"), bf16.key_prefix("a"));
        let err = BlockFormat::mla_chunk(Encoding::Fp8E4m3, 2, 16, 2 * 16 * 656).unwrap_err();
        assert!(
            err.to_string().contains("fp8_e4m3 (576 bytes a token"),
            "{err}"
        );
        assert!("fp8_e5m2".parse::<Encoding>().is_err());
        // The codes stored values carry never change.
        let codes = [
            Dtype::Bf16,
            Dtype::Fp8DsMla,
            Dtype::Mxfp6,
            Dtype::Nvfp4DsMla,
        ]
        .map(|d| Encoding::Stored(d).code());
        assert_eq!((codes, Encoding::Fp8E4m3.code()), ([0, 1, 2, 3], 4));
        assert!(BlockFormat::mla_chunk(Encoding::Fp8E4m3, u32::MAX, u32::MAX, 1).is_err());
    }
}
