"""Fixtures for local backend tests: a backend, launches built from real specs, cleanup of leftovers."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.backends.common import procs
from hai_airflow.backends.common.base import Exit, Handle, JobEnvironment, Launch
from hai_airflow.backends.local.backend import LocalBackend
from hai_airflow.scheduling.model import WorkerPlacement
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec
from tests.support.exits import ended_within


class Cluster:
    """Starts instances on one LocalBackend and remembers every handle so teardown can kill leftovers."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.code = tmp / "code"
        self.code.mkdir()
        self.handles: list[Handle] = []
        self.backends: list[LocalBackend] = []
        self.backend = self.new_backend()
        self._next_id = 1

    def new_backend(self, **options: Any) -> LocalBackend:
        backend = LocalBackend(options, self.tmp / "home")
        self.backends.append(backend)
        return backend

    def launch(
        self,
        cmd: str,
        *,
        mode: str = "standalone",
        gpus: tuple[tuple[int, ...], ...] = ((0, 1),),
        nodes: tuple[str, ...] | None = None,
        **spec: Any,
    ) -> Launch:
        iid = self._next_id
        self._next_id += 1
        common: dict[str, Any] = {"task_name": f"t{iid}", "code_path": str(self.code), "cmd": cmd, **spec}
        job: CpuJobSpec | StandaloneJobSpec | DistributedJobSpec
        if mode == "cpu":
            job = CpuJobSpec(**common)
        elif mode == "distributed":
            job = DistributedJobSpec(workers=len(gpus), worker_resource_pkg=1, **common)
        else:
            job = StandaloneJobSpec(resource_pkg=1, **common)
        names = nodes or tuple(f"node-{i}" for i in range(len(gpus)))
        placement = tuple(WorkerPlacement(node=n, gpus=g) for n, g in zip(names, gpus, strict=True))
        work = self.tmp / f"instance-{iid}"
        return Launch(
            job_id=100 + iid,
            instance_id=iid,
            spec=job,
            placement=placement,
            job=JobEnvironment(user="", group="", model_dir=work),
            log_path=self.tmp / "logs" / f"instance-{iid}.log",
            work_dir=work,
        )

    def start(self, cmd: str, backend: LocalBackend | None = None, **kw: Any) -> Handle:
        handle = (backend or self.backend).start(self.launch(cmd, **kw))
        self.handles.append(handle)
        return handle

    def wait(self, instance_id: int, timeout: float = 5, backend: LocalBackend | None = None) -> Exit:
        """Poll until the instance's Exit comes; fail if it takes longer than `timeout` seconds."""
        return ended_within(backend or self.backend, instance_id, timeout)

    def cleanup(self) -> None:
        for backend in self.backends:
            backend.close()
        for handle in self.handles:
            for w in handle.data["workers"]:
                if procs.is_alive(w["pid"], w["start_time"]):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(w["pgid"], signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.cleanup()
