"""Callbacks for the test DAGs: each call leaves one marker file under $PODSTREAM_MARKERS,
named `kind.dag.task.try.<unique>`, so a test counts calls without parsing logs."""

from __future__ import annotations

import os
import uuid


def marker(kind: str):
    """A task callback that records one call of `kind` (retry, failure, success)."""

    def callback(context) -> None:
        ti = context["ti"]
        folder = os.environ.get("PODSTREAM_MARKERS", "/tmp")
        name = f"{kind}.{ti.dag_id}.{ti.task_id}.{ti.try_number}.{uuid.uuid4().hex}"
        with open(os.path.join(folder, name), "w") as f:
            f.write(kind)

    return callback


def callbacks() -> dict:
    """`default_args` entries for every callback."""
    return {
        "on_retry_callback": marker("retry"),
        "on_failure_callback": marker("failure"),
        "on_success_callback": marker("success"),
    }
