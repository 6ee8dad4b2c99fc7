"""One scheduler's commands from JetStream: a durable pull consumer on
``<prefix>.commands.<job id>.*``, run by nats-py on an event loop of its own thread.

The scheduler's loop takes what has arrived (``take``) and acks it once its executor has
handled it (``ack``): a command is never acked before then, so a scheduler that dies mid-way
gets it again. While NATS is unreachable the scheduler goes on; the thread logs once per
outage and reconnects, and the consumer resumes where the acks left it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Optional

import nats
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from podstream_airflow.config import PodstreamConfig
from podstream_airflow.wire import commands_filter

log = logging.getLogger(__name__)

#: Commands fetched but not yet taken by the scheduler, at most: a slow scheduler makes the
#: thread wait, not the process grow.
INBOX_LIMIT = 1000
#: Commands per fetch.
FETCH_BATCH = 100
#: The consumer metadata key in which podstream's sink says who fails task instances
#: (``sink`` or ``executor``); executors write ``executor`` in their own.
TASK_FAILURES_METADATA = "podstream.task_failures"
#: What this executor's consumers say there (the sink's ``TaskFailures::Executor``).
TASK_FAILURES_EXECUTOR = "executor"
#: An executor's consumer outlives its scheduler job by this much, then NATS removes it.
INACTIVE_THRESHOLD_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class Delivery:
    """One message from the commands stream, with what is needed to ack it later."""

    payload: bytes
    subject: str
    message: Any


class CommandConsumer:
    """The commands of one scheduler, fetched on a thread of their own."""

    def __init__(self, config: PodstreamConfig, scheduler_job_id: str):
        self.config = config
        self.scheduler_job_id = scheduler_job_id
        self.subject = commands_filter(config.subject_prefix, scheduler_job_id)
        self._inbox: "queue.Queue[Delivery]" = queue.Queue(maxsize=INBOX_LIMIT)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Event] = None
        self._thread: Optional[threading.Thread] = None
        self._ready = threading.Event()
        #: Set while a subscription is live (for tests and health).
        self.connected = threading.Event()
        #: Commands on the stream for this scheduler not yet fetched, as the last fetch saw.
        self.unfetched = 0
        #: Why this executor must not take commands (a sink fails task instances too).
        self.refusal: Optional[str] = None

    def start(self) -> None:
        """Starts the thread; returns at once (NATS may be unreachable)."""
        self._thread = threading.Thread(target=self._run, name="podstream-commands", daemon=True)
        self._thread.start()
        self._ready.wait()

    def waiting(self) -> int:
        """Commands for this scheduler not yet taken: fetched and in the inbox, or still on the
        stream as the last fetch saw."""
        return self._inbox.qsize() + self.unfetched

    def take(self, limit: int = INBOX_LIMIT) -> list:
        """The deliveries that have arrived, at most ``limit``, without waiting."""
        taken: list[Delivery] = []
        while len(taken) < limit:
            try:
                taken.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        return taken

    def ack(self, deliveries: list) -> None:
        """Acks ``deliveries`` (handled by the executor); one that cannot be acked now is
        delivered again later, which the executor recognizes."""
        if not deliveries or self._loop is None or self._loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._ack(deliveries), self._loop)
        try:
            future.result(timeout=10)
        except Exception as error:  # noqa: BLE001 - an ack that fails is a redelivery, not a crash
            log.warning("podstream: could not ack %d commands (%s); they will be delivered again", len(deliveries), error)

    def stop(self) -> None:
        """Stops fetching and closes the connection."""
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass  # the loop closed meanwhile: the thread has ended
        if self._thread is not None:
            self._thread.join(timeout=15)

    async def _ack(self, deliveries: list) -> None:
        for delivery in deliveries:
            await delivery.message.ack()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._stopping = asyncio.Event()
        self._ready.set()
        try:
            self._loop.run_until_complete(self._consume())
        finally:
            self._loop.close()

    async def _consume(self) -> None:
        assert self._stopping is not None
        delay = 0.5
        outage_logged = False
        while not self._stopping.is_set():
            client = None
            try:
                client = await nats.connect(
                    name=f"podstream-airflow-{self.scheduler_job_id}",
                    connect_timeout=5,
                    # One way to reconnect: this loop's (backoff, one log line per outage).
                    # nats-py tries each server while its attempts stay within the maximum,
                    # and a maximum of 0 is endless: one retry each, then this loop decides.
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.5,
                    error_cb=_quiet,
                    **self.config.connect_options(),
                )
                js = client.jetstream()
                # Checked before this consumer declares itself: a refused executor leaves none.
                self.refusal = await second_failure_owner(js, self.subject, self.config.sink_consumer)
                if self.refusal:
                    log.error("podstream: %s", self.refusal)
                    return
                subscription = await js.pull_subscribe(
                    self.subject,
                    durable=self.config.consumer,
                    config=ConsumerConfig(
                        ack_policy=AckPolicy.EXPLICIT,
                        deliver_policy=DeliverPolicy.ALL,
                        ack_wait=self.config.ack_wait_seconds,
                        max_ack_pending=INBOX_LIMIT * 2,
                        inactive_threshold=INACTIVE_THRESHOLD_SECONDS,
                        metadata={TASK_FAILURES_METADATA: TASK_FAILURES_EXECUTOR},
                    ),
                )
                self.connected.set()
                log.info(
                    "podstream: taking commands on %s from %s (consumer %s)",
                    self.subject,
                    self.config.servers_for_log(),
                    self.config.consumer,
                )
                outage_logged, delay = False, 0.5
                await self._fetch(subscription)
            except Exception as error:  # noqa: BLE001 - any NATS failure: the scheduler goes on
                self.connected.clear()
                if not outage_logged:
                    why = (
                        f"no stream holds {self.subject} yet (podstream creates it when it starts)"
                        if isinstance(error, nats.js.errors.NotFoundError)
                        else f"{type(error).__name__}: {error}"
                    )
                    log.warning(
                        "podstream: no commands from %s (%s); the scheduler goes on and "
                        "catches up when NATS is back",
                        self.config.servers_for_log(),
                        why,
                    )
                    outage_logged = True
                try:
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
                delay = min(delay * 2, 30.0)
            finally:
                if client is not None and not client.is_closed:
                    await client.close()
        self.connected.clear()

    async def _fetch(self, subscription: Any) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            room = INBOX_LIMIT - self._inbox.qsize()
            if room <= 0:
                await asyncio.sleep(0.1)
                continue
            try:
                messages = await subscription.fetch(batch=min(FETCH_BATCH, room), timeout=1)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                self.unfetched = 0
                continue
            self.unfetched = messages[-1].metadata.num_pending if messages else 0
            for message in messages:
                self._inbox.put(Delivery(payload=message.data, subject=message.subject, message=message))


async def second_failure_owner(js: Any, subject: str, sink_consumer: str) -> Optional[str]:
    """Why an executor must not act: the sink's consumer on the stream of ``subject`` says the
    sink fails task instances (a failure would be applied twice). Only the sink's consumer is
    asked: only the sink's user may write it, where any user allowed a consumer could write
    another."""
    stream = await js.find_stream_name_by_subject(subject)
    try:
        info = await js.consumer_info(stream, sink_consumer)
    except nats.js.errors.NotFoundError:
        return None
    theirs = (info.config.metadata or {}).get(TASK_FAILURES_METADATA)
    if theirs not in (None, TASK_FAILURES_EXECUTOR):
        return (
            f"consumer {info.name} on {stream} says task failures belong to the {theirs}, "
            "and this PodstreamKubernetesExecutor fails task instances itself: a failure "
            "would be applied twice. Run podstream's sink with --task-failures executor."
        )
    return None


async def _quiet(error: Exception) -> None:
    log.debug("podstream: NATS connection: %s", error)
