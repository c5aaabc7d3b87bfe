//! A sharded map keyed by pointer or handle: the storage of every per-process record table.
//! A shard's lock is held only for the map operation itself, never across a driver call.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::Mutex;

const SHARDS: usize = 32;

/// Keys are device pointers and driver handles: already well spread, a multiply is hash enough.
#[derive(Default)]
pub struct PtrHasher(u64);
impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
type Map<V> = HashMap<u64, V, BuildHasherDefault<PtrHasher>>;

pub struct Table<V> {
    shards: [Mutex<Map<V>>; SHARDS],
}

impl<V> Table<V> {
    pub const fn new() -> Self {
        Table {
            shards: [const { Mutex::new(HashMap::with_hasher(BuildHasherDefault::new())) }; SHARDS],
        }
    }

    fn shard(&self, k: u64) -> &Mutex<Map<V>> {
        // Allocation addresses are aligned: skip the low bits before picking a shard.
        let h = (k >> 9 ^ k >> 21 ^ k).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59;
        &self.shards[h as usize % SHARDS]
    }

    pub fn insert(&self, k: u64, v: V) -> Option<V> {
        self.shard(k).lock().insert(k, v)
    }

    pub fn remove(&self, k: u64) -> Option<V> {
        self.shard(k).lock().remove(&k)
    }

    pub fn with<R>(&self, k: u64, f: impl FnOnce(Option<&mut V>) -> R) -> R {
        f(self.shard(k).lock().get_mut(&k))
    }

    /// Entry-level update creating the value with `init` when absent.
    pub fn update<R>(&self, k: u64, init: impl FnOnce() -> V, f: impl FnOnce(&mut V) -> R) -> R {
        f(self.shard(k).lock().entry(k).or_insert_with(init))
    }

    /// Removes and returns every entry matching `pred` (context teardown).
    pub fn drain_where(&self, mut pred: impl FnMut(&V) -> bool) -> Vec<(u64, V)> {
        let mut out = Vec::new();
        for s in &self.shards {
            let mut m = s.lock();
            let keys: Vec<u64> = m.iter().filter(|(_, v)| pred(v)).map(|(k, _)| *k).collect();
            for k in keys {
                if let Some(v) = m.remove(&k) {
                    out.push((k, v));
                }
            }
        }
        out
    }

    /// Whether any entry matches `pred`.
    pub fn any(&self, mut pred: impl FnMut(&V) -> bool) -> bool {
        self.shards.iter().any(|s| s.lock().values().any(&mut pred))
    }

    /// A copy of an entry matching `pred` (a scan of every shard).
    pub fn find(&self, mut pred: impl FnMut(&V) -> bool) -> Option<V>
    where
        V: Clone,
    {
        self.shards
            .iter()
            .find_map(|s| s.lock().values().find(|v| pred(v)).cloned())
    }

    /// Copies of all entries (a snapshot).
    pub fn values(&self) -> Vec<V>
    where
        V: Clone,
    {
        self.shards
            .iter()
            .flat_map(|s| s.lock().values().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Keys of all entries (a snapshot).
    pub fn keys(&self) -> Vec<u64> {
        self.shards
            .iter()
            .flat_map(|s| s.lock().keys().copied().collect::<Vec<_>>())
            .collect()
    }

    /// fork prepare: hold every shard so the child never inherits a shard locked by another thread.
    pub fn lock_all(&self) {
        for s in &self.shards {
            std::mem::forget(s.lock());
        }
    }

    /// fork parent/child: release what `lock_all` took.
    pub fn unlock_all(&self) {
        for s in &self.shards {
            // SAFETY: lock_all took this lock in this thread and forgot the guard.
            unsafe { s.force_unlock() };
        }
    }

    /// fork child: records of the parent's memory are not the child's.
    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_update_drain() {
        let t: Table<u64> = Table::new();
        for k in 0..1000u64 {
            t.insert(0x7f00_0000_0000 + k * 512, k);
        }
        assert_eq!(t.remove(0x7f00_0000_0000 + 512), Some(1));
        assert_eq!(t.remove(0x7f00_0000_0000 + 512), None);
        t.update(5, || 0, |v| *v += 7);
        t.update(5, || 0, |v| *v += 7);
        assert_eq!(t.with(5, |v| v.copied()), Some(14));
        let d = t.drain_where(|v| *v >= 990);
        assert_eq!(d.len(), 10);
        assert_eq!(t.keys().len(), 1000 - 1 - 10 + 1);
        t.lock_all();
        t.unlock_all();
        t.clear();
        assert!(t.keys().is_empty());
    }
}
