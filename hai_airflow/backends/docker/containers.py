"""Docker backend settings and the container of each worker, as pure functions of a Launch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.backends.common.base import Launch, StartError
from hai_airflow.backends.common.confine import PathRefused
from hai_airflow.backends.common.credential import credential_env
from hai_airflow.backends.common.jobuser import JobUser, RunAs, server_user
from hai_airflow.backends.common.launches import image_of
from hai_airflow.backends.common.mounts import launch_mounts
from hai_airflow.backends.common.workerenv import (
    Gang,
    WorkerSlot,
    host_ports,
    rank_env,
    worker_argv,
    worker_slots,
)
from hai_airflow.scheduling.model import WorkerPlacement
from hai_airflow.spec import DistributedJobSpec

LABEL_OWNER = "hai.owner"
LABEL_JOB = "hai.job-id"
LABEL_INSTANCE = "hai.instance-id"
LABEL_WORKER = "hai.worker"
MASTER_PORT = 29500
RENDEZVOUS_PORT = 29400
TMP_OPTIONS = "rw,exec,nosuid,nodev,mode=1777"
"""The private /tmp of every container: exec, as training code compiles and loads kernels there."""
TRAP_TERM = "trap 'exit $?' TERM INT HUP\n"
"""Prefix of every command: the shell outlives SIGTERM until its command has exited (see `command`)."""


class DockerOptions(BaseModel):
    """The `[backend]` table of `hai serve` for `backend = "docker"`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    docker_host: str | None = Field(
        default=None,
        description="Engine URL (unix:///var/run/docker.sock, tcp://...); default: DOCKER_HOST, else the "
        "local socket.",
    )
    virtual_gpus: bool = Field(
        default=False, description="Virtual nodes: jobs see CUDA_VISIBLE_DEVICES only, no GPU is passed in."
    )
    network: str | None = Field(
        default=None, description="Network of CPU and standalone containers; default: the engine's."
    )
    distributed_network: Literal["bridge", "host"] = Field(
        default="bridge",
        description="bridge: a user-defined network per instance, rank 0 found by its container name; "
        "host: the host's network, rank 0 at 127.0.0.1 (where user-defined networks are unavailable).",
    )
    owner: str = Field(
        default="hai",
        min_length=1,
        description="Label value marking this server's containers; a restarted server adopts these only.",
    )
    api_timeout_seconds: int = Field(default=120, gt=0, description="Limit for one call to the engine.")
    run_as: RunAs = Field(
        default=None,
        min_length=1,
        description='OS user the containers and git clones run as, or "{user}" for the account named like '
        "the job's owner (hai serve must run as root); unset: the server's own user. Never the image's "
        "USER.",
    )
    pids_limit: int = Field(
        default=4096, gt=0, description="Most processes and threads one container may run."
    )
    git_timeout_seconds: float = Field(
        default=600, gt=0, description="Limit for one git clone of a job's code."
    )


def server_account() -> JobUser:
    """The account of `hai serve` itself: whom containers run as when `run_as` is unset."""
    return JobUser(server_user(), os.getuid(), os.getgid(), tuple(os.getgroups()))


def container_name(instance_id: int, rank: int) -> str:
    return f"hai-{instance_id}-w{rank}"


def network_name(instance_id: int) -> str:
    return f"hai-{instance_id}"


def notice_path(launch: Launch) -> Path:
    """The notice file an elastic job watches, in its instance's work dir."""
    return launch.notice_path


def code_dir(launch: Launch) -> str:
    """Where the job starts: the NAS code path, or the checkout the backend makes in the work dir."""
    if launch.spec.code_src == "git":
        return str(launch.work_dir / "code")
    return launch.spec.code_path


def command(cmd: str) -> list[str]:
    """The worker's argv.

    The engine's init (tini) sends SIGTERM to the whole process group, so an elastic job's training
    process gets it directly. Without the trap the `sh -c` parent would die at once, the container's
    init would follow and take the still-saving process with it; with it the shell waits and then
    exits with the command's own status.
    """
    return ["/bin/sh", "-c", TRAP_TERM + cmd]


def worker_command(launch: Launch, slot: WorkerSlot, opts: DockerOptions) -> list[str]:
    """The rank launcher for a per-gpu job (it handles SIGTERM itself), else the command in a shell."""
    return worker_argv(launch.spec, slot, gang_of(launch, opts), command(launch.spec.cmd))


def uses_bridge(launch: Launch, opts: DockerOptions) -> bool:
    return isinstance(launch.spec, DistributedJobSpec) and opts.distributed_network == "bridge"


def master_addr_port(launch: Launch, opts: DockerOptions) -> tuple[str, int]:
    """Where rank 0 listens for the torch.distributed / Horovod rendezvous."""
    if uses_bridge(launch, opts):
        # Each container has its own network namespace, so the standard port never collides.
        return container_name(launch.instance_id, 0), MASTER_PORT
    return "127.0.0.1", host_ports(launch.instance_id)[0]


def gang_of(launch: Launch, opts: DockerOptions) -> Gang:
    """Where the processes of a per-gpu instance meet: worker 0's container, or this host's loopback."""
    addr, port = master_addr_port(launch, opts)
    if uses_bridge(launch, opts):
        return Gang(addr, port, addr, RENDEZVOUS_PORT, "eth0", "0.0.0.0")
    # One container (a standalone job), or the host's network shared by every instance.
    return Gang("127.0.0.1", port, "127.0.0.1", host_ports(launch.instance_id)[1], "lo", "127.0.0.1")


def engine_sockets(opts: DockerOptions) -> tuple[str, ...]:
    """The socket of the engine this backend drives: never to be seen by a job."""
    host = opts.docker_host or os.environ.get("DOCKER_HOST", "")
    return (host.removeprefix("unix://"),) if host.startswith("unix://") else ()


def mounts(launch: Launch, opts: DockerOptions) -> dict[str, dict[str, str]]:
    """Bind mounts at the same path inside as outside, so every path in the job's env is valid in both.

    Each path is checked and its symlinks resolved now, right before the engine mounts it: the host
    path the engine binds is the resolved one, so a symlink planted after submission leads nowhere.
    """
    try:
        found = launch_mounts(launch, engine_sockets(opts))
    except PathRefused as e:
        raise StartError(f"{e.field} {e.path} cannot be mounted: {e.reason}") from None
    return {m.source: {"bind": m.target, "mode": "rw"} for m in found}


def environment(launch: Launch, slot: WorkerSlot, opts: DockerOptions, account: JobUser) -> dict[str, str]:
    """Section 4 variables, the job's own `env`, then this worker's rank variables (as the local backend).

    HOME is the instance's work dir, as for a local job: the account may have no home in the image.
    """
    own = {"HOME": str(launch.work_dir), "USER": account.name, "LOGNAME": account.name}
    env = {**own, **launch.env, **launch.spec.env}
    gang = gang_of(launch, opts)  # worker 0's container, or this host's loopback
    env |= rank_env(launch.spec, slot, len(slots_of(launch)), gang, renumber=not opts.virtual_gpus)
    env["HAI_PREEMPT_NOTICE"] = str(notice_path(launch))
    env |= credential_env(launch)  # the work dir is bind-mounted at the same path
    # docker-init (tini) forwards signals to the command's process group, not only to the shell.
    env["TINI_KILL_PROCESS_GROUP"] = "1"
    return env


def labels(launch: Launch, rank: int, opts: DockerOptions) -> dict[str, str]:
    return {
        LABEL_OWNER: opts.owner,
        LABEL_JOB: str(launch.job_id),
        LABEL_INSTANCE: str(launch.instance_id),
        LABEL_WORKER: str(rank),
    }


def create_kwargs(launch: Launch, slot: WorkerSlot, opts: DockerOptions, account: JobUser) -> dict[str, Any]:
    """Keyword arguments of `containers.create` for one worker (device requests excluded).

    The worker runs as `account`, whatever USER the image names, with no capabilities and no way to
    gain privileges: on the bind-mounted NAS it has exactly its account's rights.
    """
    worker = launch.placement[slot.rank] if launch.placement else WorkerPlacement(node="docker", gpus=())
    kwargs: dict[str, Any] = {
        "image": image_of(launch),
        "command": worker_command(launch, slot, opts),
        "name": container_name(launch.instance_id, slot.rank),
        "hostname": container_name(launch.instance_id, slot.rank),
        "working_dir": code_dir(launch),
        "environment": environment(launch, slot, opts, account),
        "labels": labels(launch, slot.rank, opts),
        "volumes": mounts(launch, opts),
        "user": f"{account.uid}:{account.gid}",
        "group_add": [str(g) for g in account.groups if g != account.gid],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": opts.pids_limit,
        "tmpfs": {"/tmp": TMP_OPTIONS},
        "init": True,
        "detach": True,
    }
    if (limit := launch.worker_log_bytes(len(slots_of(launch)))) is not None:
        # The engine keeps at most this much of the worker's output (the newest), so the log kept
        # when the container is removed is bounded too.
        kwargs["log_config"] = {"type": "json-file", "config": {"max-size": str(limit), "max-file": "1"}}
    if launch.spec.shm:
        kwargs["shm_size"] = f"{launch.spec.shm}m"
    if worker.cpus > 0:
        kwargs["nano_cpus"] = int(worker.cpus * 1e9)
    if worker.memory_gb > 0:
        kwargs["mem_limit"] = int(worker.memory_gb * 1024**3)
    if isinstance(launch.spec, DistributedJobSpec):
        kwargs["network"] = network_name(launch.instance_id) if uses_bridge(launch, opts) else "host"
        if not uses_bridge(launch, opts):
            del kwargs["hostname"]  # the host network keeps the host's name
    elif opts.network:
        kwargs["network"] = opts.network
    return kwargs


def slots_of(launch: Launch) -> list[WorkerSlot]:
    # A CPU job may come without a placement: it is one worker holding no GPU.
    return worker_slots(launch.placement or (WorkerPlacement(node="docker", gpus=()),))
