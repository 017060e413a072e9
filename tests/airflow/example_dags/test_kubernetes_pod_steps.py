"""kubernetes_pod_steps end to end: its KubernetesPodOperator step runs a pod on the real test node
(tests/support/kube_node.py), writing the data set onto a NAS claim; the hai GPU job trains on it.

The NAS is a directory of this machine, a hostPath PersistentVolume to the node and an allowed path to
the hai server (the local backend: the pod step is what runs on the node here). The pod runs on the
node's pod network (its CNI bridge); where the CNI plugins are missing, on the node's network
(HAI_POD_STEPS_HOST_NETWORK=1).
"""

from __future__ import annotations

import ipaddress
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.helpers import REPO, load_dag, task_states, xcom
from tests.support.kube_apiserver import ADMIN_TOKEN
from tests.support.kube_node import CNI_BIN, POD_SUBNET, Cluster, nas_claim
from tests.support.live_server import LiveServer

DAG_ID = "kubernetes_pod_steps"
RUNS_DIR = "groups/default/kubernetes_pod_steps"


@dataclass(frozen=True)
class Nas:
    """A namespace whose claim `hai-nas` is the directory `path` of this machine."""

    namespace: str
    path: Path


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


@pytest.fixture
def nas(kube_node: Cluster, tmp_path: Path) -> Iterator[Nas]:
    from kubernetes import client

    core = client.CoreV1Api(kube_node.admin())
    namespace = f"pod-steps-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    path = tmp_path / "nas"
    path.mkdir()
    nas_claim(core, namespace, path)
    try:
        _wait(lambda: core.read_namespaced_persistent_volume_claim("hai-nas", namespace).status.phase
              == "Bound", "the NAS claim to be bound")  # fmt: skip
        # Pods are admitted once the service account controller has made the namespace's default account.
        _wait(lambda: any(sa.metadata.name == "default"
                          for sa in core.list_namespaced_service_account(namespace).items),
              "the default service account")  # fmt: skip
        yield Nas(namespace, path)
    finally:
        for pod in core.list_namespaced_pod(namespace).items:
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        _ = core.delete_namespace(namespace, _preload_content=False).data
        _ = core.delete_persistent_volume(f"{namespace}-nas", _preload_content=False).data


@pytest.fixture
def kubernetes_default(kube_node: Cluster, nas: Nas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `kubernetes_default` connection: a kubeconfig file of the test API server, the NAS's namespace."""
    kubeconfig = kube_node.api.kubeconfig(ADMIN_TOKEN, tmp_path / "airflow.kubeconfig")
    extra = {"kube_config_path": str(kubeconfig), "namespace": nas.namespace}
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": extra})
    )


def test_the_dag_loads_with_the_provider_beside_the_hai_operators() -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    bag = DagBag(dag_folder=str(REPO / "dags" / f"{DAG_ID}.py"))
    assert bag.import_errors == {}
    dag = bag.dags[DAG_ID]
    assert isinstance(dag.task_dict["make_data"], KubernetesPodOperator)
    assert dag.task_dict["make_data"].hostnetwork is False  # unless HAI_POD_STEPS_HOST_NETWORK says so
    assert dag.task_dict["train"].upstream_task_ids == {"make_data"}


@pytest.mark.kube
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferred"])
def test_a_pod_on_the_node_makes_the_data_the_hai_gpu_job_trains_on(
    hai_conn: Callable[..., LiveServer],
    kubernetes_default: None,
    kube_node: Cluster,
    nas: Nas,
    busybox_image: str,
    monkeypatch: pytest.MonkeyPatch,
    deferrable: bool,
) -> None:
    from airflow.providers.cncf.kubernetes.utils.pod_manager import OnFinishAction
    from kubernetes import client

    server = hai_conn()
    pod_network = (CNI_BIN / "bridge").exists()
    if not pod_network:
        monkeypatch.setenv("HAI_POD_STEPS_HOST_NETWORK", "1")
    dag = load_dag(DAG_ID)
    dag.task_dict["make_data"].on_finish_action = OnFinishAction.KEEP_POD  # to read it afterwards
    # What `[operators] default_deferrable = True` gives both operators where the DAG is parsed.
    dag.task_dict["make_data"].deferrable = dag.task_dict["train"].deferrable = deferrable
    conf = {"image": busybox_image, "nas_path": str(nas.path), "runs_dir": RUNS_DIR, "samples": 256}
    run = dag.test(run_conf={**conf, "steps": 30})

    assert task_states(run) == {"make_data": "success", "train": "success", "report": "success"}
    (pod,) = client.CoreV1Api(kube_node.admin()).list_namespaced_pod(nas.namespace).items
    assert pod.metadata.name == xcom(run, "make_data", "pod_name")
    assert (pod.spec.node_name, pod.status.phase) == (kube_node.node, "Succeeded")
    assert bool(pod.spec.host_network) is not pod_network
    if pod_network:
        assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(POD_SUBNET)
    assert pod.spec.containers[0].image == busybox_image
    (run_dir,) = (nas.path / RUNS_DIR).iterdir()
    rows = (run_dir / "raw.csv").read_text().splitlines()
    assert len(rows) == 256 and {row.rsplit(",", 1)[1] for row in rows} == {"0", "1", "2", "3"}

    result = xcom(run, "train")
    assert result["state"] == "SUCCEEDED" and Path(result["metrics_path"]).parent == run_dir
    with server.client() as hai:
        job = hai.job(result["job_id"])
        (instance,) = hai.instances(job.id)
        log = hai.log(instance.id)
    assert (job.mode, job.gpus, job.state) == ("standalone", 1, "SUCCEEDED")
    assert f"wrote 256 samples with 4 features and 4 classes to {run_dir}/data.npz" in log, log
    report = xcom(run, "report")
    assert report["rows"] == 256 and report["steps"] == 30 and report["job_id"] == job.id
