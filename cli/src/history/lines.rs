//! How a pod event, a command or a pod the collector collected is printed, as text for people
//! or JSON for `jq`: shared by `tail` and `replay`.

use podstream_collector::collected::Collected;
use podstream_proto::line::CommandLine;
use podstream_proto::subject::{Stream, Subjects};
use podstream_proto::v1::EventType;
use podstream_proto::{Command, PodEvent};
use prost::Message as _;
use serde_json::json;

/// A pod-event or command message as a line of text or JSON; `role` is its
/// `Podstream-Role` header (`event` when absent).
pub fn describe(
    subjects: &Subjects,
    subject: &str,
    role: Option<&str>,
    payload: &[u8],
    as_json: bool,
) -> String {
    let subject_owner = subjects
        .parse(subject)
        .map(|(owner, _)| owner)
        .unwrap_or_default();
    let role = role.unwrap_or("event");
    if podstream_collector::collected::is_entry(subjects, subject) {
        return match Collected::decode(payload) {
            Ok(collected) => collected_line(&collected, subject, as_json),
            Err(error) => undecodable(subject, &error.to_string(), as_json),
        };
    }
    if subjects.stream_of(subject) == Some(Stream::PodEvents) {
        match PodEvent::decode(payload) {
            Ok(event) => pod_line(&event, subject, &subject_owner, role, as_json),
            Err(error) => undecodable(subject, &error.to_string(), as_json),
        }
    } else {
        match Command::decode(payload) {
            Ok(command) => command_line(&command, subject, as_json),
            Err(error) => undecodable(subject, &error.to_string(), as_json),
        }
    }
}

fn pod_line(
    event: &PodEvent,
    subject: &str,
    subject_owner: &str,
    role: &str,
    as_json: bool,
) -> String {
    let pod = event.pod.clone().unwrap_or_default();
    let kind = match event.r#type() {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
        EventType::Unspecified => "?",
    };
    let phase = event
        .phase()
        .as_str_name()
        .trim_start_matches("PHASE_")
        .to_owned();
    let ti = event
        .task
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    if as_json {
        return json!({
            "stream": "pods", "subject": subject, "role": role, "type": kind, "owner": event.owner,
            "subject_owner": subject_owner, "pod": pod, "ti": event.task, "phase": phase,
            "resource_version": event.resource_version, "deleting": event.deletion_unix_ms.is_some(),
            "synthesized": event.synthesized,
        })
        .to_string();
    }
    let notice = if role == "left" {
        format!(" (left scheduler {subject_owner})")
    } else {
        String::new()
    };
    let synthesized = if event.synthesized {
        " synthesized"
    } else {
        ""
    };
    printable(format!(
        "pod  {kind:<8}{synthesized} {}/{} rv={} owner={} phase={phase} ti={ti}{notice}",
        pod.namespace, pod.name, event.resource_version, event.owner
    ))
}

/// `line` with every control character escaped (`\u{1b}`): names and reasons come from pods,
/// and a terminal must not run what a pod's annotations say.
fn printable(line: String) -> String {
    if !line.chars().any(char::is_control) {
        return line;
    }
    line.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A command as a line of text or JSON (the JSON is `decide`'s line plus stream and subject).
pub fn command_line(command: &Command, subject: &str, as_json: bool) -> String {
    let line = CommandLine::from(command);
    if as_json {
        let mut value = serde_json::to_value(&line).unwrap_or_default();
        value["stream"] = json!("commands");
        value["subject"] = json!(subject);
        return value.to_string();
    }
    let pod = command.pod.clone().unwrap_or_default();
    let ti = command
        .task
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let reason = line
        .reason
        .map(|r| format!(" reason={r}"))
        .unwrap_or_default();
    let to = line.to.map(|t| format!(" to={t}")).unwrap_or_default();
    printable(format!(
        "cmd  {:<8} {}/{} owner={} ti={ti}{reason}{to}",
        line.kind, pod.namespace, pod.name, command.owner
    ))
}

/// A pod the collector deleted or labelled done, as a line of text or JSON.
pub fn collected_line(collected: &Collected, subject: &str, as_json: bool) -> String {
    if as_json {
        let mut value = serde_json::to_value(collected).unwrap_or_default();
        value["stream"] = json!("collected");
        value["subject"] = json!(subject);
        return value.to_string();
    }
    let driver = collected
        .driver
        .as_ref()
        .map(|d| format!(" drives={}/{}", d.namespace, d.name))
        .unwrap_or_default();
    printable(format!(
        "del  {:<8} {}/{} {} ({}) ti={}{driver}",
        collected.reason,
        collected.pod.namespace,
        collected.pod.name,
        collected.action,
        collected.answer,
        collected.ti
    ))
}

fn undecodable(subject: &str, error: &str, as_json: bool) -> String {
    if as_json {
        json!({ "subject": subject, "error": error }).to_string()
    } else {
        printable(format!("?    {subject}: not decodable: {error}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podstream_proto::TaskKey;

    #[test]
    fn text_lines_escape_control_characters_and_json_lines_stay_json() {
        let command = Command {
            task: Some(TaskKey {
                dag_id: "etl\u{1b}]0;pwned\u{7}".into(),
                task_id: "load\nnext".into(),
                run_id: "r".into(),
                map_index: -1,
                try_number: 1,
                ..TaskKey::default()
            }),
            kind: Some(podstream_proto::v1::command::Kind::Running(
                podstream_proto::v1::Running {},
            )),
            ..Command::default()
        };
        let text = command_line(&command, "podstream.commands.1.u", false);
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.contains("etl\\u{1b}]0;pwned\\u{7}"), "{text}");
        let json = command_line(&command, "podstream.commands.1.u", true);
        assert!(!json.chars().any(char::is_control), "{json:?}");
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["ti"]["dag_id"], "etl\u{1b}]0;pwned\u{7}");
    }
}
