"""What each worker of an instance sees on top of the job's environment: GPUs, ranks, the rendezvous."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hai_airflow.backends.common import ranks
from hai_airflow.scheduling.model import Placement
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

MASTER_ADDR = "127.0.0.1"
"""Every worker of the local backend runs on this machine, whichever (virtual) node it is placed on."""


@dataclass(frozen=True)
class WorkerSlot:
    """One worker's place in the instance: its rank, its node and GPUs, its rank among that node's workers."""

    rank: int
    node: str
    gpus: tuple[int, ...]
    local_rank: int
    local_size: int


def worker_slots(placement: Placement) -> list[WorkerSlot]:
    """Ranks follow the placement's order; local ranks count the workers placed on the same node."""
    per_node = Counter(w.node for w in placement)
    seen: Counter[str] = Counter()
    slots = []
    for rank, w in enumerate(placement):
        slots.append(WorkerSlot(rank, w.node, tuple(w.gpus), seen[w.node], per_node[w.node]))
        seen[w.node] += 1
    return slots


def worker_env(slot: WorkerSlot, workers: int, distributed: bool, master_port: int) -> dict[str, str]:
    """The rank variables of a per-worker job's one process per worker (the job's own are `Launch.env`).

    RANK counts workers, not GPUs. A launcher such as torchrun or
    horovodrun started by the command spawns one process per GPU and computes global ranks from
    RANK x HAI_GPUS_PER_WORKER + local GPU index.
    """
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in slot.gpus),
        "HAI_WORKER_INDEX": str(slot.rank),
        "HAI_WORKERS": str(workers),
        "HAI_NODE": slot.node,
        "HAI_GPUS_PER_WORKER": str(len(slot.gpus)),
    }
    if distributed:
        env |= {
            "RANK": str(slot.rank),
            "WORLD_SIZE": str(workers),
            "LOCAL_RANK": str(slot.local_rank),
            "LOCAL_WORLD_SIZE": str(slot.local_size),
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(workers),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "MASTER_ADDR": MASTER_ADDR,
            "MASTER_PORT": str(master_port),
        }
    return env


def image_env(env: Mapping[str, str], venv: str | None) -> dict[str, str]:
    """Put the image's virtual environment (if one is configured for it) first on PATH."""
    out = dict(env)
    if venv:
        path = out.get("PATH", "")
        out["PATH"] = f"{venv.rstrip('/')}/bin" + (f":{path}" if path else "")
        out["VIRTUAL_ENV"] = venv
    return out


def free_port() -> int:
    """A TCP port free on the loopback interface right now (the rendezvous port of rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((MASTER_ADDR, 0))
        return int(s.getsockname()[1])


RANKS_SOURCE = Path(ranks.__file__).read_text()
"""The rank launcher, passed inline (`python3 -c`): a worker needs nothing installed to run it."""


@dataclass(frozen=True)
class Gang:
    """Where the processes of a per-gpu instance meet: torch.distributed's store and Horovod's rendezvous."""

    master_addr: str
    master_port: int
    rendezvous_addr: str
    rendezvous_port: int
    iface: str
    """The network interface gloo uses between ranks (lo on one machine, eth0 in a container or pod)."""
    serve_host: str
    """Where worker 0's launcher listens for the rendezvous (its own address, or every interface)."""


def per_gpu(spec: CpuJobSpec | StandaloneJobSpec | DistributedJobSpec) -> bool:
    """Whether the platform starts one process per GPU (the job's `processes`; CPU jobs never)."""
    return not isinstance(spec, CpuJobSpec) and spec.processes == "per-gpu"


def processes_of(slot: WorkerSlot) -> int:
    """Processes of a per-gpu worker: one per GPU, one for a worker holding none."""
    return max(1, len(slot.gpus))


def gang_env(slot: WorkerSlot, workers: int, gang: Gang) -> dict[str, str]:
    """The variables every process of a per-gpu worker shares: Horovod's gloo launcher's and torch's.

    Each worker is one Horovod host: local ranks count the worker's processes (one per GPU, bound by
    LOCAL_RANK to its GPU among CUDA_VISIBLE_DEVICES), cross ranks count workers. The launcher adds
    the per-process RANK, LOCAL_RANK, HOROVOD_RANK and HOROVOD_LOCAL_RANK.
    """
    local = processes_of(slot)
    size = workers * local
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in slot.gpus),
        "HAI_WORKER_INDEX": str(slot.rank),
        "HAI_WORKERS": str(workers),
        "HAI_NODE": slot.node,
        "HAI_GPUS_PER_WORKER": str(len(slot.gpus)),
        "WORLD_SIZE": str(size),
        "LOCAL_WORLD_SIZE": str(local),
        "GROUP_RANK": str(slot.rank),
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(gang.master_port),
        "HOROVOD_HOSTNAME": f"worker-{slot.rank}",
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_SIZE": str(local),
        "HOROVOD_CROSS_RANK": str(slot.rank),
        "HOROVOD_CROSS_SIZE": str(workers),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": gang.rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(gang.rendezvous_port),
        "HOROVOD_GLOO_IFACE": gang.iface,
        "NCCL_SOCKET_IFNAME": gang.iface,
        "PYTHONUNBUFFERED": "1",
    }


NO_PYTHON = (
    'if command -v python3 >/dev/null; then exec python3 -I -S -c "$0" "$@"; fi; '
    "echo 'hai: this image has no python3, which a per-gpu job needs to start a process per GPU; "
    "add Python 3 to the image or submit with processes = per-worker' >&2; exit 127"
)
"""Starts the launcher with the image's python3, or says plainly why it cannot."""


def rank_env(
    spec: CpuJobSpec | StandaloneJobSpec | DistributedJobSpec,
    slot: WorkerSlot,
    workers: int,
    gang: Gang,
    launcher: bool = True,
    renumber: bool = True,
) -> dict[str, str]:
    """A container worker's rank variables, the same under every container backend: those of its one
    process per GPU started by the rank launcher (`gang_env`; not without `launcher`, when mpirun starts
    them), else the worker's own with worker 0's address. With `renumber` (real GPUs: the engine or the
    device plugin passes only the worker's own), its GPUs are numbered from 0 as the container sees them."""
    if launcher and per_gpu(spec):
        env = gang_env(slot, workers, gang)
    else:
        distributed = isinstance(spec, DistributedJobSpec)
        env = worker_env(slot, workers, distributed, gang.master_port)
        if distributed:
            env["MASTER_ADDR"] = gang.master_addr
    if slot.gpus and renumber:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(slot.gpus)))
    return env


def host_ports(instance_id: int) -> tuple[int, int]:
    """(torch store port, Horovod rendezvous port) of an instance on a network instances share (a host's):
    spread by instance id, so two instances on one machine never ask for the same port."""
    port = 20000 + instance_id % 10000
    return port, port + 10000


def worker_argv(spec: CpuJobSpec | StandaloneJobSpec | DistributedJobSpec, slot: WorkerSlot, gang: Gang,
                shell: list[str]) -> list[str]:  # fmt: skip
    """What a worker runs: the rank launcher for a per-gpu job, else `shell` (the command in a shell)."""
    return launcher_argv(spec.cmd, slot, gang) if per_gpu(spec) else shell


def launcher_argv(cmd: str, slot: WorkerSlot, gang: Gang) -> list[str]:
    """The worker's argv: the rank launcher, serving the rendezvous on worker 0, starting `cmd` per GPU.

    `/bin/sh -c NO_PYTHON SOURCE PROCESSES FIRST_RANK SERVE CMD`: the shell execs the image's python3
    (so the launcher is what a runtime or kubelet signals) or explains that there is none.
    """
    local = processes_of(slot)
    serve = f"{gang.serve_host}:{gang.rendezvous_port}" if slot.rank == 0 else "-"
    return ["/bin/sh", "-c", NO_PYTHON, RANKS_SOURCE, str(local), str(slot.rank * local), serve, cmd]
