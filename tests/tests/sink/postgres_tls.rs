//! The sink's database over TLS, on a real PostgreSQL that takes TCP connections only over
//! TLS: `sslmode=verify-full` with the server's CA and the password from a file, or a client
//! certificate; a server certificate from another CA, a connection without TLS and a wrong
//! password are refused at once with errors that show no password.

use std::process::Command;

use podstream_sink::Database;
use podstream_sink::db::DbTarget;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::pki::Pki;
use podstream_tests::podstream_binary;
use podstream_tests::postgres::{PgCluster, PgTls};

const PASSWORD: &str = "db-pw-never-shown-2718";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_over_verified_tls_with_a_password_file_or_a_client_certificate() {
    let pki = Pki::new();
    pki.client("podstream_cert");
    let pg = PgCluster::start_with_tls(&PgTls {
        cert: pki.path("server.pem"),
        key: pki.path("server-key.pem"),
        ca: pki.path("ca.pem"),
    });
    let airflow = AirflowDb::postgres(Airflow::line("3.1"), &pg, "secured");
    pg.query(
        "postgres",
        &format!("CREATE ROLE podstream LOGIN SUPERUSER PASSWORD '{PASSWORD}'"),
    );
    pg.query("postgres", "CREATE ROLE podstream_cert LOGIN SUPERUSER");
    let port = airflow
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let ca = pki.path("ca.pem").display().to_string();
    let url =
        |user: &str, query: &str| format!("postgres://{user}@127.0.0.1:{port}/secured?{query}");
    let verified = format!("sslmode=verify-full&sslrootcert={ca}");

    // A password from a file, through the CLI: `apply` connects, checks the schema, applies
    // nothing.
    let password_file = pki.write("password", &format!("{PASSWORD}\n"));
    let empty = pki.write("empty.jsonl", "");
    let apply = |db: &str| {
        Command::new(podstream_binary())
            .args(["apply", "--db", db, "--db-password-file"])
            .arg(&password_file)
            .arg(&empty)
            .output()
            .unwrap()
    };
    let applied = apply(&url("podstream", &verified));
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );

    // A client certificate, no password.
    let cert = pki.path("podstream_cert.pem").display().to_string();
    let key = pki.path("podstream_cert-key.pem").display().to_string();
    let by_cert = url(
        "podstream_cert",
        &format!("{verified}&sslcert={cert}&sslkey={key}"),
    );
    Database::connect(&by_cert).await.unwrap();

    let refused = |target: DbTarget| async move {
        let Err(error) = Database::connect_to(&target).await else {
            panic!("connected to {}", target.redacted());
        };
        let text = podstream_bus::retry::with_causes(&error);
        assert!(!text.contains(PASSWORD), "{text}");
        text
    };
    let with_password = |url: String| DbTarget {
        url,
        password: Some(PASSWORD.to_owned()),
    };

    // A server certificate the given CA did not sign.
    let other = Pki::new();
    let other_ca = other.path("ca.pem").display().to_string();
    let text = refused(with_password(url(
        "podstream",
        &format!("sslmode=verify-full&sslrootcert={other_ca}"),
    )))
    .await;
    assert!(text.contains("TLS"), "{text}");

    // No TLS: the server takes no such connection.
    let text = refused(with_password(url("podstream", "sslmode=disable"))).await;
    assert!(text.contains("pg_hba.conf"), "{text}");

    // A wrong password, through the CLI too.
    let wrong = pki.write("wrong", "not-the-password");
    let output = Command::new(podstream_binary())
        .args([
            "apply",
            "--db",
            &url("podstream", &verified),
            "--db-password-file",
        ])
        .arg(&wrong)
        .arg(&empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");
}
