"""The backend protocol: how an instance starts, stops, reports its exit and shows its log."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hai_airflow.backends.common.confine import PathRules
from hai_airflow.backends.common.gitcode import DEFAULT_SCHEMES
from hai_airflow.scheduling.model import Node, Placement
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

AnyJobSpec = CpuJobSpec | StandaloneJobSpec | DistributedJobSpec


NOTICE_NAME = "preempt-notice"
"""The file in an instance's work dir whose appearance tells an elastic job to save and exit."""
CREDENTIAL_NAME = "hai-token"
"""The file in an instance's work dir holding its job credential (`HAI_TOKEN_FILE`), 0600, the job's."""


@dataclass(frozen=True)
class JobEnvironment:
    """What the platform tells a job about itself; `Launch.env` spells it as the HAI_* variables."""

    user: str
    group: str
    model_dir: Path
    """Where the job saves its model and checkpoints, as the server resolved it."""
    resume: bool = False
    """A later instance of the job: it should resume from its latest checkpoint."""
    latest_checkpoint: str | None = None
    array: tuple[int, int] | None = None
    """The array it is a task of and its index there (`--array`); None outside one."""
    server: str | None = None
    """Where `hai` inside the job reaches the server (`HAI_SERVER`); None when the admin set no address
    a job of this backend can reach (`[server] job_url`)."""
    credential: str | None = field(default=None, repr=False)
    """The instance's job credential: a token acting for its owner, which the backend hands to the job
    as a file only the job's account reads (`HAI_TOKEN_FILE`), never in its environment or a log."""


@dataclass(frozen=True)
class Launch:
    """Everything a backend needs to start one instance of a job."""

    job_id: int
    instance_id: int
    spec: AnyJobSpec
    placement: Placement
    job: JobEnvironment
    log_path: Path
    """Where the instance's combined log must end up."""
    work_dir: Path
    """A private scratch directory for this instance (git checkouts, notice file, ...)."""
    storages: Mapping[int, str] = field(default_factory=dict)
    """Project storage id -> host path (local/docker) or PVC name (kubernetes)."""
    grace_seconds: int = 0
    paths: PathRules | None = None
    """The path rule of the job's owner, for the backend's check right before it mounts anything."""
    git_schemes: tuple[str, ...] = DEFAULT_SCHEMES
    """The protocols a git clone of the job's code may use (`[git] schemes`)."""
    log_bytes: int | None = None
    """The most bytes of output the instance's log keeps (`[limits] log_bytes_per_instance`), shared
    by its workers; None: no cap."""

    def worker_log_bytes(self, workers: int) -> int | None:
        """Each of `workers` workers' share of `log_bytes` (at least 64 KiB)."""
        return None if self.log_bytes is None else max(64 << 10, self.log_bytes // max(workers, 1))

    @property
    def notice_path(self) -> Path:
        return self.work_dir / NOTICE_NAME

    @property
    def credential_path(self) -> Path:
        """Where the local and docker backends write the job credential (the work dir is the job's)."""
        return self.work_dir / CREDENTIAL_NAME

    @property
    def env(self) -> dict[str, str]:
        """The job environment contract: the variables every process of every worker gets (the
        backend adds the rank variables, `workerenv`, and may say where paths are inside a container)."""
        job = self.job
        env = {
            "HAI_JOB_ID": str(self.job_id),
            "HAI_INSTANCE_ID": str(self.instance_id),
            "HAI_TASK_NAME": self.spec.task_name,
            "HAI_USER": job.user,
            "HAI_GROUP": job.group,
            "HAI_MODEL_DIR": str(job.model_dir),
            "HAI_CHECKPOINT_DIR": str(job.model_dir),
            "HAI_RESUME": "1" if job.resume else "0",
            "HAI_PREEMPT_NOTICE": str(self.notice_path),
        }
        if job.latest_checkpoint:
            env["HAI_LATEST_CHECKPOINT"] = job.latest_checkpoint
        if job.server:
            env["HAI_SERVER"] = job.server
        if job.credential is not None:
            env["HAI_TOKEN_FILE"] = str(self.credential_path)
        if job.array is not None:
            env["HAI_ARRAY_ID"], env["HAI_ARRAY_INDEX"] = (str(n) for n in job.array)
        env.update({f"HAI_PROJECT_STORAGE_{sid}": path for sid, path in self.storages.items()})
        return env


@dataclass(frozen=True)
class Handle:
    """What the server persists to find an instance again after a restart (JSON-able)."""

    instance_id: int
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Exit:
    """An instance that ended: its exit code (None when it vanished) and a short reason."""

    instance_id: int
    exit_code: int | None
    reason: str
    lost: bool = False
    """True when the instance disappeared without an exit code (e.g. lost across a restart)."""


class Backend(Protocol):
    name: str
    on_exit: Callable[[], None] | None
    """Set by the backend's owner: called, from any thread, as soon as the backend learns that an
    instance ended, so the owner calls `poll()` at once instead of on its next tick. Backends that
    learn of exits only inside `poll()` never call it."""

    def inventory(self) -> list[Node] | None:
        """Nodes detected by the backend (nvidia-smi, the Kubernetes API); None = use the config."""

    def start(self, launch: Launch) -> Handle:
        """Start every worker of the instance together; raise `StartError` if it cannot."""

    def stop(self, instance_id: int, grace_seconds: int, notice: bool) -> None:
        """Stop an instance: with `notice`, write the notice file and SIGTERM, kill after grace."""

    def poll(self) -> list[Exit]:
        """Instances that ended since the last call (each reported once)."""

    def reattach(self, handles: list[Handle]) -> list[Exit]:
        """After a restart: adopt the instances still alive, report the others as lost.

        Called once at every start of a controller, with an empty list too: backends that can list
        what they started remove here whatever no handle names.
        """

    def reap(self, instance_id: int, work_dir: Path) -> None:
        """Stop whatever this backend may have started for an instance whose handle was never saved.

        The server died during `start`, so the instance is ended as lost and its job requeued: any
        process, container or pod of it still running would run the job twice. Returns once they are
        gone (or, on a cluster, being deleted); an instance of which nothing was started is fine.
        """

    def read_log(self, instance_id: int, tail: int = 0) -> str:
        """The instance's log; `tail` > 0 keeps only the last lines."""

    def follow_log(self, instance_id: int) -> Iterator[str]:
        """Yield log chunks as they are written until the instance ends."""

    def close(self) -> None:
        """Release resources; running instances keep running (they are re-attached on start)."""


class StartError(Exception):
    """An instance could not be started; the message is shown to the user as the reason."""


class BackendUnavailable(RuntimeError):
    """What runs the jobs does not answer for now (dockerd restarting, the Kubernetes API server away):
    the controller neither plans nor starts anything (a start would fail its job) and tries again;
    running jobs go on, and their exits are read once it answers."""
