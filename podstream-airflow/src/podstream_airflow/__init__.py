"""Airflow's KubernetesExecutor, listening to podstream instead of watching pods.

Set ``[core] executor = podstream_airflow.PodstreamKubernetesExecutor``. The executor launches
pods exactly as the stock one does; the outcomes of its pods come from podstream's commands on
JetStream and enter the executor's own result path. ``PodstreamSparkKubernetesOperator`` is the
provider's ``SparkKubernetesOperator`` reattaching to the Spark driver podstream chose. The rules live in podstream (Rust); this
package only adapts Airflow to them.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from packaging.version import Version

#: The Airflow releases this package is tested with: podstream's list of supported releases
#: (sink/airflow-versions.tsv), from its oldest to the next minor after its newest.
SUPPORTED_AIRFLOW = (Version("2.10"), Version("3.4"))
#: The oldest cncf.kubernetes provider it is tested with.
OLDEST_PROVIDER = Version("10.10")


class UnsupportedAirflow(ImportError):
    """The installed Airflow or cncf.kubernetes provider is outside the tested range."""


def _installed(distribution: str) -> Version | None:
    try:
        return Version(version(distribution))
    except PackageNotFoundError:
        return None


def check_supported(airflow: Version | None, provider: Version | None) -> None:
    """Refuses an Airflow or provider outside the tested range, naming the range."""
    low, high = SUPPORTED_AIRFLOW
    wanted = (
        f"podstream-airflow supports apache-airflow >={low},<{high} with "
        f"apache-airflow-providers-cncf-kubernetes >={OLDEST_PROVIDER}"
    )
    if airflow is None or not low <= airflow < high:
        raise UnsupportedAirflow(f"{wanted}; found apache-airflow {airflow or 'not installed'}")
    if provider is None or provider < OLDEST_PROVIDER:
        raise UnsupportedAirflow(
            f"{wanted}; found apache-airflow-providers-cncf-kubernetes {provider or 'not installed'}"
        )


check_supported(_installed("apache-airflow"), _installed("apache-airflow-providers-cncf-kubernetes"))


def __getattr__(name: str) -> Any:
    # Imported on first use, not with the package: Airflow loads this package's provider entry
    # point (provider_info) while it initializes its configuration, before the executor's
    # Airflow modules can be imported (Airflow 3.3 fails with a circular import otherwise).
    if name == "PodstreamKubernetesExecutor":
        from podstream_airflow.executor import PodstreamKubernetesExecutor

        return PodstreamKubernetesExecutor
    if name == "PodstreamSparkKubernetesOperator":
        from podstream_airflow.spark import PodstreamSparkKubernetesOperator

        return PodstreamSparkKubernetesOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PodstreamKubernetesExecutor", "PodstreamSparkKubernetesOperator", "UnsupportedAirflow", "check_supported"]
