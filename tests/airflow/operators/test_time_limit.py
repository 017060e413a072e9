"""The operators take a time limit as Airflow users write one: a timedelta, seconds, or `4h`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hai_airflow.operators.cpu import HaiCpuJobOperator
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from hai_airflow.spec import ResourcePackageView

PACKAGES = (ResourcePackageView(id=455, name="2xV100", gpu_type="V100", gpus=2, cpus=8, memory_gb=64),)


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (timedelta(hours=2), 7200),
        (5400, 5400),
        ("5400", 5400),  # a rendered template
        ("1h30m", 5400),
        ("", None),
        (None, None),
    ],
)
def test_the_time_limit_reaches_the_spec_in_seconds(given: object, seconds: int | None) -> None:
    op = HaiStandaloneTrainingOperator(
        task_id="train", code_path="/tmp", cmd="true", resource_pkg=455, time_limit=given
    )
    assert op.build_spec(PACKAGES).time_limit_seconds == seconds


def test_a_cpu_stage_takes_one_too_and_it_is_templated() -> None:
    op = HaiCpuJobOperator(task_id="prep", code_path="/tmp", cmd="true", time_limit="{{ params.limit }}")
    assert "time_limit" in op.template_fields
    op.time_limit = "45m"  # as rendered
    assert op.build_spec([]).time_limit_seconds == 2700


def test_a_limit_that_is_not_a_duration_names_the_forms() -> None:
    op = HaiCpuJobOperator(task_id="prep", code_path="/tmp", cmd="true", time_limit="soon")
    with pytest.raises(ValueError, match="'soon' is not a duration: write a number with units"):
        op.build_spec([])
