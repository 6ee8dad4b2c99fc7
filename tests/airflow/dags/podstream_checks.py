"""DAGs the real-Airflow tests run on `podstream sim --kubelet` (tests/src/airflow_run.rs).

Every task runs in a worker pod that the simulator's kubelet starts as a local process.
Callbacks write marker files under $PODSTREAM_MARKERS, one per call, so a test can count them.
Works on Airflow 2.10 and 3.x.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime, timedelta

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task


def _marker(kind: str):
    def callback(context) -> None:
        ti = context["ti"]
        folder = os.environ.get("PODSTREAM_MARKERS", "/tmp")
        name = f"{kind}.{ti.dag_id}.{ti.task_id}.{ti.try_number}.{uuid.uuid4().hex}"
        with open(os.path.join(folder, name), "w") as f:
            f.write(kind)

    return callback


with DAG(
    dag_id="podstream_checks",
    start_date=datetime(2026, 1, 1),
    schedule="@once",
    catchup=False,
    is_paused_upon_creation=False,
    default_args={
        "on_retry_callback": _marker("retry"),
        "on_failure_callback": _marker("failure"),
        "on_success_callback": _marker("success"),
    },
):

    @task
    def succeeds() -> str:
        return "ok"

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def fails() -> None:
        raise RuntimeError("this task fails on purpose")

    @task
    def runs_long() -> None:
        time.sleep(float(os.environ.get("PODSTREAM_LONG_TASK_SECONDS", "5")))

    succeeds()
    fails()
    runs_long()
