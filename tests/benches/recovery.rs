//! Crash recovery: each stage killed with SIGKILL at spread-out moments just after a running
//! pod failed, changes while it is down, then started again (`podstream_tests::recovery`);
//! the time from the restart to the last commit, over many kills, beside a baseline run of
//! the same kills with the ack wait podstream had before (30 s).
//!
//! `cargo bench -p podstream-tests --bench recovery`. Without `--bench` (as `cargo test
//! --all-targets` runs it) it plays one kill of each stage.

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

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, baseline_rounds) = if full { (10, 3) } else { (1, 0) };
    let binary = podstream_tests::bench_binary(full);
    let runtime = podstream_tests::bench_runtime();
    runtime.block_on(async move {
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
