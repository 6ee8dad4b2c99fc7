"""What Airflow's provider manager reads of this package (the ``apache_airflow_provider`` entry
point): its name, the executor, and the ``[podstream]`` section with every key and default, so
``airflow providers list`` and ``airflow config list --section podstream`` know them.

Imports nothing of Airflow: the provider manager calls it while Airflow itself starts."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, metadata, version
from typing import Any

from podstream_airflow.config import OPTIONS, SECTION

PACKAGE = "podstream-airflow"
#: The integration the provider's entries belong to.
INTEGRATION = "podstream"


def project_url(label: str) -> str:
    """The package's ``[project.urls]`` entry ``label`` (its one source), or "" when the
    package is not installed."""
    try:
        entries = metadata(PACKAGE).get_all("Project-URL") or []
    except PackageNotFoundError:
        return ""
    for entry in entries:
        name, _, url = entry.partition(",")
        if name.strip() == label:
            return url.strip()
    return ""


def get_provider_info() -> dict[str, Any]:
    """The provider metadata, in the form of Airflow's ``provider_info.schema.json``."""
    try:
        installed = version(PACKAGE)
    except PackageNotFoundError:
        installed = "0"
    return {
        "package-name": PACKAGE,
        "name": "podstream",
        "description": "KubernetesExecutor taking pod outcomes from podstream (NATS JetStream) "
        "instead of watching pods itself.",
        "versions": [installed],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": project_url("Documentation"),
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": INTEGRATION, "python-modules": ["podstream_airflow.spark"]}],
        "executors": ["podstream_airflow.PodstreamKubernetesExecutor"],
        # Airflow 3.2 and later read the executor's commands from here (older ones ask
        # PodstreamKubernetesExecutor.get_cli_commands).
        "cli": ["podstream_airflow.check.cli_commands"],
        "config": {
            SECTION: {
                "description": "Where PodstreamKubernetesExecutor reads podstream's commands.",
                "options": {
                    option.key: {
                        "description": option.description,
                        "version_added": "0.1.0",
                        "type": option.type,
                        "example": None,
                        "default": option.default,
                        **({"sensitive": True} if option.sensitive else {}),
                    }
                    for option in OPTIONS
                },
            }
        },
    }
