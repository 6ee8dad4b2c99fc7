"""Follow one scheduler's podstream commands and print each as a JSON line.

A service of your own reading podstream's bus, with nothing but nats-py, protobuf and the
schema podstream ships: no generated code, no Airflow. Any language does the same in three
steps (docs/reference.md, "Reading the bus from another service"):

1. build the message types from ``proto/proto/podstream/v1/podstream.proto`` (or, as here,
   from its compiled descriptor set, ``podstream.binpb``);
2. read ``<prefix>.commands.<scheduler>.*`` from the ``PODSTREAM_COMMANDS`` stream: here by
   direct gets (the next message of the subject after a sequence), which need no consumer, so
   the shipped ``podstream-reader`` user may do it and nothing it does can touch another
   consumer;
3. decode each payload as a ``podstream.v1.Command``; a message whose ``Podstream-Role``
   header is ``left`` is the previous owner's copy of a transfer.

    python examples/follow_commands.py --nats tls://nats:4222 --scheduler 1 \
        --user podstream-reader --password-file reader.pw
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import re
import sys

import nats
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from nats.js.errors import NotFoundError

#: The descriptor set podstream's build makes, as the repository ships it.
SCHEMA = pathlib.Path(__file__).resolve().parent.parent / "podstream-airflow/src/podstream_airflow/podstream.binpb"
#: Characters a subject token keeps as they are; podstream escapes every other byte as ~XX.
PLAIN = re.compile(r"[A-Za-z0-9_-]+")
#: The reply subjects the shipped users file lets ``podstream-reader`` services receive.
INBOX_PREFIX = "_INBOX_podstream-reader"
#: How long to wait before asking again once every stored command has been read.
POLL_SECONDS = 0.25


def command_class(schema: pathlib.Path):
    """The ``podstream.v1.Command`` class, built from the descriptor set at ``schema``."""
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(schema.read_bytes()).file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("podstream.v1.Command"))


def token(value: str) -> str:
    """One subject token for a scheduler id, as podstream writes it (proto/src/subject.rs)."""
    if not value:
        return "~"
    if PLAIN.fullmatch(value):
        return value
    return "".join(chr(b) if PLAIN.fullmatch(chr(b)) else f"~{b:02X}" for b in value.encode())


def stream_name(prefix: str) -> str:
    """The commands stream's name under ``prefix``, as podstream names it (proto/src/subject.rs)."""
    return "".join(c.upper() if c.isascii() and c.isalnum() else "_" for c in prefix) + "_COMMANDS"


async def follow(args: argparse.Namespace) -> int:
    command = command_class(args.schema)
    login = {}
    if args.user:
        login = {"user": args.user, "password": args.password_file.read_text().strip()}
    client = await nats.connect(args.nats, inbox_prefix=INBOX_PREFIX, **login)
    js = client.jetstream()
    stream = stream_name(args.prefix)
    subject = f"{args.prefix}.commands.{token(args.scheduler)}.*"
    # The first sequence to read: the stream's first, or the one after its last.
    info = await js.stream_info(stream)
    after = 0 if args.from_start else info.state.last_seq
    print(f"following {subject}", file=sys.stderr, flush=True)
    printed = 0
    try:
        while args.count is None or printed < args.count:
            try:
                message = await js.get_msg(stream, seq=after + 1, subject=subject, direct=True, next=True)
            except NotFoundError:
                await asyncio.sleep(POLL_SECONDS)
                continue
            after = message.seq or after + 1
            decoded = command.FromString(message.data or b"")
            line = json_format.MessageToDict(decoded, preserving_proto_field_name=True)
            line["role"] = (message.headers or {}).get("Podstream-Role", "event")
            line["sequence"] = message.seq
            print(json.dumps(line, sort_keys=True), flush=True)
            printed += 1
    finally:
        await client.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server")
    parser.add_argument("--user", help="NATS user (the shipped users file's podstream-reader)")
    parser.add_argument("--password-file", type=pathlib.Path, help="file holding the user's password")
    parser.add_argument("--scheduler", required=True, help="the scheduler (owner) whose commands to follow")
    parser.add_argument("--prefix", default="podstream", help="podstream's subject prefix")
    parser.add_argument("--schema", type=pathlib.Path, default=SCHEMA, help="podstream.binpb")
    parser.add_argument("--from-start", action="store_true", help="every stored command first, not only new ones")
    parser.add_argument("--count", type=int, help="stop after this many")
    return asyncio.run(follow(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
