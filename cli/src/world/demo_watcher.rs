//! The demo's "label watcher" lines, from Airflow's own code: every pod change the stories
//! made, as the label-scoped watch of each scheduler would have received it (a pod leaving
//! the selector is a `DELETED` without `deletionTimestamp`), fed to the installed
//! cncf.kubernetes provider's `KubernetesJobWatcher.process_status` in each Airflow venv
//! (`demo_watcher.py`), and what it reported for the executor.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use podstream_sim::Cluster;
use podstream_sim::selector::{Filter, LabelSelector};
use podstream_sim::store::{Change, Event};
use podstream_sim::watch::event_type;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// The script each venv's Python runs.
const SCRIPT: &str = include_str!("demo_watcher.py");

/// What one Airflow release's watcher reported for the stories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatcherReport {
    /// `apache-airflow`'s version.
    pub airflow: String,
    /// `apache-airflow-providers-cncf-kubernetes`' version.
    pub provider: String,
    /// Per story (its task id), per scheduler id: what it queued, in order.
    pub reported: BTreeMap<String, BTreeMap<String, Vec<Reported>>>,
}

/// One result a watcher queued for its executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// The pod it is about.
    pub pod: String,
    /// The state (`failed`, `adopted`, ...); `None` for a completed pod.
    pub state: Option<String>,
}

/// The Airflow venvs `scripts/setup.sh` installs (`target/tools/airflow-*`), found above the
/// running executable.
pub fn installed_venvs() -> Vec<PathBuf> {
    let Ok(exe) = std::env::current_exe() else {
        return Vec::new();
    };
    let Some(tools) = exe
        .ancestors()
        .map(|dir| dir.join("tools"))
        .find(|dir| dir.is_dir())
    else {
        return Vec::new();
    };
    let mut venvs: Vec<PathBuf> = std::fs::read_dir(&tools)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("airflow-"))
                        && p.join("bin/python").is_file()
                })
                .collect()
        })
        .unwrap_or_default();
    venvs.sort();
    venvs
}

/// Each story's pod changes as every scheduler's label-scoped watch received them, as the
/// script's input lines. A story is the `task_id` annotation of its pods; its schedulers are
/// every `airflow-worker` value its pods carried.
pub fn watch_lines(cluster: &Cluster, collected: &BTreeSet<String>) -> anyhow::Result<Vec<Value>> {
    let events = cluster
        .events_after(0, usize::MAX)
        .context("reading the simulator's change log")?;
    let pod_events: Vec<(&Event, Value)> = events
        .iter()
        .filter(|e| e.object.key.resource == podstream_sim::Resource::Pods)
        .filter_map(|e| e.object.value().ok().map(|v| (e, v)))
        // The collector's deletions are podstream's cleanup after a story, not the story.
        .filter(|(e, pod)| {
            !(e.change == Change::Deleted
                && pod["metadata"]["uid"]
                    .as_str()
                    .is_some_and(|uid| collected.contains(uid)))
        })
        .collect();
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (event, pod) in &pod_events {
        let story = story_of(pod);
        let seen = owners.entry(story).or_default();
        for stored in std::iter::once(&event.object).chain(&event.old) {
            if let Some(owner) = stored.labels.get("airflow-worker") {
                seen.insert(owner.clone());
            }
        }
    }
    let mut lines = Vec::new();
    for (story, schedulers) in &owners {
        for scheduler in schedulers {
            let filter = Filter {
                labels: LabelSelector::parse(&format!("airflow-worker={scheduler}"))?,
                ..Filter::default()
            };
            for (event, pod) in pod_events.iter().filter(|(_, p)| story_of(p) == *story) {
                if let Some(kind) = event_type(&filter, event) {
                    lines.push(json!({
                        "story": story,
                        "scheduler": scheduler,
                        "event": { "type": kind, "object": pod },
                    }));
                }
            }
        }
    }
    Ok(lines)
}

fn story_of(pod: &Value) -> String {
    pod["metadata"]["annotations"]["task_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Runs the provider's watcher in one venv over the lines.
pub async fn report(venv: &Path, lines: &[Value]) -> anyhow::Result<WatcherReport> {
    let python = venv.join("bin/python");
    let home = tempfile::tempdir().context("making a temp AIRFLOW_HOME")?;
    let mut child = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(SCRIPT)
        .env("AIRFLOW_HOME", home.path())
        .env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {}", python.display()))?;
    let mut input = Vec::new();
    for line in lines {
        input.extend_from_slice(line.to_string().as_bytes());
        input.push(b'\n');
    }
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&input)
            .await
            .context("writing the events")?;
    }
    let output = child
        .wait_with_output()
        .await
        .context("waiting for Python")?;
    if !output.status.success() {
        anyhow::bail!(
            "{} could not run the provider's watcher: {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    parse(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("reading what {} printed", python.display()))
}

fn parse(stdout: &str) -> anyhow::Result<WatcherReport> {
    // Airflow 3 logs to stdout: only JSON objects are the script's.
    let mut values = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(Value::is_object);
    let versions = values.next().context("no versions line")?;
    let text = |v: &Value, field: &str| v[field].as_str().unwrap_or_default().to_owned();
    let mut report = WatcherReport {
        airflow: text(&versions, "airflow"),
        provider: text(&versions, "provider"),
        reported: BTreeMap::new(),
    };
    for value in values {
        let states = value["reported"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| Reported {
                pod: text(r, "pod"),
                state: r["state"].as_str().map(str::to_owned),
            })
            .collect();
        report
            .reported
            .entry(text(&value, "story"))
            .or_default()
            .insert(text(&value, "scheduler"), states);
    }
    Ok(report)
}

impl WatcherReport {
    /// One story's line: `Airflow 2.10.5 (cncf.kubernetes 10.10.0): scheduler 1: adopted
    /// (pod); scheduler 2: nothing`.
    pub fn line(&self, story: &str) -> String {
        let schedulers = self
            .reported
            .get(story)
            .map(|by_scheduler| {
                by_scheduler
                    .iter()
                    .map(|(scheduler, states)| {
                        let said = if states.is_empty() {
                            "nothing".to_owned()
                        } else {
                            states
                                .iter()
                                .map(|r| {
                                    let state = r.state.as_deref().unwrap_or("completed");
                                    format!("{state} ({})", r.pod)
                                })
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        format!("scheduler {scheduler}: {said}")
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_else(|| "no events".to_owned());
        format!(
            "Airflow {} (cncf.kubernetes {}): {schedulers}",
            self.airflow, self.provider
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_output_reads_into_lines() {
        let stdout = "2026-12-01 [info] some Airflow log line\n\
            {\"airflow\": \"3.1.8\", \"provider\": \"10.25.0\"}\n\
            {\"story\": \"adopted\", \"scheduler\": \"1\", \"reported\": [{\"pod\": \"a-1\", \"state\": \"adopted\"}]}\n\
            {\"story\": \"adopted\", \"scheduler\": \"2\", \"reported\": []}\n\
            {\"story\": \"fine\", \"scheduler\": \"1\", \"reported\": [{\"pod\": \"f-1\", \"state\": null}]}\n";
        let report = parse(stdout).unwrap();
        assert_eq!(
            report.line("adopted"),
            "Airflow 3.1.8 (cncf.kubernetes 10.25.0): scheduler 1: adopted (a-1); scheduler 2: nothing"
        );
        assert_eq!(
            report.line("fine"),
            "Airflow 3.1.8 (cncf.kubernetes 10.25.0): scheduler 1: completed (f-1)"
        );
        assert!(parse("no json here").is_err());
    }
}
