"""What a podstream command means to one scheduler's executor: the event the stock
``KubernetesJobWatcher`` would have queued for the same pod, or nothing.

Pure: a decoded ``podstream.v1.Command`` and the scheduler's job id in, a ``WatcherEvent`` or an
``Ignored`` out. The executor puts a ``WatcherEvent`` on its watcher queue, so Airflow's own
handling runs unchanged from there (``process_watcher_task`` → ``_change_state``: retries,
callbacks, the provider's relaunch of pods that failed before the task started, slot
accounting, pod deletion).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import ADOPTED
from airflow.utils.state import TaskInstanceState


@dataclass(frozen=True)
class WatcherEvent:
    """The fields of the provider's ``KubernetesWatch``, in its order."""

    pod_name: str
    namespace: str
    #: ``failed``, ``adopted``, or ``None`` for a pod that completed (the task wrote its state).
    state: Optional[str]
    annotations: dict
    resource_version: str
    failure_details: Optional[dict]


@dataclass(frozen=True)
class Ignored:
    """A command that changes nothing in this scheduler, and why (for the log)."""

    reason: str


Meaning = Union[WatcherEvent, Ignored]


def task_annotations(task: Any) -> dict:
    """The pod annotations ``annotations_to_key`` reads, rebuilt from podstream's TI key."""
    annotations = {
        "dag_id": task.dag_id,
        "task_id": task.task_id,
        "try_number": str(task.try_number),
    }
    if task.run_id:
        annotations["run_id"] = task.run_id
    else:
        # A pod older than run ids: the provider resolves the run from the date.
        annotations["execution_date"] = task.logical_date
        annotations["logical_date"] = task.logical_date
    if task.map_index >= 0:
        annotations["map_index"] = str(task.map_index)
    if task.task_instance_id:
        annotations["task_instance_id"] = task.task_instance_id
    return annotations


def failure_details(command: Any) -> dict:
    """The provider's ``FailureDetails`` of a fail: the container reason (podstream reads it as
    the provider does) decides whether a queued TI's pod is relaunched without spending a retry."""
    fail = command.fail
    return {
        "pod_status": "Failed",
        "pod_reason": fail.reason,
        "pod_message": fail.detail or None,
        "container_reason": fail.container_reason or None,
    }


def meaning(command: Any, scheduler_job_id: str) -> Meaning:
    """What ``command`` means to the executor of scheduler ``scheduler_job_id``."""
    kind = command.WhichOneof("kind")
    if kind is None:
        return Ignored("a command without a kind")
    if not command.HasField("task") or not command.HasField("pod"):
        return Ignored(f"a {kind} command without a task instance or a pod")
    if kind == "transfer":
        transfer = command.transfer
        if getattr(transfer, "from") == scheduler_job_id and transfer.to != scheduler_job_id:
            # The pod moved to another scheduler: free this one's slot, as the stock watcher's
            # ADOPTED does when a relabel takes a pod out of its selector.
            return _event(command, ADOPTED, None)
        return Ignored(f"transfer to {transfer.to}")
    if command.owner != scheduler_job_id:
        return Ignored(f"a {kind} command for scheduler {command.owner}")
    if kind == "fail":
        return _event(command, TaskInstanceState.FAILED.value, failure_details(command))
    if kind == "completed":
        return _event(command, None, None)
    # running, lost, duplicate: recorded by podstream, nothing for the scheduler to do.
    return Ignored(kind)


def _event(command: Any, state: Optional[str], details: Optional[dict]) -> WatcherEvent:
    return WatcherEvent(
        pod_name=command.pod.name,
        namespace=command.pod.namespace,
        state=state,
        annotations=task_annotations(command.task),
        resource_version=command.resource_version,
        failure_details=details,
    )
