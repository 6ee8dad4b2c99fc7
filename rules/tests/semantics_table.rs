//! docs/semantics.md "Phase and deletion → task outcome", one case per row and
//! per edge the issue names. Each case is one event on a fresh pod.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use podstream_proto::v1::EventType::{Added, Deleted, Modified};
use podstream_proto::v1::Phase::{Failed, Pending, Running, Succeeded, Unknown, Unspecified};
use podstream_rules::{Ignored, Outcome, Rules};
use support::{EventExt, ev};

/// The outcome as a short word, so the table reads like docs/semantics.md.
fn word(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Fail(f) => format!("fail:{}", f.reason),
        Outcome::Completed => "completed".into(),
        Outcome::Running => "running".into(),
        Outcome::Lost { reason } => format!("lost:{reason}"),
        Outcome::Pending => "pending".into(),
        Outcome::Ignored(Ignored::Revoked) => "nothing:revoked".into(),
        Outcome::Ignored(Ignored::ExecutorDone) => "nothing:done".into(),
        Outcome::Ignored(Ignored::LeftSelector) => "nothing:left_selector".into(),
        Outcome::Ignored(Ignored::UnknownPhase) => "nothing:unknown_phase".into(),
        Outcome::Ignored(Ignored::Unsigned(_)) => "nothing:unsigned".into(),
    }
}

/// Row 0, with `--require-signed-pods`: only a pod the executor signed says anything.
#[test]
fn unsigned_pods_say_nothing_when_signatures_are_required() {
    #[rustfmt::skip]
    let table = [
        ("0 signed failed",                ev(Modified, Failed, "p", 1).signed(),                        "fail:pod_failed"),
        ("0 signed succeeded",             ev(Modified, Succeeded, "p", 1).signed(),                     "completed"),
        ("0 unsigned failed",              ev(Modified, Failed, "p", 1),                                 "nothing:unsigned"),
        ("0 unsigned succeeded",           ev(Modified, Succeeded, "p", 1),                              "nothing:unsigned"),
        ("0 unsigned running deleted",     ev(Deleted, Running, "p", 1).deleting(),                      "nothing:unsigned"),
        ("0 copy of another pod's signature", ev(Modified, Failed, "copy", 1).signature_of("p"),        "nothing:unsigned"),
        ("0 signed for another try",       ev(Modified, Failed, "p", 1).signed().with(|e| e.task = Some(support::ti(2))), "nothing:unsigned"),
        ("0 garbage signature",            ev(Modified, Failed, "p", 1).with(|e| e.signature = "v1:zz".into()), "nothing:unsigned"),
        ("0 unsigned revoked",             ev(Modified, Running, "p", 1).revoked(),                      "nothing:unsigned"),
    ];
    let (signed, open) = (support::signed_rules(), Rules::default());
    for (case, event, expected) in &table {
        assert_eq!(word(&signed.outcome(event)), *expected, "{case}");
    }
    // Without the flag a signature is not read: every row decides as the table above it.
    assert_eq!(word(&open.outcome(&table[2].1)), "fail:pod_failed");
    assert_eq!(word(&open.outcome(&table[5].1)), "fail:pod_failed");
}

#[test]
fn phase_and_deletion_table() {
    let rules = Rules::default();
    #[rustfmt::skip]
    let table = [
        // row 1: revoked, whatever else holds
        ("1 revoked running",              ev(Modified, Running, "p", 1).revoked(),                      "nothing:revoked"),
        ("1 revoked failed",               ev(Modified, Failed, "p", 1).revoked(),                       "nothing:revoked"),
        ("1 revoked deleted while running",ev(Deleted, Running, "p", 1).deleting().revoked(),            "nothing:revoked"),
        ("1 done label failed",            ev(Modified, Failed, "p", 1).done(),                          "nothing:done"),
        // row 2: DELETED without deletionTimestamp never fails, in every phase
        ("2 left selector pending",        ev(Deleted, Pending, "p", 1),                                 "nothing:left_selector"),
        ("2 left selector running",        ev(Deleted, Running, "p", 1),                                 "nothing:left_selector"),
        ("2 left selector succeeded",      ev(Deleted, Succeeded, "p", 1),                               "nothing:left_selector"),
        ("2 left selector failed",         ev(Deleted, Failed, "p", 1),                                  "nothing:left_selector"),
        ("2 left selector unknown",        ev(Deleted, Unknown, "p", 1),                                 "nothing:left_selector"),
        ("2 left selector provider failed",ev(Deleted, Running, "p", 1).reason("ProviderFailed"),        "nothing:left_selector"),
        // row 3: ProviderFailed in every phase
        ("3 provider failed pending",      ev(Modified, Pending, "p", 1).reason("ProviderFailed"),       "fail:provider_failed"),
        ("3 provider failed running",      ev(Modified, Running, "p", 1).reason("ProviderFailed"),       "fail:provider_failed"),
        ("3 provider failed succeeded",    ev(Modified, Succeeded, "p", 1).reason("ProviderFailed"),     "fail:provider_failed"),
        ("3 provider failed failed",       ev(Modified, Failed, "p", 1).reason("ProviderFailed"),        "fail:provider_failed"),
        ("3 provider failed unknown",      ev(Modified, Unknown, "p", 1).reason("ProviderFailed"),       "fail:provider_failed"),
        ("3 provider failed no phase",     ev(Added, Unspecified, "p", 1).reason("ProviderFailed"),      "fail:provider_failed"),
        ("3 provider failed deleted",      ev(Deleted, Running, "p", 1).deleting().reason("ProviderFailed"), "fail:provider_failed"),
        // row 4: pending and really deleted: lost before start
        ("4 pending deleted",              ev(Deleted, Pending, "p", 1).deleting(),                      "lost:deleted_while_pending"),
        ("4 pending deleted fatal waiting",ev(Deleted, Pending, "p", 1).deleting().app_waiting("ErrImagePull", "x"), "lost:deleted_while_pending"),
        ("4 pending vanished unseen",      ev(Deleted, Pending, "p", 1).synthesized(),                   "lost:deleted_while_pending"),
        ("4 pending terminating, not gone",ev(Modified, Pending, "p", 1).deleting(),                     "pending"),
        // row 5: fatal waiting reasons on init containers or the first app container
        ("5 app ErrImagePull",             ev(Modified, Pending, "p", 1).app_waiting("ErrImagePull", "not found"), "fail:fatal_pending:ErrImagePull"),
        ("5 app pull QPS exceeded",        ev(Modified, Pending, "p", 1).app_waiting("ErrImagePull", "pull QPS exceeded"), "pending"),
        ("5 app pull QPS, other text",     ev(Modified, Pending, "p", 1).app_waiting("ErrImagePull", "pull QPS exceeded!"), "fail:fatal_pending:ErrImagePull"),
        ("5 init CreateContainerConfigError", ev(Modified, Pending, "p", 1).init_waiting("CreateContainerConfigError", "no secret"), "fail:fatal_pending:CreateContainerConfigError"),
        ("5 init pull QPS exceeded",       ev(Modified, Pending, "p", 1).init_waiting("ErrImagePull", "pull QPS exceeded"), "pending"),
        ("5 app InvalidImageName",         ev(Modified, Pending, "p", 1).app_waiting("InvalidImageName", ""), "fail:fatal_pending:InvalidImageName"),
        ("5 app CreateContainerError",     ev(Modified, Pending, "p", 1).app_waiting("CreateContainerError", ""), "fail:fatal_pending:CreateContainerError"),
        ("5 app ImageInspectError",        ev(Modified, Pending, "p", 1).app_waiting("ImageInspectError", ""), "fail:fatal_pending:ImageInspectError"),
        ("5 app ContainerCreating",        ev(Modified, Pending, "p", 1).app_waiting("ContainerCreating", ""), "pending"),
        ("5 app ImagePullBackOff",         ev(Modified, Pending, "p", 1).app_waiting("ImagePullBackOff", ""), "pending"),
        ("5 nothing waiting",              ev(Added, Pending, "p", 1),                                   "pending"),
        // row 6: failed, even when deleted
        ("6 failed",                       ev(Modified, Failed, "p", 1).exited(1, "Error"),              "fail:pod_failed"),
        ("6 failed deleted",               ev(Deleted, Failed, "p", 1).deleting(),                       "fail:pod_failed"),
        // row 7: succeeded is never a fail
        ("7 succeeded",                    ev(Modified, Succeeded, "p", 1).exited(0, "Completed"),       "completed"),
        ("7 succeeded deleted",            ev(Deleted, Succeeded, "p", 1).deleting(),                    "completed"),
        ("7 succeeded terminating",        ev(Modified, Succeeded, "p", 1).deleting(),                   "completed"),
        // row 8: running and really deleted
        ("8 running deleted",              ev(Deleted, Running, "p", 1).deleting(),                      "fail:deleted_while_running"),
        ("8 running vanished unseen",      ev(Deleted, Running, "p", 1).synthesized(),                   "fail:deleted_while_running"),
        // row 9: running otherwise
        ("9 running",                      ev(Modified, Running, "p", 1),                                "running"),
        ("9 running terminating",          ev(Modified, Running, "p", 1).deleting(),                     "running"),
        // row 10: any other phase
        ("10 unknown",                     ev(Modified, Unknown, "p", 1),                                "nothing:unknown_phase"),
        ("10 no phase",                    ev(Added, Unspecified, "p", 1),                               "nothing:unknown_phase"),
        ("10 unknown deleted",             ev(Deleted, Unknown, "p", 1).deleting(),                      "nothing:unknown_phase"),
    ];
    let mut wrong = Vec::new();
    for (case, event, expected) in &table {
        let got = word(&rules.outcome(event));
        if got != *expected {
            wrong.push(format!("{case}: expected {expected}, got {got}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "rows that disagree with semantics.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn fatal_reasons_are_configurable_and_trimmed() {
    let event = ev(Modified, Pending, "p", 1).app_waiting("InvalidImageName", "");
    // Airflow's historical default: a leading space hid InvalidImageName.
    let airflow_default =
        Rules::from_comma_list("CreateContainerConfigError, ErrImagePull, InvalidImageName");
    assert_eq!(
        word(&airflow_default.outcome(&event)),
        "fail:fatal_pending:InvalidImageName"
    );
    assert_eq!(airflow_default.fatal_reasons()[2], "InvalidImageName");

    let without = Rules::from_comma_list("ErrImagePull,,");
    assert_eq!(without.fatal_reasons(), ["ErrImagePull"]);
    assert_eq!(word(&without.outcome(&event)), "pending");
}

#[test]
fn pod_failed_names_exit_codes_and_reasons() {
    let event = ev(Modified, Failed, "p", 1).exited(137, "OOMKilled");
    let Outcome::Fail(failure) = Rules::default().outcome(&event) else {
        panic!("not a fail")
    };
    assert_eq!(failure.detail, "base exited 137 (OOMKilled)");
    assert_eq!(failure.terminated.len(), 1);

    // Every terminated container, in order; no parentheses without a reason.
    let event = ev(Modified, Failed, "p", 1)
        .exited(-1, "")
        .exited(2, "Error");
    let Outcome::Fail(failure) = Rules::default().outcome(&event) else {
        panic!("not a fail")
    };
    assert_eq!(failure.detail, "base exited -1, base exited 2 (Error)");

    let event = ev(Modified, Failed, "p", 1);
    let Outcome::Fail(failure) = Rules::default().outcome(&event) else {
        panic!("not a fail")
    };
    assert_eq!(failure.detail, "pod failed; no container reported an exit");
}
