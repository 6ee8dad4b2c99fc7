"""One task that runs for $PODSTREAM_LONG_TASK_SECONDS: the seed stories (adoption, a
scheduler restart, a second pod) happen while it runs (tests/tests/stock_airflow.rs).
Works on Airflow 2.10 and 3.x."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

from podstream_markers import callbacks

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task


with DAG(
    dag_id="podstream_story",
    start_date=datetime(2026, 1, 1),
    schedule="@once",
    catchup=False,
    is_paused_upon_creation=False,
    default_args=callbacks(),
):

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def works() -> None:
        time.sleep(float(os.environ.get("PODSTREAM_LONG_TASK_SECONDS", "40")))

    works()
