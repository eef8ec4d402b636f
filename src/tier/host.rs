//! The host-memory tier (L2): whole blocks, all layers, in their stored
//! format, in one arena of fixed-size slots with LRU eviction.
//!
//! ```text
//! arena: | slot 0 | slot 1 | ... |      slot = one block, layer-major:
//!                                       | layer 0 block bytes | layer 1 | ...
//! ```
//!
//! One mutex guards the directory and the arena; copies in and out run under
//! it (a block is a few MB at most: DeepSeek-V3 in fp8_ds_mla with blocks of
//! 64 tokens is 2.6 MB).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::directory::LruDirectory;
use crate::error::Result;
use crate::hash::BlockHash;
use crate::sync::Mutex;

/// Counters and gauges of a [`HostTier`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[repr(C)]
pub struct HostTierStats {
    /// Blocks the tier can hold.
    pub capacity_blocks: u64,
    /// Blocks held now.
    pub blocks: u64,
    /// Blocks copied in.
    pub stores: u64,
    /// Blocks copied out (loads into the device tier, uploads to the remote tier).
    pub loads: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
}

/// A block [`HostTier::insert`] stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStored {
    /// The block evicted to make room, if any.
    pub evicted: Option<BlockHash>,
}

/// Whole blocks in host memory, keyed by [`BlockHash`], least recently used
/// evicted first. `Send + Sync`.
#[derive(Debug)]
pub struct HostTier {
    block_bytes: usize,
    inner: Mutex<Inner>,
    stores: AtomicU64,
    loads: AtomicU64,
    evictions: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    directory: LruDirectory,
    arena: Vec<u8>,
}

impl HostTier {
    /// A tier of `capacity_blocks` blocks of `block_bytes` bytes each. The
    /// arena is zero-initialized memory, so the OS backs its pages only as
    /// blocks arrive.
    pub fn new(block_bytes: usize, capacity_blocks: usize) -> Result<Self> {
        let bytes = block_bytes.checked_mul(capacity_blocks).ok_or_else(|| {
            crate::Error::InvalidConfig("the host tier does not fit in the address space".into())
        })?;
        Ok(Self {
            block_bytes,
            inner: Mutex::new(Inner {
                directory: LruDirectory::new(capacity_blocks)?,
                arena: crate::alloc::zeroed_bytes(bytes, "the host tier's arena")?,
            }),
            stores: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        })
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Whether the tier holds `hash` (its recency is not touched).
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.inner.lock().directory.contains(hash)
    }

    /// How many leading `hashes` the tier holds.
    pub fn leading_run(&self, hashes: &[BlockHash]) -> usize {
        let inner = self.inner.lock();
        hashes
            .iter()
            .take_while(|&&h| inner.directory.contains(h))
            .count()
    }

    /// Runs `f` on the bytes of block `hash`, making it most recently used;
    /// `Ok(false)` when the tier does not hold it.
    pub fn read(&self, hash: BlockHash, f: impl FnOnce(&[u8]) -> Result<()>) -> Result<bool> {
        let mut inner = self.inner.lock();
        let Some(slot) = inner.directory.get(hash) else {
            return Ok(false);
        };
        let start = slot as usize * self.block_bytes;
        f(&inner.arena[start..start + self.block_bytes])?;
        self.loads.fetch_add(1, Relaxed);
        Ok(true)
    }

    /// Stores block `hash`, its bytes written by `fill`, evicting the least
    /// recently used block when full. `Ok(None)` when the tier already
    /// holds it (contents are immutable per hash) or has no room at all. If
    /// `fill` fails, the block is not stored.
    pub fn insert(
        &self,
        hash: BlockHash,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Option<HostStored>> {
        let mut inner = self.inner.lock();
        let Some(placed) = inner.directory.insert(hash) else {
            return Ok(None);
        };
        if placed.evicted.is_some() {
            self.evictions.fetch_add(1, Relaxed);
        }
        let start = placed.slot as usize * self.block_bytes;
        let end = start + self.block_bytes;
        if let Err(e) = fill(&mut inner.arena[start..end]) {
            inner.directory.remove(hash);
            return Err(e);
        }
        self.stores.fetch_add(1, Relaxed);
        Ok(Some(HostStored {
            evicted: placed.evicted,
        }))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> HostTierStats {
        let inner = self.inner.lock();
        HostTierStats {
            capacity_blocks: inner.directory.capacity() as u64,
            blocks: inner.directory.len() as u64,
            stores: self.stores.load(Relaxed),
            loads: self.loads.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(value: u8) -> impl FnOnce(&mut [u8]) -> Result<()> {
        move |b| {
            b.fill(value);
            Ok(())
        }
    }

    #[test]
    fn stores_reads_and_evicts_whole_blocks() {
        let tier = HostTier::new(4, 2).unwrap();
        let h = BlockHash;
        let stored = |evicted| Some(HostStored { evicted });
        assert_eq!(tier.insert(h(1), fill(1)).unwrap(), stored(None));
        assert_eq!(tier.insert(h(2), fill(2)).unwrap(), stored(None));
        assert_eq!(tier.insert(h(1), |_| unreachable!()).unwrap(), None);
        // h(1) was touched by the refused insert: h(2) goes first.
        assert_eq!(tier.insert(h(3), fill(3)).unwrap(), stored(Some(h(2))));
        assert_eq!(tier.leading_run(&[h(1), h(3), h(2)]), 2);
        let mut seen = Vec::new();
        assert!(tier
            .read(h(3), |b| {
                seen.extend_from_slice(b);
                Ok(())
            })
            .unwrap());
        assert_eq!(seen, [3; 4]);
        assert!(!tier.read(h(2), |_| unreachable!()).unwrap());
        let failed = tier.insert(h(4), |_| Err(crate::Error::Storage("copy failed".into())));
        assert!(failed.is_err() && !tier.contains(h(4)));
        let s = tier.stats();
        assert_eq!((s.blocks, s.stores, s.loads, s.evictions), (1, 3, 1, 2));
    }
}
