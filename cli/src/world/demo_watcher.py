"""What Airflow's own label-scoped watcher reports for the demo's stories.

Run by `podstream demo` with the Python of an Airflow venv. Reads JSON lines
`{"story", "scheduler", "event"}` on stdin: each event as the watch of scheduler
`airflow-worker=<scheduler>` would have received it. Feeds each to the installed
cncf.kubernetes provider's `KubernetesJobWatcher.process_status`, one watcher per
(story, scheduler), and writes JSON lines: first the versions, then per (story, scheduler)
the states the watcher queued for the executor, in order ("failed", "adopted", null for a
completed pod, ...).
"""

from __future__ import annotations

import json
import queue
import sys
from importlib.metadata import version


def main() -> None:
    from kubernetes import watch

    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import (
        KubernetesJobWatcher,
    )
    from airflow.providers.cncf.kubernetes.kube_config import KubeConfig

    print(
        json.dumps(
            {
                "airflow": version("apache-airflow"),
                "provider": version("apache-airflow-providers-cncf-kubernetes"),
            }
        ),
        flush=True,
    )
    kube_config = KubeConfig()
    decoder = watch.Watch()
    watchers: dict[tuple[str, str], KubernetesJobWatcher] = {}
    for line in sys.stdin:
        item = json.loads(line)
        key = (item["story"], item["scheduler"])
        if key not in watchers:
            watchers[key] = KubernetesJobWatcher(
                "airflow", queue.Queue(), None, item["scheduler"], kube_config
            )
        event = decoder.unmarshal_event(json.dumps(item["event"]), "V1Pod")
        pod = event["object"]
        watchers[key].process_status(
            pod_name=pod.metadata.name,
            namespace=pod.metadata.namespace,
            status=pod.status.phase,
            annotations=pod.metadata.annotations or {},
            resource_version=pod.metadata.resource_version,
            event=event,
        )
    for (story, scheduler), watcher in watchers.items():
        states = []
        while not watcher.watcher_queue.empty():
            queued = watcher.watcher_queue.get()
            states.append({"pod": queued[0], "state": queued[2]})
        print(json.dumps({"story": story, "scheduler": scheduler, "reported": states}), flush=True)


if __name__ == "__main__":
    main()
