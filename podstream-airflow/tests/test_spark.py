"""``PodstreamSparkKubernetesOperator`` with real parts: podstream's simulator serving
SparkApplications, a real nats-server, and podstream's own ``ingest --spark`` and
``process --spark`` keeping each Spark job's chosen driver. The subclass asks podstream; the
stock operator asks the cluster; both run this venv's provider. podstream's test suite runs this
file with the variables of ``test_executor.py``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from real_parts import Nats, wait_for

NEEDED = ("PODSTREAM_BIN", "PODSTREAM_NATS_SERVER", "PODSTREAM_AIRFLOW_DB")
pytestmark = pytest.mark.skipif(
    any(name not in os.environ for name in NEEDED),
    reason=f"needs {', '.join(NEEDED)} (podstream's test suite sets them)",
)

NS = "airflow"
CRD = Path(__file__).resolve().parents[2] / "sim" / "crds" / "sparkapplications.yaml"
SPARK = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")


class Stage:
    """The simulator, a nats-server and podstream's Spark pipeline, with Kubernetes clients."""

    def __init__(self, tmp_path: Path):
        self.kubeconfig = tmp_path / "kubeconfig"
        self.sim = subprocess.Popen(
            [os.environ["PODSTREAM_BIN"], "sim", "--listen", "127.0.0.1:0", "--kubeconfig", str(self.kubeconfig), "--crd", str(CRD)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.sim.stdout is not None and self.sim.stdout.readline().startswith("listening on")
        self.nats = Nats(tmp_path / "js")
        self.nats.start()
        self.logs = tmp_path
        self.pipeline: list = []
        from kubernetes import client, config

        api = config.new_client_from_config(str(self.kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def start_pipeline(self) -> None:
        """``podstream ingest --spark`` and ``podstream process --spark`` on this stage."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        for component in (["ingest", "--namespaces", NS], ["process"]):
            log = open(self.logs / f"{component[0]}.log", "w")  # noqa: SIM115 - closed with the process
            self.pipeline.append(
                subprocess.Popen(
                    [os.environ["PODSTREAM_BIN"], *component, "--spark", "--nats", self.nats.url],
                    stdout=log,
                    stderr=log,
                    env=env,
                )
            )

    def stop_pipeline(self) -> None:
        for process in self.pipeline:
            process.terminate()
            process.wait(timeout=30)
        self.pipeline = []

    def stop(self) -> None:
        self.stop_pipeline()
        self.nats.stop()
        self.sim.terminate()
        self.sim.wait(timeout=10)

    def application(self, name: str, driver: str) -> None:
        """A SparkApplication whose status names ``driver``, as the Spark operator writes it."""
        self.custom.create_namespaced_custom_object(
            *SPARK[:2], NS, SPARK[2],
            {"apiVersion": "/".join(SPARK[:2]), "kind": "SparkApplication", "metadata": {"name": name},
             "spec": {"type": "Python", "mode": "cluster"}},
        )
        self.custom.patch_namespaced_custom_object_status(
            *SPARK[:2], NS, SPARK[2], name, {"status": {"driverInfo": {"podName": driver}}}
        )

    def driver(self, task_id: str, name: str, phase: str, application: str) -> None:
        """A driver pod of ``task_id`` in ``phase``, labelled as the operator and the Spark
        operator label it."""
        labels = {
            "dag_id": "spark_dag", "task_id": task_id, "run_id": "r1", "try_number": "1",
            "spark_kubernetes_operator": "True", "spark-role": "driver",
            "sparkoperator.k8s.io/app-name": application,
        }
        self.core.create_namespaced_pod(
            NS,
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
             "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:3.5"}]}},
        )
        self.core.patch_namespaced_pod_status(name, NS, {"status": {"phase": phase}})

    def chosen(self, task_id: str):
        """podstream's kept choice for ``task_id``'s job (``None`` while it has none)."""
        from podstream_airflow.config import PodstreamConfig
        from podstream_airflow.spark import chosen_driver, job_key

        labels = {"dag_id": "spark_dag", "task_id": task_id, "run_id": "r1"}
        return chosen_driver(PodstreamConfig.from_airflow("spark"), job_key(NS, labels))


@pytest.fixture
def stage(tmp_path, monkeypatch):
    staged = Stage(tmp_path)
    monkeypatch.setenv("AIRFLOW__PODSTREAM__URL", staged.nats.url)
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", '{"conn_type": "kubernetes"}')
    yield staged
    staged.stop()


def find(operator_class, stage: Stage, task_id: str):
    """The driver ``operator_class.find_spark_job`` reattaches to: its name, ``None`` for none,
    or the error it raised (the provider before 10.25 refuses several pods)."""
    operator = operator_class(
        task_id=task_id,
        namespace=NS,
        config_file=str(stage.kubeconfig),
        template_spec={"spark": {}, "kubernetes": {}},
    )
    ti = SimpleNamespace(dag_id="spark_dag", task_id=task_id, map_index=-1, try_number=1)
    context = {"dag": SimpleNamespace(dag_id="spark_dag", parent_dag=None), "ti": ti, "task_instance": ti, "run_id": "r1"}
    try:
        pod = operator.find_spark_job(context)
    except Exception as error:  # noqa: BLE001 - what the stock operator does is the finding
        return f"raises {type(error).__name__}"
    return pod.metadata.name if pod is not None else None


def test_the_operator_reattaches_to_the_driver_the_application_names(stage):
    from airflow.providers.cncf.kubernetes.operators.spark_kubernetes import SparkKubernetesOperator

    from podstream_airflow import PodstreamSparkKubernetesOperator

    stage.start_pipeline()
    stage.application("crunch", "crunch-driver")
    stage.driver("crunch", "crunch-driver", "Running", "crunch")
    time.sleep(1.1)  # a newer creation time for the second driver
    stage.driver("crunch", "crunch-driver-2", "Pending", "crunch")
    wait_for(lambda: (stage.chosen("crunch") or {}).get("basis") == "spark_application", what="podstream's choice")
    assert stage.chosen("crunch")["pod"]["name"] == "crunch-driver"

    podstream = find(PodstreamSparkKubernetesOperator, stage, "crunch")
    stock = find(SparkKubernetesOperator, stage, "crunch")
    print(f"two drivers, the application tracking the older: podstream {podstream}, stock {stock}")
    assert podstream == "crunch-driver"
    # The current provider takes the newer pending pod; the older one refuses to choose.
    assert stock in ("crunch-driver-2", "raises AirflowException")


def test_a_choice_whose_pod_is_gone_leaves_the_lookup_to_the_stock_operator(stage):
    from airflow.providers.cncf.kubernetes.operators.spark_kubernetes import SparkKubernetesOperator

    from podstream_airflow import PodstreamSparkKubernetesOperator

    stage.start_pipeline()
    stage.application("gone", "gone-driver")
    stage.driver("gone", "gone-driver", "Running", "gone")
    wait_for(lambda: (stage.chosen("gone") or {}).get("pod", {}).get("name") == "gone-driver", what="podstream's choice")
    # podstream stops, so its record still names the pod deleted after.
    stage.stop_pipeline()
    stage.driver("gone", "gone-driver-2", "Pending", "gone")
    stage.core.delete_namespaced_pod("gone-driver", NS, grace_period_seconds=0)
    assert stage.chosen("gone")["pod"]["name"] == "gone-driver"
    assert find(PodstreamSparkKubernetesOperator, stage, "gone") == find(SparkKubernetesOperator, stage, "gone") == "gone-driver-2"


def test_without_podstream_the_operator_is_the_stock_one(stage):
    from podstream_airflow import PodstreamSparkKubernetesOperator

    stage.driver("alone", "alone-driver", "Running", "alone")
    stage.nats.stop()
    started = time.monotonic()
    assert find(PodstreamSparkKubernetesOperator, stage, "alone") == "alone-driver"
    # Bounded by its timeout, not the connect's retries.
    assert time.monotonic() - started < 10
