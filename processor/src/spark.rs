//! Choosing the driver pod of an Airflow-launched Spark job when several match its task
//! instance (seed 003, issue 25): the pod its `SparkApplication` names, else the provider's
//! own `SparkKubernetesOperator.find_spark_job` order.
//!
//! `find_spark_job` (cncf.kubernetes ≥ 10.25) lists the driver pods of the task instance's
//! labels without its try number, leaving out pods labelled `already_checked=True` and pods in
//! phase `Failed` or `Unknown`, and takes the maximum of (not terminating, `Succeeded`,
//! `Pending`, creation time, name); `max` keeps the first of equal keys.
//!
//! [`SparkJobs`] keeps what driver pod and SparkApplication events show and reports the choice
//! as a `duplicate` whenever a task instance has several drivers and the choice changes.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;

use podstream_proto::v1::command::Kind;
use podstream_proto::v1::{Command, Duplicate, DuplicateBasis, Phase, PodRef, TaskKey};

use crate::command::TaskCommand;

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

/// The driver chosen among a task instance's driver pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverChoice {
    /// Its index in the pods given.
    pub chosen: usize,
    /// Why it was chosen: [`DuplicateBasis::SparkApplication`] or
    /// [`DuplicateBasis::SparkPodFacts`].
    pub basis: DuplicateBasis,
}

/// The driver of a task instance among `drivers` (its driver pods, in one namespace, in the
/// order the API lists them): the pod `named` by its SparkApplication when it is among them,
/// else [`by_facts`]. `None` when neither picks a pod.
pub fn choose_driver(named: Option<&str>, drivers: &[DriverPod]) -> Option<DriverChoice> {
    if let Some(chosen) = named.and_then(|name| drivers.iter().position(|d| d.name == name)) {
        return Some(DriverChoice {
            chosen,
            basis: DuplicateBasis::SparkApplication,
        });
    }
    by_facts(drivers).map(|chosen| DriverChoice {
        chosen,
        basis: DuplicateBasis::SparkPodFacts,
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

/// What one driver pod's event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverEvent {
    /// The pod.
    pub pod: PodRef,
    /// Its task instance, from its labels as the operator sets them (with its try).
    pub task: TaskKey,
    /// What the choice reads.
    pub facts: DriverPod,
    /// The SparkApplication that owns it, if it says.
    pub application: Option<String>,
    /// resourceVersion of the event.
    pub resource_version: String,
    /// The pod is gone (`DELETED`).
    pub gone: bool,
}

/// What one SparkApplication's event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationEvent {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.creationTimestamp`, Unix milliseconds.
    pub created_unix_ms: Option<i64>,
    /// `status.driverInfo.podName`: the driver the Spark operator tracks.
    pub driver: Option<String>,
    /// resourceVersion of the event.
    pub resource_version: String,
    /// The application is gone (`DELETED`).
    pub gone: bool,
}

/// A task instance as `find_spark_job` lists its drivers: its labels without the try.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Job {
    namespace: String,
    dag_id: String,
    task_id: String,
    run_id: String,
    map_index: i64,
}

impl Job {
    fn of(pod: &PodRef, task: &TaskKey) -> Job {
        Job {
            namespace: pod.namespace.clone(),
            dag_id: task.dag_id.clone(),
            task_id: task.task_id.clone(),
            run_id: task.run_id.clone(),
            map_index: task.map_index,
        }
    }
}

#[derive(Debug, Clone)]
struct Driver {
    pod: PodRef,
    task: TaskKey,
    facts: DriverPod,
    application: Option<String>,
}

#[derive(Debug, Default)]
struct Drivers {
    /// In the order the API lists them (by name).
    pods: Vec<Driver>,
    /// The choice last reported: basis, chosen uid, the others' uids.
    reported: Option<(DuplicateBasis, String, Vec<String>)>,
}

#[derive(Debug, Clone)]
struct Application {
    created_unix_ms: Option<i64>,
    driver: Option<String>,
}

/// The driver pods and SparkApplications of Airflow-launched Spark jobs, as events show
/// them; reports a `duplicate` whenever a task instance has several drivers and the choice
/// among them changes. A job is forgotten with its last driver, an application when deleted.
#[derive(Debug, Default)]
pub struct SparkJobs {
    jobs: HashMap<Job, Drivers>,
    applications: HashMap<(String, String), Application>,
}

impl SparkJobs {
    /// Applies a driver pod's event; the `duplicate` it makes, if the choice changed.
    pub fn driver(&mut self, event: DriverEvent) -> Option<Command> {
        let job = Job::of(&event.pod, &event.task);
        let drivers = self.jobs.entry(job.clone()).or_default();
        drivers.pods.retain(|d| d.pod.uid != event.pod.uid);
        if event.gone {
            if drivers.pods.is_empty() {
                self.jobs.remove(&job);
                return None;
            }
        } else {
            let at = drivers
                .pods
                .partition_point(|d| d.pod.name < event.pod.name);
            drivers.pods.insert(
                at,
                Driver {
                    pod: event.pod,
                    task: event.task,
                    facts: event.facts,
                    application: event.application,
                },
            );
        }
        self.report(&job, &event.resource_version)
    }

    /// Applies a SparkApplication's event; the `duplicate`s it makes for the jobs whose
    /// drivers it owns.
    pub fn application(&mut self, event: ApplicationEvent) -> Vec<Command> {
        let key = (event.namespace.clone(), event.name.clone());
        if event.gone {
            self.applications.remove(&key);
        } else {
            self.applications.insert(
                key,
                Application {
                    created_unix_ms: event.created_unix_ms,
                    driver: event.driver,
                },
            );
        }
        let owned: Vec<Job> = self
            .jobs
            .iter()
            .filter(|(job, drivers)| {
                job.namespace == event.namespace
                    && drivers
                        .pods
                        .iter()
                        .any(|d| d.application.as_deref() == Some(event.name.as_str()))
            })
            .map(|(job, _)| job.clone())
            .collect();
        owned
            .iter()
            .filter_map(|job| self.report(job, &event.resource_version))
            .collect()
    }

    /// The job's `duplicate` when it has several drivers and the choice is new.
    fn report(&mut self, job: &Job, resource_version: &str) -> Option<Command> {
        let named = self.named_driver(job);
        let drivers = self.jobs.get_mut(job)?;
        if drivers.pods.len() < 2 {
            drivers.reported = None;
            return None;
        }
        let facts: Vec<DriverPod> = drivers.pods.iter().map(|d| d.facts.clone()).collect();
        let choice = choose_driver(named.as_deref(), &facts)?;
        let chosen = &drivers.pods[choice.chosen];
        let others: Vec<&Driver> = drivers
            .pods
            .iter()
            .filter(|d| d.pod.uid != chosen.pod.uid)
            .collect();
        let signature = (
            choice.basis,
            chosen.pod.uid.clone(),
            others.iter().map(|d| d.pod.uid.clone()).collect(),
        );
        if drivers.reported.as_ref() == Some(&signature) {
            return None;
        }
        // A driver has no `airflow-worker` label: no owner.
        let command = TaskCommand {
            task: &chosen.task,
            pod: Cow::Borrowed(&chosen.pod),
            owner: Cow::Borrowed(""),
            resource_version: Cow::Borrowed(resource_version),
            kind: Kind::Duplicate(Duplicate {
                chosen: Some(chosen.pod.clone()),
                others: others.iter().map(|d| d.pod.clone()).collect(),
                basis: choice.basis as i32,
            }),
        }
        .into_command();
        drivers.reported = Some(signature);
        Some(command)
    }

    /// The driver the job's newest application names, among those that name one of its
    /// drivers (a retried job may have left an older application behind).
    fn named_driver(&self, job: &Job) -> Option<String> {
        let drivers = self.jobs.get(job)?;
        drivers
            .pods
            .iter()
            .filter_map(|d| d.application.as_ref())
            .filter_map(|name| {
                let application = self
                    .applications
                    .get(&(job.namespace.clone(), name.clone()))?;
                let driver = application.driver.as_ref()?;
                drivers
                    .pods
                    .iter()
                    .any(|d| &d.pod.name == driver)
                    .then_some((application.created_unix_ms, name, driver))
            })
            .max()
            .map(|(_, _, driver)| driver.clone())
    }
}

#[cfg(test)]
mod tests {
    use podstream_proto::v1::Phase;

    use super::{DriverPod, DuplicateBasis, by_facts, choose_driver};

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
            (choice.chosen, choice.basis),
            (1, DuplicateBasis::SparkApplication)
        );
        // A name no pod has: the provider's order.
        let choice = choose_driver(Some("gone"), &pods).unwrap();
        assert_eq!(
            (choice.chosen, choice.basis),
            (0, DuplicateBasis::SparkPodFacts)
        );
        let choice = choose_driver(None, &pods).unwrap();
        assert_eq!(
            (choice.chosen, choice.basis),
            (0, DuplicateBasis::SparkPodFacts)
        );
    }

    mod jobs {
        use podstream_proto::v1::command::Kind;
        use podstream_proto::v1::{Command, DuplicateBasis, Phase, PodRef, TaskKey};

        use super::super::{ApplicationEvent, DriverEvent, DriverPod, SparkJobs};

        fn driver(name: &str, phase: Phase, created: i64, rv: &str) -> DriverEvent {
            DriverEvent {
                pod: PodRef {
                    namespace: "airflow".into(),
                    name: name.into(),
                    uid: format!("uid-{name}"),
                },
                task: TaskKey {
                    dag_id: "etl".into(),
                    task_id: "crunch".into(),
                    run_id: "r1".into(),
                    map_index: -1,
                    try_number: 1,
                    ..TaskKey::default()
                },
                facts: DriverPod {
                    name: name.into(),
                    phase,
                    terminating: false,
                    created_unix_ms: Some(created),
                    checked: false,
                },
                application: Some("crunch-app".into()),
                resource_version: rv.into(),
                gone: false,
            }
        }

        fn application(driver: Option<&str>, rv: &str) -> ApplicationEvent {
            ApplicationEvent {
                namespace: "airflow".into(),
                name: "crunch-app".into(),
                created_unix_ms: Some(1),
                driver: driver.map(str::to_owned),
                resource_version: rv.into(),
                gone: false,
            }
        }

        /// (chosen, others, basis) of a duplicate.
        fn said(command: &Command) -> (String, Vec<String>, DuplicateBasis) {
            let Some(Kind::Duplicate(duplicate)) = &command.kind else {
                panic!("not a duplicate: {command:?}");
            };
            (
                duplicate
                    .chosen
                    .as_ref()
                    .map(|p| p.name.clone())
                    .unwrap_or_default(),
                duplicate.others.iter().map(|p| p.name.clone()).collect(),
                duplicate.basis(),
            )
        }

        #[test]
        fn the_application_names_the_driver_and_a_vanished_name_falls_back_to_facts() {
            let mut jobs = SparkJobs::default();
            assert_eq!(jobs.driver(driver("old", Phase::Running, 1, "10")), None);
            assert!(jobs.application(application(Some("old"), "11")).is_empty());
            // A newer pending driver would win on facts; the application says otherwise.
            let named = jobs.driver(driver("new", Phase::Pending, 2, "12")).unwrap();
            assert_eq!(
                said(&named),
                (
                    "old".into(),
                    vec!["new".into()],
                    DuplicateBasis::SparkApplication
                )
            );
            assert_eq!(named.id, "uid-old:12:duplicate");
            // The same choice again is not reported twice.
            assert_eq!(jobs.driver(driver("new", Phase::Pending, 2, "13")), None);
            // The application points at a pod that no longer exists: the provider's order.
            let fallback = jobs.application(application(Some("gone"), "14"));
            assert_eq!(
                fallback.iter().map(said).collect::<Vec<_>>(),
                vec![(
                    "new".into(),
                    vec!["old".into()],
                    DuplicateBasis::SparkPodFacts
                )]
            );
        }

        #[test]
        fn one_driver_is_no_duplicate_and_a_job_is_forgotten_with_its_last_driver() {
            let mut jobs = SparkJobs::default();
            assert_eq!(jobs.driver(driver("a", Phase::Running, 1, "1")), None);
            assert!(jobs.driver(driver("b", Phase::Running, 2, "2")).is_some());
            let mut gone = driver("b", Phase::Running, 2, "3");
            gone.gone = true;
            assert_eq!(jobs.driver(gone), None);
            let mut last = driver("a", Phase::Running, 1, "4");
            last.gone = true;
            assert_eq!(jobs.driver(last), None);
            assert!(jobs.jobs.is_empty());
        }
    }
}
