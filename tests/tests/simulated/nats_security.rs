//! podstream against a nats-server that asks for TLS and credentials (passwords, nkeys,
//! tokens, JWT credentials files, and the shipped least-privilege users). Every way to log in
//! works for `ingest`, `process` and `sink` (each becomes ready and the pipeline moves); a
//! wrong credential or a missing client certificate ends the component at once with an
//! error naming the server and the method, never the secret; `--help` shows no secret.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use podstream_proto::subject::stream_names;
use podstream_sim::WorkerPod;
use podstream_sink::Database;
use podstream_sink::seed::SeedTi;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::component::Component;
use podstream_tests::nats::{NatsServer, SHIPPED_USERS};
use podstream_tests::pki::Pki;
use podstream_tests::{free_port, http_get, podstream_binary, recovery};

const DAG: &str = "etl";
const RUN: &str = "manual__2026-11-30";
const PASSWORD: &str = "pw-never-shown-4711";
const TOKEN: &str = "token-never-shown-0815";

/// Ingest, process, sink and collector, each with its `auth` flags, all become ready on `url`;
/// a running task's pod deleted then puts its task instance up for retry, and a pod that
/// succeeded is deleted by the collector: every stage worked.
async fn pipeline_works(url: &str, auth: [&[&str]; 4]) {
    let (sim, dir) = recovery::simulator().await;
    let kubeconfig = dir.path().join("kubeconfig");
    let target = AirflowDb::sqlite(Airflow::line("2.10"));
    let db = Database::connect(&target.url).await.unwrap();
    db.seed(
        DAG,
        RUN,
        &[
            SeedTi::running("secured", 1),
            SeedTi::running("collected", 1),
        ],
    )
    .await
    .unwrap();
    // With --spark: its stream, consumer, bucket and a driver pod's record are permitted
    // too (the simulator serves no SparkApplications: that watch only fails, and says so).
    let stages: [&[&str]; 4] = [
        &[
            "ingest",
            "--namespaces",
            recovery::NS,
            "--no-leader-election",
            "--spark",
        ],
        &["process", "--spark"],
        &["sink", "--db", &target.url],
        &["collect"],
    ];
    let mut running = Vec::new();
    for (stage, auth) in stages.into_iter().zip(auth) {
        let ops = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let ops_text = ops.to_string();
        let mut args: Vec<&str> = stage.to_vec();
        args.extend(["--nats", url, "--metrics-listen", &ops_text]);
        args.extend(auth);
        let component = Component::start(podstream_binary(), &args, &kubeconfig);
        running.push((stage[0], ops, component));
    }
    for (name, ops, component) in &mut running {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http_get(*ops, "/readyz").is_some_and(|(status, _)| status == 200) {
                break;
            }
            assert!(
                component.wait_exit(Duration::ZERO).is_none(),
                "{name} exited with {auth:?}"
            );
            assert!(Instant::now() < deadline, "{name} not ready with {auth:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let cluster = sim.cluster();
    cluster
        .create_pod(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": "secured-driver", "namespace": recovery::NS, "labels": {
                "spark-role": "driver", "spark_kubernetes_operator": "True", "dag_id": DAG,
                "task_id": "spark", "run_id": RUN, "try_number": "1" } },
            "spec": { "containers": [{ "name": "spark-kubernetes-driver", "image": "spark:3.5" }] },
        }))
        .unwrap();
    cluster
        .create_pod(WorkerPod::new("secured-pod", "1", DAG, "secured", RUN).to_json())
        .unwrap();
    cluster
        .set_phase(recovery::NS, "secured-pod", "Running")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(
        cluster
            .delete_pod(recovery::NS, "secured-pod", Some(1))
            .unwrap(),
    );
    let key = podstream_sink::seed::first_try(DAG, "secured", RUN);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = db.task_instance(&key).await.unwrap().unwrap();
        if row.state == "up_for_retry" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the task instance stayed {row:?} with {auth:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The collector reads the records and writes its bucket: a pod that succeeded goes.
    cluster
        .create_pod(WorkerPod::new("collected-pod", "1", DAG, "collected", RUN).to_json())
        .unwrap();
    for phase in ["Running", "Succeeded"] {
        cluster
            .set_phase(recovery::NS, "collected-pod", phase)
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Ok(pod) = cluster.pod(recovery::NS, "collected-pod") {
        if pod["metadata"]["deletionTimestamp"].is_string() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the collector left the pod that succeeded with {auth:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (name, _, component) in running {
        assert!(component.terminate().success(), "{name} with {auth:?}");
    }
}

/// `podstream process` with `auth` flags (see [`stage_for`]).
fn process_alone(
    url: &str,
    auth: &[&str],
    within: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    stage_for("process", url, auth, within)
}

/// `podstream COMMAND` with `auth` flags at info level: its exit status if it ended within
/// `within` (else it is stopped with SIGTERM and the status is `None`), and its stderr.
fn stage_for(
    command: &str,
    url: &str,
    auth: &[&str],
    within: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let mut child = Command::new(podstream_binary())
        .args([command, "--nats", url])
        .args(auth)
        .env("PODSTREAM_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    let mut status = child.try_wait().unwrap();
    while status.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        status = child.try_wait().unwrap();
    }
    if status.is_none() {
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    (status, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Ended with an error within `within`: its stderr.
fn refused(url: &str, auth: &[&str], within: Duration) -> String {
    let (status, stderr) = process_alone(url, auth, within);
    let status = status.unwrap_or_else(|| panic!("still running after {within:?}: {stderr}"));
    assert!(!status.success(), "{stderr}");
    stderr
}

fn path_str(path: &Path) -> String {
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_password_or_an_nkey_and_a_wrong_one_refused_at_once() {
    let pki = Pki::new();
    pki.client("podstream");
    let nkey = nkeys::KeyPair::new_user();
    let seed = pki.write("user.nk", &nkey.seed().unwrap());
    let password_file = pki.write("password", &format!("{PASSWORD}\n"));
    let wrong_file = pki.write("wrong", "not-the-password-31337");
    let config = pki.write(
        "nats-server.conf",
        &format!(
            r#"
tls {{
  cert_file: "{server}"
  key_file: "{server_key}"
  ca_file: "{ca}"
  verify: true
}}
authorization {{
  users: [
    {{ user: "podstream", password: "{PASSWORD}" }}
    {{ nkey: "{public}" }}
  ]
}}
"#,
            server = path_str(&pki.path("server.pem")),
            server_key = path_str(&pki.path("server-key.pem")),
            ca = path_str(&pki.path("ca.pem")),
            public = nkey.public_key(),
        ),
    );
    let nats = NatsServer::start_with_config(&config, &[]);
    let url = format!("tls://127.0.0.1:{}", nats.port());
    let ca = path_str(&pki.path("ca.pem"));
    let cert = path_str(&pki.path("podstream.pem"));
    let key = path_str(&pki.path("podstream-key.pem"));
    let tls = ["--nats-ca", &ca, "--nats-cert", &cert, "--nats-key", &key];

    let password = path_str(&password_file);
    let with_password: Vec<&str> = tls
        .iter()
        .copied()
        .chain([
            "--nats-user",
            "podstream",
            "--nats-password-file",
            &password,
        ])
        .collect();
    pipeline_works(&url, [&with_password; 4]).await;

    let seed = path_str(&seed);
    let with_nkey: Vec<&str> = tls.iter().copied().chain(["--nats-nkey", &seed]).collect();
    pipeline_works(&url, [&with_nkey; 4]).await;

    // A wrong password: refused at once, naming the server and the method, not the secret.
    let wrong = path_str(&wrong_file);
    let with_wrong: Vec<&str> = tls
        .iter()
        .copied()
        .chain(["--nats-user", "podstream", "--nats-password-file", &wrong])
        .collect();
    let stderr = refused(&url, &with_wrong, Duration::from_secs(15));
    assert!(stderr.contains("refused a user and password"), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", nats.port())),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");

    // A password in the URL is used, and redacted where the URL is logged.
    let in_url = format!("tls://podstream:{PASSWORD}@127.0.0.1:{}", nats.port());
    let (status, stderr) = process_alone(&in_url, &tls, Duration::from_secs(3));
    assert!(status.is_none(), "it runs: {stderr}");
    assert!(
        stderr.contains("connected to NATS url=tls://podstream:***@127.0.0.1"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");

    // No client certificate where the server verifies one: a TLS error, at once.
    let without_cert = [
        "--nats-ca",
        &ca,
        "--nats-user",
        "podstream",
        "--nats-password-file",
        &password,
    ];
    let stderr = refused(&url, &without_cert, Duration::from_secs(15));
    assert!(stderr.contains("TLS"), "{stderr}");
    assert!(!stderr.contains(PASSWORD), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_a_file_and_urls_redacted_in_logs_and_help() {
    let pki = Pki::new();
    let token_file = pki.write("token", TOKEN);
    let config = pki.write(
        "nats-server.conf",
        &format!("authorization {{ token: \"{TOKEN}\" }}\n"),
    );
    let nats = NatsServer::start_with_config(&config, &[]);
    let url = nats.url();
    let token = path_str(&token_file);
    pipeline_works(&url, [&["--nats-token-file", &token]; 4]).await;

    // A wrong token in the URL is refused and not printed.
    let wrong = format!("nats://wrong-{TOKEN}@127.0.0.1:{}", nats.port());
    let stderr = refused(&wrong, &[], Duration::from_secs(15));
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(!stderr.contains(TOKEN), "{stderr}");

    let in_url = format!("nats://{TOKEN}@127.0.0.1:{}", nats.port());
    for command in ["ingest", "process", "sink", "run", "tail", "replay"] {
        let help = Command::new(podstream_binary())
            .args([command, "--help"])
            .env("PODSTREAM_NATS", &in_url)
            .env(
                "PODSTREAM_DB",
                format!("postgres://airflow:{TOKEN}@db/airflow"),
            )
            .output()
            .unwrap();
        assert!(help.status.success());
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(text.contains("--nats-token-file"), "{command}: {text}");
        assert!(
            !text.contains(TOKEN),
            "{command} --help shows a secret: {text}"
        );
    }
}

/// The shipped `deploy/nats/podstream-users.conf`: each component with its own user runs the
/// pipeline without one refusal; the reader user replays the streams; a component with
/// another component's user is refused what exceeds that user's permissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_component_with_its_own_user_on_the_shipped_least_privilege_config() {
    let pki = Pki::new();
    let users = SHIPPED_USERS;
    let nats = NatsServer::start_with_shipped_users(&pki.path(""), PASSWORD);
    let url = nats.url();
    let files: Vec<String> = users.iter().map(|user| path_str(&pki.path(user))).collect();
    let user_names: Vec<String> = users
        .iter()
        .map(|user| format!("podstream-{user}"))
        .collect();
    let login = |i: usize| -> [&str; 4] {
        [
            "--nats-user",
            &user_names[i],
            "--nats-password-file",
            &files[i],
        ]
    };

    pipeline_works(&url, [&login(0), &login(1), &login(2), &login(6)]).await;
    let refusals = |log: &str| {
        log.lines()
            .filter(|line| line.contains("Violation"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(refusals(&nats.log()), Vec::<String>::new());

    // The reader replays both streams and tails them.
    let replay = Command::new(podstream_binary())
        .args(["replay", "--since", "1", "--nats", &url])
        .args(login(3))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    assert!(stdout.contains("secured-pod"), "{stdout}");
    let (status, stderr) = stage_for("tail", &url, &login(3), Duration::from_secs(2));
    assert!(status.is_none(), "tail runs: {stderr}");
    assert_eq!(refusals(&nats.log()), Vec::<String>::new());

    // The processor with the sink's user may not read pod events: refused, and says so.
    let (status, stderr) = process_alone(&url, &login(2), Duration::from_secs(5));
    assert!(status.is_none(), "{stderr}");
    assert!(stderr.contains("Permissions Violation"), "{stderr}");
    assert!(
        refusals(&nats.log())
            .iter()
            .any(|line| line.contains("podstream-sink") && line.contains(stream_names::PODS)),
        "{}",
        nats.log()
    );
}

/// The shipped users file, tried as an attacker with each credential would: every operation
/// a user must not do is refused by the server (a permission violation naming that user), and
/// the same connection still does what the user is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shipped_user_is_refused_what_its_job_does_not_need() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_with_shipped_users(dir.path(), PASSWORD);
    let connect = async |user: &str| {
        async_nats::ConnectOptions::with_user_and_password(
            format!("podstream-{user}"),
            format!("{user}-{PASSWORD}"),
        )
        // The inbox each client really uses.
        .custom_inbox_prefix(match user {
            "reader" => "_INBOX_podstream-tail".to_owned(),
            user => format!("_INBOX_podstream-{user}"),
        })
        .connect(nats.url())
        .await
        .unwrap()
    };
    // (user, subject it must not publish to, what that would be)
    let forbidden = [
        (
            "airflow",
            "$JS.API.CONSUMER.MSG.NEXT.PODSTREAM_COMMANDS.podstream-sink",
            "pull the sink's commands",
        ),
        (
            "airflow",
            "$JS.ACK.PODSTREAM_COMMANDS.podstream-sink.1.2.3.4.5.6",
            "ack the sink's commands",
        ),
        (
            "airflow",
            "$JS.API.CONSUMER.CREATE.PODSTREAM_COMMANDS.podstream-sink",
            "redefine the sink's consumer",
        ),
        (
            "airflow",
            "$JS.API.CONSUMER.DELETE.PODSTREAM_COMMANDS.podstream-sink",
            "delete the sink's consumer",
        ),
        (
            "airflow",
            "podstream.commands.1.forged",
            "publish a command",
        ),
        (
            "airflow",
            "$KV.podstream-spark.job",
            "write the Spark bucket",
        ),
        ("spark", "$KV.podstream-spark.job", "write the Spark bucket"),
        (
            "spark",
            "$JS.API.CONSUMER.MSG.NEXT.PODSTREAM_COMMANDS.podstream-airflow-1",
            "pull a scheduler's commands",
        ),
        ("spark", "podstream.pods.1.forged", "publish a pod event"),
        (
            "reader",
            "$JS.API.CONSUMER.DELETE.PODSTREAM_COMMANDS.podstream-sink",
            "delete the sink's consumer",
        ),
        (
            "reader",
            "$JS.API.CONSUMER.DELETE.PODSTREAM_PODS.podstream-process",
            "delete the processor's consumer",
        ),
        (
            "reader",
            "$JS.API.CONSUMER.MSG.NEXT.PODSTREAM_COMMANDS.podstream-sink",
            "pull the sink's commands",
        ),
        ("reader", "podstream.commands.1.forged", "publish a command"),
        // The 5-token form takes the consumer's name from the body: {"name":"podstream-sink"}.
        (
            "reader",
            "$JS.API.CONSUMER.CREATE.PODSTREAM_COMMANDS",
            "create a consumer named in the body",
        ),
        (
            "reader",
            "$JS.API.CONSUMER.CREATE.PODSTREAM_PODS",
            "create a consumer named in the body",
        ),
        (
            "reader",
            "$JS.API.CONSUMER.CREATE.PODSTREAM_PODS.podstream-process.podstream.pods.>",
            "redefine the processor's consumer",
        ),
        (
            "reader",
            "$JS.API.CONSUMER.MSG.NEXT.PODSTREAM_COMMANDS.podstream-airflow-1",
            "pull a scheduler's commands",
        ),
        (
            "airflow",
            "$JS.API.CONSUMER.CREATE.PODSTREAM_COMMANDS",
            "create a consumer named in the body",
        ),
        ("ingest", "podstream.commands.1.forged", "publish a command"),
        (
            "ingest",
            "$JS.API.CONSUMER.DELETE.PODSTREAM_PODS.podstream-process",
            "delete the processor's consumer",
        ),
        ("process", "podstream.pods.1.forged", "publish a pod event"),
        (
            "process",
            "$JS.API.CONSUMER.MSG.NEXT.PODSTREAM_COMMANDS.podstream-sink",
            "pull the sink's commands",
        ),
        ("sink", "podstream.commands.1.forged", "publish a command"),
        (
            "collect",
            "podstream.commands.1.forged",
            "publish a command",
        ),
        (
            "collect",
            "$KV.podstream-process.ti.forged",
            "write the processor's task records",
        ),
        (
            "collect",
            "$JS.API.CONSUMER.MSG.NEXT.PODSTREAM_COMMANDS.podstream-sink",
            "pull the sink's commands",
        ),
        (
            "collect",
            "$JS.API.CONSUMER.CREATE.PODSTREAM_COMMANDS",
            "create a consumer named in the body",
        ),
        (
            "sink",
            "$JS.API.CONSUMER.MSG.NEXT.PODSTREAM_PODS.podstream-process",
            "pull pod events",
        ),
        (
            "sink",
            "$JS.API.STREAM.DELETE.PODSTREAM_COMMANDS",
            "delete the commands stream",
        ),
    ];
    for (user, subject, what) in forbidden {
        let client = connect(user).await;
        client
            .publish(subject.to_owned(), "x".into())
            .await
            .unwrap();
        client.flush().await.unwrap();
        until_refused(&nats, "Violation", user, subject, what).await;
    }
    // Nobody reads another user's replies: a pull's answer carries the messages and the
    // subjects that ack them.
    let foreign_inboxes = [
        ("spark", "_INBOX_podstream-airflow.>"),
        ("airflow", "_INBOX_podstream-spark.>"),
        ("airflow", "_INBOX_podstream-sink.>"),
        ("reader", "_INBOX_podstream-process.>"),
        ("ingest", "_INBOX_podstream-airflow.>"),
        ("collect", "_INBOX_podstream-sink.>"),
    ];
    for (user, inbox) in foreign_inboxes {
        let client = connect(user).await;
        let _subscription = client.subscribe(inbox).await.unwrap();
        client.flush().await.unwrap();
        until_refused(&nats, "Subscription Violation", user, inbox, "read replies").await;
    }
    // What they are for still works: the Spark user reads JetStream's account info.
    let spark = async_nats::jetstream::new(connect("spark").await);
    let refused_before = nats.log().matches("Violation").count();
    spark.query_account().await.unwrap();
    assert_eq!(nats.log().matches("Violation").count(), refused_before);
}

/// Waits until the server's log shows a `violation` of `subject` by `podstream-<user>`;
/// fails the test after 5 s, saying `podstream-<user>` may `what`.
async fn until_refused(nats: &NatsServer, violation: &str, user: &str, subject: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = nats.log();
        let refused = log.lines().any(|line| {
            line.contains(violation)
                && line.contains(&format!("podstream-{user}"))
                && line.contains(subject)
        });
        if refused {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "podstream-{user} may {what} ({subject}):\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A JWT as nats-server reads it: `claims` for `subject`, signed by `issuer`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = serde_json::json!({"typ": "JWT", "alg": "ed25519-nkey"});
    let claims = serde_json::json!({
        "jti": format!("{subject}-{name}"),
        "iat": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        "iss": issuer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let signed = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    );
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", b64.encode(signature))
}

/// A server in operator mode (JWT accounts, as NGS and nsc set up) and a `.creds` file for
/// a user of an account with JetStream: the pipeline runs with `--nats-creds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_file_on_a_server_in_operator_mode() {
    let pki = Pki::new();
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "podstream-test",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "airflow",
        serde_json::json!({"type": "account", "version": 2, "limits": unlimited}),
    );
    let system = nkeys::KeyPair::new_account();
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "podstream",
        serde_json::json!({"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1}),
    );
    let config = pki.write(
        "nats-server.conf",
        &format!(
            "operator: {operator_jwt}\nsystem_account: {system}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {account}: {account_jwt}\n  {system}: {system_jwt}\n}}\n",
            account = account.public_key(),
            system = system.public_key(),
        ),
    );
    let creds = pki.write(
        "podstream.creds",
        &format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    );
    let nats = NatsServer::start_with_config(&config, &[]);
    let creds = path_str(&creds);
    pipeline_works(&nats.url(), [&["--nats-creds", &creds]; 4]).await;

    // Without the file: refused at once.
    let stderr = refused(&nats.url(), &[], Duration::from_secs(15));
    assert!(stderr.contains("refused"), "{stderr}");
}

/// The nats-server `podstream run` and `demo` start for themselves takes only the token they
/// made for it: another local user's process cannot read or publish through it. The token is
/// in a file only its owner reads (for `tail --nats-token-file`), never on a command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_server_of_run_and_demo_takes_only_its_token() {
    use std::os::unix::fs::PermissionsExt as _;

    use podstream_bus::local_server::LocalServer;
    use podstream_bus::{NatsCredentials, NatsSecurity};

    let dir = tempfile::tempdir().unwrap();
    let server = LocalServer::start_with_token(
        &podstream_tests::nats::nats_server_binary(),
        dir.path(),
        free_port(),
    )
    .unwrap();
    let anonymous = async_nats::connect(server.url()).await;
    assert!(
        anonymous.is_err(),
        "an anonymous client was let in: {anonymous:?}"
    );

    let own = podstream_bus::connect::connect(
        &server.client_url(),
        &NatsSecurity::default(),
        "podstream-ingest",
    )
    .await
    .unwrap();
    own.flush().await.unwrap();

    let token_file = server.token_file().unwrap();
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is readable by others");
    let tail = NatsSecurity {
        credentials: NatsCredentials::TokenFile(token_file.clone()),
        ..NatsSecurity::default()
    };
    let with_file = podstream_bus::connect::connect(&server.url(), &tail, "podstream-tail")
        .await
        .unwrap();
    with_file.flush().await.unwrap();

    let token = std::fs::read_to_string(&token_file).unwrap();
    let command_line =
        std::fs::read_to_string(format!("/proc/{}/cmdline", server.pid().unwrap())).unwrap();
    assert!(!command_line.contains(token.trim()), "{command_line}");
    assert!(
        !server.url().contains(token.trim()),
        "the shown URL holds the token"
    );
}
