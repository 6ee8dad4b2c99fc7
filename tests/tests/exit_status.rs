//! The exit status says what failed (`podstream --help`, docs/reference.md): a script or an
//! orchestrator tells its own mistake from a service that is away without reading the message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};

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
    let cases: [Case<'_>; 4] = [
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
