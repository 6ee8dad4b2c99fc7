//! Choosing the pod that drives a task instance when several map to it
//! (docs/semantics.md "Several pods for one task instance").

use std::cmp::Ordering;

use podstream_proto::v1::Phase;

use crate::state::Candidate;

/// The index of the candidate that drives the TI: the same on every processor and replay,
/// whatever order the pods were seen in.
///
/// 1. pods without `deletionTimestamp` before terminating ones;
/// 2. then by phase: Running, Pending, Succeeded, Failed, other;
/// 3. then the newest `creationTimestamp`;
/// 4. then the lexicographically last pod name;
/// 5. (ours, for a total order) then the last namespace, then the last uid.
///
/// Before all of these, a pod that was passed over (it ended while another pod drove the TI)
/// comes last: its ending was already judged not to be the TI's.
pub fn choose(candidates: &[Candidate]) -> Option<usize> {
    (0..candidates.len()).min_by(|&a, &b| precedence(&candidates[a], &candidates[b]))
}

/// `Less` when `a` is preferred to `b`.
pub fn precedence(a: &Candidate, b: &Candidate) -> Ordering {
    a.passed_over
        .cmp(&b.passed_over)
        .then_with(|| a.terminating.cmp(&b.terminating))
        .then_with(|| phase_rank(a.phase).cmp(&phase_rank(b.phase)))
        .then_with(|| b.created_unix_ms.cmp(&a.created_unix_ms))
        .then_with(|| b.pod.name.cmp(&a.pod.name))
        .then_with(|| b.pod.namespace.cmp(&a.pod.namespace))
        .then_with(|| b.pod.uid.cmp(&a.pod.uid))
}

fn phase_rank(phase: Phase) -> u8 {
    match phase {
        Phase::Running => 0,
        Phase::Pending => 1,
        Phase::Succeeded => 2,
        Phase::Failed => 3,
        Phase::Unknown | Phase::Unspecified => 4,
    }
}
