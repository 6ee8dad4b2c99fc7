//! `podstream demo` end to end: the simulator, a local nats-server, an Airflow 2.10 SQLite DB
//! made by Airflow, the pipeline; every story must end as docs/semantics.md says.

use std::process::Command;

use podstream_tests::nats::nats_server_binary;
use podstream_tests::{podstream_binary, workspace_root};

/// `podstream demo ARGS` on the cached Airflow 2.10 SQLite DB, run to its end.
fn demo(args: &[&str]) -> std::process::Output {
    Command::new(podstream_binary())
        .arg("demo")
        .args(args)
        .env("PODSTREAM_NATS_SERVER", nats_server_binary())
        // The demo stops as soon as every story has settled; the deadline only bounds a
        // wrong run, and this binary shares two cores with real Airflow schedulers.
        .env("PODSTREAM_DEMO_TIMEOUT_SECONDS", "300")
        .env(
            "PODSTREAM_DEMO_AIRFLOW_DB",
            workspace_root().join("target/airflow-db/airflow-2.10.sqlite"),
        )
        .output()
        .unwrap()
}

#[test]
fn demo_plays_every_story_and_exits_0() {
    let out = tempfile::tempdir().unwrap();
    let page = out.path().join("stories.html");
    let output = demo(&["--html", &page.display().to_string()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.matches(" OK (expected").count(), 5, "{stdout}");
    assert!(stdout.contains("transfer 1→2 (adopted-1)"), "{stdout}");
    assert!(
        stdout.contains("duplicate: twins-1 drives, others twins-2"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fail: deleted_while_running (broken-1)"),
        "{stdout}"
    );
    // Seed 003's losing pod is collected after the grace period; the driving one is not.
    assert!(
        stdout.contains("collector:     deleted twins-2 (duplicate; twins-1 drives)"),
        "{stdout}"
    );
    assert!(!stdout.contains("deleted twins-1"), "{stdout}");
    assert!(!stdout.contains("WRONG"), "{stdout}");
    // The label-watcher lines are what the installed providers' own watcher reported for the
    // events each story produced, for every Airflow that scripts/setup.sh installs.
    for release in podstream_sink::airflow::supported() {
        let (airflow, provider) = (release.release, release.kubernetes_provider);
        let said = |story: usize| -> String {
            let prefix =
                format!("   label watcher: Airflow {airflow} (cncf.kubernetes {provider}): ");
            story_block(&stdout, story)
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_owned))
                .unwrap_or_else(|| {
                    panic!("story {story}: no line from Airflow {airflow}\n{stdout}")
                })
        };
        // A relabel is an adoption to current providers: nothing is failed.
        assert_eq!(
            said(1),
            "scheduler 1: adopted (adopted-1); scheduler 2: nothing"
        );
        assert_eq!(
            said(2),
            "scheduler 1: adopted (survivor-1); scheduler 3: completed (survivor-1)"
        );
        // The loser's failure is reported for the TI.
        assert_eq!(said(3), "scheduler 1: failed (twins-2)");
        assert_eq!(said(4), "scheduler 1: failed (broken-1)");
        assert_eq!(said(5), "scheduler 1: completed (fine-1)");
    }
    assert!(!stdout.contains("not checked"), "{stdout}");

    // --html: the same stories as a page, a lane per story, as a browser builds it.
    let dom = podstream_tests::browser::dom(&page);
    assert_eq!(dom.matches("<section class=\"lane\"").count(), 5, "{dom}");
    for task in ["adopted", "survivor", "twins", "broken", "fine"] {
        assert!(
            dom.contains(&format!("data-ti=\"podstream_demo/{task}/")),
            "{task}: {dom}"
        );
    }
    assert!(
        dom.contains("class=\"pod driver\" data-pod=\"twins-1\""),
        "{dom}"
    );
}

/// The report's lines for story `n` (from `n. ` to the next blank line).
fn story_block(stdout: &str, n: usize) -> String {
    let start = format!("{n}. ");
    stdout
        .split("\n\n")
        .find(|block| block.trim_start().starts_with(&start))
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn demo_without_airflow_says_the_watcher_was_not_checked() {
    let output = demo(&["--airflow-venv", "/nonexistent/venv"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert_eq!(
        stdout.matches("   label watcher: not checked: ").count(),
        5,
        "{stdout}"
    );
    assert!(stdout.contains("/nonexistent/venv"), "{stdout}");
}

#[test]
fn demo_without_an_airflow_db_says_what_to_do() {
    let output = Command::new(podstream_binary())
        .args(["demo", "--airflow-db", "/nonexistent/airflow.db"])
        .env("PODSTREAM_NATS_SERVER", nats_server_binary())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/airflow.db"), "{stderr}");
}

/// `podstream demo --airflow --story 3 --story 4`: real Airflow 3.1 schedulers play the
/// second-pod story and the pod that dies while its scheduler is down, each with the stock
/// executor and with podstream's (every story's ending with podstream is
/// tests/tests/airflow/podstream_stories.rs; the suite plays two here to keep its time). Both end right
/// with podstream; the report says what the stock executor did (on 3.1 it fails the live try
/// of the second-pod story and retries it) and how long each took to see the pod's end.
#[test]
fn demo_with_airflow_plays_the_stories_side_by_side() {
    let out = tempfile::tempdir().unwrap();
    let page = out.path().join("airflow-stories.html");
    let output = demo(&[
        "--airflow",
        "--story",
        "3",
        "--story",
        "4",
        "--html",
        &page.display().to_string(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo --airflow failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let first_try = "run success; task try 1 success; callbacks: success (try 1)";
    let retried = "run success; task try 2 success; callbacks: retry (try 1), success (try 2)";
    // Story 4's pod dies while the scheduler is down: the scheduler that adopts it fails that
    // try once and retries it, with either executor.
    for (n, right, stock) in [(3, first_try, retried), (4, retried, retried)] {
        let block = story_block(&stdout, n);
        assert!(
            block.contains(&format!("   podstream:          {right}  OK")),
            "story {n}:\n{block}"
        );
        assert!(
            block.contains(&format!("   stock executor:     {stock}")),
            "story {n}:\n{block}"
        );
        assert!(
            block.contains("   first pod's end to the TI's change: stock executor "),
            "story {n}:\n{block}"
        );
        assert!(
            block.contains("timeline with podstream:"),
            "story {n}:\n{block}"
        );
    }
    assert!(
        story_block(&stdout, 3).contains("timeline with the stock executor:"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("\n1. ") && !stdout.contains("\n6. "),
        "{stdout}"
    );

    // --html: podstream's history of each story, a part per story, as a browser builds it.
    let dom = podstream_tests::browser::dom(&page);
    assert_eq!(dom.matches("<h2>").count(), 2, "{dom}");
    assert!(!dom.contains("no history"), "{dom}");
    for n in [3, 4] {
        assert!(dom.contains(&format!("<h2>{n}. ")), "story {n}: {dom}");
    }
    // Each story's task instance has its lane, with its pods as bars and podstream's commands.
    assert!(dom.matches("<section class=\"lane\"").count() >= 2, "{dom}");
    assert!(dom.contains("class=\"mark command kind-completed"), "{dom}");
    // Story 3's second pod loses to the driver.
    assert!(dom.contains("class=\"pod loser\""), "{dom}");
}

#[test]
fn demo_with_airflow_refuses_a_story_it_does_not_have() {
    let output = demo(&["--airflow", "--story", "9"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("there is no story 9"), "{stderr}");
}

#[test]
fn demo_with_an_unknown_airflow_version_names_the_supported_ones() {
    let output = demo(&["--airflow", "--airflow-version", "1.10"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no Airflow release line 1.10") && stderr.contains("3.1"),
        "{stderr}"
    );
}
