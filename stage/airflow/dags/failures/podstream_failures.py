"""A task whose pod the simulator's kubelet kills (OOMKilled, exit 137) while it runs, with one
retry: the executor learns of the failure from the pod, not from the task, and Airflow's own
retry and callbacks follow. Works on Airflow 2.10 and 3.x."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from kubernetes.client import models as k8s
from podstream_markers import callbacks

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task

# The kubelet kills the container this long after it starts: well after the task is running,
# also on a loaded machine (a task can take 20 s to start there).
KILLED = k8s.V1Pod(
    metadata=k8s.V1ObjectMeta(
        annotations={"podstream/kubelet-fault": "oom", "podstream/kubelet-fault-after-seconds": "40"}
    )
)

with DAG(
    dag_id="podstream_failures",
    start_date=datetime(2026, 1, 1),
    schedule="@once",
    catchup=False,
    is_paused_upon_creation=False,
    default_args=callbacks(),
):

    @task(retries=1, retry_delay=timedelta(seconds=1), executor_config={"pod_override": KILLED})
    def killed() -> None:
        time.sleep(120)

    killed()
