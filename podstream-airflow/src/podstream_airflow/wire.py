"""podstream's bus schema, read at run time from the descriptor set the Rust build makes.

``podstream.binpb`` is ``proto/podstream/v1/podstream.proto`` compiled by podstream's own build
(``podstream_proto::FILE_DESCRIPTOR_SET``); podstream's tests fail when this copy differs from
it. Building the message classes from it needs no protoc and no generated code, so it works
with whatever protobuf runtime Airflow brings.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib.resources import files
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

#: The package of podstream's messages.
PACKAGE = "podstream.v1"
#: The first token of podstream's subjects unless configured otherwise.
DEFAULT_PREFIX = "podstream"

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")


@lru_cache(maxsize=None)
def _pool() -> descriptor_pool.DescriptorPool:
    raw = files("podstream_airflow").joinpath("podstream.binpb").read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(raw).file:
        pool.Add(file)
    return pool


@lru_cache(maxsize=None)
def message_class(name: str) -> Any:
    """The class of message ``name`` (``Command``, ``TaskKey``, ...), one per name."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))


def decode_command(payload: bytes) -> Any:
    """A ``podstream.v1.Command`` from its bytes on the bus; raises ``DecodeError`` when not."""
    return message_class("Command").FromString(payload)


def encode_token(value: str) -> str:
    """One subject token for any string, as podstream encodes it (``proto/src/subject.rs``)."""
    return _escaped(value, "~")


def encode_key_token(value: str) -> str:
    """One KV-key token for any string, as podstream encodes it (``encode_key_token`` in
    ``proto/src/subject.rs``): plain characters stay, every other byte is ``=XX``."""
    return _escaped(value, "=")


def _escaped(value: str, escape: str) -> str:
    if not value:
        return escape
    if _PLAIN.fullmatch(value):
        return value
    return "".join(
        chr(byte) if _PLAIN.fullmatch(chr(byte)) else f"{escape}{byte:02X}" for byte in value.encode()
    )


def commands_filter(prefix: str, owner: str) -> str:
    """The subjects of every command for scheduler ``owner``: ``<prefix>.commands.<owner>.*``."""
    return f"{prefix}.commands.{encode_token(owner)}.*"
