//! The exit status says what failed (`podstream --help`, docs/reference.md): a script or an
//! orchestrator tells its own mistake from a service that is away without reading the message.

use std::process::{Command, Stdio};

use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::nats::NatsServer;
use podstream_tests::podstream_binary;

/// `podstream args` with `env`; its exit code and standard error.
fn exits(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = Command::new(podstream_binary())
        .args(args)
        .envs(env.iter().copied())
        .env("KUBECONFIG", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A command line, its environment, and the exit code it must end with.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], i32);

#[test]
fn each_failure_exits_with_its_class() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let empty_db = format!("sqlite://{}", empty.display());
    let data_dir = dir.path().join("data").display().to_string();
    let cases: [Case<'_>; 5] = [
        // Any other failure: an input file that is not there.
        (&["decide", "/nonexistent/pods.json"], &[], 1),
        // Usage: clap refuses the flag.
        (&["run", "--no-such-flag"], &[], 2),
        // Configuration: a database URL that names nothing.
        (&["apply", "--db", "postgres://x@db:notaport/a"], &[], 78),
        // Unavailable: no nats-server to start for `run`.
        (
            &["run", "--db", &empty_db, "--data-dir", &data_dir],
            &[("PODSTREAM_NATS_SERVER", "/nonexistent/nats-server")],
            69,
        ),
        // Data: a database that is not Airflow's.
        (&["apply", "--db", &empty_db], &[], 65),
    ];
    for (args, env, code) in cases {
        let (got, stderr) = exits(args, env);
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
    }
}

/// A stage that cannot start exits with the class its library's error type says, met for
/// real: the processor refused by nats-server, the sink's retention shorter than the commands
/// stream's.
#[test]
fn a_stage_that_cannot_start_exits_with_the_class_of_its_error() {
    let nats = NatsServer::start_with_token();
    let token = nats.token_file().unwrap().display().to_string();
    let db = AirflowDb::sqlite(Airflow::oldest());
    let url = nats.url();
    let sink = |db: &str, more: &[&str]| -> Vec<String> {
        let mut args = vec![
            "sink",
            "--nats",
            &url,
            "--nats-token-file",
            &token,
            "--db",
            db,
        ];
        args.extend(more);
        args.into_iter().map(str::to_owned).collect()
    };
    let cases: [(Vec<String>, i32); 3] = [
        // Configuration: nats-server wants a token the processor does not give.
        (vec!["process".into(), "--nats".into(), url.clone()], 78),
        // Configuration: applied ids kept an hour, commands kept longer by the stream.
        (sink(&db.url, &["--applied-retention-hours", "1"]), 78),
        // Data: the sink's database is not Airflow's.
        (sink("sqlite:///dev/null", &[]), 65),
    ];
    for (args, code) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (got, stderr) = exits(&args, &[]);
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
    }
}
