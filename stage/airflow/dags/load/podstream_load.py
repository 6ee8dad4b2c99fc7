"""Many tasks whose pods fail, for the scheduler-load benchmark (tests/benches/scheduler_load.rs).
Works on Airflow 2.10 and 3.x. Each TI goes to up_for_retry (its retry an hour away) when the
executor (or podstream's sink) learns that its pod failed:

- by default each pod's container sleeps, then exits 1 without running the task, so the TI is
  still queued when its pod fails: the scheduler's work per task is the same for both executors
  but the watching (schedule, queue, launch, the pod's events, the failure);
- with PODSTREAM_LOAD_KILLED_AFTER_SECONDS set, the pod runs the task (the TI is running), and
  the simulator's kubelet kills it that many seconds after it starts (OOMKilled): the failure
  comes from the pod, not from the task, which podstream's sink may also apply."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

from kubernetes.client import models as k8s

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task

TASKS = int(os.environ.get("PODSTREAM_LOAD_TASKS", "500"))
POD_SECONDS = int(os.environ.get("PODSTREAM_LOAD_POD_SECONDS", "40"))
KILLED_AFTER_SECONDS = os.environ.get("PODSTREAM_LOAD_KILLED_AFTER_SECONDS")

if KILLED_AFTER_SECONDS:
    POD = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            annotations={
                "podstream/kubelet-fault": "oom",
                "podstream/kubelet-fault-after-seconds": KILLED_AFTER_SECONDS,
            }
        )
    )
else:
    # The executor's command follows as the script's $0 and arguments, which it ignores.
    POD = k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="base", command=["sh", "-c", f"sleep {POD_SECONDS}; exit 1"])]
        )
    )

with DAG(
    dag_id="podstream_load",
    start_date=datetime(2026, 1, 1),
    schedule="@once",
    catchup=False,
    is_paused_upon_creation=False,
    max_active_tasks=TASKS,
):
    for index in range(TASKS):

        @task(
            task_id=f"load_{index:04}",
            retries=1,
            retry_delay=timedelta(hours=1),
            executor_config={"pod_override": POD},
        )
        def load() -> None:
            if not KILLED_AFTER_SECONDS:
                raise RuntimeError("never runs: its pod's container does not start the task")
            time.sleep(3600)  # until the kubelet kills its pod

        load()
