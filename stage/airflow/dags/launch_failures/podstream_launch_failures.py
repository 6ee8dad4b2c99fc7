"""A task whose pods never start (their image cannot be pulled), with one retry: the executor
learns of the failure from podstream while the TI is still queued, and Airflow's own handling
follows (cncf.kubernetes 10.20 and later relaunch such a pod once without spending a retry).
Works on Airflow 2.10 and 3.x."""

from __future__ import annotations

from datetime import datetime, timedelta

from kubernetes.client import models as k8s
from podstream_markers import callbacks

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task

UNPULLABLE = k8s.V1Pod(metadata=k8s.V1ObjectMeta(annotations={"podstream/kubelet-fault": "image-pull"}))

with DAG(
    dag_id="podstream_launch_failures",
    start_date=datetime(2026, 1, 1),
    schedule="@once",
    catchup=False,
    is_paused_upon_creation=False,
    default_args=callbacks(),
):

    @task(retries=1, retry_delay=timedelta(seconds=1), executor_config={"pod_override": UNPULLABLE})
    def unpullable() -> None:
        raise RuntimeError("never runs: its image cannot be pulled")

    unpullable()
