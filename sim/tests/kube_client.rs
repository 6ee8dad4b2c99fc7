//! The simulator through the `kube` crate, as ingest will use it: kube-runtime's `watcher`
//! over a label selector, raw watches with bookmarks, status patches, and re-lists after 410.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use podstream_sim::ContainerState;
use serde_json::json;
use support::{client, name, next, owner, server, worker};

/// Skips watcher events until an `Apply` or `Delete`, returning it.
async fn next_change<S>(stream: &mut S) -> Event<Pod>
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    loop {
        match next(stream).await.unwrap() {
            event @ (Event::Apply(_) | Event::Delete(_)) => return event,
            _ => continue,
        }
    }
}

/// Reads watcher events until `InitDone`, returning the pods listed.
async fn initial_list<S>(stream: &mut S) -> Vec<Pod>
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    let mut pods = Vec::new();
    loop {
        match next(stream).await.unwrap() {
            Event::Init => pods.clear(),
            Event::InitApply(pod) => pods.push(pod),
            Event::InitDone => return pods,
            other => panic!("unexpected event before InitDone: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_relabel_is_a_delete_for_the_old_selector_and_an_add_for_the_new() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    sim.cluster().create_pod(worker("task-a", "1")).unwrap();
    sim.cluster()
        .set_phase("airflow", "task-a", "Running")
        .unwrap();

    let mut scheduler_1 = watcher(
        pods.clone(),
        watcher::Config::default().labels("airflow-worker=1"),
    )
    .boxed();
    let mut scheduler_2 = watcher(
        pods.clone(),
        watcher::Config::default().labels("airflow-worker=2"),
    )
    .boxed();
    let mut everyone = watcher(
        pods.clone(),
        watcher::Config::default().labels("airflow-worker"),
    )
    .boxed();
    assert_eq!(initial_list(&mut scheduler_1).await.len(), 1);
    assert_eq!(initial_list(&mut scheduler_2).await.len(), 0);
    assert_eq!(initial_list(&mut everyone).await.len(), 1);

    sim.cluster()
        .relabel("airflow", "task-a", "airflow-worker", Some("2"))
        .unwrap();

    // The old owner's selector no longer matches: a DELETED carrying the new state, with
    // no deletionTimestamp — the leak of the seed discussion.
    match next_change(&mut scheduler_1).await {
        Event::Delete(pod) => {
            assert_eq!(owner(&pod).as_deref(), Some("2"));
            assert!(pod.metadata.deletion_timestamp.is_none());
            assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));
        }
        other => panic!("expected Delete, got {other:?}"),
    }
    // The new owner's selector starts matching: an ADDED, which the watcher reports as Apply.
    match next_change(&mut scheduler_2).await {
        Event::Apply(pod) => assert_eq!(owner(&pod).as_deref(), Some("2")),
        other => panic!("expected Apply, got {other:?}"),
    }
    // A watch on label existence sees a plain MODIFIED.
    match next_change(&mut everyone).await {
        Event::Apply(pod) => assert_eq!(owner(&pod).as_deref(), Some("2")),
        other => panic!("expected Apply, got {other:?}"),
    }
    // And the pod is still there.
    assert_eq!(
        owner(&pods.get("task-a").await.unwrap()).as_deref(),
        Some("2")
    );
}

#[tokio::test]
async fn a_graceful_delete_is_modified_with_deletion_timestamp_then_deleted() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    sim.cluster().create_pod(worker("task-b", "1")).unwrap();
    sim.cluster()
        .set_phase("airflow", "task-b", "Running")
        .unwrap();
    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().labels("airflow-worker"),
    )
    .boxed();
    initial_list(&mut stream).await;

    pods.delete(
        "task-b",
        &kube::api::DeleteParams::default().grace_period(1),
    )
    .await
    .unwrap();

    let terminating = match next_change(&mut stream).await {
        Event::Apply(pod) => pod,
        other => panic!("expected Apply with deletionTimestamp, got {other:?}"),
    };
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(1));
    // Still readable while terminating.
    assert!(
        pods.get("task-b")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    match next_change(&mut stream).await {
        Event::Delete(pod) => {
            assert_eq!(name(&pod), "task-b");
            assert!(pod.metadata.deletion_timestamp.is_some());
        }
        other => panic!("expected Delete, got {other:?}"),
    }
    assert!(pods.get_opt("task-b").await.unwrap().is_none());
}

#[tokio::test]
async fn finalizers_hold_a_deleted_pod_until_they_are_removed() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    let mut pod = worker("held", "1");
    pod["metadata"]["finalizers"] = json!(["podstream.io/test"]);
    sim.cluster().create_pod(pod).unwrap();

    pods.delete("held", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let held = pods.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    let clear = json!({ "metadata": { "finalizers": null } });
    pods.patch("held", &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .unwrap();
    assert!(pods.get_opt("held").await.unwrap().is_none());
}

#[tokio::test]
async fn raw_watches_get_bookmarks_at_the_current_revision() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    sim.cluster().create_pod(worker("task-c", "1")).unwrap();
    let head = sim.cluster().resource_version();

    let mut stream = pods
        .watch(&WatchParams::default(), &head.to_string())
        .await
        .unwrap()
        .boxed();
    match next(&mut stream).await.unwrap() {
        WatchEvent::Bookmark(bookmark) => {
            assert_eq!(bookmark.metadata.resource_version, head.to_string());
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    sim.cluster()
        .set_phase("airflow", "task-c", "Running")
        .unwrap();
    match next(&mut stream).await.unwrap() {
        WatchEvent::Modified(pod) => {
            assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"))
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    match next(&mut stream).await.unwrap() {
        WatchEvent::Bookmark(bookmark) => {
            assert_eq!(bookmark.metadata.resource_version, (head + 1).to_string());
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn a_watch_from_a_compacted_revision_gets_an_error_event_with_410() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    let stale = sim.cluster().resource_version();
    sim.cluster().create_pod(worker("during", "1")).unwrap();
    sim.cluster().compact();
    let mut raw = pods
        .watch(&WatchParams::default(), &stale.to_string())
        .await
        .unwrap()
        .boxed();
    match next(&mut raw).await.unwrap() {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    // A list at an exact compacted revision is refused the same way.
    let exact = kube::api::ListParams::default()
        .at(&stale.to_string())
        .matching(kube::api::VersionMatch::Exact);
    match pods.list(&exact).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn after_a_restart_and_compaction_the_watcher_lists_again_and_misses_nothing() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    sim.cluster().create_pod(worker("before", "1")).unwrap();
    // No bookmarks: the watcher's revision stays at its list until it sees an event.
    let config = watcher::Config::default()
        .labels("airflow-worker")
        .disable_bookmarks();
    let mut stream = watcher(pods.clone(), config).boxed();
    assert_eq!(initial_list(&mut stream).await.len(), 1);

    // The apiserver "restarts"; while the watcher reconnects (slowed down so the order is
    // certain), a pod appears and history is compacted past the watcher's revision.
    sim.cluster()
        .set_latency(std::time::Duration::from_millis(300));
    sim.cluster().drop_watches();
    sim.cluster().create_pod(worker("during", "1")).unwrap();
    sim.cluster().compact();

    let relisted = loop {
        match next(&mut stream).await {
            Ok(Event::Init) => break initial_list_after_init(&mut stream).await,
            Ok(other) => panic!("expected a re-list after 410, got {other:?}"),
            Err(_) => continue,
        }
    };
    sim.cluster().set_latency(std::time::Duration::ZERO);
    let mut names: Vec<_> = relisted.iter().map(name).collect();
    names.sort();
    assert_eq!(names, ["before", "during"]);
}

async fn initial_list_after_init<S>(stream: &mut S) -> Vec<Pod>
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    let mut pods = Vec::new();
    loop {
        match next(stream).await.unwrap() {
            Event::InitApply(pod) => pods.push(pod),
            Event::InitDone => return pods,
            other => panic!("unexpected event in a re-list: {other:?}"),
        }
    }
}

#[tokio::test]
async fn streaming_lists_end_with_the_initial_events_bookmark() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    for i in 0..3 {
        sim.cluster()
            .create_pod(worker(&format!("s-{i}"), "1"))
            .unwrap();
    }
    let config = watcher::Config::default()
        .labels("airflow-worker")
        .streaming_lists();
    let mut stream = watcher(pods, config).boxed();
    assert_eq!(initial_list(&mut stream).await.len(), 3);
    sim.cluster().create_pod(worker("s-3", "1")).unwrap();
    match next_change(&mut stream).await {
        Event::Apply(pod) => assert_eq!(name(&pod), "s-3"),
        other => panic!("expected Apply, got {other:?}"),
    }
}

#[tokio::test]
async fn status_changes_only_through_the_status_subresource() {
    let sim = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&sim).await, "airflow");
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(worker("task-d", "1")).unwrap(),
        )
        .await
        .unwrap();
    // The API resets a created pod's status, as the real server does.
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));

    let running = json!({ "status": { "phase": "Running" } });
    let ignored = pods
        .patch("task-d", &PatchParams::default(), &Patch::Merge(&running))
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(
        ignored.metadata.resource_version,
        created.metadata.resource_version
    );

    let patched = pods
        .patch_status("task-d", &PatchParams::default(), &Patch::Merge(&running))
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Running"));

    // The control API moves container states as a kubelet would.
    sim.cluster()
        .set_container_state(
            "airflow",
            "task-d",
            "base",
            ContainerState::Terminated {
                exit_code: 137,
                reason: "OOMKilled".into(),
                message: String::new(),
            },
        )
        .unwrap();
    let pod = pods.get("task-d").await.unwrap();
    let terminated = pod.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (terminated.exit_code, terminated.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
}

fn watcher(
    api: Api<Pod>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<Event<Pod>, watcher::Error>> {
    watcher::watcher(api, config)
}
