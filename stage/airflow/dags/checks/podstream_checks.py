"""A success, a failure with one retry, and a task that runs a few seconds: the normal run
that tests/tests/airflow/real_airflow.rs checks on each Airflow release. Works on Airflow 2.10 and 3.x."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from podstream_markers import callbacks

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task


with DAG(
    dag_id="podstream_checks",
    start_date=datetime(2026, 1, 1),
    schedule="@once",
    catchup=False,
    is_paused_upon_creation=False,
    default_args=callbacks(),
):

    @task
    def succeeds() -> str:
        return "ok"

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def fails() -> None:
        raise RuntimeError("this task fails on purpose")

    @task
    def runs_long() -> None:
        time.sleep(5)

    succeeds()
    fails()
    runs_long()
