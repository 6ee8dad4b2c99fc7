//! What a processor did, counted per consumer and summed when it stops.

/// Counters reported when the processor stops.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStats {
    /// Pod events decided.
    pub decided: u64,
    /// Commands published.
    pub commands: u64,
    /// Pod events that were dead-lettered.
    pub dead_lettered: u64,
    /// Searches of the stream for earlier undecided events of a pod (the ingest could not
    /// vouch for the pod's previous event).
    pub searches: u64,
    /// Task records read from KV (not in the cache, or changed by another instance).
    pub reads: u64,
    /// Task records written: one per group of a TI's events decided together.
    pub writes: u64,
}

impl std::ops::AddAssign for ProcessStats {
    fn add_assign(&mut self, other: ProcessStats) {
        self.decided += other.decided;
        self.commands += other.commands;
        self.dead_lettered += other.dead_lettered;
        self.searches += other.searches;
        self.reads += other.reads;
        self.writes += other.writes;
    }
}

impl std::fmt::Display for ProcessStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "decided {}, commands {}, dead-lettered {}, searches for earlier events {}, records read {}, records written {}",
            self.decided, self.commands, self.dead_lettered, self.searches, self.reads, self.writes
        )
    }
}
