//! Counting outcomes: `applied 12 (launch_failed 1), skipped 3 (terminal 2, unknown_ti 1),
//! dead-lettered 0`.

use std::collections::BTreeMap;
use std::fmt;

use crate::guard::Effect;
use crate::item::Outcome;

/// Outcome counts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Commands applied.
    pub applied: u64,
    /// Of those, fails of queued TIs recorded as `launch_failed` and left to the executor.
    pub launch_failed: u64,
    /// Commands skipped, by reason.
    pub skipped: BTreeMap<&'static str, u64>,
    /// Commands dead-lettered.
    pub dead_lettered: u64,
}

impl Summary {
    /// Counts one outcome.
    pub fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Applied(effect) => {
                self.applied += 1;
                if *effect == Effect::LaunchFailed {
                    self.launch_failed += 1;
                }
            }
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
        write!(f, "applied {}", self.applied)?;
        if self.launch_failed > 0 {
            write!(f, " (launch_failed {})", self.launch_failed)?;
        }
        write!(f, ", skipped {}", self.skipped_total())?;
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
