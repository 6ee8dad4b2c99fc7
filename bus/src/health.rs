//! Whether a component is ready: the conditions it declared, each met or not.
//!
//! A component declares its conditions at start (all unmet), and flips them as it goes: the
//! `/readyz` endpoint answers 200 only while every one is met. A fault that the component
//! waits out instead of failing (a database refusing writes, JetStream unavailable, a watch
//! that keeps failing) shows here, not only in its logs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One condition of readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Condition {
    /// The ingest's watch has listed and is streaming (or it stands by to lead).
    WatchSynced,
    /// The stage's JetStream consumers are bound and its last bus operation succeeded.
    ConsumerBound,
    /// The sink's database answers writes.
    DatabaseAnswers,
}

impl Condition {
    /// Every condition, in the order `/readyz` reports them.
    pub const ALL: [Condition; 3] = [
        Condition::WatchSynced,
        Condition::ConsumerBound,
        Condition::DatabaseAnswers,
    ];

    /// Its name in `/readyz` and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Condition::WatchSynced => "watch_synced",
            Condition::ConsumerBound => "consumer_bound",
            Condition::DatabaseAnswers => "database_answers",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The conditions a component declared, shared between the component and its endpoint.
/// Cloning shares the state.
#[derive(Debug, Clone, Default)]
pub struct Health {
    declared: Arc<[AtomicBool; 3]>,
    met: Arc<[AtomicBool; 3]>,
}

impl Health {
    /// A component with no conditions yet: ready until it declares one.
    pub fn new() -> Health {
        Health::default()
    }

    /// Declares `condition`, unmet.
    pub fn declare(&self, condition: Condition) {
        self.met[condition.index()].store(false, Ordering::Release);
        self.declared[condition.index()].store(true, Ordering::Release);
        report(condition, false);
    }

    /// Marks `condition` met or not; logs when it changes.
    pub fn set(&self, condition: Condition, met: bool) {
        let was = self.met[condition.index()].swap(met, Ordering::AcqRel);
        if was != met && self.declared[condition.index()].load(Ordering::Acquire) {
            report(condition, met);
            // Info, not warn: the fault behind a change logs its own warning.
            if met {
                tracing::info!(condition = condition.name(), "ready");
            } else {
                tracing::info!(condition = condition.name(), "not ready");
            }
        }
    }

    /// Each declared condition and whether it is met.
    pub fn conditions(&self) -> Vec<(Condition, bool)> {
        Condition::ALL
            .into_iter()
            .filter(|c| self.declared[c.index()].load(Ordering::Acquire))
            .map(|c| (c, self.met[c.index()].load(Ordering::Acquire)))
            .collect()
    }

    /// Whether every declared condition is met.
    pub fn ready(&self) -> bool {
        self.conditions().iter().all(|(_, met)| *met)
    }
}

/// The condition as the [`crate::metrics::READY`] gauge.
fn report(condition: Condition, met: bool) {
    metrics::gauge!(crate::metrics::READY, "condition" => condition.name()).set(if met {
        1.0
    } else {
        0.0
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_every_declared_condition_is_met() {
        let health = Health::new();
        assert!(health.ready(), "nothing declared");
        health.declare(Condition::ConsumerBound);
        health.declare(Condition::DatabaseAnswers);
        assert!(!health.ready());
        health.set(Condition::ConsumerBound, true);
        assert!(!health.ready());
        let shared = health.clone();
        shared.set(Condition::DatabaseAnswers, true);
        assert!(health.ready());
        health.set(Condition::DatabaseAnswers, false);
        assert_eq!(
            health.conditions(),
            vec![
                (Condition::ConsumerBound, true),
                (Condition::DatabaseAnswers, false)
            ]
        );
        // An undeclared condition does not count.
        health.set(Condition::DatabaseAnswers, true);
        health.set(Condition::WatchSynced, false);
        assert!(health.ready());
    }
}
