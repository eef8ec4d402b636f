//! The block manager's batched calls (`append_batch`, `fill_block_tables`,
//! `free_batch`) and queries (`num_computed_tokens`, `capacity`,
//! `would_admit`): all or nothing, and equal to the single calls in turn.

// One position range per request: a batch of one is an array of one range.
#![allow(clippy::single_range_in_vec_init)]

use mla_cache::{AdmitOptions, BlockCopy, BlockManager, CacheConfig, Error, TableSizes};
use proptest::prelude::*;

const BS: usize = 4;

fn manager(num_blocks: usize) -> BlockManager {
    let mut c = CacheConfig::new(num_blocks);
    c.block_size = BS;
    c.hash_seed = Some(42);
    BlockManager::new(c).unwrap()
}

fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

/// Everything the public API shows of requests `ids` and the cache.
fn snapshot(m: &BlockManager, ids: &[u64]) -> Vec<String> {
    let mut out = vec![format!("{:?}", m.stats())];
    for &id in ids {
        out.push(format!(
            "{id}: {:?} {:?} {:?}",
            m.block_table(id),
            m.num_tokens(id),
            m.computed_blocks(id, 0)
        ));
    }
    out
}

#[test]
fn append_batch_appends_to_each_request_and_maps_the_new_slots() {
    let m = manager(16);
    m.admit(1, &toks(0..4), &AdmitOptions::default()).unwrap(); // full: next token takes a block
    m.admit(2, &toks(10..13), &AdmitOptions::default()).unwrap(); // room for one
    let out = m
        .append_batch(&[(1, &[100][..]), (2, &[200, 201][..])])
        .unwrap();
    assert_eq!(out.requests.len(), 2);
    let t1 = m.block_table(1).unwrap();
    let t2 = m.block_table(2).unwrap();
    assert_eq!(out.requests[0].new_block_ids, vec![t1[1]]);
    assert_eq!(out.requests[1].new_block_ids, vec![t2[1]]);
    let expected: Vec<i64> = [
        m.slot_mapping(1, 4..5).unwrap(),
        m.slot_mapping(2, 3..5).unwrap(),
    ]
    .concat();
    assert_eq!(out.slot_mapping, expected);
    assert_eq!(m.num_tokens(1).unwrap(), 5);
    assert_eq!(m.num_tokens(2).unwrap(), 5);
    m.check_invariants().unwrap();
}

#[test]
fn a_failing_batch_changes_nothing() {
    let m = manager(4);
    m.admit(1, &toks(0..4), &AdmitOptions::default()).unwrap();
    m.admit(2, &toks(10..14), &AdmitOptions::default()).unwrap();
    m.admit(3, &toks(20..24), &AdmitOptions::default()).unwrap();
    let before = snapshot(&m, &[1, 2, 3]);
    // One free block, three requests that each need one.
    let err = m
        .append_batch(&[(1, &[1][..]), (2, &[2][..]), (3, &[3][..])])
        .unwrap_err();
    assert_eq!(
        err,
        Error::OutOfBlocks {
            needed: 3,
            available: 1
        }
    );
    assert_eq!(snapshot(&m, &[1, 2, 3]), before);
    // An unknown request, an empty append, a repeated request: all refused.
    let err = m.append_batch(&[(1, &[1][..]), (9, &[2][..])]).unwrap_err();
    assert_eq!(err, Error::UnknownRequest(9));
    let err = m.append_batch(&[(1, &[1][..]), (2, &[][..])]).unwrap_err();
    assert!(matches!(err, Error::EmptyInput(_)), "{err:?}");
    let err = m.append_batch(&[(1, &[1][..]), (1, &[2][..])]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = m.append_batch(&[(1, &[0; 20][..])]).unwrap_err();
    assert!(matches!(err, Error::RequestTooLarge { .. }), "{err:?}");
    assert_eq!(snapshot(&m, &[1, 2, 3]), before);
    m.check_invariants().unwrap();
}

#[test]
fn a_copy_in_the_batch_spares_the_last_holder_of_a_shared_tail() {
    let m = manager(4);
    m.admit(1, &toks(0..6), &AdmitOptions::default()).unwrap(); // 1 full + 1 partial
    m.fork(1, 2).unwrap();
    m.fork(1, 3).unwrap();
    assert_eq!(m.num_free_blocks(), 2);
    let tail = m.block_table(1).unwrap()[1];
    // Two of the three holders copy; the last writes in place: the batch
    // fits the two free blocks, though each append alone would count a copy.
    let out = m
        .append_batch(&[(2, &[7][..]), (3, &[8][..]), (1, &[9][..])])
        .unwrap();
    let copies: Vec<&[BlockCopy]> = out.requests.iter().map(|o| &o.copies[..]).collect();
    assert_eq!(copies[0].len(), 1);
    assert_eq!(copies[1].len(), 1);
    assert!(copies[2].is_empty());
    for (id, c) in [(2, copies[0][0]), (3, copies[1][0])] {
        assert_eq!(c.src, tail);
        assert_eq!(c.position, 1);
        assert_eq!(m.block_table(id).unwrap()[c.position], c.dst);
    }
    assert_eq!(m.block_table(1).unwrap()[1], tail);
    assert_eq!(m.num_free_blocks(), 0);
    m.check_invariants().unwrap();
}

#[test]
fn fill_block_tables_pads_rows_and_maps_positions() {
    let m = manager(16);
    m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap(); // 3 blocks
    m.admit(2, &toks(20..22), &AdmitOptions::default()).unwrap(); // 1 block
    let mut tables = vec![0i32; 2 * 4];
    let mut slots = vec![0i64; 4];
    let sizes = m
        .fill_block_tables(&[2, 1], &mut tables, 4, -1, &[0..2, 7..9], &mut slots)
        .unwrap();
    assert_eq!(
        sizes,
        TableSizes {
            max_blocks: 3,
            num_slots: 4
        }
    );
    let row = |id| -> Vec<i32> {
        let mut r: Vec<i32> = m
            .block_table(id)
            .unwrap()
            .iter()
            .map(|&b| b as i32)
            .collect();
        r.resize(4, -1);
        r
    };
    assert_eq!(tables, [row(2), row(1)].concat());
    let expected = [
        m.slot_mapping(2, 0..2).unwrap(),
        m.slot_mapping(1, 7..9).unwrap(),
    ]
    .concat();
    assert_eq!(slots, expected);
    // Without positions, only the tables are written.
    let mut slots = vec![];
    let sizes = m
        .fill_block_tables(&[1], &mut tables[..3], 3, 0, &[], &mut slots)
        .unwrap();
    assert_eq!(sizes.num_slots, 0);
}

#[test]
fn fill_block_tables_reports_the_sizes_it_needs_and_writes_nothing() {
    let m = manager(16);
    m.admit(1, &toks(0..9), &AdmitOptions::default()).unwrap(); // 3 blocks
    let mut tables = vec![7i32; 2];
    let mut slots = vec![7i64; 1];
    let err = m
        .fill_block_tables(&[1], &mut tables, 2, -1, &[0..9], &mut slots)
        .unwrap_err();
    assert_eq!(
        err,
        Error::BatchBuffersTooSmall {
            max_blocks: 3,
            num_slots: 9
        }
    );
    assert_eq!((tables, slots), (vec![7; 2], vec![7; 1]));
    let mut tables = vec![0i32; 3];
    for (ids, positions, width) in [
        (&[1u64, 1][..], &[][..], 3),     // 2 rows of 3 in 3 entries
        (&[1][..], &[0..1, 0..1][..], 3), // 2 ranges for 1 request
        (&[1][..], &[0..13][..], 3),      // past the request's slots
        (&[5][..], &[][..], 3),           // unknown
    ] {
        let err = m
            .fill_block_tables(ids, &mut tables, width, 0, positions, &mut [0; 16])
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument(_) | Error::UnknownRequest(5)),
            "{err:?}"
        );
    }
    assert_eq!(tables, vec![0; 3]);
}

#[test]
fn free_batch_frees_all_or_none() {
    let m = manager(16);
    for id in 1..=3 {
        m.admit(id, &toks(0..5), &AdmitOptions::default()).unwrap();
    }
    let before = snapshot(&m, &[1, 2, 3]);
    assert_eq!(m.free_batch(&[1, 4]).unwrap_err(), Error::UnknownRequest(4));
    assert!(matches!(
        m.free_batch(&[1, 2, 1]),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(snapshot(&m, &[1, 2, 3]), before);
    m.free_batch(&[3, 1]).unwrap();
    assert_eq!(m.stats().num_requests, 1);
    assert_eq!(m.block_table(1).unwrap_err(), Error::UnknownRequest(1));
    m.check_invariants().unwrap();
}

#[test]
fn queries_report_computed_tokens_capacity_and_a_dry_run() {
    let m = manager(8);
    let chunked = AdmitOptions {
        chunked_prefill: true,
        decode_slots: 3,
        ..AdmitOptions::default()
    };
    m.admit(1, &toks(0..9), &chunked).unwrap(); // 12 slots, 3 blocks
    assert_eq!(m.num_computed_tokens(1).unwrap(), 0);
    assert_eq!(m.capacity(1).unwrap(), 3);
    m.commit(1, 8).unwrap();
    assert_eq!(m.num_computed_tokens(1).unwrap(), 8);
    m.admit(2, &toks(0..4), &AdmitOptions::default()).unwrap();
    assert_eq!(m.num_computed_tokens(2).unwrap(), 4);
    assert_eq!(m.capacity(2).unwrap(), 0);
    assert_eq!(m.capacity(3), Err(Error::UnknownRequest(3)));

    // The dry run sees the hit and the free blocks, and changes nothing.
    let before = snapshot(&m, &[1, 2]);
    let check = m
        .would_admit(&toks(0..9), &AdmitOptions::default())
        .unwrap();
    assert_eq!(check.num_cached_tokens, 8);
    assert_eq!(check.new_blocks, 1);
    assert_eq!(check.available_blocks, 4);
    assert!(check.fits());
    let too_many = AdmitOptions::decode_slots(27);
    let check = m.would_admit(&toks(0..5), &too_many).unwrap();
    assert!(!check.fits());
    assert!(m.admit(3, &toks(0..5), &too_many).is_err());
    assert!(matches!(
        m.would_admit(&[], &AdmitOptions::default()),
        Err(Error::EmptyInput(_))
    ));
    assert!(matches!(
        m.would_admit(&toks(0..40), &AdmitOptions::default()),
        Err(Error::RequestTooLarge { .. })
    ));
    assert_eq!(snapshot(&m, &[1, 2]), before);
}

/// Random steps: distinct requests (id 6 is never admitted), each with
/// 0 to 5 tokens (0 is refused).
fn steps() -> impl Strategy<Value = Vec<Vec<(u64, usize)>>> {
    let step = (
        prop::sample::subsequence((0u64..7).collect::<Vec<_>>(), 0..=7).prop_shuffle(),
        prop::collection::vec(0usize..6, 7),
    )
        .prop_map(|(ids, lens)| ids.into_iter().zip(lens).collect());
    prop::collection::vec(step, 1..12)
}

/// Six requests, each a prompt of `prompts[i]` tokens or a fork of the one before.
fn setup(prompts: &[usize], forks: &[bool]) -> BlockManager {
    // Room for the prompts (at most 12 blocks) and little more, so that
    // batches often need exactly the blocks that are free.
    let m = manager(14);
    for (i, &len) in prompts.iter().enumerate() {
        let id = i as u64;
        if forks[i] && i > 0 {
            m.fork(id - 1, id).unwrap();
        } else {
            m.admit(id, &toks(0..len as u32), &AdmitOptions::default())
                .unwrap();
        }
    }
    m
}

type Batch = Vec<(u64, Vec<u32>)>;

fn appends(batch: &Batch) -> Vec<(u64, &[u32])> {
    batch.iter().map(|(id, t)| (*id, &t[..])).collect()
}

proptest! {
    /// A batch equals the single appends in turn: same outcomes, slots and
    /// state; a batch fails exactly when one of the appends in turn would,
    /// and then changes nothing.
    #[test]
    fn a_batch_equals_the_appends_in_turn(
        prompts in prop::collection::vec(1usize..9, 6),
        forks in prop::collection::vec(any::<bool>(), 6),
        steps in steps(),
    ) {
        let batched = setup(&prompts, &forks);
        let single = setup(&prompts, &forks);
        let ids: Vec<u64> = (0..7).collect();
        let mut done: Vec<Batch> = Vec::new();
        let mut next = 1000u32;
        for step in steps {
            let batch: Batch = step
                .iter()
                .map(|&(id, n)| {
                    next += n as u32;
                    (id, (next - n as u32..next).collect())
                })
                .collect();
            let before = snapshot(&batched, &ids);
            match batched.append_batch(&appends(&batch)) {
                Ok(out) => {
                    let mut slots = Vec::new();
                    for (&(id, t), outcome) in appends(&batch).iter().zip(&out.requests) {
                        let start = single.num_tokens(id).unwrap();
                        prop_assert_eq!(&single.append(id, t).unwrap(), outcome);
                        slots.extend(single.slot_mapping(id, start..start + t.len()).unwrap());
                    }
                    prop_assert_eq!(out.slot_mapping, slots);
                    done.push(batch);
                }
                Err(_) => {
                    prop_assert_eq!(&snapshot(&batched, &ids), &before);
                    // The appends in turn, on a replay of the steps so far, fail too.
                    let probe = setup(&prompts, &forks);
                    for b in &done {
                        probe.append_batch(&appends(b)).unwrap();
                    }
                    prop_assert_eq!(snapshot(&probe, &ids), before);
                    let failed = appends(&batch)
                        .iter()
                        .any(|&(id, t)| probe.append(id, t).is_err());
                    prop_assert!(failed);
                }
            }
            prop_assert_eq!(snapshot(&batched, &ids), snapshot(&single, &ids));
            batched.check_invariants().unwrap();
        }
    }
}
