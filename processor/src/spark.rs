//! Choosing the driver pod of an Airflow-launched Spark job when several match its task
//! instance (seed 003, issue 25): the pod its `SparkApplication` names, else the provider's
//! own `SparkKubernetesOperator.find_spark_job` order.
//!
//! `find_spark_job` (cncf.kubernetes ≥ 10.25) lists the driver pods of the task instance's
//! labels without its try number, leaving out pods labelled `already_checked=True` and pods in
//! phase `Failed` or `Unknown`, and takes the maximum of (not terminating, `Succeeded`,
//! `Pending`, creation time, name); `max` keeps the first of equal keys.

use std::cmp::Ordering;

use podstream_proto::v1::Phase;

/// The facts of one driver pod that the choice reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverPod {
    /// `metadata.name`.
    pub name: String,
    /// `status.phase`.
    pub phase: Phase,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `metadata.creationTimestamp`, Unix milliseconds; `None` sorts before any time.
    pub created_unix_ms: Option<i64>,
    /// Labelled `already_checked=True`: the operator has dealt with it.
    pub checked: bool,
}

/// Why a driver was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverReason {
    /// The owning SparkApplication's `status.driverInfo.podName` names it.
    Application,
    /// The application names no pod that exists; the provider's order chose it.
    Facts,
}

impl DriverReason {
    /// How the duplicate record says it.
    pub fn as_str(self) -> &'static str {
        match self {
            DriverReason::Application => "the SparkApplication names it",
            DriverReason::Facts => "by pod facts, as find_spark_job",
        }
    }
}

/// The driver chosen among a task instance's driver pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverChoice {
    /// Its index in the pods given.
    pub chosen: usize,
    /// Why it was chosen.
    pub reason: DriverReason,
}

/// The driver of a task instance among `drivers` (its driver pods, in one namespace, in the
/// order the API lists them): the pod `named` by its SparkApplication when it is among them,
/// else [`by_facts`]. `None` when neither picks a pod.
pub fn choose_driver(named: Option<&str>, drivers: &[DriverPod]) -> Option<DriverChoice> {
    if let Some(chosen) = named.and_then(|name| drivers.iter().position(|d| d.name == name)) {
        return Some(DriverChoice {
            chosen,
            reason: DriverReason::Application,
        });
    }
    by_facts(drivers).map(|chosen| DriverChoice {
        chosen,
        reason: DriverReason::Facts,
    })
}

/// The pod `find_spark_job` reattaches to, given the pods the API lists in this order.
pub fn by_facts(drivers: &[DriverPod]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (index, pod) in drivers.iter().enumerate() {
        if !listed_by_the_provider(pod) {
            continue;
        }
        // Strictly greater replaces: of equal keys the first stays, as Python's `max`.
        if best.is_none_or(|b| provider_key(pod, &drivers[b]) == Ordering::Greater) {
            best = Some(index);
        }
    }
    best
}

/// The provider's label and field selectors: `already_checked!=True`,
/// `status.phase!=Failed,status.phase!=Unknown`.
fn listed_by_the_provider(pod: &DriverPod) -> bool {
    !pod.checked && !matches!(pod.phase, Phase::Failed | Phase::Unknown)
}

/// `a` against `b` on (not terminating, Succeeded, Pending, creation time, name).
fn provider_key(a: &DriverPod, b: &DriverPod) -> Ordering {
    (!a.terminating)
        .cmp(&!b.terminating)
        .then_with(|| (a.phase == Phase::Succeeded).cmp(&(b.phase == Phase::Succeeded)))
        .then_with(|| (a.phase == Phase::Pending).cmp(&(b.phase == Phase::Pending)))
        .then_with(|| a.created_unix_ms.cmp(&b.created_unix_ms))
        .then_with(|| a.name.cmp(&b.name))
}

#[cfg(test)]
mod tests {
    use podstream_proto::v1::Phase;

    use super::{DriverPod, DriverReason, by_facts, choose_driver};

    fn pod(name: &str, phase: Phase, terminating: bool, created: i64) -> DriverPod {
        DriverPod {
            name: name.into(),
            phase,
            terminating,
            created_unix_ms: Some(created),
            checked: false,
        }
    }

    /// Pods-only cases read like the provider's own tests of find_spark_job.
    #[test]
    fn by_facts_follows_the_providers_order() {
        use Phase::*;
        let cases: &[(&str, Vec<DriverPod>, Option<&str>)] = &[
            (
                "a running pod beats a terminating one",
                vec![pod("old", Running, true, 2), pod("new", Running, false, 1)],
                Some("new"),
            ),
            (
                "a pending pod (a restarted driver) beats a running one",
                vec![
                    pod("run", Running, false, 5),
                    pod("pend", Pending, false, 1),
                ],
                Some("pend"),
            ),
            (
                "a succeeded pod beats a pending one",
                vec![
                    pod("pend", Pending, false, 9),
                    pod("done", Succeeded, false, 1),
                ],
                Some("done"),
            ),
            (
                "same phase: the newest",
                vec![pod("a", Running, false, 1), pod("b", Running, false, 2)],
                Some("b"),
            ),
            (
                "same time: the last name",
                vec![pod("xyz", Running, false, 1), pod("abc", Running, false, 1)],
                Some("xyz"),
            ),
            (
                "failed and unknown pods are never listed",
                vec![pod("f", Failed, false, 9), pod("u", Unknown, false, 9)],
                None,
            ),
            ("no pods", vec![], None),
        ];
        for (story, pods, expected) in cases {
            let chosen = by_facts(pods).map(|i| pods[i].name.as_str());
            assert_eq!(chosen, *expected, "{story}");
        }
    }

    #[test]
    fn a_checked_pod_is_left_out() {
        let mut checked = pod("checked", Phase::Succeeded, false, 9);
        checked.checked = true;
        let pods = [checked, pod("other", Phase::Running, false, 1)];
        assert_eq!(by_facts(&pods), Some(1));
    }

    #[test]
    fn the_application_names_the_driver_when_that_pod_exists() {
        use Phase::*;
        // The operator tracks the older running driver; a newer pending one would win on facts.
        let pods = [
            pod("new", Pending, false, 2),
            pod("tracked", Running, false, 1),
        ];
        let choice = choose_driver(Some("tracked"), &pods).unwrap();
        assert_eq!(
            (choice.chosen, choice.reason),
            (1, DriverReason::Application)
        );
        // A name no pod has: the provider's order.
        let choice = choose_driver(Some("gone"), &pods).unwrap();
        assert_eq!((choice.chosen, choice.reason), (0, DriverReason::Facts));
        let choice = choose_driver(None, &pods).unwrap();
        assert_eq!((choice.chosen, choice.reason), (0, DriverReason::Facts));
    }
}
