"""The training operators pass `processes` into the spec: the mode's default when not given."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hai_airflow.operators.distributed import HaiDistributedTrainingOperator
from hai_airflow.operators.job import BaseHaiJobOperator
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from hai_airflow.spec import ResourcePackageView

PACKAGES = (ResourcePackageView(id=455, name="2xV100", gpu_type="V100", gpus=2, cpus=8, memory_gb=64),)


def standalone(processes: str | None) -> HaiStandaloneTrainingOperator:
    return HaiStandaloneTrainingOperator(
        task_id="train", code_path="/tmp", cmd="true", resource_pkg=455, processes=processes
    )


def distributed(processes: str | None) -> HaiDistributedTrainingOperator:
    return HaiDistributedTrainingOperator(
        task_id="train", code_path="/tmp", cmd="true", workers=2, worker_resource_pkg=455, processes=processes
    )


@pytest.mark.parametrize(
    ("operator", "stored"),
    [
        pytest.param(standalone(None), "per-worker", id="standalone default"),
        pytest.param(standalone(""), "per-worker", id="standalone, empty form field"),
        pytest.param(standalone("per-gpu"), "per-gpu", id="standalone per-gpu"),
        pytest.param(distributed(None), "per-gpu", id="distributed default"),
        pytest.param(distributed(""), "per-gpu", id="distributed, empty form field"),
        pytest.param(distributed("per-worker"), "per-worker", id="distributed per-worker"),
    ],
)
def test_processes_reaches_the_spec(operator: BaseHaiJobOperator, stored: str) -> None:
    assert operator.build_spec(PACKAGES).model_dump()["processes"] == stored


@pytest.mark.parametrize(
    "operator", [standalone("per-node"), distributed("all")], ids=["standalone", "distributed"]
)
def test_an_unknown_choice_is_refused_naming_the_field(operator: BaseHaiJobOperator) -> None:
    with pytest.raises(ValidationError) as refused:
        operator.build_spec(PACKAGES)
    assert [e["loc"] for e in refused.value.errors()] == [("processes",)]


@pytest.mark.parametrize("operator", [HaiStandaloneTrainingOperator, HaiDistributedTrainingOperator])
def test_processes_is_templated(operator: type[BaseHaiJobOperator]) -> None:
    assert "processes" in operator.template_fields
    assert ":param processes:" in (operator.__doc__ or "")


def test_a_rendered_template_reaches_the_spec() -> None:
    op = distributed("{{ params.processes }}")
    op.render_template_fields({"params": {"processes": "per-worker"}})
    assert op.build_spec(PACKAGES).model_dump()["processes"] == "per-worker"
