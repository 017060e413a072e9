"""A real Docker engine for the tests (started by .ci/docker.sh when none is running) and its images."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.exits import ended_within
from tests.support.live_server import TEST_CONFIG, LiveServer

REPO = Path(__file__).resolve().parents[2]
DOCKER_SH = REPO / ".ci" / "docker.sh"
BUSYBOX = Path("/bin/busybox")


@dataclass(frozen=True)
class Engine:
    """A reachable engine: its URL (what DOCKER_HOST would be) and a client."""

    url: str
    client: object  # docker.DockerClient; typed loosely so this module imports without the SDK


def _ping(url: str) -> bool:
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.DockerClient(base_url=url, timeout=5)
        ok = bool(client.ping())
        client.close()
        return ok
    except Exception:
        return False


def start_private(directory: Path, env: dict[str, str] | None = None) -> str:
    """Start a private dockerd with its state under `directory` (.ci/docker.sh); its URL. The tier is
    skipped, saying why, when dockerd is not installed or does not start."""
    if shutil.which("dockerd") is None:
        reason = "docker tier skipped: dockerd is not installed; run .ci/docker.sh install"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    done = subprocess.run(
        [str(DOCKER_SH), "start", str(directory)], capture_output=True, text=True, timeout=60, env=env
    )
    if done.returncode != 0:
        reason = f"docker tier skipped: dockerd did not start: {done.stderr.strip()[-500:]}"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    return done.stdout.strip()


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The engine of DOCKER_HOST if it answers, else a private dockerd started for this session."""
    docker = pytest.importorskip("docker", reason="the docker SDK is not installed (pip install '.[docker]')")
    url = os.environ.get("DOCKER_HOST", "")
    started: Path | None = None
    if not (url and _ping(url)):
        started = tmp_path_factory.mktemp("dockerd")
        url = start_private(started)
    client = docker.DockerClient(base_url=url, timeout=120)
    try:
        yield Engine(url, client)
    finally:
        client.close()
        if started is not None:
            subprocess.run([str(DOCKER_SH), "stop", str(started)], check=False, timeout=60)


class OwnEngine:
    """A dockerd of one test's own, never the machine's nor the session's, to stop and start again under
    running containers. With `live_restore` it runs with `--live-restore` (a `dockerd` first on PATH adds
    the option: .ci/docker.sh takes none), so its containers outlive the daemon."""

    def __init__(self, directory: Path, live_restore: bool = True) -> None:
        self.dir = directory
        self.env = dict(os.environ)
        dockerd = shutil.which("dockerd")
        if live_restore and dockerd is not None:
            shim = directory / "bin"
            shim.mkdir(parents=True)
            (shim / "dockerd").write_text(f'#!/bin/sh\nexec {dockerd} --live-restore "$@"\n')
            (shim / "dockerd").chmod(0o755)
            self.env["PATH"] = f"{shim}{os.pathsep}{self.env.get('PATH', '')}"
        self.engine: Engine | None = None

    def start(self) -> Engine:
        """Start the daemon unless it runs (again after `stop`: the same state, socket and containers)."""
        import docker

        url = start_private(self.dir / "state", self.env)
        if self.engine is None:
            self.engine = Engine(url, docker.DockerClient(base_url=url, timeout=120))
        return self.engine

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM the daemon and wait until it is gone, leaving its state, mounts and (with live-restore)
        its containers' processes as they are: what a `systemctl restart docker` does first."""
        pid = int((self.dir / "state" / "dockerd.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _runs(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd {pid} still runs {timeout:.0f} s after SIGTERM")
            time.sleep(0.05)

    def close(self) -> None:
        """Remove every container and stop the daemon for good, unmounting what it left."""
        if self.engine is not None:
            with contextlib.suppress(Exception):
                for c in self.engine.client.containers.list(all=True):  # type: ignore[attr-defined]
                    c.remove(force=True)
            self.engine.client.close()  # type: ignore[attr-defined]
        subprocess.run([str(DOCKER_SH), "stop", str(self.dir / "state")], check=False, timeout=60)


def _runs(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def own_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnEngine]:
    """A live-restore dockerd of this test's own, started (see `OwnEngine`)."""
    pytest.importorskip("docker", reason="the docker SDK is not installed (pip install '.[docker]')")
    own = OwnEngine(tmp_path_factory.mktemp("own-dockerd"))
    try:
        own.start()
        yield own
    finally:
        own.close()


def _has_image(client: object, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)  # type: ignore[attr-defined]
        return True
    except docker.errors.ImageNotFound:
        return False


def _import(client: object, tar_path: Path, tag: str, changes: list[str]) -> None:
    # `docker import`: the engine's image-create endpoint with the root filesystem tar as its body.
    repo, _, version = tag.partition(":")
    client.api.import_image_from_file(  # type: ignore[attr-defined]
        str(tar_path), repository=repo, tag=version, changes=changes
    )


def busybox_rootfs_tar(dest: Path) -> Path:
    """A root filesystem of Debian's static busybox: /bin/sh and the usual tools, nothing else."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout
    with tarfile.open(dest, "w") as tar:
        for d in ("bin", "tmp", "etc", "root"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(BUSYBOX), "bin/busybox")
        for name in applets.split():
            if name == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{name}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return dest


@pytest.fixture(scope="session")
def busybox_image(docker_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny image made by importing a busybox root filesystem (well under a second)."""
    return import_busybox(docker_engine, tmp_path_factory.mktemp("busybox"))


def import_busybox(engine: Engine, work: Path) -> str:
    """The busybox image on `engine`, imported unless it is there already; its tag."""
    if not BUSYBOX.exists():
        pytest.skip("docker tier: /bin/busybox is missing; run .ci/docker.sh install")
    digest = hashlib.sha256(BUSYBOX.read_bytes()).hexdigest()[:12]
    tag = f"hai-ci/busybox:{digest}"
    if not _has_image(engine.client, tag):
        tar = busybox_rootfs_tar(work / "rootfs.tar")
        _import(engine.client, tar, tag, ["ENV PATH=/bin", "WORKDIR /"])
    return tag


def torch_rootfs_tar() -> Path:
    """The cached Debian root with python3 and this environment's torch and Horovod (built by .ci/docker.sh
    on first use: minutes, or about 15 more when the Horovod wheel is not built yet)."""
    done = subprocess.run(
        [str(DOCKER_SH), "torch-rootfs", sys.executable], capture_output=True, text=True, timeout=2400
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-800:])
    return Path(done.stdout.strip())


@pytest.fixture(scope="session")
def torch_image(docker_engine: Engine) -> str:
    """Debian's python3 with the tests' torch and Horovod, imported from the cached root, tagged by key."""
    try:
        return import_torch(docker_engine)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"docker tier: the torch image cannot be built here: {e}")


def import_torch(engine: Engine) -> str:
    """The torch image on `engine`, imported from the cached root unless it is there already; its tag."""
    tar = torch_rootfs_tar()
    tag = f"hai-ci/torch:{tar.stem.removeprefix('torch-')}"
    if not _has_image(engine.client, tag):
        _import(engine.client, tar, tag, ["ENV PATH=/usr/local/bin:/usr/bin:/bin", "WORKDIR /"])
    return tag


class DockerJobs:
    """Launches built from real specs on one engine; teardown removes every container of its owner."""

    def __init__(self, engine: Engine, tmp: Path, image: str) -> None:
        self.engine = engine
        self.tmp = tmp
        self.image = image
        self.owner = f"hai-test-{uuid.uuid4().hex[:8]}"
        self.code = tmp / "code"
        self.code.mkdir()
        self.backends: list[Any] = []
        self.backend = self.new_backend()
        self._next_id = int(time.time() * 1000) % 10_000_000

    def new_backend(self, **options: Any) -> Any:
        from hai_airflow.backends.docker.backend import DockerBackend

        opts = {"docker_host": self.engine.url, "owner": self.owner, "virtual_gpus": True, **options}
        backend = DockerBackend(opts, self.tmp / "home")
        self.backends.append(backend)
        return backend

    def launch(
        self,
        cmd: str,
        *,
        mode: str = "standalone",
        gpus: tuple[tuple[int, ...], ...] = ((0, 1),),
        cpus: float = 0,
        memory_gb: float = 0,
        code_path: str | None = None,
        **spec: Any,
    ) -> Any:
        from hai_airflow.backends.common.base import JobEnvironment, Launch
        from hai_airflow.scheduling.model import WorkerPlacement
        from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

        self._next_id += 1
        iid = self._next_id
        common: dict[str, Any] = {
            "task_name": f"t{iid}",
            "code_path": code_path or str(self.code),
            "cmd": cmd,
            "image": self.image,
            **spec,
        }
        job: Any
        if mode == "cpu":
            job = CpuJobSpec(**common)
        elif mode == "distributed":
            job = DistributedJobSpec(workers=len(gpus), worker_resource_pkg=1, **common)
        else:
            job = StandaloneJobSpec(resource_pkg=1, **common)
        placement = tuple(
            WorkerPlacement(node=f"node-{i}", gpus=g, cpus=cpus, memory_gb=memory_gb)
            for i, g in enumerate(gpus)
        )
        work = self.tmp / f"instance-{iid}"
        return Launch(
            job_id=iid + 5,
            instance_id=iid,
            spec=job,
            placement=placement,
            job=JobEnvironment(user="", group="", model_dir=work),
            log_path=self.tmp / "logs" / f"instance-{iid}.log",
            work_dir=work,
        )

    def start(self, cmd: str, backend: Any = None, **kw: Any) -> Any:
        return (backend or self.backend).start(self.launch(cmd, **kw))

    def wait(self, instance_id: int, timeout: float = 30, backend: Any = None) -> Any:
        return ended_within(backend or self.backend, instance_id, timeout)

    def containers(self, instance_id: int | None = None) -> list[Any]:
        labels = [f"hai.owner={self.owner}"]
        if instance_id is not None:
            labels.append(f"hai.instance-id={instance_id}")
        return self.engine.client.containers.list(all=True, filters={"label": labels})  # type: ignore[attr-defined]

    def cleanup(self) -> None:
        for backend in self.backends:
            backend.close()
        for c in self.containers():
            c.remove(force=True)
        client = self.engine.client
        for net in client.networks.list(filters={"label": f"hai.owner={self.owner}"}):  # type: ignore[attr-defined]
            net.remove()


@contextmanager
def docker_server(
    engine: Engine, home: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[LiveServer, str]]:
    """A `hai serve` with TEST_CONFIG on `engine`'s docker backend (virtual GPUs, an owner label of its
    own), and that label; every container of the owner is removed at the end. `env`: the server's extra
    environment (its database)."""
    owner = f"hai-test-{uuid.uuid4().hex[:8]}"
    options = f'[backend]\ndocker_host = "{engine.url}"\nowner = "{owner}"\nvirtual_gpus = true\n'
    config = TEST_CONFIG.replace('backend = "local"', 'backend = "docker"').replace(
        "\n[[nodes]]", f"\n{options}\n[[nodes]]", 1
    )
    live = LiveServer(home, config, env).start()
    try:
        yield live, owner
    finally:
        live.close()
        for c in engine.client.containers.list(all=True, filters={"label": f"hai.owner={owner}"}):  # type: ignore[attr-defined]
            c.remove(force=True)
