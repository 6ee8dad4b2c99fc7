//! The request surface through the `kube` client: paging with consistent snapshots, every
//! label selector operator, field selectors, and the Status errors of the real server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use podstream_sim::{Server, SimConfig};
use serde_json::json;
use support::{client, name, server, server_with, worker};

fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn labelled(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": { "name": name, "namespace": "airflow", "labels": labels },
        "spec": { "containers": [{ "name": "base", "image": "busybox:1.36" }] },
    })
}

#[tokio::test]
async fn every_label_selector_operator_selects_like_kube_apiserver() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    for (pod, labels) in [
        (
            "a",
            json!({ "airflow-worker": "1", "tier": "etl", "try_number": "1" }),
        ),
        (
            "b",
            json!({ "airflow-worker": "2", "tier": "ml", "try_number": "3" }),
        ),
        ("c", json!({ "airflow-worker": "3", "try_number": "10" })),
        ("d", json!({ "other": "x" })),
    ] {
        sim.cluster().create_pod(labelled(pod, labels)).unwrap();
    }
    let table: &[(&str, &[&str])] = &[
        ("", &["a", "b", "c", "d"]),
        ("airflow-worker", &["a", "b", "c"]),
        ("!airflow-worker", &["d"]),
        ("airflow-worker=1", &["a"]),
        ("airflow-worker==2", &["b"]),
        ("airflow-worker!=1", &["b", "c", "d"]),
        ("airflow-worker in (1,3)", &["a", "c"]),
        ("airflow-worker notin (1,3)", &["b", "d"]),
        ("airflow-worker,tier=etl", &["a"]),
        ("airflow-worker,!tier", &["c"]),
        ("try_number>2", &["b", "c"]),
        ("try_number<3", &["a"]),
        (" airflow-worker  in ( 2 , 3 ) , tier ", &["b"]),
    ];
    for (selector, expected) in table {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap();
        let mut names: Vec<_> = list.items.iter().map(name).collect();
        names.sort();
        assert_eq!(names, *expected, "selector {selector:?}");
    }
    for bad in [
        "airflow-worker in (1",
        "=1",
        "a b",
        "key=val ue",
        "x in ()",
        "k>v",
        "bad/key/x",
    ] {
        let (code, reason) = api_error(pods.list(&ListParams::default().labels(bad)).await);
        assert_eq!(
            (code, reason.as_str()),
            (400, "BadRequest"),
            "selector {bad:?}"
        );
    }
}

#[tokio::test]
async fn field_selectors_filter_by_name_namespace_and_phase() {
    let sim = server().await;
    let client = client(&sim).await;
    for (pod, phase) in [
        ("p-run", "Running"),
        ("p-fail", "Failed"),
        ("p-pend", "Pending"),
    ] {
        sim.cluster().create_pod(worker(pod, "1")).unwrap();
        sim.cluster().set_phase("airflow", pod, phase).unwrap();
    }
    let mut other = worker("elsewhere", "1");
    other["metadata"]["namespace"] = json!("default");
    sim.cluster().create_pod(other).unwrap();
    let all: Api<Pod> = Api::all(client.clone());
    let table: &[(&str, &[&str])] = &[
        ("status.phase=Failed", &["p-fail"]),
        ("status.phase!=Pending", &["p-fail", "p-run"]),
        ("metadata.name=p-run", &["p-run"]),
        ("metadata.namespace=default", &["elsewhere"]),
        (
            "metadata.namespace!=default,status.phase==Pending",
            &["p-pend"],
        ),
    ];
    for (selector, expected) in table {
        let list = all
            .list(&ListParams::default().fields(selector))
            .await
            .unwrap();
        let mut names: Vec<_> = list.items.iter().map(name).collect();
        names.sort();
        assert_eq!(names, *expected, "field selector {selector:?}");
    }
    let (code, _) = api_error(
        all.list(&ListParams::default().fields("spec.containers=x"))
            .await,
    );
    assert_eq!(code, 400);
}

#[tokio::test]
async fn pages_read_one_consistent_snapshot_and_expire_with_compaction() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    let names: Vec<String> = (0..25).map(|i| format!("pod-{i:02}")).collect();
    for pod in &names {
        sim.cluster().create_pod(worker(pod, "1")).unwrap();
    }
    let first = pods.list(&ListParams::default().limit(10)).await.unwrap();
    let snapshot_rv = first.metadata.resource_version.clone().unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(first.items.len(), 10);

    // Changes after the first page do not leak into the next pages.
    sim.cluster()
        .set_phase("airflow", "pod-15", "Running")
        .unwrap();
    sim.cluster()
        .delete_pod("airflow", "pod-20", Some(0))
        .unwrap();
    sim.cluster().create_pod(worker("pod-99", "1")).unwrap();

    let mut seen: Vec<Pod> = first.items;
    let mut next = Some(token);
    while let Some(token) = next {
        let page = pods
            .list(&ListParams::default().limit(10).continue_token(&token))
            .await
            .unwrap();
        assert_eq!(
            page.metadata.resource_version.as_deref(),
            Some(snapshot_rv.as_str())
        );
        seen.extend(page.items);
        next = page.metadata.continue_.filter(|t| !t.is_empty());
    }
    let seen_names: Vec<String> = seen.iter().map(name).collect();
    assert_eq!(
        seen_names, names,
        "every pod once, in key order, as of the first page"
    );
    let pod_15 = seen.iter().find(|p| name(p) == "pod-15").unwrap();
    assert_eq!(
        pod_15.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );

    // A continue token older than the retained history is refused with 410.
    let first = pods.list(&ListParams::default().limit(10)).await.unwrap();
    sim.cluster()
        .set_phase("airflow", "pod-01", "Running")
        .unwrap();
    sim.cluster().compact();
    let token = first.metadata.continue_.unwrap();
    let (code, reason) = api_error(
        pods.list(&ListParams::default().limit(10).continue_token(&token))
            .await,
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn errors_carry_the_status_codes_and_reasons_of_the_real_server() {
    let sim = server().await;
    let client = client(&sim).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "airflow");
    let pod: Pod = serde_json::from_value(worker("p", "1")).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // 404: missing object, missing namespace.
    assert_eq!(api_error(pods.get("nope").await), (404, "NotFound".into()));
    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "no-such-ns");
    let mut unplaced = pod.clone();
    unplaced.metadata.namespace = None;
    assert_eq!(
        api_error(elsewhere.create(&PostParams::default(), &unplaced).await).0,
        404
    );
    // A body naming another namespace than the URL is a 400, as on the real server.
    assert_eq!(
        api_error(elsewhere.create(&PostParams::default(), &pod).await).0,
        400
    );
    assert_eq!(
        api_error(pods.delete("nope", &DeleteParams::default()).await).0,
        404
    );

    // 409: create twice; replace with a stale resourceVersion.
    assert_eq!(
        api_error(pods.create(&PostParams::default(), &pod).await),
        (409, "AlreadyExists".into())
    );
    let mut stale = pods.get("p").await.unwrap();
    sim.cluster()
        .relabel("airflow", "p", "x", Some("1"))
        .unwrap();
    stale
        .metadata
        .labels
        .get_or_insert_default()
        .insert("y".into(), "2".into());
    assert_eq!(
        api_error(pods.replace("p", &PostParams::default(), &stale).await),
        (409, "Conflict".into())
    );
    let precondition = json!({ "metadata": { "resourceVersion": "1" , "labels": { "z": "3" } } });
    assert_eq!(
        api_error(
            pods.patch("p", &PatchParams::default(), &Patch::Merge(&precondition))
                .await
        )
        .0,
        409
    );

    // 422: invalid names, label values, a pod without containers.
    let mut bad_name = pod.clone();
    bad_name.metadata.name = Some("Not_Valid".into());
    assert_eq!(
        api_error(pods.create(&PostParams::default(), &bad_name).await),
        (422, "Invalid".into())
    );
    let long_label = json!({ "metadata": { "labels": { "airflow-worker": "x".repeat(64) } } });
    assert_eq!(
        api_error(
            pods.patch("p", &PatchParams::default(), &Patch::Merge(&long_label))
                .await
        )
        .0,
        422
    );
    let empty: Pod = serde_json::from_value(
        json!({ "metadata": { "name": "empty" }, "spec": { "containers": [] } }),
    )
    .unwrap();
    assert_eq!(
        api_error(pods.create(&PostParams::default(), &empty).await).0,
        422
    );

    // The status code of a request sent as is.
    let status = async |method: &str, uri: &str, content_type: &str, body: &str| {
        let request = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .body(body.as_bytes().to_vec())
            .unwrap();
        api_error(client.request_text(request).await).0
    };
    let pods_uri = "/api/v1/namespaces/airflow/pods";
    let json = "application/json";
    // 400: a body that is not an object; a kind that does not belong at the URL.
    assert_eq!(status("POST", pods_uri, json, "{not json").await, 400);
    let service = r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"s"}}"#;
    assert_eq!(status("POST", pods_uri, json, service).await, 400);
    // 400: an apply without a field manager; 415: a patch type the server does not take;
    // 404: a resource it does not serve.
    let pod_uri = "/api/v1/namespaces/airflow/pods/p";
    let apply = "application/apply-patch+yaml";
    assert_eq!(status("PATCH", pod_uri, apply, "{}").await, 400);
    assert_eq!(
        status("PATCH", pod_uri, "application/yaml", "{}").await,
        415
    );
    // 415: a create or replace in a media type that is not JSON, as a web page's POST to
    // loopback would send (text/plain and form data need no preflight).
    let pod = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"from-a-page"},"spec":{"containers":[{"name":"base","image":"busybox:1.36"}]}}"#;
    for media in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        assert_eq!(status("POST", pods_uri, media, pod).await, 415, "{media}");
        assert_eq!(status("PUT", pod_uri, media, pod).await, 415, "{media}");
    }
    assert!(pods.get_opt("from-a-page").await.unwrap().is_none());
    let services_uri = "/api/v1/namespaces/airflow/services";
    assert_eq!(status("GET", services_uri, json, "").await, 404);
    assert_eq!(
        status("GET", "/apis/apps/v1/deployments", json, "").await,
        404
    );
    // The pod is unharmed by all of it.
    let kept = pods.get("p").await.unwrap();
    assert_eq!(
        kept.metadata.labels.unwrap().get("x").map(String::as_str),
        Some("1")
    );
}

/// The status line's code of `GET path` sent with `Host: host` and the server's token, over
/// a raw TLS connection.
async fn status_for_host(server: &Server, host: &str, path: &str) -> u16 {
    let authorization = format!("Authorization: Bearer {}\r\n", server.token());
    raw_status(server, &format!("Host: {host}\r\n{authorization}"), path).await
}

/// The status line's code of `GET path` with `headers` (each ending in CRLF), over a raw TLS
/// connection that trusts the server's CA.
async fn raw_status(server: &Server, headers: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::pem::PemObject::from_pem_slice(server.ca_pem().as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(server.addr().ip().into());
    let mut stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    // A TLS close without close_notify is an error here; what was read is enough.
    let _ = stream.read_to_string(&mut response).await;
    response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"))
}

/// Without the token the kubeconfig carries, nothing is answered: not with no
/// `Authorization`, another token, another scheme, or the token's prefix.
#[tokio::test]
async fn only_requests_with_the_bearer_token_are_answered() {
    let sim = server().await;
    let host = format!("Host: {}\r\n", sim.addr());
    let token = sim.token().to_owned();
    assert_eq!(token.len(), 64, "a 256-bit token in hex: {token}");
    for path in ["/version", "/api/v1/namespaces/airflow/pods", "/api"] {
        assert_eq!(raw_status(&sim, &host, path).await, 401, "{path}");
    }
    for authorization in [
        format!("Bearer {}", &token[..63]),
        format!("Bearer {token}x"),
        format!("Basic {token}"),
        format!("bearer{token}"),
        format!("Bearer {}", server().await.token()),
    ] {
        let headers = format!("{host}Authorization: {authorization}\r\n");
        assert_eq!(
            raw_status(&sim, &headers, "/version").await,
            401,
            "{authorization}"
        );
    }
    let headers = format!("{host}Authorization: Bearer {token}\r\n");
    assert_eq!(raw_status(&sim, &headers, "/version").await, 200);
}

/// A simulator on every interface writes a kubeconfig that reaches it through loopback, a
/// name its certificate and its Host check both accept.
#[tokio::test]
async fn a_server_on_every_interface_is_reached_through_loopback() {
    let sim = Server::start("0.0.0.0:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    assert_eq!(
        sim.url(),
        format!("https://127.0.0.1:{}", sim.addr().port())
    );
    let namespaces: Api<Namespace> = Api::all(client(&sim).await);
    assert!(namespaces.get_opt("default").await.unwrap().is_some());
}

/// Plain HTTP gets no answer: the simulator only speaks TLS.
#[tokio::test]
async fn plain_http_is_not_served() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let sim = server().await;
    let mut stream = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let request = format!(
        "GET /version HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        sim.addr(),
        sim.token()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    assert!(
        !String::from_utf8_lossy(&response).contains("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&response)
    );
}

/// DNS rebinding: a web page whose own name resolves to 127.0.0.1 sends that name as the
/// `Host`; the simulator answers loopback names only, and the names it is told.
#[tokio::test]
async fn only_loopback_hosts_and_the_allowed_ones_are_answered() {
    let port = |server: &Server| server.addr().port();
    let sim = server().await;
    for (host, want) in [
        (format!("127.0.0.1:{}", port(&sim)), 200),
        (format!("localhost:{}", port(&sim)), 200),
        (format!("[::1]:{}", port(&sim)), 200),
        (format!("attacker.example:{}", port(&sim)), 403),
        ("sim.internal".to_owned(), 403),
    ] {
        assert_eq!(
            status_for_host(&sim, &host, "/version").await,
            want,
            "{host}"
        );
    }
    assert_eq!(
        status_for_host(&sim, "attacker.example", "/api/v1/namespaces/airflow/pods").await,
        403
    );
    let told = server_with(SimConfig {
        allowed_hosts: vec!["sim.internal".into()],
        ..SimConfig::default()
    })
    .await;
    assert_eq!(
        status_for_host(&told, "sim.internal:8001", "/version").await,
        200
    );
    assert_eq!(
        status_for_host(&told, "attacker.example", "/version").await,
        403
    );
}

#[tokio::test]
async fn json_and_strategic_patches_edit_labels_annotations_and_lists() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    sim.cluster().create_pod(worker("p", "1")).unwrap();
    let strategic = json!({
        "metadata": { "labels": { "airflow-worker": "7" }, "annotations": { "note": "x" } },
        "spec": { "containers": [{ "name": "base", "image": "apache/airflow:3.1.8" }] },
    });
    let pod = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(&strategic))
        .await
        .unwrap();
    let containers = &pod.spec.as_ref().unwrap().containers;
    assert_eq!(containers.len(), 1, "merged by name, not appended");
    assert_eq!(containers[0].image.as_deref(), Some("apache/airflow:3.1.8"));
    assert_eq!(
        containers[0].args.as_ref().unwrap()[0],
        "airflow",
        "other fields kept"
    );
    assert_eq!(support::owner(&pod).as_deref(), Some("7"));

    let ops: json_patch::Patch = serde_json::from_value(json!([
        { "op": "remove", "path": "/metadata/annotations/note" },
        { "op": "add", "path": "/metadata/labels/airflow_executor_done", "value": "True" },
    ]))
    .unwrap();
    let pod = pods
        .patch("p", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert!(!pod.metadata.annotations.unwrap().contains_key("note"));
    assert_eq!(
        pod.metadata.labels.unwrap()["airflow_executor_done"],
        "True"
    );

    let failing: json_patch::Patch = serde_json::from_value(
        json!([{ "op": "test", "path": "/metadata/name", "value": "other" }]),
    )
    .unwrap();
    assert_eq!(
        api_error(
            pods.patch("p", &PatchParams::default(), &Patch::<()>::Json(failing))
                .await
        )
        .0,
        422
    );
}

#[tokio::test]
async fn namespaces_and_leases_are_served() {
    let sim = server().await;
    let client = client(&sim).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": "scratch" } })).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "scratch");
    let mut pod: Pod = serde_json::from_value(worker("in-scratch", "1")).unwrap();
    pod.metadata.namespace = None;
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // Leases: create, then compare-and-swap updates as leader election does.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "scratch");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "podstream-ingest" },
        "spec": { "holderIdentity": "a", "leaseDurationSeconds": 15 },
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut taken = created.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let taken = leases
        .replace("podstream-ingest", &PostParams::default(), &taken)
        .await
        .unwrap();
    assert_eq!(taken.spec.unwrap().holder_identity.as_deref(), Some("b"));
    let mut late = created;
    late.spec.as_mut().unwrap().holder_identity = Some("c".into());
    assert_eq!(
        api_error(
            leases
                .replace("podstream-ingest", &PostParams::default(), &late)
                .await
        )
        .0,
        409
    );

    // Deleting a namespace deletes what is in it.
    namespaces
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(pods.get("in-scratch").await).0, 404);
    assert_eq!(api_error(namespaces.get("scratch").await).0, 404);
}
