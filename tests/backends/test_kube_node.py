"""`hai serve` with the kubernetes backend on a real node: the kube-scheduler binds, the kubelet runs pods
on the private dockerd, logs come from the kubelet, preStop hooks and SIGTERM are the kubelet's own.

The node's GPUs are an extended resource patched into its status (no device plugin: no GPUs here) and its
pods use the host's network (see tests/support/kube_node.py for why).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.client import HaiClient
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, JobView, StandaloneJobSpec
from hai_airflow.training import EXIT_SAVED_ON_NOTICE
from tests.support.accounts import Account, made_account
from tests.support.docker_engine import REPO
from tests.support.kube_apiserver import SERVER_TOKEN, grant_server_rbac
from tests.support.kube_node import GPU_TYPE, Cluster, nas_claim
from tests.support.live_server import LiveServer
from tests.support.training_code import copy_training_code

pytestmark = [pytest.mark.kube, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

TIMEOUT = 180.0
STEPS = 60
EVERY = 10
TRAIN_ARGS = f"--steps {STEPS} --ckpt-every {EVERY}"
DETERMINISTIC = {"OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


def node_iface(address: str) -> str:
    """The interface holding `address` (gloo and NCCL bind to it on the host network)."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True)
    for line in shown.stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address:
            return fields[1]
    raise AssertionError(f"no interface holds {address}")


def server_config(cluster: Cluster, kubeconfig: Path, namespace: str, nas: Path, pin: str) -> str:
    return f"""
[server]
backend = "kubernetes"

[backend]
kubeconfig = "{kubeconfig}"
namespace = "{namespace}"
pin = "{pin}"
network = "host"
host_iface = "{node_iface(cluster.node_ip)}"
nas_pvc = "hai-nas"
nas_mount_path = "{nas}"
start_timeout_seconds = 40

[paths]
allowed = ["{nas}"]

[[resource_packages]]
id = 100
name = "CPU"
gpu_type = "CPU"
gpus = 0
cpus = 0.2
memory_gb = 0.25

[[resource_packages]]
id = 454
name = "1x{GPU_TYPE}"
gpu_type = "{GPU_TYPE}"
gpus = 1
cpus = 0.2
memory_gb = 2

[[resource_packages]]
id = 457
name = "8x{GPU_TYPE}"
gpu_type = "{GPU_TYPE}"
gpus = 8
cpus = 0.5
memory_gb = 2

[[groups]]
name = "research"
quota_gpus = 8

[[users]]
name = "admin"
group = "research"
role = "platform_admin"
token = "admin-token"

[[users]]
name = "lena"
group = "research"
token = "lena-token"

[[users]]
name = "hugo"
group = "research"
quota_gpus = 8
token = "hugo-token"
"""


@dataclass
class Site:
    """One `hai serve` on the node, in a namespace of its own, with a hostPath PersistentVolume for a NAS."""

    cluster: Cluster
    live: LiveServer
    namespace: str
    nas: Path

    @property
    def code(self) -> Path:
        return self.nas / "code"

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.cluster.admin())

    def pods(self) -> list[Any]:
        return list(self.core().list_namespaced_pod(self.namespace).items)


def open_site(cluster: Cluster, tmp: Path, pin: str = "affinity", extra: str = "") -> Site:
    """A site; `extra` is added to its config's [backend] section (options and, after them, tables)."""
    from kubernetes import client

    namespace = f"hai-e2e-{uuid.uuid4().hex[:6]}"
    admin = cluster.admin()
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": namespace}})
    grant_server_rbac(admin, namespace)
    # The NAS: a directory of this machine as a hostPath PersistentVolume, bound by the controller manager.
    nas = tmp / "nas"
    (nas / "code").mkdir(parents=True)
    nas_claim(core, namespace, nas)
    _wait(lambda: core.read_namespaced_persistent_volume_claim("hai-nas", namespace).status.phase == "Bound",
          "the NAS claim to be bound")  # fmt: skip
    # Pods are admitted once the service account controller made the namespace's default account.
    _wait(lambda: any(sa.metadata.name == "default"
                      for sa in core.list_namespaced_service_account(namespace).items),
          "the default service account")  # fmt: skip
    kubeconfig = cluster.api.kubeconfig(SERVER_TOKEN, tmp / "server.kubeconfig")
    config = server_config(cluster, kubeconfig, namespace, nas, pin)
    if extra:
        options, _, tables = extra.partition("\n[")
        config = config.replace("[backend]\n", f"[backend]\n{options}\n", 1)
        config += f"\n[{tables}" if tables else ""
    live = LiveServer(nas / "hai-home", config).start()
    return Site(cluster, live, namespace, nas)


def close_site(site: Site) -> None:
    from kubernetes import client

    site.live.close()
    core = site.core()
    for pod in site.pods():
        core.delete_namespaced_pod(pod.metadata.name, site.namespace, grace_period_seconds=0)
    # Deletes are not read back (a Status the typed client of some versions cannot read).
    _ = client.CoreV1Api(site.cluster.admin()).delete_namespace(site.namespace, _preload_content=False).data
    _ = core.delete_persistent_volume(f"{site.namespace}-nas", _preload_content=False).data


def _wait(predicate: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def site(kube_node: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    s = open_site(kube_node, tmp_path_factory.mktemp("kube-e2e"))
    copy_training_code(s.code)
    try:
        yield s
    finally:
        close_site(s)


@pytest.fixture
def node(site: Site) -> Iterator[Site]:
    yield site
    if not site.live.running():  # a test that killed it failed before starting it again
        site.live.start()
    site.live.cancel_all()


def wait_state(client: HaiClient, job_id: int, *states: str, timeout: float = TIMEOUT) -> JobView:
    deadline = time.monotonic() + timeout
    job: JobView = client.job(job_id)
    while job.state not in states:
        left = deadline - time.monotonic()
        assert left > 0, f"job {job_id} is {job.state} ({job.reason}), not {states}"
        job = client.wait(job_id, since_state=job.state, timeout=min(left, 10))
    return job


def busybox_job(site: Site, image: str, cmd: str, pkg: int = 454) -> StandaloneJobSpec:
    return StandaloneJobSpec(task_name="on the node", code_path=str(site.code), cmd=cmd, image=image,
                             resource_pkg=pkg)  # fmt: skip


def pod_of(site: Site, job_id: int) -> Any:
    (pod,) = [p for p in site.pods() if p.metadata.labels.get(m.LABEL_JOB) == str(job_id)]
    return pod


# ---- one pod ----------------------------------------------------------------------------------------


def test_a_job_runs_in_a_pod_the_scheduler_bound_and_its_log_streams_while_it_runs(
    node: Site, busybox_image: str
) -> None:
    cmd = 'echo "job $HAI_JOB_ID on GPUs $CUDA_VISIBLE_DEVICES"; sleep 4; echo done'
    with node.live.client("lena-token") as lena:
        job = lena.submit(busybox_job(node, busybox_image, cmd))
        wait_state(lena, job.id, "RUNNING")
        (instance,) = lena.instances(job.id)
        _wait(lambda: pod_of(node, job.id).status.phase == "Running", "the pod to run")
        # The first line arrives through the kubelet while the pod still runs.
        first = next(iter(lena.follow_log(instance.id)))
        assert first.startswith(f"job {job.id} on GPUs 0"), first
        assert lena.job(job.id).state == "RUNNING"
        pod = pod_of(node, job.id)
        done = wait_state(lena, job.id, "SUCCEEDED", "FAILED")
        assert done.state == "SUCCEEDED", done.reason
        assert lena.log(instance.id) == f"job {job.id} on GPUs 0\ndone\n"
    # The kube-scheduler bound it through the required affinity; it asked for one nvidia.com/gpu.
    assert pod.spec.node_name == node.cluster.node
    assert "affinity" in pod.spec.to_dict() and pod.spec.affinity.node_affinity is not None
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert pod.spec.host_network is True


def test_exec_runs_in_the_pod_through_the_api_server(node: Site, busybox_image: str) -> None:
    """`hai exec` is the pod's exec (its environment, through the API server and the kubelet), ended
    at its timeout by a second exec; someone else's exec is refused."""
    with node.live.client("lena-token") as lena:
        job = lena.submit(busybox_job(node, busybox_image, "sleep 600"))
        wait_state(lena, job.id, "RUNNING")
        _wait(lambda: pod_of(node, job.id).status.phase == "Running", "the pod to run")
        shows = 'echo "job $HAI_JOB_ID gpus $CUDA_VISIBLE_DEVICES"; exit 4'
        said = list(lena.exec(job.id, ["sh", "-c", shows]))
        assert "".join(s.get("output", "") for s in said) == f"job {job.id} gpus 0\n"
        assert said[-1] == {"exit_code": 4, "reason": None}
        started = time.monotonic()
        said = list(lena.exec(job.id, ["sleep", "60"], timeout=1))
        assert said[-1]["reason"] == "killed after its timeout of 1 s" and time.monotonic() - started < 15
        lena.cancel(job.id)


def test_a_cpu_job_runs_on_the_node(node: Site, busybox_image: str) -> None:
    spec = CpuJobSpec(task_name="prep", code_path=str(node.code), cmd="echo cpu job; sleep 2",
                      image=busybox_image, cpus=0.2, memory_gb=0.25)  # fmt: skip
    with node.live.client("lena-token") as lena:
        job = lena.submit(spec)
        wait_state(lena, job.id, "RUNNING")
        resources = pod_of(node, job.id).spec.containers[0].resources
        done = wait_state(lena, job.id, "SUCCEEDED", "FAILED")
        assert done.state == "SUCCEEDED", done.reason
        (instance,) = lena.instances(job.id)
        assert lena.log(instance.id) == "cpu job\n"
    assert resources.requests["cpu"] == "200m" and "nvidia.com/gpu" not in resources.requests


def test_a_pod_that_cannot_start_fails_the_job_with_the_reason(node: Site) -> None:
    with node.live.client("lena-token") as lena:
        job = lena.submit(busybox_job(node, "hai-ci/no-such-image:1", "true"))
        done = wait_state(lena, job.id, "FAILED", "SUCCEEDED", timeout=120)
    assert done.state == "FAILED"
    assert re.search(r"ErrImagePull|ImagePullBackOff", done.reason or ""), done.reason


def test_the_server_killed_with_9_adopts_its_running_pod_again(node: Site, busybox_image: str) -> None:
    with node.live.client("lena-token") as lena:
        job = lena.submit(busybox_job(node, busybox_image, "echo before; sleep 8; echo after"))
        wait_state(lena, job.id, "RUNNING")
    _wait(lambda: pod_of(node, job.id).status.phase == "Running", "the pod to run")
    node.live.kill9()
    assert pod_of(node, job.id).status.phase == "Running"  # the job did not die with the server
    node.live.start()
    with node.live.client("lena-token") as lena:
        done = wait_state(lena, job.id, "SUCCEEDED", "FAILED")
        assert done.state == "SUCCEEDED", done.reason
        (instance,) = lena.instances(job.id)
        assert lena.log(instance.id) == "before\nafter\n"


def test_pin_node_name_binds_without_the_scheduler(
    kube_node: Cluster, busybox_image: str, tmp_path: Path
) -> None:
    site = open_site(kube_node, tmp_path, pin="node_name")
    try:
        with site.live.client("lena-token") as lena:
            job = lena.submit(busybox_job(site, busybox_image, "echo pinned; sleep 2"))
            wait_state(lena, job.id, "RUNNING")
            pod = pod_of(site, job.id)
            done = wait_state(lena, job.id, "SUCCEEDED", "FAILED")
            assert done.state == "SUCCEEDED", done.reason
        assert pod.spec.node_name == kube_node.node and pod.spec.affinity is None
        # No scheduler decision: the pod never had a PodScheduled condition set by kube-scheduler.
        events = site.core().list_namespaced_event(site.namespace).items
        scheduled = [
            e for e in events if e.involved_object.name == pod.metadata.name and e.reason == "Scheduled"
        ]
        assert scheduled == []
    finally:
        close_site(site)


# ---- training on the node ---------------------------------------------------------------------------


def train_env(site: Site) -> dict[str, str]:
    return {"PYTHONPATH": str(site.code), **DETERMINISTIC}


def test_two_workers_talk_over_torch_distributed(node: Site, torch_image: str) -> None:
    model = node.nas / "models" / "dist"
    spec = DistributedJobSpec(
        task_name="two pods", code_path=str(node.code), image=torch_image, workers=2, worker_resource_pkg=454,
        cmd="python3 include/train_distributed.py --steps 20 --ckpt-every 10 --backend torch",
        env=train_env(node), model_dir=str(model),
    )  # fmt: skip
    with node.live.client("lena-token") as lena:
        job = lena.submit(spec)
        wait_state(lena, job.id, "RUNNING")
        pods = len([p for p in node.pods() if p.metadata.labels.get(m.LABEL_JOB) == str(job.id)])
        done = wait_state(lena, job.id, "SUCCEEDED", "FAILED")
        (instance,) = lena.instances(job.id)
        log = lena.log(instance.id)
    assert done.state == "SUCCEEDED", f"{done.reason}\n{log}"
    assert "on 2 processes" in log
    assert pods == 2
    result = json.loads((model / "metrics.json").read_text())
    assert (result["steps"], result["size"]) == (20, 2)
    assert (model / "final-rank1.json").exists()  # rank 1 trained too, in its own pod


def reference_weights(tmp: Path) -> str:
    """The same training as one plain process here, nobody stopping it (same torch as the image)."""
    model = tmp / "reference"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **DETERMINISTIC}
    done = subprocess.run(
        [sys.executable, str(REPO / "include" / "train.py"), *TRAIN_ARGS.split(), "--model-dir", str(model)],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return str(json.loads((model / "metrics.json").read_text())["weights_sha256"])


@pytest.mark.parametrize("elastic", [False, True], ids=["killed", "elastic"])
def test_a_low_job_suspended_for_a_high_one_resumes_to_the_uninterrupted_weights(
    node: Site, torch_image: str, busybox_image: str, tmp_path: Path, elastic: bool
) -> None:
    model = node.nas / "models" / f"low-{'elastic' if elastic else 'killed'}"
    low_spec = StandaloneJobSpec(
        task_name="low", code_path=str(node.code), image=torch_image, resource_pkg=457, model_dir=str(model),
        cmd=f"echo HAI_RESUME=$HAI_RESUME; exec python3 include/train.py {TRAIN_ARGS} --step-sleep 0.15 "
            "--log-every 1",
        env=train_env(node), elastic=elastic, grace_seconds=30 if elastic else None,
    )  # fmt: skip
    with node.live.client("lena-token") as lena, node.live.client("hugo-token") as hugo:
        low = lena.submit(low_spec)
        wait_state(lena, low.id, "RUNNING")
        _wait(lambda: (model / "checkpoint-00000010.pt").exists() or None, "the first checkpoint", 120)
        high = hugo.submit(
            StandaloneJobSpec(
                task_name="urgent",
                code_path=str(node.code),
                image=busybox_image,
                resource_pkg=457,
                max_schedule=4,
                cmd="echo urgent",
            )
        )
        done_high = wait_state(hugo, high.id, "SUCCEEDED", "FAILED")
        assert done_high.state == "SUCCEEDED", done_high.reason
        done = wait_state(lena, low.id, "SUCCEEDED", "FAILED")
        assert done.state == "SUCCEEDED", done.reason
        assert (done.instances, done.preemptions) == (2, 1)
        stopped, resumed = lena.instances(low.id)
        before, after = lena.log(stopped.id), lena.log(resumed.id)
    assert (stopped.end_reason, stopped.preempted_by) == ("preempted", high.id)
    assert before.startswith("HAI_RESUME=0\n") and after.startswith("HAI_RESUME=1\n")
    if elastic:
        # The kubelet ran the preStop hook (the notice), then SIGTERM: it saved and left by itself, and
        # resumes at the very step it saved. (Its exit code, 75, is seen only when the watch catches the
        # terminated pod before the kubelet removes it.)
        assert stopped.exit_code in (None, EXIT_SAVED_ON_NOTICE), before
        noticed = re.search(
            rf"preemption notice: step (\d+) saved; exiting with {EXIT_SAVED_ON_NOTICE}", before
        )
        assert noticed is not None, before
    else:
        # Deleted with no grace: the pod object is gone before the kubelet reports the container's exit.
        assert stopped.exit_code in (None, 137), before
        assert "preemption notice" not in before
    found = re.search(r"^resumed from step (\d+)", after, re.MULTILINE)
    assert found is not None and int(found[1]) >= EVERY, after
    if elastic:
        assert noticed is not None and int(found[1]) == int(noticed[1])
    result = json.loads((model / "metrics.json").read_text())
    assert result["resumed_from"] == int(found[1])
    assert result["weights_sha256"] == reference_weights(tmp_path)


# ---- each owner's account ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def owners() -> Iterator[tuple[Account, Account]]:
    with made_account("haika") as first, made_account("haikb") as second:
        yield first, second


@pytest.fixture(scope="module")
def owned(
    kube_node: Cluster, tmp_path_factory: pytest.TempPathFactory, owners: tuple[Account, Account]
) -> Iterator[Site]:
    """A site whose pods run as their owner's account (`run_as = "{user}"`), with a shared NAS dir."""
    users = "".join(
        f'[[users]]\nname = "{a.name}"\ngroup = "research"\ntoken = "{a.name}-token"\n\n' for a in owners
    )
    s = open_site(kube_node, tmp_path_factory.mktemp("kube-owned"), extra=f'run_as = "{{user}}"\n{users}')
    shared = s.nas / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)  # like /tmp: everyone writes, only a file's owner changes it
    try:
        yield s
    finally:
        close_site(s)


def _run_as(site: Site, account: Account, image: str, cmd: str) -> str:
    spec = CpuJobSpec(task_name="owned", code_path=str(site.code), cmd=cmd, image=image, cpus=0.2,
                      memory_gb=0.25, model_dir=str(site.nas / "shared"))  # fmt: skip
    with site.live.client(f"{account.name}-token") as client:
        done = wait_state(client, client.submit(spec).id, "SUCCEEDED", "FAILED")
        (instance,) = client.instances(done.id)
        log = client.log(instance.id)
    assert done.state == "SUCCEEDED", (done.reason, log)
    return log


def test_two_owners_pods_on_one_nas_claim_keep_to_their_own_files(
    owned: Site, owners: tuple[Account, Account], busybox_image: str
) -> None:
    """With run_as = "{user}" each job's pod runs as its owner's uid, gid and groups: what one owner's
    job writes on the shared claim the other's job can neither read (0600) nor overwrite."""
    first, second = owners
    write = 'id; cd "$HAI_MODEL_DIR"; (umask 077; echo secret > private); echo mine > public'
    wrote = _run_as(owned, first, busybox_image, write)
    assert f"uid={first.uid}" in wrote and f"gid={first.gid}" in wrote and str(first.extra_gid) in wrote
    shared = owned.nas / "shared"
    assert (shared / "private").stat().st_uid == first.uid
    trespass = 'cd "$HAI_MODEL_DIR"; cat private && echo READ; echo theirs > public && echo WROTE; true'
    tried = _run_as(owned, second, busybox_image, trespass)
    assert "READ" not in tried and "WROTE" not in tried and "secret" not in tried, tried
    assert (shared / "public").read_text() == "mine\n"
