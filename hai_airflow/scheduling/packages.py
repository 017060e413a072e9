"""Which resource package a request for GPUs gets: one rule for `hai submit` and the Airflow operators."""

from __future__ import annotations

from collections.abc import Sequence

from hai_airflow.spec import ResourcePackageView


def smallest_package(
    packages: Sequence[ResourcePackageView], gpus: int, gpu_type: str | None
) -> ResourcePackageView | None:
    """The smallest package holding at least `gpus` GPUs of `gpu_type` (any type when None or empty).

    Smallest means, in order: 1. fewest GPUs, 2. fewest CPUs, 3. least memory, 4. lowest id.
    """
    wanted = gpu_type.casefold() if gpu_type else None
    fitting = [p for p in packages if p.gpus >= gpus and (wanted is None or p.gpu_type.casefold() == wanted)]
    return min(fitting, key=lambda p: (p.gpus, p.cpus, p.memory_gb, p.id), default=None)


def offered(packages: Sequence[ResourcePackageView]) -> str:
    """The GPU packages on offer, for an error message: ``1xV100, 8xV100`` (or ``none``)."""
    return ", ".join(sorted({f"{p.gpus}x{p.gpu_type}" for p in packages if p.gpus})) or "none"
