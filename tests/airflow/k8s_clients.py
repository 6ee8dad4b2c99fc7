"""Airflow's own Kubernetes clients against `podstream sim`, run from an Airflow venv.

    python k8s_clients.py client  KUBECONFIG NAMESPACE
    python k8s_clients.py watcher KUBECONFIG NAMESPACE SCHEDULER_ID SECONDS

`client` drives the official `kubernetes` client through list, watch (`watch=True`, through
`Watch().stream`), create, patch and delete, and prints what it saw as one JSON object.
`watcher` runs the cncf.kubernetes provider's `KubernetesJobWatcher` for one scheduler id
and prints each result it queues (pod, state) as a JSON line behind `podstream-check: `,
until SECONDS pass.
The Rust tests (tests/tests/airflow/airflow_clients.rs) start the simulator and check the output.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time


def client(kubeconfig: str, namespace: str) -> None:
    from kubernetes import client as k8s
    from kubernetes import config, watch

    config.load_kube_config(config_file=kubeconfig)
    api = k8s.CoreV1Api()
    selector = "airflow-worker=7"
    seen: list[dict] = []
    listed_rv = api.list_namespaced_pod(namespace, label_selector=selector).metadata.resource_version

    def follow() -> None:
        stream = watch.Watch().stream(
            api.list_namespaced_pod,
            namespace,
            label_selector=selector,
            resource_version=listed_rv,
            timeout_seconds=30,
        )
        for event in stream:
            pod = event["object"]
            seen.append(
                {
                    "type": event["type"],
                    "name": pod.metadata.name,
                    "phase": pod.status.phase,
                    "terminating": pod.metadata.deletion_timestamp is not None,
                    "note": (pod.metadata.labels or {}).get("note"),
                }
            )
            if event["type"] == "DELETED":
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    body = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="py-pod", labels={"airflow-worker": "7"}),
        spec=k8s.V1PodSpec(
            restart_policy="Never",
            termination_grace_period_seconds=5,
            containers=[k8s.V1Container(name="base", image="none", command=["sleep", "30"])],
        ),
    )
    api.create_namespaced_pod(namespace, body)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(e["phase"] == "Running" for e in seen):
        time.sleep(0.05)
    listed = [p.metadata.name for p in api.list_namespaced_pod(namespace, label_selector=selector).items]
    api.patch_namespaced_pod("py-pod", namespace, {"metadata": {"labels": {"note": "patched"}}})
    api.delete_namespaced_pod("py-pod", namespace)
    follower.join(timeout=20)
    print(json.dumps({"listed": listed, "events": seen}))


def report(line: str) -> None:
    sys.stdout.write(f"podstream-check: {line}\n")
    sys.stdout.flush()


def watcher(kubeconfig: str, namespace: str, scheduler_id: str, seconds: float) -> None:
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import (
        KubernetesJobWatcher,
    )
    from airflow.providers.cncf.kubernetes.kube_client import get_kube_client
    from airflow.providers.cncf.kubernetes.kube_config import KubeConfig

    kube_config = KubeConfig()
    kube_client = get_kube_client(in_cluster=False, config_file=kubeconfig)
    results: queue.Queue = queue.Queue()
    job_watcher = KubernetesJobWatcher(namespace, results, None, scheduler_id, kube_config)

    def run() -> None:
        while True:
            job_watcher._run(kube_client, None, scheduler_id, kube_config)

    threading.Thread(target=run, daemon=True).start()
    # Airflow logs to stdout too, from other threads: the lines meant for the test carry a
    # prefix and are written whole, in one call each.
    report("watching")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            item = results.get(timeout=0.1)
        except queue.Empty:
            continue
        pod_name, pod_namespace, state = item[0], item[1], item[2]
        report(json.dumps({"pod": pod_name, "namespace": pod_namespace, "state": state}))


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "watcher":
        watcher(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}: client or watcher")
