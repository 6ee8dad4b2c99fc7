//! The guard as a table: docs/semantics.md "Applying outcomes to the metadata store".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_proto::v1::command::Kind;
use podstream_proto::v1::{
    Completed, ContainerTerminated, Duplicate, Fail, Lost, PodRef, Running, Transfer,
};
use podstream_proto::{Command, TaskKey};
use podstream_sink::guard::{
    Effect, FailState, Policy, RecordedPod, Skip, TaskFailures, TiRow, Verdict, verdict,
};

const UP_FOR_RETRY: Effect = Effect::Fail {
    state: FailState::UpForRetry,
};
const FAILED: Effect = Effect::Fail {
    state: FailState::Failed,
};
const ID: &str = "0196b3a0-1c2d-7e3f-8a4b-5c6d7e8f9a0b";
const OTHER_ID: &str = "0196b3a0-1c2d-7e3f-8a4b-000000000000";

fn command(try_number: i64, kind: Kind) -> Command {
    Command {
        id: "x".into(),
        task: Some(TaskKey {
            dag_id: "d".into(),
            task_id: "t".into(),
            run_id: "r".into(),
            map_index: -1,
            try_number,
            ..TaskKey::default()
        }),
        kind: Some(kind),
        ..Command::default()
    }
}

fn ti(state: Option<&str>, try_number: i64, max_tries: i64) -> Option<TiRow> {
    Some(TiRow::new(state, try_number, max_tries))
}

/// A running row whose hostname is `hostname`, and whose try podstream recorded pod `recorded`.
fn ti_on_host(hostname: &str, recorded: Option<&str>) -> Option<TiRow> {
    Some(TiRow {
        hostname: Some(hostname.to_owned()),
        recorded_pod: recorded.map(in_airflow),
        ..ti(Some("running"), 1, 1)?
    })
}

/// A queued row (no retries) whose try podstream bound to pod `recorded`.
fn queued_bound_to(recorded: Option<&str>) -> Option<TiRow> {
    Some(TiRow {
        recorded_pod: recorded.map(in_airflow),
        ..ti(Some("queued"), 1, 0)?
    })
}

/// Pod `name` of namespace `airflow`, as `podstream_ti_pod` records it.
fn in_airflow(name: &str) -> RecordedPod {
    RecordedPod {
        namespace: "airflow".into(),
        name: name.into(),
        alive: true,
    }
}

/// A queued row whose try was bound to pod `recorded`, which has ended.
fn queued_after_bound_pod_ended(recorded: &str) -> Option<TiRow> {
    Some(TiRow {
        recorded_pod: Some(RecordedPod {
            alive: false,
            ..in_airflow(recorded)
        }),
        ..ti(Some("queued"), 1, 0)?
    })
}

/// `command` reported for pod `name` of another namespace.
fn from_other_namespace(command: Command, name: &str) -> Command {
    let mut command = from_pod(command, name);
    if let Some(pod) = command.pod.as_mut() {
        pod.namespace = "team-b".into();
    }
    command
}

/// `command` reported for pod `name`.
fn from_pod(mut command: Command, name: &str) -> Command {
    command.pod = Some(PodRef {
        namespace: "airflow".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    });
    command
}

fn transfer(from: &str, to: &str) -> Kind {
    Kind::Transfer(Transfer {
        from: from.into(),
        to: to.into(),
    })
}

/// An Airflow 3 row, with its UUID.
fn ti_with_id(state: &str, id: &str) -> Option<TiRow> {
    Some(TiRow {
        id: Some(id.to_owned()),
        ..ti(Some(state), 1, 1)?
    })
}

/// A command whose pod names the TI's UUID.
fn with_id(mut command: Command, id: &str) -> Command {
    if let Some(task) = command.task.as_mut() {
        task.task_instance_id = id.to_owned();
    }
    command
}

/// A fail whose reason is `reason`, with one container that ended with `container_reason`.
fn fail_of(reason: &str, container_reason: Option<&str>) -> Kind {
    let terminated = container_reason.map(|r| ContainerTerminated {
        container: "base".into(),
        exit_code: 1,
        reason: r.to_owned(),
    });
    Kind::Fail(Fail::new(
        reason.to_owned(),
        String::new(),
        terminated.into_iter().collect(),
    ))
}

fn fail() -> Kind {
    Kind::Fail(Fail::default())
}

#[test]
fn the_guard_table() {
    use Verdict::{Apply, Invalid, Skip as S};
    let table: Vec<(&str, Command, Option<TiRow>, Verdict)> = vec![
        (
            "fail, retries left",
            command(1, fail()),
            ti(Some("running"), 1, 2),
            Apply(UP_FOR_RETRY),
        ),
        (
            "fail, last retry",
            command(2, fail()),
            ti(Some("running"), 2, 2),
            Apply(UP_FOR_RETRY),
        ),
        (
            "fail, retries used up",
            command(3, fail()),
            ti(Some("running"), 3, 2),
            Apply(FAILED),
        ),
        (
            "fail, no retries",
            command(1, fail()),
            ti(Some("running"), 1, 0),
            Apply(FAILED),
        ),
        (
            "fail of a queued TI: left to the executor's relaunch",
            command(1, fail_of("deleted_while_running", None)),
            ti(Some("queued"), 1, 0),
            Apply(Effect::LaunchFailed),
        ),
        (
            "fail of a queued TI, image pull",
            command(1, fail_of("fatal_pending:ErrImagePull", None)),
            ti(Some("queued"), 1, 1),
            Apply(Effect::LaunchFailed),
        ),
        (
            "fail of a queued TI from the pod bound to its try, container reason Error (excluded)",
            from_pod(command(1, fail_of("pod_failed", Some("Error"))), "real"),
            queued_bound_to(Some("real")),
            Apply(FAILED),
        ),
        (
            "fail of a queued TI, reason Error, from a pod not bound to it (a copy): left to the executor",
            from_pod(command(1, fail_of("pod_failed", Some("Error"))), "copy"),
            queued_bound_to(Some("real")),
            Apply(Effect::LaunchFailed),
        ),
        (
            "fail of a queued TI, reason Error, from a pod of the bound name in another namespace: left to the executor",
            from_other_namespace(command(1, fail_of("pod_failed", Some("Error"))), "real"),
            queued_bound_to(Some("real")),
            Apply(Effect::LaunchFailed),
        ),
        (
            "fail of a queued TI, reason Error, no pod bound yet: left to the executor",
            from_pod(command(1, fail_of("pod_failed", Some("Error"))), "copy"),
            queued_bound_to(None),
            Apply(Effect::LaunchFailed),
        ),
        (
            "fail of a queued TI, container reason OOMKilled",
            command(1, fail_of("pod_failed", Some("OOMKilled"))),
            ti(Some("queued"), 1, 1),
            Apply(Effect::LaunchFailed),
        ),
        (
            "fail of a running TI, container reason OOMKilled",
            command(1, fail_of("pod_failed", Some("OOMKilled"))),
            ti(Some("running"), 1, 1),
            Apply(UP_FOR_RETRY),
        ),
        (
            "fail naming the TI's UUID",
            with_id(command(1, fail()), ID),
            ti_with_id("running", ID),
            Apply(UP_FOR_RETRY),
        ),
        (
            "fail naming another UUID: another attempt's pod, or a forged one",
            with_id(command(1, fail()), OTHER_ID),
            ti_with_id("running", ID),
            S(Skip::ForeignPod),
        ),
        (
            "fail without a UUID on an Airflow 3 row: its executor keys by names, so they decide",
            command(1, fail()),
            ti_with_id("running", ID),
            Apply(UP_FOR_RETRY),
        ),
        (
            "fail naming a UUID on an Airflow 2 row: no pod of this TI names one",
            with_id(command(1, fail()), ID),
            ti(Some("running"), 1, 1),
            S(Skip::ForeignPod),
        ),
        (
            "transfer naming another UUID",
            with_id(command(1, transfer("1", "7")), OTHER_ID),
            ti_with_id("running", ID),
            S(Skip::ForeignPod),
        ),
        (
            "running on another UUID records nothing either",
            with_id(command(1, Kind::Running(Running {})), OTHER_ID),
            ti_with_id("running", ID),
            S(Skip::ForeignPod),
        ),
        (
            "fail of the pod the running task lives in",
            from_pod(command(1, fail()), "load-1"),
            ti_on_host("load-1", Some("load-1")),
            Apply(UP_FOR_RETRY),
        ),
        (
            "fail of another pod while the task runs in the recorded one",
            from_pod(command(1, fail()), "load-forged"),
            ti_on_host("load-1", Some("load-1")),
            S(Skip::ForeignPod),
        ),
        (
            "fail of a pod of the recorded name in another namespace while the task runs",
            from_other_namespace(command(1, fail()), "load-1"),
            ti_on_host("load-1", Some("load-1")),
            S(Skip::ForeignPod),
        ),
        (
            "transfer of another pod while the queued try's bound pod lives",
            from_pod(command(1, transfer("1", "7")), "copy"),
            queued_bound_to(Some("real")),
            S(Skip::ForeignPod),
        ),
        (
            "transfer of the queued try's bound pod",
            from_pod(command(1, transfer("1", "7")), "real"),
            queued_bound_to(Some("real")),
            Apply(Effect::Transfer { job_id: 7 }),
        ),
        (
            "transfer of another pod once the bound pod ended (a relaunch)",
            from_pod(command(1, transfer("1", "7")), "relaunch"),
            queued_after_bound_pod_ended("real"),
            Apply(Effect::Transfer { job_id: 7 }),
        ),
        (
            "transfer of another pod while the task runs in the recorded one",
            from_pod(command(1, transfer("1", "7")), "load-forged"),
            ti_on_host("load-1", Some("load-1")),
            S(Skip::ForeignPod),
        ),
        (
            "a hostname that names no pod podstream recorded binds nothing",
            from_pod(command(1, fail()), "load-2"),
            ti_on_host("worker-7.example", Some("load-1")),
            Apply(UP_FOR_RETRY),
        ),
        (
            "a hostname with nothing recorded binds nothing",
            from_pod(command(1, fail()), "load-2"),
            ti_on_host("load-1", None),
            Apply(UP_FOR_RETRY),
        ),
        (
            "fail, restarting",
            command(1, fail()),
            ti(Some("restarting"), 1, 1),
            Apply(UP_FOR_RETRY),
        ),
        (
            "terminal success",
            command(1, fail()),
            ti(Some("success"), 1, 2),
            S(Skip::Terminal("success".into())),
        ),
        (
            "terminal failed",
            command(1, fail()),
            ti(Some("failed"), 1, 2),
            S(Skip::Terminal("failed".into())),
        ),
        (
            "newer try",
            command(1, fail()),
            ti(Some("running"), 2, 2),
            S(Skip::NewerTry),
        ),
        (
            "older try",
            command(2, fail()),
            ti(Some("running"), 1, 2),
            S(Skip::OlderTry),
        ),
        ("unknown TI", command(1, fail()), None, S(Skip::UnknownTi)),
        (
            "scheduled",
            command(1, fail()),
            ti(Some("scheduled"), 1, 2),
            S(Skip::NotAdoptable("scheduled".into())),
        ),
        (
            "up_for_retry",
            command(1, fail()),
            ti(Some("up_for_retry"), 1, 2),
            S(Skip::NotAdoptable("up_for_retry".into())),
        ),
        (
            "state NULL",
            command(1, fail()),
            ti(None, 1, 2),
            S(Skip::NotAdoptable("none".into())),
        ),
        (
            "transfer",
            command(1, transfer("1", "7")),
            ti(Some("queued"), 1, 0),
            Apply(Effect::Transfer { job_id: 7 }),
        ),
        (
            "transfer from an owner the TI does not hold: a later link of a chain another sink \
             has not applied yet (the stream-order rule keeps the newest)",
            command(1, transfer("5", "7")),
            ti(Some("running"), 1, 0),
            Apply(Effect::Transfer { job_id: 7 }),
        ),
        (
            "transfer to a non-id",
            command(
                1,
                Kind::Transfer(Transfer {
                    from: "1".into(),
                    to: "x".into(),
                }),
            ),
            ti(Some("queued"), 1, 0),
            Invalid("transfer to owner \"x\": queued_by_job_id needs an integer job id".into()),
        ),
        (
            "completed",
            command(1, Kind::Completed(Completed {})),
            ti(Some("running"), 1, 0),
            Apply(Effect::Record),
        ),
        (
            "running",
            command(1, Kind::Running(Running {})),
            ti(Some("running"), 1, 0),
            Apply(Effect::Record),
        ),
        (
            "lost",
            command(
                1,
                Kind::Lost(Lost {
                    reason: "deleted_while_pending".into(),
                }),
            ),
            ti(Some("queued"), 1, 0),
            Apply(Effect::Record),
        ),
        (
            "duplicate",
            command(1, Kind::Duplicate(Duplicate::default())),
            ti(Some("running"), 1, 0),
            Apply(Effect::Record),
        ),
        (
            "completed on a finished TI",
            command(1, Kind::Completed(Completed {})),
            ti(Some("success"), 1, 0),
            S(Skip::Terminal("success".into())),
        ),
    ];
    for (name, command, row, expected) in table {
        assert_eq!(
            verdict(&command, None, row.as_ref(), &Policy::default()),
            expected,
            "{name}"
        );
    }
    let keyless = Command {
        task: None,
        ..command(1, fail())
    };
    assert!(matches!(
        verdict(&keyless, None, None, &Policy::default()),
        Invalid(_)
    ));
}

/// Where the schedulers' executors fail task instances, the sink leaves every fail to them
/// (recorded) and still applies transfers; the TI guards hold as ever.
#[test]
fn with_executors_failing_tasks_the_sink_leaves_fails_to_them() {
    let executor = Policy::default().with_task_failures(TaskFailures::Executor);
    let table = [
        (
            "running",
            command(1, fail()),
            ti(Some("running"), 1, 2),
            Verdict::Apply(Effect::LeftToExecutor),
        ),
        (
            "queued",
            command(1, fail()),
            ti(Some("queued"), 1, 0),
            Verdict::Apply(Effect::LeftToExecutor),
        ),
        (
            "terminal",
            command(1, fail()),
            ti(Some("success"), 1, 0),
            Verdict::Skip(Skip::Terminal("success".into())),
        ),
        (
            "newer try",
            command(1, fail()),
            ti(Some("running"), 2, 2),
            Verdict::Skip(Skip::NewerTry),
        ),
        (
            "transfer",
            command(
                1,
                Kind::Transfer(Transfer {
                    from: "1".into(),
                    to: "7".into(),
                }),
            ),
            ti(Some("running"), 1, 0),
            Verdict::Apply(Effect::Transfer { job_id: 7 }),
        ),
    ];
    for (name, command, row, expected) in table {
        assert_eq!(
            verdict(&command, None, row.as_ref(), &executor),
            expected,
            "{name}"
        );
    }
}

/// Where the executor names each TI's UUID on its pods (`--require-task-instance-id`), an
/// Airflow 3 TI belongs only to pods that name its UUID: a copy of the names alone is foreign.
#[test]
fn requiring_the_uuid_makes_a_pod_without_one_foreign() {
    let strict = Policy::default().requiring_task_instance_id(true);
    let table = [
        (
            "no UUID on an Airflow 3 row",
            command(1, fail()),
            ti_with_id("running", ID),
            Verdict::Skip(Skip::ForeignPod),
        ),
        (
            "the TI's UUID",
            with_id(command(1, fail()), ID),
            ti_with_id("running", ID),
            Verdict::Apply(UP_FOR_RETRY),
        ),
        (
            "an Airflow 2 row, which has no UUID to require",
            command(1, fail()),
            ti(Some("running"), 1, 1),
            Verdict::Apply(UP_FOR_RETRY),
        ),
    ];
    for (name, command, row, expected) in table {
        assert_eq!(
            verdict(&command, None, row.as_ref(), &strict),
            expected,
            "{name}"
        );
    }
}

/// The excluded reasons are read as Airflow reads its option: comma-separated, each trimmed.
#[test]
fn excluded_launch_failure_reasons_are_configurable() {
    let pull = from_pod(
        command(1, fail_of("fatal_pending:ErrImagePull", None)),
        "real",
    );
    let queued = queued_bound_to(Some("real"));
    let strict = Policy::with_launch_failure_excluded_reasons("Error, ErrImagePull ,");
    assert_eq!(
        verdict(&pull, None, queued.as_ref(), &strict),
        Verdict::Apply(FAILED)
    );
    let none = Policy::with_launch_failure_excluded_reasons("");
    let error = from_pod(command(1, fail_of("pod_failed", Some("Error"))), "real");
    assert_eq!(
        verdict(&error, None, queued.as_ref(), &none),
        Verdict::Apply(Effect::LaunchFailed)
    );
}

/// Transfers apply in stream order whatever order they arrive in: one older than the last
/// transfer applied to the TI is skipped (a late redelivery, another sink); commands without
/// a sequence (`podstream apply`) and every other kind are not ordered by it.
#[test]
fn a_transfer_older_than_the_last_one_applied_is_skipped() {
    use Verdict::{Apply, Skip as S};
    let transfer = || {
        command(
            1,
            Kind::Transfer(Transfer {
                from: "2".into(),
                to: "3".into(),
            }),
        )
    };
    let after = |last: Option<u64>| {
        Some(TiRow {
            last_transfer: last,
            ..ti(Some("running"), 1, 1)?
        })
    };
    let table = [
        (
            "first transfer",
            transfer(),
            Some(10),
            after(None),
            Apply(Effect::Transfer { job_id: 3 }),
        ),
        (
            "after an older one",
            transfer(),
            Some(10),
            after(Some(9)),
            Apply(Effect::Transfer { job_id: 3 }),
        ),
        (
            "after a newer one",
            transfer(),
            Some(10),
            after(Some(11)),
            S(Skip::OlderTransfer),
        ),
        (
            "without a sequence",
            transfer(),
            None,
            after(Some(11)),
            Apply(Effect::Transfer { job_id: 3 }),
        ),
        (
            "a fail after a newer transfer",
            command(1, fail()),
            Some(10),
            after(Some(11)),
            Apply(UP_FOR_RETRY),
        ),
    ];
    for (name, command, sequence, row, expected) in table {
        assert_eq!(
            verdict(&command, sequence, row.as_ref(), &Policy::default()),
            expected,
            "{name}"
        );
    }
}
