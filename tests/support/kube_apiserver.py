"""A real kube-apiserver (built by .ci/kubernetes.sh) with etcd on loopback, one per test session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HAI_CI_CACHE", "/var/cache/hai-ci"))
ADMIN_TOKEN = "hai-test-admin-token"
SERVER_TOKEN = "hai-test-server-token"
SERVER_USER = "hai-server"
"""The user the backend tests act as: it holds only the RBAC rules the README documents."""
AIRFLOW_TOKEN = "hai-test-airflow-token"
AIRFLOW_USER = "airflow-scheduler"
"""The user Airflow's KubernetesExecutor acts as: it holds only deploy/airflow/rbac.yaml's rules."""


@dataclass(frozen=True)
class ApiServer:
    url: str
    dir: Path

    @property
    def ca_file(self) -> Path:
        """The certificate kube-apiserver made for itself (it ends with the CA that signed it)."""
        return self.dir / "certs" / "apiserver.crt"

    def config(self, token: str) -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    def api_client(self, token: str = ADMIN_TOKEN) -> Any:
        from kubernetes import client

        return client.ApiClient(self.config(token))

    def kubeconfig(self, token: str, path: Path) -> Path:
        """A kubeconfig file for `token`, as a deployment would give the hai server."""
        cluster = f"{{server: '{self.url}', certificate-authority: '{self.ca_file}'}}"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: test, cluster: {cluster}}}]\n"
            f"users: [{{name: u, user: {{token: '{token}'}}}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: u}}]\n"
            "current-context: test\n"
        )
        return path


def binary(name: str = "kube-apiserver") -> Path | None:
    """A Kubernetes binary: from HAI_KUBE_BIN (a directory), then the CI cache, then PATH."""
    named = os.environ.get("HAI_KUBE_BIN")
    for directory in (named, str(CACHE / "kube" / "bin")):
        if directory and os.access(Path(directory) / name, os.X_OK):
            return Path(directory) / name
    found = shutil.which(name)
    return Path(found) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, ready: Any, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s: {log.read_text()[-2000:]}")


def _healthy(url: str) -> bool:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(f"{url}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def start(
    exe: Path, work: Path, controllers: bool = False
) -> tuple[ApiServer, list[subprocess.Popen[bytes]]]:
    """etcd and kube-apiserver under `work`; returns the server and the processes to stop.

    With `controllers` (a controller manager and a kubelet will run beside it) pods get service account
    tokens, and the API server reaches kubelets by their InternalIP (for pod logs).
    """
    etcd = shutil.which("etcd")
    if etcd is None:
        raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
    client_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    etcd_log = work / "etcd.log"
    procs.append(
        subprocess.Popen(
            [
                etcd,
                "--data-dir",
                str(work / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{client_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{client_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
            ],
            stdout=open(etcd_log, "wb"),  # noqa: SIM115 - the child keeps the file
            stderr=subprocess.STDOUT,
        )
    )
    try:
        _wait("etcd", lambda: _port_open(client_port), procs[0], etcd_log, 30)
        (work / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},admin,admin,"system:masters"\n{SERVER_TOKEN},{SERVER_USER},{SERVER_USER}\n'
            f"{AIRFLOW_TOKEN},{AIRFLOW_USER},{AIRFLOW_USER}\n"
        )
        sa_key = work / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
        api_log = work / "kube-apiserver.log"
        procs.append(
            subprocess.Popen(
                [
                    str(exe),
                    f"--etcd-servers=http://127.0.0.1:{client_port}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={api_port}",
                    "--insecure-port=0",
                    f"--cert-dir={work / 'certs'}",
                    f"--token-auth-file={work / 'tokens.csv'}",
                    "--authorization-mode=RBAC",
                    *(
                        ["--kubelet-preferred-address-types=InternalIP,Hostname"]
                        if controllers
                        # No controller manager runs to make service account tokens.
                        else ["--disable-admission-plugins=ServiceAccount"]
                    ),
                    f"--service-account-key-file={sa_key}",
                    f"--service-account-signing-key-file={sa_key}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    "--service-cluster-ip-range=10.96.0.0/16",
                    "--enable-priority-and-fairness=false",
                ],
                stdout=open(api_log, "wb"),  # noqa: SIM115 - the child keeps the file
                stderr=subprocess.STDOUT,
            )
        )
        url = f"https://127.0.0.1:{api_port}"
        _wait("kube-apiserver", lambda: _healthy(url), procs[1], api_log, 120)
    except BaseException:
        stop(procs)
        raise
    return ApiServer(url, work), procs


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def crash(proc: subprocess.Popen[bytes]) -> None:
    """Kill a component (-9) and reap it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def again(proc: subprocess.Popen[bytes], log: Path) -> subprocess.Popen[bytes]:
    """Start a component that ended again with the same arguments (same port, same etcd, same state),
    its output added to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(proc.args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(server: ApiServer, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Wait until the API server answers /readyz (it exits: RuntimeError with its log)."""
    _wait("kube-apiserver", lambda: _healthy(server.url), proc, server.dir / "kube-apiserver.log", timeout)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="session")
def kube_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A fresh API server for the session; the tier is skipped, saying why, when it cannot run."""
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
    exe = binary()
    if exe is None:
        reason = "kube tier skipped: no kube-apiserver binary; build it with .ci/kubernetes.sh"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    try:
        server, procs = start(exe, tmp_path_factory.mktemp("kube"))
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        reason = f"kube tier skipped: the API server did not start: {e}"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    try:
        yield server
    finally:
        stop(procs)


class KubeTest:
    """One test's namespace on the session's API server: the admin plays kubelet and operator, the
    backend runs as the `hai-server` user with only the RBAC of `manifests.rbac`."""

    def __init__(self, server: ApiServer, tmp: Path, namespace: str) -> None:
        from kubernetes import client

        self.server = server
        self.tmp = tmp
        self.ns = namespace
        self.admin_client = server.api_client(ADMIN_TOKEN)
        self.core = client.CoreV1Api(self.admin_client)
        self.custom = client.CustomObjectsApi(self.admin_client)
        self.core.create_namespace({"metadata": {"name": namespace}})
        grant_server_rbac(self.admin_client, namespace)
        self.kubeconfig = server.kubeconfig(SERVER_TOKEN, tmp / "kubeconfig")
        self.backends: list[Any] = []
        self._next_id = 100

    def backend(self, **options: Any) -> Any:
        from hai_airflow.backends.kubernetes.backend import KubernetesBackend

        opts = {"kubeconfig": str(self.kubeconfig), "namespace": self.ns, **options}
        backend = KubernetesBackend(opts, self.tmp / "home")
        self.backends.append(backend)
        return backend

    def launch(
        self,
        cmd: str = "python3 train.py",
        *,
        mode: str = "standalone",
        gpus: tuple[tuple[int, ...], ...] = ((0, 1),),
        nodes: tuple[str, ...] | None = None,
        cpus: float = 0,
        memory_gb: float = 0,
        storages: dict[int, str] | None = None,
        **spec: Any,
    ) -> Any:
        from hai_airflow.backends.common.base import JobEnvironment, Launch
        from hai_airflow.scheduling.model import WorkerPlacement
        from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

        self._next_id += 1
        iid = self._next_id
        common: dict[str, Any] = {"task_name": f"训练-{iid}", "code_path": "/nas/code", "cmd": cmd, **spec}
        job: Any
        if mode == "cpu":
            job = CpuJobSpec(**common)
        elif mode == "distributed":
            job = DistributedJobSpec(workers=len(gpus), worker_resource_pkg=1, **common)
        else:
            job = StandaloneJobSpec(resource_pkg=1, **common)
        names = nodes or tuple(f"gpu-node-{i}" for i in range(len(gpus)))
        placement = tuple(
            WorkerPlacement(node=n, gpus=g, cpus=cpus, memory_gb=memory_gb)
            for n, g in zip(names, gpus, strict=True)
        )
        work = self.tmp / f"instance-{iid}"
        return Launch(
            job_id=iid + 1000,
            instance_id=iid,
            spec=job,
            placement=placement,
            job=JobEnvironment(user="", group="", model_dir=Path(f"/nas/hai/jobs/{iid + 1000}/model")),
            log_path=work / "output.log",
            work_dir=work,
            storages=storages or {},
        )

    # ---- playing the kubelet -------------------------------------------------------------------

    def pod(self, name: str) -> Any:
        return self.core.read_namespaced_pod(name, self.ns)

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns).items)

    def set_running(self, name: str) -> None:
        self._status(name, "Running", {"running": {"startedAt": _now()}})

    def set_waiting(self, name: str, reason: str, message: str = "") -> None:
        self._status(name, "Pending", {"waiting": {"reason": reason, "message": message}})

    def set_terminated(self, name: str, exit_code: int, reason: str = "") -> None:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": _now(),
                "finishedAt": _now(),
            }
        }
        self._status(name, "Succeeded" if exit_code == 0 else "Failed", state)

    def _status(self, name: str, phase: str, state: dict[str, Any]) -> None:
        pod = self.pod(name)
        main = pod.spec.containers[0]
        status = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": main.name,
                    "image": main.image,
                    "imageID": "",
                    "ready": phase == "Running",
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        self.core.patch_namespaced_pod_status(name, self.ns, {"status": status})

    def force_delete(self, name: str) -> None:
        """What the kubelet does once the containers of a terminating pod have stopped."""
        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    def cleanup(self) -> None:
        for backend in self.backends:
            backend.close()
        for pod in self.pods():
            self.force_delete(pod.metadata.name)


def grant_server_rbac(admin_client: Any, namespace: str) -> None:
    """The backend's RBAC (`manifests.rbac`) in `namespace` for the `hai-server` user."""
    from kubernetes import client

    from hai_airflow.backends.kubernetes import manifests

    subject = {"kind": "User", "name": SERVER_USER, "apiGroup": "rbac.authorization.k8s.io"}
    rbac_api = client.RbacAuthorizationV1Api(admin_client)
    for doc in manifests.rbac(namespace, subject):
        kind = doc["kind"]
        if kind == "Role":
            rbac_api.create_namespaced_role(namespace, doc)
        elif kind == "RoleBinding":
            rbac_api.create_namespaced_role_binding(namespace, doc)
        elif kind == "ClusterRole":
            _create_or_keep(lambda d=doc: rbac_api.create_cluster_role(d))
        else:
            _create_or_keep(lambda d=doc: rbac_api.create_cluster_role_binding(d))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _create_or_keep(create: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        create()
    except ApiException as e:
        if e.status != 409:  # already there from an earlier test of this session
            raise


def wait_until(predicate: Any, what: str, timeout: float = 10, step: Any = None) -> Any:
    """Call `step` (e.g. a backend's poll) and `predicate` until the predicate is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        if step is not None:
            step()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)
