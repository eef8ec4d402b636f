//! A block manager keyed by the caller's block hashes (`admit_hashed`,
//! `commit_hashed`, `match_hashes`) makes the same decisions as one that
//! hashes the tokens itself, when the caller's hashes are the manager's own
//! chain; bad hashes are refused and change nothing.

use mla_cache::{
    AdmitOptions, BlockHash, BlockHashKind, BlockManager, CacheConfig, CacheEvent, Error, ExtraKeys,
};
use proptest::prelude::*;

const BS: usize = 4;

fn config(kind: BlockHashKind) -> CacheConfig {
    let mut c = CacheConfig::new(24);
    c.block_size = BS;
    c.block_hash = kind;
    c.hash_seed = Some(7);
    c.enable_events = true;
    c
}

fn chunked() -> AdmitOptions {
    AdmitOptions {
        chunked_prefill: true,
        ..AdmitOptions::default()
    }
}

/// What a step did, comparable across managers.
#[derive(Debug, PartialEq)]
enum Outcome {
    Admitted(Vec<u32>, usize),
    Refused(String),
    Freed,
}

#[derive(Debug, Clone)]
enum Op {
    /// Admit a prompt: one of a few shared prefixes plus a tail.
    Admit { prefix: usize, tail: Vec<u32> },
    /// Free the `n`-th live request.
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, proptest::collection::vec(0..20u32, 1..14))
            .prop_map(|(prefix, tail)| Op::Admit { prefix, tail }),
        2 => (0..8usize).prop_map(Op::Free),
    ]
}

/// Runs `ops` on a manager, admitting by tokens or by the caller's hashes.
fn run(ops: &[Op], by_hashes: bool, kind: BlockHashKind) -> (Vec<Outcome>, Vec<CacheEvent>) {
    let m = BlockManager::new(config(kind)).unwrap();
    let hasher = BlockManager::new(config(kind)).unwrap();
    let prefixes: [Vec<u32>; 3] = [
        (100..108).collect(),
        (100..104).chain(200..206).collect(),
        (300..312).collect(),
    ];
    let none = ExtraKeys::default();
    let mut live = Vec::new();
    let mut out = Vec::new();
    for (id, op) in ops.iter().enumerate() {
        let id = id as u64;
        match op {
            Op::Admit { prefix, tail } => {
                let tokens: Vec<u32> = prefixes[*prefix].iter().chain(tail).copied().collect();
                let admitted = if by_hashes {
                    let hashes = hasher.chain_hashes(&tokens, &none);
                    m.admit_hashed(id, &tokens, &hashes, &chunked())
                } else {
                    m.admit(id, &tokens, &chunked())
                };
                match admitted {
                    Ok(a) => {
                        // Prefill done: every full block becomes shareable.
                        if by_hashes {
                            let hashes = hasher.chain_hashes(&tokens, &none);
                            let skip = a.num_cached_tokens / BS;
                            m.commit_hashed(id, tokens.len(), &hashes[skip..]).unwrap();
                        } else {
                            m.commit(id, tokens.len()).unwrap();
                        }
                        live.push(id);
                        out.push(Outcome::Admitted(a.block_ids, a.num_cached_tokens));
                    }
                    Err(e) => out.push(Outcome::Refused(e.to_string())),
                }
            }
            Op::Free(n) if !live.is_empty() => {
                let id = live.remove(n % live.len());
                m.free(id).unwrap();
                out.push(Outcome::Freed);
            }
            Op::Free(_) => {}
        }
        m.check_invariants().unwrap();
    }
    (out, m.take_events())
}

proptest! {
    #[test]
    fn caller_hashes_equal_to_the_chain_decide_alike(ops in proptest::collection::vec(op(), 1..40)) {
        for kind in [BlockHashKind::Sha256Cbor, BlockHashKind::XxhashCbor] {
            let own = run(&ops, false, kind);
            let caller = run(&ops, true, kind);
            prop_assert_eq!(&own.0, &caller.0);
            prop_assert_eq!(&own.1, &caller.1);
        }
    }
}

#[test]
fn hashes_are_refused_under_the_librarys_own_chain_and_with_verify_tokens() {
    let m = BlockManager::new(config(BlockHashKind::Xxh3)).unwrap();
    let e = m.admit_hashed(1, &[1; 8], &[BlockHash(1), BlockHash(2)], &chunked());
    assert!(matches!(e, Err(Error::InvalidArgument(ref s)) if s.contains("sha256_cbor")));
    assert!(m.match_hashes([BlockHash(1)]).is_err());
    assert!(m.engine_block_hash(&[0; 16]).is_err());
    let mut c = config(BlockHashKind::Sha256Cbor);
    c.verify_tokens = true;
    let m = BlockManager::new(c).unwrap();
    assert!(m.match_hashes([]).is_err());
    assert_eq!(m.num_free_blocks(), 24);
}

#[test]
fn a_digest_maps_to_its_last_sixteen_bytes_big_endian() {
    let m = BlockManager::new(config(BlockHashKind::Sha256Cbor)).unwrap();
    let digest: Vec<u8> = (0u8..32).collect();
    let h = m.engine_block_hash(&digest).unwrap();
    assert_eq!(h.0.to_be_bytes(), digest[16..]);
    assert_eq!(
        h.external(),
        u64::from_be_bytes(digest[24..].try_into().unwrap())
    );
    assert!(m.engine_block_hash(&digest[..16]).is_err());
    let x = BlockManager::new(config(BlockHashKind::XxhashCbor)).unwrap();
    assert_eq!(x.engine_block_hash(&digest[16..]).unwrap(), h);
    assert!(x.engine_block_hash(&digest).is_err());
}

#[test]
fn wrong_counts_change_nothing() {
    let m = BlockManager::new(config(BlockHashKind::Sha256Cbor)).unwrap();
    let hashes = [BlockHash(1), BlockHash(2), BlockHash(3)];
    assert!(m.admit_hashed(1, &[1; 8], &hashes, &chunked()).is_err());
    assert!(m
        .admit_hashed(1, &[1; 8], &hashes[..1], &chunked())
        .is_err());
    assert_eq!(m.num_free_blocks(), 24);
    let opts = AdmitOptions {
        decode_slots: 4,
        ..chunked()
    };
    m.admit_hashed(1, &[1; 8], &hashes[..2], &opts).unwrap();
    let before = m.stats();
    assert!(m.commit_hashed(1, 8, &hashes[..1]).is_err());
    assert!(m.commit_hashed(1, 13, &hashes).is_err()); // past the 12 slots
    assert_eq!(m.stats(), before);
    m.commit_hashed(1, 8, &hashes[..2]).unwrap();
    assert_eq!(m.match_hashes(hashes).unwrap().num_tokens, 8);
    m.check_invariants().unwrap();
}
