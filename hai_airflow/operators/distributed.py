"""HaiDistributedTrainingOperator: multi-machine Horovod / torch.distributed training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hai_airflow.operators.job import BaseHaiJobOperator
from hai_airflow.operators.package_choice import choose_package, chosen_gpus
from hai_airflow.operators.spec_building import processes_field
from hai_airflow.spec import DistributedJobSpec, JobSpec, ResourcePackageView


class HaiDistributedTrainingOperator(BaseHaiJobOperator):
    """Runs distributed training on hai: `workers` x the worker package's GPUs, started as a gang.

    Takes every argument of :class:`~hai_airflow.operators.job.BaseHaiJobOperator`, and:

    :param workers: number of workers (usually whole 8-GPU machines).
    :param min_workers: makes the job resizable (templated; None or empty: it never resizes). Rather
        than suspend it, a high-priority job may shrink it by whole workers down to this many, and it
        grows back to `workers` when GPUs free; each resize is a save on the notice and a restart at the
        new size from that checkpoint, so it implies `elastic`.
    :param worker_resource_pkg: resource package of one worker; may be left out when
        `gpus_per_worker` is given.
    :param gpus_per_worker: GPUs per worker; picks or checks the package like `gpus` of the
        standalone operator. Total GPUs = workers x GPUs per worker.
    :param worker_image: image of each worker; default `image`.
    :param gpu_type: GPU type; default the worker package's.
    :param processes: ``per-gpu`` (None, the default): one process per GPU of each worker, each given
        its Horovod and torch.distributed rank variables, so ``hvd.size()`` is workers x GPUs per
        worker and no launcher is needed; ``per-worker``: one process per worker, for a command that
        brings its own launcher (``torchrun``, ``horovodrun``, ``mpirun``).
    """

    template_fields: Sequence[str] = (
        *BaseHaiJobOperator.template_fields,
        "workers",
        "min_workers",
        "worker_resource_pkg",
        "gpus_per_worker",
        "worker_image",
        "gpu_type",
        "processes",
    )

    def __init__(
        self,
        *,
        workers: int | str,
        min_workers: int | str | None = None,
        worker_resource_pkg: int | str | None = None,
        gpus_per_worker: int | str | None = None,
        worker_image: str | None = None,
        gpu_type: str | None = None,
        processes: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workers = workers
        self.min_workers = min_workers
        self.worker_resource_pkg = worker_resource_pkg
        self.gpus_per_worker = gpus_per_worker
        self.worker_image = worker_image
        self.gpu_type = gpu_type
        self.processes = processes
        self._take_quota_pool()

    def pool_gpus(self, packages: Sequence[ResourcePackageView] | None) -> int | None:
        per_worker = chosen_gpus(packages, self.worker_resource_pkg, self.gpus_per_worker, self.gpu_type)
        return self.workers * per_worker if isinstance(self.workers, int) and per_worker else None

    def build_spec(self, packages: Sequence[ResourcePackageView]) -> JobSpec:
        package = choose_package(
            packages, self.worker_resource_pkg, self.gpus_per_worker, self.gpu_type, "worker_resource_pkg"
        )
        fields = {
            **self.common_fields(),
            "mode": "distributed",
            "workers": self.workers,
            "worker_resource_pkg": package,
            "worker_image": self.worker_image or None,
            "gpu_type": self.gpu_type or None,
            **processes_field(self.processes),
        }
        return DistributedJobSpec.model_validate(resizable(fields, self.min_workers))


def resizable(fields: dict[str, Any], min_workers: int | str | None) -> dict[str, Any]:
    """The spec fields with `min_workers` when given (an empty rendered template is not given). It
    implies `elastic`, so an `elastic` left false is dropped for the spec to imply."""
    if min_workers in (None, ""):
        return fields
    kept = fields if fields.get("elastic") else {k: v for k, v in fields.items() if k != "elastic"}
    return {**kept, "min_workers": min_workers}
