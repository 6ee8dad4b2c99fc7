//! Choosing the driver pod of an Airflow-launched Spark job when several match its task
//! instance (seed 003, issue 25): the pod its `SparkApplication` names, else the provider's
//! own `SparkKubernetesOperator.find_spark_job` order.
//!
//! `find_spark_job` (cncf.kubernetes ≥ 10.25) lists the driver pods of the task instance's
//! labels without its try number, leaving out pods labelled `already_checked=True` and pods in
//! phase `Failed` or `Unknown`, and takes the maximum of (not terminating, `Succeeded`,
//! `Pending`, creation time, name); `max` keeps the first of equal keys.
//!
//! A [`JobRecord`] keeps what a job's driver pod events show and reports the choice as a
//! `duplicate` whenever the job has several drivers and the choice changes; an
//! [`ApplicationRecord`] keeps what its SparkApplication says. [`SparkJobs`] holds them in
//! memory for `decide`; the processor's Spark consumer (`podstream_processor::spark`) keeps them
//! in KV.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;

use podstream_proto::subject::encode_key_token;
use podstream_proto::v1::command::Kind;
use podstream_proto::v1::spark_event::Object;
use podstream_proto::v1::{
    Command, Duplicate, DuplicateBasis, EventType, Phase, PodRef, SparkApplication, SparkDriver,
    SparkEvent, TaskKey,
};
use serde::{Deserialize, Serialize};

use crate::command::TaskCommand;
use crate::order::is_newer;

/// The facts of one driver pod that the choice reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// A Spark job: what `find_spark_job` lists for a task instance, whatever its try: the
/// driver pods of one namespace with the same `dag_id`, `task_id`, `run_id` and `map_index`
/// labels (Airflow's safe label values).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobKey {
    /// The pods' namespace.
    pub namespace: String,
    /// The `dag_id` label.
    pub dag_id: String,
    /// The `task_id` label.
    pub task_id: String,
    /// The `run_id` label.
    pub run_id: String,
    /// The `map_index` label; -1 when the pods have none.
    pub map_index: i64,
}

impl JobKey {
    /// The job a driver pod belongs to.
    pub fn of(driver: &SparkDriver) -> JobKey {
        let task = driver.task.clone().unwrap_or_default();
        JobKey {
            namespace: driver
                .pod
                .as_ref()
                .map(|p| p.namespace.clone())
                .unwrap_or_default(),
            dag_id: task.dag_id,
            task_id: task.task_id,
            run_id: task.run_id,
            map_index: task.map_index,
        }
    }

    /// Its key in the processor's Spark bucket, where `PodstreamSparkKubernetesOperator`
    /// reads the choice: `job.<namespace>.<dag_id>.<task_id>.<run_id>.<map_index>`, each
    /// value one key token (`podstream_proto::subject::encode_key_token`).
    pub fn kv_key(&self) -> String {
        format!(
            "job.{}.{}.{}.{}.{}",
            encode_key_token(&self.namespace),
            encode_key_token(&self.dag_id),
            encode_key_token(&self.task_id),
            encode_key_token(&self.run_id),
            self.map_index
        )
    }
}

/// The key of a SparkApplication's record in the processor's Spark bucket:
/// `application.<namespace>.<name>`.
pub fn application_kv_key(namespace: &str, name: &str) -> String {
    format!(
        "application.{}.{}",
        encode_key_token(namespace),
        encode_key_token(name)
    )
}

/// One of a job's driver pods, as its last event showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverRecord {
    /// The pod.
    pub pod: PodRef,
    /// Its task labels, with its try.
    pub task: TaskKey,
    /// What the choice reads.
    pub facts: DriverPod,
    /// The SparkApplication that owns it; empty when none.
    pub application: String,
    /// resourceVersion of the event that showed it so.
    pub resource_version: String,
}

/// The driver that drives a job now, and why: what operators read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chosen {
    /// The pod.
    pub pod: PodRef,
    /// `spark_application` or `spark_pod_facts` (as `decide`'s duplicate lines say).
    pub basis: String,
    /// The job's other driver pods.
    pub others: Vec<PodRef>,
}

/// What podstream keeps of a Spark job: in memory for `decide`, a KV record in the pipeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Its driver pods, by name (the order the API lists them in).
    pub drivers: Vec<DriverRecord>,
    /// The driver that drives the job now; `None` when no pod qualifies.
    pub chosen: Option<Chosen>,
    /// The duplicate last reported, so one choice is reported once.
    #[serde(default)]
    reported: Option<(i32, String, Vec<String>)>,
    /// The commands of the last decision, published again when the same event comes back
    /// (a redelivery after a crash between the record's write and the publish).
    #[serde(default)]
    pub outbox: Vec<Command>,
}

impl JobRecord {
    /// Takes a driver pod's event: its facts replace the last ones, or it leaves the job
    /// (`DELETED`). `false` when the event is not newer than what the record holds of that
    /// pod (a redelivery, a replay): it changes nothing.
    pub fn take_driver(&mut self, event: &SparkEvent, driver: &SparkDriver) -> bool {
        let pod = driver.pod.clone().unwrap_or_default();
        let known = self.drivers.iter().position(|d| d.pod.uid == pod.uid);
        if let Some(at) = known
            && !is_newer(&event.resource_version, &self.drivers[at].resource_version)
        {
            return false;
        }
        if let Some(at) = known {
            self.drivers.remove(at);
        }
        if event.r#type() == EventType::Deleted {
            return known.is_some();
        }
        let at = self.drivers.partition_point(|d| d.pod.name < pod.name);
        self.drivers.insert(
            at,
            DriverRecord {
                facts: DriverPod {
                    name: pod.name.clone(),
                    phase: driver.phase(),
                    terminating: driver.terminating,
                    created_unix_ms: driver.creation_unix_ms,
                    checked: driver.checked,
                },
                task: driver.task.clone().unwrap_or_default(),
                application: driver.application.clone(),
                resource_version: event.resource_version.clone(),
                pod,
            },
        );
        true
    }

    /// The SparkApplications its drivers name, each once.
    pub fn applications(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .drivers
            .iter()
            .map(|d| d.application.as_str())
            .filter(|name| !name.is_empty())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Decides the choice anew at an event of `resource_version`, given what is known of the
    /// applications its drivers name: `chosen` follows, and `outbox` holds the duplicate to
    /// report when there are several drivers and the choice changed (nothing otherwise).
    pub fn decide<'a>(
        &mut self,
        applications: impl Fn(&str) -> Option<&'a ApplicationRecord>,
        resource_version: &str,
    ) {
        self.outbox.clear();
        let facts: Vec<DriverPod> = self.drivers.iter().map(|d| d.facts.clone()).collect();
        let named = self.named_driver(applications);
        let Some(choice) = choose_driver(named.as_deref(), &facts) else {
            self.chosen = None;
            self.reported = None;
            return;
        };
        let chosen = &self.drivers[choice.chosen];
        let others: Vec<PodRef> = self
            .drivers
            .iter()
            .filter(|d| d.pod.uid != chosen.pod.uid)
            .map(|d| d.pod.clone())
            .collect();
        self.chosen = Some(Chosen {
            pod: chosen.pod.clone(),
            basis: basis_name(choice.basis).to_owned(),
            others: others.clone(),
        });
        if others.is_empty() {
            self.reported = None;
            return;
        }
        let signature = (
            choice.basis as i32,
            chosen.pod.uid.clone(),
            others.iter().map(|p| p.uid.clone()).collect(),
        );
        if self.reported.as_ref() == Some(&signature) {
            return;
        }
        let command = TaskCommand {
            task: Cow::Borrowed(&chosen.task),
            pod: Cow::Borrowed(&chosen.pod),
            owner: Cow::Borrowed(""),
            resource_version: Cow::Borrowed(resource_version),
            kind: Kind::Duplicate(Duplicate {
                chosen: Some(chosen.pod.clone()),
                others,
                basis: choice.basis as i32,
                // A Spark job's drivers are the few its application made.
                others_left_out: 0,
            }),
        }
        .into_command();
        self.reported = Some(signature);
        self.outbox.push(command);
    }

    /// The driver the newest of its applications names, when that pod is one of its drivers.
    fn named_driver<'a>(
        &self,
        applications: impl Fn(&str) -> Option<&'a ApplicationRecord>,
    ) -> Option<String> {
        self.applications()
            .into_iter()
            .filter_map(|name| {
                let application = applications(name)?;
                let driver = application.driver.as_str();
                self.drivers
                    .iter()
                    .any(|d| d.pod.name == driver)
                    .then_some((application.created_unix_ms, name, driver))
            })
            .max()
            .map(|(_, _, driver)| driver.to_owned())
    }
}

/// The name a duplicate line gives a basis.
fn basis_name(basis: DuplicateBasis) -> &'static str {
    match basis {
        DuplicateBasis::SparkApplication => "spark_application",
        DuplicateBasis::SparkPodFacts => "spark_pod_facts",
        DuplicateBasis::PodOrder => "pod_order",
    }
}

/// What podstream keeps of a SparkApplication: what it says, and the jobs whose drivers name
/// it (so its next event finds them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplicationRecord {
    /// `metadata.creationTimestamp`, Unix milliseconds.
    pub created_unix_ms: Option<i64>,
    /// `status.driverInfo.podName`; empty when unset.
    pub driver: String,
    /// resourceVersion of its last event; empty while only its drivers named it.
    pub resource_version: String,
    /// The jobs whose drivers name it.
    pub jobs: Vec<JobKey>,
}

impl ApplicationRecord {
    /// Takes the application's event (not `DELETED`, which removes the record); `false` when
    /// it is not newer than the last one taken.
    pub fn take(&mut self, event: &SparkEvent, application: &SparkApplication) -> bool {
        if !self.resource_version.is_empty()
            && !is_newer(&event.resource_version, &self.resource_version)
        {
            return false;
        }
        self.created_unix_ms = application.creation_unix_ms;
        self.driver = application.driver.clone();
        self.resource_version = event.resource_version.clone();
        true
    }

    /// Notes that `job`'s drivers name it; `false` when it knew.
    pub fn named_by(&mut self, job: &JobKey) -> bool {
        match self.jobs.binary_search(job) {
            Ok(_) => false,
            Err(at) => {
                self.jobs.insert(at, job.clone());
                true
            }
        }
    }

    /// Forgets `job`; whether the record is now of no use (never seen itself, named by none).
    pub fn forget(&mut self, job: &JobKey) -> bool {
        self.jobs.retain(|j| j != job);
        self.jobs.is_empty() && self.resource_version.is_empty()
    }
}

/// The namespace and name of a SparkApplication event's object.
pub fn application_name(application: &SparkApplication) -> (String, String) {
    application
        .application
        .as_ref()
        .map(|a| (a.namespace.clone(), a.name.clone()))
        .unwrap_or_default()
}

/// Every Spark job and application in memory, decided event by event: `decide`'s state, and
/// the reference for the processor's KV-backed one (the same record methods, in the same
/// order). A job is forgotten with its last driver, an application when it is deleted.
#[derive(Debug, Default)]
pub struct SparkJobs {
    jobs: HashMap<JobKey, JobRecord>,
    applications: HashMap<(String, String), ApplicationRecord>,
}

impl SparkJobs {
    /// Takes one Spark event; the duplicates it makes to report.
    pub fn take(&mut self, event: &SparkEvent) -> Vec<Command> {
        match &event.object {
            Some(Object::Driver(driver)) => self.driver(event, driver),
            Some(Object::Application(application)) => self.application(event, application),
            None => Vec::new(),
        }
    }

    /// What the job of a driver pod has chosen, for tests and readers.
    pub fn chosen(&self, job: &JobKey) -> Option<&Chosen> {
        self.jobs.get(job)?.chosen.as_ref()
    }

    fn driver(&mut self, event: &SparkEvent, driver: &SparkDriver) -> Vec<Command> {
        let key = JobKey::of(driver);
        let job = self.jobs.entry(key.clone()).or_default();
        let before = job
            .applications()
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>();
        if !job.take_driver(event, driver) {
            if job.drivers.is_empty() {
                self.jobs.remove(&key);
            }
            return Vec::new();
        }
        let now: Vec<String> = job.applications().iter().map(|a| a.to_string()).collect();
        for name in &now {
            self.applications
                .entry((key.namespace.clone(), name.clone()))
                .or_default()
                .named_by(&key);
        }
        for name in before.iter().filter(|name| !now.contains(name)) {
            self.forget_job_of(&key, name);
        }
        let Some(job) = self.jobs.get_mut(&key) else {
            return Vec::new();
        };
        let applications = &self.applications;
        job.decide(
            |name| applications.get(&(key.namespace.clone(), name.to_owned())),
            &event.resource_version,
        );
        let commands = std::mem::take(&mut job.outbox);
        if job.drivers.is_empty() {
            self.jobs.remove(&key);
        }
        commands
    }

    fn forget_job_of(&mut self, job: &JobKey, application: &str) {
        let key = (job.namespace.clone(), application.to_owned());
        if self
            .applications
            .get_mut(&key)
            .is_some_and(|record| record.forget(job))
        {
            self.applications.remove(&key);
        }
    }

    fn application(&mut self, event: &SparkEvent, application: &SparkApplication) -> Vec<Command> {
        let key = application_name(application);
        let jobs = if event.r#type() == EventType::Deleted {
            match self.applications.remove(&key) {
                Some(record) => record.jobs,
                None => return Vec::new(),
            }
        } else {
            let record = self.applications.entry(key.clone()).or_default();
            if !record.take(event, application) {
                return Vec::new();
            }
            record.jobs.clone()
        };
        let mut commands = Vec::new();
        for job_key in jobs {
            let Some(job) = self.jobs.get_mut(&job_key) else {
                continue;
            };
            let applications = &self.applications;
            job.decide(
                |name| applications.get(&(job_key.namespace.clone(), name.to_owned())),
                &event.resource_version,
            );
            commands.append(&mut job.outbox);
        }
        commands
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
        use podstream_proto::v1::spark_event::Object;
        use podstream_proto::v1::{
            Command, DuplicateBasis, EventType, Phase, PodRef, SparkApplication, SparkDriver,
            SparkEvent, TaskKey,
        };

        use super::super::{JobKey, SparkJobs};

        fn event(kind: EventType, rv: &str, object: Object) -> SparkEvent {
            SparkEvent {
                r#type: kind as i32,
                resource_version: rv.into(),
                synthesized: false,
                object: Some(object),
            }
        }

        fn driver_of(name: &str, phase: Phase, created: i64) -> SparkDriver {
            SparkDriver {
                pod: Some(PodRef {
                    namespace: "airflow".into(),
                    name: name.into(),
                    uid: format!("uid-{name}"),
                }),
                task: Some(TaskKey {
                    dag_id: "etl".into(),
                    task_id: "crunch".into(),
                    run_id: "r1".into(),
                    map_index: -1,
                    try_number: 1,
                    ..TaskKey::default()
                }),
                phase: phase as i32,
                terminating: false,
                creation_unix_ms: Some(created),
                checked: false,
                application: "crunch-app".into(),
            }
        }

        fn driver(name: &str, phase: Phase, created: i64, rv: &str) -> SparkEvent {
            event(
                EventType::Modified,
                rv,
                Object::Driver(driver_of(name, phase, created)),
            )
        }

        fn gone(name: &str, rv: &str) -> SparkEvent {
            event(
                EventType::Deleted,
                rv,
                Object::Driver(driver_of(name, Phase::Running, 1)),
            )
        }

        fn application(driver: Option<&str>, rv: &str) -> SparkEvent {
            event(
                EventType::Modified,
                rv,
                Object::Application(SparkApplication {
                    application: Some(PodRef {
                        namespace: "airflow".into(),
                        name: "crunch-app".into(),
                        uid: "app-uid".into(),
                    }),
                    creation_unix_ms: Some(1),
                    driver: driver.unwrap_or_default().into(),
                }),
            )
        }

        fn job() -> JobKey {
            JobKey::of(&driver_of("any", Phase::Running, 1))
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
            assert!(
                jobs.take(&driver("old", Phase::Running, 1, "10"))
                    .is_empty()
            );
            assert!(jobs.take(&application(Some("old"), "11")).is_empty());
            // A newer pending driver would win on facts; the application says otherwise.
            let named = jobs.take(&driver("new", Phase::Pending, 2, "12"));
            assert_eq!(
                named.iter().map(said).collect::<Vec<_>>(),
                vec![(
                    "old".into(),
                    vec!["new".into()],
                    DuplicateBasis::SparkApplication
                )]
            );
            assert_eq!(named[0].id, "uid-old:12:duplicate");
            let chosen = jobs.chosen(&job()).unwrap();
            assert_eq!(
                (chosen.pod.name.as_str(), chosen.basis.as_str()),
                ("old", "spark_application")
            );
            // The same choice again is not reported twice; a redelivery changes nothing.
            assert!(
                jobs.take(&driver("new", Phase::Pending, 2, "13"))
                    .is_empty()
            );
            assert!(
                jobs.take(&driver("new", Phase::Pending, 2, "12"))
                    .is_empty()
            );
            // The application points at a pod that no longer exists: the provider's order.
            let fallback = jobs.take(&application(Some("gone"), "14"));
            assert_eq!(
                fallback.iter().map(said).collect::<Vec<_>>(),
                vec![(
                    "new".into(),
                    vec!["old".into()],
                    DuplicateBasis::SparkPodFacts
                )]
            );
            // An older application event, redelivered, changes nothing.
            assert!(jobs.take(&application(Some("old"), "11")).is_empty());
            assert_eq!(jobs.chosen(&job()).unwrap().pod.name, "new");
        }

        #[test]
        fn one_driver_is_no_duplicate_and_a_job_is_forgotten_with_its_last_driver() {
            let mut jobs = SparkJobs::default();
            assert!(jobs.take(&driver("a", Phase::Running, 1, "1")).is_empty());
            assert_eq!(jobs.chosen(&job()).unwrap().pod.name, "a");
            assert_eq!(jobs.take(&driver("b", Phase::Running, 2, "2")).len(), 1);
            assert!(jobs.take(&gone("b", "3")).is_empty());
            assert!(jobs.take(&gone("a", "4")).is_empty());
            assert!(jobs.jobs.is_empty());
            assert!(jobs.applications.is_empty(), "{:?}", jobs.applications);
            // A delete of a pod never seen leaves nothing behind.
            assert!(jobs.take(&gone("c", "5")).is_empty());
            assert!(jobs.jobs.is_empty());
        }

        #[test]
        fn a_deleted_application_leaves_the_choice_to_the_facts() {
            let mut jobs = SparkJobs::default();
            jobs.take(&application(Some("old"), "1"));
            jobs.take(&driver("old", Phase::Running, 1, "2"));
            jobs.take(&driver("new", Phase::Pending, 2, "3"));
            assert_eq!(jobs.chosen(&job()).unwrap().pod.name, "old");
            let mut deleted = application(Some("old"), "4");
            deleted.r#type = EventType::Deleted as i32;
            let commands = jobs.take(&deleted);
            assert_eq!(
                commands.iter().map(said).collect::<Vec<_>>(),
                vec![(
                    "new".into(),
                    vec!["old".into()],
                    DuplicateBasis::SparkPodFacts
                )]
            );
        }

        #[test]
        fn keys_are_subject_tokens() {
            let mut key = job();
            key.run_id = "manual__2026-11-30T10:00:00+00:00".into();
            assert_eq!(
                key.kv_key(),
                "job.airflow.etl.crunch.manual__2026-11-30T10=3A00=3A00=2B00=3A00.-1"
            );
            assert_eq!(
                super::super::application_kv_key("airflow", "crunch.app"),
                "application.airflow.crunch=2Eapp"
            );
        }
    }
}
