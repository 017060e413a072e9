"""A distributed job across two real nodes: the kube-scheduler binds its workers' pods to two kubelets, each
with a dockerd of its own (tests/support/kube_node.py `second_node`); its ranks, started by the platform's
launcher, train over torch.distributed or Horovod; suspended for a high job and resumed, it ends with the
weights of the same training run uninterrupted outside any cluster.

For this module each node advertises one GPU, so a job of two 1-GPU workers fills both nodes. Both nodes
are this machine, on the host network: the ranks meet at the node address, as they would at two
machines' addresses.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.backends.test_kube_node as node_tier
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.client import HaiClient
from hai_airflow.spec import DistributedJobSpec, StandaloneJobSpec
from tests.support.docker_engine import (
    Engine,
    OwnEngine,
    import_busybox,
    import_torch,
)
from tests.support.kube_node import (
    CNI_BIN,
    GPUS,
    NODE,
    POD_SUBNET,
    Cluster,
    advertise_gpus,
    second_node,
)
from tests.support.training_code import copy_training_code
from tests.training.gang import Instance

pytestmark = [pytest.mark.kube, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

TRAIN = "python3 include/train_distributed.py --steps 60 --ckpt-every 10"


@pytest.fixture(scope="module")
def two_nodes(
    kube_node: Cluster, torch_image: str, busybox_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, str]]:
    """The session's cluster with a second node for this module, on a dockerd holding the same images;
    each node advertises one GPU meanwhile."""
    pytest.importorskip("docker", reason="the docker SDK is not installed (pip install '.[docker]')")
    if os.geteuid() != 0:
        pytest.skip("two-node tier skipped: the second kubelet's mount namespace needs root")
    work = tmp_path_factory.mktemp("node-1")
    own = OwnEngine(work / "dockerd", live_restore=False)
    try:
        engine: Engine = own.start()
        assert import_torch(engine) == torch_image and import_busybox(engine, work) == busybox_image
        with second_node(kube_node, engine, work / "node") as name:
            advertise_gpus(kube_node, 1)
            advertise_gpus(kube_node, 1, node=name)
            yield kube_node, name
    finally:
        advertise_gpus(kube_node, GPUS)
        own.close()


def serving(cluster: Cluster, tmp: Path, edit: Callable[[str], str] = str) -> Iterator[node_tier.Site]:
    """A `hai serve` of the node tier, its config passed through `edit`, with the training code."""
    plain = node_tier.server_config
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_tier, "server_config", lambda *args: edit(plain(*args)))
        s = node_tier.open_site(cluster, tmp)
    copy_training_code(s.code)
    try:
        yield s
    finally:
        node_tier.close_site(s)


@pytest.fixture
def site(two_nodes: tuple[Cluster, str], tmp_path: Path) -> Iterator[node_tier.Site]:
    yield from serving(two_nodes[0], tmp_path)


def nodes_of(site: node_tier.Site, client: HaiClient, job_id: int, instance: int) -> list[str] | None:
    """The nodes of the pods of the job's `instance`-th instance (0: its first), once both are bound."""
    instances = client.instances(job_id)
    if len(instances) <= instance:
        return None
    selector = f"{m.LABEL_INSTANCE}={instances[instance].id}"
    pods = site.core().list_namespaced_pod(site.namespace, label_selector=selector).items
    nodes = sorted(p.spec.node_name or "" for p in pods)
    return nodes if len(nodes) == 2 and all(nodes) else None


def reference_weights(site: node_tier.Site, tmp: Path, train: str) -> str:
    """The same two ranks through the platform's launcher as plain processes here, nobody stopping them."""
    model = tmp / "reference"
    env = {**node_tier.train_env(site), "HAI_MODEL_DIR": str(model)}
    run = Instance(train, workers=2, gpus=1, cwd=site.code, log=tmp / "reference.log", env=env)
    assert run.wait(timeout=300) == [0, 0], run.text()
    return str(json.loads((model / "metrics.json").read_text())["weights_sha256"])


@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_a_gang_across_two_nodes_is_suspended_resumed_and_ends_as_if_uninterrupted(
    site: node_tier.Site,
    two_nodes: tuple[Cluster, str],
    torch_image: str,
    busybox_image: str,
    tmp_path: Path,
    backend: str,
) -> None:
    model = site.nas / "models" / "across"
    train = f"{TRAIN} --backend {backend}"
    spec = DistributedJobSpec(
        task_name="across", code_path=str(site.code), image=torch_image, workers=2, worker_resource_pkg=454,
        cmd=f"{train} --step-sleep 0.15", env=node_tier.train_env(site), model_dir=str(model),
    )  # fmt: skip
    with site.live.client("lena-token") as lena, site.live.client("hugo-token") as hugo:
        low = lena.submit(spec)
        node_tier.wait_state(lena, low.id, "RUNNING")
        first = node_tier._wait(lambda: nodes_of(site, lena, low.id, 0), "the pods")
        saved = model / "checkpoint-00000010.pt"
        node_tier._wait(lambda: saved.exists() or None, "the first checkpoint", 120)
        urgent = StandaloneJobSpec(
            task_name="urgent", code_path=str(site.code), image=busybox_image, resource_pkg=454,
            max_schedule=4, cmd="echo urgent",
        )  # fmt: skip
        high = hugo.submit(urgent)
        assert node_tier.wait_state(hugo, high.id, "SUCCEEDED", "FAILED").state == "SUCCEEDED"
        second = node_tier._wait(lambda: nodes_of(site, lena, low.id, 1), "the resumed pods", 120)
        done = node_tier.wait_state(lena, low.id, "SUCCEEDED", "FAILED")
        stopped, last = lena.instances(low.id)
        logs = lena.log(stopped.id) + lena.log(last.id)
    assert done.state == "SUCCEEDED", f"{done.reason}\n{logs}"
    assert first == second == sorted([NODE, two_nodes[1]]), (first, second)
    assert (done.instances, done.preemptions, stopped.preempted_by) == (2, 1, high.id)
    result = json.loads((model / "metrics.json").read_text())
    assert (result["steps"], result["size"]) == (60, 2)
    assert result["weights_sha256"] == reference_weights(site, tmp_path, train), logs


# ---- on the pod network ------------------------------------------------------------------------------


@pytest.fixture
def pod_site(two_nodes: tuple[Cluster, str], tmp_path: Path) -> Iterator[node_tier.Site]:
    """A `hai serve` whose pods have their own IPs (the nodes' CNI bridge); gangs meet at worker 0's IP."""
    if not (CNI_BIN / "bridge").exists():
        pytest.skip("pod network tier skipped: no CNI plugins; apt-get install containernetworking-plugins")
    host, pod = 'network = "host"', 'network = "pod"\ngang_address = "pod_ip"'
    yield from serving(two_nodes[0], tmp_path, lambda config: config.replace(host, pod))


def with_ips(site: node_tier.Site) -> dict[str, Any] | None:
    """The site's pods by name, once there are two and both have an IP."""
    pods = site.pods()
    ready = len(pods) == 2 and all(p.status.pod_ip for p in pods)
    return {p.metadata.name: p for p in pods} if ready else None


def test_a_gang_across_two_nodes_meets_over_pod_ips(
    pod_site: node_tier.Site, two_nodes: tuple[Cluster, str], torch_image: str
) -> None:
    site, model = pod_site, pod_site.nas / "models" / "pod-network"
    spec = DistributedJobSpec(
        task_name="pod network", code_path=str(site.code), image=torch_image, workers=2,
        worker_resource_pkg=454, cmd=f"{TRAIN} --backend torch --step-sleep 0.1",
        env=node_tier.train_env(site), model_dir=str(model),
    )  # fmt: skip
    with site.live.client("lena-token") as lena:
        job = lena.submit(spec)
        node_tier._wait(lambda: nodes_of(site, lena, job.id, 0), "the pods")
        pods = node_tier._wait(lambda: with_ips(site), "both pods' IPs")
        done = node_tier.wait_state(lena, job.id, "SUCCEEDED", "FAILED")
        (instance,) = lena.instances(job.id)
        log = lena.log(instance.id)
    assert done.state == "SUCCEEDED", f"{done.reason}\n{log}"
    first, second = (pods[f"hai-{instance.id}-w{rank}"] for rank in (0, 1))
    assert sorted([first.spec.node_name, second.spec.node_name]) == sorted([NODE, two_nodes[1]])
    subnet = ipaddress.ip_network(POD_SUBNET)
    ips = [ipaddress.ip_address(p.status.pod_ip) for p in (first, second)]
    assert all(ip in subnet for ip in ips) and ips[0] != ips[1], ips
    assert not (first.spec.host_network or second.spec.host_network)

    def env(pod: object) -> dict[str, str]:
        return {e.name: e.value for e in pod.spec.containers[0].env}  # type: ignore[attr-defined]

    # Worker 0 meets at its own IP (the downward API's); worker 1, made once it had one, at that IP.
    assert env(first)["MASTER_ADDR"] == "$(HAI_POD_IP)"
    assert env(second)["MASTER_ADDR"] == env(second)["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == str(ips[0])
    result = json.loads((model / "metrics.json").read_text())
    assert (result["steps"], result["size"]) == (60, 2)
