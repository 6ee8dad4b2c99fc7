//! `podstream check` against real nats-servers: a component's login, the streams and buckets it
//! uses and their replicas, each a line; the exit status is the first failure's kind. The
//! database's privileges are checked in the sink suite (`sink/grants.rs`), the Kubernetes
//! permissions on the real API server (`kube_apiserver_deploy.rs`).

use std::process::Command;

use podstream_tests::nats::{NatsCluster, NatsServer};
use podstream_tests::podstream_binary;

/// `podstream check <args>`: its exit code and its report.
fn check(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = Command::new(podstream_binary())
        .arg("check")
        .args(args)
        .env_remove("PODSTREAM_STREAM_REPLICAS")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    (output.status.code(), report)
}

/// The report's line about `item`.
fn line<'a>(report: &'a str, item: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.contains(item))
        .unwrap_or_else(|| panic!("no line about {item}:\n{report}"))
}

/// On a JetStream cluster, a processor configured without stream replicas would make its
/// streams and bucket with one copy each: every one is a failing line, exit 78. With
/// PODSTREAM_STREAM_REPLICAS=3, as the shipped ConfigMap sets it, every line passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_streams_without_replicas_fail_and_with_three_pass() {
    let cluster = NatsCluster::start(3);
    cluster.ready().await;
    let urls = cluster.urls();
    let (code, report) = check(&["process", "--nats", &urls], &[]);
    assert_eq!(code, Some(78), "{report}");
    assert!(line(&report, "nats login").starts_with("ok "), "{report}");
    for stream in [
        "PODSTREAM_PODS",
        "PODSTREAM_COMMANDS",
        "PODSTREAM_DEAD",
        "KV_podstream-process",
    ] {
        let stream_line = line(&report, &format!("stream {stream}:"));
        assert!(stream_line.starts_with("FAIL "), "{report}");
        assert!(
            stream_line.contains("PODSTREAM_STREAM_REPLICAS=3"),
            "{report}"
        );
    }

    let (code, report) = check(
        &["process", "--nats", &urls],
        &[("PODSTREAM_STREAM_REPLICAS", "3")],
    );
    assert_eq!(code, Some(0), "{report}");
    assert!(report.lines().all(|l| l.starts_with("ok ")), "{report}");
}

/// On the shipped users file: the sink's own user passes; a wrong password is a failing login
/// (exit 78, nothing else tried); another component's user may not look up the sink's
/// streams, each a failing line naming the permission (exit 78).
#[test]
fn a_refused_login_and_a_user_without_the_sinks_permissions_fail_their_lines() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_with_shipped_users(dir.path(), "check");
    let url = nats.url();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let db = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", db.path().join("absent.db").display());
    let as_user = |user: &str, password_file: &str| {
        check(
            &[
                "sink",
                "--nats",
                &url,
                "--nats-user",
                user,
                "--nats-password-file",
                password_file,
                "--db",
                &sqlite,
            ],
            &[],
        )
    };

    let (_, report) = as_user("podstream-sink", &file("sink"));
    assert!(line(&report, "nats login").starts_with("ok "), "{report}");
    assert!(
        line(&report, "stream PODSTREAM_COMMANDS:").starts_with("ok "),
        "{report}"
    );

    let (code, report) = as_user("podstream-sink", &file("ingest"));
    assert_eq!(code, Some(78), "{report}");
    let login = line(&report, "nats login");
    assert!(login.starts_with("FAIL "), "{report}");
    assert!(!report.contains("stream PODSTREAM"), "{report}");

    let (code, report) = as_user("podstream-ingest", &file("ingest"));
    assert_eq!(code, Some(78), "{report}");
    let commands = line(&report, "stream PODSTREAM_COMMANDS:");
    assert!(commands.starts_with("FAIL "), "{report}");
    assert!(
        commands.contains("$JS.API.STREAM.INFO.PODSTREAM_COMMANDS"),
        "{report}"
    );
}
