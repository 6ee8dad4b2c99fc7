"""The ``[podstream]`` section of ``airflow.cfg`` (each key also ``AIRFLOW__PODSTREAM__<KEY>``).

| key | default | meaning |
|---|---|---|
| ``url`` | ``nats://127.0.0.1:4222`` | NATS server(s), comma-separated; ``tls://`` requires TLS |
| ``subject_prefix`` | ``podstream`` | first token of podstream's subjects (``podstream --prefix``) |
| ``consumer`` | ``podstream-airflow-<job id>`` | durable consumer name (one per scheduler job) |
| ``sink_consumer`` | ``podstream-sink`` | the sink's consumer (``podstream sink --consumer``), whose metadata says who fails task instances |
| ``creds_file`` | | NATS credentials file (JWT and nkey seed) |
| ``nkey_file`` | | nkey seed file |
| ``user``, ``password_file`` | | user and a file holding the password |
| ``token_file`` | | file holding a token |
| ``ca_file`` | | CA certificate to verify the server with |
| ``cert_file``, ``key_file`` | | client certificate and key (mutual TLS) |
| ``ack_wait_seconds`` | ``60`` | how long NATS waits for the executor to take a command before redelivering it |
| ``signing_key_file`` | | file holding the key the executor signs its pods with (``podstream process --require-signed-pods``) |
| ``spark_bucket`` | ``<subject_prefix>-spark`` | KV bucket of the Spark jobs' chosen drivers (``podstream process --spark-bucket``), read by ``PodstreamSparkKubernetesOperator`` |
| ``collect_pods`` | ``False`` | podstream's collector deletes worker pods (``podstream collect``, ``run --collect-pods``): the executor then deletes and labels none itself |
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from podstream_airflow.wire import DEFAULT_PREFIX

SECTION = "podstream"
#: podstream's Spark bucket unless configured otherwise (``podstream process --spark-bucket``).
DEFAULT_SPARK_BUCKET = "podstream-spark"
#: The sink's consumer unless configured otherwise (``podstream sink --consumer``).
DEFAULT_SINK_CONSUMER = "podstream-sink"
#: The NATS server unless configured otherwise.
DEFAULT_URL = "nats://127.0.0.1:4222"
#: How long NATS waits for a command to be taken unless configured otherwise.
DEFAULT_ACK_WAIT_SECONDS = 60.0


def resource_name(prefix: str, role: str) -> str:
    """``<prefix>-<role>``, dots as dashes: the name podstream gives a prefix's KV bucket
    (``podstream-spark`` under the default prefix), as ``Subjects::resource_name`` does."""
    return f"{prefix.replace('.', '-')}-{role}"


@dataclass(frozen=True)
class Option:
    """One key of the ``[podstream]`` section, as Airflow's provider metadata lists it."""

    key: str
    description: str
    default: Optional[str] = None
    type: str = "string"
    sensitive: bool = False


#: Every key of the section (``airflow config list --section podstream`` shows them).
OPTIONS = (
    Option("url", "NATS server(s), comma-separated; tls:// requires TLS.", DEFAULT_URL),
    Option("subject_prefix", "First token of podstream's subjects (podstream --prefix).", DEFAULT_PREFIX),
    Option("consumer", "Durable consumer name; podstream-airflow-<scheduler job id> when unset."),
    Option(
        "sink_consumer",
        "The sink's durable consumer (podstream sink --consumer): the one consumer whose "
        "metadata says who fails task instances.",
        DEFAULT_SINK_CONSUMER,
    ),
    Option("creds_file", "NATS credentials file (JWT and nkey seed)."),
    Option("nkey_file", "NATS nkey seed file."),
    Option("user", "NATS user."),
    Option("password_file", "File holding the NATS user's password."),
    Option("token_file", "File holding a NATS token."),
    Option("ca_file", "CA certificate to verify the NATS server with."),
    Option("cert_file", "Client certificate for mutual TLS (with key_file)."),
    Option("key_file", "Client key for mutual TLS (with cert_file)."),
    Option(
        "ack_wait_seconds",
        "Seconds NATS waits for the executor to take a command before redelivering it.",
        str(int(DEFAULT_ACK_WAIT_SECONDS)),
        "float",
    ),
    Option(
        "signing_key_file",
        "File holding the key (32 bytes or more) the executor signs its worker pods with, "
        "for podstream process --require-signed-pods.",
    ),
    Option(
        "spark_bucket",
        "KV bucket of the Spark jobs' chosen drivers (podstream process --spark-bucket); "
        "<subject_prefix>-spark when unset.",
    ),
    Option(
        "collect_pods",
        "podstream's collector deletes worker pods (podstream collect, podstream run "
        "--collect-pods): the executor then deletes and labels none when a task ends.",
        "False",
        "boolean",
    ),
)
#: The subject prefix of the replies the executor's NATS connection receives.
INBOX_PREFIX = "_INBOX_podstream-airflow"
#: The subject prefix of the replies PodstreamSparkKubernetesOperator's connection receives,
#: in worker pods: apart from the schedulers', so the users file lets neither read the other's.
SPARK_INBOX_PREFIX = "_INBOX_podstream-spark"


@dataclass(frozen=True)
class PodstreamConfig:
    """Where podstream's commands are and how to log in."""

    #: Kept out of ``repr``: a URL may carry credentials.
    servers: tuple = field(repr=False)
    subject_prefix: str
    consumer: str
    sink_consumer: str = DEFAULT_SINK_CONSUMER
    creds_file: Optional[str] = None
    nkey_file: Optional[str] = None
    user: Optional[str] = None
    password_file: Optional[str] = None
    token_file: Optional[str] = None
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    ack_wait_seconds: float = DEFAULT_ACK_WAIT_SECONDS
    spark_bucket: str = DEFAULT_SPARK_BUCKET
    signing_key_file: Optional[str] = None
    collect_pods: bool = False

    @classmethod
    def read(cls, get: Callable[[str], Optional[str]], scheduler_job_id: str) -> "PodstreamConfig":
        """The configuration ``get(key)`` gives (``None`` for an unset key), for one scheduler."""

        def value(key: str) -> Optional[str]:
            raw = get(key)
            return raw.strip() if raw and raw.strip() else None

        servers = tuple(s.strip() for s in (value("url") or DEFAULT_URL).split(",") if s.strip())
        ack_wait = value("ack_wait_seconds")
        try:
            ack_wait_seconds = float(ack_wait) if ack_wait else DEFAULT_ACK_WAIT_SECONDS
        except ValueError:
            raise ValueError(f"[{SECTION}] ack_wait_seconds is {ack_wait!r}, not a number") from None
        if (value("cert_file") is None) != (value("key_file") is None):
            raise ValueError(f"[{SECTION}] cert_file and key_file go together (mutual TLS)")
        prefix = value("subject_prefix") or DEFAULT_PREFIX
        collect_pods = (value("collect_pods") or "False").lower()
        if collect_pods not in ("true", "false"):
            raise ValueError(f"[{SECTION}] collect_pods is {value('collect_pods')!r}, not True or False")
        return cls(
            servers=servers,
            subject_prefix=prefix,
            consumer=value("consumer") or f"podstream-airflow-{scheduler_job_id}",
            sink_consumer=value("sink_consumer") or DEFAULT_SINK_CONSUMER,
            creds_file=value("creds_file"),
            nkey_file=value("nkey_file"),
            user=value("user"),
            password_file=value("password_file"),
            token_file=value("token_file"),
            ca_file=value("ca_file"),
            cert_file=value("cert_file"),
            key_file=value("key_file"),
            ack_wait_seconds=ack_wait_seconds,
            spark_bucket=value("spark_bucket") or resource_name(prefix, "spark"),
            signing_key_file=value("signing_key_file"),
            collect_pods=collect_pods == "true",
        )

    @classmethod
    def from_airflow(cls, scheduler_job_id: str) -> "PodstreamConfig":
        """The configuration in ``airflow.cfg`` and ``AIRFLOW__PODSTREAM__*``."""
        from airflow.configuration import conf

        return cls.read(lambda key: conf.get(SECTION, key, fallback=None), scheduler_job_id)

    def servers_for_log(self) -> str:
        """The servers with any credentials in a URL replaced, for logs."""
        return ",".join(_redacted(s) for s in self.servers)

    def connect_options(self, inbox_prefix: str = INBOX_PREFIX) -> dict:
        """Keyword arguments for ``nats.connect``: credentials are read from their files here,
        never logged. Replies come on ``inbox_prefix``, so a server may let each user read
        only its own (deploy/nats/podstream-users.conf)."""
        options: dict[str, Any] = {"servers": list(self.servers), "inbox_prefix": inbox_prefix}
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        if self.nkey_file:
            options["nkeys_seed"] = self.nkey_file
        if self.user:
            options["user"] = self.user
            if self.password_file:
                options["password"] = _read(self.password_file)
        if self.token_file:
            options["token"] = _read(self.token_file)
        if self.ca_file or self.cert_file or any(s.startswith("tls://") for s in self.servers):
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file and self.key_file:
                context.load_cert_chain(self.cert_file, self.key_file)
            options["tls"] = context
        return options


def _read(path: str) -> str:
    return Path(path).read_text().strip()


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
