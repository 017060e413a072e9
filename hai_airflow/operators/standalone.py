"""HaiStandaloneTrainingOperator: single-machine (multi-)GPU training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hai_airflow.operators.job import BaseHaiJobOperator
from hai_airflow.operators.package_choice import choose_package, chosen_gpus
from hai_airflow.operators.spec_building import processes_field
from hai_airflow.spec import JobSpec, ResourcePackageView, StandaloneJobSpec


class HaiStandaloneTrainingOperator(BaseHaiJobOperator):
    """Runs single-machine GPU training on hai; the code should checkpoint so it survives suspension.

    Takes every argument of :class:`~hai_airflow.operators.job.BaseHaiJobOperator`, and:

    :param resource_pkg: resource package id (``hai res``); may be left out when `gpus` is given.
    :param gpus: GPUs wanted; picks the smallest package with that many (of `gpu_type`), or is
        checked against `resource_pkg`.
    :param gpu_type: GPU type (V100, A100, P100, T4...); default the package's.
    :param processes: ``per-worker`` (None, the default): the command runs once and sees every GPU;
        ``per-gpu``: one process per GPU, each given its Horovod and torch.distributed rank
        variables, so no launcher is needed.
    """

    template_fields: Sequence[str] = (
        *BaseHaiJobOperator.template_fields,
        "resource_pkg",
        "gpus",
        "gpu_type",
        "processes",
    )

    def __init__(
        self,
        *,
        resource_pkg: int | str | None = None,
        gpus: int | str | None = None,
        gpu_type: str | None = None,
        processes: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.resource_pkg = resource_pkg
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.processes = processes
        self._take_quota_pool()

    def pool_gpus(self, packages: Sequence[ResourcePackageView] | None) -> int | None:
        return chosen_gpus(packages, self.resource_pkg, self.gpus, self.gpu_type)

    def build_spec(self, packages: Sequence[ResourcePackageView]) -> JobSpec:
        package = choose_package(packages, self.resource_pkg, self.gpus, self.gpu_type, "resource_pkg")
        return StandaloneJobSpec.model_validate(
            {
                **self.common_fields(),
                "mode": "standalone",
                "resource_pkg": package,
                "gpu_type": self.gpu_type or None,
                **processes_field(self.processes),
            }
        )
