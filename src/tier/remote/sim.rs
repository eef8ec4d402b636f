//! An in-process stand-in for a shared key-value store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{RemoteBackend, RemoteError};
use crate::sync::Mutex;

/// A bounded in-memory key-value store with LRU eviction (like a server
/// with `maxmemory-policy allkeys-lru`), shared by every clone: give clones
/// to several caches and they share blocks as nodes sharing one server do.
#[derive(Debug, Clone)]
pub struct SimRemote {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    tick: u64,
    values: HashMap<Vec<u8>, (u64, Vec<u8>)>,
    /// Keys by last use, oldest first.
    recency: BTreeMap<u64, Vec<u8>>,
}

impl SimRemote {
    /// A store holding at most `capacity` values.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                capacity,
                tick: 0,
                values: HashMap::new(),
                recency: BTreeMap::new(),
            })),
        }
    }

    /// Values held now.
    pub fn len(&self) -> usize {
        self.inner.lock().values.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    fn touch(&mut self, key: &[u8]) -> bool {
        self.tick += 1;
        let tick = self.tick;
        let Some(entry) = self.values.get_mut(key) else {
            return false;
        };
        let old = std::mem::replace(&mut entry.0, tick);
        let k = self
            .recency
            .remove(&old)
            .expect("every value has a recency");
        self.recency.insert(tick, k);
        true
    }
}

impl RemoteBackend for SimRemote {
    fn get(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        let mut inner = self.inner.lock();
        Ok(keys
            .iter()
            .map(|k| inner.touch(k).then(|| inner.values[k].1.clone()))
            .collect())
    }

    fn exists(&mut self, keys: &[Vec<u8>]) -> Result<Vec<bool>, RemoteError> {
        let inner = self.inner.lock();
        Ok(keys.iter().map(|k| inner.values.contains_key(k)).collect())
    }

    fn put_if_absent(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), RemoteError> {
        let mut inner = self.inner.lock();
        for (key, value) in entries {
            if inner.capacity == 0 || inner.touch(key) {
                continue;
            }
            if inner.values.len() == inner.capacity {
                let (_, oldest) = inner.recency.pop_first().expect("a full store has values");
                inner.values.remove(&oldest);
            }
            let tick = inner.tick;
            inner.recency.insert(tick, key.clone());
            inner.values.insert(key.clone(), (tick, value.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_value_and_evicts_the_least_recently_used() {
        let mut a = SimRemote::new(2);
        let mut b = a.clone();
        let k = |s: &str| s.as_bytes().to_vec();
        a.put_if_absent(&[(k("x"), k("1")), (k("y"), k("2"))])
            .unwrap();
        b.put_if_absent(&[(k("x"), k("other"))]).unwrap();
        assert_eq!(b.get(&[k("x")]).unwrap(), vec![Some(k("1"))]);
        // x was used after y: y goes first.
        a.put_if_absent(&[(k("z"), k("3"))]).unwrap();
        assert_eq!(
            b.exists(&[k("x"), k("y"), k("z")]).unwrap(),
            vec![true, false, true]
        );
        assert_eq!(a.len(), 2);
    }
}
