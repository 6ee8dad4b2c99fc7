//! The guard as a table: semantics.md "Applying outcomes to the metadata store".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_proto::v1::command::Kind;
use podstream_proto::v1::{Completed, Duplicate, Fail, Lost, Running, Transfer};
use podstream_proto::{Command, TaskKey};
use podstream_sink::guard::{Effect, Skip, TiRow, Verdict, verdict};

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
    Some(TiRow {
        state: state.map(str::to_owned),
        try_number,
        max_tries,
    })
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
            Apply(Effect::Fail {
                state: "up_for_retry",
            }),
        ),
        (
            "fail, last retry",
            command(2, fail()),
            ti(Some("running"), 2, 2),
            Apply(Effect::Fail {
                state: "up_for_retry",
            }),
        ),
        (
            "fail, retries used up",
            command(3, fail()),
            ti(Some("running"), 3, 2),
            Apply(Effect::Fail { state: "failed" }),
        ),
        (
            "fail, no retries",
            command(1, fail()),
            ti(Some("queued"), 1, 0),
            Apply(Effect::Fail { state: "failed" }),
        ),
        (
            "fail, restarting",
            command(1, fail()),
            ti(Some("restarting"), 1, 1),
            Apply(Effect::Fail {
                state: "up_for_retry",
            }),
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
            command(
                1,
                Kind::Transfer(Transfer {
                    from: "1".into(),
                    to: "7".into(),
                }),
            ),
            ti(Some("queued"), 1, 0),
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
        assert_eq!(verdict(&command, row.as_ref()), expected, "{name}");
    }
    let keyless = Command {
        task: None,
        ..command(1, fail())
    };
    assert!(matches!(verdict(&keyless, None), Invalid(_)));
}
