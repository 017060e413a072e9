"""The web form's checks: a job from what the person filled in, or a message naming each field to fix."""

from __future__ import annotations

from typing import Any

import pytest

from hai_airflow.operators.form import FormError, spec_from_form

NAS = {"task_name": "t", "code_src": "nas", "code_path": "/nas/me/code", "cmd": "python3 train.py"}
"""What a NAS job needs; everything else as the form opens (None)."""
AS_OPENED = dict.fromkeys(
    ("gpu_type", "git_branch", "model_dir", "project_storage", "shm", "processes", "worker_image", "cpus",
     "time_limit"),
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
