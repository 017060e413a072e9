"""What each worker of an instance sees on top of the job's environment: GPUs, ranks, the rendezvous."""

from __future__ import annotations

import shlex
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from hai_airflow.scheduling.model import Placement

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
    """The per-worker variables (ARCHITECTURE.md section 4).

    One process runs per worker: RANK counts workers, not GPUs. A launcher such as torchrun or
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


def mpirun_env(slots: list[WorkerSlot], master_port: int) -> dict[str, str]:
    """Variables for an mpirun launch: every GPU of the instance, bound per process by local rank."""
    gpus = [g for s in slots for g in s.gpus]
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        "HAI_WORKER_INDEX": "0",
        "HAI_WORKERS": str(len(slots)),
        "HAI_NODE": slots[0].node,
        "HAI_GPUS_PER_WORKER": str(len(slots[0].gpus)),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(master_port),
    }


def mpirun_command(mpirun: str, cmd: str, slots: list[WorkerSlot]) -> str:
    """One mpirun on this machine starting one process per GPU (per worker for CPU-only workers)."""
    processes = sum(max(1, len(s.gpus)) for s in slots)
    argv = [
        mpirun,
        "--allow-run-as-root",
        "-np",
        str(processes),
        "-H",
        f"localhost:{processes}",
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "/bin/sh",
        "-c",
        cmd,
    ]
    return shlex.join(argv)
