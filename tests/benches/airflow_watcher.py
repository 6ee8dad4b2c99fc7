"""Airflow's own watcher code over a file of pod watch events, timed (the decide bench's baseline).

Run by `tests/benches/decide.rs` with the Python of an Airflow venv:
`python airflow_watcher.py EVENTS_FILE`. Reads the file's lines first, then times what
`KubernetesJobWatcher._run` does for each event: the Python client's deserialization into a
`V1Pod` (`Watch.unmarshal_event`), the annotations it gathers, and `process_status`. Imports
and file reading are outside the clock. Prints one JSON line: the versions, the events read,
the states the watcher queued, and the seconds the loop took.
"""

from __future__ import annotations

import json
import queue
import sys
import time
from importlib.metadata import version


def main() -> None:
    from kubernetes import watch

    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import (
        KubernetesJobWatcher,
    )
    from airflow.providers.cncf.kubernetes.kube_config import KubeConfig

    try:
        from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import (
            get_logical_date_key,
        )

        logical_date_key = get_logical_date_key()
    except ImportError:
        logical_date_key = "logical_date"

    with open(sys.argv[1], encoding="utf-8") as file:
        lines = file.readlines()

    watcher = KubernetesJobWatcher("airflow", queue.Queue(), None, "1", KubeConfig())
    decoder = watch.Watch()
    queued = 0
    start = time.perf_counter()
    for line in lines:
        event = decoder.unmarshal_event(line, "V1Pod")
        task = event["object"]
        annotations = task.metadata.annotations
        related = {
            "dag_id": annotations["dag_id"],
            "task_id": annotations["task_id"],
            logical_date_key: annotations.get(logical_date_key),
            "run_id": annotations.get("run_id"),
            "try_number": annotations["try_number"],
        }
        map_index = annotations.get("map_index")
        if map_index is not None:
            related["map_index"] = map_index
        watcher.process_status(
            pod_name=task.metadata.name,
            namespace=task.metadata.namespace,
            status=task.status.phase,
            annotations=related,
            resource_version=task.metadata.resource_version,
            event=event,
        )
        # The executor drains the queue as it goes; so does this, so the queue stays small.
        while not watcher.watcher_queue.empty():
            watcher.watcher_queue.get_nowait()
            queued += 1
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "airflow": version("apache-airflow"),
                "provider": version("apache-airflow-providers-cncf-kubernetes"),
                "events": len(lines),
                "queued": queued,
                "seconds": seconds,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
