"""Real parts the tests share: a nats-server with JetStream on a port of its own, and waiting."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Nats:
    """A nats-server with JetStream on a port of its own; stop and start keep its store."""

    def __init__(self, store: Path, config: Optional[Path] = None, env: Optional[dict] = None):
        self.port = free_port()
        self.store = store
        self.config = config
        self.env = env or {}
        self.log = store.parent / "nats-server.log"
        self.process = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = ["-c", str(self.config)] if self.config else []
        self.process = subprocess.Popen(
            [os.environ["PODSTREAM_NATS_SERVER"], *config, "-js", "-sd", str(self.store), "-a", "127.0.0.1",
             "-p", str(self.port), "-l", str(self.log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **self.env},
        )
        wait_for(lambda: _accepts(self.port), what="nats-server")

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def run(coroutine):
    return asyncio.new_event_loop().run_until_complete(coroutine)
