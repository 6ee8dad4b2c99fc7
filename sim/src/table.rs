//! Server-side printing: the `Table` form `kubectl get` asks for when no `-o` is given.

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::resource::Resource;

/// `columnDefinitions` of a resource's table.
pub fn columns(resource: Resource) -> Value {
    let column = |name: &str, kind: &str, format: &str, description: &str| json!({ "name": name, "type": kind, "format": format, "description": description, "priority": 0 });
    let name = column(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
    );
    let age = column(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    match resource {
        Resource::Pods => json!([
            name,
            column(
                "Ready",
                "string",
                "",
                "The aggregate readiness state of this pod for accepting traffic."
            ),
            column(
                "Status",
                "string",
                "",
                "The aggregate status of the containers in this pod."
            ),
            column(
                "Restarts",
                "string",
                "",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."
            ),
            age,
        ]),
        Resource::Namespaces => json!([
            name,
            column("Status", "string", "", "The status of the namespace"),
            age,
        ]),
        Resource::Leases => json!([
            name,
            column("Holder", "string", "", "The holder of the lease"),
            age,
        ]),
        // kube-apiserver's columns for a definition without additionalPrinterColumns.
        Resource::Custom(_) => json!([name, age]),
    }
}

/// One table row for an object; `full` includes the whole object rather than its metadata.
pub fn row(resource: Resource, object: &Value, full: bool) -> Value {
    let meta = object.get("metadata").cloned().unwrap_or_default();
    let name = meta.get("name").cloned().unwrap_or_default();
    let age = meta
        .get("creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(human_age)
        .unwrap_or_else(|| "<unknown>".to_owned());
    let cells = match resource {
        Resource::Pods => {
            let (ready, total, restarts) = readiness(object);
            json!([
                name,
                format!("{ready}/{total}"),
                pod_status(object),
                restarts.to_string(),
                age
            ])
        }
        Resource::Namespaces => {
            json!([
                name,
                object["status"]["phase"].as_str().unwrap_or("Active"),
                age
            ])
        }
        Resource::Leases => {
            json!([
                name,
                object["spec"]["holderIdentity"].as_str().unwrap_or(""),
                age
            ])
        }
        Resource::Custom(_) => json!([name, age]),
    };
    let embedded = if full {
        object.clone()
    } else {
        json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta })
    };
    json!({ "cells": cells, "object": embedded })
}

/// A `Table` holding the given rows; `with_columns` false for watch events after the first.
pub fn table(
    resource: Resource,
    rows: Vec<Value>,
    resource_version: u64,
    continue_token: Option<&str>,
    with_columns: bool,
) -> Value {
    let mut metadata = json!({ "resourceVersion": resource_version.to_string() });
    if let Some(token) = continue_token {
        metadata["continue"] = json!(token);
    }
    let mut table = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "rows": rows,
    });
    table["columnDefinitions"] = if with_columns {
        columns(resource)
    } else {
        Value::Null
    };
    table
}

fn readiness(pod: &Value) -> (usize, usize, u64) {
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let statuses = pod["status"]["containerStatuses"].as_array();
    let ready = statuses.map_or(0, |s| {
        s.iter().filter(|c| c["ready"] == json!(true)).count()
    });
    let restarts = statuses.map_or(0, |s| {
        s.iter().filter_map(|c| c["restartCount"].as_u64()).sum()
    });
    (ready, total, restarts)
}

/// The STATUS column, worked out like kubectl's pod printer (simplified).
fn pod_status(pod: &Value) -> String {
    if pod["metadata"]["deletionTimestamp"].is_string() {
        return "Terminating".to_owned();
    }
    let mut status = pod["status"]["reason"]
        .as_str()
        .or_else(|| pod["status"]["phase"].as_str())
        .unwrap_or("Unknown")
        .to_owned();
    for (list, prefix) in [
        ("initContainerStatuses", "Init:"),
        ("containerStatuses", ""),
    ] {
        for container in pod["status"][list].as_array().into_iter().flatten() {
            let state = &container["state"];
            if let Some(reason) = state["waiting"]["reason"]
                .as_str()
                .filter(|r| !r.is_empty() && *r != "PodInitializing")
            {
                return format!("{prefix}{reason}");
            }
            if let Some(reason) = state["terminated"]["reason"].as_str()
                && (prefix.is_empty() || state["terminated"]["exitCode"] != json!(0))
            {
                status = format!("{prefix}{reason}");
            }
        }
    }
    status
}

/// `5s`, `3m2s`, `4h`, `2d`: the AGE column.
fn human_age(since: Timestamp) -> String {
    let seconds = (Timestamp::now().as_second() - since.as_second()).max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}
