"""The cncf.kubernetes provider's own SparkKubernetesOperator.find_spark_job (or, with a third
argument ``podstream``, podstream-airflow's PodstreamSparkKubernetesOperator, which asks
podstream at ``AIRFLOW__PODSTREAM__URL``), asked for each case's task instance against a
cluster (the simulator): reads a JSON list of cases ({"dag_id", "task_id", "run_id",
"try_number"}) on stdin, prints a JSON line per case with the driver pod it reattaches to
(null for none)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from airflow.providers.cncf.kubernetes.operators.spark_kubernetes import SparkKubernetesOperator


def main(kubeconfig: str, namespace: str, which: str = "stock") -> None:
    operator_class = SparkKubernetesOperator
    if which == "podstream":
        from podstream_airflow import PodstreamSparkKubernetesOperator

        operator_class = PodstreamSparkKubernetesOperator
    for case in json.load(sys.stdin):
        operator = operator_class(
            task_id=case["task_id"],
            namespace=namespace,
            config_file=kubeconfig,
            # Never submitted: only find_spark_job runs.
            template_spec={"spark": {}, "kubernetes": {}},
        )
        ti = SimpleNamespace(
            dag_id=case["dag_id"],
            task_id=case["task_id"],
            map_index=-1,
            try_number=case["try_number"],
        )
        dag = SimpleNamespace(dag_id=case["dag_id"], parent_dag=None)
        context = {"dag": dag, "ti": ti, "task_instance": ti, "run_id": case["run_id"]}
        pod = operator.find_spark_job(context)
        chosen = pod.metadata.name if pod is not None else None
        print(json.dumps({"task_id": case["task_id"], "chosen": chosen}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
