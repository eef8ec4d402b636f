//! vLLM 0.33's block hashes (`sha256_cbor`, `xxhash_cbor`), byte for byte.
//!
//! vLLM hashes the canonical CBOR (RFC 8949) of the tuple
//! `(parent_digest, tuple(block_tokens), extra_keys)`, where the first
//! block's parent is `NONE_HASH`, the hash of the CBOR text string of the
//! seed. `extra_keys` is CBOR `null` or an array, in this order, of
//! `("lora", name, path)`, `("mm", identifier, offset - block_start)` for
//! each multimodal input the block overlaps, and `("cache_salt", salt)` on
//! the first block. Only these CBOR types occur, so a few lines encode them.

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_128;

use crate::config::BlockHashKind;
use crate::hash::{BlockHash, ExtraKeys};
use crate::ids::TokenId;

/// vLLM's `NONE_HASH` seed when `PYTHONHASHSEED` is unset and the hash is SHA-256.
pub(crate) const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// The digest of one block as vLLM computes it: 32 bytes (SHA-256) or 16 (xxh3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineDigest {
    bytes: [u8; 32],
    len: u8,
}

impl EngineDigest {
    /// The digest's bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The digest whose last 16 bytes are `hash` (exact for 16-byte digests).
    pub(crate) fn from_xxh3(hash: BlockHash) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(&hash.0.to_be_bytes());
        EngineDigest { bytes, len: 16 }
    }

    /// The manager's 128-bit name: the digest's last 16 bytes, big-endian,
    /// so [`BlockHash::external`] (the low 64 bits) equals vLLM's published
    /// `int.from_bytes(digest, "big") & (2**64 - 1)`.
    pub(crate) fn block_hash(&self) -> BlockHash {
        let b = self.as_bytes();
        let tail: [u8; 16] = b[b.len() - 16..].try_into().expect("16 bytes");
        BlockHash(u128::from_be_bytes(tail))
    }
}

/// Hashes CBOR bytes with vLLM's function for `kind`.
fn digest(kind: BlockHashKind, cbor: &[u8]) -> EngineDigest {
    let mut bytes = [0u8; 32];
    match kind {
        BlockHashKind::Sha256Cbor => {
            bytes.copy_from_slice(&Sha256::digest(cbor));
            EngineDigest { bytes, len: 32 }
        }
        BlockHashKind::XxhashCbor | BlockHashKind::Xxh3 => {
            bytes[..16].copy_from_slice(&xxh3_128(cbor).to_be_bytes());
            EngineDigest { bytes, len: 16 }
        }
    }
}

/// `NONE_HASH`: the hash of the seed string.
pub(crate) fn none_hash(kind: BlockHashKind, seed: &str) -> EngineDigest {
    let mut buf = Vec::new();
    text(&mut buf, seed);
    digest(kind, &buf)
}

/// Hash of the block of `tokens` starting at token `start`, after `parent`.
pub(crate) fn block(
    kind: BlockHashKind,
    parent: &EngineDigest,
    start: usize,
    tokens: &[TokenId],
    keys: &ExtraKeys,
    buf: &mut Vec<u8>,
) -> EngineDigest {
    buf.clear();
    head(buf, 4, 3);
    head(buf, 2, parent.len as u64);
    buf.extend_from_slice(parent.as_bytes());
    head(buf, 4, tokens.len() as u64);
    for &t in tokens {
        head(buf, 0, u64::from(t));
    }
    extra_keys(buf, start, start + tokens.len(), keys);
    digest(kind, buf)
}

/// vLLM's `generate_block_hash_extra_keys` for the block `start..end`.
fn extra_keys(buf: &mut Vec<u8>, start: usize, end: usize, keys: &ExtraKeys) {
    let lora = keys.adapter.as_deref();
    let salt = keys.salt.as_deref().filter(|s| start == 0 && !s.is_empty());
    let overlaps = |m: &&crate::hash::MultiModalKey| {
        m.offset < end && m.offset.saturating_add(m.length) > start
    };
    let mm = keys.mm.iter().filter(overlaps).count();
    let n = usize::from(lora.is_some()) + mm + usize::from(salt.is_some());
    if n == 0 {
        buf.push(0xf6); // null
        return;
    }
    head(buf, 4, n as u64);
    if let Some(name) = lora {
        head(buf, 4, 3);
        text(buf, "lora");
        text(buf, name);
        text(buf, keys.adapter_path.as_deref().unwrap_or(""));
    }
    for m in keys.mm.iter().filter(overlaps) {
        head(buf, 4, 3);
        text(buf, "mm");
        text(buf, &m.hash);
        int(buf, m.offset as i128 - start as i128);
    }
    if let Some(s) = salt {
        head(buf, 4, 2);
        text(buf, "cache_salt");
        text(buf, s);
    }
}

/// A CBOR head: major type and argument, in the shortest form.
fn head(buf: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    match arg {
        0..=23 => buf.push(m | arg as u8),
        24..=0xff => buf.extend_from_slice(&[m | 24, arg as u8]),
        0x100..=0xffff => {
            buf.push(m | 25);
            buf.extend_from_slice(&(arg as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            buf.push(m | 26);
            buf.extend_from_slice(&(arg as u32).to_be_bytes());
        }
        _ => {
            buf.push(m | 27);
            buf.extend_from_slice(&arg.to_be_bytes());
        }
    }
}

/// A CBOR text string.
fn text(buf: &mut Vec<u8>, s: &str) {
    head(buf, 3, s.len() as u64);
    buf.extend_from_slice(s.as_bytes());
}

/// A CBOR integer (negative ones as major type 1, `-1 - n`).
fn int(buf: &mut Vec<u8>, v: i128) {
    if v >= 0 {
        head(buf, 0, v as u64);
    } else {
        head(buf, 1, (-1 - v) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cbor_heads_take_the_shortest_form() {
        let enc = |major, arg| {
            let mut b = Vec::new();
            head(&mut b, major, arg);
            b
        };
        assert_eq!(enc(0, 23), [0x17]);
        assert_eq!(enc(0, 24), [0x18, 24]);
        assert_eq!(enc(0, 256), [0x19, 1, 0]);
        assert_eq!(enc(0, 65_536), [0x1a, 0, 1, 0, 0]);
        assert_eq!(enc(0, 1 << 32), [0x1b, 0, 0, 0, 1, 0, 0, 0, 0]);
        let mut b = Vec::new();
        int(&mut b, -1);
        int(&mut b, -25);
        assert_eq!(b, [0x20, 0x38, 24]);
    }
}
