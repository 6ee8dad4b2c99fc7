"""The schema copy, subject tokens, configuration and the supported range."""

from __future__ import annotations

import ssl

import pytest
from packaging.version import Version

from podstream_airflow import UnsupportedAirflow, check_supported
from podstream_airflow.config import PodstreamConfig
from podstream_airflow.spark import job_key
from podstream_airflow.wire import commands_filter, decode_command, encode_key_token, encode_token, message_class


@pytest.mark.parametrize(
    "value, token",
    [("42", "42"), ("uid-1_a", "uid-1_a"), ("team.a", "team~2Ea"), ("~", "~7E"), ("é", "~C3~A9"), ("", "~")],
)
def test_tokens_are_podstreams(value, token):
    assert encode_token(value) == token


@pytest.mark.parametrize(
    "value, token",
    [("etl", "etl"), ("", "="), ("a.b", "a=2Eb"), ("r~1", "r=7E1"), ("t:00+00", "t=3A00=2B00")],
)
def test_key_tokens_are_podstreams(value, token):
    assert encode_key_token(value) == token


def test_a_spark_jobs_key_is_the_processors():
    # The same key as `keys_are_subject_tokens` in rules/src/spark.rs.
    labels = {"dag_id": "etl", "task_id": "crunch", "run_id": "manual__2026-11-30T10:00:00+00:00"}
    assert job_key("airflow", labels) == "job.airflow.etl.crunch.manual__2026-11-30T10=3A00=3A00=2B00=3A00.-1"
    assert job_key("airflow", {**labels, "map_index": "3"}).endswith(".3")


def test_the_filter_names_this_schedulers_commands():
    assert commands_filter("podstream", "7") == "podstream.commands.7.*"


def test_a_command_round_trips_through_the_shipped_schema():
    Command = message_class("Command")
    original = Command(id="u:1:fail", owner="7")
    original.fail.reason = "pod_failed"
    original.fail.container_reason = "Error"
    decoded = decode_command(original.SerializeToString())
    assert decoded.WhichOneof("kind") == "fail"
    assert decoded.fail.container_reason == "Error"


def config(**values):
    return PodstreamConfig.read(values.get, "7")


def test_defaults():
    c = config()
    assert c.servers == ("nats://127.0.0.1:4222",)
    assert (c.subject_prefix, c.consumer, c.ack_wait_seconds) == ("podstream", "podstream-airflow-7", 60.0)
    assert c.spark_bucket == "podstream-spark"
    assert config(spark_bucket=" spark-choices ").spark_bucket == "spark-choices"
    # A second deployment's prefix names its bucket, as podstream names it.
    assert config(subject_prefix="team.b").spark_bucket == "team-b-spark"
    assert c.connect_options() == {"servers": ["nats://127.0.0.1:4222"], "inbox_prefix": "_INBOX_podstream-airflow"}


def test_credentials_come_from_files_and_never_from_the_log(tmp_path):
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    c = config(url="nats://ps:s3cret@nats-a:4222, nats://nats-b:4222", user="ps", password_file=str(password))
    options = c.connect_options()
    assert options["user"] == "ps" and options["password"] == "s3cret"
    assert options["servers"] == ["nats://ps:s3cret@nats-a:4222", "nats://nats-b:4222"]
    assert "s3cret" not in c.servers_for_log()
    assert "s3cret" not in repr(c)


def test_tls_urls_get_a_tls_context():
    assert isinstance(config(url="tls://nats:4222").connect_options()["tls"], ssl.SSLContext)


@pytest.mark.parametrize(
    "values, error",
    [({"ack_wait_seconds": "soon"}, "not a number"), ({"cert_file": "/c.pem"}, "go together")],
)
def test_bad_configuration_is_refused_with_the_key(values, error):
    with pytest.raises(ValueError, match=error):
        config(**values)


@pytest.mark.parametrize(
    "airflow, provider, ok",
    [
        ("2.10.5", "10.10.0", True),
        ("3.3.2", "10.25.0", True),
        ("2.9.3", "10.10.0", False),
        ("3.4.0", "10.25.0", False),
        ("3.1.8", "8.4.2", False),
    ],
)
def test_only_tested_releases_import(airflow, provider, ok):
    if ok:
        check_supported(Version(airflow), Version(provider))
    else:
        with pytest.raises(UnsupportedAirflow, match=r"apache-airflow >=2\.10,<3\.4"):
            check_supported(Version(airflow), Version(provider))
