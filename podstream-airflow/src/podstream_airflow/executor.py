"""``PodstreamKubernetesExecutor``: the provider's ``KubernetesExecutor``, without its
label-scoped pod watch.

It launches pods exactly as the stock executor does (templates, labels, ``airflow-worker`` =
the scheduler's job id). It starts no ``KubernetesJobWatcher``: podstream watches every worker
pod once, decides what each event means, and its commands for this scheduler arrive from
JetStream. Each command that matters to the scheduler becomes the event the stock watcher
would have queued (``commands.meaning``) and goes on the executor's own watcher queue, so
everything after that is Airflow's own code, unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, cast

from airflow.providers.cncf.kubernetes.executors import kubernetes_executor_utils
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import KubernetesWatch
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import annotations_to_key
from airflow.stats import Stats
from airflow.utils.state import TaskInstanceState
from google.protobuf.message import DecodeError
from kubernetes.client.rest import ApiException

from podstream_airflow.commands import Ignored, WatcherEvent, meaning
from podstream_airflow.config import PodstreamConfig
from podstream_airflow.consumer import CommandConsumer, Delivery
from podstream_airflow.signing import read_key, sign_pod
from podstream_airflow.ti_pod import live_pods
from podstream_airflow.wire import decode_command

#: Command ids remembered to recognize a redelivery (an ack that did not reach NATS).
REMEMBERED_COMMANDS = 10_000
#: Tasks whose own pods are remembered: far more than a scheduler runs at once (a task's
#: entry goes when its ending or its transfer away enters the executor).
REMEMBERED_TASKS = 100_000
#: Counts fails skipped because their task is not one this scheduler launched or adopted.
UNTRACKED_METRIC = "podstream.executor.untracked_fail"
#: Counts transfers, fails and completions skipped because they name a pod this scheduler did
#: not launch or adopt for the task (a copy of the pod's annotations).
FOREIGN_POD_METRIC = "podstream.executor.foreign_pod"
#: A gauge per scheduler, ``<this>.<job id>``: 1 while its consumer takes commands, else 0.
#: It and the next are emitted every sync; docs/install.md maps them to
#: ``airflow_podstream_executor_*`` with a ``scheduler_job_id`` label, and the shipped alerts
#: watch them.
CONNECTED_METRIC = "podstream.executor.connected"
#: A gauge per scheduler, ``<this>.<job id>``: commands for it not yet taken by its loop.
WAITING_METRIC = "podstream.executor.waiting"
#: The commands that act on a task: only its own pod's count.
ACTING = ("transfer", "fail", "completed")


class PodstreamConflict(RuntimeError):
    """podstream's sink fails task instances too: this executor refuses to run beside it."""


class _SchedulerWithoutWatchers(kubernetes_executor_utils.AirflowKubernetesScheduler):
    """The provider's pod launcher, with no ``KubernetesJobWatcher`` (nothing to start, to
    health-check or to terminate), that signs each pod it creates and tells the executor."""

    #: The key pods are signed with; ``None`` leaves them unsigned.
    signing_key: Optional[bytes] = None
    #: Called with each pod just before it is created.
    on_launch: Optional[Callable[[Any], None]] = None
    #: While true, deleting or labelling a pod done does nothing: podstream's collector does.
    leave_pods: bool = False

    def _make_kube_watchers(self) -> dict:
        return {}

    def _launching(self, pod: Any) -> None:
        sign_pod(self.signing_key, pod)
        if self.on_launch is not None:
            self.on_launch(pod)

    def delete_pod(self, pod_name: str, namespace: str) -> None:
        """Deletes the pod as the provider does, unless it is left to podstream's collector."""
        if not self.leave_pods:
            super().delete_pod(pod_name=pod_name, namespace=namespace)

    def patch_pod_executor_done(self, *, pod_name: str, namespace: str) -> None:
        """Labels the pod done as the provider does, unless it is left to podstream's collector."""
        if not self.leave_pods:
            super().patch_pod_executor_done(pod_name=pod_name, namespace=namespace)

    def run_pod_async(self, pod: Any, **kwargs: Any) -> Any:
        """Signs and remembers the pod, then creates it as the provider does (one at a time)."""
        self._launching(pod)
        return super().run_pod_async(pod, **kwargs)

    def _run_pods_async(self, jobs_and_pods: list) -> list:
        """Signs and remembers the pods, then creates them as the provider does (in a batch,
        cncf.kubernetes 10.25 and later)."""
        for _job, pod in jobs_and_pods:
            self._launching(pod)
        return super()._run_pods_async(jobs_and_pods)


@contextmanager
def _launcher_without_watchers() -> Iterator[None]:
    # ``KubernetesExecutor.start`` builds its launcher by name from this module, and the
    # launcher starts its watchers in its constructor: the name is swapped for that one call.
    stock = kubernetes_executor_utils.AirflowKubernetesScheduler
    kubernetes_executor_utils.AirflowKubernetesScheduler = _SchedulerWithoutWatchers  # type: ignore[misc]
    try:
        yield
    finally:
        kubernetes_executor_utils.AirflowKubernetesScheduler = stock  # type: ignore[misc]


class PodstreamKubernetesExecutor(KubernetesExecutor):
    """A ``KubernetesExecutor`` that takes its pods' outcomes from podstream."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.podstream: Optional[CommandConsumer] = None
        self._handled: "OrderedDict[str, None]" = OrderedDict()
        self._running_logged = 0
        #: Commands whose events the last ``sync`` put in the event buffer: acked on the next
        #: ``sync``, once the scheduler loop has committed what they did.
        self._uncommitted: list = []
        #: (namespace, name) of the pods this scheduler launched or adopted, by TI key: only
        #: their commands act on a task.
        self.own_pods: "OrderedDict[Any, set]" = OrderedDict()
        #: podstream's collector deletes the pods of ended tasks (``[podstream] collect_pods``).
        self.collect_pods = False

    @staticmethod
    def get_cli_commands() -> list:
        """The stock executor's ``airflow kubernetes`` commands, and ``airflow podstream``."""
        from podstream_airflow.check import cli_commands

        return [*KubernetesExecutor.get_cli_commands(), *cli_commands()]

    def _scheduler(self) -> str:
        """This scheduler's job id, which Airflow sets before it starts the executor."""
        if self.scheduler_job_id is None:
            raise RuntimeError("podstream: the executor has no scheduler job id; Airflow sets it before start()")
        return str(self.scheduler_job_id)

    def start(self) -> None:
        """Starts the pod launcher (without watchers) and the podstream consumer."""
        with _launcher_without_watchers():
            super().start()
        config = PodstreamConfig.from_airflow(self._scheduler())
        self.collect_pods = config.collect_pods
        launcher = cast(_SchedulerWithoutWatchers, self.kube_scheduler)
        launcher.signing_key = read_key(config.signing_key_file) if config.signing_key_file else None
        launcher.on_launch = self._launched
        if launcher.signing_key is None:
            self.log.info("podstream: worker pods are not signed ([podstream] signing_key_file is not set)")
        self.podstream = CommandConsumer(config, self._scheduler())
        self.podstream.start()

    def sync(self) -> None:
        """Acks the commands the last sync handled, feeds new ones to the watcher queue and
        runs the stock sync.

        A command is acked one sync late: the events it produced reach the database when the
        scheduler loop processes the event buffer, after this sync returns, and only the next
        sync comes after that commit. A scheduler killed in between leaves its commands unacked.
        """
        if self.podstream and self.podstream.refusal:
            raise PodstreamConflict(self.podstream.refusal)
        if self.podstream:
            connected = 1 if self.podstream.connected.is_set() else 0
            Stats.gauge(f"{CONNECTED_METRIC}.{self._scheduler()}", connected)
            Stats.gauge(f"{WAITING_METRIC}.{self._scheduler()}", self.podstream.waiting())
            self.podstream.ack(self._uncommitted)
        self._uncommitted = []
        deliveries = self.podstream.take() if self.podstream else []
        for delivery in deliveries:
            self.take_command(delivery)
        super().sync()
        self._uncommitted = deliveries
        if len(self.running) != self._running_logged:
            # Slots are what leaked in stock multi-scheduler installs: say when they change.
            self._running_logged = len(self.running)
            self.log.info("podstream: %d task(s) running in this executor", self._running_logged)

    def take_command(self, delivery: Delivery) -> Optional[KubernetesWatch]:
        """Puts the event a command means on the watcher queue; returns it (``None`` when the
        command changes nothing here: logged, and acked all the same)."""
        try:
            command = decode_command(delivery.payload)
        except DecodeError as error:
            self.log.warning("podstream: ignoring a message on %s that is not a command: %s", delivery.subject, error)
            return None
        if command.id in self._handled:
            self.log.debug("podstream: command %s was handled already", command.id)
            return None
        self._remember(command.id)
        what = meaning(command, self._scheduler())
        if isinstance(what, Ignored):
            self.log.info(
                "podstream: %s for %s (pod %s): nothing to do here (%s)",
                command.WhichOneof("kind"),
                _ti(command),
                command.pod.name,
                what.reason,
            )
            return None
        kind = command.WhichOneof("kind")
        key = annotations_to_key(what.annotations)
        if kind in ACTING and (what.namespace, what.pod_name) not in self.own_pods.get(key, ()):
            # A pod this scheduler did not launch or adopt for the task (a copy of its
            # annotations, or a pod left from before a restart that was never adopted): its
            # outcome is not the task's here.
            self.log.warning(
                "podstream: %s for %s skipped: pod %s/%s is not one this scheduler launched or adopted",
                kind,
                _ti(command),
                what.namespace,
                what.pod_name,
            )
            Stats.incr(FOREIGN_POD_METRIC)
            return None
        if what.state == TaskInstanceState.FAILED.value and key not in self.running:
            # Only a task this scheduler launched or adopted can fail here: a fail for any
            # other (a forged pod under this job id) is skipped, and the pod it names is left.
            self.log.warning(
                "podstream: fail for %s (pod %s) skipped: not a task this scheduler launched or adopted",
                _ti(command),
                command.pod.name,
            )
            Stats.incr(UNTRACKED_METRIC)
            return None
        if kind in ACTING:
            # The task's pod is done here (it ended, or another scheduler took it); a relaunch
            # of the try is a launch, and is remembered again.
            self.own_pods.pop(key, None)
        event = _watch(what)
        self.log.info(
            "podstream: %s for %s (pod %s) enters the executor as %s",
            command.WhichOneof("kind"),
            _ti(command),
            event.pod_name,
            event.state,
        )
        if TYPE_CHECKING:
            assert self.kube_scheduler is not None
        self.kube_scheduler.watcher_queue.put(event)
        return event

    def try_adopt_task_instances(self, tis: Sequence[Any]) -> Sequence[Any]:
        """Adopts by facts first: every TI whose pod podstream last saw alive (its
        ``podstream_ti_pod`` row, by the TI key from the pod's annotations, whatever the pod's
        labels say) and that is still pending or running, relabelled as the stock executor
        does; the rest go through the stock adoption, which lists pods by label."""
        remaining = {ti.key: ti for ti in tis}
        for namespace, name in live_pods(tis):
            try:
                if TYPE_CHECKING:
                    assert self.kube_client is not None
                pod = self.kube_client.read_namespaced_pod(name=name, namespace=namespace)
            except ApiException as error:
                self.log.info("podstream: pod %s/%s is not there to adopt (%s)", namespace, name, error.status)
                continue
            if pod.status is None or pod.status.phase not in ("Pending", "Running"):
                continue
            before = len(remaining)
            self.adopt_launched_task(self.kube_client, pod, remaining)
            if len(remaining) < before:
                self.log.info("podstream: adopted pod %s/%s by podstream's record of it", namespace, name)
        return super().try_adopt_task_instances(list(remaining.values()))

    def adopt_launched_task(self, kube_client: Any, pod: Any, tis_to_flush_by_key: dict) -> None:
        """Adopts as the stock executor does; a pod it adopts becomes one of this scheduler's."""
        before = len(tis_to_flush_by_key)
        super().adopt_launched_task(kube_client, pod, tis_to_flush_by_key)
        if len(tis_to_flush_by_key) < before:
            self._launched(pod)

    def remember_pod(self, key: Any, namespace: str, name: str) -> None:
        """Records pod ``namespace/name`` as this scheduler's for TI ``key`` (the oldest task
        forgotten past ``REMEMBERED_TASKS``)."""
        self.own_pods.setdefault(key, set()).add((namespace, name))
        self.own_pods.move_to_end(key)
        while len(self.own_pods) > REMEMBERED_TASKS:
            self.own_pods.popitem(last=False)

    def _change_state(self, *args: Any, **kwargs: Any) -> None:
        """The stock change of state, which deletes or labels the task's pod unless podstream's
        collector does (``[podstream] collect_pods``); a revoke still deletes its pod."""
        launcher = cast(_SchedulerWithoutWatchers, self.kube_scheduler)
        launcher.leave_pods = self.collect_pods
        try:
            super()._change_state(*args, **kwargs)
        finally:
            launcher.leave_pods = False

    def _launched(self, pod: Any) -> None:
        metadata = pod.metadata
        self.remember_pod(annotations_to_key(metadata.annotations), metadata.namespace, metadata.name)

    def end(self) -> None:
        """Stops the consumer, then the executor as the stock one stops."""
        if self.podstream:
            self.podstream.stop()
        super().end()

    def terminate(self) -> None:
        """Stops the consumer, then terminates as the stock executor does."""
        if self.podstream:
            self.podstream.stop()
        super().terminate()

    def _remember(self, command_id: str) -> None:
        self._handled[command_id] = None
        while len(self._handled) > REMEMBERED_COMMANDS:
            self._handled.popitem(last=False)


def _watch(event: WatcherEvent) -> KubernetesWatch:
    return KubernetesWatch(
        event.pod_name,
        event.namespace,
        event.state,
        event.annotations,
        event.resource_version,
        # A plain dict of the fields the provider's ``FailureDetails`` names.
        cast(Any, event.failure_details),
    )


def _ti(command: Any) -> str:
    task = command.task
    index = f"[{task.map_index}]" if task.map_index >= 0 else ""
    return f"{task.dag_id}/{task.task_id}/{task.run_id or task.logical_date}{index}#{task.try_number}"
