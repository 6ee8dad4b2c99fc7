"""The pod signature, as podstream's processor checks it (``proto/src/signature.rs``)."""

from __future__ import annotations

import pytest
from kubernetes import client

from podstream_airflow.signing import SIGNATURE_ANNOTATION, read_key, sign, sign_pod, signed_text

KEY = b"0123456789abcdef0123456789abcdef"
ANNOTATIONS = {
    "dag_id": "etl",
    "task_id": "load",
    "run_id": "scheduled__2026-12-06T00:00:00+00:00",
    "try_number": "1",
}
#: The vector podstream's own test checks (``signature::tests``), made with openssl.
VECTOR = "v1:38a8521adc9cb406366d922a3ecabf3c9801d2c14a4057cb32f2ac1b54976304"


def test_the_shared_vector_is_what_both_languages_compute():
    assert sign(KEY, "airflow", "etl-load-x7k2", ANNOTATIONS) == VECTOR


def test_fields_are_read_as_podstream_reads_them():
    mapped = {**ANNOTATIONS, "map_index": " 3 ", "try_number": "01"}
    assert signed_text("ns", "p", mapped).split("\n")[-2:] == ["3", "1"]
    assert signed_text("ns", "p", ANNOTATIONS).split("\n")[-2:] == ["-1", "1"]
    assert sign(KEY, "airflow", "etl-load-copy", ANNOTATIONS) != VECTOR
    assert sign(KEY, "dags", "etl-load-x7k2", ANNOTATIONS) != VECTOR


def test_a_pod_is_signed_only_with_a_key_and_keeps_its_annotations():
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="etl-load-x7k2", namespace="airflow", annotations=dict(ANNOTATIONS)))
    sign_pod(None, pod)
    assert SIGNATURE_ANNOTATION not in pod.metadata.annotations
    sign_pod(KEY, pod)
    assert pod.metadata.annotations[SIGNATURE_ANNOTATION] == VECTOR
    assert pod.metadata.annotations["dag_id"] == "etl"


def test_a_short_key_is_refused_and_a_newline_is_trimmed(tmp_path):
    (tmp_path / "short").write_bytes(b"short\n")
    with pytest.raises(ValueError, match="at least 32"):
        read_key(str(tmp_path / "short"))
    (tmp_path / "key").write_bytes(KEY + b"\n")
    assert read_key(str(tmp_path / "key")) == KEY
