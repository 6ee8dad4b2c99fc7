//! A pod watch event projected straight from its JSON text by `json_scan`,
//! reading only the fields the projection needs and skipping the rest unbuilt.
//!
//! `podstream decide` reads most of its input this way: a worker pod is about a
//! kilobyte of JSON, of which the rules read a tenth, and building k8s-openapi's
//! whole `Pod` (every spec and status field, owned) costs more than deciding.
//! Whatever this reader does not take (bare pods, lists, bookmarks, anything
//! malformed in a field it reads) goes to [`crate::watch_json`], which says
//! precisely what is wrong.
//!
//! Fields it reads are read as k8s-openapi reads them (a `null` or absent
//! required field is its default), so both paths project a valid pod alike.
//! Fields it skips are checked to be JSON, not to be what a pod holds there: a pod
//! malformed only where the rules never look is still decided.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use podstream_proto::v1::{EventType, PodEvent, PodRef};

use crate::json_scan::{Decline, Scan, Step};
use podstream_proto::signature::SIGNATURE_ANNOTATION;

use crate::projection::{
    DONE_LABEL, KeyAnnotations, Labels, OWNER_LABEL, PodFacts, ProjectionError, REVOKED_LABEL,
    StatusFacts, project_facts, unix_ms,
};

/// A projected pod watch event, or why its pod cannot be projected (with the
/// pod's reference, for the report).
pub type Projected = Result<PodEvent, (ProjectionError, PodRef)>;

/// Projects one `{"type": ..., "object": <Pod>}` watch event of type `ADDED`,
/// `MODIFIED` or `DELETED`. `None` when `text` is anything else or does not
/// read this way: the caller takes the [`crate::watch_json`] path.
pub fn project_watch_event(text: &str) -> Option<Projected> {
    let (event_type, pod) = read_whole(text, watch_event).ok()?;
    let event_type = match event_type.as_ref() {
        "ADDED" => EventType::Added,
        "MODIFIED" => EventType::Modified,
        "DELETED" => EventType::Deleted,
        _ => return None,
    };
    project_read(event_type, &pod)
}

/// Projects one pod object, given as its JSON text, as an event of `event_type`. `None` when
/// `text` does not read this way (not an object, another kind, a field the rules read
/// malformed): the caller takes k8s-openapi's `Pod`, which says precisely what is wrong.
pub fn project_pod(text: &str, event_type: EventType) -> Option<Projected> {
    let pod = read_whole(text, pod).ok()?;
    project_read(event_type, &pod)
}

fn project_read(event_type: EventType, pod: &PodJson) -> Option<Projected> {
    // k8s-openapi refuses another kind or version; leave those to the generic path.
    if pod.kind.as_deref().is_some_and(|k| k != "Pod")
        || pod.api_version.as_deref().is_some_and(|v| v != "v1")
    {
        return None;
    }
    let facts = pod.facts();
    Some(project_facts(event_type, &facts).map_err(|err| (err, facts.pod_ref())))
}

/// `text` read by `read` as one JSON value with nothing after it.
fn read_whole<'a, T>(text: &'a str, read: fn(&mut Scan<'a>) -> Step<T>) -> Step<T> {
    let mut scan = Scan::new(text);
    let value = read(&mut scan)?;
    scan.end()?;
    Ok(value)
}

/// A JSON string, borrowed from the text unless it holds escapes.
type Text<'a> = Cow<'a, str>;

/// The fields of one object read so far, to refuse a repeated one as serde's derive does
/// (a repeated key of a map, such as labels, is not refused: the later one wins).
#[derive(Default)]
struct Seen(u8);

impl Seen {
    /// `field` (each object's fields numbered from 0) is read for the first time.
    fn first(&mut self, field: u8) -> Step<()> {
        let bit = 1 << field;
        if self.0 & bit != 0 {
            return Err(Decline);
        }
        self.0 |= bit;
        Ok(())
    }
}

/// A string or `null`.
fn text<'a>(scan: &mut Scan<'a>) -> Step<Option<Text<'a>>> {
    nullable(scan, Scan::string)
}

/// `read`, or `None` for `null`.
fn nullable<'a, T>(
    scan: &mut Scan<'a>,
    read: impl FnOnce(&mut Scan<'a>) -> Step<T>,
) -> Step<Option<T>> {
    if scan.null() {
        return Ok(None);
    }
    read(scan).map(Some)
}

/// A list of objects each read by `read`, or `null`.
fn list<'a, T>(scan: &mut Scan<'a>, read: fn(&mut Scan<'a>) -> Step<T>) -> Step<Option<Vec<T>>> {
    nullable(scan, |scan| {
        let mut items = Vec::new();
        scan.array(|scan| {
            items.push(read(scan)?);
            Ok(())
        })?;
        Ok(items)
    })
}

/// A timestamp as k8s-openapi reads one, or `null`.
fn time(scan: &mut Scan<'_>) -> Step<Option<Time>> {
    let Some(text) = text(scan)? else {
        return Ok(None);
    };
    // jiff's `FromStr` is the parser its `Deserialize`, and so k8s-openapi's, uses.
    text.parse::<Timestamp>()
        .map(|at| Some(Time(at)))
        .map_err(|_| Decline)
}

fn watch_event<'a>(scan: &mut Scan<'a>) -> Step<(Text<'a>, PodJson<'a>)> {
    let (mut event_type, mut object, mut seen) = (None, None, Seen::default());
    scan.object(|key, scan| match key {
        "type" => {
            seen.first(0)?;
            event_type = Some(scan.string()?);
            Ok(())
        }
        "object" => {
            seen.first(1)?;
            object = Some(pod(scan)?);
            Ok(())
        }
        _ => scan.skip(),
    })?;
    Ok((event_type.ok_or(Decline)?, object.ok_or(Decline)?))
}

#[derive(Default)]
struct PodJson<'a> {
    api_version: Option<Text<'a>>,
    kind: Option<Text<'a>>,
    metadata: Option<MetaJson<'a>>,
    spec: Option<SpecJson<'a>>,
    status: Option<StatusJson<'a>>,
}

fn pod<'a>(scan: &mut Scan<'a>) -> Step<PodJson<'a>> {
    let (mut pod, mut seen) = (PodJson::default(), Seen::default());
    scan.object(|key, scan| {
        match key {
            "apiVersion" => (seen.first(0)?, pod.api_version = text(scan)?),
            "kind" => (seen.first(1)?, pod.kind = text(scan)?),
            "metadata" => (seen.first(2)?, pod.metadata = nullable(scan, meta)?),
            "spec" => (seen.first(3)?, pod.spec = nullable(scan, spec)?),
            "status" => (seen.first(4)?, pod.status = nullable(scan, status)?),
            _ => return scan.skip(),
        };
        Ok(())
    })?;
    Ok(pod)
}

#[derive(Default)]
struct MetaJson<'a> {
    uid: Option<Text<'a>>,
    namespace: Option<Text<'a>>,
    name: Option<Text<'a>>,
    resource_version: Option<Text<'a>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<LabelsJson<'a>>,
    annotations: Option<AnnotationsJson<'a>>,
}

fn meta<'a>(scan: &mut Scan<'a>) -> Step<MetaJson<'a>> {
    let (mut meta, mut seen) = (MetaJson::default(), Seen::default());
    scan.object(|key, scan| {
        match key {
            "uid" => (seen.first(0)?, meta.uid = text(scan)?),
            "namespace" => (seen.first(1)?, meta.namespace = text(scan)?),
            "name" => (seen.first(2)?, meta.name = text(scan)?),
            "resourceVersion" => (seen.first(3)?, meta.resource_version = text(scan)?),
            "creationTimestamp" => (seen.first(4)?, meta.creation_timestamp = time(scan)?),
            "deletionTimestamp" => (seen.first(5)?, meta.deletion_timestamp = time(scan)?),
            "labels" => (seen.first(6)?, meta.labels = nullable(scan, labels)?),
            "annotations" => (
                seen.first(7)?,
                meta.annotations = nullable(scan, annotations)?,
            ),
            _ => return scan.skip(),
        };
        Ok(())
    })?;
    Ok(meta)
}

/// The labels the projection reads. Every value of the map must be a string,
/// as k8s-openapi requires; the others are checked and dropped.
#[derive(Default)]
struct LabelsJson<'a> {
    owner: Option<Text<'a>>,
    done: Option<Text<'a>>,
    revoked: Option<Text<'a>>,
}

fn labels<'a>(scan: &mut Scan<'a>) -> Step<LabelsJson<'a>> {
    let mut labels = LabelsJson::default();
    string_map(scan, |key, value| {
        let slot = match key {
            OWNER_LABEL => &mut labels.owner,
            DONE_LABEL => &mut labels.done,
            REVOKED_LABEL => &mut labels.revoked,
            _ => return,
        };
        *slot = Some(value);
    })?;
    Ok(labels)
}

/// The annotations that name the task instance; as for labels, every value
/// must be a string.
#[derive(Default)]
struct AnnotationsJson<'a> {
    dag_id: Option<Text<'a>>,
    task_id: Option<Text<'a>>,
    run_id: Option<Text<'a>>,
    try_number: Option<Text<'a>>,
    map_index: Option<Text<'a>>,
    logical_date: Option<Text<'a>>,
    execution_date: Option<Text<'a>>,
    task_instance_id: Option<Text<'a>>,
    signature: Option<Text<'a>>,
}

fn annotations<'a>(scan: &mut Scan<'a>) -> Step<AnnotationsJson<'a>> {
    let mut a = AnnotationsJson::default();
    string_map(scan, |key, value| {
        let slot = match key {
            "dag_id" => &mut a.dag_id,
            "task_id" => &mut a.task_id,
            "run_id" => &mut a.run_id,
            "try_number" => &mut a.try_number,
            "map_index" => &mut a.map_index,
            "logical_date" => &mut a.logical_date,
            "execution_date" => &mut a.execution_date,
            "task_instance_id" => &mut a.task_instance_id,
            SIGNATURE_ANNOTATION => &mut a.signature,
            _ => return,
        };
        *slot = Some(value);
    })?;
    Ok(a)
}

/// Reads a JSON object of strings, handing each entry to `keep` (a later duplicate key
/// wins, as in a map).
fn string_map<'a>(scan: &mut Scan<'a>, mut keep: impl FnMut(&str, Text<'a>)) -> Step<()> {
    scan.object(|key, scan| {
        keep(key, scan.string()?);
        Ok(())
    })
}

struct SpecJson<'a> {
    containers: Option<Vec<NameJson<'a>>>,
}

fn spec<'a>(scan: &mut Scan<'a>) -> Step<SpecJson<'a>> {
    let (mut containers, mut seen) = (None, Seen::default());
    scan.object(|key, scan| match key {
        "containers" => {
            seen.first(0)?;
            containers = list(scan, container)?;
            Ok(())
        }
        _ => scan.skip(),
    })?;
    Ok(SpecJson { containers })
}

struct NameJson<'a> {
    name: Option<Text<'a>>,
}

fn container<'a>(scan: &mut Scan<'a>) -> Step<NameJson<'a>> {
    let (mut name, mut seen) = (None, Seen::default());
    scan.object(|key, scan| match key {
        "name" => {
            seen.first(0)?;
            name = text(scan)?;
            Ok(())
        }
        _ => scan.skip(),
    })?;
    Ok(NameJson { name })
}

#[derive(Default)]
struct StatusJson<'a> {
    phase: Option<Text<'a>>,
    reason: Option<Text<'a>>,
    init_container_statuses: Option<Vec<ContainerStatusJson<'a>>>,
    container_statuses: Option<Vec<ContainerStatusJson<'a>>>,
}

fn status<'a>(scan: &mut Scan<'a>) -> Step<StatusJson<'a>> {
    let (mut status, mut seen) = (StatusJson::default(), Seen::default());
    scan.object(|key, scan| {
        match key {
            "phase" => (seen.first(0)?, status.phase = text(scan)?),
            "reason" => (seen.first(1)?, status.reason = text(scan)?),
            "initContainerStatuses" => (
                seen.first(2)?,
                status.init_container_statuses = list(scan, container_status)?,
            ),
            "containerStatuses" => (
                seen.first(3)?,
                status.container_statuses = list(scan, container_status)?,
            ),
            _ => return scan.skip(),
        };
        Ok(())
    })?;
    Ok(status)
}

#[derive(Default)]
struct ContainerStatusJson<'a> {
    name: Option<Text<'a>>,
    state: Option<StateJson<'a>>,
}

fn container_status<'a>(scan: &mut Scan<'a>) -> Step<ContainerStatusJson<'a>> {
    let (mut status, mut seen) = (ContainerStatusJson::default(), Seen::default());
    scan.object(|key, scan| {
        match key {
            "name" => (seen.first(0)?, status.name = text(scan)?),
            "state" => (seen.first(1)?, status.state = nullable(scan, state)?),
            _ => return scan.skip(),
        };
        Ok(())
    })?;
    Ok(status)
}

#[derive(Default)]
struct StateJson<'a> {
    waiting: Option<WaitingJson<'a>>,
    terminated: Option<TerminatedJson<'a>>,
}

fn state<'a>(scan: &mut Scan<'a>) -> Step<StateJson<'a>> {
    let (mut state, mut seen) = (StateJson::default(), Seen::default());
    scan.object(|key, scan| {
        match key {
            "waiting" => (seen.first(0)?, state.waiting = nullable(scan, waiting)?),
            "terminated" => (
                seen.first(1)?,
                state.terminated = nullable(scan, terminated)?,
            ),
            _ => return scan.skip(),
        };
        Ok(())
    })?;
    Ok(state)
}

#[derive(Default)]
struct WaitingJson<'a> {
    reason: Option<Text<'a>>,
    message: Option<Text<'a>>,
}

fn waiting<'a>(scan: &mut Scan<'a>) -> Step<WaitingJson<'a>> {
    let (mut waiting, mut seen) = (WaitingJson::default(), Seen::default());
    scan.object(|key, scan| {
        match key {
            "reason" => (seen.first(0)?, waiting.reason = text(scan)?),
            "message" => (seen.first(1)?, waiting.message = text(scan)?),
            _ => return scan.skip(),
        };
        Ok(())
    })?;
    Ok(waiting)
}

#[derive(Default)]
struct TerminatedJson<'a> {
    exit_code: Option<i32>,
    reason: Option<Text<'a>>,
}

fn terminated<'a>(scan: &mut Scan<'a>) -> Step<TerminatedJson<'a>> {
    let (mut terminated, mut seen) = (TerminatedJson::default(), Seen::default());
    scan.object(|key, scan| {
        match key {
            "exitCode" => (seen.first(0)?, terminated.exit_code = exit_code(scan)?),
            "reason" => (seen.first(1)?, terminated.reason = text(scan)?),
            _ => return scan.skip(),
        };
        Ok(())
    })?;
    Ok(terminated)
}

/// An `i32` as serde reads one from JSON, or `null`.
fn exit_code(scan: &mut Scan<'_>) -> Step<Option<i32>> {
    nullable(scan, |scan| {
        // serde_json's own reading: it takes `-0` for a float, and so refuses it, for one.
        serde_json::from_str::<i32>(scan.number()?).map_err(|_| Decline)
    })
}

impl PodJson<'_> {
    fn facts(&self) -> PodFacts<'_> {
        let meta = self.metadata.as_ref();
        let labels = meta.and_then(|m| m.labels.as_ref());
        let status = self.status.as_ref();
        PodFacts {
            uid: meta.and_then(|m| as_str(&m.uid)),
            namespace: meta.and_then(|m| as_str(&m.namespace)),
            name: meta.and_then(|m| as_str(&m.name)),
            resource_version: meta.and_then(|m| as_str(&m.resource_version)),
            creation_unix_ms: meta
                .and_then(|m| m.creation_timestamp.as_ref())
                .map(unix_ms),
            deletion_unix_ms: meta
                .and_then(|m| m.deletion_timestamp.as_ref())
                .map(unix_ms),
            labels: Labels {
                owner: labels.and_then(|l| as_str(&l.owner)),
                done: labels.and_then(|l| as_str(&l.done)),
                revoked: labels.and_then(|l| as_str(&l.revoked)),
            },
            annotations: meta
                .and_then(|m| m.annotations.as_ref())
                .map(|a| KeyAnnotations {
                    dag_id: as_str(&a.dag_id),
                    task_id: as_str(&a.task_id),
                    run_id: as_str(&a.run_id),
                    try_number: as_str(&a.try_number),
                    map_index: as_str(&a.map_index),
                    logical_date: as_str(&a.logical_date),
                    execution_date: as_str(&a.execution_date),
                    task_instance_id: as_str(&a.task_instance_id),
                    signature: as_str(&a.signature),
                }),
            phase: status.and_then(|s| as_str(&s.phase)),
            status_reason: status.and_then(|s| as_str(&s.reason)),
            first_container: self
                .spec
                .as_ref()
                .and_then(|s| s.containers.as_ref()?.first())
                .map(|c| c.name.as_deref().unwrap_or_default()),
            init_statuses: statuses(status.and_then(|s| s.init_container_statuses.as_deref())),
            app_statuses: statuses(status.and_then(|s| s.container_statuses.as_deref())),
        }
    }
}

impl ContainerStatusJson<'_> {
    fn facts(&self) -> StatusFacts<'_> {
        let state = self.state.as_ref();
        StatusFacts {
            name: self.name.as_deref().unwrap_or_default(),
            waiting: state
                .and_then(|s| s.waiting.as_ref())
                .map(|w| (w.reason.as_deref(), w.message.as_deref())),
            terminated: state
                .and_then(|s| s.terminated.as_ref())
                .map(|t| (t.exit_code.unwrap_or_default(), t.reason.as_deref())),
        }
    }
}

fn as_str<'a>(value: &'a Option<Text<'_>>) -> Option<&'a str> {
    value.as_deref()
}

fn statuses<'a>(list: Option<&'a [ContainerStatusJson<'_>]>) -> Vec<StatusFacts<'a>> {
    list.map(|l| l.iter().map(|s| s.facts()).collect())
        .unwrap_or_default()
}
