//! Counting outcomes: `applied 12, skipped 3 (terminal 2, unknown_ti 1), dead-lettered 0`.

use std::collections::BTreeMap;
use std::fmt;

use crate::apply::Outcome;

/// Outcome counts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Commands applied.
    pub applied: u64,
    /// Commands skipped, by reason.
    pub skipped: BTreeMap<&'static str, u64>,
    /// Commands dead-lettered.
    pub dead_lettered: u64,
}

impl Summary {
    /// Counts one outcome.
    pub fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Applied(_) => self.applied += 1,
            Outcome::Skipped(skip) => *self.skipped.entry(skip.name()).or_default() += 1,
            Outcome::Dead(_) => self.dead_lettered += 1,
        }
    }

    /// Commands skipped in all.
    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().sum()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "applied {}, skipped {}",
            self.applied,
            self.skipped_total()
        )?;
        if !self.skipped.is_empty() {
            let reasons: Vec<String> = self
                .skipped
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            write!(f, " ({})", reasons.join(", "))?;
        }
        write!(f, ", dead-lettered {}", self.dead_lettered)
    }
}
