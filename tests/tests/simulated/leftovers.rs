//! Nothing a test starts outlives it: a test process killed outright (a CI timeout, Ctrl-C on
//! the suite) drops nothing, so each server the harness starts has a watcher that kills it
//! once the test process has gone (`podstream_stage::kill_when_this_process_ends`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podstream_tests::nats::NatsServer;

/// Set in the child this test starts: it starts a server, says its pid, and waits to be killed.
const HELPER: &str = "PODSTREAM_TEST_LEFTOVERS_HELPER";

fn alive(pid: u32) -> bool {
    // A zombie is gone for every purpose here; `ps` says `Z` for one.
    Command::new("ps")
        .args(["-o", "stat=", "-p", &pid.to_string()])
        .output()
        .is_ok_and(|out| {
            out.status.success() && !String::from_utf8_lossy(&out.stdout).starts_with('Z')
        })
}

#[test]
fn a_server_started_by_a_killed_test_process_goes_with_it() {
    if std::env::var_os(HELPER).is_some() {
        let server = NatsServer::start();
        println!("{}", server.pid().unwrap());
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    // The test's path in its tier's binary, without the crate's name.
    let test_name = format!(
        "{}::a_server_started_by_a_killed_test_process_goes_with_it",
        module_path!().split_once("::").unwrap().1
    );
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test_name, "--nocapture", "--test-threads", "1"])
        .env(HELPER, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = helper.stdout.take().unwrap();
    let pid: u32 = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        // libtest writes the test's name on the line the pid ends.
        .find_map(|line| line.split_whitespace().last()?.parse().ok())
        .expect("the helper says its server's pid");
    assert!(alive(pid), "the server runs while its test does");
    helper.kill().unwrap();
    helper.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "nats-server {pid} outlived the test process that started it"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
