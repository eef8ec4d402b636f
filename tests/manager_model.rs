//! Model test: random operation sequences run against the block manager and
//! against a deliberately naive reference model (prefixes as token vectors,
//! free queues as `VecDeque`s). Block tables must agree exactly, and the
//! manager's invariants must hold after every step. Operations: admit,
//! append, fork, free, reserve (lookahead room), evict_blocks (drop given
//! blocks from the index) and evict (ahead of allocation). The reference model
//! encodes LRU exactly; every other policy is held to the invariants and to
//! the counts that do not depend on which block is evicted.

use std::collections::{HashMap, VecDeque};

use mla_cache::{AdmitOptions, BlockManager, CacheConfig, Error, EvictionPolicyKind};
use proptest::prelude::*;

const BS: usize = 4;
const BLOCKS: usize = 12;

#[derive(Debug, Clone)]
enum Op {
    Admit {
        id: u64,
        prompt: Vec<u32>,
        decode: usize,
    },
    Append {
        id: u64,
        tokens: Vec<u32>,
    },
    Fork {
        parent: u64,
        child: u64,
    },
    Free {
        id: u64,
    },
    Reserve {
        id: u64,
        total: usize,
    },
    EvictBlocks {
        blocks: Vec<u32>,
    },
    Evict {
        n: usize,
    },
}

#[derive(Default, Clone)]
struct MBlock {
    refs: u32,
    key: Option<Vec<u32>>,
}

struct MReq {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
}

/// The reference: the rules of docs/semantics.md, written as plainly as possible.
struct Model {
    blocks: Vec<MBlock>,
    cached: HashMap<Vec<u32>, u32>,
    unhashed: VecDeque<u32>,
    lru: VecDeque<u32>,
    reqs: HashMap<u64, MReq>,
    evictions: u64,
    cow: u64,
    hit_tokens: u64,
}

impl Model {
    fn new() -> Self {
        Self {
            blocks: vec![MBlock::default(); BLOCKS],
            cached: HashMap::new(),
            unhashed: (0..BLOCKS as u32).collect(),
            lru: VecDeque::new(),
            reqs: HashMap::new(),
            evictions: 0,
            cow: 0,
            hit_tokens: 0,
        }
    }

    fn free_count(&self) -> usize {
        self.unhashed.len() + self.lru.len()
    }

    fn acquire(&mut self, b: u32) {
        if self.blocks[b as usize].refs == 0 {
            self.lru.retain(|&x| x != b);
        }
        self.blocks[b as usize].refs += 1;
    }

    fn release(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        blk.refs -= 1;
        if blk.refs == 0 {
            if blk.key.is_some() {
                self.lru.push_back(b);
            } else {
                self.unhashed.push_back(b);
            }
        }
    }

    fn alloc(&mut self) -> u32 {
        let b = match self.unhashed.pop_front() {
            Some(b) => b,
            None => {
                let b = self.lru.pop_front().unwrap();
                let key = self.blocks[b as usize].key.take().unwrap();
                self.cached.remove(&key);
                self.evictions += 1;
                b
            }
        };
        self.blocks[b as usize].refs = 1;
        b
    }

    fn index(&mut self, id: u64, from: usize) {
        let r = &self.reqs[&id];
        let full = r.tokens.len() / BS;
        let pending: Vec<(Vec<u32>, u32)> = (from..full)
            .map(|i| (r.tokens[..(i + 1) * BS].to_vec(), r.blocks[i]))
            .collect();
        for (key, b) in pending {
            if !self.cached.contains_key(&key) && self.blocks[b as usize].key.is_none() {
                self.cached.insert(key.clone(), b);
                self.blocks[b as usize].key = Some(key);
            }
        }
    }

    fn admit(&mut self, id: u64, prompt: &[u32], decode: usize) -> Result<usize, Error> {
        let needed = (prompt.len() + decode).div_ceil(BS);
        if needed > BLOCKS {
            return Err(Error::RequestTooLarge {
                needed,
                total: BLOCKS,
            });
        }
        if self.reqs.contains_key(&id) {
            return Err(Error::DuplicateRequest(id));
        }
        let limit = (prompt.len() - 1) / BS;
        let hits: Vec<u32> = (0..limit)
            .map_while(|i| self.cached.get(&prompt[..(i + 1) * BS]).copied())
            .collect();
        let reviving = hits
            .iter()
            .filter(|&&b| self.blocks[b as usize].refs == 0)
            .count();
        let available = self.free_count() - reviving;
        let fresh = needed - hits.len();
        if fresh > available {
            return Err(Error::OutOfBlocks {
                needed: fresh,
                available,
            });
        }
        let mut blocks = hits.clone();
        for &b in &hits {
            self.acquire(b);
        }
        for _ in 0..fresh {
            blocks.push(self.alloc());
        }
        self.reqs.insert(
            id,
            MReq {
                tokens: prompt.to_vec(),
                blocks,
            },
        );
        self.index(id, hits.len());
        self.hit_tokens += (hits.len() * BS) as u64;
        Ok(hits.len() * BS)
    }

    fn append(&mut self, id: u64, tokens: &[u32]) -> Result<(), Error> {
        let r = self.reqs.get(&id).ok_or(Error::UnknownRequest(id))?;
        let len = r.tokens.len();
        let needed = (len + tokens.len()).div_ceil(BS);
        if needed > BLOCKS {
            return Err(Error::RequestTooLarge {
                needed,
                total: BLOCKS,
            });
        }
        let grow = needed.saturating_sub(r.blocks.len());
        let cow = len % BS != 0 && self.blocks[r.blocks[len / BS] as usize].refs > 1;
        let fresh = grow + usize::from(cow);
        if fresh > self.free_count() {
            return Err(Error::OutOfBlocks {
                needed: fresh,
                available: self.free_count(),
            });
        }
        let mut r = self.reqs.remove(&id).unwrap();
        if cow {
            let dst = self.alloc();
            self.release(r.blocks[len / BS]);
            r.blocks[len / BS] = dst;
            self.cow += 1;
        }
        for _ in 0..grow {
            r.blocks.push(self.alloc());
        }
        r.tokens.extend_from_slice(tokens);
        self.reqs.insert(id, r);
        self.index(id, len / BS);
        Ok(())
    }

    fn fork(&mut self, parent: u64, child: u64) -> Result<(), Error> {
        if self.reqs.contains_key(&child) {
            return Err(Error::DuplicateRequest(child));
        }
        let p = self
            .reqs
            .get(&parent)
            .ok_or(Error::UnknownRequest(parent))?;
        let tokens = p.tokens.clone();
        let blocks = p.blocks[..tokens.len().div_ceil(BS)].to_vec();
        for &b in &blocks {
            self.acquire(b);
        }
        self.reqs.insert(child, MReq { tokens, blocks });
        Ok(())
    }

    fn reserve(&mut self, id: u64, total: usize) -> Result<(), Error> {
        let r = self.reqs.get(&id).ok_or(Error::UnknownRequest(id))?;
        let len = r.tokens.len();
        let needed = total.div_ceil(BS);
        if needed > BLOCKS {
            return Err(Error::RequestTooLarge {
                needed,
                total: BLOCKS,
            });
        }
        let grow = needed.saturating_sub(r.blocks.len());
        // Slots past the tokens get written at once: a shared partial tail is copied first.
        let cow = total > len && len % BS != 0 && self.blocks[r.blocks[len / BS] as usize].refs > 1;
        let fresh = grow + usize::from(cow);
        if fresh > self.free_count() {
            return Err(Error::OutOfBlocks {
                needed: fresh,
                available: self.free_count(),
            });
        }
        let mut r = self.reqs.remove(&id).unwrap();
        if cow {
            let dst = self.alloc();
            self.release(r.blocks[len / BS]);
            r.blocks[len / BS] = dst;
            self.cow += 1;
        }
        for _ in 0..grow {
            r.blocks.push(self.alloc());
        }
        self.reqs.insert(id, r);
        Ok(())
    }

    fn evict_blocks(&mut self, ids: &[u32]) -> Result<usize, Error> {
        if let Some(&b) = ids.iter().find(|&&b| b as usize >= BLOCKS) {
            return Err(Error::InvalidBlock(b));
        }
        let mut removed = 0;
        for &b in ids {
            if let Some(key) = self.blocks[b as usize].key.take() {
                self.cached.remove(&key);
                if self.blocks[b as usize].refs == 0 {
                    self.lru.retain(|&x| x != b);
                    self.unhashed.push_back(b);
                }
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn evict(&mut self, n: usize) -> usize {
        let mut done = 0;
        while done < n {
            let Some(b) = self.lru.pop_front() else { break };
            let key = self.blocks[b as usize].key.take().unwrap();
            self.cached.remove(&key);
            self.evictions += 1;
            self.unhashed.push_back(b);
            done += 1;
        }
        done
    }

    fn free(&mut self, id: u64) -> Result<(), Error> {
        let r = self.reqs.remove(&id).ok_or(Error::UnknownRequest(id))?;
        for &b in r.blocks.iter().rev() {
            self.release(b);
        }
        Ok(())
    }
}

fn op() -> impl Strategy<Value = Op> {
    // Prompts share prefixes: a few bases, cut at random lengths, with a small tail alphabet.
    let prompt = (0..3u32, 1..20usize, prop::collection::vec(0..3u32, 0..6)).prop_map(
        |(base, cut, tail)| {
            let mut p: Vec<u32> = (0..cut as u32).map(|i| base * 100 + i).collect();
            p.extend(tail);
            p
        },
    );
    prop_oneof![
        3 => (0..6u64, prompt, 0..6usize).prop_map(|(id, prompt, decode)| Op::Admit { id, prompt, decode }),
        4 => (0..6u64, prop::collection::vec(0..3u32, 1..6)).prop_map(|(id, tokens)| Op::Append { id, tokens }),
        1 => (0..6u64, 0..6u64).prop_map(|(parent, child)| Op::Fork { parent, child }),
        2 => (0..6u64).prop_map(|id| Op::Free { id }),
        1 => (0..6u64, 0..56usize).prop_map(|(id, total)| Op::Reserve { id, total }),
        1 => prop::collection::vec(0..BLOCKS as u32 + 1, 0..4).prop_map(|blocks| Op::EvictBlocks { blocks }),
        1 => (0..4usize).prop_map(|n| Op::Evict { n }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn manager_agrees_with_the_reference_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut config = CacheConfig::new(BLOCKS);
        config.block_size = BS;
        config.hash_seed = Some(3);
        // The reference model evicts in vLLM's order.
        config.eviction = EvictionPolicyKind::Lru;
        let m = BlockManager::new(config).unwrap();
        let mut model = Model::new();
        for op in &ops {
            match op {
                Op::Admit { id, prompt, decode } => {
                    let got = m.admit(*id, prompt, &AdmitOptions::decode_slots(*decode));
                    let want = model.admit(*id, prompt, *decode);
                    prop_assert_eq!(got.map(|a| a.num_cached_tokens), want, "{:?}", op);
                }
                Op::Append { id, tokens } => {
                    prop_assert_eq!(m.append(*id, tokens).map(|_| ()), model.append(*id, tokens), "{:?}", op);
                }
                Op::Fork { parent, child } => {
                    prop_assert_eq!(m.fork(*parent, *child), model.fork(*parent, *child), "{:?}", op);
                }
                Op::Free { id } => prop_assert_eq!(m.free(*id), model.free(*id), "{:?}", op),
                Op::Reserve { id, total } => {
                    prop_assert_eq!(m.reserve(*id, *total).map(|_| ()), model.reserve(*id, *total), "{:?}", op);
                }
                Op::EvictBlocks { blocks } => {
                    prop_assert_eq!(m.evict_blocks(blocks), model.evict_blocks(blocks), "{:?}", op);
                }
                Op::Evict { n } => prop_assert_eq!(m.evict(*n), model.evict(*n), "{:?}", op),
            }
            if let Err(e) = m.check_invariants() {
                prop_assert!(false, "after {:?}: {}", op, e);
            }
            for (id, r) in &model.reqs {
                prop_assert_eq!(m.block_table(*id).unwrap(), r.blocks.clone(), "table of {} after {:?}", id, op);
            }
            let s = m.stats();
            prop_assert_eq!(s.free_blocks as usize, model.free_count());
            prop_assert_eq!(s.free_blocks + s.used_blocks, BLOCKS as u64);
            prop_assert_eq!(s.cached_blocks as usize, model.cached.len());
            prop_assert_eq!(s.evictable_blocks as usize, model.lru.len());
            prop_assert_eq!((s.evictions, s.cow_copies, s.prefix_hit_tokens), (model.evictions, model.cow, model.hit_tokens));
            prop_assert_eq!(s.num_requests as usize, model.reqs.len());
        }
        for id in model.reqs.keys().copied().collect::<Vec<_>>() {
            m.free(id).unwrap();
        }
        prop_assert_eq!(m.num_free_blocks(), BLOCKS);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_keeps_the_invariants(ops in prop::collection::vec(op(), 1..80)) {
        for kind in EvictionPolicyKind::ALL {
            let mut config = CacheConfig::new(BLOCKS);
            config.block_size = BS;
            config.hash_seed = Some(3);
            config.eviction = kind;
            let m = BlockManager::new(config).unwrap();
            let mut live: Vec<u64> = Vec::new();
            for op in &ops {
                let ok = match op {
                    Op::Admit { id, prompt, decode } => {
                        let r = m.admit(*id, prompt, &AdmitOptions::decode_slots(*decode));
                        if let Ok(a) = &r {
                            prop_assert!(a.num_cached_tokens < prompt.len());
                            prop_assert_eq!(&m.block_table(*id).unwrap(), &a.block_ids);
                            live.push(*id);
                        }
                        r.map(|_| ())
                    }
                    Op::Append { id, tokens } => m.append(*id, tokens).map(|_| ()),
                    Op::Fork { parent, child } => m.fork(*parent, *child).inspect(|_| live.push(*child)),
                    Op::Free { id } => m.free(*id).inspect(|_| live.retain(|x| x != id)),
                    Op::Reserve { id, total } => m.reserve(*id, *total).map(|_| ()),
                    Op::EvictBlocks { blocks } => m.evict_blocks(blocks).map(|_| ()),
                    Op::Evict { n } => {
                        let before = m.stats().evictable_blocks;
                        let done = m.evict(*n);
                        prop_assert_eq!(done as u64, before.min(*n as u64));
                        Ok(())
                    }
                };
                match ok {
                    Ok(())
                    | Err(Error::OutOfBlocks { .. } | Error::UnknownRequest(_) | Error::DuplicateRequest(_) | Error::RequestTooLarge { .. } | Error::InvalidBlock(_)) => {}
                    Err(e) => prop_assert!(false, "{}: {:?} failed: {}", kind, op, e),
                }
                if let Err(e) = m.check_invariants() {
                    prop_assert!(false, "{} after {:?}: {}", kind, op, e);
                }
                let s = m.stats();
                prop_assert_eq!(s.free_blocks + s.used_blocks, BLOCKS as u64);
                prop_assert!(s.cached_blocks <= BLOCKS as u64);
                prop_assert!(s.evictable_blocks <= s.free_blocks.min(s.cached_blocks));
            }
            for id in live {
                m.free(id).unwrap();
            }
            prop_assert_eq!(m.num_free_blocks(), BLOCKS);
            m.check_invariants().unwrap();
            m.reset_prefix_cache().unwrap();
            prop_assert_eq!(m.stats().cached_blocks, 0);
        }
    }
}
