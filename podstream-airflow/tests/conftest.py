"""Shared builders: podstream commands made with the schema the package ships."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import pytest

if "PODSTREAM_AIRFLOW_DB" in os.environ:
    # Before Airflow is imported: its engine is made from this at import time.
    _home = Path(tempfile.mkdtemp(prefix="podstream-airflow-"))
    shutil.copy(os.environ["PODSTREAM_AIRFLOW_DB"], _home / "airflow.db")
    os.environ["AIRFLOW_HOME"] = str(_home)
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_home / 'airflow.db'}"

from podstream_airflow.wire import message_class

SCHEDULER = "7"


def command(
    kind: str,
    *,
    owner: str = SCHEDULER,
    task_id: str = "load",
    map_index: int = -1,
    try_number: int = 1,
    task_instance_id: str = "",
    command_id: Optional[str] = None,
    **fields,
):
    """A ``podstream.v1.Command`` of ``kind`` (``fail``, ``transfer``, ...) with ``fields`` for
    its body."""
    Command = message_class("Command")
    built = Command(
        id=command_id or f"uid-{task_id}:42:{kind}",
        owner=owner,
        resource_version="42",
    )
    built.task.dag_id = "etl"
    built.task.task_id = task_id
    built.task.run_id = "manual__2026-11-30"
    built.task.map_index = map_index
    built.task.try_number = try_number
    built.task.task_instance_id = task_instance_id
    built.pod.namespace = "airflow"
    built.pod.name = f"etl-{task_id}-pod"
    built.pod.uid = f"uid-{task_id}"
    body = getattr(built, kind)
    body.SetInParent()
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(body, name).extend(value)
        else:
            setattr(body, name, value)
    return built


@pytest.fixture
def make_command():
    return command
