"""Airflow's KubernetesExecutor runs a hai DAG's tasks as pods on the real test node.

The four Airflow services run on this machine (the KubernetesExecutor inside the scheduler, the
metadata database on PostgreSQL, which the executor requires); every task of `hai_submit_training`
runs in a pod made from deploy/airflow/pod_template.yaml. Its deferrable hai operator submits the job
in one pod, defers to the triggerer on this machine, and finishes in a second pod.

What differs from a production pod, and why:
- The image: the CI's Debian python3 base with this machine's Python runtime, virtual environment and
  checkout mounted read-only at their own paths (an Airflow image cannot be pulled here). So the pod
  runs as root, which can read them; the shipped template runs as the Airflow image's user.
- The claims: hostPath volumes of the same directories the services use (the DAGs, the log folder).
- The network: the node's (`hostNetwork`): the api-server and `hai serve` listen on this machine's
  loopback, which the pod network's bridge cannot reach.
The scheduler acts with the rights of deploy/airflow/rbac.yaml only.
"""

from __future__ import annotations

import configparser
import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.airflow.helpers import REPO, STANDALONE_FORM
from tests.airflow.services import AirflowServices, poll
from tests.support import postgres
from tests.support.docker_engine import Engine
from tests.support.kube_apiserver import AIRFLOW_TOKEN, AIRFLOW_USER
from tests.support.kube_node import Cluster
from tests.support.live_server import LiveServer
from tests.support.python_base_image import python_base_image

DAG_ID = "hai_submit_training"
TEMPLATE = REPO / "deploy" / "airflow" / "pod_template.yaml"
RBAC = REPO / "deploy" / "airflow" / "rbac.yaml"
WORKER_SETTINGS = (
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__LOGGING__BASE_LOG_FOLDER",
    "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE",  # read where the task's DAG is parsed: in the pod
)
"""What a task pod reads from the `airflow-config` ConfigMap: the same values as the services'."""


def documented_settings() -> dict[str, str]:
    """The scheduler's settings docs/airflow.md shows, as the AIRFLOW__SECTION__KEY variables."""
    text = (REPO / "docs" / "airflow.md").read_text()
    found = re.search(r"```ini\n(\[core\]\nexecutor = KubernetesExecutor\n.*?)```", text, re.S)
    assert found, "docs/airflow.md shows no [core] executor = KubernetesExecutor block"
    parser = configparser.ConfigParser()
    parser.read_string(found.group(1))
    return {f"AIRFLOW__{s}__{k}".upper(): v for s in parser.sections() for k, v in parser[s].items()}


def scheduler_settings(template: Path, namespace: str, kubeconfig: Path) -> dict[str, str]:
    """The documented settings, with this machine's values where it differs (outside the cluster)."""
    here = {
        "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE": str(template),
        "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE": namespace,
        "AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER": "False",
        "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": str(kubeconfig),
        "AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS": "False",  # to read them afterwards
    }
    return {**documented_settings(), **here}


def runtime_paths() -> list[Path]:
    """This machine's Python runtime, virtual environment and checkout, none inside another."""
    paths = sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), REPO.resolve()})
    return [p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)]


def task_pod_template(image: str, logs: Path) -> dict[str, Any]:
    """The shipped template with the test's image, volumes and network (see the module's docstring)."""
    pod: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text())
    spec = pod["spec"]
    (base,) = spec["containers"]
    assert base["name"] == "base" and base["envFrom"] == [{"configMapRef": {"name": "airflow-config"}}]
    mounts = {f"runtime-{i}": path for i, path in enumerate(runtime_paths())}
    spec["volumes"] = [{"name": "logs", "hostPath": {"path": str(logs), "type": "Directory"}}] + [
        {"name": name, "hostPath": {"path": str(path), "type": "Directory"}} for name, path in mounts.items()
    ]
    base["volumeMounts"] = [{"name": "logs", "mountPath": str(logs)}] + [
        {"name": name, "mountPath": str(path), "readOnly": True} for name, path in mounts.items()
    ]
    base["image"] = image
    base["env"] = [{"name": "PATH", "value": f"{Path(sys.executable).parent}:/usr/bin:/bin"}]
    spec["securityContext"] = {"runAsUser": 0}
    spec["hostNetwork"] = True
    return pod


def grant_the_shipped_rules(cluster: Cluster, namespace: str) -> None:
    """deploy/airflow/rbac.yaml in `namespace`, bound to the scheduler's user of the test API server
    (a token user here, the service account `airflow-scheduler` in a cluster): the executor gets
    nothing more."""
    from kubernetes import client

    role, binding = yaml.safe_load_all(RBAC.read_text())
    role["metadata"]["namespace"] = binding["metadata"]["namespace"] = namespace
    binding["subjects"] = [{"kind": "User", "name": AIRFLOW_USER, "apiGroup": "rbac.authorization.k8s.io"}]
    rbac = client.RbacAuthorizationV1Api(cluster.admin())
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(namespace, binding)
    scheduler = client.CoreV1Api(cluster.api.api_client(AIRFLOW_TOKEN))
    with pytest.raises(client.ApiException) as refused:  # nothing outside the namespace
        scheduler.list_namespaced_pod("default")
    assert refused.value.status == 403


@pytest.fixture
def airflow_on_kubernetes(
    hai_server: LiveServer, kube_node: Cluster, docker_engine: Engine, tmp_path: Path
) -> Iterator[tuple[AirflowServices, str]]:
    """Airflow with the KubernetesExecutor in a fresh namespace; yields the services and the namespace."""
    from kubernetes import client

    reason = postgres.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the KubernetesExecutor needs PostgreSQL: {reason}")
    core = client.CoreV1Api(kube_node.admin())
    namespace = f"airflow-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    services = AirflowServices(tmp_path / "airflow", hai_server)
    logs = services.home / "logs"
    logs.mkdir(parents=True)
    template = services.home / "pod_template.yaml"
    grant_the_shipped_rules(kube_node, namespace)
    kubeconfig = kube_node.api.kubeconfig(AIRFLOW_TOKEN, tmp_path / "airflow.kubeconfig")
    template.write_text(yaml.safe_dump(task_pod_template(python_base_image(docker_engine.client), logs)))
    with postgres.temporary_database("airflow_ke") as database:
        services.env.update(
            {
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database,
                # psycopg 3 serves the async engine too (its default driver, asyncpg, is not installed)
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": database,
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(logs),
                **scheduler_settings(template, namespace, kubeconfig),
            }
        )
        settings = {name: services.env[name] for name in WORKER_SETTINGS}
        core.create_namespaced_config_map(
            namespace,
            {
                "metadata": {"name": "airflow-config"},
                "data": {"AIRFLOW_HOME": str(services.home), **settings},
            },
        )
        try:
            services.start()
            yield services, namespace
        finally:
            services.stop()
            for pod in core.list_namespaced_pod(namespace).items:
                core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
            _ = core.delete_namespace(namespace, _preload_content=False).data


@pytest.mark.kube
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_task_runs_in_a_pod_and_the_hai_task_defers_between_two(
    airflow_on_kubernetes: tuple[AirflowServices, str], hai_server: LiveServer, kube_node: Cluster
) -> None:
    from kubernetes import client

    services, namespace = airflow_on_kubernetes
    api = services.api("alice")
    poll(lambda: api.get(f"/dags/{DAG_ID}").status_code == 200, 240, "the DAG", services.logs)
    # Long enough (about 14 s) for the task to be seen deferred while its job trains.
    train = "python3 train.py --steps 20 --ckpt-every 10 --step-sleep 0.7"
    conf = {**STANDALONE_FORM, "task_name": "in a pod", "max_schedule": 0, "cmd": train}
    created = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
    assert created.status_code == 200, created.text
    run = f"/dags/{DAG_ID}/dagRuns/{created.json()['dag_run_id']}"
    seen: set[str] = set()

    def ended() -> str | None:
        state = str(api.get(f"{run}/taskInstances/submit_standalone").json().get("state"))
        seen.add(state)
        return state if state in ("success", "failed", "upstream_failed") else None

    started = time.monotonic()
    assert poll(ended, 600, "the hai task to end", services.logs) == "success", services.logs()
    assert "deferred" in seen, seen
    states = {t["task_id"]: t["state"] for t in api.get(f"{run}/taskInstances").json()["task_instances"]}
    assert states == {"check_form": "success", "submit_standalone": "success", "submit_cpu": "skipped",
                      "submit_distributed": "skipped"}, states  # fmt: skip

    core = client.CoreV1Api(kube_node.admin())

    def pods_ended() -> list[Any] | None:  # a task's state is set a moment before its pod exits
        pods = core.list_namespaced_pod(namespace).items
        return pods if all(p.status.phase in ("Succeeded", "Failed") for p in pods) else None

    pods = poll(pods_ended, 120, "the task pods to end", services.logs)
    by_task: dict[str, list[Any]] = {}
    for pod in pods:
        by_task.setdefault(pod.metadata.labels["task_id"], []).append(pod)
    assert {task: len(p) for task, p in by_task.items()} == {"check_form": 1, "submit_standalone": 2}
    for pod in pods:
        (base,) = pod.spec.containers
        assert (pod.spec.node_name, pod.status.phase) == (kube_node.node, "Succeeded"), pod.status
        assert base.args[:3] == ["python", "-m", "airflow.sdk.execution_time.execute_workload"]
        assert base.resources.requests == {"cpu": "250m", "memory": "512Mi"}  # the shipped template's
    first, second = sorted(by_task["submit_standalone"], key=lambda p: p.metadata.creation_timestamp)
    assert first.metadata.labels["try_number"] == second.metadata.labels["try_number"] == "1"
    ended_first = first.status.container_statuses[0].state.terminated.finished_at
    assert ended_first <= second.metadata.creation_timestamp  # it ended when the task deferred

    with hai_server.client("alice-token") as alice:
        (job,) = [j for j in alice.jobs() if j.task_name == "in a pod"]
    assert (job.user, job.state) == ("alice", "SUCCEEDED")
    log = api.get(f"{run}/taskInstances/submit_standalone/logs/1").text
    assert f"hai job {job.id}: RUNNING -> SUCCEEDED" in log, log[-3000:]
    print(f"\nFIGURE kubernetes executor: DAG run to success in {time.monotonic() - started:.0f} s")


def test_the_shipped_template_is_one_pod_whose_base_container_reads_airflow_config() -> None:
    pod = yaml.safe_load(TEMPLATE.read_text())
    assert pod["kind"] == "Pod" and pod["spec"]["restartPolicy"] == "Never"
    (base,) = pod["spec"]["containers"]
    assert base["name"] == "base"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert "SQL_ALCHEMY_CONN" not in json.dumps(pod)  # a task pod needs no database URL


def test_the_documented_scheduler_settings_are_the_ones_the_test_runs_with(tmp_path: Path) -> None:
    documented = documented_settings()
    assert documented["AIRFLOW__CORE__EXECUTOR"] == "KubernetesExecutor"
    settings = scheduler_settings(tmp_path / "t.yaml", "ns", tmp_path / "kubeconfig")
    # every setting the test gives a value of its own is one the docs name, but the kubeconfig's
    assert set(settings) - set(documented) == {"AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE"}
