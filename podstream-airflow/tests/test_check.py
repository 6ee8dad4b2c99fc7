"""``airflow podstream check`` with real parts: a real nats-server with JetStream and Airflow's
metadata DB made by Airflow's own migrations (see test_executor.py for the environment
podstream's suite sets). Each item passes when it is as the executor needs it, and fails with
its exit status when one of the install's stoppers is brought back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from real_parts import Nats, run

NEEDED = ("PODSTREAM_BIN", "PODSTREAM_NATS_SERVER", "PODSTREAM_AIRFLOW_DB")
pytestmark = pytest.mark.skipif(
    any(name not in os.environ for name in NEEDED),
    reason=f"needs {', '.join(NEEDED)} (podstream's test suite sets them)",
)


async def _stream(url: str) -> None:
    import nats
    from nats.js.api import StreamConfig

    client = await nats.connect(url)
    await client.jetstream().add_stream(StreamConfig(name="PODSTREAM_COMMANDS", subjects=["podstream.commands.>"]))
    await client.close()


async def _sink_consumer(url: str, task_failures: str) -> None:
    import nats
    from nats.js.api import ConsumerConfig

    client = await nats.connect(url)
    await client.jetstream().add_consumer(
        "PODSTREAM_COMMANDS",
        ConsumerConfig(durable_name="podstream-sink", metadata={"podstream.task_failures": task_failures}),
    )
    await client.close()


def _ti_pod_table(present: bool) -> None:
    """podstream's record of pods, as the sink creates it at start, or gone."""
    url = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    if present:
        subprocess.run([os.environ["PODSTREAM_BIN"], "apply", "--db", url], input=b"", check=True, capture_output=True)
    else:
        from airflow.utils.session import create_session
        from sqlalchemy import text

        with create_session() as session:
            session.execute(text("DROP TABLE IF EXISTS podstream_ti_pod"))


@pytest.fixture
def nats_url(tmp_path, monkeypatch):
    server = Nats(tmp_path / "js")
    server.start()
    monkeypatch.setenv("AIRFLOW__PODSTREAM__URL", server.url)
    yield server.url
    server.stop()


def _by_item(lines) -> dict:
    return {line.item: line for line in lines}


def test_each_item_passes_when_the_executor_has_what_it_needs(nats_url, tmp_path, monkeypatch):
    from podstream_airflow.check import lines

    run(_stream(nats_url))
    run(_sink_consumer(nats_url, "executor"))
    _ti_pod_table(present=True)
    key = tmp_path / "signing.key"
    key.write_text("k" * 40)
    monkeypatch.setenv("AIRFLOW__PODSTREAM__SIGNING_KEY_FILE", str(key))
    found = lines()
    assert [line.failure for line in found] == [0] * len(found), "\n".join(map(str, found))
    assert list(_by_item(found)) == [
        "configuration", "signing key", "nats login", "commands stream", "task failures", "adoption record",
    ]


def test_each_stopper_brought_back_fails_its_line(nats_url, tmp_path, monkeypatch):
    from podstream_airflow.check import CONFIGURATION, UNAVAILABLE, lines

    # No stream yet, a short key, and no record of pods to adopt by.
    key = tmp_path / "signing.key"
    key.write_text("short")
    monkeypatch.setenv("AIRFLOW__PODSTREAM__SIGNING_KEY_FILE", str(key))
    _ti_pod_table(present=False)
    found = _by_item(lines())
    assert found["signing key"].failure == CONFIGURATION, found["signing key"]
    assert found["commands stream"].failure == UNAVAILABLE, found["commands stream"]
    assert found["adoption record"].failure == CONFIGURATION, found["adoption record"]
    assert "GRANT SELECT ON podstream_ti_pod" in found["adoption record"].text

    # The sink fails task instances too: a failure would be applied twice.
    run(_stream(nats_url))
    run(_sink_consumer(nats_url, "sink"))
    found = _by_item(lines())
    assert found["task failures"].failure == CONFIGURATION, found["task failures"]
    assert "--task-failures executor" in found["task failures"].text

    # No server there.
    monkeypatch.setenv("AIRFLOW__PODSTREAM__URL", "nats://127.0.0.1:9")
    found = _by_item(lines())
    assert found["nats login"].failure == UNAVAILABLE, found["nats login"]
    assert "commands stream" not in found


def test_airflow_podstream_check_is_a_command_of_the_executor(nats_url):
    """Registered through the executor's ``get_cli_commands``: ``airflow podstream check``
    prints its lines and exits with the first failure's status."""
    from podstream_airflow.check import UNAVAILABLE

    _ti_pod_table(present=True)
    checked = subprocess.run(
        [sys.executable, "-m", "airflow", "podstream", "check"],
        env={
            **os.environ,
            "AIRFLOW__CORE__EXECUTOR": "podstream_airflow.PodstreamKubernetesExecutor",
            # Airflow 2 refuses a Kubernetes executor on SQLite, the test's metadata DB, when it
            # loads the executor's commands; this is Airflow's own switch for that check.
            "_AIRFLOW__SKIP_DATABASE_EXECUTOR_COMPATIBILITY_CHECK": "1",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == UNAVAILABLE, checked.stdout + checked.stderr
    assert "FAIL  commands stream: no stream holds podstream.commands.0.* yet" in checked.stdout, checked.stdout
    assert "ok    adoption record" in checked.stdout, checked.stdout
