"""`HaiDistributedTrainingOperator(min_workers=...)`: a resizable job's spec, templated, refused naming it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from hai_airflow.operators.distributed import HaiDistributedTrainingOperator
from hai_airflow.operators.spec_building import spec_error
from hai_airflow.spec import ResourcePackageView

PACKAGES = (ResourcePackageView(id=457, name="8xV100", gpu_type="V100", gpus=8, cpus=32, memory_gb=256),)


def distributed(**kwargs: Any) -> HaiDistributedTrainingOperator:
    return HaiDistributedTrainingOperator(
        task_id="train", code_path="/tmp", cmd="true", workers=4, worker_resource_pkg=457, **kwargs
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, (None, False, False), id="not given: never resizes"),
        pytest.param({"min_workers": ""}, (None, False, False), id="an empty form field: never resizes"),
        pytest.param({"min_workers": 2}, (2, True, True), id="resizable, elastic implied"),
        pytest.param({"min_workers": 2, "elastic": True}, (2, True, True), id="elastic given too"),
        pytest.param({"min_workers": 4}, (4, True, False), id="as many as workers: never shrinks"),
    ],
)
def test_min_workers_reaches_the_spec(kwargs: dict[str, Any], expected: tuple[Any, ...]) -> None:
    spec = distributed(**kwargs).build_spec(PACKAGES)
    assert (spec.min_workers, spec.elastic, spec.resizable) == expected  # type: ignore[union-attr]


def test_a_rendered_template_reaches_the_spec() -> None:
    op = distributed(min_workers="{{ params.min_workers }}")
    op.render_template_fields({"params": {"min_workers": 3}})
    assert op.build_spec(PACKAGES).min_workers == 3  # type: ignore[union-attr]


def test_min_workers_is_templated_and_documented() -> None:
    assert "min_workers" in HaiDistributedTrainingOperator.template_fields
    assert ":param min_workers:" in (HaiDistributedTrainingOperator.__doc__ or "")


def test_more_than_workers_is_refused_naming_the_field_and_the_fix() -> None:
    with pytest.raises(ValidationError) as refused:
        distributed(min_workers=5).build_spec(PACKAGES)
    message = spec_error(refused.value)
    assert "`min_workers` (5) is more than `workers` (4)" in message
    assert "Set min_workers between 1 and workers" in message
