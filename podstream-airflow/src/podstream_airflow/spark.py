"""``PodstreamSparkKubernetesOperator``: the provider's ``SparkKubernetesOperator``, whose
``find_spark_job`` asks podstream which driver pod drives the task instance (seed 003).

With ``--spark``, podstream's ingest watches the driver pods of Airflow's Spark jobs and their
SparkApplications, and its processor keeps each job's chosen driver in a KV bucket (the pod the
job's SparkApplication names when it exists, else the provider's own order). This operator
reads that choice and reattaches to the pod when the cluster still lists it under the stock
selector; with no answer (podstream not running, NATS unreachable, no choice yet, the pod gone)
it runs the stock ``find_spark_job``. The rule lives in podstream, not here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from typing import Any, Optional, cast

import nats
import nats.js.errors
from airflow.providers.cncf.kubernetes.operators.spark_kubernetes import SparkKubernetesOperator

from podstream_airflow.config import SPARK_INBOX_PREFIX, PodstreamConfig
from podstream_airflow.wire import encode_key_token

log = logging.getLogger(__name__)

#: How long the operator waits for podstream's answer before asking the cluster itself.
ASK_TIMEOUT_SECONDS = 5.0


def job_key(namespace: str, labels: dict) -> str:
    """The key of a Spark job's record in podstream's bucket, from the operator's task labels
    without the try (``JobKey::kv_key`` in ``rules/src/spark.rs``)."""
    return ".".join(
        [
            "job",
            encode_key_token(namespace),
            encode_key_token(labels["dag_id"]),
            encode_key_token(labels["task_id"]),
            encode_key_token(labels["run_id"]),
            str(labels.get("map_index", "-1")),
        ]
    )


def chosen_driver(config: PodstreamConfig, key: str) -> Optional[dict]:
    """podstream's choice for the job under ``key``: ``{"pod": {"namespace", "name", "uid"},
    "basis", "others"}``, or ``None`` when it has none or cannot be asked in time."""

    async def ask() -> Optional[bytes]:
        client = await nats.connect(
            name="podstream-airflow-spark",
            connect_timeout=2,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            **config.connect_options(SPARK_INBOX_PREFIX),
        )
        try:
            bucket = await client.jetstream().key_value(config.spark_bucket)
            return (await bucket.get(key)).value
        except nats.js.errors.KeyNotFoundError:
            return None
        finally:
            await client.close()

    # A thread of its own: the task may already run an event loop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(asyncio.run, asyncio.wait_for(ask(), ASK_TIMEOUT_SECONDS))
        try:
            value = future.result()
        except Exception as error:  # noqa: BLE001 - no answer: the stock lookup decides
            log.info("podstream: no answer for %s from %s (%s: %s)", key, config.servers_for_log(), type(error).__name__, error)
            return None
    return chosen_of(key, value) if value else None


def chosen_of(key: str, value: bytes) -> Optional[dict]:
    """The ``chosen`` of the job record ``value`` (the processor's ``JobRecord`` as JSON), or
    ``None`` when it names no pod or is not a record podstream writes (logged)."""
    try:
        chosen = json.loads(value).get("chosen")
    except (ValueError, AttributeError) as error:
        log.warning("podstream: the record of %s is not one podstream writes (%s)", key, error)
        return None
    return chosen if isinstance(chosen, dict) and isinstance(chosen.get("pod"), dict) else None


class PodstreamSparkKubernetesOperator(SparkKubernetesOperator):
    """A drop-in ``SparkKubernetesOperator`` that reattaches to the driver podstream chose."""

    def find_spark_job(self, context: Any, exclude_checked: bool = True) -> Any:
        """The driver pod podstream chose for this task instance, when the cluster still
        lists it under the stock selector; otherwise the stock ``find_spark_job``."""
        labels = self._get_ti_pod_labels(context, include_try_number=False)
        chosen = chosen_driver(PodstreamConfig.from_airflow("spark"), job_key(cast(str, self.namespace), labels))
        if chosen is not None:
            name = chosen["pod"].get("name", "")
            selector = self._build_find_pod_label_selector(context, exclude_checked=exclude_checked) + ",spark-role=driver"
            pods = self.client.list_namespaced_pod(
                self.namespace, label_selector=selector, field_selector=f"metadata.name={name}"
            ).items
            if pods:
                self.log.info(
                    "podstream: driver pod %s drives this task instance (%s); reattaching to it",
                    name,
                    chosen.get("basis", "?"),
                )
                return pods[0]
            self.log.info("podstream: its choice %s is gone or no longer this job's; asking the cluster", name)
        return super().find_spark_job(context, exclude_checked=exclude_checked)
