"""Rank, size and device of this training process, from Horovod, torch.distributed or the environment."""

from __future__ import annotations

import os
import sys
from typing import Any

# Launchers disagree on names; the platform sets the Horovod and torch ones, mpirun sets Open MPI's.
RANK_VARS = ("HOROVOD_RANK", "RANK", "OMPI_COMM_WORLD_RANK")
SIZE_VARS = ("HOROVOD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")
LOCAL_RANK_VARS = ("HOROVOD_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
LOCAL_SIZE_VARS = ("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _horovod() -> Any | None:
    """The initialised Horovod module the job imported, if any; never imports Horovod itself."""
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras", "horovod.mxnet"):
        hvd = sys.modules.get(name)
        if hvd is None:
            continue
        try:
            if hvd.is_initialized():
                return hvd
        except (AttributeError, ValueError):
            continue
    return None


def _torch_dist() -> Any | None:
    """torch.distributed when the job already imported it and initialised a process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _from_env(names: tuple[str, ...], default: int) -> int:
    for name in names:
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer. Unset it or set it to a number.") from None
    return default


def rank() -> int:
    """Global rank 0..size()-1 (Horovod's hvd.rank())."""
    if (hvd := _horovod()) is not None:
        return int(hvd.rank())
    if (dist := _torch_dist()) is not None:
        return int(dist.get_rank())
    return _from_env(RANK_VARS, 0)


def size() -> int:
    """Number of processes in the job, normally one per GPU (Horovod's hvd.size())."""
    if (hvd := _horovod()) is not None:
        return int(hvd.size())
    if (dist := _torch_dist()) is not None:
        return int(dist.get_world_size())
    return _from_env(SIZE_VARS, 1)


def local_rank() -> int:
    """Rank within this worker machine; selects the process's GPU."""
    if (hvd := _horovod()) is not None:
        return int(hvd.local_rank())
    return _from_env(LOCAL_RANK_VARS, 0)


def local_size() -> int:
    """Number of processes on this worker machine."""
    if (hvd := _horovod()) is not None:
        return int(hvd.local_size())
    return _from_env(LOCAL_SIZE_VARS, 1)


def is_chief() -> bool:
    """True on rank 0, the only process that writes checkpoints."""
    return rank() == 0


def scaled_lr(base: float) -> float:
    """The learning rate scaled by the number of processes, as Horovod recommends for a global batch."""
    return base * size()


def device() -> Any:
    """``torch.device("cuda:<local rank>")`` when CUDA is available, else the CPU."""
    import torch

    if torch.cuda.is_available():
        # A launcher that binds one GPU per process leaves a single visible device.
        return torch.device("cuda", local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def any_rank(flag: bool) -> bool:
    """True when ``flag`` is true on any rank; a collective, so every rank must call it at the same point.

    Works with Horovod for PyTorch and with torch.distributed; under any other framework each rank
    keeps its own answer.
    """
    if (hvd := _horovod()) is not None and hvd.__name__ == "horovod.torch":
        import torch

        return bool(hvd.allreduce(torch.tensor([int(flag)]), op=hvd.Sum).item() > 0)
    if (dist := _torch_dist()) is not None and dist.get_world_size() > 1:
        import torch

        where = device() if dist.get_backend() == "nccl" else torch.device("cpu")
        votes = torch.tensor([int(flag)], device=where)
        dist.all_reduce(votes, op=dist.ReduceOp.SUM)
        return bool(votes.item() > 0)
    return flag
