//! `podstream demo`: the newcomer's first run. Everything embedded: the Kubernetes simulator,
//! a local `nats-server`, a copy of an Airflow 2.10 SQLite DB made by `airflow db migrate`, and
//! the pipeline in process. It plays the three seed stories plus a real failure and a success,
//! then reports, per task, its pods, podstream's commands, the pods its collector deleted and
//! the TI row, next to what
//! Airflow's own label-scoped watcher reports for the same events (run from each installed
//! Airflow venv, see `demo_watcher.rs`). Exit 0 only if every story ended as docs/semantics.md says.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream;
use clap::Args;
use podstream_bus::BusConfig;
use podstream_bus::local_server::{LocalServer, find_binary, free_port};
use podstream_collector::collected::Collected;
use podstream_collector::rule::Settings;
use podstream_collector::service::CollectConfig;
use podstream_ingest::service::IngestConfig;
use podstream_processor::service::ProcessConfig;
use podstream_proto::subject::{Stream, Subjects};
use podstream_proto::{Command, TaskKey};
use podstream_sim::{Cluster, Server, SimConfig, WorkerPod};
use podstream_sink::Database;
use podstream_sink::seed::{SeedTi, TiRow};
use podstream_sink::service::SinkConfig;
use prost::Message as _;

use crate::stages::pipeline::{Pipeline, PipelineConfig};
use crate::world::demo_airflow;
use crate::world::demo_watcher::{self, WatcherReport};

const DAG: &str = "podstream_demo";
const RUN: &str = "manual__2026-11-30";
const NS: &str = "airflow";

/// Flags of `podstream demo`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  podstream demo\n  scripts/setup.sh && cargo run --release -- demo    # from a fresh checkout\n  podstream demo --airflow                           # real Airflow 3.1 schedulers, stock beside podstream"
)]
pub struct DemoArgs {
    /// An Airflow 2.10 SQLite metadata DB made by `airflow db migrate` to copy (never
    /// modified); by default the one scripts/setup.sh caches in target/airflow-db.
    #[arg(long, env = "PODSTREAM_DEMO_AIRFLOW_DB")]
    pub airflow_db: Option<PathBuf>,
    /// Airflow venvs whose cncf.kubernetes provider's watcher is run over the stories' events
    /// (comma-separated); by default the ones scripts/setup.sh installs in target/tools.
    #[arg(long, env = "PODSTREAM_DEMO_AIRFLOW_VENVS", value_delimiter = ',')]
    pub airflow_venv: Vec<PathBuf>,
    /// Seconds to wait for every story to settle.
    #[arg(long, env = "PODSTREAM_DEMO_TIMEOUT_SECONDS", default_value_t = 180)]
    pub timeout_seconds: u64,
    /// Play the seed stories with real Airflow schedulers instead (PostgreSQL, Airflow's own
    /// components), each with the stock KubernetesExecutor and with podstream-airflow's
    /// executor beside `podstream run`, and print their outcomes side by side (a few minutes;
    /// needs a checkout after scripts/setup.sh).
    #[arg(long, env = "PODSTREAM_DEMO_AIRFLOW")]
    pub airflow: bool,
    /// With --airflow: the Airflow release line to run, from sink/airflow-versions.tsv.
    #[arg(long, env = "PODSTREAM_DEMO_AIRFLOW_VERSION", default_value = "3.1")]
    pub airflow_version: String,
    /// With --airflow: play only the story of this number, as the report numbers them
    /// (repeatable) [default: every story].
    #[arg(
        long = "story",
        env = "PODSTREAM_DEMO_STORIES",
        value_name = "N",
        value_delimiter = ','
    )]
    pub stories: Vec<u8>,
    /// Also write the stories' timeline as one HTML page to FILE (a lane per story; with
    /// --airflow a part per story, each on its own time axis), as `podstream replay --html`
    /// draws it.
    #[arg(long, env = "PODSTREAM_DEMO_HTML", value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// One story: a task instance, what happens to its pods, and how it must end.
struct Story {
    title: &'static str,
    task_id: &'static str,
    max_tries: i64,
    /// What happens to the pods, in words.
    pods: &'static str,
    /// Where stock Airflow's outcome is decided beyond its watcher, when it is.
    scheduler_note: Option<&'static str>,
    /// The TI state and `queued_by_job_id` docs/semantics.md asks for.
    expected: (&'static str, i64),
    /// The kinds of the commands podstream must decide, in order.
    decisions: &'static [&'static str],
    /// The pods the collector must delete, and why.
    collected: &'static [(&'static str, &'static str)],
}

const STORIES: &[Story] = &[
    Story {
        title: "relabel during adoption (seed: abrupt pod deletes)",
        task_id: "adopted",
        max_tries: 1,
        pods: "pod Running under scheduler 1; scheduler 2 adopts it: label airflow-worker 1→2",
        scheduler_note: None,
        expected: ("running", 2),
        decisions: &["running", "transfer"],
        collected: &[],
    },
    Story {
        title: "scheduler restart with running pods (seed: reset as orphaned)",
        task_id: "survivor",
        max_tries: 1,
        pods: "pod Running under scheduler 1; it restarts as job 3 and adopts: label 1→3; the pod succeeds",
        scheduler_note: Some(
            "the watcher is not where this goes wrong: the stock scheduler adopts the pod by relabelling it after a restart, and resets the running TI only when its executor routing no longer matches the TI's queue (docs/stock-airflow.md, story c)",
        ),
        expected: ("running", 3),
        decisions: &["running", "transfer", "completed"],
        collected: &[("survivor-1", "finished")],
    },
    Story {
        title: "two driver pods for one task (seed: reattachment fails)",
        task_id: "twins",
        max_tries: 1,
        pods: "older pod Running; a newer pod for the same TI starts, then fails; it is collected after the grace period",
        scheduler_note: Some(
            "the watcher reports the newer pod's failure for the TI; Airflow 2.x's scheduler ignores it for a running task, Airflow 3.x's fails the live try and retries it (docs/stock-airflow.md, story d)",
        ),
        expected: ("running", 1),
        decisions: &["running", "duplicate"],
        collected: &[("twins-2", "duplicate")],
    },
    Story {
        title: "a real failure: running pod deleted",
        task_id: "broken",
        max_tries: 1,
        pods: "pod Running; deleted with a grace period (deletionTimestamp, then DELETED)",
        scheduler_note: None,
        expected: ("up_for_retry", 1),
        decisions: &["running", "fail"],
        collected: &[],
    },
    Story {
        title: "a success",
        task_id: "fine",
        max_tries: 1,
        pods: "pod Running, then Succeeded",
        scheduler_note: None,
        expected: ("running", 1),
        decisions: &["running", "completed"],
        collected: &[("fine-1", "finished")],
    },
];

/// Runs the demo; exits non-zero when a story ended wrong.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if args.airflow {
        return match demo_airflow::run(&args.airflow_version, &args.stories, args.html.as_deref())?
        {
            true => Ok(()),
            false => anyhow::bail!("a story did not end right with podstream"),
        };
    }
    let template = match &args.airflow_db {
        Some(path) => path.clone(),
        None => default_airflow_db().context(
            "no Airflow 2.10 SQLite DB to copy: run scripts/setup.sh (it migrates one with Airflow itself into target/airflow-db) or pass --airflow-db",
        )?,
    };
    let dir = tempfile::tempdir().context("making a temp dir")?;
    let db_path = dir.path().join("airflow.db");
    std::fs::copy(&template, &db_path)
        .with_context(|| format!("copying {}", template.display()))?;
    let mut nats =
        LocalServer::start_with_token(&find_binary(), &dir.path().join("nats"), free_port()?)
            .context("starting a local nats-server")?;
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    let result = runtime.block_on(play(args, &db_path, &nats.client_url()));
    nats.stop();
    let passed = result?;
    if !passed {
        anyhow::bail!("some stories did not end as semantics.md says (see above)");
    }
    Ok(())
}

/// The DB `scripts/setup.sh` caches, found above the running executable (`target/`).
fn default_airflow_db() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors().find_map(|dir| {
        let candidate = dir.join("airflow-db/airflow-2.10.sqlite");
        candidate.is_file().then_some(candidate)
    })
}

async fn play(args: &DemoArgs, db_path: &Path, nats_url: &str) -> anyhow::Result<bool> {
    let db_url = format!("sqlite://{}", db_path.display());
    let db = Database::connect(&db_url).await?;
    let tis: Vec<SeedTi<'_>> = STORIES
        .iter()
        .map(|s| SeedTi::running(s.task_id, s.max_tries))
        .collect();
    db.seed(DAG, RUN, &tis).await?;

    let listen: SocketAddr = "127.0.0.1:0".parse().context("listen address")?;
    let sim = Server::start(
        listen,
        SimConfig {
            namespaces: vec![NS.into()],
            ..SimConfig::default()
        },
    )
    .await?;
    let kube = kube_client(&sim).await?;
    let settings = config(nats_url);
    let subjects = settings.bus.subjects()?;
    let pipeline = Pipeline::start(settings.clone(), kube, db.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(pipeline.run_until(async move {
        let _ = stopped.await;
    }));

    eprintln!(
        "podstream demo: simulator at {}, nats-server at {}, Airflow DB {}",
        sim.url(),
        podstream_bus::connect::redacted(nats_url),
        db_path.display()
    );
    scenario(sim.cluster()).await?;

    // Settled: every story ended right and nothing is left to decide or apply (checked
    // twice, so a late wrong command cannot slip past), or the time is up.
    let client = podstream_bus::connect::connect(
        nats_url,
        &podstream_bus::NatsSecurity::default(),
        "podstream-demo",
    )
    .await?;
    let js = jetstream::new(client);
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let mut idle_polls = 0;
    let (rows, commands, collected) = loop {
        let rows = read_rows(&db).await?;
        let commands = read_commands(&js, &subjects).await?;
        let collected = read_collected(&js, &subjects).await?;
        let done = STORIES
            .iter()
            .all(|s| ends_right(s, rows.get(s.task_id), &commands, &collected));
        idle_polls = if done && idle(&js, &subjects, &settings).await {
            idle_polls + 1
        } else {
            0
        };
        if idle_polls >= 2 || Instant::now() > deadline {
            break (rows, commands, collected);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let _ = stop.send(());
    running.await.context("the pipeline panicked")??;
    if let Some(file) = &args.html {
        let timeline = crate::history::replay::timeline_of(&js, &subjects).await?;
        let page =
            crate::history::timeline_page::render(&timeline, "podstream demo: the stories", "");
        std::fs::write(file, page).with_context(|| format!("writing {}", file.display()))?;
        eprintln!(
            "podstream demo: the stories' timeline is in {}",
            file.display()
        );
    }
    let collected_uids = collected.iter().map(|c| c.pod.uid.clone()).collect();
    let watchers = airflow_watchers(args, sim.cluster(), &collected_uids).await;
    sim.shutdown().await;
    Ok(report(&rows, &commands, &collected, &watchers))
}

/// What each Airflow venv's own watcher reported, or why it could not be asked.
async fn airflow_watchers(
    args: &DemoArgs,
    cluster: &Cluster,
    collected: &std::collections::BTreeSet<String>,
) -> Vec<Result<WatcherReport, String>> {
    let venvs = if args.airflow_venv.is_empty() {
        demo_watcher::installed_venvs()
    } else {
        args.airflow_venv.clone()
    };
    if venvs.is_empty() {
        return vec![Err(
            "no Airflow venv found (scripts/setup.sh installs them; or --airflow-venv DIR)".into(),
        )];
    }
    let lines = match demo_watcher::watch_lines(cluster, collected) {
        Ok(lines) => lines,
        Err(error) => return vec![Err(format!("{error:#}"))],
    };
    let runs = venvs.iter().map(|venv| demo_watcher::report(venv, &lines));
    futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.map_err(|e| format!("{e:#}")))
        .collect()
}

fn config(nats_url: &str) -> PipelineConfig {
    PipelineConfig {
        bus: BusConfig::at(nats_url),
        ingest: IngestConfig {
            namespaces: vec![NS.into()],
            ..IngestConfig::default()
        },
        process: ProcessConfig::default(),
        sink: SinkConfig::default(),
        // Airflow's own pod settings, with a grace period a newcomer waits out.
        collect: Some(CollectConfig {
            settings: Settings {
                grace: COLLECT_GRACE,
                ..Settings::default()
            },
            ..CollectConfig::default()
        }),
    }
}

/// How long the demo's collector leaves a losing duplicate.
const COLLECT_GRACE: Duration = Duration::from_secs(2);

async fn kube_client(sim: &Server) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&sim.kubeconfig())?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// Plays the stories on the simulator, as Kubernetes and the schedulers would.
async fn scenario(cluster: &Cluster) -> anyhow::Result<()> {
    let pause = || tokio::time::sleep(Duration::from_millis(300));
    let create = |name: &str, owner: &str, task_id: &str| -> anyhow::Result<()> {
        cluster.create_pod(WorkerPod::new(name, owner, DAG, task_id, RUN).to_json())?;
        Ok(())
    };
    for (pod, task) in [
        ("adopted-1", "adopted"),
        ("survivor-1", "survivor"),
        ("twins-1", "twins"),
        ("broken-1", "broken"),
        ("fine-1", "fine"),
    ] {
        create(pod, "1", task)?;
        cluster.set_phase(NS, pod, "Running")?;
    }
    pause().await;
    // 1. Scheduler 2 adopts scheduler 1's pod while it runs.
    cluster.relabel(NS, "adopted-1", "airflow-worker", Some("2"))?;
    // 2. Scheduler 1 restarts as job 3 and adopts its own pods; the task then finishes.
    cluster.relabel(NS, "survivor-1", "airflow-worker", Some("3"))?;
    pause().await;
    cluster.set_phase(NS, "survivor-1", "Succeeded")?;
    // 3. A second pod for the running TI starts, then fails.
    create("twins-2", "1", "twins")?;
    pause().await;
    cluster.set_phase(NS, "twins-2", "Failed")?;
    // 4. The running pod is deleted (node drain, eviction, a human).
    cluster.delete_pod(NS, "broken-1", Some(1))?;
    // 5. The task succeeds.
    cluster.set_phase(NS, "fine-1", "Succeeded")?;
    Ok(())
}

fn ends_right(
    story: &Story,
    row: Option<&TiRow>,
    commands: &[Command],
    collected: &[Collected],
) -> bool {
    let row_right = row.is_some_and(|row| {
        row.state == story.expected.0 && row.queued_by_job_id == Some(story.expected.1)
    });
    let mut deleted: Vec<(&str, &str)> = story_collected(story, collected)
        .map(|c| (c.pod.name.as_str(), c.reason.as_str()))
        .collect();
    deleted.sort_unstable();
    row_right
        && decided(story, commands).eq(story.decisions.iter().copied())
        && deleted == story.collected
}

/// The pods of the story's task the collector collected.
fn story_collected<'a>(
    story: &'a Story,
    collected: &'a [Collected],
) -> impl Iterator<Item = &'a Collected> + 'a {
    collected.iter().filter(|c| c.ti.task_id == story.task_id)
}

/// Every pod the collector collected so far, from its bucket.
async fn read_collected(
    js: &jetstream::Context,
    subjects: &Subjects,
) -> anyhow::Result<Vec<Collected>> {
    let bucket = subjects.resource_name(podstream_collector::service::BUCKET_ROLE);
    let Ok(store) = js.get_key_value(&bucket).await else {
        return Ok(Vec::new());
    };
    let mut keys = store.keys().await?;
    let mut collected = Vec::new();
    while let Some(key) = futures::StreamExt::next(&mut keys).await {
        if let Some(value) = store.get(key?).await? {
            collected.push(Collected::decode(&value)?);
        }
    }
    Ok(collected)
}

/// The kinds of the commands decided for the story's task, in order.
fn decided<'a>(
    story: &'a Story,
    commands: &'a [Command],
) -> impl Iterator<Item = &'static str> + 'a {
    story_commands(story, commands).map(|c| c.kind.as_ref().map_or("none", |k| k.name()))
}

fn story_commands<'a>(
    story: &'a Story,
    commands: &'a [Command],
) -> impl Iterator<Item = &'a Command> + 'a {
    commands
        .iter()
        .filter(|c| c.task.as_ref().is_some_and(|t| t.task_id == story.task_id))
}

/// Whether the processor and the sink have nothing pending.
async fn idle(js: &jetstream::Context, subjects: &Subjects, settings: &PipelineConfig) -> bool {
    for (stream, consumer) in [
        (Stream::PodEvents, &settings.process.consumer),
        (Stream::Commands, &settings.sink.consumer),
    ] {
        let Ok(stream) = js.get_stream(subjects.stream_name(stream)).await else {
            return false;
        };
        let Ok(mut consumer) = stream
            .get_consumer::<jetstream::consumer::pull::Config>(consumer)
            .await
        else {
            return false;
        };
        match consumer.info().await {
            Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
            _ => return false,
        }
    }
    true
}

async fn read_rows(db: &Database) -> anyhow::Result<BTreeMap<&'static str, TiRow>> {
    let mut rows = BTreeMap::new();
    for story in STORIES {
        let key = TaskKey {
            dag_id: DAG.into(),
            task_id: story.task_id.into(),
            run_id: RUN.into(),
            map_index: -1,
            try_number: 1,
            ..TaskKey::default()
        };
        if let Some(row) = db.task_instance(&key).await? {
            rows.insert(story.task_id, row);
        }
    }
    Ok(rows)
}

/// Every command the processor published, in order, once (not a transfer's copy for the
/// previous owner).
async fn read_commands(
    js: &jetstream::Context,
    subjects: &Subjects,
) -> anyhow::Result<Vec<Command>> {
    let Ok(mut stream) = js.get_stream(subjects.stream_name(Stream::Commands)).await else {
        return Ok(Vec::new());
    };
    let state = stream.info().await?.state.clone();
    let mut history = podstream_bus::history::History::new(
        &js.client(),
        &subjects.stream_name(Stream::Commands),
        podstream_bus::history::Start::Sequence(state.first_sequence),
        state.last_sequence,
    );
    let mut commands = Vec::new();
    while let Some(message) = history.next().await? {
        if !podstream_bus::role::is_left_notice(Some(&message.headers)) {
            commands.push(Command::decode(message.payload.as_ref())?);
        }
    }
    Ok(commands)
}

fn describe(command: &Command) -> String {
    use podstream_proto::v1::command::Kind;
    let pod = command.pod.as_ref().map_or("?", |p| p.name.as_str());
    match &command.kind {
        Some(Kind::Transfer(t)) => format!("transfer {}→{} ({pod})", t.from, t.to),
        Some(Kind::Fail(f)) => format!("fail: {} ({pod})", f.reason),
        Some(Kind::Lost(l)) => format!("lost: {} ({pod})", l.reason),
        Some(Kind::Duplicate(d)) => format!(
            "duplicate: {} drives, others {}",
            d.chosen.as_ref().map_or("?", |p| p.name.as_str()),
            d.others
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(kind) => format!("{} ({pod}, owner {})", kind.name(), command.owner),
        None => "?".into(),
    }
}

/// Prints the report; true when every story ended right.
fn report(
    rows: &BTreeMap<&'static str, TiRow>,
    commands: &[Command],
    collected: &[Collected],
    watchers: &[Result<WatcherReport, String>],
) -> bool {
    let mut all = true;
    println!(
        "podstream demo: {} stories, DAG {DAG}, run {RUN}\n",
        STORIES.len()
    );
    for (n, story) in STORIES.iter().enumerate() {
        let decided: Vec<String> = story_commands(story, commands).map(describe).collect();
        let row = rows.get(story.task_id);
        let right = ends_right(story, row, commands, collected);
        all &= right;
        let now = row.map_or("missing".to_owned(), |r| {
            format!(
                "{}, queued_by_job_id {}",
                r.state,
                r.queued_by_job_id.map_or("NULL".into(), |j| j.to_string())
            )
        });
        println!("{}. {} [{}.{}]", n + 1, story.title, DAG, story.task_id);
        println!("   pods:          {}", story.pods);
        println!("   podstream:     {}", decided.join("; "));
        let deleted: Vec<String> = story_collected(story, collected)
            .map(|c| match &c.driver {
                Some(driver) => format!(
                    "{} {} ({}; {} drives)",
                    c.action, c.pod.name, c.reason, driver.name
                ),
                None => format!("{} {} ({})", c.action, c.pod.name, c.reason),
            })
            .collect();
        if !deleted.is_empty() {
            println!("   collector:     {}", deleted.join("; "));
        }
        println!(
            "   TI now:        {now}  {} (expected {}, queued_by_job_id {}; decisions {}{})",
            if right { "OK" } else { "WRONG" },
            story.expected.0,
            story.expected.1,
            story.decisions.join(", "),
            if story.collected.is_empty() {
                String::new()
            } else {
                let pods: Vec<&str> = story.collected.iter().map(|(pod, _)| *pod).collect();
                format!("; collected {}", pods.join(", "))
            }
        );
        for watcher in watchers {
            match watcher {
                Ok(report) => println!("   label watcher: {}", report.line(story.task_id)),
                Err(why) => println!("   label watcher: not checked: {why}"),
            }
        }
        if let Some(note) = story.scheduler_note {
            println!("   scheduler:     {note}");
        }
        println!();
    }
    println!(
        "{}",
        if all {
            "every story ended as semantics.md says"
        } else {
            "SOME STORIES ENDED WRONG"
        }
    );
    all
}
