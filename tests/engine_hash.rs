//! Engine-compatible block hashes: `BlockHashKind::Sha256Cbor` and
//! `XxhashCbor` give the 64-bit hashes vLLM 0.33 publishes.
//!
//! The expected values were computed by running vLLM 0.33's own
//! `init_none_hash`, `generate_block_hash_extra_keys` and `hash_block_tokens`
//! (with `PYTHONHASHSEED` set as noted) in its venv, and converting each
//! digest as vLLM's `maybe_convert_block_hash` does.

use mla_cache::{
    AdmitOptions, BlockHashKind, BlockManager, CacheConfig, CacheEvent, ExtraKeys, MultiModalKey,
};
use proptest::prelude::*;

const TOKENS: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 100_000, 70_000, 300, 24];

fn manager(kind: BlockHashKind, seed: Option<u64>) -> BlockManager {
    BlockManager::new(CacheConfig {
        block_size: 4,
        block_hash: kind,
        hash_seed: seed,
        enable_events: true,
        ..CacheConfig::new(32)
    })
    .unwrap()
}

/// LoRA `a` at `/adapters/a`, salt `tenant`, images at 2..5 and 5..7.
fn keys() -> ExtraKeys {
    let mm = |hash: &str, offset, length| MultiModalKey {
        hash: hash.into(),
        offset,
        length,
    };
    ExtraKeys {
        adapter: Some("a".into()),
        adapter_path: Some("/adapters/a".into()),
        salt: Some("tenant".into()),
        mm: vec![mm("img1", 2, 3), mm("img2", 5, 2)],
    }
}

#[test]
fn sha256_cbor_matches_vllm_with_its_default_seed() {
    // PYTHONHASHSEED unset: NONE_HASH = sha256_cbor("vllm-none-hash").
    let m = manager(BlockHashKind::Sha256Cbor, None);
    assert_eq!(
        m.block_hashes(&TOKENS, &ExtraKeys::default()),
        [
            0x84b1_46b1_51d5_5111,
            0xd43b_57df_56b5_8fb1,
            0x4063_9e84_f38b_0d6f
        ]
    );
}

#[test]
fn sha256_cbor_matches_vllm_with_a_seed_and_extra_keys() {
    // PYTHONHASHSEED=0.
    let m = manager(BlockHashKind::Sha256Cbor, Some(0));
    assert_eq!(
        m.block_hashes(&TOKENS, &ExtraKeys::default()),
        [
            0x1e0b_2e02_8ef0_71cb,
            0xefad_121d_154a_b2d6,
            0x7763_779a_6f45_508e
        ]
    );
    // PYTHONHASHSEED=42; block 1 holds image 1's tail at offset -2.
    let m = manager(BlockHashKind::Sha256Cbor, Some(42));
    assert_eq!(
        m.block_hashes(&TOKENS, &keys()),
        [
            0x8f41_349f_ea40_6cd1,
            0x49f4_3d32_ade0_a1b7,
            0x9eb0_1011_11c8_9cfd
        ]
    );
}

#[test]
fn xxhash_cbor_matches_vllm() {
    // PYTHONHASHSEED=0, then 42.
    let m = manager(BlockHashKind::XxhashCbor, Some(0));
    assert_eq!(
        m.block_hashes(&TOKENS, &ExtraKeys::default()),
        [
            0x15a8_cc1f_6e3a_c52e,
            0xe718_a811_a3b7_5e23,
            0xdb04_13ac_9b1b_0c34
        ]
    );
    let m = manager(BlockHashKind::XxhashCbor, Some(42));
    assert_eq!(
        m.block_hashes(&TOKENS, &keys()),
        [
            0x5fe0_a810_d665_ffb7,
            0xe7cb_3b27_95cb_8eb8,
            0x289e_75af_3479_6ad6
        ]
    );
}

#[test]
fn kinds_are_named_as_vllm_names_them() {
    for (name, kind) in [
        ("xxh3", BlockHashKind::Xxh3),
        ("sha256_cbor", BlockHashKind::Sha256Cbor),
        ("xxhash_cbor", BlockHashKind::XxhashCbor),
    ] {
        assert_eq!(kind.name(), name);
        assert_eq!(name.parse::<BlockHashKind>().unwrap(), kind);
    }
    assert!("sha256".parse::<BlockHashKind>().is_err());
    assert_eq!(CacheConfig::new(1).block_hash, BlockHashKind::Xxh3);
}

/// Stored hashes of every `BlockStored` event, in order.
fn stored(m: &BlockManager) -> Vec<u64> {
    m.take_events()
        .into_iter()
        .flat_map(|e| match e {
            CacheEvent::BlockStored { block_hashes, .. } => block_hashes,
            _ => Vec::new(),
        })
        .collect()
}

proptest! {
    /// Blocks completed one decode step at a time (the SHA-256 parent is
    /// recomputed) carry the hashes the whole sequence gets at once.
    #[test]
    fn decoded_blocks_hash_as_the_whole_sequence(
        prompt in prop::collection::vec(0u32..200_000, 1..20),
        decoded in prop::collection::vec(0u32..200_000, 1..20),
        sha in any::<bool>(),
    ) {
        let kind = if sha { BlockHashKind::Sha256Cbor } else { BlockHashKind::XxhashCbor };
        let m = manager(kind, Some(7));
        m.admit(1, &prompt, &AdmitOptions::decode_slots(decoded.len())).unwrap();
        for &t in &decoded {
            m.append(1, &[t]).unwrap();
        }
        let all: Vec<u32> = prompt.iter().chain(&decoded).copied().collect();
        // Unchunked: every appended token counts as computed, so every full
        // block was stored.
        prop_assert_eq!(stored(&m), m.block_hashes(&all, &ExtraKeys::default()));
    }
}
