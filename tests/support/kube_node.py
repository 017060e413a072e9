"""A real one-node Kubernetes cluster for the tests, one per session: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and a kubelet whose built-in dockershim runs the pods on the Docker tier's private
dockerd. All four binaries come from Debian's kubernetes source package (.ci/kubernetes.sh). `second_node`
joins another kubelet, on a dockerd of its own, for the tests that need two nodes.

What stands in for a GPU cluster's parts, and why:
- GPUs: no device plugin runs (there are no GPUs); the node advertises `nvidia.com/gpu` as an extended
  resource by a patch of its status, Kubernetes' documented way, and carries the GPU-type label. The
  scheduler and the kubelet's admission count it like a device plugin's; no device is mounted.
- Network: the private dockerd runs without a bridge (it must not touch the host's network), so pods use the
  node's network (`hostNetwork`, the backend's `network = "host"`); there is no kube-proxy and no cluster DNS.
- The sandbox ("pause") image is built here from the source package's pause.c and imported, so nothing is
  pulled; so are the job images (busybox, python+torch).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import kube_apiserver as api
from tests.support.docker_engine import Engine

NODE = "hai-node-0"
GPU_TYPE = "V100"
GPUS = 8
PAUSE_IMAGE = "hai-ci/pause:3.4.1"
CNI_BIN = Path("/usr/lib/cni")
POD_BRIDGE = "hai-pods"
POD_SUBNET = "198.18.0.0/16"
"""Pod IPs: a benchmarking range (RFC 2544), inside the pods' own network namespaces."""
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet")


@dataclass(frozen=True)
class Cluster:
    api: api.ApiServer
    node: str
    node_ip: str
    dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, compare=False)
    """etcd, then the BINARIES in order: what the session stops at its end."""

    def admin(self) -> Any:
        return self.api.api_client(api.ADMIN_TOKEN)

    @contextmanager
    def apiserver_down(self) -> Iterator[None]:
        """kube-apiserver killed (-9) for the body, then started again on the same port and etcd; the
        body's end waits until it is ready."""
        api.crash(self.processes[1])
        try:
            yield
        finally:
            self.processes[1] = api.again(self.processes[1], self.dir / "kube-apiserver.log")
        api.wait_healthy(self.api, self.processes[1])

    @contextmanager
    def kubelet_down(self, timeout: float = 120) -> Iterator[None]:
        """The kubelet killed (-9) with its pods running for the body, then started again; the body's
        end waits until it has reported the node Ready again (and its GPUs are back)."""
        from kubernetes import client

        index = 1 + BINARIES.index("kubelet")
        api.crash(self.processes[index])
        try:
            yield
        finally:
            back_at = time.time()
            self.processes[index] = api.again(self.processes[index], self.dir / "kubelet.log")
        core = client.CoreV1Api(self.admin())
        deadline = time.monotonic() + timeout
        while not _heard_since(core.read_node(self.node), back_at):
            if self.processes[index].poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail("kubelet")
                raise RuntimeError(f"the restarted kubelet did not report the node Ready:\n{tail}")
            time.sleep(0.5)
        advertise_gpus(self)

    def log_tail(self, name: str, lines: int = 40) -> str:
        return tail(self.dir / f"{name}.log", lines)


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _heard_since(node: Any, since: float) -> bool:
    """Whether the node is Ready by a heartbeat later than `since` (a time.time())."""
    ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
    return bool(ready) and ready[0].status == "True" and ready[0].last_heartbeat_time.timestamp() > since


def node_ip() -> str:
    """This machine's address on its default route (the kubelet refuses a loopback node IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.254", 9))  # no packet is sent: connect only picks the route
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        raise RuntimeError("this machine has no address but loopback, which a kubelet cannot use")
    return address


def pause_image(engine: Engine, work: Path) -> str:
    """The pods' sandbox image: the source package's pause.c, linked statically, imported as an image."""
    if _has_image(engine, PAUSE_IMAGE):
        return PAUSE_IMAGE
    sources = sorted((api.CACHE / "kube" / "src").glob("kubernetes-*/build/pause/linux/pause.c"))
    if not sources:
        raise RuntimeError("no pause.c in the kubernetes source tree; run .ci/kubernetes.sh")
    binary = work / "pause"
    subprocess.run(
        ["gcc", "-Os", "-static", '-DVERSION="3.4.1"', "-o", str(binary), str(sources[0])],
        check=True,
        capture_output=True,
    )
    tar = work / "pause.tar"
    with tarfile.open(tar, "w") as t:
        t.add(str(binary), "pause")
    repo, _, tag = PAUSE_IMAGE.partition(":")
    engine.client.api.import_image_from_file(  # type: ignore[attr-defined]
        str(tar), repository=repo, tag=tag, changes=['ENTRYPOINT ["/pause"]']
    )
    return PAUSE_IMAGE


def _has_image(engine: Engine, tag: str) -> bool:
    import docker

    try:
        engine.client.images.get(tag)  # type: ignore[attr-defined]
        return True
    except docker.errors.ImageNotFound:
        return False


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdout=log.open("wb"),  # the child keeps the file
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C aimed at pytest must not hit the cluster first
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(exes: dict[str, Path], engine: Engine, work: Path) -> tuple[Cluster, list[subprocess.Popen[bytes]]]:
    ip = node_ip()
    pause = pause_image(engine, work)
    server, procs = api.start(exes["kube-apiserver"], work, controllers=True)
    try:
        kubeconfig = server.kubeconfig(api.ADMIN_TOKEN, work / "admin.kubeconfig")

        def control(name: str) -> list[str]:
            """A control-plane component talking to the API server as its admin, serving on loopback."""
            return [
                str(exes[name]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={_free_port()}",
                "--port=0",
                f"--cert-dir={work / name}-certs",
            ]

        procs.append(_spawn(control("kube-scheduler"), work / "kube-scheduler.log"))
        procs.append(
            _spawn(
                [
                    *control("kube-controller-manager"),
                    f"--service-account-private-key-file={work / 'sa.key'}",
                    f"--root-ca-file={server.ca_file}",
                    "--use-service-account-credentials=false",
                    # One node that never goes away: no eviction of its pods while the tests pause it.
                    "--pod-eviction-timeout=1h",
                ],
                work / "kube-controller-manager.log",
            )
        )
        kubelet = kubelet_argv(exes["kubelet"], kubeconfig, NODE, engine, pause, work)
        procs.append(_spawn(kubelet, work / "kubelet.log"))
        cluster = Cluster(server, NODE, ip, work, procs)
        _wait_ready(cluster, procs)
        advertise_gpus(cluster)
    except BaseException:
        api.stop(procs)
        raise
    return cluster, procs


def pod_network(work: Path, node: int) -> list[str]:
    """The kubelet flags giving pods off the host network an IP on `POD_BRIDGE` (CNI bridge, host-local
    addresses 198.18.<node>.2-254 of 198.18.0.0/16); none where Debian's CNI plugins are not installed.

    Every node's pods share the one bridge (this machine stands for the nodes' network, so no route is
    needed between them); the bridge has no address, so pods reach each other and nothing else."""
    if not (CNI_BIN / "bridge").exists():
        return []
    conf = work / "cni"
    conf.mkdir()
    addresses = {"subnet": POD_SUBNET, "rangeStart": f"198.18.{node}.2", "rangeEnd": f"198.18.{node}.254"}
    ipam = {"type": "host-local", "ranges": [[addresses]], "dataDir": str(work / "cni-ipam")}
    network = {"cniVersion": "0.4.0", "name": POD_BRIDGE, "type": "bridge", "bridge": POD_BRIDGE}
    (conf / "10-hai-pods.conf").write_text(json.dumps(network | {"ipam": ipam}))
    return ["--network-plugin=cni", f"--cni-bin-dir={CNI_BIN}", f"--cni-conf-dir={conf}"]


def kubelet_argv(
    exe: Path, kubeconfig: Path, name: str, engine: Engine, pause: str, work: Path, node: int = 0
) -> list[str]:
    """A kubelet registering node `name` (the `node`-th) at this machine's address, its pods on `engine`;
    its state (root, certificates, dockershim socket and checkpoints) under `work`, so that two of them can
    run here."""
    (work / "kubelet").mkdir()
    return [
        str(exe),
        *pod_network(work, node),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={name}",
        f"--node-ip={node_ip()}",
        f"--node-labels=hai.io/gpu-type={GPU_TYPE}",
        "--container-runtime=docker",
        f"--docker-endpoint={engine.url}",
        f"--container-runtime-endpoint=unix://{work / 'dockershim.sock'}",
        f"--experimental-dockershim-root-directory={work / 'dockershim'}",
        f"--pod-infra-container-image={pause}",
        f"--root-dir={work / 'kubelet'}",
        f"--cert-dir={work / 'kubelet-pki'}",
        f"--volume-plugin-dir={work / 'volume-plugins'}",
        f"--port={_free_port()}",
        "--read-only-port=0",
        "--healthz-port=0",
        # The API server fetches pod logs from here; only this machine can reach it.
        "--anonymous-auth=true",
        "--authorization-mode=AlwaysAllow",
        "--fail-swap-on=false",
        "--cgroup-driver=cgroupfs",
        "--cgroups-per-qos=false",
        "--enforce-node-allocatable=",
        "--make-iptables-util-chains=false",
        "--hairpin-mode=none",
        "--eviction-hard=memory.available<1Mi,nodefs.available<1%,imagefs.available<1%",
        "--image-gc-high-threshold=100",
        "--image-gc-low-threshold=99",
        "--serialize-image-pulls=false",
        "--node-status-update-frequency=2s",
        "--v=2",
    ]


def _wait_ready(cluster: Cluster, procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    from kubernetes import client

    core = client.CoreV1Api(cluster.admin())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc, name in zip(procs[2:], BINARIES[1:], strict=True):
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{cluster.log_tail(name)}")
        if _is_ready(core, cluster.node):
            return
        time.sleep(0.5)
    raise RuntimeError(f"node {cluster.node} not Ready after {timeout:.0f} s:\n{cluster.log_tail('kubelet')}")


def _is_ready(core: Any, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        node = core.read_node(name)
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
    return bool(ready) and ready[0].status == "True"


def nas_claim(core: Any, namespace: str, path: Path) -> None:
    """A hostPath PersistentVolume of `path`, bound to the claim `hai-nas` of `namespace`."""
    core.create_persistent_volume(
        {
            "metadata": {"name": f"{namespace}-nas"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": "hai-nas"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "hai-nas"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": f"{namespace}-nas",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )


def advertise_gpus(cluster: Cluster, gpus: int = GPUS, node: str | None = None) -> None:
    """What a device plugin would do: `nvidia.com/gpu` in the capacity of `node` (the cluster's first by
    default; the kubelet adds it to allocatable), done here by patching the node's status."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.admin())
    name = node or cluster.node
    core.patch_node_status(name, {"status": {"capacity": {"nvidia.com/gpu": str(gpus)}}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        allocatable = core.read_node(name).status.allocatable or {}
        if allocatable.get("nvidia.com/gpu") == str(gpus):
            return
        time.sleep(0.2)
    raise RuntimeError("the kubelet did not make the patched nvidia.com/gpu allocatable within 30 s")


@contextmanager
def second_node(cluster: Cluster, engine: Engine, work: Path, name: str = "hai-node-1") -> Iterator[str]:
    """Another kubelet joining `cluster` as node `name` for the body, its pods on `engine`, which must be a
    dockerd of its own: a kubelet kills every pod container of its engine that it does not know.

    It runs in a mount namespace of its own where /var/log/pods and /var/log/containers are directories
    of its own (a kubelet removes the log directories of pods it does not know: the first node's). Its
    root is a shared mount, so the volumes it mounts there reach its dockerd, which runs outside.
    At the end the kubelet stops, the node is deleted and its pod containers are removed.
    """
    from kubernetes import client

    exe = api.binary("kubelet")
    assert exe is not None, "no kubelet binary; build it with .ci/kubernetes.sh"
    core = client.CoreV1Api(cluster.admin())
    logs = work / "var-log"
    for sub in ("pods", "containers"):
        (logs / sub).mkdir(parents=True)
        Path("/var/log", sub).mkdir(parents=True, exist_ok=True)
    pause = pause_image(engine, work)
    argv = kubelet_argv(exe, cluster.dir / "admin.kubeconfig", name, engine, pause, work, node=1)
    root = work / "kubelet"
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "--make-shared", str(root)], check=True)
    private = " && ".join(f"mount --bind {logs / sub} /var/log/{sub}" for sub in ("pods", "containers"))
    unshared = ["unshare", "--mount", "--propagation=unchanged", "sh", "-c", f'{private} && exec "$@"', "sh"]
    kubelet = _spawn([*unshared, *argv], work / "kubelet.log")
    try:
        deadline = time.monotonic() + 120
        while not _is_ready(core, name):
            if kubelet.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {name} not Ready:\n{tail(work / 'kubelet.log')}")
            time.sleep(0.5)
        advertise_gpus(cluster, node=name)
        yield name
    finally:
        api.stop([kubelet])
        _ = core.delete_node(name, _preload_content=False).data
        remove_pod_containers(engine)
        unmount_below(work)


@pytest.fixture(scope="session")
def kube_node(docker_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The real one-node cluster; the tier is skipped, saying why, when it cannot run here."""
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
    exes = {name: api.binary(name) for name in BINARIES}
    missing = [name for name, exe in exes.items() if exe is None]
    if missing:
        reason = f"kube node tier skipped: no {', '.join(missing)}; build them with .ci/kubernetes.sh"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("kube-node")
    try:
        cluster, procs = start({k: v for k, v in exes.items() if v is not None}, docker_engine, work)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        reason = f"kube node tier skipped: the cluster did not start: {e}"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    try:
        yield cluster
    finally:
        api.stop(procs)
        # The kubelet is gone: remove what it left running on the engine.
        remove_pod_containers(docker_engine)
        unmount_below(work)
        subprocess.run(["ip", "link", "delete", POD_BRIDGE], check=False, capture_output=True)


def remove_pod_containers(engine: Engine) -> None:
    """Remove every container a kubelet made on `engine` (its pods' sandboxes and containers)."""
    for container in engine.client.containers.list(  # type: ignore[attr-defined]
        all=True, filters={"label": "io.kubernetes.docker.type"}
    ):
        container.remove(force=True)


def unmount_below(directory: Path) -> None:
    """Unmount what the kubelet mounted under its root (volumes, and the root itself), deepest first."""
    prefix = f"{directory.resolve()}/"
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
