//! The task records this instance wrote last, with their KV revisions, so the next event of a
//! task instance is decided without reading its record back. Nothing here is trusted: every
//! write is a compare-and-set on the cached revision, so a record another instance changed
//! meanwhile fails the write, and the service reads it afresh.

use std::sync::Mutex;

use hashlink::LruCache;

use podstream_rules::record::TaskRecord;

/// A record as this instance last wrote or read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Cached {
    /// The record; its outbox already published.
    pub record: TaskRecord,
    /// Its KV revision.
    pub revision: u64,
}

/// A bounded, least-recently-used map of task records by KV key.
pub struct RecordCache {
    entries: Mutex<LruCache<String, Cached>>,
}

impl RecordCache {
    /// Holds at most `capacity` records (0 keeps none).
    pub fn new(capacity: usize) -> RecordCache {
        RecordCache {
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// Takes the record of `key` out, so one task instance is never decided from two copies.
    pub fn take(&self, key: &str) -> Option<Cached> {
        self.lock().remove(key)
    }

    /// Keeps the record of `key`, evicting the least recently used beyond capacity.
    pub fn put(&self, key: String, mut cached: Cached) {
        // Published already; only the KV copy needs it (for a crash between write and publish).
        cached.record.outbox = Vec::new();
        self.lock().insert(key, cached);
    }

    /// How many records it holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, Cached>> {
        // A panic elsewhere while holding the lock leaves a map that is still consistent.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podstream_proto::v1::{Command, Running};

    fn cached(revision: u64) -> Cached {
        Cached {
            record: TaskRecord {
                outbox: vec![Command {
                    id: "c".into(),
                    kind: Some(podstream_proto::v1::command::Kind::Running(Running {})),
                    ..Command::default()
                }],
                ..TaskRecord::default()
            },
            revision,
        }
    }

    #[test]
    fn keeps_the_most_recently_used_records_without_their_outbox() {
        let cache = RecordCache::new(2);
        cache.put("a".into(), cached(1));
        cache.put("b".into(), cached(2));
        // "a" used again: "b" is now the least recently used.
        let a = cache.take("a").unwrap();
        assert_eq!(a.revision, 1);
        assert!(a.record.outbox.is_empty(), "the outbox is not kept");
        cache.put("a".into(), a);
        cache.put("c".into(), cached(3));
        assert_eq!(cache.len(), 2);
        assert!(cache.take("b").is_none(), "evicted");
        assert_eq!(cache.take("c").map(|c| c.revision), Some(3));
        // Taken means gone until put back.
        assert!(cache.take("c").is_none());
    }

    #[test]
    fn a_zero_capacity_keeps_nothing() {
        let cache = RecordCache::new(0);
        cache.put("a".into(), cached(1));
        assert_eq!(cache.len(), 0);
        assert!(cache.take("a").is_none());
    }
}
