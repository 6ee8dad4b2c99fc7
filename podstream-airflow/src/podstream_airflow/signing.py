"""Signed worker pods: the annotation ``PodstreamKubernetesExecutor`` writes on every pod it
launches, an HMAC-SHA256 over the pod's namespace, name and TI key, so that podstream's
processor (``--require-signed-pods``) can tell the executor's pods from copies of their
annotations (docs/semantics.md "Signed worker pods"). The scheme is podstream's
``proto/src/signature.rs``; both sides' tests check one shared vector.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Mapping, Optional

#: The annotation that carries a pod's signature.
SIGNATURE_ANNOTATION = "podstream.io/signature"
#: The scheme's version: the first line of the signed text and the value's prefix.
VERSION = "v1"
#: The fewest bytes a signing key may have.
MIN_KEY_BYTES = 32


def read_key(path: str) -> bytes:
    """The key in ``path``, surrounding whitespace trimmed (as podstream trims it)."""
    key = Path(path).read_bytes().strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"pod-signing key {path} has {len(key)} bytes; at least {MIN_KEY_BYTES} are required")
    return key


def signed_text(namespace: str, name: str, annotations: Mapping[str, str]) -> str:
    """The text signed for a pod: the version, namespace, name, dag_id, task_id, run_id,
    map_index (-1 when absent) and try_number, one per line, read as podstream reads them."""

    def get(key: str) -> str:
        return (annotations.get(key) or "").strip()

    map_index = int(get("map_index")) if get("map_index") else -1
    fields = [VERSION, namespace, name, get("dag_id"), get("task_id"), get("run_id"), str(map_index)]
    fields.append(str(int(get("try_number"))))
    return "\n".join(fields)


def sign(key: bytes, namespace: str, name: str, annotations: Mapping[str, str]) -> str:
    """The annotation's value for a pod with these ``annotations``."""
    digest = hmac.new(key, signed_text(namespace, name, annotations).encode(), hashlib.sha256).hexdigest()
    return f"{VERSION}:{digest}"


def sign_pod(key: Optional[bytes], pod) -> None:
    """Adds the signature to ``pod`` (a ``V1Pod`` about to be created) when a key is set."""
    if key is None:
        return
    metadata = pod.metadata
    annotations = dict(metadata.annotations or {})
    annotations[SIGNATURE_ANNOTATION] = sign(key, metadata.namespace, metadata.name, annotations)
    metadata.annotations = annotations
