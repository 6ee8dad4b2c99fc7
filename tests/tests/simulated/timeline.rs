//! `podstream replay --html`: the page for the seed stories played through `podstream run`
//! (a relabel, a graceful delete while running, a failure, two pods for one TI), read as a
//! browser builds it (headless Chromium's DOM and a screenshot), and a page of a narrowed
//! history and of an undecodable message that still render, with their gaps shown.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use podstream_proto::subject::stream_names;
use podstream_sim::WorkerPod;
use podstream_sink::Database;
use podstream_sink::seed::SeedTi;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::component::Component;
use podstream_tests::nats::NatsServer;
use podstream_tests::recovery::{self, NS};
use podstream_tests::{browser, podstream_binary};

const DAG: &str = "etl";
const RUN: &str = "manual__2026-11-30";

/// The part of the DOM of the lane whose TI is `task`.
fn lane<'a>(dom: &'a str, task: &str) -> &'a str {
    let marker = format!("data-ti=\"{DAG}/{task}/{RUN}#1\"");
    let start = dom
        .find(&marker)
        .unwrap_or_else(|| panic!("no lane {task}"));
    let end = dom[start..]
        .find("</section>")
        .map_or(dom.len(), |e| start + e);
    &dom[start..end]
}

fn replay_html(nats: &str, since: &str, page: &Path) {
    let output = Command::new(podstream_binary())
        .args(["replay", "--nats", nats, "--since", since, "--html"])
        .arg(page)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_stories_as_a_page_a_browser_draws() {
    let (sim, dir) = recovery::simulator().await;
    let nats = NatsServer::start();
    let target = AirflowDb::sqlite(Airflow::line("2.10"));
    let db = Database::connect(&target.url).await.unwrap();
    let tasks = ["adopted", "retried", "failed", "twins"];
    let tis: Vec<SeedTi<'_>> = tasks
        .iter()
        .map(|task| SeedTi::running(task, if *task == "failed" { 0 } else { 1 }))
        .collect();
    db.seed(DAG, RUN, &tis).await.unwrap();
    let run = Component::run(
        &nats.url(),
        &target.url,
        &dir.path().join("kubeconfig"),
        &[],
    );
    let cluster = sim.cluster();
    for task in tasks {
        let pod = format!("{task}-1");
        cluster
            .create_pod(WorkerPod::new(&pod, "1", DAG, task, RUN).to_json())
            .unwrap();
        cluster.set_phase(NS, &pod, "Running").unwrap();
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    cluster
        .relabel(NS, "adopted-1", "airflow-worker", Some("2"))
        .unwrap();
    drop(cluster.delete_pod(NS, "retried-1", Some(1)).unwrap());
    cluster.set_phase(NS, "failed-1", "Failed").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before_the_twin = last_pod_sequence(&nats.url()).await;
    let mut twin = WorkerPod::new("twins-2", "1", DAG, "twins", RUN).to_json();
    twin["metadata"]["creationTimestamp"] = "2099-01-01T00:00:00Z".into();
    cluster.create_pod(twin).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    cluster.set_phase(NS, "twins-2", "Failed").unwrap();

    let key = |task: &str| podstream_sink::seed::first_try(DAG, task, RUN);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let adopted = db.task_instance(&key("adopted")).await.unwrap().unwrap();
        let retried = db.task_instance(&key("retried")).await.unwrap().unwrap();
        let failed = db.task_instance(&key("failed")).await.unwrap().unwrap();
        if adopted.queued_by_job_id == Some(2)
            && retried.state == "up_for_retry"
            && failed.state == "failed"
        {
            break;
        }
        assert!(Instant::now() < deadline, "the stories did not end");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The graceful delete's end, and the duplicate record.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(run.terminate().success());

    let out = tempfile::tempdir().unwrap();
    let page = out.path().join("stories.html");
    replay_html(&nats.url(), "1", &page);
    let size = std::fs::metadata(&page).unwrap().len();
    assert!(size < 200_000, "{size} bytes");
    let dom = browser::dom(&page);
    assert_eq!(dom.matches("<section class=\"lane\"").count(), 4, "{dom}");

    // A relabel: the owner mark on the running pod's bar; it never ended.
    let adopted = lane(&dom, "adopted");
    assert!(adopted.contains("class=\"owner\""), "{adopted}");
    assert!(adopted.contains("→2"), "{adopted}");
    assert!(adopted.contains("class=\"gap open\""), "{adopted}");
    assert!(adopted.contains("data-kind=\"transfer\""), "{adopted}");
    // A graceful delete of a running pod: terminating, then gone; podstream failed it.
    let retried = lane(&dom, "retried");
    assert!(retried.contains("class=\"span terminating\""), "{retried}");
    assert!(retried.contains("data-kind=\"fail\""), "{retried}");
    assert!(retried.contains("deleted_while_running"), "{retried}");
    // A failure.
    let failed = lane(&dom, "failed");
    assert!(failed.contains("class=\"span failed\""), "{failed}");
    assert!(failed.contains("data-kind=\"fail\""), "{failed}");
    // Two pods for one TI: the older drives, the newer loses, a duplicate record.
    let twins = lane(&dom, "twins");
    assert!(
        twins.contains("class=\"pod driver\" data-pod=\"twins-1\""),
        "{twins}"
    );
    assert!(
        twins.contains("class=\"pod loser\" data-pod=\"twins-2\""),
        "{twins}"
    );
    assert!(twins.contains("data-kind=\"duplicate\""), "{twins}");
    assert!(!twins.contains("data-kind=\"fail\""), "{twins}");
    // Every mark is reachable by keyboard and says what it is.
    for mark in dom.split("<g class=\"mark").skip(1) {
        assert!(mark.contains("tabindex=\"0\""), "{mark}");
        assert!(mark.contains("<title>"), "{mark}");
    }

    // A screenshot: drawn, with running and failed bars in their colours.
    let shot = out.path().join("stories.png");
    browser::screenshot(&page, 1240, 560, &shot);
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), (1240, 560));
    let channels = frame.color_type.samples();
    let count = |rgb: [u8; 3]| {
        pixels[..frame.buffer_size()]
            .chunks(channels)
            .filter(|p| p[..3].iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= 8))
            .count()
    };
    let running = count([0x2e, 0x7d, 0x32]);
    let failed_red = count([0xc6, 0x28, 0x28]);
    assert!(running > 500, "running pixels: {running}");
    assert!(failed_red > 200, "failed pixels: {failed_red}");
    if let Some(keep) = std::env::var_os("PODSTREAM_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }

    // From the twin on: the duplicate names the older pod, which has no event in the window,
    // and the page says so instead of breaking. A message on the pods stream that is no pod
    // event is drawn as a gap the page names, not skipped in silence.
    let garbage = publish_garbage(&nats.url()).await;
    let narrowed = out.path().join("narrowed.html");
    let since = (before_the_twin + 1).to_string();
    replay_html(&nats.url(), &since, &narrowed);
    let dom = browser::dom(&narrowed);
    let twins = lane(&dom, "twins");
    assert!(
        twins.contains("class=\"pod unseen\" data-pod=\"twins-1\""),
        "{twins}"
    );
    assert!(
        twins.contains("no event of this pod in the history"),
        "{twins}"
    );
    assert!(
        dom.contains(&format!(
            "1 message(s) could not be read and are not drawn: pods #{garbage}."
        )),
        "{dom}"
    );
}

/// Publishes bytes that are no `PodEvent` onto the pods stream; their stream sequence.
async fn publish_garbage(url: &str) -> u64 {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    js.publish("podstream.pods.1.not-a-pod", vec![0xff_u8; 8].into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

/// The stream sequence of the last pod event so far.
async fn last_pod_sequence(url: &str) -> u64 {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let mut stream = js.get_stream(stream_names::PODS).await.unwrap();
    stream.info().await.unwrap().state.last_sequence
}
