//! `podstream replay`: the history of pod events and commands from JetStream, as one timeline,
//! optionally narrowed to a task or a pod; `--decide` runs today's rules over the replayed pod
//! events and shows where they differ from what was decided then.

use std::collections::BTreeMap;

use crate::args::stream::{NatsArgs, PrefixArgs};
use anyhow::Context;
use async_nats::jetstream;
use clap::Args;
use podstream_bus::history::{self, Start};
use podstream_collector::collected::Collected;
use podstream_proto::subject::{ROLE_HEADER, Role, Stream, Subjects};
use podstream_proto::{Command, PodEvent, TaskKey};
use podstream_rules::{MemoryStore, Processor};
use prost::Message as _;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::history::lines;
use crate::history::timeline::Timeline;
use crate::history::timeline_page;
use crate::offline::decide::RulesArgs;

/// Flags of `podstream replay`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    podstream replay --since 2026-11-30T10:00:00Z --task etl/load/scheduled__2026-11-30T09:00:00+00:00\n  \
    podstream replay --since 2h --pod etl-load-x7k2 --json\n  \
    podstream replay --since seq:1 --decide --fatal-reasons ErrImagePull    # what would today's rules change?\n  \
    podstream replay --since 2026-11-30T00:00:00Z --task etl/load/scheduled__2026-11-30T00:00:00+00:00 --html load.html")]
pub struct ReplayArgs {
    #[command(flatten)]
    nats: NatsArgs,
    #[command(flatten)]
    prefix: PrefixArgs,
    /// Where to start: a duration ago (`30m`, `2h`, `1d`), an RFC 3339 time (both streams),
    /// or a sequence of the pod-events stream, `seq:N` (commands from that event's time on; a
    /// bare number is read as a sequence too).
    #[arg(long, env = "PODSTREAM_REPLAY_SINCE")]
    since: Position,
    /// Where to stop (inclusive), same forms; the streams' ends at start when absent.
    #[arg(long, env = "PODSTREAM_REPLAY_UNTIL")]
    until: Option<Position>,
    /// Only this task: DAG/TASK/RUN or DAG/TASK/RUN/TRY (map index as TASK[N]).
    #[arg(long, env = "PODSTREAM_REPLAY_TASK")]
    task: Option<TaskFilter>,
    /// Only this pod (its name).
    #[arg(long, env = "PODSTREAM_REPLAY_POD")]
    pod: Option<String>,
    /// Re-decide the replayed pod events with today's rules and print the differences.
    #[arg(long, env = "PODSTREAM_REPLAY_DECIDE")]
    decide: bool,
    /// One JSON object per line instead of text.
    #[arg(long, env = "PODSTREAM_JSON")]
    json: bool,
    /// Write the timeline as one self-contained HTML page to FILE (a lane per task instance,
    /// a bar per pod, podstream's commands as marks) instead of printing it.
    #[arg(long, env = "PODSTREAM_REPLAY_HTML", value_name = "FILE")]
    html: Option<std::path::PathBuf>,
    #[command(flatten)]
    rules: RulesArgs,
}

/// A point in the history.
#[derive(Debug, Clone, Copy)]
enum Position {
    Time(OffsetDateTime),
    Sequence(u64),
}

impl std::str::FromStr for Position {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let sequence = text.strip_prefix("seq:").unwrap_or(text);
        if let Ok(sequence) = sequence.parse::<u64>() {
            return Ok(Position::Sequence(sequence));
        }
        if let Some(ago) = duration(text) {
            return Ok(Position::Time(OffsetDateTime::now_utc() - ago));
        }
        OffsetDateTime::parse(text, &Rfc3339).map(Position::Time).map_err(|e| {
            format!(
                "{text:?} is none of a duration ago (30m, 2h, 1d), an RFC 3339 time and a stream sequence (seq:N): {e}"
            )
        })
    }
}

/// `30s`, `30m`, `2h`, `1d`: how long ago.
fn duration(text: &str) -> Option<time::Duration> {
    let unit = text.chars().last()?;
    let count: i64 = text[..text.len() - unit.len_utf8()].parse().ok()?;
    let seconds = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        _ => return None,
    };
    (count >= 0).then(|| time::Duration::seconds(count.saturating_mul(seconds)))
}

/// `--task DAG/TASK/RUN[/TRY]`, where TASK may end in `[map index]`.
#[derive(Debug, Clone)]
struct TaskFilter {
    dag_id: String,
    task_id: String,
    map_index: Option<i64>,
    run_id: String,
    try_number: Option<i64>,
}

impl std::str::FromStr for TaskFilter {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.splitn(3, '/').collect();
        let [dag_id, task, rest] = parts.as_slice() else {
            return Err(format!(
                "{text:?}: expected DAG/TASK/RUN or DAG/TASK/RUN/TRY"
            ));
        };
        // A run id may itself hold '/', so a try is only a trailing all-digit segment.
        let (run_id, try_number) = match rest.rsplit_once('/') {
            Some((run, tail)) if tail.parse::<i64>().is_ok() => (run, tail.parse().ok()),
            _ => (*rest, None),
        };
        let (task_id, map_index) = match task.strip_suffix(']').and_then(|t| t.split_once('[')) {
            Some((task_id, index)) => (
                task_id,
                Some(
                    index
                        .parse()
                        .map_err(|_| format!("bad map index in {task:?}"))?,
                ),
            ),
            None => (*task, None),
        };
        Ok(TaskFilter {
            dag_id: (*dag_id).to_owned(),
            task_id: task_id.to_owned(),
            map_index,
            run_id: run_id.to_owned(),
            try_number,
        })
    }
}

impl TaskFilter {
    fn matches(&self, key: &TaskKey) -> bool {
        let run = if key.is_complete() {
            &key.run_id
        } else {
            &key.logical_date
        };
        key.dag_id == self.dag_id
            && key.task_id == self.task_id
            && *run == self.run_id
            && self.map_index.is_none_or(|m| m == key.map_index)
            && self.try_number.is_none_or(|t| t == key.try_number)
    }
}

/// Which of the three readers a message comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The pod-events stream.
    Pods,
    /// The commands stream.
    Commands,
    /// The collector's bucket of pods collected.
    Collected,
}

impl Source {
    /// Its name in the progress bar, the text lines' `p#`/`c#` marks and the timeline.
    fn as_str(self) -> &'static str {
        match self {
            Source::Pods => "pods",
            Source::Commands => "commands",
            Source::Collected => "collected",
        }
    }
}

/// One replayed message.
struct Entry {
    stream: Source,
    sequence: u64,
    time: OffsetDateTime,
    subject: String,
    role: Option<String>,
    payload: bytes::Bytes,
}

/// Prints the timeline: both streams read at once and merged in time order as they arrive,
/// so a week of history takes constant memory (`--decide` keeps only the commands not yet
/// matched with their counterpart, and the rules' state of the task instances seen).
pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    runtime.block_on(async {
        let subjects = args.prefix.subjects()?;
        let client = podstream_bus::connect(
            args.nats.url(),
            &args.nats.security.security(),
            "podstream-replay",
        )
        .await?;
        let js = jetstream::new(client);
        let mut history = History::open(&js, &subjects, args.since, args.until).await?;

        let mut printed = 0usize;
        let mut replayed = 0usize;
        let mut decide = args.decide.then(|| Redecide::new(args)).transpose()?;
        let mut differences = 0usize;
        let mut timeline = args.html.as_ref().map(|_| Timeline::new());
        while let Some(entry) = history.next().await? {
            replayed += 1;
            let (task, pod) = identify(&entry.payload, entry.stream);
            if let Some(filter) = &args.task
                && !task.as_ref().is_some_and(|t| filter.matches(t))
            {
                continue;
            }
            // --decide sees every pod of the task, also those --pod hides; a previous owner's
            // copy (`left`) is neither an event to decide nor a second command.
            let left = entry.role.as_deref() == Some(Role::Left.as_str());
            if let Some(decide) = decide.as_mut()
                && !left
            {
                let found = if entry.stream == Source::Pods {
                    PodEvent::decode(entry.payload.as_ref())
                        .map(|event| decide.event(&event))
                        .unwrap_or_default()
                } else {
                    Command::decode(entry.payload.as_ref())
                        .ok()
                        .and_then(|command| decide.recorded(command))
                        .into_iter()
                        .collect()
                };
                for difference in found {
                    differences += 1;
                    show_difference(&difference, timeline.as_mut(), args.json);
                }
            }
            if let Some(name) = &args.pod
                && pod.as_deref() != Some(name.as_str())
            {
                continue;
            }
            if let Some(timeline) = timeline.as_mut() {
                entry.add_to(timeline);
                printed += 1;
                continue;
            }
            let line = lines::describe(
                &subjects,
                &entry.subject,
                entry.role.as_deref(),
                &entry.payload,
                args.json,
            );
            let when = entry.time.format(&Rfc3339).unwrap_or_default();
            if args.json {
                let mut value: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                value["time"] = when.into();
                value["sequence"] = entry.sequence.into();
                println!("{value}");
            } else {
                println!(
                    "{when} {:<8} {line}",
                    format!("{}#{}", &entry.stream.as_str()[..1], entry.sequence)
                );
            }
            printed += 1;
        }
        history.finish();
        if let Some(decide) = decide {
            for difference in decide.finish() {
                differences += 1;
                show_difference(&difference, timeline.as_mut(), args.json);
            }
        }
        eprintln!("replayed {replayed} messages, {printed} shown");
        if args.decide {
            eprintln!("--decide: {differences} difference(s) between then and today's rules");
        }
        if let (Some(timeline), Some(file)) = (timeline, &args.html) {
            let page = timeline_page::render(
                &timeline,
                "podstream replay",
                "Narrow the selection with --task, --pod, --since or --until.",
            );
            std::fs::write(file, page).with_context(|| format!("writing {}", file.display()))?;
            eprintln!(
                "wrote {}: {} task instance(s){}",
                file.display(),
                timeline.lanes().len(),
                match timeline.left_out() {
                    0 => String::new(),
                    n => format!(", {n} left out"),
                }
            );
        }
        Ok(())
    })
}

/// The whole history as a timeline: what `podstream demo --html` draws.
#[cfg(feature = "test-world")]
pub async fn timeline_of(js: &jetstream::Context, subjects: &Subjects) -> anyhow::Result<Timeline> {
    let mut history = History::open(js, subjects, Position::Sequence(1), None).await?;
    let mut timeline = Timeline::new();
    while let Some(entry) = history.next().await? {
        entry.add_to(&mut timeline);
    }
    history.finish();
    Ok(timeline)
}

impl Entry {
    /// Feeds this message to `timeline`; a previous owner's copy of a command is left out
    /// (the command itself is on the new owner's subject).
    fn add_to(&self, timeline: &mut Timeline) {
        let at = (self.time.unix_timestamp_nanos() / 1_000_000) as i64;
        let unreadable = |timeline: &mut Timeline| {
            timeline.unreadable(at, self.stream.as_str(), self.sequence);
        };
        match self.stream {
            Source::Pods => match PodEvent::decode(self.payload.as_ref()) {
                Ok(event) => timeline.pod_event(at, self.sequence, &event),
                Err(_) => unreadable(timeline),
            },
            Source::Collected => match Collected::decode(self.payload.as_ref()) {
                Ok(collected) => timeline.collected(at, &collected),
                Err(_) => unreadable(timeline),
            },
            Source::Commands if self.role.as_deref() != Some(Role::Left.as_str()) => {
                match Command::decode(self.payload.as_ref()) {
                    Ok(command) => timeline.command(at, self.sequence, &command),
                    Err(_) => unreadable(timeline),
                }
            }
            Source::Commands => {}
        }
    }
}

/// The streams read at once and merged in time order as they arrive: pod events, then
/// commands, then the pods the collector collected (at the same instant, a command follows
/// its event, and a deletion its command).
struct History {
    /// Each stream's reader and its next message, in that order.
    readers: Vec<(Reader, Option<Entry>)>,
}

impl History {
    /// From `since` to `until` (or the streams' ends now).
    async fn open(
        js: &jetstream::Context,
        subjects: &Subjects,
        since: Position,
        until: Option<Position>,
    ) -> anyhow::Result<History> {
        let pods_name = subjects.stream_name(Stream::PodEvents);
        let pods_start = start_policy(js, &pods_name, since).await?;
        let since_time = match (since, &pods_start) {
            (Position::Time(time), _) => time,
            (Position::Sequence(_), Some((_, time))) => *time,
            (Position::Sequence(_), None) => OffsetDateTime::now_utc(),
        };
        let mut pods = match pods_start {
            Some((start, _)) => Reader::open(js, &pods_name, Source::Pods, start, until).await?,
            None => Reader::Empty,
        };
        // A pod-event sequence says nothing about the other streams' sequences: they stop at
        // its time.
        let until_time = until.map(|u| match u {
            Position::Sequence(_) => Position::Time(OffsetDateTime::now_utc()),
            time => time,
        });
        // Then, from the same time on: the commands, and the pods the collector collected.
        let by_time = [
            (subjects.stream_name(Stream::Commands), Source::Commands),
            (
                podstream_bus::streams::bucket_stream(
                    &subjects.resource_name(podstream_collector::service::BUCKET_ROLE),
                ),
                Source::Collected,
            ),
        ];
        let first = pods.next().await?;
        let mut readers = vec![(pods, first)];
        for (name, label) in by_time {
            let mut reader =
                Reader::open(js, &name, label, Start::Time(since_time), until_time).await?;
            let next = reader.next().await?;
            readers.push((reader, next));
        }
        Ok(History { readers })
    }

    /// The next message of any stream, or `None` at the end of all.
    async fn next(&mut self) -> anyhow::Result<Option<Entry>> {
        let first = (self.readers.iter().enumerate())
            .filter_map(|(at, (_, next))| next.as_ref().map(|entry| (entry.time, at)))
            .min();
        let Some((_, at)) = first else {
            return Ok(None);
        };
        let (reader, next) = &mut self.readers[at];
        let following = reader.next().await?;
        Ok(std::mem::replace(next, following))
    }

    fn finish(&self) {
        for (reader, _) in &self.readers {
            reader.finish();
        }
    }
}

/// Where to start reading `stream`, and the time of that point; `None` when the stream does
/// not exist or holds nothing from there on.
async fn start_policy(
    js: &jetstream::Context,
    stream: &str,
    since: Position,
) -> anyhow::Result<Option<(Start, OffsetDateTime)>> {
    let Ok(stream) = js.get_stream(stream).await else {
        return Ok(None);
    };
    match since {
        Position::Time(time) => Ok(Some((Start::Time(time), time))),
        Position::Sequence(sequence) => {
            let first = stream
                .get_first_raw_message_by_subject(">", sequence.max(1))
                .await;
            match first {
                Ok(message) => Ok(Some((Start::Sequence(message.sequence), message.time))),
                Err(_) => Ok(None),
            }
        }
    }
}

/// One stream read in order by direct gets (no consumer: the reader user may create none),
/// from a start to `until` (or its end at start), with a progress bar on stderr.
enum Reader {
    /// The stream does not exist or holds nothing.
    Empty,
    /// Messages to come.
    Reading(Box<Reading>),
}

/// A stream being read.
struct Reading {
    label: Source,
    messages: history::History,
    until: Option<Position>,
    progress: indicatif::ProgressBar,
    ended: bool,
}

impl Reader {
    async fn open(
        js: &jetstream::Context,
        name: &str,
        label: Source,
        start: Start,
        until: Option<Position>,
    ) -> anyhow::Result<Reader> {
        let Ok(mut stream) = js.get_stream(name).await else {
            return Ok(Reader::Empty);
        };
        let state = stream
            .info()
            .await
            .context("reading stream info")?
            .state
            .clone();
        if state.messages == 0 {
            return Ok(Reader::Empty);
        }
        let last = match until {
            Some(Position::Sequence(sequence)) => sequence.min(state.last_sequence),
            _ => state.last_sequence,
        };
        let progress = indicatif::ProgressBar::with_draw_target(
            Some(state.messages),
            indicatif::ProgressDrawTarget::stderr(),
        )
        .with_message(label.as_str());
        let messages = history::History::new(&js.client(), name, start, last);
        Ok(Reader::Reading(Box::new(Reading {
            label,
            messages,
            until,
            progress,
            ended: false,
        })))
    }

    /// The next message, or `None` at the end.
    async fn next(&mut self) -> anyhow::Result<Option<Entry>> {
        let Reader::Reading(reading) = self else {
            return Ok(None);
        };
        let Reading {
            label,
            messages,
            until,
            progress,
            ended,
        } = reading.as_mut();
        if *ended {
            return Ok(None);
        }
        let Some(message) = messages.next().await? else {
            *ended = true;
            return Ok(None);
        };
        let (sequence, time) = (message.sequence, message.time);
        if matches!(until, Some(Position::Time(until)) if time > *until) {
            *ended = true;
            return Ok(None);
        }
        progress.inc(1);
        Ok(Some(Entry {
            stream: *label,
            sequence,
            time,
            subject: message.subject.to_string(),
            role: message
                .headers
                .get(ROLE_HEADER)
                .map(|v| v.as_str().to_owned()),
            payload: message.payload,
        }))
    }

    fn finish(&self) {
        if let Reader::Reading(reading) = self {
            reading.progress.finish_and_clear();
        }
    }
}

/// The task and pod name a message is about.
fn identify(payload: &[u8], stream: Source) -> (Option<TaskKey>, Option<String>) {
    match stream {
        Source::Pods => PodEvent::decode(payload)
            .map(|e| (e.task, e.pod.map(|p| p.name)))
            .unwrap_or_default(),
        Source::Collected => Collected::decode(payload)
            .map(|c| (Some(c.ti), Some(c.pod.name)))
            .unwrap_or_default(),
        Source::Commands => Command::decode(payload)
            .map(|c| (c.task, c.pod.map(|p| p.name)))
            .unwrap_or_default(),
    }
}

/// A command decided then and what today's rules decide instead; either may be missing.
struct Difference {
    then: Option<Command>,
    today: Option<Command>,
}

/// Prints a difference, or marks it on the page being made.
fn show_difference(difference: &Difference, timeline: Option<&mut Timeline>, json: bool) {
    if let Some(timeline) = timeline {
        timeline.difference(difference.then.as_ref(), difference.today.as_ref());
        return;
    }
    match (&difference.then, &difference.today) {
        (Some(then), Some(today)) => {
            println!("differs  then: {}", lines::command_line(then, "", json));
            println!("         today: {}", lines::command_line(today, "", json));
        }
        (Some(then), None) => println!("then only: {}", lines::command_line(then, "", json)),
        (None, Some(today)) => println!("today only: {}", lines::command_line(today, "", json)),
        (None, None) => {}
    }
}

/// `--decide`: today's rules over the replayed pod events, beside the commands recorded then,
/// matched by command id as they come; only the unmatched are kept.
struct Redecide {
    processor: Processor<MemoryStore>,
    /// Commands seen on one side only so far: (then, today).
    unmatched: BTreeMap<String, (Option<Command>, Option<Command>)>,
}

impl Redecide {
    fn new(args: &ReplayArgs) -> Result<Redecide, crate::offline::decide::SigningKeyError> {
        Ok(Redecide {
            processor: Processor::new(args.rules.rules()?, MemoryStore::default()),
            unmatched: BTreeMap::new(),
        })
    }

    /// Decides a replayed pod event with today's rules; the differences it settles.
    fn event(&mut self, event: &PodEvent) -> Vec<Difference> {
        let Ok(commands) = self.processor.handle(event) else {
            return Vec::new();
        };
        commands
            .into_iter()
            .filter_map(|command| self.side(command.into_command(), false))
            .collect()
    }

    /// A command as it was decided then; the difference it settles, if any.
    fn recorded(&mut self, command: Command) -> Option<Difference> {
        self.side(command, true)
    }

    fn side(&mut self, command: Command, then: bool) -> Option<Difference> {
        let id = command.id.clone();
        let sides = self.unmatched.entry(id.clone()).or_default();
        if then {
            sides.0 = Some(command);
        } else {
            sides.1 = Some(command);
        }
        if sides.0.is_none() || sides.1.is_none() {
            return None;
        }
        let (then, today) = self.unmatched.remove(&id)?;
        (then != today).then_some(Difference { then, today })
    }

    /// What was decided on one side only.
    fn finish(self) -> Vec<Difference> {
        self.unmatched
            .into_values()
            .map(|(then, today)| Difference { then, today })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_durations_times_and_sequences() {
        let now = OffsetDateTime::now_utc();
        let ago = |text: &str| match text.parse::<Position>() {
            Ok(Position::Time(at)) => (now - at).whole_seconds(),
            other => panic!("{text}: {other:?}"),
        };
        for (text, seconds) in [("30s", 30), ("30m", 1_800), ("2h", 7_200), ("1d", 86_400)] {
            assert!((ago(text) - seconds).abs() <= 5, "{text}");
        }
        for (text, sequence) in [("seq:1", 1), ("1", 1), ("seq:42", 42)] {
            assert!(
                matches!(text.parse::<Position>(), Ok(Position::Sequence(s)) if s == sequence),
                "{text}"
            );
        }
        assert!(matches!(
            "2026-11-30T00:00:00Z".parse::<Position>(),
            Ok(Position::Time(_))
        ));
        for bad in ["", "m", "-5m", "5w", "seq:", "seq:x", "yesterday"] {
            assert!(bad.parse::<Position>().is_err(), "{bad:?}");
        }
    }
}
