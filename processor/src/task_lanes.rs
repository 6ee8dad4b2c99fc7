//! Which events of which task instance the service decides next. Pure bookkeeping, no I/O.
//!
//! A task instance is decided by one group of its events at a time, in stream order. Events
//! that arrive while its group is being decided wait behind it and become its next group,
//! decided together with one record write. No other TI waits: a group starts as soon as its
//! TI is free, so there is no batch that waits for its slowest TI.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

/// Per busy task instance (by record key), the events waiting behind its running group.
#[derive(Debug)]
pub struct TaskLanes<T> {
    busy: HashMap<String, Vec<T>>,
}

impl<T> Default for TaskLanes<T> {
    fn default() -> Self {
        TaskLanes {
            busy: HashMap::new(),
        }
    }
}

impl<T> TaskLanes<T> {
    /// Events of `key` arrived, in stream order: returned as a group to start now when the
    /// TI is free, or queued behind its running group (`None`).
    pub fn arrived(&mut self, key: &str, events: Vec<T>) -> Option<Vec<T>> {
        match self.busy.get_mut(key) {
            Some(waiting) => {
                waiting.extend(events);
                None
            }
            None => {
                self.busy.insert(key.to_owned(), Vec::new());
                Some(events)
            }
        }
    }

    /// The running group of `key` finished: the events that waited behind it, as its next
    /// group; `None` frees the TI.
    pub fn finished(&mut self, key: &str) -> Option<Vec<T>> {
        match self.busy.entry(key.to_owned()) {
            Entry::Occupied(mut waiting) if !waiting.get().is_empty() => {
                Some(std::mem::take(waiting.get_mut()))
            }
            Entry::Occupied(free) => {
                free.remove();
                None
            }
            Entry::Vacant(_) => None,
        }
    }

    /// Task instances with a running group.
    #[cfg(test)]
    fn busy(&self) -> usize {
        self.busy.len()
    }
}

/// Splits `events` by key, each key's events in their order, the keys in order of first sight.
pub fn by_key<T>(events: impl IntoIterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
    let mut groups: Vec<(String, Vec<T>)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for (key, event) in events {
        match at.entry(key) {
            Entry::Occupied(index) => groups[*index.get()].1.push(event),
            Entry::Vacant(slot) => {
                groups.push((slot.key().clone(), vec![event]));
                slot.insert(groups.len() - 1);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of the service: events arrive for a TI, or a TI's group finishes.
    enum Step {
        Arrive(&'static str, &'static [u64]),
        Finish(&'static str),
    }
    use Step::{Arrive, Finish};

    /// A case: its name, and each step with the group it starts (`None`: nothing starts).
    type Case = (&'static str, &'static [(Step, Option<&'static [u64]>)]);

    #[test]
    fn a_task_instance_is_decided_by_one_group_at_a_time_in_order() {
        let table: &[Case] = &[
            (
                "a free TI starts at once",
                &[(Arrive("a", &[1, 2]), Some(&[1, 2]))],
            ),
            (
                "a busy TI's events wait, then go together",
                &[
                    (Arrive("a", &[1]), Some(&[1])),
                    (Arrive("a", &[2]), None),
                    (Arrive("a", &[3, 4]), None),
                    (Finish("a"), Some(&[2, 3, 4])),
                    (Finish("a"), None),
                    (Arrive("a", &[5]), Some(&[5])),
                ],
            ),
            (
                "another TI never waits for a busy one",
                &[
                    (Arrive("a", &[1]), Some(&[1])),
                    (Arrive("a", &[2]), None),
                    (Arrive("b", &[3]), Some(&[3])),
                    (Finish("b"), None),
                    (Finish("a"), Some(&[2])),
                ],
            ),
            (
                "finishing a TI that is not busy starts nothing",
                &[(Finish("a"), None)],
            ),
        ];
        for (case, steps) in table {
            let mut lanes = TaskLanes::default();
            for (number, (step, wanted)) in steps.iter().enumerate() {
                let started = match step {
                    Arrive(key, events) => lanes.arrived(key, events.to_vec()),
                    Finish(key) => lanes.finished(key),
                };
                assert_eq!(started.as_deref(), *wanted, "{case}: step {number}");
            }
        }
    }

    #[test]
    fn finishing_the_last_group_frees_the_task_instance() {
        let mut lanes = TaskLanes::default();
        lanes.arrived("a", vec![1]);
        lanes.arrived("b", vec![2]);
        assert_eq!(lanes.busy(), 2);
        assert_eq!(lanes.finished("a"), None);
        assert_eq!(lanes.busy(), 1);
    }

    #[test]
    fn events_split_by_key_keep_their_order() {
        let events = [("b", 1), ("a", 2), ("b", 3), ("c", 4), ("a", 5)]
            .map(|(key, event)| (key.to_owned(), event));
        let wanted = vec![
            ("b".to_owned(), vec![1, 3]),
            ("a".to_owned(), vec![2, 5]),
            ("c".to_owned(), vec![4]),
        ];
        assert_eq!(by_key(events), wanted);
    }
}
