"""The package against podstream's contract: ``contract.json`` beside this file is made from
podstream's Rust definitions (``tests/tests/airflow/podstream_airflow.rs`` checks it is current), so a
change on either side that the other does not follow fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podstream_airflow import config, consumer, signing, spark, ti_pod, wire

CONTRACT = json.loads((Path(__file__).parent / "contract.json").read_text())


def test_the_subjects_are_podstreams():
    assert wire.DEFAULT_PREFIX == CONTRACT["subject_prefix"]
    for example in CONTRACT["commands_filters"]:
        assert wire.commands_filter(wire.DEFAULT_PREFIX, example["owner"]) == example["filter"], example


@pytest.mark.parametrize("example", CONTRACT["tokens"], ids=lambda e: repr(e["value"]))
def test_tokens_are_encoded_as_podstream_encodes_them(example):
    assert wire.encode_token(example["value"]) == example["token"]
    assert wire.encode_key_token(example["value"]) == example["key_token"]


def test_the_failure_owner_is_declared_where_the_sink_reads_it():
    assert config.DEFAULT_SINK_CONSUMER == CONTRACT["sink_consumer"]
    assert consumer.TASK_FAILURES_METADATA == CONTRACT["task_failures_metadata"]
    assert consumer.TASK_FAILURES_EXECUTOR == CONTRACT["task_failures_executor"]


def test_replies_come_to_the_inboxes_the_users_file_allows():
    assert config.INBOX_PREFIX == CONTRACT["inbox_prefixes"]["podstream-airflow"]
    assert config.SPARK_INBOX_PREFIX == CONTRACT["inbox_prefixes"]["podstream-spark"]


def test_the_spark_operator_reads_the_processors_bucket_and_key():
    assert config.DEFAULT_SPARK_BUCKET == CONTRACT["spark_bucket"]
    job = CONTRACT["spark_job"]
    labels = {key: job[key] for key in ("dag_id", "task_id", "run_id")}
    labels["map_index"] = str(job["map_index"])
    assert spark.job_key(job["namespace"], labels) == job["key"]
    chosen = spark.chosen_of(job["key"], job["record"].encode())
    assert chosen is not None
    assert (chosen["pod"]["name"], chosen["basis"]) == (job["chosen_name"], job["chosen_basis"])


def test_pods_are_signed_as_the_processor_checks():
    example = CONTRACT["signature"]
    assert signing.SIGNATURE_ANNOTATION == example["annotation"]
    args = (example["namespace"], example["name"], example["annotations"])
    assert signing.signed_text(*args) == example["signed_text"]
    assert signing.sign(example["key"].encode(), *args) == example["value"]


def test_adoption_reads_the_sinks_table_as_the_sink_writes_it():
    table = CONTRACT["ti_pod"]
    assert ti_pod.TI_POD_TABLE == table["table"]
    assert set(ti_pod.TI_POD_COLUMNS) | {"last_command"} <= set(table["columns"])
    assert ti_pod.ALIVE_AFTER == tuple(table["live_commands"])
