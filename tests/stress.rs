//! Eight threads hammer one manager with random operations (reserve,
//! evict_blocks and evict among them), once per eviction policy; the invariants must hold at the end and every block must
//! come back.

use std::sync::Arc;
use std::thread;

use mla_cache::{AdmitOptions, BlockManager, CacheConfig, Error, EvictionPolicyKind, ExtraKeys};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn eight_threads_of_random_operations_keep_the_invariants() {
    for kind in EvictionPolicyKind::ALL {
        hammer(kind);
    }
}

fn hammer(kind: EvictionPolicyKind) {
    let mut config = CacheConfig::new(256);
    config.eviction = kind;
    config.block_size = 16;
    config.hash_seed = Some(9);
    config.enable_events = true;
    let m = Arc::new(BlockManager::new(config).unwrap());
    let threads: Vec<_> =
        (0..8u64)
            .map(|t| {
                let m = m.clone();
                thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(t);
                    let mut live: Vec<u64> = Vec::new();
                    let mut next = t << 32;
                    for step in 0..20_000 {
                        match rng.gen_range(0..12) {
                            0..=2 => {
                                // Shared system prompts plus a private tail.
                                let base = rng.gen_range(0..4u32) * 1000;
                                let mut p: Vec<u32> = (base..base + rng.gen_range(1..80)).collect();
                                p.extend((0..rng.gen_range(0..40)).map(|_| rng.gen_range(0..50)));
                                let id = next;
                                next += 1;
                                match m.admit(
                                    id,
                                    &p,
                                    &AdmitOptions::decode_slots(rng.gen_range(0..32)),
                                ) {
                                    Ok(_) => live.push(id),
                                    Err(Error::OutOfBlocks { .. }) => {}
                                    Err(e) => panic!("admit: {e}"),
                                }
                            }
                            3..=5 if !live.is_empty() => {
                                let id = live[rng.gen_range(0..live.len())];
                                let n = rng.gen_range(1..8);
                                let toks: Vec<u32> = (0..n).map(|_| rng.gen_range(0..50)).collect();
                                match m.append(id, &toks) {
                                    Ok(_) | Err(Error::OutOfBlocks { .. }) => {}
                                    Err(e) => panic!("append: {e}"),
                                }
                            }
                            6 if !live.is_empty() => {
                                let parent = live[rng.gen_range(0..live.len())];
                                m.fork(parent, next).unwrap();
                                live.push(next);
                                next += 1;
                            }
                            7 => {
                                let base = rng.gen_range(0..4u32) * 1000;
                                let p: Vec<u32> = (base..base + 64).collect();
                                let hit = m.match_prefix(&p, &ExtraKeys::default());
                                assert!(hit.num_tokens <= 64);
                            }
                            8 if step % 50 == 0 => {
                                let _ = m.take_events();
                            }
                            9 if !live.is_empty() => {
                                // Lookahead room past the tokens.
                                let id = live[rng.gen_range(0..live.len())];
                                let total = m.num_tokens(id).unwrap() + rng.gen_range(0..24);
                                match m.reserve(id, total) {
                                    Ok(_)
                                    | Err(
                                        Error::OutOfBlocks { .. } | Error::RequestTooLarge { .. },
                                    ) => {}
                                    Err(e) => panic!("reserve: {e}"),
                                }
                            }
                            10 if !live.is_empty() => {
                                // Drop one block of a live table from the index, or evict ahead.
                                if rng.gen_bool(0.5) {
                                    let table =
                                        m.block_table(live[rng.gen_range(0..live.len())]).unwrap();
                                    m.evict_blocks(&[table[rng.gen_range(0..table.len())]])
                                        .unwrap();
                                } else {
                                    m.evict(rng.gen_range(0..4));
                                }
                            }
                            _ if !live.is_empty() => {
                                let id = live.swap_remove(rng.gen_range(0..live.len()));
                                m.free(id).unwrap();
                            }
                            _ => {}
                        }
                    }
                    for id in live {
                        m.free(id).unwrap();
                    }
                })
            })
            .collect();
    for t in threads {
        t.join().unwrap();
    }
    m.check_invariants().unwrap();
    let s = m.stats();
    assert_eq!((s.free_blocks, s.used_blocks, s.num_requests), (256, 0, 0));
    assert!(
        s.prefix_hit_tokens > 0 && s.evictions > 0 && s.cow_copies > 0,
        "{kind}: {s:?}"
    );
    m.reset_prefix_cache().unwrap();
    assert_eq!(m.stats().cached_blocks, 0);
}
