"""``airflow podstream check``: what ``PodstreamKubernetesExecutor`` needs, tried from the
scheduler's own configuration without changing anything, one line per item as ``podstream
check`` prints them (``ok`` with what was found, ``FAIL`` with what to fix); the exit status is
the first failure's kind (78 configuration, 69 unavailable).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any, Optional

import nats
import nats.errors
import nats.js.errors

from podstream_airflow.config import PodstreamConfig
from podstream_airflow.consumer import second_failure_owner
from podstream_airflow.signing import read_key
from podstream_airflow.wire import commands_filter

#: Exit status of a wrong configuration (``sysexits.h``, as podstream's own).
CONFIGURATION = 78
#: Exit status of a service that cannot be used now.
UNAVAILABLE = 69
#: The owner token the check looks up the commands stream with: any scheduler's subject is in it.
ANY_SCHEDULER = "0"
#: Seconds a login or a JetStream request may take.
TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Line:
    """What one item of the check found."""

    item: str
    text: str
    #: 0 when the item is as needed, else the exit status its failure means.
    failure: int = 0

    def __str__(self) -> str:
        return f"{'ok  ' if not self.failure else 'FAIL'}  {self.item}: {self.text}"


def lines() -> list:
    """Every item, in order; a configuration that does not parse ends the check."""
    try:
        config = PodstreamConfig.from_airflow(ANY_SCHEDULER)
    except ValueError as error:
        return [Line("configuration", str(error), CONFIGURATION)]
    found = [Line("configuration", f"[podstream] parses; NATS at {config.servers_for_log()}")]
    found.append(_signing_key(config))
    found.extend(asyncio.new_event_loop().run_until_complete(_nats(config)))
    found.append(_adoption_record())
    return found


def _signing_key(config: PodstreamConfig) -> Line:
    if not config.signing_key_file:
        return Line(
            "signing key",
            "not set: worker pods are launched unsigned, so podstream process must run without "
            "--require-signed-pods",
        )
    try:
        key = read_key(config.signing_key_file)
    except (OSError, ValueError) as error:
        return Line("signing key", f"{error}", CONFIGURATION)
    return Line("signing key", f"{config.signing_key_file}, {len(key)} bytes")


async def _nats(config: PodstreamConfig) -> list:
    try:
        options = config.connect_options()
    except OSError as error:
        return [Line("nats login", f"a credential file does not read: {error}", CONFIGURATION)]
    client: Optional[Any] = None
    try:
        client = await nats.connect(
            name="podstream-airflow-check",
            connect_timeout=TIMEOUT_SECONDS,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            error_cb=_quiet,
            **options,
        )
    except Exception as error:  # noqa: BLE001 - every way a login fails is a line
        refused = "authorization" in str(error).lower() or "authentication" in str(error).lower()
        why = f"refused: {error}" if refused else f"no server answered ({type(error).__name__}: {error})"
        return [Line("nats login", f"{config.servers_for_log()} {why}", CONFIGURATION if refused else UNAVAILABLE)]
    try:
        login = Line("nats login", f"{config.servers_for_log()} as {config.user or 'the configured credentials'}")
        return [login, *await _commands(client, config)]
    finally:
        await client.close()


async def _commands(client: Any, config: PodstreamConfig) -> list:
    subject = commands_filter(config.subject_prefix, ANY_SCHEDULER)
    js = client.jetstream(timeout=TIMEOUT_SECONDS)
    try:
        stream = await js.find_stream_name_by_subject(subject)
    except nats.js.errors.NotFoundError:
        return [Line("commands stream", f"no stream holds {subject} yet: start podstream's processor", UNAVAILABLE)]
    except (nats.errors.TimeoutError, asyncio.TimeoutError):
        return [
            Line(
                "commands stream",
                f"no answer looking up {subject}: the user may not call $JS.API.STREAM.NAMES "
                "(deploy/nats/podstream-users.conf, user podstream-airflow)",
                CONFIGURATION,
            )
        ]
    found = [Line("commands stream", f"{stream} holds {config.subject_prefix}.commands.*")]
    try:
        refusal = await second_failure_owner(js, subject, config.sink_consumer)
    except (nats.errors.TimeoutError, asyncio.TimeoutError):
        refusal = f"no answer asking for consumer {config.sink_consumer}: the user may not read its info"
    if refusal:
        found.append(Line("task failures", refusal, CONFIGURATION))
    else:
        found.append(Line("task failures", f"the executor's (consumer {config.sink_consumer} does not claim them)"))
    return found


def _adoption_record() -> Line:
    """Whether Airflow's own database role reads podstream's record of each TI's pod."""
    from airflow import settings
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from podstream_airflow.ti_pod import TI_POD_TABLE

    if settings.engine is None:
        return Line("adoption record", "Airflow has no database engine configured", CONFIGURATION)
    try:
        with settings.engine.connect() as connection:
            connection.execute(text(f"SELECT 1 FROM {TI_POD_TABLE} WHERE 1 = 0")).fetchall()
    except SQLAlchemyError as error:
        return Line(
            "adoption record",
            f"Airflow's database role may not read {TI_POD_TABLE} ({type(error).__name__}); adoption "
            f"falls back to labels. Once podstream's sink has started (it creates the table): "
            f"GRANT SELECT ON {TI_POD_TABLE} TO <Airflow's role> (docs/install.md)",
            CONFIGURATION,
        )
    return Line("adoption record", f"{TI_POD_TABLE} is readable: adoption by podstream's record")


def cli_commands() -> list:
    """``airflow podstream check``, as Airflow's CLI takes a provider's commands."""
    from airflow.cli.cli_config import ActionCommand, GroupCommand, lazy_load_command

    check = ActionCommand(
        name="check",
        help="Try what PodstreamKubernetesExecutor needs, one line per item",
        func=lazy_load_command("podstream_airflow.check.run"),
        args=(),
    )
    return [GroupCommand(name="podstream", help="podstream's executor: check its configuration", subcommands=(check,))]


def run(_args: Any = None) -> None:
    """Prints every line; exits with the first failure's status."""
    found = lines()
    for line in found:
        print(line)
    failures = [line.failure for line in found if line.failure]
    if failures:
        sys.exit(failures[0])


async def _quiet(_error: Exception) -> None:
    pass
