"""A Kubernetes pod step makes the data set on the NAS; a hai GPU job trains on it; a task reports.

The pod step (`KubernetesPodOperator`) is CPU work that has no place in the GPU queue: it runs as a plain
pod in the namespace of the ``kubernetes_default`` connection, with the NAS claim mounted. The training
goes through hai, which is how GPU work enters the cluster (quota, priority, preemption).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG, Param, task
from kubernetes.client import models as k8s

from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator

INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
RUN_DIR = "{{ params.runs_dir }}/{{ run_id | replace(':', '') | replace('+', '') }}"
"""The run's directory, relative to the NAS root: the pod mounts it as a sub-path of the NAS claim."""
WORKDIR = "{{ params.nas_path }}/" + RUN_DIR
"""The same directory as hai jobs see it, under the NAS's mount path."""
HOST_NETWORK = os.environ.get("HAI_POD_STEPS_HOST_NETWORK", "").lower() in {"1", "true", "yes"}
"""Run the pod on its node's network (``HAI_POD_STEPS_HOST_NETWORK=1`` where the DAG is parsed), for
clusters without a pod network, like hai's kubernetes backend with ``network = "host"``."""
MAKE_CSV = """
set -eu
awk -v n="$SAMPLES" -v seed="$SEED" 'BEGIN {
  srand(seed)
  for (i = 0; i < n; i++) {
    a = 2 * rand() - 1; b = 2 * rand() - 1; c = 2 * rand() - 1; d = 2 * rand() - 1
    printf "%.5f,%.5f,%.5f,%.5f,%d\\n", a, b, c, d, (a + b > 0) + 2 * (c - d > 0)
  }
}' > /data/.raw.csv.tmp
mv /data/.raw.csv.tmp /data/raw.csv
echo "wrote $(wc -l < /data/raw.csv) rows to raw.csv on node $NODE_NAME"
"""
"""Four features and a class from 0 to 3 by a fixed rule, written whole or not at all; a real pipeline
would fetch and unpack its data here instead (wget, tar, an object store's CLI)."""

NODE_NAME_FIELD = k8s.V1ObjectFieldSelector(field_path="spec.nodeName")

with DAG(
    dag_id="kubernetes_pod_steps",
    description="Make a data set in a Kubernetes pod, train on it as a hai GPU job",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "kubernetes", "example"],
    params={
        "image": Param("busybox:1.36", type="string", description="Image of the pod step (sh and awk)."),
        "nas_claim": Param("hai-nas", type="string", description="PersistentVolumeClaim of the NAS."),
        "nas_path": Param("/nas", type="string", description="Where hai jobs see the NAS."),
        "runs_dir": Param(
            "groups/default/kubernetes_pod_steps",
            type="string",
            description="Directory of the runs, relative to the NAS root; hai must allow it.",
        ),
        "samples": Param(1024, type="integer", minimum=16, description="Rows the pod step makes."),
        "seed": Param(0, type="integer", description="Seed of the rows."),
        "steps": Param(100, type="integer", minimum=1, description="Training steps."),
        "max_schedule": Param(
            0, type="integer", enum=[0, 4, 6, 8, 24, 48], description="0 = low priority, more = high."
        ),
    },
) as dag:
    make_data = KubernetesPodOperator(
        task_id="make_data",
        name="make-data",
        image="{{ params.image }}",
        cmds=["sh", "-c", MAKE_CSV],
        env_vars=[
            k8s.V1EnvVar(name="SAMPLES", value="{{ params.samples }}"),
            k8s.V1EnvVar(name="SEED", value="{{ params.seed }}"),
            k8s.V1EnvVar(name="NODE_NAME", value_from=k8s.V1EnvVarSource(field_ref=NODE_NAME_FIELD)),
        ],
        volumes=[
            k8s.V1Volume(
                name="nas",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                    claim_name="{{ params.nas_claim }}"
                ),
            )
        ],
        volume_mounts=[k8s.V1VolumeMount(name="nas", mount_path="/data", sub_path=RUN_DIR)],
        container_resources=k8s.V1ResourceRequirements(
            requests={"cpu": "100m", "memory": "64Mi"}, limits={"memory": "256Mi"}
        ),
        hostnetwork=HOST_NETWORK,
        on_finish_action="delete_succeeded_pod",  # a failed pod stays, to be looked at
        startup_timeout_seconds=300,
    )

    train = HaiStandaloneTrainingOperator(
        task_id="train",
        task_name="{{ dag.dag_id }}.train",
        code_path=INCLUDE,
        cmd=(
            f"python3 preprocess.py '{WORKDIR}/data.npz' --input '{WORKDIR}/raw.csv' && "
            f"python3 train.py --data '{WORKDIR}/data.npz' --steps {{{{ params.steps }}}} "
            f"--metrics '{WORKDIR}/metrics.json'"
        ),
        gpus=1,
        max_schedule="{{ params.max_schedule }}",
        model_dir=f"{WORKDIR}/model",
        metrics_path=f"{WORKDIR}/metrics.json",
    )

    @task
    def report(result: dict[str, Any]) -> dict[str, Any]:
        """The training job's metrics and how many rows of the pod's data set it trained on."""
        metrics_path = Path(result["metrics_path"])
        metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        rows = len((metrics_path.parent / "raw.csv").read_text(encoding="utf-8").splitlines())
        print(f"hai job {result['job_id']}: loss {metrics['loss']:.4f} on {rows} rows")
        return {**metrics, "job_id": result["job_id"], "rows": rows}

    make_data >> train
    report(train.output)  # type: ignore[arg-type]  # an XCom at parse time
