//! Least recently freed first: vLLM's free-block queue, the default.

use super::EvictionPolicy;
use crate::error::Result;
use crate::id_list::IdList;
use crate::ids::BlockId;

/// Least recently freed first (vLLM's free-block queue). Ignores stores and
/// hits: only the order in which blocks were freed counts.
#[derive(Debug)]
pub(crate) struct Lru {
    queue: IdList,
}

impl Lru {
    pub(crate) fn new(num_blocks: usize) -> Result<Self> {
        Ok(Self {
            queue: IdList::new(num_blocks)?,
        })
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, block: BlockId) {
        self.queue.push_back(block);
    }

    fn remove(&mut self, block: BlockId) {
        self.queue.remove(block);
    }

    fn evict(&mut self) -> Option<BlockId> {
        self.queue.pop_front()
    }

    fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recently_freed() {
        let mut p = Lru::new(4).unwrap();
        p.insert(2);
        p.insert(0);
        p.insert(3);
        p.remove(0);
        assert_eq!(p.evict(), Some(2));
        assert_eq!(p.evict(), Some(3));
        assert!(p.is_empty());
    }
}
