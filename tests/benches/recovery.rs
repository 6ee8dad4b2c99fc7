//! Crash recovery: each stage killed with SIGKILL at spread-out moments just after a running
//! pod failed, changes while it is down, then started again (`podstream_tests::recovery`);
//! the time from the restart to the last commit, over many kills, beside a baseline run of
//! the same kills with the ack wait podstream had before (30 s).
//!
//! Also `podstream run` killed in the middle of a burst of pod failures and started again at
//! once, in its pod (`POD_NAME` set: it takes its own Lease back) and off Kubernetes (it waits
//! the Lease out): seconds from the restart to every task instance up for retry.
//!
//! `cargo bench -p podstream-tests --bench recovery` (`-- --burst-only` for the burst alone).
//! Without `--bench` (as `cargo test --all-targets` runs it) it plays one kill of each stage
//! and one small burst in a pod.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use podstream_bus::config::DEFAULT_ACK_WAIT_SECONDS;
use podstream_tests::recovery::{self, Kill, Stage};

/// The ack wait of every durable consumer before crash recovery was worked on.
const BASELINE_ACK_WAIT_SECONDS: u64 = 30;

fn summary(mut seconds: Vec<f64>) -> String {
    seconds.sort_by(f64::total_cmp);
    let at = |q: f64| seconds[((seconds.len() - 1) as f64 * q).round() as usize];
    format!(
        "n {:>2}  min {:>5.2}  median {:>5.2}  p90 {:>5.2}  max {:>5.2}",
        seconds.len(),
        at(0.0),
        at(0.5),
        at(0.9),
        at(1.0)
    )
}

/// `-- --burst-only`: only the burst section, the restarted `podstream run`.
const BURST_ONLY: &str = "--burst-only";
/// Task instances whose pods fail in one burst.
const BURST_TASKS: usize = 150;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let burst_only = std::env::args().any(|a| a == BURST_ONLY);
    let (rounds, baseline_rounds) = if full { (10, 3) } else { (1, 0) };
    let binary = podstream_tests::bench_binary(full);
    let runtime = podstream_tests::bench_runtime();
    runtime.block_on(async move {
        // A restarted `podstream run` in its pod takes its own Lease back; off Kubernetes it
        // waits out the Lease its earlier incarnation held (10 s): the baseline.
        println!(
            "podstream run killed -9 mid-burst of {BURST_TASKS} pod failures, started again at once: \
             seconds from the restart to every task instance up for retry"
        );
        for (label, in_pod, n) in [
            ("in its pod (POD_NAME)", true, if full { 5 } else { 1 }),
            ("off Kubernetes", false, if full { 5 } else { 0 }),
        ] {
            let mut seconds = Vec::new();
            for round in 0..n {
                let burst = recovery::Burst {
                    tasks: if full { BURST_TASKS } else { 20 },
                    after: Duration::from_millis(20 + 20 * round as u64),
                    in_pod,
                };
                seconds.push(recovery::play_burst(&binary, burst).await);
            }
            if !seconds.is_empty() {
                println!("run      {label:<22} {}", summary(seconds));
            }
        }
        if burst_only {
            return;
        }
        println!("seconds from the restart to the last commit (0.5 s down)");
        // Unlocked: killed 0-45 ms after the failure, whatever is in flight then. Locked: the
        // database is locked until the restart, so the sink dies holding the fail.
        let scenarios = Stage::ALL
            .into_iter()
            .map(|stage| (stage, false))
            .chain([(Stage::Run, true), (Stage::Sink, true)]);
        for (stage, lock_database) in scenarios {
            for (label, ack_wait_seconds, n) in [
                ("ack wait now", DEFAULT_ACK_WAIT_SECONDS, rounds),
                ("baseline 30 s", BASELINE_ACK_WAIT_SECONDS, baseline_rounds),
            ] {
                let mut from_restart = Vec::new();
                for round in 0..n {
                    let kill = Kill {
                        stage,
                        after: Duration::from_millis(5 * (round as u64 % 10)),
                        down: Duration::from_millis(500),
                        ack_wait_seconds,
                        lock_database,
                    };
                    from_restart.push(recovery::play(&binary, kill).await.from_restart);
                }
                if !from_restart.is_empty() {
                    let locked = if lock_database { "locked" } else { "" };
                    println!(
                        "{:<8} {locked:<7} {label:<14} {}",
                        stage.name(),
                        summary(from_restart)
                    );
                }
            }
        }
    });
}
