"""HaiCpuJobOperator: a CPU stage (e.g. preprocessing) that holds no GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hai_airflow.operators.job import BaseHaiJobOperator
from hai_airflow.spec import CpuJobSpec, JobSpec, ResourcePackageView


class HaiCpuJobOperator(BaseHaiJobOperator):
    """Runs a CPU-only hai job, such as the preprocessing stage of CPU-GPU staged training.

    Takes every argument of :class:`~hai_airflow.operators.job.BaseHaiJobOperator`, and:

    :param cpus: CPU cores the job needs.
    :param memory_gb: memory the job needs, GB.
    """

    template_fields: Sequence[str] = (*BaseHaiJobOperator.template_fields, "cpus", "memory_gb")
    needs_packages = False

    def __init__(self, *, cpus: float | str = 1, memory_gb: float | str = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cpus = cpus
        self.memory_gb = memory_gb

    def build_spec(self, packages: Sequence[ResourcePackageView]) -> JobSpec:
        # an empty value (e.g. a form field left blank) leaves the spec's default
        given = {k: v for k, v in (("cpus", self.cpus), ("memory_gb", self.memory_gb)) if v not in ("", None)}
        return CpuJobSpec.model_validate({**self.common_fields(), "mode": "cpu", **given})
