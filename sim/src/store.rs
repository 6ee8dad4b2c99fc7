//! The versioned object store: one global resourceVersion counter, the current objects, and
//! a bounded log of changes that watches replay and paged lists read consistent snapshots from.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use serde_json::Value;

use crate::object::{Key, Stored, set_resource_version};
use crate::resource::Resource;
use crate::status::ApiError;

/// What a change did to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The object was created.
    Added,
    /// The object was updated.
    Modified,
    /// The object was removed.
    Deleted,
}

/// One change, at one resourceVersion.
#[derive(Debug, Clone)]
pub struct Event {
    /// The revision of this change.
    pub rv: u64,
    /// What happened.
    pub change: Change,
    /// The object after the change (its last state for `Deleted`).
    pub object: Arc<Stored>,
    /// The object before the change, for selector transitions and snapshots.
    pub old: Option<Arc<Stored>>,
}

/// The objects and their recent history.
#[derive(Debug)]
pub struct Store {
    objects: BTreeMap<Key, Arc<Stored>>,
    log: VecDeque<Event>,
    head: u64,
    compacted_through: u64,
    retain: usize,
}

impl Store {
    /// An empty store that keeps the last `retain` changes.
    pub fn new(retain: usize) -> Store {
        Store {
            objects: BTreeMap::new(),
            log: VecDeque::new(),
            head: 0,
            compacted_through: 0,
            retain: retain.max(1),
        }
    }

    /// The newest resourceVersion.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The newest resourceVersion that history no longer covers: reads at or after it work.
    pub fn compacted_through(&self) -> u64 {
        self.compacted_through
    }

    /// Number of changes retained.
    pub fn retained(&self) -> usize {
        self.log.len()
    }

    /// The current version of an object.
    pub fn get(&self, key: &Key) -> Option<Arc<Stored>> {
        self.objects.get(key).cloned()
    }

    /// Inserts a new object (prepared by `object::prepare_create`) at the next revision.
    pub fn insert(
        &mut self,
        resource: Resource,
        mut value: Value,
    ) -> Result<Arc<Stored>, ApiError> {
        let rv = self.head + 1;
        set_resource_version(&mut value, rv);
        let stored = Arc::new(Stored::from_value(resource, &value)?);
        if self.objects.contains_key(&stored.key) {
            return Err(ApiError::already_exists(
                resource.group(),
                resource.plural(),
                &stored.key.name,
            ));
        }
        self.objects.insert(stored.key.clone(), stored.clone());
        self.record(rv, Change::Added, stored.clone(), None);
        Ok(stored)
    }

    /// Replaces an object's value at the next revision, unless nothing changed.
    pub fn replace(&mut self, key: &Key, mut value: Value) -> Result<Arc<Stored>, ApiError> {
        let Some(old) = self.objects.get(key).cloned() else {
            return Err(ApiError::not_found(
                key.resource.group(),
                key.resource.plural(),
                &key.name,
            ));
        };
        set_resource_version(&mut value, old.resource_version);
        if value == old.value()? {
            return Ok(old);
        }
        let rv = self.head + 1;
        set_resource_version(&mut value, rv);
        let stored = Arc::new(Stored::from_value(key.resource, &value)?);
        self.objects.insert(key.clone(), stored.clone());
        self.record(rv, Change::Modified, stored.clone(), Some(old));
        Ok(stored)
    }

    /// Removes an object at the next revision; its last state carries that revision.
    pub fn remove(&mut self, key: &Key) -> Result<Arc<Stored>, ApiError> {
        let Some(old) = self.objects.remove(key) else {
            return Err(ApiError::not_found(
                key.resource.group(),
                key.resource.plural(),
                &key.name,
            ));
        };
        let rv = self.head + 1;
        let mut value = old.value()?;
        set_resource_version(&mut value, rv);
        let last = Arc::new(Stored::from_value(key.resource, &value)?);
        self.record(rv, Change::Deleted, last.clone(), Some(old));
        Ok(last)
    }

    fn record(&mut self, rv: u64, change: Change, object: Arc<Stored>, old: Option<Arc<Stored>>) {
        self.head = rv;
        self.log.push_back(Event {
            rv,
            change,
            object,
            old,
        });
        while self.log.len() > self.retain {
            if let Some(dropped) = self.log.pop_front() {
                self.compacted_through = dropped.rv;
            }
        }
    }

    /// Forgets all history: any read or watch from an older resourceVersion gets 410.
    pub fn compact(&mut self) {
        self.log.clear();
        self.compacted_through = self.head;
    }

    /// Up to `max` changes after `rv`, or 410 when compaction removed some of them.
    pub fn events_after(&self, rv: u64, max: usize) -> Result<Vec<Event>, ApiError> {
        if rv < self.compacted_through {
            return Err(ApiError::too_old(rv, self.compacted_through + 1));
        }
        let start = self.log.partition_point(|event| event.rv <= rv);
        Ok(self.log.range(start..).take(max).cloned().collect())
    }

    /// Up to `take` objects of one resource (and namespace, if given) that `select` accepts,
    /// as they were at revision `at`, in key order, starting after `after`; 410 when `at` is
    /// older than the history. Reads only as far as it needs.
    pub fn snapshot(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        at: u64,
        after: Option<&Key>,
        take: usize,
        select: impl Fn(&Stored) -> bool,
    ) -> Result<Vec<Arc<Stored>>, ApiError> {
        if at < self.compacted_through {
            return Err(ApiError::too_old(at, self.compacted_through + 1));
        }
        let in_scope =
            |key: &Key| key.resource == resource && namespace.is_none_or(|ns| key.namespace == ns);
        let past_after = |key: &Key| after.is_none_or(|a| key > a);
        // Keys changed after `at`: the first change of each holds the state at `at`.
        let mut undone: BTreeMap<Key, Option<Arc<Stored>>> = BTreeMap::new();
        if at < self.head {
            let start = self.log.partition_point(|event| event.rv <= at);
            for event in self.log.range(start..) {
                let key = &event.object.key;
                if !in_scope(key) || !past_after(key) || undone.contains_key(key) {
                    continue;
                }
                let then = match &event.old {
                    Some(old) if event.change != Change::Added => Some(old.clone()),
                    _ => None,
                };
                undone.insert(key.clone(), then);
            }
        }
        let lower = match after {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Included(Key::new(resource, namespace.unwrap_or(""), "")),
        };
        let mut current = self
            .objects
            .range((lower, Bound::Unbounded))
            .take_while(|(key, _)| in_scope(key))
            .filter(|(key, _)| !undone.contains_key(*key))
            .map(|(key, object)| (key, Some(object)))
            .peekable();
        let mut past = undone
            .iter()
            .map(|(key, object)| (key, object.as_ref()))
            .peekable();
        let mut out = Vec::new();
        while out.len() < take {
            // Merge the two key-ordered sources.
            let next = match (current.peek(), past.peek()) {
                (Some((a, _)), Some((b, _))) if a < b => current.next(),
                (Some(_), Some(_)) => past.next(),
                (Some(_), None) => current.next(),
                (None, Some(_)) => past.next(),
                (None, None) => break,
            };
            if let Some((_, Some(object))) = next
                && select(object)
            {
                out.push(object.clone());
            }
        }
        Ok(out)
    }

    /// Every current object of a resource (all namespaces), in key order.
    pub fn all(&self, resource: Resource) -> impl Iterator<Item = &Arc<Stored>> {
        self.objects
            .range(Key::new(resource, "", "")..)
            .take_while(move |(key, _)| key.resource == resource)
            .map(|(_, object)| object)
    }
}
