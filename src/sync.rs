//! Synchronization primitives, swapped for loom's under `--cfg loom` so the
//! loom models in `tests/loom_*.rs` explore every interleaving of the real code.

/// A mutex whose `lock` never fails (poisoning is not used by this crate).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(Inner<T>);

#[cfg(not(loom))]
type Inner<T> = parking_lot::Mutex<T>;
#[cfg(loom)]
type Inner<T> = loom::sync::Mutex<T>;

#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Inner::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(not(loom))]
        return self.0.lock();
        #[cfg(loom)]
        return self.0.lock().unwrap_or_else(|e| e.into_inner());
    }
}

/// A reader-writer lock whose `read`/`write` never fail.
#[derive(Debug, Default)]
pub(crate) struct RwLock<T>(RwInner<T>);

#[cfg(not(loom))]
type RwInner<T> = parking_lot::RwLock<T>;
#[cfg(loom)]
type RwInner<T> = loom::sync::RwLock<T>;

#[cfg(not(loom))]
pub(crate) type ReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
#[cfg(loom)]
pub(crate) type ReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
#[cfg(not(loom))]
pub(crate) type WriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;
#[cfg(loom)]
pub(crate) type WriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

impl<T> RwLock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(RwInner::new(value))
    }

    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        #[cfg(not(loom))]
        return self.0.read();
        #[cfg(loom)]
        return self.0.read().unwrap_or_else(|e| e.into_inner());
    }

    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        #[cfg(not(loom))]
        return self.0.write();
        #[cfg(loom)]
        return self.0.write().unwrap_or_else(|e| e.into_inner());
    }
}
