//! Discovery documents: what `kubectl` reads to learn which resources exist and where.

use serde_json::{Value, json};

use crate::resource::{Resource, Served};

/// The Kubernetes version the simulator reports (the API it imitates).
pub const KUBERNETES_VERSION: (&str, &str) = ("1", "33");

/// `GET /version`.
pub fn version() -> Value {
    let (major, minor) = KUBERNETES_VERSION;
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": format!("v{major}.{minor}.0-podstream-sim"),
        "gitCommit": "podstream-sim",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "none",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// `GET /api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

/// `GET /apis`.
pub fn groups(served: &Served) -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": named_groups(served).into_iter().map(|(name, version)| group(name, version)).collect::<Vec<_>>(),
    })
}

/// Each named group with its one served version, in discovery order.
fn named_groups(served: &Served) -> Vec<(&'static str, &'static str)> {
    let mut names: Vec<_> = served
        .all()
        .map(|r| (r.group(), r.version()))
        .filter(|(g, _)| !g.is_empty())
        .collect();
    names.dedup();
    names
}

/// `GET /apis/<group>`, or `None` for a group the simulator does not serve.
pub fn api_group(served: &Served, name: &str) -> Option<Value> {
    named_groups(served)
        .into_iter()
        .find(|(group, _)| *group == name)
        .map(|(name, version)| group(name, version))
}

fn group(name: &str, version: &str) -> Value {
    let version = json!({ "groupVersion": format!("{name}/{version}"), "version": version });
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": [version],
        "preferredVersion": version,
    })
}

/// `GET /api/v1` or `GET /apis/<group>/v1`, or `None` for a group the simulator does not serve.
pub fn resource_list(served: &Served, group: &str, version: &str) -> Option<Value> {
    let served: Vec<Resource> = served
        .all()
        .filter(|r| r.group() == group && r.version() == version)
        .collect();
    if served.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for resource in served {
        let mut entry = json!({
            "name": resource.plural(),
            "singularName": resource.singular(),
            "namespaced": resource.namespaced(),
            "kind": resource.kind(),
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        });
        if !resource.short_names().is_empty() {
            entry["shortNames"] = json!(resource.short_names());
        }
        if resource == Resource::Pods {
            entry["categories"] = json!(["all"]);
        }
        resources.push(entry);
        for sub in resource.subresources() {
            resources.push(json!({
                "name": format!("{}/{sub}", resource.plural()),
                "singularName": "",
                "namespaced": resource.namespaced(),
                "kind": resource.kind(),
                "verbs": ["get", "patch", "update"],
            }));
        }
        for sub in resource.read_only_subresources() {
            resources.push(json!({
                "name": format!("{}/{sub}", resource.plural()),
                "singularName": "",
                "namespaced": resource.namespaced(),
                "kind": resource.kind(),
                "verbs": ["get"],
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// `GET /openapi/v3`: where each group version's document lives.
pub fn openapi_index(served: &Served) -> Value {
    let mut paths = serde_json::Map::new();
    for resource in served.all() {
        let path = group_version_path(resource.group(), resource.version());
        paths.insert(
            path.clone(),
            json!({ "serverRelativeURL": format!("/openapi/v3/{path}?hash=podstream-sim") }),
        );
    }
    json!({ "paths": paths })
}

fn group_version_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `GET /openapi/v3/<group version path>`: the operations of the served resources, with the
/// query parameters they accept. kubectl reads it to learn that the server validates fields,
/// so it needs no schemas; `None` for a group version the simulator does not serve.
pub fn openapi_group_version(served: &Served, path: &str) -> Option<Value> {
    let served: Vec<Resource> = served
        .all()
        .filter(|r| group_version_path(r.group(), r.version()) == path)
        .collect();
    if served.is_empty() {
        return None;
    }
    let query = |name: &str| json!({ "name": name, "in": "query", "schema": { "type": "string", "uniqueItems": true } });
    let write_params = json!([
        query("dryRun"),
        query("fieldManager"),
        query("fieldValidation")
    ]);
    let mut paths = serde_json::Map::new();
    for resource in served {
        let gvk = json!({ "group": resource.group(), "version": resource.version(), "kind": resource.kind() });
        let operation = |action: &str, params: &Value| {
            json!({
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": params,
                "responses": { "200": { "description": "OK" } },
            })
        };
        let base = if resource.namespaced() {
            format!("/{path}/namespaces/{{namespace}}/{}", resource.plural())
        } else {
            format!("/{path}/{}", resource.plural())
        };
        let list_params = json!([
            query("labelSelector"),
            query("fieldSelector"),
            query("limit"),
            query("continue"),
            query("resourceVersion"),
            query("watch")
        ]);
        paths.insert(
            base.clone(),
            json!({ "get": operation("list", &list_params), "post": operation("post", &write_params) }),
        );
        let item = json!({
            "get": operation("get", &json!([])),
            "put": operation("put", &write_params),
            "patch": operation("patch", &write_params),
            "delete": operation("delete", &json!([query("gracePeriodSeconds"), query("dryRun")])),
        });
        paths.insert(format!("{base}/{{name}}"), item);
        for sub in resource.subresources() {
            paths.insert(
                format!("{base}/{{name}}/{sub}"),
                json!({ "get": operation("get", &json!([])), "put": operation("put", &write_params), "patch": operation("patch", &write_params) }),
            );
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes (podstream simulator)", "version": "v1.33.0" },
        "paths": paths,
        "components": { "schemas": {} },
    }))
}

/// `GET /openapi/v2` as JSON: a valid document with no definitions, so clients that validate
/// against it skip validation of kinds it does not describe (the server validates instead).
pub fn openapi_v2_json() -> Value {
    json!({
        "swagger": "2.0",
        "info": { "title": "Kubernetes (podstream simulator)", "version": "v1.33.0" },
        "paths": {},
        "definitions": {},
    })
}

/// The same document in the protobuf encoding (gnostic `openapi_v2.Document`) that older
/// kubectl releases ask for: field 1 `swagger`, field 2 `info` with `title` (1) and
/// `version` (2). Written by hand: three strings do not warrant a schema compiler.
pub fn openapi_v2_protobuf() -> Vec<u8> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2);
        // Every field here is shorter than 128 bytes, so its length is one varint byte.
        out.push(u8::try_from(bytes.len()).unwrap_or(127).min(127));
        out.extend_from_slice(&bytes[..bytes.len().min(127)]);
    }
    let mut info = Vec::new();
    field(&mut info, 1, b"Kubernetes (podstream simulator)");
    field(&mut info, 2, b"v1.33.0");
    let mut document = Vec::new();
    field(&mut document, 1, b"2.0");
    field(&mut document, 2, &info);
    document
}
