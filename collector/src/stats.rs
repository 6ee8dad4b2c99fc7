//! What a collector did, reported when it stops.

/// Counters reported when the collector stops.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CollectStats {
    /// Commands acked.
    pub commands: u64,
    /// Pods deleted (the API server answered, 404 included).
    pub deleted: u64,
    /// Pods labelled `airflow_executor_done=True`.
    pub labelled_done: u64,
    /// Commands sent back to be judged again later (a grace period, a refusal).
    pub delayed: u64,
    /// Commands that were dead-lettered.
    pub dead_lettered: u64,
}

impl std::ops::AddAssign for CollectStats {
    fn add_assign(&mut self, other: CollectStats) {
        self.commands += other.commands;
        self.deleted += other.deleted;
        self.labelled_done += other.labelled_done;
        self.delayed += other.delayed;
        self.dead_lettered += other.dead_lettered;
    }
}

impl std::fmt::Display for CollectStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "commands {}, pods deleted {}, pods labelled done {}, commands delayed {}, dead-lettered {}",
            self.commands, self.deleted, self.labelled_done, self.delayed, self.dead_lettered
        )
    }
}
