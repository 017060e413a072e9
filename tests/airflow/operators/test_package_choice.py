"""The operators choose the resource package by the rule `hai submit` uses (at least N GPUs, smallest)."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from hai_airflow.cli.submit import smallest_package as cli_rule
from hai_airflow.operators.distributed import HaiDistributedTrainingOperator
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from hai_airflow.spec import DistributedJobSpec, ResourcePackageView, StandaloneJobSpec


def package(id: int, gpus: int, gpu_type: str = "V100", cpus: float = 8) -> ResourcePackageView:
    return ResourcePackageView(
        id=id, name=f"{gpus}x{gpu_type}", gpu_type=gpu_type, gpus=gpus, cpus=cpus, memory_gb=64
    )


PACKAGES = (package(10, 8), package(11, 1), package(12, 1, cpus=4), package(13, 4), package(14, 1, "P100"))


@pytest.mark.parametrize(
    ("gpus", "gpu_type", "chosen"),
    [
        pytest.param(3, None, 13, id="three GPUs: the four-GPU package, as from the CLI"),
        pytest.param(1, "v100", 12, id="fewest CPUs, GPU type in any case"),
        pytest.param(5, "V100", 10, id="five GPUs: a whole machine"),
        pytest.param(1, "P100", 14, id="by type"),
    ],
)
def test_standalone_takes_the_package_the_cli_takes(gpus: int, gpu_type: str | None, chosen: int) -> None:
    op = HaiStandaloneTrainingOperator(
        task_id="t", code_path="/tmp", cmd="true", gpus=gpus, gpu_type=gpu_type
    )
    spec = op.build_spec(PACKAGES)
    assert isinstance(spec, StandaloneJobSpec)
    cli = cli_rule(PACKAGES, gpus, gpu_type)
    assert spec.resource_pkg == chosen == (cli.id if cli else None)


def test_distributed_workers_take_the_same_rule() -> None:
    op = HaiDistributedTrainingOperator(
        task_id="t", code_path="/tmp", cmd="true", workers=2, gpus_per_worker="3"
    )
    spec = op.build_spec(PACKAGES)
    assert isinstance(spec, DistributedJobSpec) and spec.worker_resource_pkg == 13


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"gpus": 16}, "no resource package has 16 x any GPU (offered: 1xP100", id="too many"),
        pytest.param({"gpus": 1, "gpu_type": "T4"}, "no resource package has 1 x T4", id="no such type"),
        pytest.param(
            {"gpus": 8, "resource_pkg": 13}, "package 13 (4xV100) has 4 GPUs, fewer than 8", id="too small"
        ),
        pytest.param({}, "`resource_pkg` or a GPU count is required", id="neither"),
    ],
)
def test_what_cannot_be_chosen_fails_naming_the_fix(args: dict[str, object], message: str) -> None:
    op = HaiStandaloneTrainingOperator(task_id="t", code_path="/tmp", cmd="true", **args)  # type: ignore[arg-type]
    with pytest.raises(AirflowFailException, match=message.replace("(", r"\(").replace(")", r"\)")):
        op.build_spec(PACKAGES)
