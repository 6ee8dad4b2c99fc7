//! The HTTP face of the simulator: kube-apiserver's URL layout, verbs and query parameters.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;

use crate::apply::FieldManager;
use crate::cluster::{Cluster, DeleteOptions, Deletion, ListQuery, ResourceVersionMatch};
use crate::discovery;
use crate::object::{Key, Stored};
use crate::patch::PatchType;
use crate::protobuf;
use crate::query::Query;
use crate::resource::{Resource, Served};
use crate::selector::{FieldSelector, Filter, LabelSelector};
use crate::status::{self, ApiError, Reason};
use crate::table;
use crate::watch::{self, Format, WatchRequest};

/// What the handler needs besides the cluster: the address clients reach it at.
#[derive(Clone)]
pub struct AppState {
    /// The cluster.
    pub cluster: Cluster,
    /// `host:port` for `/api`'s serverAddressByClientCIDRs.
    pub address: String,
    /// Host names answered besides loopback ones ([`host_allowed`]).
    pub allowed_hosts: Vec<String>,
    /// The bearer token every request must carry.
    pub token: std::sync::Arc<str>,
}

/// Whether a request's `Host` header names this server: a loopback name (`localhost`,
/// `127.0.0.1`, `[::1]`, any port) or one of `allowed`. A web page's script that reaches the
/// simulator through a name it controls (DNS rebinding) sends that name, and is refused.
pub fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host else {
        // HTTP/1.0 without Host: no browser sends that.
        return true;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or(v6, |(name, _)| name),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let loopback = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// The router: one handler that parses kube-apiserver paths itself.
pub fn router(state: AppState) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(state)
}

/// What a resource path names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    legacy_watch: bool,
}

async fn handle(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let latency = state.cluster.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok());
    if !host_allowed(host, &state.allowed_hosts) {
        tracing::warn!(host = ?host, path = uri.path(), "request for a host the simulator does not answer to; refused");
        return error_response(&ApiError::new(
            Reason::Forbidden,
            format!(
                "host {:?} is not one the simulator answers to (loopback names, or --allow-host)",
                host.unwrap_or_default()
            ),
        ));
    }
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|value| value.as_bytes());
    if !crate::tls::bearer_matches(authorization, &state.token) {
        tracing::warn!(
            path = uri.path(),
            "request that lacks the simulator's bearer token; refused"
        );
        return error_response(&ApiError::new(Reason::Unauthorized, "Unauthorized"));
    }
    let query = Query::parse(uri.query());
    let request = Request {
        method: &method,
        query: &query,
        headers: &headers,
        body: &body,
    };
    let response = route(&state, uri.path(), &request);
    match response {
        Ok(response) => {
            tracing::debug!(%method, path = uri.path(), status = response.status().as_u16(), "request");
            response
        }
        Err(error) => {
            tracing::debug!(%method, path = uri.path(), code = error.code(), reason = error.reason.as_str(), message = %error.message, "request refused");
            error_response(&error)
        }
    }
}

/// What a handler reads of a request besides its path.
struct Request<'a> {
    method: &'a Method,
    query: &'a Query,
    headers: &'a HeaderMap,
    body: &'a [u8],
}

fn route(state: &AppState, path: &str, request: &Request<'_>) -> Result<Response, ApiError> {
    let method = request.method;
    let headers = request.headers;
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let served = state.cluster.served();
    let only_get = |value: Option<Value>| -> Result<Response, ApiError> {
        if method != Method::GET {
            return Err(ApiError::new(
                Reason::MethodNotAllowed,
                "the server does not allow this method on the requested resource",
            ));
        }
        value
            .map(|v| json_response(StatusCode::OK, &v))
            .ok_or_else(not_served)
    };
    match segments.as_slice() {
        ["version"] => only_get(Some(discovery::version())),
        ["healthz" | "livez" | "readyz"] => Ok(text_response(StatusCode::OK, "ok")),
        ["api"] => only_get(Some(discovery::core_versions(&state.address))),
        ["api", version] => only_get(discovery::resource_list(served, "", version)),
        ["apis"] => only_get(Some(discovery::groups(served))),
        ["apis", group] => only_get(discovery::api_group(served, group)),
        ["apis", group, version] => only_get(discovery::resource_list(served, group, version)),
        ["openapi", "v2"] if method == Method::GET => Ok(openapi_v2(headers)),
        ["openapi", "v3"] => only_get(Some(discovery::openapi_index(served))),
        ["openapi", "v3", rest @ ..] => {
            only_get(discovery::openapi_group_version(served, &rest.join("/")))
        }
        ["api", version, rest @ ..] => {
            let target = parse_target(served, "", version, rest)?;
            serve(state, &target, request)
        }
        ["apis", group, version, rest @ ..] => {
            let target = parse_target(served, group, version, rest)?;
            serve(state, &target, request)
        }
        _ => Err(not_served()),
    }
}

fn not_served() -> ApiError {
    ApiError::new(
        Reason::NotFound,
        "the server could not find the requested resource",
    )
}

fn parse_target(
    served: &Served,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Target, ApiError> {
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let find = |plural: &str| served.find(group, version, plural).ok_or_else(not_served);
    let target =
        |resource, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| Target {
            resource,
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            subresource: sub.map(str::to_owned),
            legacy_watch,
        };
    let namespaces_served = group.is_empty();
    match rest {
        ["namespaces", ns, plural, tail @ ..]
            if namespaces_served || served.find(group, version, plural).is_some() =>
        {
            match (served.find(group, version, plural), tail) {
                (Some(resource), []) if resource.namespaced() => {
                    Ok(target(resource, Some(ns), None, None))
                }
                (Some(resource), [name]) if resource.namespaced() => {
                    Ok(target(resource, Some(ns), Some(name), None))
                }
                (Some(resource), [name, sub])
                    if resource.namespaced() && resource.serves_subresource(sub) =>
                {
                    Ok(target(resource, Some(ns), Some(name), Some(sub)))
                }
                // `/api/v1/namespaces/<name>/status`: the namespace's own subresource.
                (None, [])
                    if group.is_empty() && Resource::Namespaces.subresources().contains(plural) =>
                {
                    Ok(target(Resource::Namespaces, None, Some(ns), Some(plural)))
                }
                _ => Err(not_served()),
            }
        }
        [plural] => Ok(target(find(plural)?, None, None, None)),
        [plural, name] => {
            let resource = find(plural)?;
            if resource.namespaced() {
                return Err(not_served());
            }
            Ok(target(resource, None, Some(name), None))
        }
        [plural, name, sub] => {
            let resource = find(plural)?;
            if resource.namespaced() || !resource.subresources().contains(sub) {
                return Err(not_served());
            }
            Ok(target(resource, None, Some(name), Some(sub)))
        }
        _ => Err(not_served()),
    }
}

fn serve(state: &AppState, target: &Target, request: &Request<'_>) -> Result<Response, ApiError> {
    let Request {
        method,
        query,
        headers,
        body,
    } = *request;
    if query.non_empty("dryRun").is_some() {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the podstream simulator",
        ));
    }
    let cluster = &state.cluster;
    let resource = target.resource;
    let format = requested_format(headers, query);
    let status_sub = target.subresource.as_deref() == Some("status");
    if let (Some(name), Some("log")) = (&target.name, target.subresource.as_deref()) {
        if method != Method::GET {
            return Err(ApiError::new(
                Reason::MethodNotAllowed,
                "the server does not allow this method on the requested resource",
            ));
        }
        let namespace = target.namespace.as_deref().unwrap_or_default();
        let log = cluster.pod_log(namespace, name, query.get("container"))?;
        let mut response = Response::new(Body::from(log));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain"),
        );
        return Ok(response);
    }
    match (&target.name, method.clone()) {
        (None, Method::GET) => {
            let filter = filter(resource, target.namespace.as_deref(), query)?;
            if target.legacy_watch || query.flag("watch") {
                return watch_response(cluster, resource, filter, query, format);
            }
            list_response(cluster, resource, filter, query, format)
        }
        (None, Method::POST) => {
            if resource.namespaced() && target.namespace.is_none() {
                return Err(ApiError::new(
                    Reason::MethodNotAllowed,
                    "create needs a namespace in the path",
                ));
            }
            let value = parse_body(headers, body)?;
            let stored = cluster.create(
                resource,
                target.namespace.as_deref().unwrap_or(""),
                value,
                true,
            )?;
            Ok(object_response(StatusCode::CREATED, &stored, format))
        }
        (Some(name), Method::GET) if !target.legacy_watch => {
            let stored = cluster.get(&key(target, name))?;
            Ok(object_response(StatusCode::OK, &stored, format))
        }
        (Some(name), Method::PUT) => {
            let value = parse_body(headers, body)?;
            let stored =
                cluster.replace(&key(target, name), value, status_sub, &field_manager(query))?;
            Ok(object_response(StatusCode::OK, &stored, format))
        }
        (Some(name), Method::PATCH) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let patch_type = PatchType::from_content_type(content_type)?;
            if patch_type == PatchType::Apply && query.non_empty("fieldManager").is_none() {
                return Err(ApiError::bad_request(
                    "PATCH: fieldManager is required for apply requests",
                ));
            }
            let stored = cluster.patch(
                &key(target, name),
                patch_type,
                body,
                status_sub,
                &field_manager(query),
            )?;
            Ok(object_response(StatusCode::OK, &stored, format))
        }
        (Some(name), Method::DELETE) if target.subresource.is_none() => {
            let options = delete_options(query, body)?;
            match cluster.delete(&key(target, name), &options)? {
                Deletion::Gone(last) if resource == Resource::Namespaces => {
                    let _ = last;
                    Ok(json_response(StatusCode::OK, &status::success()))
                }
                Deletion::Gone(last) => Ok(object_response(StatusCode::OK, &last, Format::Object)),
                Deletion::Pending(current) => {
                    Ok(object_response(StatusCode::OK, &current, Format::Object))
                }
            }
        }
        _ => Err(ApiError::new(
            Reason::MethodNotAllowed,
            format!("the server does not allow this method on the requested resource ({method})"),
        )),
    }
}

/// The writer a request names; server-side apply records and checks ownership by it.
fn field_manager(query: &Query) -> FieldManager {
    FieldManager {
        name: query
            .non_empty("fieldManager")
            .map(str::to_owned)
            .unwrap_or_else(|| FieldManager::unknown().name),
        force: query.flag("force"),
    }
}

fn key(target: &Target, name: &str) -> Key {
    Key::new(
        target.resource,
        target.namespace.as_deref().unwrap_or(""),
        name,
    )
}

fn filter(resource: Resource, namespace: Option<&str>, query: &Query) -> Result<Filter, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").unwrap_or_default(),
        resource.selectable_fields(),
    )?;
    Ok(Filter {
        namespace: namespace.map(str::to_owned),
        labels,
        fields,
    })
}

fn list_response(
    cluster: &Cluster,
    resource: Resource,
    filter: Filter,
    query: &Query,
    format: Format,
) -> Result<Response, ApiError> {
    // A limit of zero or less lists everything, as on the real server.
    let limit = query
        .integer("limit")?
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| *n > 0);
    let list_query = ListQuery {
        filter,
        limit,
        continue_token: query.non_empty("continue").map(str::to_owned),
        resource_version: query.get("resourceVersion").map(str::to_owned),
        resource_version_match: resource_version_match(query)?,
    };
    let page = cluster.list(resource, &list_query)?;
    if let Format::Table { full } = format {
        let rows = page
            .items
            .iter()
            .map(|o| o.value().map(|v| table::row(resource, &v, full)))
            .collect::<Result<Vec<_>, _>>()?;
        let table = table::table(
            resource,
            rows,
            page.resource_version,
            page.continue_token.as_deref(),
            true,
        );
        return Ok(json_response(StatusCode::OK, &table));
    }
    let mut out =
        Vec::with_capacity(256 + page.items.iter().map(|o| o.json.len() + 1).sum::<usize>());
    out.extend_from_slice(b"{\"kind\":\"");
    out.extend_from_slice(resource.list_kind().as_bytes());
    out.extend_from_slice(b"\",\"apiVersion\":\"");
    out.extend_from_slice(resource.api_version().as_bytes());
    out.extend_from_slice(b"\",\"metadata\":");
    let mut metadata = serde_json::json!({ "resourceVersion": page.resource_version.to_string() });
    if let Some(token) = &page.continue_token {
        metadata["continue"] = serde_json::json!(token);
    }
    out.extend_from_slice(metadata.to_string().as_bytes());
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&item.json);
    }
    out.extend_from_slice(b"]}");
    Ok(bytes_response(StatusCode::OK, Bytes::from(out)))
}

/// `resourceVersionMatch`, validated as the apiserver validates `ListOptions` (422 otherwise).
fn resource_version_match(query: &Query) -> Result<Option<ResourceVersionMatch>, ApiError> {
    let Some(value) = query.non_empty("resourceVersionMatch") else {
        return Ok(None);
    };
    let invalid = |why: String| {
        ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            vec![("resourceVersionMatch".to_owned(), why)],
        )
    };
    let resource_version = query.get("resourceVersion").unwrap_or_default();
    if resource_version.is_empty() {
        return Err(invalid(
            "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
                .to_owned(),
        ));
    }
    if query.non_empty("continue").is_some() {
        return Err(invalid(
            "Forbidden: resourceVersionMatch is forbidden when continue is provided".to_owned(),
        ));
    }
    match value {
        "Exact" if resource_version == "0" => Err(invalid(
            "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""
                .to_owned(),
        )),
        "Exact" => Ok(Some(ResourceVersionMatch::Exact)),
        "NotOlderThan" => Ok(Some(ResourceVersionMatch::NotOlderThan)),
        other => Err(invalid(format!(
            "Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
        ))),
    }
}

fn watch_response(
    cluster: &Cluster,
    resource: Resource,
    filter: Filter,
    query: &Query,
    format: Format,
) -> Result<Response, ApiError> {
    let requested = query.get("resourceVersion").unwrap_or_default();
    let send_initial_events = query.optional_flag("sendInitialEvents") == Some(true);
    let from = match requested {
        "" | "0" => None,
        _ if send_initial_events => None,
        rv => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    // Zero or less means no timeout of the client's, as on the real server.
    let timeout = query
        .integer("timeoutSeconds")?
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let request = WatchRequest {
        resource,
        filter,
        from,
        send_initial_events,
        bookmarks: query.flag("allowWatchBookmarks"),
        timeout,
        format,
    };
    let mut restarts = cluster.restarts();
    restarts.borrow_and_update();
    let chunks = watch::start(cluster.clone(), request);
    // Chunks queued but not yet written are discarded too when watches are dropped.
    let dropped = async move {
        let _ = restarts.changed().await;
    };
    let body = Body::from_stream(
        ReceiverStream::new(chunks)
            .take_until(dropped)
            .map(Ok::<_, Infallible>),
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .map_err(|e| ApiError::new(Reason::InternalError, e.to_string()))
}

fn delete_options(query: &Query, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut options = DeleteOptions::default();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        options.grace_period_seconds = value.get("gracePeriodSeconds").and_then(Value::as_u64);
        let preconditions = value.get("preconditions");
        options.uid = preconditions
            .and_then(|p| p.get("uid"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        options.resource_version = preconditions
            .and_then(|p| p.get("resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    if let Some(grace) = query.integer("gracePeriodSeconds")? {
        // A negative grace period is taken as one second, as the pod registry does.
        options.grace_period_seconds = Some(u64::try_from(grace).unwrap_or(1));
    }
    Ok(options)
}

fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type.starts_with(protobuf::CONTENT_TYPE) {
        return protobuf::decode(body);
    }
    // Only a JSON media type: a web page may POST `text/plain` (or form data) to loopback
    // without asking, and must not create a pod whose command the kubelet would run.
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if media != "application/json" {
        return Err(ApiError::new(
            Reason::UnsupportedMediaType,
            format!(
                "the body of the request was in an unknown format ({media:?}) - accepted media types include: application/json, {}",
                protobuf::CONTENT_TYPE
            ),
        ));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is not a JSON object",
        ));
    }
    Ok(value)
}

fn requested_format(headers: &HeaderMap, query: &Query) -> Format {
    let wants_table = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.contains("as=Table"));
    if wants_table {
        Format::Table {
            full: query.get("includeObject") == Some("Object"),
        }
    } else {
        Format::Object
    }
}

fn object_response(code: StatusCode, stored: &Stored, format: Format) -> Response {
    match format {
        Format::Object => bytes_response(code, stored.json.clone()),
        Format::Table { full } => match stored.value() {
            Ok(value) => {
                let row = table::row(stored.key.resource, &value, full);
                let table = table::table(
                    stored.key.resource,
                    vec![row],
                    stored.resource_version,
                    None,
                    true,
                );
                json_response(code, &table)
            }
            Err(error) => error_response(&error),
        },
    }
}

fn openapi_v2(headers: &HeaderMap) -> Response {
    let wants_protobuf = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.contains("protobuf"));
    if !wants_protobuf {
        return json_response(StatusCode::OK, &discovery::openapi_v2_json());
    }
    let mut response = Response::new(Body::from(discovery::openapi_v2_protobuf()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        ),
    );
    response
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    bytes_response(code, Bytes::from(value.to_string()))
}

fn bytes_response(code: StatusCode, body: Bytes) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn text_response(code: StatusCode, text: &'static str) -> Response {
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn error_response(error: &ApiError) -> Response {
    let code = StatusCode::from_u16(error.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &error.to_status())
}
