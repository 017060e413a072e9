"""The web form's checks: a job from what the person filled in, or a message naming each field to fix."""

from __future__ import annotations

from typing import Any

import pytest

from hai_airflow.operators.form import DISTRIBUTED, FormError, ServerChoices, form_params, spec_from_form

NAS = {"task_name": "t", "code_src": "nas", "code_path": "/nas/me/code", "cmd": "python3 train.py"}
"""What a NAS job needs; everything else as the form opens (None)."""
AS_OPENED = dict.fromkeys(
    ("gpu_type", "git_branch", "model_dir", "project_storage", "shm", "processes", "worker_image", "cpus",
     "time_limit", "min_workers"),
    None,
)


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        pytest.param(
            {**NAS, "resource_pkg": 454},
            {"mode": "standalone", "resource_pkg": 454, "gpu_type": None, "processes": "per-worker"},
            id="a NAS standalone job with every optional field empty",
        ),
        pytest.param(
            {**NAS, "code_src": "git", "git_branch": "dev", "resource_pkg": 455, "gpu_type": "V100"},
            {"code_src": "git", "git_branch": "dev", "gpu_type": "V100"},
            id="a git job with a branch",
        ),
        pytest.param(
            {**NAS, "mode": "distributed", "workers": 2, "worker_resource_pkg": 457, "resource_pkg": None},
            {"mode": "distributed", "workers": 2, "worker_image": None, "processes": "per-gpu"},
            id="a distributed job; the standalone package may be empty",
        ),
        pytest.param(
            {**NAS, "mode": "cpu", "resource_pkg": None, "workers": None, "memory_gb": 4},
            {"mode": "cpu", "cpus": 1, "memory_gb": 4},
            id="a CPU job ignores the GPU fields and fills its defaults",
        ),
        pytest.param(
            {**NAS, "resource_pkg": 454, "project_storage": " 10111, 10222 ", "shm": 256},
            {"project_storage": (10111, 10222), "shm": 256},
            id="storages as typed",
        ),
        pytest.param(
            {**NAS, "resource_pkg": 454, "time_limit": "1h30m"},
            {"time_limit_seconds": 5400},
            id="a time limit as a duration",
        ),
        pytest.param({**NAS, "resource_pkg": 454}, {"time_limit_seconds": None}, id="no time limit"),
        pytest.param(
            {**NAS, "mode": "distributed", "workers": 4, "min_workers": 2, "worker_resource_pkg": 457},
            {"workers": 4, "min_workers": 2, "elastic": True, "resizable": True},
            id="a resizable distributed job",
        ),
        pytest.param(
            {**NAS, "mode": "distributed", "workers": 4, "min_workers": None, "worker_resource_pkg": 457},
            {"min_workers": None, "elastic": False},
            id="min workers left empty: never resizes",
        ),
    ],
)
def test_the_form_makes_the_job(form: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = spec_from_form({**AS_OPENED, **form})
    assert {k: getattr(spec, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("form", "message"),
    [
        pytest.param(
            {**NAS, "mode": "distributed", "workers": None, "worker_resource_pkg": None},
            "workers (worker数目 Workers): a distributed job needs its number of workers; fill it in; "
            "worker_resource_pkg (worker资源组 Worker resource package): a distributed job needs one "
            "worker's package; pick one",
            id="distributed without workers or their package",
        ),
        pytest.param(
            {**NAS, "resource_pkg": None},
            "resource_pkg (资源组 Resource package): a standalone job needs a resource package",
            id="standalone without a package",
        ),
        pytest.param(
            {**NAS, "resource_pkg": 454, "git_branch": "dev"},
            "`git_branch` is only valid when `code_src` is git",
            id="a branch for NAS code",
        ),
        pytest.param(
            {**NAS, "resource_pkg": 454, "code_path": "   "},
            "code_path (代码地址 Code path):",
            id="a field the spec refuses is named with its label",
        ),
        pytest.param(
            {**NAS, "resource_pkg": 454, "min_workers": 1},
            "min_workers (最少worker数 Min workers (resizable)): only a distributed job takes it; "
            "empty it, or pick mode distributed",
            id="min workers for a standalone job",
        ),
        pytest.param(
            {**NAS, "mode": "distributed", "workers": 2, "min_workers": 3, "worker_resource_pkg": 457},
            "`min_workers` (3) is more than `workers` (2) (Set min_workers between 1 and workers",
            id="more min workers than workers, with the fix",
        ),
        pytest.param(
            {**NAS, "resource_pkg": 454, "time_limit": "90"},
            "time_limit (运行时限 Time limit): '90' has no unit: write 90m for minutes or 90s for seconds",
            id="a time limit without a unit",
        ),
    ],
)
def test_the_form_names_the_field_and_the_fix(form: dict[str, Any], message: str) -> None:
    with pytest.raises(FormError, match="the form is not valid") as refused:
        spec_from_form({**AS_OPENED, **form})
    assert message in str(refused.value)


def test_min_workers_is_an_optional_field_of_the_distributed_section() -> None:
    param = form_params(ServerChoices(unreachable="test")).get("min_workers")
    assert param is not None and param.value is None
    assert param.schema["type"] == ["null", "integer"] and param.schema["minimum"] == 1
    assert param.schema["section"] == DISTRIBUTED
