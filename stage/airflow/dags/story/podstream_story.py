"""One task that runs for $PODSTREAM_LONG_TASK_SECONDS: the seed stories (adoption, a
scheduler restart, a second pod) happen while it runs (tests/tests/airflow/stock_airflow.rs).

A story can end a try sooner, as the pod would end on its own: a file named after the try
number in $PODSTREAM_ENDINGS says `succeed` (the task returns and reports its success) or
`die` (the pod's main process is killed, exit 137, so the task reports nothing and only the
pod says how it ended). Works on Airflow 2.10 and 3.x."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta

from podstream_markers import callbacks

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task


def ending(try_number: int) -> str | None:
    """How the story wants this try to end now, if it has said."""
    folder = os.environ.get("PODSTREAM_ENDINGS")
    if not folder:
        return None
    try:
        with open(os.path.join(folder, str(try_number))) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


with DAG(
    dag_id="podstream_story",
    start_date=datetime(2026, 1, 1),
    schedule="@once",
    catchup=False,
    is_paused_upon_creation=False,
    default_args=callbacks(),
):

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def works(ti=None) -> None:
        deadline = time.monotonic() + float(os.environ.get("PODSTREAM_LONG_TASK_SECONDS", "40"))
        while time.monotonic() < deadline:
            said = ending(ti.try_number) if ti is not None else None
            if said == "succeed":
                return
            if said == "die":
                # Said on the pod's own log (its main process's stdout): a story's report of
                # a failed pod must name this cause.
                with open(f"/proc/{os.getppid()}/fd/1", "w") as pod_log:
                    pod_log.write(f"podstream story: try {ti.try_number} told to die\n")
                # The task runs under the pod's main process (Airflow 2's `tasks run --local`,
                # Airflow 3's supervisor), which would report a failure: it goes first.
                os.kill(os.getppid(), signal.SIGKILL)
                os._exit(1)
            time.sleep(0.25)

    works()
