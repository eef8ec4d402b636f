//! Bad sizes and ranges are refused in the core, with a message and no
//! change of state, before any binding sees them: config fields and the
//! sizes derived from them, multimodal ranges outside the prompt.

use mla_cache::store::HostStore;
use mla_cache::{AdmitOptions, BlockManager, CacheConfig, Dtype, Error, ExtraKeys, MultiModalKey};
use proptest::prelude::*;

fn invalid_config(c: &CacheConfig) -> String {
    match c.validate() {
        Err(Error::InvalidConfig(m)) => m,
        other => panic!("{c:?} gave {other:?}"),
    }
}

/// Sets one field of a config.
type Setter = fn(&mut CacheConfig, usize);

#[test]
fn every_field_is_bounded() {
    let fields: [(&str, Setter); 5] = [
        ("num_blocks", |c, v| c.num_blocks = v),
        ("block_size", |c, v| c.block_size = v),
        ("num_layers", |c, v| c.num_layers = v),
        ("kv_lora_rank", |c, v| c.kv_lora_rank = v),
        ("rope_dim", |c, v| c.rope_dim = v),
    ];
    for (name, set) in fields {
        for bad in [usize::MAX, 1 << 51, 1 << 33] {
            let mut c = CacheConfig::new(16);
            set(&mut c, bad);
            assert!(invalid_config(&c).contains(name), "{name} = {bad}");
            assert!(HostStore::new(&c).is_err());
            assert!(BlockManager::new(c).is_err());
        }
    }
}

#[test]
fn bounded_fields_whose_product_overflows_are_refused() {
    let mut c = CacheConfig::new(CacheConfig::MAX_NUM_BLOCKS);
    c.block_size = CacheConfig::MAX_BLOCK_SIZE;
    c.num_layers = CacheConfig::MAX_NUM_LAYERS;
    c.kv_lora_rank = CacheConfig::MAX_LATENT_WIDTH;
    c.rope_dim = CacheConfig::MAX_LATENT_WIDTH;
    assert!(invalid_config(&c).contains("overflow"));
}

#[test]
fn dtype_widths_beyond_the_bound_are_invalid_arguments() {
    for dtype in Dtype::ALL {
        for (rank, rope) in [(usize::MAX, usize::MAX), (512, usize::MAX), (1 << 20, 64)] {
            assert!(
                matches!(
                    dtype.bytes_per_token(rank, rope),
                    Err(Error::InvalidArgument(_))
                ),
                "{dtype} {rank} {rope}"
            );
        }
    }
}

proptest! {
    /// A config that validates has every derived size exact: computed in
    /// 128 bits, each fits `usize` and equals what the accessors return.
    #[test]
    fn valid_configs_have_exact_sizes(
        num_blocks in prop_oneof![1usize..64, 1usize..=CacheConfig::MAX_NUM_BLOCKS + 4],
        block_size in prop_oneof![1usize..128, 1usize..=CacheConfig::MAX_BLOCK_SIZE + 4],
        num_layers in prop_oneof![1usize..64, 1usize..=CacheConfig::MAX_NUM_LAYERS + 4],
        rank_groups in 1usize..=(CacheConfig::MAX_LATENT_WIDTH / 128 + 1),
        rope_dim in 0usize..=CacheConfig::MAX_LATENT_WIDTH + 4,
        dtype in prop::sample::select(Dtype::ALL.to_vec()),
    ) {
        let c = CacheConfig {
            num_blocks,
            block_size,
            num_layers,
            kv_lora_rank: rank_groups * 128,
            rope_dim,
            dtype,
            ..CacheConfig::new(1)
        };
        if c.validate().is_ok() {
            let per_token = c.bytes_per_token_per_layer() as u128;
            let total = per_token * block_size as u128 * num_layers as u128 * num_blocks as u128;
            prop_assert!(total <= isize::MAX as u128);
            prop_assert_eq!(c.total_bytes() as u128, total);
            prop_assert_eq!(c.num_tokens() as u128, num_blocks as u128 * block_size as u128);
            prop_assert_eq!(
                c.blocks_for_bytes(u64::MAX) as u128,
                u64::MAX as u128 / c.bytes_per_block() as u128
            );
        }
    }
}

fn admit_with(m: &BlockManager, offset: usize, length: usize) -> mla_cache::Result<usize> {
    let opts = AdmitOptions {
        keys: ExtraKeys {
            mm: vec![MultiModalKey {
                hash: "image".into(),
                offset,
                length,
            }],
            ..ExtraKeys::default()
        },
        ..AdmitOptions::default()
    };
    let tokens: Vec<u32> = (0..8).collect();
    let admitted = m.admit(1, &tokens, &opts).map(|a| a.block_ids.len());
    if admitted.is_ok() {
        m.free(1).unwrap();
    }
    admitted
}

#[test]
fn multimodal_ranges_outside_the_prompt_are_refused() {
    // An 8-token prompt in a cache of 8 blocks of 4 tokens.
    let mut c = CacheConfig::new(8);
    c.block_size = 4;
    let m = BlockManager::new(c).unwrap();
    let before = m.stats();
    for (offset, length) in [
        (6, 3),
        (8, 1),
        (30, 4),
        (2, 0),
        (usize::MAX, 1),
        (1, usize::MAX),
    ] {
        match admit_with(&m, offset, length) {
            Err(Error::InvalidArgument(msg)) => {
                assert!(msg.contains("multimodal input 0"), "{msg}")
            }
            other => panic!("{offset}+{length}: {other:?}"),
        }
        assert_eq!(m.stats(), before);
        m.check_invariants().unwrap();
    }
    // Inside the prompt, up to its last token.
    assert_eq!(admit_with(&m, 0, 8).unwrap(), 2);
    assert_eq!(admit_with(&m, 6, 2).unwrap(), 2);
}
