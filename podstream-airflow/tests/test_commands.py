"""What each podstream command means to a scheduler's executor, as a table."""

from __future__ import annotations

import pytest
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import ADOPTED
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import annotations_to_key
from conftest import SCHEDULER, command

from podstream_airflow.commands import Ignored, WatcherEvent, meaning
from podstream_airflow.wire import message_class


def ended(container: str, exit_code: int, reason: str):
    return message_class("ContainerTerminated")(container=container, exit_code=exit_code, reason=reason)


FAIL_OOM = command(
    "fail",
    reason="pod_failed",
    detail="base exited 137 (OOMKilled)",
    terminated=[ended("base", 137, "OOMKilled")],
    container_reason="OOMKilled",
)

TABLE = [
    # (case, command, state on the watcher queue or None when ignored, container_reason)
    ("a fail becomes FAILED with podstream's reason", FAIL_OOM, "failed", "OOMKilled"),
    ("a fail before start keeps its waiting reason",
     command("fail", reason="fatal_pending:ErrImagePull", container_reason="ErrImagePull"), "failed", "ErrImagePull"),
    ("a fail without a container reason", command("fail", reason="deleted_while_running"), "failed", None),
    ("completed is the stock completed result", command("completed"), None, None),
    ("a transfer away frees the slot", command("transfer", owner="9", **{"from": SCHEDULER, "to": "9"}), ADOPTED, None),
]

IGNORED = [
    ("a transfer to this scheduler", command("transfer", **{"from": "3", "to": SCHEDULER}), "transfer to 7"),
    ("running", command("running"), "running"),
    ("lost before start", command("lost", reason="deleted_while_pending"), "lost"),
    ("duplicate", command("duplicate"), "duplicate"),
    ("a fail for another scheduler", command("fail", owner="9", reason="pod_failed"), "a fail command for scheduler 9"),
    ("no kind", message_class("Command")(id="x", owner=SCHEDULER), "a command without a kind"),
]


@pytest.mark.parametrize("case, cmd, state, container_reason", TABLE, ids=[row[0] for row in TABLE])
def test_commands_that_reach_the_executor(case, cmd, state, container_reason):
    event = meaning(cmd, SCHEDULER)
    assert isinstance(event, WatcherEvent), case
    assert event.state == state
    assert (event.pod_name, event.namespace, event.resource_version) == (cmd.pod.name, "airflow", "42")
    if state == "failed":
        assert event.failure_details["container_reason"] == container_reason
        assert event.failure_details["pod_reason"] == cmd.fail.reason
    else:
        assert event.failure_details is None


@pytest.mark.parametrize("case, cmd, reason", IGNORED, ids=[row[0] for row in IGNORED])
def test_commands_that_change_nothing_here(case, cmd, reason):
    assert meaning(cmd, SCHEDULER) == Ignored(reason), case


def test_the_annotations_give_airflows_own_key():
    mapped = command("fail", task_id="score", map_index=3, try_number=2, reason="pod_failed")
    event = meaning(mapped, SCHEDULER)
    key = annotations_to_key(event.annotations)
    assert (key.dag_id, key.task_id, key.run_id, key.try_number, key.map_index) == (
        "etl", "score", "manual__2026-11-30", 2, 3,
    )
    assert "task_instance_id" not in event.annotations


def test_a_ti_uuid_travels_in_the_annotations():
    uuid = "0196b3a0-1c2d-7e3f-8a4b-5c6d7e8f9a0b"
    event = meaning(command("fail", task_instance_id=uuid, reason="pod_failed"), SCHEDULER)
    assert event.annotations["task_instance_id"] == uuid
