//! The tiered cache's event queue: the device tier's events and the lower
//! tiers' own, each with its `medium`, in the order they happened, bounded
//! like the manager's (`max_pending_events`, excess dropped and counted).

use std::sync::Arc;

use crate::events::CacheEvent;
use crate::hash::BlockHash;
use crate::manager::BlockManager;
use crate::publish::{WireEvent, MEDIUM_GPU};
use crate::sync::Mutex;

/// Blocks one call stored into and removed from a tier, in order: runs of
/// the same kind (`true`: stored).
#[derive(Debug, Default)]
pub(crate) struct Changes {
    runs: Vec<(bool, Vec<BlockHash>)>,
}

impl Changes {
    /// Block `hash` entered the tier.
    pub(crate) fn stored(&mut self, hash: BlockHash) {
        self.add(true, hash);
    }

    /// Block `hash` left the tier.
    pub(crate) fn removed(&mut self, hash: BlockHash) {
        self.add(false, hash);
    }

    fn add(&mut self, stored: bool, hash: BlockHash) {
        match self.runs.last_mut() {
            Some((kind, hashes)) if *kind == stored => hashes.push(hash),
            _ => self.runs.push((stored, vec![hash])),
        }
    }
}

/// Events of every tier, waiting for `TieredCache::take_events`.
#[derive(Debug)]
pub(crate) struct EventLog {
    enabled: bool,
    max_events: usize,
    gpu: Arc<str>,
    inner: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    events: Vec<WireEvent>,
    dropped: u64,
}

impl EventLog {
    /// A log for `manager`'s events (recording only when its config enables events).
    pub(crate) fn new(manager: &BlockManager) -> Self {
        let config = manager.config();
        Self {
            enabled: config.enable_events,
            max_events: config.max_pending_events,
            gpu: MEDIUM_GPU.into(),
            inner: Mutex::new(Queue::default()),
        }
    }

    /// Records the changes of the tier `medium`, in their order: a
    /// `BlockStored` (no tokens or parent: a lower tier keeps whole blocks by
    /// hash, as vLLM's offloading events do) or `BlockRemoved` per run.
    pub(crate) fn record(&self, manager: &BlockManager, medium: &Arc<str>, changes: Changes) {
        if !self.enabled || changes.runs.is_empty() {
            return;
        }
        let mut q = self.inner.lock();
        // The device tier's earlier events go first, so the order holds.
        self.drain_device(manager, &mut q);
        for (stored, hashes) in changes.runs {
            let block_hashes = hashes.iter().map(|h| h.external()).collect();
            let event = if stored {
                CacheEvent::BlockStored {
                    block_hashes,
                    parent_block_hash: None,
                    token_ids: Vec::new(),
                    block_size: manager.config().block_size,
                    adapter: None,
                }
            } else {
                CacheEvent::BlockRemoved { block_hashes }
            };
            self.push(&mut q, Arc::clone(medium), event);
        }
    }

    /// Every event recorded since the last call, oldest first.
    pub(crate) fn take(&self, manager: &BlockManager) -> Vec<WireEvent> {
        let mut q = self.inner.lock();
        self.drain_device(manager, &mut q);
        std::mem::take(&mut q.events)
    }

    /// Events dropped because `max_pending_events` were waiting.
    pub(crate) fn dropped(&self) -> u64 {
        self.inner.lock().dropped
    }

    fn drain_device(&self, manager: &BlockManager, q: &mut Queue) {
        for event in manager.take_events() {
            self.push(q, Arc::clone(&self.gpu), event);
        }
    }

    fn push(&self, q: &mut Queue, medium: Arc<str>, event: CacheEvent) {
        if q.events.len() < self.max_events {
            q.events.push(WireEvent { event, medium });
        } else {
            q.dropped += 1;
        }
    }
}
