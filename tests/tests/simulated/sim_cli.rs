//! `podstream sim` as docs/contract.md §4 promises it to scripts.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use podstream_tests::{kubectl, podstream_binary};

#[test]
fn sim_prints_its_address_writes_a_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(podstream_binary())
        .args(["sim", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    assert!(
        url.starts_with("https://127.0.0.1:") && !url.ends_with(":0"),
        "{url}"
    );
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(written.contains(url), "{written}");
    assert!(
        written.contains("certificate-authority-data: "),
        "{written}"
    );
    assert!(written.contains("token: "), "{written}");
    // It holds the token: its owner's alone.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&kubeconfig).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    let (ok, stdout, stderr) = kubectl(&kubeconfig, &["get", "namespaces", "-o", "name"]);
    assert!(ok, "{stderr}");
    assert!(stdout.lines().any(|l| l == "namespace/airflow"), "{stdout}");
    // The same server without the kubeconfig's user: kubectl is refused.
    let (ok, _, stderr) = kubectl(
        &kubeconfig,
        &["get", "namespaces", "--token", "not-the-token"],
    );
    assert!(!ok && stderr.contains("Unauthorized"), "{stderr}");

    let term = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "sim exited with {status:?} after SIGTERM");
}

/// Whether a process whose command line is exactly `line` runs.
fn running(line: &str) -> bool {
    Command::new("pgrep")
        .args(["-x", "-f", line])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `podstream sim --kubelet` in `dir` with `configure`'s flags and environment besides, once
/// it listens; its kubeconfig is `dir/kubeconfig`.
fn sim_with_kubelet(
    dir: &std::path::Path,
    configure: impl FnOnce(&mut Command) -> &mut Command,
) -> std::process::Child {
    let mut command = Command::new(podstream_binary());
    command
        .args([
            "sim",
            "--kubelet",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig",
        ])
        .arg(dir.join("kubeconfig"))
        .arg("--kubelet-dir")
        .arg(dir.join("kubelet"))
        .stdout(Stdio::piped());
    let mut child = configure(&mut command).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("listening on "), "{first}");
    child
}

/// Creates `pod` through kubectl.
fn create(kubeconfig: &std::path::Path, pod: &serde_json::Value) {
    let (ok, _, err) = podstream_tests::control_plane::kubectl_with_input(
        kubeconfig,
        &["create", "-f", "-"],
        &pod.to_string(),
    );
    assert!(ok, "{err}");
}

/// The kubelet's pods never outlive it: killed with SIGKILL (no drop, no signal handler),
/// the processes of the pods it ran go with it, also one that started its own session.
#[test]
fn a_killed_kubelet_leaves_no_pod_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = sim_with_kubelet(dir.path(), |command| command);
    // A distinct sleep per test run, and one that leaves the pod's process group as
    // Airflow 2's task runner does (setsid).
    let marker = 3000 + std::process::id() % 1000;
    let plain = format!("sleep {marker}");
    let escaped = format!("sleep {}", marker + 1);
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "long", "namespace": "airflow"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "base", "image": "none",
            "command": ["sh", "-c", format!("setsid {escaped} & exec {plain}")],
        }]},
    });
    create(&kubeconfig, &pod);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(running(&plain) && running(&escaped)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod's processes never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // The kubelet looks for processes that left the container's group once a second.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while running(&plain) || running(&escaped) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod's processes outlived the kubelet: {plain}: {}, {escaped}: {}",
            running(&plain),
            running(&escaped)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The kubelet's pods get an explicit environment: PATH, HOME (their scratch directory),
/// HOSTNAME (their name), the variables `--kubelet-env` names and their own `env`; nothing
/// else of the simulator's environment (a credential set for the simulator stays there).
#[test]
fn the_kubelets_pods_get_only_the_environment_named() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = sim_with_kubelet(dir.path(), |command| {
        command
            .args([
                "--kubelet-env",
                "PODSTREAM_TEST_PASSED,PODSTREAM_TEST_UNSET",
            ])
            .env("PODSTREAM_TEST_PASSED", "passed")
            .env("PODSTREAM_TEST_SECRET", "leaked")
            .env_remove("PODSTREAM_TEST_UNSET")
    });
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "env", "namespace": "airflow"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "base", "image": "none",
            "command": ["env"],
            "env": [{"name": "OWN", "value": "own"}],
        }]},
    });
    create(&kubeconfig, &pod);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let log = loop {
        let (ok, phase, _) = kubectl(
            &kubeconfig,
            &[
                "get",
                "pod",
                "-n",
                "airflow",
                "env",
                "-o",
                "jsonpath={.status.phase}",
            ],
        );
        if ok && phase == "Succeeded" {
            let (ok, log, err) = kubectl(&kubeconfig, &["logs", "-n", "airflow", "env"]);
            assert!(ok, "{err}");
            break log;
        }
        assert!(std::time::Instant::now() < deadline, "the pod never ended");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    child.kill().unwrap();
    child.wait().unwrap();

    let mut names: Vec<&str> = log
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["HOME", "HOSTNAME", "OWN", "PATH", "PODSTREAM_TEST_PASSED"],
        "{log}"
    );
    assert!(log.contains("HOSTNAME=env\n"), "{log}");
    assert!(log.contains("PODSTREAM_TEST_PASSED=passed\n"), "{log}");
    assert!(!log.contains("leaked"), "{log}");
    let home = log
        .lines()
        .find_map(|line| line.strip_prefix("HOME="))
        .unwrap();
    assert!(
        std::path::Path::new(home).starts_with(dir.path().join("kubelet").canonicalize().unwrap()),
        "HOME {home} is not under the kubelet's directory\n{log}"
    );
}
