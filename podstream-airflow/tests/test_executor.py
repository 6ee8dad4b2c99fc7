"""The executor with real parts: a real nats-server with JetStream, podstream's Kubernetes
simulator, and Airflow's metadata DB made by Airflow's own migrations. podstream's test suite
runs this file (tests/tests/airflow/podstream_airflow.rs) with:

- ``PODSTREAM_BIN``: the ``podstream`` binary (for ``podstream sim``);
- ``PODSTREAM_NATS_SERVER``: a ``nats-server`` binary;
- ``PODSTREAM_AIRFLOW_DB``: a migrated SQLite metadata DB of this venv's Airflow (copied by
  ``conftest.py`` before Airflow is imported).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

import pytest
from real_parts import Nats, run, wait_for

NEEDED = ("PODSTREAM_BIN", "PODSTREAM_NATS_SERVER", "PODSTREAM_AIRFLOW_DB")
pytestmark = pytest.mark.skipif(
    any(name not in os.environ for name in NEEDED),
    reason=f"needs {', '.join(NEEDED)} (podstream's test suite sets them)",
)

STREAM = "PODSTREAM_COMMANDS"


async def _create_stream(url: str, **login):
    import nats
    from nats.js.api import StreamConfig

    client = await nats.connect(url, **login)
    await client.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["podstream.commands.>"]))
    await client.close()


async def _publish(url: str, messages, **login):
    import nats

    client = await nats.connect(url, **login)
    js = client.jetstream()
    for subject, payload in messages:
        await js.publish(subject, payload)
    await client.close()


async def _put_spark_choice(url: str, key: str, pod: str, **login) -> None:
    """A Spark job's record naming ``pod``, as podstream's processor writes it."""
    import json

    import nats
    from nats.js.api import KeyValueConfig

    client = await nats.connect(url, **login)
    bucket = await client.jetstream().create_key_value(KeyValueConfig(bucket="podstream-spark"))
    record = {"drivers": [], "chosen": {"pod": {"namespace": "airflow", "name": pod, "uid": "u1"},
                                        "basis": "spark_application", "others": []}}
    await bucket.put(key, json.dumps(record).encode())
    await client.close()


async def _pending(url: str, consumer: str, **login) -> tuple:
    import nats

    client = await nats.connect(url, **login)
    info = await client.jetstream().consumer_info(STREAM, consumer)
    await client.close()
    return info.num_pending, info.num_ack_pending


async def _inactive_threshold(url: str, consumer: str) -> float:
    import nats

    client = await nats.connect(url)
    info = await client.jetstream().consumer_info(STREAM, consumer)
    await client.close()
    return info.config.inactive_threshold


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A simulator and a nats-server, and Airflow configured to use them."""
    kubeconfig = tmp_path / "kubeconfig"
    sim = subprocess.Popen(
        [os.environ["PODSTREAM_BIN"], "sim", "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert sim.stdout is not None and sim.stdout.readline().startswith("listening on")
    nats_server = Nats(tmp_path / "js")
    nats_server.start()
    # As podstream creates it when it starts.
    run(_create_stream(nats_server.url))
    for section, key, value in [
        ("kubernetes_executor", "in_cluster", "False"),
        ("kubernetes_executor", "config_file", str(kubeconfig)),
        ("kubernetes_executor", "namespace", "airflow"),
        ("podstream", "url", nats_server.url),
        ("podstream", "ack_wait_seconds", "5"),
    ]:
        monkeypatch.setenv(f"AIRFLOW__{section.upper()}__{key.upper()}", value)
    yield nats_server
    nats_server.stop()
    sim.terminate()
    sim.wait(timeout=10)


def started_executor(job_id: str = "7"):
    from podstream_airflow import PodstreamKubernetesExecutor

    executor = PodstreamKubernetesExecutor()
    executor.job_id = job_id
    executor.start()
    return executor


def key_of(cmd):
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import annotations_to_key

    from podstream_airflow.commands import task_annotations

    return annotations_to_key(task_annotations(cmd.task))


def make_own(executor, cmd) -> None:
    """Makes ``cmd``'s task and pod this executor's, as a launch does."""
    executor.running.add(key_of(cmd))
    executor.remember_pod(key_of(cmd), cmd.pod.namespace, cmd.pod.name)


def sync_until(executor, check, what):
    def step():
        executor.sync()
        return check()

    wait_for(step, what=what)


def test_commands_enter_airflows_result_path_and_are_acked_after(world, make_command):
    executor = started_executor()
    try:
        assert executor.kube_scheduler.kube_watchers == {}, "no label-scoped watcher"
        failed = make_command("fail", task_id="load", reason="pod_failed", container_reason="Error")
        moved = make_command("transfer", task_id="moved", owner="9", **{"from": "7", "to": "9"})
        running = make_command("running", task_id="still")
        for cmd in (failed, moved, running):
            make_own(executor, cmd)
        run(_publish(world.url, [
            ("podstream.commands.7.uid-load", failed.SerializeToString()),
            ("podstream.commands.7.uid-moved", moved.SerializeToString()),
            ("podstream.commands.7.uid-still", running.SerializeToString()),
            ("podstream.commands.7.garbage", b"\xff\xffnot protobuf"),
        ]))
        # The four may arrive over several syncs; each sync acks what it took.
        wait_for(executor.podstream.connected.is_set, what="the consumer")
        sync_until(
            executor,
            lambda: run(_pending(world.url, "podstream-airflow-7")) == (0, 0),
            "every command taken and acked",
        )
        state, _info = executor.event_buffer[key_of(failed)]
        assert state == "failed"
        assert key_of(failed) not in executor.running, "the slot of the failed TI is free"
        assert key_of(moved) not in executor.running, "a transfer away frees the slot ..."
        assert key_of(moved) not in executor.event_buffer, "... without an event, as ADOPTED"
        assert key_of(running) in executor.running, "running changes nothing"
    finally:
        executor.end()


@pytest.mark.parametrize("collect_pods", [False, True])
def test_with_podstreams_collector_a_task_end_deletes_no_pod(world, make_command, monkeypatch, collect_pods):
    """Stock, a task's end deletes its pod (``delete_worker_pods``); with ``[podstream]
    collect_pods`` the collector does, and the executor deletes none: one deleter per pod."""
    from kubernetes import client, config

    monkeypatch.setenv("AIRFLOW__PODSTREAM__COLLECT_PODS", str(collect_pods))
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "True")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS_ON_FAILURE", "True")
    config.load_kube_config(os.environ["AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE"])
    pods = client.CoreV1Api()
    ended = [make_command("completed", task_id="done"), make_command("fail", task_id="broke", reason="pod_failed")]
    for cmd in ended:
        pods.create_namespaced_pod("airflow", client.V1Pod(
            metadata=client.V1ObjectMeta(name=cmd.pod.name, labels={"airflow-worker": "7"}),
            spec=client.V1PodSpec(containers=[client.V1Container(name="base", image="none")]),
        ))
    executor = started_executor()
    try:
        for cmd in ended:
            make_own(executor, cmd)
        run(_publish(world.url, [(f"podstream.commands.7.{c.pod.uid}", c.SerializeToString()) for c in ended]))
        sync_until(executor, lambda: all(key_of(c) in executor.event_buffer for c in ended), "both ends taken")
        left = {p.metadata.name for p in pods.list_namespaced_pod("airflow").items if p.metadata.deletion_timestamp is None}
        names = {c.pod.name for c in ended}
        assert (names <= left) == collect_pods, f"pods left: {left}"
        if not collect_pods:
            assert not names & left, "stock, the executor deletes both"
    finally:
        executor.end()


def test_a_fail_for_a_task_not_launched_or_adopted_here_enters_nothing(world, make_command):
    """A fail under this scheduler's job id for a task it never launched or adopted (a forged
    pod labelled with the job id) enters nothing: no event, the pod it names is not deleted."""
    executor = started_executor()
    try:
        stranger = make_command("fail", task_id="stranger", reason="pod_failed")
        own = make_command("fail", task_id="own", reason="pod_failed")
        make_own(executor, own)
        assert executor.take_command(_delivery(stranger)) is None
        executor.sync()
        assert key_of(stranger) not in executor.event_buffer
        event = executor.take_command(_delivery(own))
        assert event is not None and event.state == "failed", "a fail for its own task enters"
        executor.sync()
        assert executor.event_buffer[key_of(own)][0] == "failed"
    finally:
        executor.end()


def test_pods_it_launches_are_signed_and_only_their_commands_act(world, make_command, tmp_path, monkeypatch):
    """Each pod the executor creates carries the signature podstream checks, and is remembered:
    a fail, completion or transfer naming any other pod of the task (a copy of its annotations)
    enters nothing; the launched pod's fail enters."""
    from kubernetes import client

    from podstream_airflow.signing import SIGNATURE_ANNOTATION, sign

    key = b"0123456789abcdef0123456789abcdef"
    (tmp_path / "signing-key").write_bytes(key + b"\n")
    monkeypatch.setenv("AIRFLOW__PODSTREAM__SIGNING_KEY_FILE", str(tmp_path / "signing-key"))
    executor = started_executor()
    try:
        annotations = {"dag_id": "etl", "task_id": "load", "run_id": "manual__2026-11-30", "try_number": "1"}
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="etl-load-pod", namespace="airflow", annotations=dict(annotations),
                labels={"airflow-worker": "7", "kubernetes_executor": "True"},
            ),
            spec=client.V1PodSpec(containers=[client.V1Container(name="base", image="none")]),
        )
        executor.kube_scheduler.run_pod_async(pod)
        created = executor.kube_client.read_namespaced_pod("etl-load-pod", "airflow")
        assert created.metadata.annotations[SIGNATURE_ANNOTATION] == sign(key, "airflow", "etl-load-pod", annotations)

        real = make_command("fail", task_id="load", reason="pod_failed")
        executor.running.add(key_of(real))
        copies = []
        for kind, fields in [("fail", {"reason": "pod_failed"}), ("completed", {}), ("transfer", {"from": "7", "to": "9"})]:
            copy = make_command(kind, task_id="load", command_id=f"copy-{kind}", **fields)
            copy.pod.name = "etl-load-copy"
            copies.append(copy)
        other_namespace = make_command("fail", task_id="load", command_id="copy-ns", reason="pod_failed")
        other_namespace.pod.namespace = "dags"
        for copy in [*copies, other_namespace]:
            assert executor.take_command(_delivery(copy)) is None, f"{copy.WhichOneof('kind')} of {copy.pod}"
        executor.sync()
        assert key_of(real) not in executor.event_buffer and key_of(real) in executor.running
        event = executor.take_command(_delivery(real))
        assert event is not None and event.state == "failed", "the launched pod's fail enters"
    finally:
        executor.end()


def _delivery(cmd):
    from podstream_airflow.consumer import Delivery

    return Delivery(payload=cmd.SerializeToString(), subject="podstream.commands.7.uid", message=None)


def test_a_dead_schedulers_consumer_goes_after_its_inactivity_threshold(world):
    """NATS removes a scheduler's consumer a day after the scheduler last pulled: a dead
    scheduler's job id leaves nothing behind on the bus."""
    from podstream_airflow.consumer import INACTIVE_THRESHOLD_SECONDS

    executor = started_executor()
    try:
        wait_for(executor.podstream.connected.is_set, what="the consumer")
        threshold = run(_inactive_threshold(world.url, "podstream-airflow-7"))
        assert threshold == INACTIVE_THRESHOLD_SECONDS == 24 * 3600
    finally:
        executor.end()


def test_a_command_is_acked_only_after_the_scheduler_loop_committed_its_event(world, make_command):
    """The event a command produces is committed by the scheduler loop after ``sync`` returns:
    the command is acked by the next ``sync``, so a scheduler killed in between leaves it
    unacked rather than lost."""
    executor = started_executor()
    try:
        failed = make_command("fail", task_id="held", reason="pod_failed", container_reason="Error")
        make_own(executor, failed)
        run(_publish(world.url, [("podstream.commands.7.uid-held", failed.SerializeToString())]))
        wait_for(executor.podstream.connected.is_set, what="the consumer")
        sync_until(executor, lambda: key_of(failed) in executor.event_buffer, "the command taken")
        assert run(_pending(world.url, "podstream-airflow-7")) == (0, 1), "taken, not yet acked"
        executor.sync()
        wait_for(lambda: run(_pending(world.url, "podstream-airflow-7")) == (0, 0), what="the ack")
    finally:
        executor.end()


def test_a_scheduler_restart_resumes_from_its_consumer(world, make_command):
    first = started_executor()
    wait_for(first.podstream.connected.is_set, what="the first consumer")
    first.end()
    later = make_command("fail", task_id="later", reason="deleted_while_running")
    run(_publish(world.url, [("podstream.commands.7.uid-later", later.SerializeToString())]))
    again = started_executor()
    try:
        make_own(again, later)
        sync_until(again, lambda: key_of(later) in again.event_buffer, "the command sent while it was down")
    finally:
        again.end()


def test_without_nats_the_scheduler_goes_on_and_catches_up(world, make_command, caplog):
    world.stop()
    caplog.set_level(logging.WARNING, logger="podstream_airflow.consumer")
    executor = started_executor()
    try:
        for _ in range(5):
            executor.sync()
        wait_for(lambda: "the scheduler goes on" in caplog.text, what="one clear log line")
        assert caplog.text.count("the scheduler goes on") == 1
        world.start()
        late = make_command("fail", task_id="late", reason="pod_failed")
        make_own(executor, late)
        run(_publish(world.url, [("podstream.commands.7.uid-late", late.SerializeToString())]))
        sync_until(executor, lambda: key_of(late) in executor.event_buffer, "the command after the outage")
    finally:
        executor.end()


async def _consumer_names(url: str) -> list:
    import nats

    client = await nats.connect(url)
    infos = await client.jetstream().consumers_info(STREAM)
    await client.close()
    return sorted(info.name for info in infos)


async def _declare_sink(url: str, task_failures: str, name: str = "podstream-sink"):
    import nats
    from nats.js.api import ConsumerConfig

    client = await nats.connect(url)
    await client.jetstream().add_consumer(
        STREAM,
        ConsumerConfig(
            durable_name=name,
            filter_subject="podstream.commands.>",
            metadata={"podstream.task_failures": task_failures},
        ),
    )
    await client.close()


def test_beside_a_sink_that_fails_tasks_the_executor_refuses(world):
    from podstream_airflow.executor import PodstreamConflict

    run(_declare_sink(world.url, "sink"))
    executor = started_executor()
    try:
        wait_for(lambda: executor.podstream.refusal is not None, what="the refusal")
        assert "--task-failures executor" in executor.podstream.refusal
        with pytest.raises(PodstreamConflict, match="podstream-sink"):
            executor.sync()
        assert run(_consumer_names(world.url)) == ["podstream-sink"], "a refused executor declares nothing"
    finally:
        executor.end()


@pytest.mark.parametrize(
    ("task_failures", "consumer"),
    [
        # The sink leaves failures to the executors.
        ("executor", "podstream-sink"),
        # Any user allowed a consumer could write the metadata; only the sink's user may make
        # the sink's consumer (deploy/nats/podstream-users.conf), and only it is asked.
        ("sink", "podstream-airflow-99"),
    ],
)
def test_the_executor_runs_unless_the_sinks_own_consumer_takes_failures(world, task_failures, consumer):
    run(_declare_sink(world.url, task_failures, name=consumer))
    executor = started_executor()
    try:
        wait_for(executor.podstream.connected.is_set, what="the consumer")
        assert executor.podstream.refusal is None
        executor.sync()
    finally:
        executor.end()



def _podstream_tables() -> str:
    """Creates podstream's tables in the test's metadata DB, as the sink does; its URL."""
    url = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    subprocess.run([os.environ["PODSTREAM_BIN"], "apply", "--db", url], input=b"", check=True, capture_output=True)
    return url


def _record(task_id: str, pod_name: str, last_command: str) -> None:
    """A row of the sink's record of a TI's current pod."""
    from airflow.utils.session import create_session
    from sqlalchemy import text

    with create_session() as session:
        session.execute(
            text(
                "INSERT INTO podstream_ti_pod (dag_id, task_id, run_id, map_index, try_number, pod_namespace, "
                "pod_name, pod_uid, owner, last_command, resource_version, updated_at) VALUES "
                "('etl', :task_id, 'manual__2026-11-30', -1, 1, 'airflow', :pod_name, :pod_name, '5', :last, '1', "
                "'2026-12-01 00:00:00.000000')"
            ),
            {"task_id": task_id, "pod_name": pod_name, "last": last_command},
        )


def _ti(task_id: str, queued_by_job_id: int):
    from types import SimpleNamespace

    from airflow.models.taskinstancekey import TaskInstanceKey

    key = TaskInstanceKey("etl", task_id, "manual__2026-11-30", 1, -1)
    return SimpleNamespace(
        dag_id="etl", task_id=task_id, run_id="manual__2026-11-30", map_index=-1, try_number=1,
        queued_by_job_id=queued_by_job_id, key=key,
    )


def test_adoption_by_podstreams_record_finds_a_pod_whatever_its_labels(world):
    """The stock adoption lists pods by ``airflow-worker=<queued_by_job_id>``; a pod whose
    label says another scheduler (a drift, a half-done relabel) is not found, and its running
    task is reset. podstream's record of the TI's pod finds it."""
    from kubernetes import client, config

    _podstream_tables()
    config.load_kube_config(os.environ["AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE"])
    pods = client.CoreV1Api()
    for task_id, label in [("drifted", "5"), ("ended", "4")]:
        pods.create_namespaced_pod("airflow", client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=f"etl-{task_id}",
                labels={"airflow-worker": label, "kubernetes_executor": "True"},
                annotations={"dag_id": "etl", "task_id": task_id, "run_id": "manual__2026-11-30", "try_number": "1"},
            ),
            spec=client.V1PodSpec(containers=[client.V1Container(name="base", image="none")]),
        ))
    _record("drifted", "etl-drifted", "running")
    _record("ended", "etl-ended", "completed")
    executor = started_executor()
    try:
        drifted, ended, unknown = _ti("drifted", 3), _ti("ended", 3), _ti("unknown", 3)
        reset = executor.try_adopt_task_instances([drifted, ended, unknown])
        assert [ti.task_id for ti in reset] == ["ended", "unknown"], "only TIs with no live pod go back"
        assert drifted.key in executor.running
        labels = pods.read_namespaced_pod("etl-drifted", "airflow").metadata.labels
        assert labels["airflow-worker"] == "7", "relabelled to this scheduler, as the stock executor does"
    finally:
        executor.end()


def test_without_podstreams_record_adoption_is_the_stock_one(world):
    executor = started_executor()
    try:
        ti = _ti("anything", 3)
        assert executor.try_adopt_task_instances([ti]) == [ti]
    finally:
        executor.end()


def test_with_the_shipped_users_file_the_executor_needs_no_more(world, tmp_path, monkeypatch, make_command):
    """deploy/nats/podstream-users.conf: the executor as ``podstream-airflow`` takes and
    acks commands, and the server refuses it nothing; the commands come as the processor's
    user."""
    users = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "podstream-users.conf"
    secured = tmp_path / "secured"
    secured.mkdir()
    config = secured / "nats-server.conf"
    config.write_text(users.read_text())
    # Every password the file asks for (nats-server refuses to start with one undefined).
    names = re.findall(r"\$PODSTREAM_(\w+)_PASSWORD", users.read_text())
    passwords = {name: f"{name}-pw" for name in names}
    nats_server = Nats(
        secured / "js",
        config=config,
        env={f"PODSTREAM_{name}_PASSWORD": pw for name, pw in passwords.items()},
    )
    nats_server.start()
    try:
        processor = {"user": "podstream-process", "password": passwords["PROCESS"], "inbox_prefix": "_INBOX_podstream-process"}
        airflow = {"user": "podstream-airflow", "password": passwords["AIRFLOW"], "inbox_prefix": "_INBOX_podstream-airflow"}
        run(_create_stream(nats_server.url, **processor))
        password_file = tmp_path / "airflow.pw"
        password_file.write_text(passwords["AIRFLOW"] + "\n")
        for key, value in [
            ("url", nats_server.url),
            ("user", "podstream-airflow"),
            ("password_file", str(password_file)),
            ("ack_wait_seconds", "5"),
        ]:
            monkeypatch.setenv(f"AIRFLOW__PODSTREAM__{key.upper()}", value)
        executor = started_executor()
        try:
            failed = make_command("fail", task_id="load", reason="pod_failed", container_reason="Error")
            make_own(executor, failed)
            run(_publish(nats_server.url, [("podstream.commands.7.uid-load", failed.SerializeToString())], **processor))
            wait_for(executor.podstream.connected.is_set, what="the consumer")
            sync_until(
                executor,
                lambda: run(_pending(nats_server.url, "podstream-airflow-7", **airflow)) == (0, 0),
                "the command taken and acked",
            )
            state, _info = executor.event_buffer[key_of(failed)]
            assert state == "failed"
        finally:
            executor.end()
        # PodstreamSparkKubernetesOperator, in a worker pod with the read-only Spark user,
        # reads the Spark bucket the processor writes.
        from podstream_airflow.config import PodstreamConfig
        from podstream_airflow.spark import chosen_driver

        spark_password = tmp_path / "spark.pw"
        spark_password.write_text(passwords["SPARK"] + "\n")
        monkeypatch.setenv("AIRFLOW__PODSTREAM__USER", "podstream-spark")
        monkeypatch.setenv("AIRFLOW__PODSTREAM__PASSWORD_FILE", str(spark_password))
        key = "job.airflow.etl.crunch.r1.-1"
        run(_put_spark_choice(nats_server.url, key, "crunch-driver", **processor))
        chosen = chosen_driver(PodstreamConfig.from_airflow("spark"), key)
        assert chosen is not None and chosen["pod"]["name"] == "crunch-driver"
        refused = [line for line in nats_server.log.read_text().splitlines() if "Violation" in line]
        assert refused == []
    finally:
        nats_server.stop()


#: A scheduler's executor in a process of its own: Airflow's statsd client is made from the
#: configuration the first time a metric is sent, so the test's [metrics] settings must be
#: there from the start. It syncs once connected, waits for a line on stdin (the test stops
#: NATS meanwhile), then syncs once the consumer has noticed.
_SCHEDULER = """
import sys, time
from podstream_airflow import PodstreamKubernetesExecutor

def until(check):
    deadline = time.monotonic() + 30
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)

executor = PodstreamKubernetesExecutor()
executor.job_id = "7"
executor.start()
until(lambda: executor.podstream.waiting() == 3)
executor.sync()
print("synced", flush=True)
sys.stdin.readline()
until(lambda: not executor.podstream.connected.is_set())
executor.sync()
executor.end()
"""


def test_each_sync_says_whether_the_scheduler_takes_commands_and_how_many_wait(world, make_command):
    """The gauges ``podstream.executor.connected.<job id>`` and ``...waiting.<job id>``
    through Airflow's own statsd client: 1 while the consumer takes commands, 0 once NATS is
    gone; the commands published for the scheduler and not yet taken."""
    import socket
    import sys

    waiting = [make_command("fail", task_id=f"t{n}", reason="pod_failed") for n in range(3)]
    run(_publish(world.url, [(f"podstream.commands.7.uid-t{n}", c.SerializeToString()) for n, c in enumerate(waiting)]))

    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    statsd.bind(("127.0.0.1", 0))
    statsd.settimeout(30)
    env = {
        **os.environ,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    scheduler = subprocess.Popen(
        [sys.executable, "-c", _SCHEDULER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert scheduler.stdin is not None and scheduler.stdout is not None

    received: list = []

    def sent(line: str) -> None:
        while line not in received:
            received.extend(statsd.recv(65536).decode().splitlines())

    try:
        # Airflow logs to standard output too.
        while scheduler.stdout.readline().strip() != "synced":
            assert scheduler.poll() is None, "the scheduler process ended before its first sync"
        sent("airflow.podstream.executor.connected.7:1|g")
        sent("airflow.podstream.executor.waiting.7:3|g")
        world.stop()
        scheduler.stdin.write("go on\n")
        scheduler.stdin.flush()
        sent("airflow.podstream.executor.connected.7:0|g")
        assert scheduler.wait(timeout=30) == 0
    finally:
        scheduler.kill()
        statsd.close()
