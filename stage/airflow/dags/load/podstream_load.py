"""Many tasks whose pods fail, for the scheduler-load benchmark (tests/benches/scheduler_load.rs):
each pod's container sleeps, then exits 1 without running the task, so the TI is still queued
when its pod fails and the executor's report is what moves it (to up_for_retry, its retry an
hour away). The scheduler's work per task is the same for both executors but the watching:
schedule, queue, launch, the pod's events, the failure. Works on Airflow 2.10 and 3.x."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from kubernetes.client import models as k8s

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task

TASKS = int(os.environ.get("PODSTREAM_LOAD_TASKS", "500"))
POD_SECONDS = int(os.environ.get("PODSTREAM_LOAD_POD_SECONDS", "40"))

# The executor's command follows as the script's $0 and arguments, which it ignores.
FAILING = k8s.V1Pod(
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
            executor_config={"pod_override": FAILING},
        )
        def load() -> None:
            raise RuntimeError("never runs: its pod's container does not start the task")

        load()
