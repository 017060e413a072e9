"""Resizing on the kubernetes backend: each instance of a resizable job is a gang of its own placement.

The manifests of a 4-worker job started at 2 and at 4 workers (pod network, headless Service, MPIJob),
and `hai serve` on the real node (tests/support/kube_node.py): a high job shrinks the job's 4 pods to 2,
whose workers see WORLD_SIZE=2, and it grows back to 4 pods when the high job ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tests.backends.test_kube_node as node_tier
from hai_airflow.backends.common.base import JobEnvironment, Launch
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.scheduling.model import WorkerPlacement
from hai_airflow.spec import DistributedJobSpec
from tests.backends.test_docker_resize import high_job, resizable_job, resize_scenario
from tests.support.kube_node import GPU_TYPE, Cluster

PACKAGES = "".join(
    f"""
[[resource_packages]]
id = {pkg}
name = "{gpus}x{GPU_TYPE}"
gpu_type = "{GPU_TYPE}"
gpus = {gpus}
cpus = 0.2
memory_gb = 1
"""
    for pkg, gpus in ((455, 2), (456, 4))
)
"""The packages of the resizable job's workers (4 of them fill the node's 8 GPUs) and of the high job
(the 4 GPUs a shrink to 2 workers frees)."""


def at_size(instance_id: int, workers: int, processes: str) -> Launch:
    """An instance of a 4-worker job resizable down to 2, started at `workers` workers of 2 GPUs."""
    spec = DistributedJobSpec(
        task_name="resizable", code_path="/nas/code", cmd="python3 train.py", workers=4,
        worker_resource_pkg=1, min_workers=2, processes=processes,
    )  # fmt: skip
    placement = tuple(WorkerPlacement(f"node-{i}", (0, 1)) for i in range(workers))
    return Launch(
        job_id=7, instance_id=instance_id, spec=spec, placement=placement,
        job=JobEnvironment(user="alice", group="vision", model_dir=Path("/nas/hai/jobs/7/model")),
        log_path=Path(f"/hai/{instance_id}/output.log"), work_dir=Path(f"/hai/{instance_id}"),
    )  # fmt: skip


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("workers", [2, 4])
def test_the_pods_of_an_instance_follow_its_placement_not_the_workers_asked(workers: int) -> None:
    opts = m.KubernetesOptions(network="pod")
    iid = 40 + workers
    service = m.gang_service(at_size(iid, workers, "per-worker"), opts)["metadata"]["name"]
    assert service == f"hai-{iid}"
    pods = m.worker_pods(at_size(iid, workers, "per-worker"), opts)
    assert [p["metadata"]["name"] for p in pods] == [f"hai-{iid}-w{r}" for r in range(workers)]
    for rank, pod in enumerate(pods):
        env = env_of(pod)
        assert (env["RANK"], env["WORLD_SIZE"], env["HAI_WORKERS"]) == (str(rank), str(workers), str(workers))
        assert env["MASTER_ADDR"] == f"hai-{iid}-w0.{service}" and pod["spec"]["subdomain"] == service
    per_gpu = [env_of(p) for p in m.worker_pods(at_size(iid, workers, "per-gpu"), opts)]
    assert {(e["WORLD_SIZE"], e["HOROVOD_CROSS_SIZE"]) for e in per_gpu} == {(str(2 * workers), str(workers))}


@pytest.mark.parametrize("workers", [2, 4])
def test_the_mpijob_of_an_instance_has_a_replica_per_placed_worker(workers: int) -> None:
    job = m.mpijob(at_size(50 + workers, workers, "per-gpu"), m.KubernetesOptions(network="pod"))
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == workers
    argv = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("-np") + 1] == str(2 * workers)


# ---- on the real node --------------------------------------------------------------------------------


@pytest.fixture
def site(kube_node: Cluster, tmp_path: Path) -> Iterator[node_tier.Site]:
    """A `hai serve` of the node tier with `PACKAGES` added to its config."""
    plain = node_tier.server_config
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_tier, "server_config", lambda *args: plain(*args) + PACKAGES)
        s = node_tier.open_site(kube_node, tmp_path)
    try:
        yield s
    finally:
        node_tier.close_site(s)


def pods_of(site: node_tier.Site) -> Callable[[int], int]:
    """How many pods of an instance (by its label) have run for 2 s at least, as the kubelet reports.

    The scenario waits for them before it resizes: a kubelet 1.20 whose own view still took a new pod's
    sandbox for dead when the pod's delete came (seen once in CI, within the second the pod started)
    killed nothing, and the pod ended only when its grace had run out. Its view is relisted every second.
    """

    def count(instance_id: int) -> int:
        selector = f"{m.LABEL_INSTANCE}={instance_id}"
        pods = site.core().list_namespaced_pod(site.namespace, label_selector=selector).items
        settled = datetime.now(UTC) - timedelta(seconds=2)
        return sum(1 for p in pods if (started := _running_since(p)) is not None and started <= settled)

    return count


def _running_since(pod: Any) -> datetime | None:
    statuses = pod.status.container_statuses or []
    running = statuses[0].state.running if statuses and statuses[0].state else None
    return running.started_at if running is not None else None


@pytest.mark.kube
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_high_job_shrinks_a_resizable_job_of_pods_which_grows_back(
    site: node_tier.Site, busybox_image: str
) -> None:
    model = site.nas / "models" / "resizable"
    model.mkdir(parents=True)
    low = resizable_job(site.code, model, busybox_image, pkg=455)
    high = high_job(site.code, busybox_image, pkg=456)
    # A pod's exit code is seen only when the watch catches it before the kubelet removes the pod
    # (test_kube_node.py): the end reason is what must be right.
    resize_scenario(site.live, low, high, model, ("lena-token", "hugo-token"), pods_of(site), (75, None))
