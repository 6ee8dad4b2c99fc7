//! The seed stories played by real Airflow schedulers on the simulator: one long task
//! (`podstream_story.works`), and while it runs (b) a second scheduler adopts it while the
//! first is stopped past its health threshold, (c) the scheduler is killed -9 and restarted,
//! (d) a second pod for the running task appears and fails; and while the scheduler is killed
//! the pod (e) dies, (f) succeeds or (g) is deleted before a new scheduler starts, or (h) the
//! scheduler is killed after its executor took the pod's failure and before its loop committed
//! it (an outcome must reach the scheduler that adopts the task); and (i) a forged copy of the
//! task's pod fails (a pod anyone can create must not fail a running task); before the task
//! runs, (j) a copy of its pod succeeds first or (k) a copy fails while its pod waits (a copy
//! must neither mute nor fail a try). Played with the stock executor
//! (`tests/tests/airflow/stock_airflow.rs`, the baselines of docs/stock-airflow.md), with podstream's
//! (`tests/tests/airflow/podstream_stories.rs`), and side by side by `podstream demo --airflow`.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use podstream_proto::signature::SIGNATURE_ANNOTATION;
use podstream_proto::{PodRef, TaskKey};

use crate::airflow::Airflow;
use crate::real_airflow::{Dags, Executor, Kubernetes, RealAirflow};

/// The story DAG.
pub const DAG: &str = "podstream_story";
/// How long any step of a story may take.
pub const WAIT: Duration = Duration::from_secs(240);
/// The callback of a story task whose first try succeeds.
pub const SUCCESS_ON_THE_FIRST_TRY: &str = "success.podstream_story.works.1";
/// The callback of a story task whose first try failed and will be retried.
pub const RETRY_OF_THE_FIRST_TRY: &str = "retry.podstream_story.works.1";
/// The callback of a story task whose second try succeeds.
pub const SUCCESS_ON_THE_SECOND_TRY: &str = "success.podstream_story.works.2";

/// A seed story: what happens while the story task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Story {
    /// (b) A second scheduler adopts the task: its pod is relabelled (seed 000).
    Adoption,
    /// (c) The scheduler is killed -9 and restarted (seed 001).
    Restart,
    /// (d) A second pod for the running task appears and fails (seed 003).
    SecondPod,
    /// (e) The scheduler is killed -9; the task's pod dies (its task reports nothing) while
    /// no scheduler runs; a new scheduler starts (seed 001, with a pod that does not wait).
    DiesWhileDown,
    /// (f) The same, with a task that succeeds while no scheduler runs.
    SucceedsWhileDown,
    /// (g) The same, with the task's pod deleted while no scheduler runs.
    DeletedWhileDown,
    /// (h) The task's pod dies; the scheduler is killed -9 right after its executor took the
    /// failure, before the scheduler loop committed it; a new scheduler starts.
    KilledAfterTakingAFail,
    /// (i) A forged pod, a copy of the task's pod under another `task_instance_id` (anyone
    /// who can create pods in the namespace can make one), fails while the task runs.
    ForgedPod,
    /// (j) Before the task's pod exists, a copy of the pod it will have (its predictable
    /// names, try 1, the scheduler's job id as owner) succeeds at once; then the real pod
    /// dies. With podstream's signed pods the copy settles nothing: the real failure fails
    /// try 1 once and try 2 succeeds. Not one of [`Story::ALL`]: it needs signed pods.
    CopyFirst,
    /// (k) While the task's pod waits Pending for room on the node, a copy of it stays
    /// Pending too, one container unable to pull its image and another ended with `Error`;
    /// then the real pod runs. Its act comes before the first try runs. With podstream's
    /// signed pods the copy fails nothing: try 1 succeeds. Not one of [`Story::ALL`]: it
    /// needs signed pods.
    PendingCopy,
}

impl Story {
    /// Every story: the seeds' order, then what happens while the scheduler is down.
    pub const ALL: [Story; 8] = [
        Story::Adoption,
        Story::Restart,
        Story::SecondPod,
        Story::DiesWhileDown,
        Story::SucceedsWhileDown,
        Story::DeletedWhileDown,
        Story::KilledAfterTakingAFail,
        Story::ForgedPod,
    ];

    /// What happens, in a few words.
    pub fn title(self) -> &'static str {
        match self {
            Story::Adoption => "adoption by a second scheduler",
            Story::Restart => "scheduler killed -9 and restarted",
            Story::SecondPod => "a second pod for the running task fails",
            Story::DiesWhileDown => "the task's pod dies while its scheduler is down",
            Story::SucceedsWhileDown => "the task succeeds while its scheduler is down",
            Story::DeletedWhileDown => "the task's pod is deleted while its scheduler is down",
            Story::KilledAfterTakingAFail => {
                "the task's pod dies and its scheduler is down before it committed the failure"
            }
            Story::ForgedPod => "a forged copy of the task's pod fails",
            Story::CopyFirst => "a copy of the task's pod succeeds before the real pod exists",
            Story::PendingCopy => "a copy of the waiting task's pod fails with reason Error",
        }
    }

    /// The seed discussion the story comes from, and what it reported.
    pub fn seed(self) -> &'static str {
        match self {
            Story::Adoption => "seed 000: a relabel during adoption kills live tasks",
            Story::Restart => "seed 001: a restarted scheduler resets running tasks as orphans",
            Story::SecondPod => "seed 003: two pods for one task make reattachment fail",
            Story::DiesWhileDown
            | Story::SucceedsWhileDown
            | Story::DeletedWhileDown
            | Story::KilledAfterTakingAFail => {
                "seed 001, the pod not waiting: an outcome must reach the scheduler that adopts the task"
            }
            Story::ForgedPod => {
                "trust: a pod anyone in the namespace can create must not fail a running task"
            }
            Story::CopyFirst => "trust: a copy that ends first must not mute the real pod",
            Story::PendingCopy => "trust: a pod podstream cannot bind must not fail a queued try",
        }
    }

    /// Plays the story's act on a running task; `Err` says why the act could not be played
    /// out (the task's first pod ended on its own meanwhile).
    pub fn act(self, real: &mut RealAirflow) -> Result<(), String> {
        match self {
            Story::Adoption => adopt_by_a_second_scheduler(real),
            Story::Restart => {
                kill_and_restart_the_scheduler(real);
                Ok(())
            }
            Story::SecondPod => {
                start_a_second_pod_that_fails(real);
                Ok(())
            }
            Story::DiesWhileDown => end_the_pod_while_down(real, PodEnding::Dies),
            Story::SucceedsWhileDown => end_the_pod_while_down(real, PodEnding::Succeeds),
            Story::DeletedWhileDown => end_the_pod_while_down(real, PodEnding::Deleted),
            Story::KilledAfterTakingAFail => kill_after_taking_the_failure(real),
            Story::ForgedPod => {
                start_a_forged_pod_that_fails(real);
                Ok(())
            }
            Story::CopyFirst => {
                tell_the_first_try_to_die(real);
                Ok(())
            }
            // Played before the first try runs, by `act_once`.
            Story::PendingCopy => Ok(()),
        }
    }

    /// The index of the scheduler the story kills, if it kills one.
    pub fn killed_scheduler(self) -> Option<usize> {
        (self == Story::Restart || self.while_down()).then_some(0)
    }

    /// The try the story task ends on, and its callbacks, when the story ends right with
    /// podstream. Its first try succeeds, unless its pod ended without success while the
    /// scheduler was down: a pod that died is adopted by the next scheduler, which learns
    /// that it failed, fails the try once and retries it; a deleted pod leaves nothing to
    /// adopt, so the next scheduler resets the orphaned TI and Airflow runs it again (try 2,
    /// no failure callback), as it does with the stock executor. On Airflow 2 the deleted
    /// pod's task process takes the SIGTERM as its own failure (try 1 `up_for_retry`, the
    /// retry callback) before any scheduler runs, with either executor.
    pub fn right_ending(self, airflow: Airflow) -> (&'static str, &'static [&'static str]) {
        match self {
            Story::DiesWhileDown | Story::KilledAfterTakingAFail | Story::CopyFirst => {
                ("2", &[RETRY_OF_THE_FIRST_TRY, SUCCESS_ON_THE_SECOND_TRY])
            }
            Story::DeletedWhileDown if !airflow.is_3() => {
                ("2", &[RETRY_OF_THE_FIRST_TRY, SUCCESS_ON_THE_SECOND_TRY])
            }
            Story::DeletedWhileDown => ("2", &[SUCCESS_ON_THE_SECOND_TRY]),
            _ => ("1", &[SUCCESS_ON_THE_FIRST_TRY]),
        }
    }

    /// Whether the first pod's outcome is left to the next scheduler: the pod ended while its
    /// scheduler was down, or before the scheduler committed what it took of it.
    pub fn while_down(self) -> bool {
        matches!(
            self,
            Story::DiesWhileDown
                | Story::SucceedsWhileDown
                | Story::DeletedWhileDown
                | Story::KilledAfterTakingAFail
        )
    }
}

/// The story task's (try_number, state, queued_by_job_id).
pub fn story_ti(real: &RealAirflow) -> Option<(String, String, String)> {
    real.query(
        "SELECT try_number, coalesce(state, 'none'), coalesce(queued_by_job_id::text, '-') \
         FROM task_instance WHERE task_id = 'works'",
    )
    .into_iter()
    .find_map(|row| {
        Some((
            row.first()?.clone(),
            row.get(1)?.clone(),
            row.get(2)?.clone(),
        ))
    })
}

/// The story task's own pods for try `try_number` (never a copy a story made), as listed.
fn own_pods(real: &RealAirflow, try_number: &str) -> Vec<Value> {
    real.pods()
        .into_iter()
        .filter(|pod| {
            let annotations = &pod["metadata"]["annotations"];
            annotations["task_id"] == "works"
                && annotations["try_number"] == try_number
                && !is_planted_copy(pod)
        })
        .collect()
}

/// The phase of the story task's pod for try `try_number`, if it is there.
pub fn pod_phase(real: &RealAirflow, try_number: &str) -> Option<String> {
    own_pods(real, try_number)
        .first()
        .and_then(|pod| pod["status"]["phase"].as_str().map(str::to_owned))
}

/// What a story's act disrupts holds: the task runs its first try, in a running pod.
fn first_try_running(real: &RealAirflow) -> bool {
    story_ti(real).is_some_and(|(try_number, state, _)| try_number == "1" && state == "running")
        && pod_phase(real, "1").as_deref() == Some("Running")
}

/// Why the first try can no longer be what the act disrupts, if it cannot: its pod ended or
/// the task moved past it before the act (then the act would be judged for what it did not
/// cause).
fn precondition_broken(real: &RealAirflow) -> Option<String> {
    if first_pod_ended(real) {
        return Some("the task's first pod ended on its own".to_owned());
    }
    let (try_number, state, _) = story_ti(real)?;
    // Try 0 is a task instance Airflow 2.10+ has not scheduled yet: nothing is broken.
    let past_try_1 = try_number.parse::<u32>().map_or(true, |n| n > 1);
    let try_1_over =
        try_number == "1" && matches!(state.as_str(), "up_for_retry" | "failed" | "success");
    (past_try_1 || try_1_over).then(|| format!("the task is at try {try_number}, {state}"))
}

/// Plays `story` until the task runs its first try, then its act, then waits for the run to
/// end; returns the stage and the run's state. A story whose precondition broke before its
/// act (the first pod failed on its own, say on a loaded machine) is reported, with why the
/// pod failed, and played again once: its outcome would not be the act's.
pub fn play(airflow: Airflow, executor: Executor, story: Story) -> (RealAirflow, String) {
    play_on(airflow, executor, story, Kubernetes::Simulated)
}

/// [`play`] on the Kubernetes given.
pub fn play_on(
    airflow: Airflow,
    executor: Executor,
    story: Story,
    kubernetes: Kubernetes,
) -> (RealAirflow, String) {
    again_once_if_broken(|| play_once(airflow, executor, story, kubernetes))
}

/// `play`'s result, or, when its precondition broke, the result of playing it once more.
///
/// # Panics
/// When the second play breaks too.
fn again_once_if_broken<T>(play: impl Fn() -> Result<T, String>) -> T {
    play().unwrap_or_else(|broken| {
        eprintln!("{broken}\nplaying the story again, once");
        play().unwrap_or_else(|broken| panic!("{broken}"))
    })
}

fn play_once(
    airflow: Airflow,
    executor: Executor,
    story: Story,
    kubernetes: Kubernetes,
) -> Result<(RealAirflow, String), String> {
    let real = act_once(airflow, executor, story, kubernetes)?;
    let state = real.wait_for_run(DAG, WAIT);
    // Give the executor a moment to finish with the pods before the timeline is read.
    std::thread::sleep(Duration::from_secs(3));
    Ok((real, state))
}

/// Plays `story` until the task runs its first try, then its act, on the simulator, and
/// returns the stage at once: for a run that does not end on its own (stock Airflow muted by
/// [`Story::CopyFirst`]'s copy). A broken precondition is played again once, as in [`play`].
pub fn play_act(airflow: Airflow, executor: Executor, story: Story) -> RealAirflow {
    again_once_if_broken(|| act_once(airflow, executor, story, Kubernetes::Simulated))
}

fn act_once(
    airflow: Airflow,
    executor: Executor,
    story: Story,
    kubernetes: Kubernetes,
) -> Result<RealAirflow, String> {
    // (k) needs a node with room for one pod, which a pod of the stage's fills first.
    let kubernetes = match (story, kubernetes) {
        (Story::PendingCopy, Kubernetes::Simulated) => Kubernetes::SimulatedOnePodAtATime,
        (Story::PendingCopy, Kubernetes::Real) => Kubernetes::RealOnePodAtATime,
        _ => kubernetes,
    };
    let mut real = RealAirflow::set_up_on(airflow, Dags::Story, executor, kubernetes);
    let not_played =
        |why: String| format!("{}: {why}", heading(airflow, executor, story, "not played"));
    match story {
        // The real pod cannot come first: no task is queued until the copy has ended.
        Story::CopyFirst => start_with_nothing_queued_until(&mut real, plant_a_copy_that_succeeds)
            .map_err(not_played)?,
        Story::PendingCopy => {
            start_with_nothing_queued_until(&mut real, fill_the_node).map_err(not_played)?;
            // The act is over before the first try runs.
            fail_a_copy_while_the_pod_waits(&mut real).map_err(not_played)?;
            return Ok(real);
        }
        _ => real.start_components(),
    }
    // Why the play says nothing of its act, with what the stage shows.
    let says_nothing = |real: &RealAirflow, why: String, when: &str, state: &str| {
        format!(
            "{}: {why} {when} the act ({}), so the story says nothing of the act\n{}\n{}",
            heading(airflow, executor, story, state),
            story.title(),
            real.failed_pods(),
            real.timeline()
        )
    };
    // The act starts only on a state seen whole: a wait ended by one reading is judged again
    // on a fresh one, so a task between two states never starts the act early.
    loop {
        real.wait_until("the story task to run its first try", WAIT, |real| {
            first_try_running(real) || precondition_broken(real).is_some()
        });
        if first_try_running(&real) {
            break;
        }
        if let Some(why) = precondition_broken(&real) {
            return Err(says_nothing(&real, why, "before", "not played"));
        }
    }
    if let Err(why) = story.act(&mut real) {
        return Err(says_nothing(&real, why, "during", "not played out"));
    }
    Ok(real)
}

/// The heading of a played story's timeline.
pub fn heading(airflow: Airflow, executor: Executor, story: Story, state: &str) -> String {
    format!(
        "=== Airflow {}, {executor:?} executor ({}): run {state}",
        airflow.short(),
        story.title()
    )
}

/// How a played story ended, in one line: the run, the task's last try, the callbacks.
pub fn outcome(real: &RealAirflow, state: &str) -> String {
    let task = story_ti(real).map_or_else(
        || "no task instance".to_owned(),
        |(try_number, state, _)| format!("try {try_number} {state}"),
    );
    let callbacks: Vec<String> = real
        .markers()
        .iter()
        .filter_map(|marker| {
            // `kind.dag.task.try`
            let mut parts = marker.split('.');
            let kind = parts.next()?;
            let try_number = parts.nth(2)?;
            Some(format!("{kind} (try {try_number})"))
        })
        .collect();
    let callbacks = if callbacks.is_empty() {
        "none".to_owned()
    } else {
        callbacks.join(", ")
    };
    format!("run {state}; task {task}; callbacks: {callbacks}")
}

/// Whether a story ended as it must with podstream: the run succeeded on the try and with the
/// callbacks of [`Story::right_ending`], every scheduler still alive (all but the story's
/// killed one) ends with no task in its executor, and a story whose pod ended while its
/// scheduler was down leaves no pod but a failed one. `Err` says what did not hold.
pub fn ended_right(real: &RealAirflow, state: &str, story: Story) -> Result<(), String> {
    if state != "success" {
        return Err(format!("the run ended {state}, not success"));
    }
    let (last_try, callbacks) = story.right_ending(real.airflow);
    let task = story_ti(real).map(|(try_number, state, _)| (try_number, state));
    if task != Some((last_try.to_owned(), "success".to_owned())) {
        return Err(format!("try {last_try} did not run to its end: {task:?}"));
    }
    let markers = real.markers();
    if markers != callbacks {
        return Err(format!("callbacks {markers:?}, not {callbacks:?}"));
    }
    // No slot leaks (stock multi-scheduler installs leaked them: #32928, #35675). An
    // executor frees the slot when it handles the pod's completion, a moment after the run
    // ends: wait for that.
    let deadline = Instant::now() + SLOTS_FREED;
    loop {
        match slots_freed(real, story).and_then(|()| pods_deleted(real, story)) {
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(500)),
            freed => return freed,
        }
    }
}

/// For the trust stories, (j) and (k), with podstream's executor: podstream refused the
/// story's copy as a pod without a valid signature, and in (k) the task was still `queued`
/// once the copy had failed. `Err` says what did not hold; every other story is `Ok`.
pub fn copy_refused(real: &RealAirflow, story: Story) -> Result<(), String> {
    let copy = match story {
        Story::CopyFirst => PLANTED_COPY,
        Story::PendingCopy => PENDING_COPY,
        _ => return Ok(()),
    };
    if story == Story::PendingCopy
        && !real
            .timeline()
            .contains(&format!("{COPY_FAILED_NOTE} queued"))
    {
        return Err("the task was not queued once the copy had failed".to_owned());
    }
    if real.unsigned_warnings(copy) == 0 {
        return Err(format!(
            "podstream never refused {copy} as unsigned:\n{}",
            real.podstream_log()
        ));
    }
    Ok(())
}

/// A story whose pod ended while its scheduler was down leaves no pod of the task behind but
/// a failed one: the adopting scheduler deletes the rest (`delete_worker_pods`, on by
/// default) and keeps failed pods for their logs (`delete_worker_pods_on_failure`, off).
fn pods_deleted(real: &RealAirflow, story: Story) -> Result<(), String> {
    // Airflow 2 adopts no pod whose task instance has finished: a task that succeeded while
    // its scheduler was down leaves its Succeeded pod to nobody (the stock executor's watcher
    // sees only its own job's pods, so it leaves it too).
    let left_by_airflow_2 = story == Story::SucceedsWhileDown && !real.airflow.is_3();
    if !story.while_down() || left_by_airflow_2 {
        return Ok(());
    }
    let left: Vec<String> = real
        .pods()
        .iter()
        .filter(|pod| pod["metadata"]["annotations"]["task_id"] == "works")
        .filter(|pod| pod["status"]["phase"] != "Failed")
        .map(|pod| {
            format!(
                "{} ({})",
                pod["metadata"]["name"].as_str().unwrap_or("?"),
                pod["status"]["phase"].as_str().unwrap_or("?")
            )
        })
        .collect();
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the task's pods are still there: {}",
            left.join(", ")
        ))
    }
}

/// How long after its run ends a story's executors may take to free the task's slot.
const SLOTS_FREED: Duration = Duration::from_secs(60);

/// Every scheduler still alive (all but the story's killed one) last said its executor runs
/// no task, and at least one said how many it runs.
fn slots_freed(real: &RealAirflow, story: Story) -> Result<(), String> {
    let logs = real.logs_of("scheduler");
    if !logs
        .iter()
        .any(|log| log.contains(" task(s) running in this executor"))
    {
        return Err("no executor said how many tasks it runs".to_owned());
    }
    for (index, log) in logs.iter().enumerate() {
        if Some(index) == story.killed_scheduler() {
            continue;
        }
        let last = log
            .lines()
            .rev()
            .filter_map(|line| line.split("podstream: ").nth(1))
            .find_map(|said| said.split_once(" task(s) running in this executor"))
            .map(|(count, _)| count);
        if let Some(count) = last.filter(|n| *n != "0") {
            return Err(format!(
                "the scheduler started {} ends with {count} task(s) in its executor",
                index + 1
            ));
        }
    }
    Ok(())
}

/// (b) The scheduler is stopped past its health threshold; a second one adopts the task;
/// the first comes back.
fn adopt_by_a_second_scheduler(real: &mut RealAirflow) -> Result<(), String> {
    let Some(first) = real.component("scheduler") else {
        panic!("no scheduler to stop");
    };
    let owner = story_ti(real).map(|(_, _, owner)| owner);
    real.signal(first, Signal::SIGSTOP);
    real.start_component("scheduler");
    let adopted = |r: &RealAirflow| story_ti(r).map(|(_, _, by)| by) != owner;
    real.wait_until("the second scheduler to adopt the task", WAIT, |r| {
        adopted(r) || first_pod_ended(r)
    });
    real.signal(first, Signal::SIGCONT);
    if adopted(real) {
        Ok(())
    } else {
        Err("the task's first pod ended on its own before it was adopted".to_owned())
    }
}

/// The task's first pod has ended (nothing in a story's act ends it).
fn first_pod_ended(real: &RealAirflow) -> bool {
    pod_phase(real, "1").is_some_and(|phase| phase == "Failed" || phase == "Succeeded")
}

/// (c) The scheduler is killed -9 and started again.
fn kill_and_restart_the_scheduler(real: &mut RealAirflow) {
    let Some(first) = real.component("scheduler") else {
        panic!("no scheduler to kill");
    };
    real.signal(first, Signal::SIGKILL);
    real.start_component("scheduler");
}

/// How a story ends the task's first pod while its scheduler is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodEnding {
    /// The pod's main process is killed: the pod fails, the task reports nothing.
    Dies,
    /// The task returns: it reports its success, the pod succeeds.
    Succeeds,
    /// The pod is deleted through the API.
    Deleted,
}

/// (e)–(g) The scheduler is killed -9; the first pod ends as `ending` says while no scheduler
/// runs; once it has ended, a new scheduler starts.
fn end_the_pod_while_down(real: &mut RealAirflow, ending: PodEnding) -> Result<(), String> {
    let Some(first) = real.component("scheduler") else {
        panic!("no scheduler to kill");
    };
    real.signal(first, Signal::SIGKILL);
    match ending {
        PodEnding::Dies => tell(real, "1", "die"),
        PodEnding::Succeeds => tell(real, "1", "succeed"),
        PodEnding::Deleted => {
            let Some(pod) = first_pod(real) else {
                return Err("the task's pod is not there".to_owned());
            };
            real.delete_pod(
                pod["metadata"]["namespace"].as_str().unwrap_or("airflow"),
                pod["metadata"]["name"].as_str().unwrap_or_default(),
            );
        }
    }
    real.wait_until("the task's first pod to end", WAIT, |r| {
        first_pod_ended(r) || pod_phase(r, "1").is_none()
    });
    // A second try, where the story leads to one, has nothing left to show: it succeeds as
    // soon as it runs.
    tell(real, "2", "succeed");
    real.start_component("scheduler");
    Ok(())
}

/// Tells try `try_number` of the story task how to end (`succeed` or `die`, read by the story
/// DAG from the endings folder), and notes it on the timeline.
fn tell(real: &RealAirflow, try_number: &str, ending: &str) {
    std::fs::write(real.endings.join(try_number), ending).unwrap_or_else(|e| panic!("{e}"));
    real.note(format!("told try {try_number} to {ending}"));
}

/// The file by which the stage asks podstream's executor to hold its scheduler loop after
/// taking a fail (`PODSTREAM_TEST_HOLD_AFTER_TAKING` of the stories' executor,
/// `stage/airflow/lib/podstream_story_executor.py`, pointed at the endings folder), and the
/// one it answers with.
const HOLD: &str = "hold";
const TAKEN: &str = "taken";

/// (h) The first pod dies while its scheduler runs. With podstream's executor the scheduler
/// is held (the stories' executor's hold) right after the executor took the failure and
/// before the loop committed it, and killed -9 there; with the stock executor, killed -9 as soon as the pod
/// has failed. Then a new scheduler starts.
fn kill_after_taking_the_failure(real: &mut RealAirflow) -> Result<(), String> {
    let Some(first) = real.component("scheduler") else {
        panic!("no scheduler to kill");
    };
    let podstream = real.executor == Executor::Podstream;
    if podstream {
        std::fs::write(real.endings.join(HOLD), "").unwrap_or_else(|e| panic!("{e}"));
    }
    tell(real, "1", "die");
    if podstream {
        real.wait_until("the executor to take the failure", WAIT, |r| {
            r.endings.join(TAKEN).exists()
        });
        real.note("the executor took the failure; its loop is held");
    } else {
        real.wait_until("the task's first pod to end", WAIT, first_pod_ended);
    }
    real.signal(first, Signal::SIGKILL);
    tell(real, "2", "succeed");
    real.start_component("scheduler");
    Ok(())
}

/// (d) A second pod for the running task, which fails after a few seconds.
fn start_a_second_pod_that_fails(real: &mut RealAirflow) {
    let Some(original) = first_pod(real) else {
        panic!("the task's pod is not there");
    };
    real.create_pod(&duplicate(&original));
}

/// The `task_instance_id` a forged pod claims: a well-formed UUID that is no task
/// instance's.
pub const FORGED_TASK_INSTANCE_ID: &str = "6f0e8a52-1b7c-4c1e-9a51-3a5f0c2d9e11";
/// The name suffix of the forged pod of [`Story::ForgedPod`].
pub const FORGED_SUFFIX: &str = "-forged";

/// (i) A copy of the running task's pod (its labels and annotations) claiming another task
/// instance id, which fails after a few seconds.
fn start_a_forged_pod_that_fails(real: &mut RealAirflow) {
    let Some(original) = first_pod(real) else {
        panic!("the task's pod is not there");
    };
    let mut forged = duplicate(&original);
    forged["metadata"]["name"] = json!(format!(
        "{}{FORGED_SUFFIX}",
        original["metadata"]["name"].as_str().unwrap_or("pod")
    ));
    forged["metadata"]["annotations"]["task_instance_id"] = json!(FORGED_TASK_INSTANCE_ID);
    real.create_pod(&forged);
}

/// The story task's first pod listed (the one an act works on), if there is one; never
/// [`Story::CopyFirst`]'s copy.
fn first_pod(real: &RealAirflow) -> Option<Value> {
    real.pods()
        .into_iter()
        .find(|p| p["metadata"]["annotations"]["task_id"] == "works" && !is_planted_copy(p))
}

/// The name of [`Story::CopyFirst`]'s copy.
pub const PLANTED_COPY: &str = "podstream-story-works-planted-copy";
/// The name of [`Story::PendingCopy`]'s copy.
pub const PENDING_COPY: &str = "podstream-story-works-pending-copy";
/// The pod of the stage's that fills [`Story::PendingCopy`]'s node.
const NODE_FILLER: &str = "podstream-story-node-filler";

/// Whether `pod` is a copy a story made (never the task's own pod).
fn is_planted_copy(pod: &Value) -> bool {
    pod["metadata"]["name"] == PLANTED_COPY || pod["metadata"]["name"] == PENDING_COPY
}

/// (k)'s note once the copy has failed, before the task's state.
const COPY_FAILED_NOTE: &str = "with the copy failed, the task is";

/// The run `@once` makes of the story DAG: what a copy made in advance can name.
pub const STORY_RUN_ID: &str = "scheduled__2026-01-01T00:00:00+00:00";

/// (j) Once a scheduler runs and before the task's pod exists: a copy of that pod (the story
/// run's names, try 1, the scheduler's job id), which succeeds at once.
fn plant_a_copy_that_succeeds(real: &mut RealAirflow) -> Result<(), String> {
    let scheduler = |r: &RealAirflow| {
        r.query("SELECT max(id) FROM job WHERE job_type = 'SchedulerJob' AND state = 'running'")
            .into_iter()
            .flatten()
            .find(|id| !id.is_empty())
    };
    real.wait_until("a scheduler job to run", WAIT, |r| scheduler(r).is_some());
    let owner = scheduler(real).unwrap_or_default();
    if first_pod(real).is_some() {
        return Err("the task's pod was there before the copy".to_owned());
    }
    let labels = json!({"airflow-worker": owner, "dag_id": DAG, "task_id": "works",
        "try_number": "1", "kubernetes_executor": "True"});
    real.create_pod(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": PLANTED_COPY,
            "namespace": "airflow",
            "labels": labels,
            "annotations": {"dag_id": DAG, "task_id": "works", "run_id": STORY_RUN_ID, "try_number": "1"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "base", "image": "podstream-story", "command": ["sh", "-c", "exit 0"]}],
        },
    }));
    // The stock executor deletes a pod as soon as its watcher sees it succeed: gone counts.
    real.wait_until("the copy to succeed", WAIT, |r| {
        let pods = r.pods();
        let copy = pods.iter().find(|p| is_planted_copy(p));
        copy.is_none_or(|p| p["status"]["phase"] == "Succeeded")
    });
    if first_pod(real).is_some() {
        return Err("the task's pod appeared before the copy ended".to_owned());
    }
    real.note("the copy succeeded before the task's pod exists");
    Ok(())
}

/// Starts Airflow's components with `default_pool` at 0 slots, so that no task is queued (it
/// stays `scheduled`) until `before` has played, however loaded the machine; then gives the
/// pool its slots back.
fn start_with_nothing_queued_until(
    real: &mut RealAirflow,
    before: impl FnOnce(&mut RealAirflow) -> Result<(), String>,
) -> Result<(), String> {
    let slots = real.default_pool_slots();
    real.set_default_pool_slots(0);
    real.start_components();
    let played = before(real);
    real.set_default_pool_slots(slots);
    played
}

/// (k) Fills the node's one pod slot with a pod of the stage's, so the task's pod will wait.
fn fill_the_node(real: &mut RealAirflow) -> Result<(), String> {
    real.create_pod(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": NODE_FILLER, "namespace": "airflow"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "filler", "image": "podstream-story", "command": ["sleep", "3600"]}],
        },
    }));
    real.wait_until("the node's one slot to be taken", WAIT, |r| {
        r.pods()
            .iter()
            .any(|p| p["metadata"]["name"] == NODE_FILLER && p["status"]["phase"] == "Running")
    });
    Ok(())
}

/// (k) On a full node, waits for the task's pod to wait Pending, then makes a copy of it
/// (another name, so a signature that does not fit) that stays Pending on another node with a
/// container unable to pull and another ended with `Error`. Once podstream (or the stock
/// watcher) has had it, try 1 is told to succeed and the node is freed.
fn fail_a_copy_while_the_pod_waits(real: &mut RealAirflow) -> Result<(), String> {
    real.wait_until("the task's pod to wait", WAIT, |r| first_pod(r).is_some());
    let Some(original) = first_pod(real) else {
        return Err("the task's pod went away".to_owned());
    };
    if original["status"]["phase"] != "Pending" {
        return Err(format!(
            "the task's pod is {}, not waiting",
            original["status"]["phase"]
        ));
    }
    let mut copy = duplicate(&original);
    // Renamed after `duplicate` signed it: the signature no longer fits, as a copy's cannot.
    copy["metadata"]["name"] = json!(PENDING_COPY);
    copy["spec"]["nodeName"] = json!("another-node");
    let base = copy["spec"]["containers"][0].clone();
    copy["spec"]["containers"] = json!([base, {
        "name": "sidecar", "image": "podstream-story", "command": ["sh", "-c", "exit 1"],
    }]);
    real.create_pod(&copy);
    real.patch_pod_status(
        "airflow",
        PENDING_COPY,
        &json!({
            "phase": "Pending",
            "containerStatuses": [
                {"name": "base", "ready": false, "restartCount": 0, "image": "podstream-story",
                 "imageID": "", "state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}},
                {"name": "sidecar", "ready": false, "restartCount": 0, "image": "podstream-story",
                 "imageID": "", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}},
            ],
        }),
    );
    if real.executor == Executor::Podstream {
        // One warning for the copy's creation, one for its failed container.
        real.wait_until("podstream to have the copy's failure", WAIT, |r| {
            r.unsigned_warnings(PENDING_COPY) >= 2
        });
    } else {
        std::thread::sleep(Duration::from_secs(10));
    }
    match story_ti(real) {
        Some((_, state, _)) => real.note(format!("{COPY_FAILED_NOTE} {state}")),
        None => real.note("with the copy failed, there is no task instance"),
    }
    tell(real, "1", "succeed");
    real.delete_pod("airflow", NODE_FILLER);
    Ok(())
}

/// (j) The real pod dies while its scheduler runs; the retry succeeds.
fn tell_the_first_try_to_die(real: &RealAirflow) {
    tell(real, "2", "succeed");
    tell(real, "1", "die");
}

/// The same pod again under another name (as a relaunch after a reset would make it), whose
/// container fails after a few seconds.
fn duplicate(pod: &Value) -> Value {
    let mut copy = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{}-second", pod["metadata"]["name"].as_str().unwrap_or("pod")),
            "namespace": pod["metadata"]["namespace"],
            "labels": pod["metadata"]["labels"],
            "annotations": pod["metadata"]["annotations"],
        },
        "spec": pod["spec"],
    });
    if let Some(spec) = copy["spec"].as_object_mut() {
        spec.remove("nodeName");
    }
    copy["spec"]["containers"][0]["command"] = json!(["sh", "-c", "sleep 3; exit 1"]);
    copy["spec"]["containers"][0]["args"] = json!([]);
    // Seed 003's second pod is a scheduler's own (a relaunch): signed as the executor signs,
    // for its own name. A forged copy renamed later keeps a signature that no longer fits.
    if copy["metadata"]["annotations"][SIGNATURE_ANNOTATION].is_string() {
        let signature = signature_for(&copy);
        copy["metadata"]["annotations"][SIGNATURE_ANNOTATION] = json!(signature);
    }
    copy
}

/// The signature the stage's executor would give `pod`, by its namespace, name and TI
/// annotations.
fn signature_for(pod: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let annotations = &pod["metadata"]["annotations"];
    let number = |v: &Value, absent: i64| {
        v.as_str()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(absent)
    };
    let pod_ref = PodRef {
        namespace: text(&pod["metadata"]["namespace"]),
        name: text(&pod["metadata"]["name"]),
        uid: String::new(),
    };
    let task = TaskKey {
        dag_id: text(&annotations["dag_id"]),
        task_id: text(&annotations["task_id"]),
        run_id: text(&annotations["run_id"]),
        map_index: number(&annotations["map_index"], -1),
        try_number: number(&annotations["try_number"], 0),
        ..TaskKey::default()
    };
    crate::real_airflow::pod_signing().sign(&pod_ref, &task)
}

/// Seconds from the moment the story task's first pod ended (`Failed`, `Succeeded` or
/// deleted) to the task instance's next change of state, read from a played story's timeline
/// (the detection latency `podstream demo --airflow` prints per executor). `None` when the
/// pod did not end, or no change followed: the task had reported its own end first.
pub fn detection_seconds(timeline: &str) -> Option<f64> {
    let mut first_pod: Option<&str> = None;
    let mut ended: Option<f64> = None;
    for line in timeline.lines() {
        let Some((seconds, what)) = line.trim_start().split_once("s  ") else {
            continue;
        };
        let Ok(at) = seconds.parse::<f64>() else {
            continue;
        };
        if let Some(pod) = what.strip_prefix("pod ") {
            let Some((name, event)) = pod.split_once(": ") else {
                continue;
            };
            // Only worker pods count: the watch also shows objects without the label
            // (`airflow-worker=-`), such as podstream's own.
            if event.contains("airflow-worker=-") {
                continue;
            }
            let first = *first_pod.get_or_insert(name);
            let over = event.starts_with("DELETED")
                || event.contains(" Failed")
                || event.contains(" Succeeded");
            if name == first && over && ended.is_none() {
                ended = Some(at);
            }
        } else if let (Some(end), Some(state)) = (ended, what.strip_prefix("TI works try ")) {
            let changed = !state.contains(": running") && !state.contains(": queued");
            if at >= end && changed {
                return Some(at - end);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::detection_seconds;

    const DIES: &str = "   0.0s  ** started scheduler #0
  10.3s  pod p-works-a: ADDED Pending, airflow-worker=1
  10.3s  pod p-works-a: MODIFIED Running, airflow-worker=1
  12.0s  TI works try 1: running (queued_by_job_id 1)
  20.0s  ** SIGKILL to scheduler #0
  21.5s  pod p-works-a: MODIFIED Failed, airflow-worker=1
  22.0s  ** started scheduler #3
  40.0s  pod p-works-a: MODIFIED Failed, airflow-worker=2
  44.0s  TI works try 1: up_for_retry (queued_by_job_id 2)
";

    #[test]
    fn detection_is_read_from_the_first_pods_end_to_the_next_ti_change() {
        let table: [(&str, Option<f64>); 5] = [
            // The pod failed at 21.5 s; the TI changed at 44.0 s.
            (DIES, Some(22.5)),
            // The task reported success before its pod ended: nothing was detected.
            (
                "  5.0s  pod p-works-a: MODIFIED Running, airflow-worker=1
  9.0s  TI works try 1: success (queued_by_job_id 1)
  9.5s  pod p-works-a: MODIFIED Succeeded, airflow-worker=1",
                None,
            ),
            // A deleted pod ends it too; a second pod's end is not the first pod's.
            (
                "  5.0s  pod p-works-a: MODIFIED Running, airflow-worker=1
  6.0s  pod p-works-a-second: MODIFIED Failed, airflow-worker=1
  7.0s  TI works try 1: running (queued_by_job_id 1)
  8.0s  pod p-works-a: DELETED Running, airflow-worker=1
  9.25s  TI works try 1: none (queued_by_job_id 1)",
                Some(1.25),
            ),
            // An object without the worker label before the first pod is not the first pod.
            (
                "  5.3s  pod podstream-ingest: MODIFIED -, airflow-worker=-
  6.0s  pod p-works-a: MODIFIED Running, airflow-worker=1
  8.0s  pod p-works-a: MODIFIED Failed, airflow-worker=1
  9.5s  TI works try 1: up_for_retry (queued_by_job_id 1)",
                Some(1.5),
            ),
            // The pod never ended.
            (
                "  5.0s  pod p-works-a: MODIFIED Running, airflow-worker=1",
                None,
            ),
        ];
        for (timeline, seconds) in table {
            let got = detection_seconds(timeline);
            assert_eq!(
                got.map(|s| (s * 100.0).round()),
                seconds.map(|s| (s * 100.0).round()),
                "{timeline}"
            );
        }
    }
}
