//! `podstream demo --airflow`: the seed stories played by real Airflow schedulers on the
//! simulator, each twice: once with the stock KubernetesExecutor (its own label-scoped pod
//! watch), once with podstream-airflow's `PodstreamKubernetesExecutor` beside `podstream run
//! --task-failures executor`. It prints per story what the stock executor did beside what
//! podstream did, with podstream's pods/TI timeline (and the stock one where they differ), and
//! exits 0 only if every story ended right with podstream.
//!
//! The stage (PostgreSQL from the cached dump, `podstream sim --kubelet`, Airflow's own
//! components) is `podstream_stage`'s, the one the tests use; it needs a checkout after
//! `scripts/setup.sh`.

use std::path::Path;
use std::thread;

use anyhow::{Context, bail};
use async_nats::jetstream;
use podstream_bus::BusConfig;
use podstream_stage::airflow::Airflow;
use podstream_stage::real_airflow::Executor;
use podstream_stage::stories::{self, Story};

use crate::history::replay;
use crate::history::timeline::Timeline;
use crate::history::timeline_page::{self, Part};

/// What one play of a story came to.
struct Played {
    /// One line: the run, the task's last try, the callbacks; or why the play broke off.
    outcome: String,
    timeline: String,
    /// With podstream: its history read back from the nats-server, or why it could not be.
    history: Option<Result<Timeline, String>>,
    /// With podstream: whether it ended right, and if not, why.
    verdict: Result<(), String>,
}

/// Plays every story (or those `only` numbers, from 1) with both executors on Airflow `line`
/// and prints the report, and with `html` writes podstream's history of each story there as a
/// timeline page; `Ok(true)` when every story played ended right with podstream.
pub fn run(line: &str, only: &[u8], html: Option<&Path>) -> anyhow::Result<bool> {
    let Some(airflow) = Airflow::find(line) else {
        let lines: Vec<&str> = Airflow::all().iter().map(|a| a.short()).collect();
        bail!(
            "no Airflow release line {line} (sink/airflow-versions.tsv has {})",
            lines.join(", ")
        );
    };
    airflow.installed().map_err(anyhow::Error::msg)?;
    if let Some(unknown) = only
        .iter()
        .find(|&&n| n == 0 || usize::from(n) > Story::ALL.len())
    {
        bail!(
            "there is no story {unknown}: the stories are numbered 1 to {}",
            Story::ALL.len()
        );
    }
    let binary = std::env::current_exe().context("finding the podstream binary")?;
    podstream_stage::use_podstream_binary(binary);

    let release = airflow.0;
    println!(
        "Airflow {} (cncf.kubernetes {}) on the simulator: each seed story played by real \
         schedulers, with the stock executor and with podstream's (both at once, a few minutes)\n",
        release.release, release.kubernetes_provider
    );
    let mut all_right = true;
    let mut histories = Vec::new();
    for (number, story) in Story::ALL.into_iter().enumerate() {
        if !only.is_empty() && !only.iter().any(|&n| usize::from(n) == number + 1) {
            continue;
        }
        let (stock, podstream) = play_both(airflow, story);
        all_right &= podstream.verdict.is_ok();
        print_story(number + 1, story, &stock, &podstream);
        histories.push((number + 1, story, podstream));
    }
    if let Some(file) = html {
        write_page(file, release.release, &histories)?;
        println!(
            "The stories' timelines with podstream are in {}.",
            file.display()
        );
    }
    if all_right {
        println!(
            "Every story ended right with podstream: no running try was failed, reset or retried, \
             and an outcome reached the scheduler that adopted the task."
        );
    } else {
        println!("Some story did not end right with podstream (see above).");
    }
    Ok(all_right)
}

/// Plays `story` with the stock executor and with podstream's at once, each on a thread of
/// its own: a stage that breaks off panics (as in a test), and the panic becomes that play's
/// outcome.
fn play_both(airflow: Airflow, story: Story) -> (Played, Played) {
    thread::scope(|scope| {
        let stock = scope.spawn(|| play(airflow, story, Executor::Stock));
        let podstream = scope.spawn(|| play(airflow, story, Executor::Podstream));
        (
            stock.join().unwrap_or_else(|panic| broke_off(&*panic)),
            podstream.join().unwrap_or_else(|panic| broke_off(&*panic)),
        )
    })
}

fn broke_off(panic: &(dyn std::any::Any + Send)) -> Played {
    Played {
        outcome: format!("broke off: {}", panic_text(panic)),
        timeline: String::new(),
        history: None,
        verdict: Err("the play broke off".to_owned()),
    }
}

fn play(airflow: Airflow, story: Story, executor: Executor) -> Played {
    let (real, state) = stories::play(airflow, executor, story);
    let verdict = match executor {
        // Why a pod failed, where one did: what the story's outcome alone cannot say.
        Executor::Podstream => stories::ended_right(&real, &state, story)
            .map_err(|why| format!("{why}\n{}", real.failed_pods())),
        // The demo plays the stock executor and podstream's own stage, never an install's.
        Executor::Stock | Executor::Sink | Executor::Installed => Ok(()),
    };
    Played {
        outcome: stories::outcome(&real, &state),
        timeline: real.timeline(),
        history: real
            .nats_url()
            .map(|url| history(&url).map_err(|e| format!("{e:#}"))),
        verdict,
    }
}

/// Everything podstream streamed during a play, read while its nats-server still runs.
fn history(nats_url: &str) -> anyhow::Result<Timeline> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a Tokio runtime")?;
    runtime.block_on(async {
        let client = podstream_bus::connect(
            nats_url,
            &podstream_bus::NatsSecurity::default(),
            "podstream-demo",
        )
        .await
        .with_context(|| {
            format!(
                "connecting to {}",
                podstream_bus::connect::redacted(nats_url)
            )
        })?;
        let subjects = BusConfig::at(nats_url).subjects()?;
        replay::timeline_of(&jetstream::new(client), &subjects).await
    })
}

/// One page, a part per story: podstream's timeline of it, or why there is none.
fn write_page(file: &Path, release: &str, plays: &[(usize, Story, Played)]) -> anyhow::Result<()> {
    let nothing = Timeline::new();
    let parts: Vec<Part<'_>> = plays
        .iter()
        .map(|(number, story, played)| {
            let (timeline, missing) = match &played.history {
                Some(Ok(timeline)) => (timeline, String::new()),
                Some(Err(why)) => (&nothing, format!(" (no history: {why})")),
                None => (&nothing, " (no history: the play broke off)".to_owned()),
            };
            Part {
                heading: Some(format!(
                    "{number}. {} ({}): {}{missing}",
                    story.title(),
                    story.seed(),
                    played.outcome
                )),
                timeline,
            }
        })
        .collect();
    let title = format!("podstream demo --airflow: the seed stories on Airflow {release}");
    let page = timeline_page::render_parts(&parts, &title, "");
    std::fs::write(file, page).with_context(|| format!("writing {}", file.display()))
}

fn print_story(number: usize, story: Story, stock: &Played, podstream: &Played) {
    println!("{number}. {} ({})", story.title(), story.seed());
    println!("   stock executor:     {}", stock.outcome);
    let verdict = match &podstream.verdict {
        Ok(()) => "OK".to_owned(),
        Err(why) => format!("WRONG: {why}"),
    };
    println!("   podstream:          {}  {verdict}", podstream.outcome);
    println!(
        "   first pod's end to the TI's change: stock executor {}, podstream {}",
        detection(stock),
        detection(podstream)
    );
    println!("   timeline with podstream:");
    print_indented(&podstream.timeline);
    if stock.outcome != podstream.outcome {
        println!("   timeline with the stock executor:");
        print_indented(&stock.timeline);
    }
    println!();
}

/// The detection latency of a play, or why there is none.
fn detection(played: &Played) -> String {
    stories::detection_seconds(&played.timeline).map_or_else(
        || "none (the pod did not end first)".to_owned(),
        |seconds| format!("{seconds:.1} s"),
    )
}

fn print_indented(text: &str) {
    for line in text.lines() {
        println!("     {line}");
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic");
    // The stage's panics carry the timeline and the logs: the first line says what broke.
    text.lines().next().unwrap_or(text).to_owned()
}
