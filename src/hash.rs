//! Prefix hashing: chained, seeded 128-bit xxh3 over full blocks.
//!
//! ```text
//!   root = H(seed, "mla_cache root")
//!   h[0] = H(seed, root   | tokens[0..B)   | adapter | salt | mm keys in block 0)
//!   h[1] = H(seed, h[0]   | tokens[B..2B)  | adapter |        mm keys in block 1)
//!   ...
//! ```
//! A block's hash names its tokens *and every token before it*, so equal
//! hashes mean equal prefixes. The salt enters the first block only and, by
//! chaining, every later one: two salts never share a block.

use std::sync::Arc;

use xxhash_rust::const_xxh3::const_custom_default_secret;
use xxhash_rust::xxh3::{xxh3_128_with_seed, xxh3_64_with_seed};

use crate::config::BlockHashKind;
use crate::engine_hash::{self, EngineDigest};
use crate::error::{Error, Result};
use crate::ids::TokenId;

/// The 128-bit hash of a full block and its whole prefix.
///
/// Inside the library (the prefix index, the lower tiers' keys) blocks are
/// named by all 128 bits. Every surface that shows a hash to other software
/// (events, [`BlockManager::block_hashes`](crate::BlockManager::block_hashes),
/// the C and Python bindings) shows [`BlockHash::external`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// The 64-bit hash other software sees: the low 64 bits of the 128-bit
    /// chain hash (`hash as u64`). Routers and engines' msgpack publishers
    /// take unsigned 64-bit ints; collisions of these never reach the
    /// library, which keys everything by the full 128 bits.
    pub fn external(self) -> u64 {
        self.0 as u64
    }
}

/// Keys beyond the token ids that decide whether two blocks may be shared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraKeys {
    /// LoRA adapter (or any model variant) the KV was computed with; enters every block.
    pub adapter: Option<String>,
    /// Cache salt for tenant isolation; enters the first block (and so all).
    pub salt: Option<String>,
    /// Multimodal inputs: each enters every block its placeholder tokens
    /// overlap (in offset order, as vLLM assumes).
    pub mm: Vec<MultiModalKey>,
    /// The adapter's path, part of vLLM's LoRA key (`("lora", name, path)`)
    /// under an engine-compatible block hash; `""` when unset. The default
    /// hash ignores it.
    pub adapter_path: Option<String>,
}

/// A multimodal input (an image, say) whose placeholder tokens occupy
/// `offset..offset + length` of the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiModalKey {
    /// Content hash of the input (any string, e.g. a hex digest).
    pub hash: String,
    /// First placeholder token.
    pub offset: usize,
    /// Number of placeholder tokens.
    pub length: usize,
}

impl ExtraKeys {
    /// Keys with only an adapter.
    pub fn adapter(name: impl Into<String>) -> Self {
        Self {
            adapter: Some(name.into()),
            ..Self::default()
        }
    }

    /// Keys with only a cache salt.
    pub fn salt(salt: impl Into<String>) -> Self {
        Self {
            salt: Some(salt.into()),
            ..Self::default()
        }
    }

    /// True when no extra key is set.
    pub fn is_empty(&self) -> bool {
        self.adapter.is_none() && self.salt.is_none() && self.mm.is_empty()
    }

    /// Checks that every multimodal input covers a non-empty range of the
    /// prompt's `prompt_len` tokens, without overflow
    /// ([`Error::InvalidArgument`] otherwise).
    pub fn check(&self, prompt_len: usize) -> Result<()> {
        for (i, m) in self.mm.iter().enumerate() {
            let end = m.offset.checked_add(m.length);
            if m.length == 0 || end.is_none_or(|end| end > prompt_len) {
                return Err(Error::InvalidArgument(format!(
                    "multimodal input {i} ({:?}) covers tokens {}..{}+{}, which is {} \
                     the prompt's {prompt_len} tokens",
                    m.hash,
                    m.offset,
                    m.offset,
                    m.length,
                    if m.length == 0 { "empty in" } else { "outside" },
                )));
            }
        }
        Ok(())
    }
}

/// [`ExtraKeys`] reduced to what the hash chain consumes, computed once per request.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyDigest {
    adapter: Option<u64>,
    salt: Option<u64>,
    /// (digest, first token, end token) of each multimodal input.
    mm: Vec<(u64, usize, usize)>,
    /// The adapter's name, carried into events.
    pub(crate) adapter_name: Option<Arc<str>>,
    /// The keys themselves, under an engine-compatible block hash.
    engine: Option<ExtraKeys>,
}

const TAG_ADAPTER: u8 = 1;
const TAG_SALT: u8 = 2;
const TAG_MM: u8 = 3;

/// A chain of block hashes as it is extended block by block, with what the
/// next block needs of the last one beyond its 128 bits: under
/// `sha256_cbor`, its whole 32-byte digest (kept, so a decode block costs one
/// digest, not the chain's from its start).
#[derive(Debug, Clone, Default)]
pub(crate) struct Chain {
    /// The hashes of the leading full blocks.
    pub(crate) hashes: Vec<BlockHash>,
    /// The engine digest of the last of `hashes`, under an engine kind
    /// (`None`: recomputed from the start when needed).
    last_digest: Option<EngineDigest>,
}

impl Chain {
    /// A chain of hashes the caller computed (no engine digest kept: the
    /// manager never extends it).
    pub(crate) fn from_hashes(hashes: Vec<BlockHash>) -> Self {
        Self {
            hashes,
            last_digest: None,
        }
    }

    /// A copy of the first `n` hashes (the whole chain, digest kept, when
    /// `n` reaches its end): what [`Chain::truncate`] of a clone leaves,
    /// without copying the rest.
    pub(crate) fn prefix(&self, n: usize) -> Self {
        if n >= self.hashes.len() {
            return self.clone();
        }
        Self::from_hashes(self.hashes[..n].to_vec())
    }

    /// Keeps the first `n` hashes.
    pub(crate) fn truncate(&mut self, n: usize) {
        if n < self.hashes.len() {
            self.hashes.truncate(n);
            self.last_digest = None;
        }
    }
}

/// Computes block hashes for one manager (one seed).
#[derive(Debug, Clone)]
pub(crate) struct Hasher {
    seed: u64,
    /// xxh3's secret for `seed`, derived once: a seeded xxh3 of more than
    /// 240 bytes is its hash under this secret, which it would otherwise
    /// derive on every call.
    secret: [u8; 192],
    root: BlockHash,
    block_size: usize,
    kind: BlockHashKind,
    /// vLLM's `NONE_HASH`, under an engine-compatible kind.
    none_hash: EngineDigest,
}

impl Hasher {
    /// A hasher of the library's own kind.
    #[cfg(test)]
    pub(crate) fn new(seed: u64, block_size: usize) -> Self {
        Self::with_kind(
            BlockHashKind::Xxh3,
            seed.to_string().as_str(),
            seed,
            block_size,
        )
    }

    /// A hasher of `kind`; `engine_seed` is vLLM's `NONE_HASH` seed string.
    pub(crate) fn with_kind(
        kind: BlockHashKind,
        engine_seed: &str,
        seed: u64,
        block_size: usize,
    ) -> Self {
        let root = BlockHash(xxh3_128_with_seed(b"mla_cache root", seed));
        Self {
            seed,
            secret: const_custom_default_secret(seed),
            root,
            block_size,
            kind,
            none_hash: engine_hash::none_hash(kind, engine_seed),
        }
    }

    pub(crate) fn digest(&self, keys: &ExtraKeys) -> KeyDigest {
        let h = |s: &str| xxh3_64_with_seed(s.as_bytes(), self.seed);
        KeyDigest {
            adapter: keys.adapter.as_deref().map(h),
            salt: keys.salt.as_deref().map(h),
            mm: keys
                .mm
                .iter()
                .map(|m| (h(&m.hash), m.offset, m.offset.saturating_add(m.length)))
                .collect(),
            adapter_name: keys.adapter.as_deref().map(Arc::from),
            engine: (self.kind != BlockHashKind::Xxh3).then(|| keys.clone()),
        }
    }

    /// Hash of block `index` (its `block_size` tokens) after `parent`.
    pub(crate) fn block(
        &self,
        parent: BlockHash,
        index: usize,
        tokens: &[TokenId],
        keys: &KeyDigest,
        buf: &mut Vec<u8>,
    ) -> BlockHash {
        debug_assert_eq!(tokens.len(), self.block_size);
        buf.clear();
        buf.extend_from_slice(&parent.0.to_le_bytes());
        extend_le(buf, tokens);
        if let Some(a) = keys.adapter {
            buf.push(TAG_ADAPTER);
            buf.extend_from_slice(&a.to_le_bytes());
        }
        if let (0, Some(s)) = (index, keys.salt) {
            buf.push(TAG_SALT);
            buf.extend_from_slice(&s.to_le_bytes());
        }
        let (start, end) = (index * self.block_size, (index + 1) * self.block_size);
        for &(digest, first, last) in &keys.mm {
            if first < end && last > start {
                buf.push(TAG_MM);
                buf.extend_from_slice(&digest.to_le_bytes());
                buf.extend_from_slice(&(first as u64).to_le_bytes());
            }
        }
        self.xxh3(buf)
    }

    /// `xxh3_128_with_seed(bytes, seed)`, with the seed's secret derived
    /// once, by twox-hash: its long path (a block of 64 tokens and more)
    /// picks AVX2 at run time, where xxhash-rust uses the SIMD width the
    /// build targets (SSE2 for a portable build).
    fn xxh3(&self, bytes: &[u8]) -> BlockHash {
        BlockHash(
            twox_hash::XxHash3_128::oneshot_with_seed_and_secret(self.seed, &self.secret, bytes)
                .expect("xxh3's default secret length is valid"),
        )
    }

    /// Appends to `chain` the hashes of full blocks `chain.hashes.len()..`
    /// of `tokens`, up to `limit` blocks in all.
    pub(crate) fn extend_chain(
        &self,
        tokens: &[TokenId],
        keys: &KeyDigest,
        limit: usize,
        chain: &mut Chain,
        buf: &mut Vec<u8>,
    ) {
        let full = (tokens.len() / self.block_size).min(limit);
        let out = &mut chain.hashes;
        out.reserve(full.saturating_sub(out.len()));
        if let Some(engine_keys) = &keys.engine {
            return self.extend_engine_chain(tokens, engine_keys, full, chain, buf);
        }
        for i in out.len()..full {
            let parent = if i == 0 { self.root } else { out[i - 1] };
            let block = &tokens[i * self.block_size..(i + 1) * self.block_size];
            out.push(self.block(parent, i, block, keys, buf));
        }
    }

    /// [`Hasher::extend_chain`] of tokens the caller owns: a block after the
    /// first, when nothing but its tokens follows the parent hash (no
    /// adapter, no multimodal input), is hashed where it lies, the parent
    /// written over the four tokens before it for the duration of the hash
    /// (then put back) instead of the block being copied behind it. The
    /// hashes are [`Hasher::extend_chain`]'s; `tokens` end as they started.
    pub(crate) fn extend_chain_in_place(
        &self,
        tokens: &mut [TokenId],
        keys: &KeyDigest,
        limit: usize,
        chain: &mut Chain,
        buf: &mut Vec<u8>,
    ) {
        let bs = self.block_size;
        let in_place = cfg!(target_endian = "little")
            && bs >= PARENT_TOKENS
            && keys.engine.is_none()
            && keys.adapter.is_none()
            && keys.mm.is_empty();
        let full = (tokens.len() / bs).min(limit);
        if !in_place || full == 0 {
            return self.extend_chain(tokens, keys, limit, chain, buf);
        }
        // The first block (salted, perhaps) has no tokens before it.
        self.extend_chain(&tokens[..bs], keys, 1, chain, buf);
        let out = &mut chain.hashes;
        out.reserve(full.saturating_sub(out.len()));
        for i in out.len()..full {
            let window = &mut tokens[i * bs - PARENT_TOKENS..(i + 1) * bs];
            let (head, _) = window.split_at_mut(PARENT_TOKENS);
            let saved: [TokenId; PARENT_TOKENS] = (&*head).try_into().expect("4 tokens");
            let parent = out[i - 1].0.to_le_bytes();
            for (t, b) in head.iter_mut().zip(parent.chunks_exact(4)) {
                *t = TokenId::from_le_bytes(b.try_into().expect("4 bytes"));
            }
            let hash = self.xxh3(le_bytes(window));
            window[..PARENT_TOKENS].copy_from_slice(&saved);
            out.push(hash);
        }
    }
}

/// Tokens a parent hash covers in place (16 bytes).
const PARENT_TOKENS: usize = 4;

impl Hasher {
    /// [`Hasher::extend_chain`] for vLLM's kinds. A 16-byte digest is the
    /// block hash itself; a SHA-256 parent is the chain's last digest, or,
    /// when the chain does not have it, recomputed from the chain's start.
    fn extend_engine_chain(
        &self,
        tokens: &[TokenId],
        keys: &ExtraKeys,
        full: usize,
        chain: &mut Chain,
        buf: &mut Vec<u8>,
    ) {
        let out = &mut chain.hashes;
        let b = self.block_size;
        let mut block = |parent: &EngineDigest, i: usize| {
            engine_hash::block(
                self.kind,
                parent,
                i * b,
                &tokens[i * b..(i + 1) * b],
                keys,
                buf,
            )
        };
        let mut parent = match (out.last(), self.kind) {
            (None, _) => self.none_hash,
            (Some(&last), BlockHashKind::XxhashCbor) => EngineDigest::from_xxh3(last),
            (Some(_), _) if chain.last_digest.is_some() => chain.last_digest.expect("checked"),
            (Some(_), _) => {
                let mut d = self.none_hash;
                for i in 0..out.len() {
                    d = block(&d, i);
                }
                d
            }
        };
        if out.len() >= full {
            return;
        }
        for i in out.len()..full {
            parent = block(&parent, i);
            out.push(parent.block_hash());
        }
        chain.last_digest = Some(parent);
    }
}

/// Appends the tokens' little-endian bytes.
fn extend_le(buf: &mut Vec<u8>, tokens: &[TokenId]) {
    #[cfg(target_endian = "little")]
    buf.extend_from_slice(le_bytes(tokens));
    #[cfg(not(target_endian = "little"))]
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
}

/// The tokens' memory as bytes: their little-endian bytes on a
/// little-endian machine (the only one that calls it).
fn le_bytes(tokens: &[TokenId]) -> &[u8] {
    // SAFETY: u32 has no padding and any byte is a valid u8; the slice
    // covers exactly the tokens' memory.
    unsafe {
        std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(h: &Hasher, tokens: &[u32], keys: &ExtraKeys) -> Vec<BlockHash> {
        let mut out = Chain::default();
        h.extend_chain(
            tokens,
            &h.digest(keys),
            usize::MAX,
            &mut out,
            &mut Vec::new(),
        );
        out.hashes
    }

    #[test]
    fn only_full_blocks_are_hashed_and_the_chain_is_prefix_stable() {
        let h = Hasher::new(7, 4);
        let a = chain(&h, &[1, 2, 3, 4, 5, 6, 7, 8, 9], &ExtraKeys::default());
        assert_eq!(a.len(), 2);
        let b = chain(&h, &[1, 2, 3, 4, 5, 6, 7, 0], &ExtraKeys::default());
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        // Same block tokens after a different prefix hash differently.
        let c = chain(&h, &[9, 9, 9, 9, 5, 6, 7, 8], &ExtraKeys::default());
        assert_ne!(a[1], c[1]);
    }

    #[test]
    fn seeds_adapters_salts_and_images_separate_chains() {
        let tokens: Vec<u32> = (0..8).collect();
        let h = Hasher::new(1, 4);
        let base = chain(&h, &tokens, &ExtraKeys::default());
        assert_ne!(
            base,
            chain(&Hasher::new(2, 4), &tokens, &ExtraKeys::default())
        );
        let lora = chain(&h, &tokens, &ExtraKeys::adapter("a"));
        assert_ne!(base[0], lora[0]);
        assert_ne!(lora, chain(&h, &tokens, &ExtraKeys::adapter("b")));
        let salted = chain(&h, &tokens, &ExtraKeys::salt("tenant"));
        assert!(salted.iter().zip(&base).all(|(s, b)| s != b));
        let image = |hash: &str| ExtraKeys {
            mm: vec![MultiModalKey {
                hash: hash.into(),
                offset: 5,
                length: 2,
            }],
            ..ExtraKeys::default()
        };
        let img = chain(&h, &tokens, &image("cat"));
        assert_eq!(img[0], base[0], "image starts in block 1");
        assert_ne!(img[1], base[1]);
        assert_ne!(img[1], chain(&h, &tokens, &image("dog"))[1]);
    }

    #[test]
    fn a_chain_extended_block_by_block_equals_one_hashed_at_once() {
        let tokens: Vec<u32> = (0..40).map(|t| t * 7 % 23).collect();
        let keys = ExtraKeys::salt("s");
        for kind in BlockHashKind::ALL {
            let h = Hasher::with_kind(kind, "seed", 3, 4);
            let digest = h.digest(&keys);
            let whole = chain(&h, &tokens, &keys);
            let mut grown = Chain::default();
            for end in (0..=tokens.len()).step_by(3) {
                h.extend_chain(
                    &tokens[..end],
                    &digest,
                    usize::MAX,
                    &mut grown,
                    &mut Vec::new(),
                );
            }
            h.extend_chain(&tokens, &digest, usize::MAX, &mut grown, &mut Vec::new());
            assert_eq!(grown.hashes, whole, "{kind}");
            // Cut back, the chain regrows to the same hashes without its last digest.
            let mut cut = grown.prefix(3);
            assert_eq!(
                cut.hashes,
                whole[..3],
                "{kind}: a prefix copies the first hashes"
            );
            grown.truncate(3);
            h.extend_chain(&tokens, &digest, usize::MAX, &mut grown, &mut Vec::new());
            assert_eq!(grown.hashes, whole, "{kind} after truncate");
            h.extend_chain(&tokens, &digest, usize::MAX, &mut cut, &mut Vec::new());
            assert_eq!(
                cut.hashes, whole,
                "{kind}: a prefix regrows as a truncated chain does"
            );
        }
    }

    proptest::proptest! {
        /// Hashing owned tokens in place gives the copying chain's hashes,
        /// whatever the block size (below and above xxh3's mid-size limit),
        /// keys, kind and start, and leaves the tokens as they were.
        #[test]
        fn hashing_in_place_equals_hashing_copies(
            tokens in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..700),
            block_size in 1usize..=80,
            key in 0usize..4,
            kind in 0usize..BlockHashKind::ALL.len(),
            start in 0usize..4,
            limit in 0usize..20,
        ) {
            let keys = match key {
                0 => ExtraKeys::default(),
                1 => ExtraKeys::salt("s"),
                2 => ExtraKeys::adapter("a"),
                _ => ExtraKeys {
                    mm: vec![MultiModalKey { hash: "i".into(), offset: 0, length: 1 }],
                    ..ExtraKeys::default()
                },
            };
            let h = Hasher::with_kind(BlockHashKind::ALL[kind], "seed", 9, block_size);
            let digest = h.digest(&keys);
            let mut copied = Chain::default();
            h.extend_chain(&tokens, &digest, start, &mut copied, &mut Vec::new());
            let mut in_place = copied.clone();
            h.extend_chain(&tokens, &digest, limit, &mut copied, &mut Vec::new());
            let mut owned = tokens.clone();
            h.extend_chain_in_place(&mut owned, &digest, limit, &mut in_place, &mut Vec::new());
            proptest::prop_assert_eq!(in_place.hashes, copied.hashes);
            proptest::prop_assert_eq!(owned, tokens);
        }
    }

    #[test]
    fn the_seeds_secret_hashes_as_the_seed_does() {
        let h = Hasher::new(0x5eed, 64);
        for len in [0, 1, 16, 17, 128, 129, 240, 241, 272, 300, 1024, 1025] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            assert_eq!(
                h.xxh3(&bytes).0,
                xxh3_128_with_seed(&bytes, 0x5eed),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn the_external_hash_is_the_low_64_bits() {
        let h = BlockHash(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(h.external(), 0xfedc_ba98_7654_3210);
    }
}
