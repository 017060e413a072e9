"""Real training in containers: include/train.py suspended and resumed ends with the uninterrupted weights."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.docker_engine import DockerJobs, Engine
from tests.support.horovod import DETERMINISTIC, run_reference
from tests.support.training_code import copy_training_code

# The first run on a machine builds the torch root filesystem (minutes) inside the first test's time.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1500)]

STEPS = 60
TRAIN = f"python3 include/train.py --steps {STEPS} --ckpt-every 10 --step-sleep 0.1 --log-every 5"


@pytest.fixture
def jobs(docker_engine: Engine, torch_image: str, tmp_path: Path) -> Iterator[DockerJobs]:
    j = DockerJobs(docker_engine, tmp_path, torch_image)
    copy_training_code(j.code)
    try:
        yield j
    finally:
        j.cleanup()


def launch_in(jobs: DockerJobs, model: Path, resume: bool, **kw: Any) -> Any:
    """A launch of the sample trainer writing to `model`, with the variables the server would set."""
    base = jobs.launch(TRAIN, env={"PYTHONPATH": str(jobs.code), "PYTHONDONTWRITEBYTECODE": "1"}, **kw)
    return replace(base, job=replace(base.job, model_dir=model, resume=resume))


def wait_for_checkpoint(jobs: DockerJobs, launch: Any, model: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(p.suffix == ".pt" and p.name != "final.pt" for p in model.glob("*")):
        log = jobs.backend.read_log(launch.instance_id)
        assert time.monotonic() < deadline, f"no checkpoint in {model}: {log}"
        time.sleep(0.2)


def metrics(model: Path) -> dict[str, Any]:
    return dict(json.loads((model / "metrics.json").read_text()))


def test_killed_and_elastic_suspensions_resume_to_the_uninterrupted_weights(
    jobs: DockerJobs, tmp_path: Path
) -> None:
    # 1. The reference: one uninterrupted run.
    ref_model = tmp_path / "model-ref"
    ref = launch_in(jobs, ref_model, resume=False)
    jobs.backend.start(ref)
    ended = jobs.wait(ref.instance_id, timeout=240)
    assert ended.exit_code == 0, ref.log_path.read_text()
    reference = metrics(ref_model)
    assert reference["resumed_from"] is None

    # 2. Killed at once (a standalone job): it restarts from the last checkpoint it completed.
    model = tmp_path / "model-killed"
    first = launch_in(jobs, model, resume=False)
    jobs.backend.start(first)
    wait_for_checkpoint(jobs, first, model)
    jobs.backend.stop(first.instance_id, grace_seconds=0, notice=False)
    killed = jobs.wait(first.instance_id, timeout=60)
    assert killed.exit_code == 137
    assert not (model / "metrics.json").exists()
    second = launch_in(jobs, model, resume=True)
    jobs.backend.start(second)
    ended = jobs.wait(second.instance_id, timeout=240)
    assert ended.exit_code == 0, second.log_path.read_text()
    resumed = metrics(model)
    assert resumed["resumed_from"] and resumed["resumed_from"] > 0
    assert resumed["weights_sha256"] == reference["weights_sha256"]

    # 3. Elastic: told to save, it checkpoints and exits by itself with "saved on notice" (75).
    model = tmp_path / "model-elastic"
    first = launch_in(jobs, model, resume=False, elastic=True)
    jobs.backend.start(first)
    wait_for_checkpoint(jobs, first, model)
    jobs.backend.stop(first.instance_id, grace_seconds=60, notice=True)
    saved = jobs.wait(first.instance_id, timeout=90)
    assert saved.exit_code == 75, first.log_path.read_text()
    second = launch_in(jobs, model, resume=True, elastic=True)
    jobs.backend.start(second)
    ended = jobs.wait(second.instance_id, timeout=240)
    assert ended.exit_code == 0, second.log_path.read_text()
    resumed = metrics(model)
    assert resumed["resumed_from"] and resumed["resumed_from"] > 0
    assert resumed["weights_sha256"] == reference["weights_sha256"]


def test_two_workers_train_together_over_torch_distributed(jobs: DockerJobs, tmp_path: Path) -> None:
    model = tmp_path / "model-dist"
    base = jobs.launch(
        "python3 include/train_distributed.py --steps 20 --ckpt-every 10 --backend torch",
        mode="distributed",
        gpus=((0,), (1,)),
        env={"PYTHONPATH": str(jobs.code), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    launch = replace(base, job=replace(base.job, model_dir=model))
    jobs.backend.start(launch)
    ended = jobs.wait(launch.instance_id, timeout=300)
    log = launch.log_path.read_text()
    assert ended.exit_code == 0, log
    assert "[worker 0] [rank 0] done: " in log and "on 2 processes" in log  # only rank 0 reports
    result = metrics(model)
    assert (result["steps"], result["size"]) == (20, 2)
    assert (model / "final-rank1.json").exists()  # rank 1 trained too, in its own container


HOROVOD_ARGS = "--steps 40 --ckpt-every 10"


def test_a_horovod_job_runs_4_ranks_in_2_containers_and_resumes_bit_identical(
    jobs: DockerJobs, tmp_path: Path
) -> None:
    """The platform document's Horovod sample with no horovodrun: 2 containers x 2 ranks on one network."""
    model = tmp_path / "model-hvd"
    env = {"PYTHONPATH": str(jobs.code), "PYTHONDONTWRITEBYTECODE": "1", **DETERMINISTIC}

    def start() -> Any:
        base = jobs.launch(
            f"python3 include/train_distributed.py {HOROVOD_ARGS} --step-sleep 0.2",
            mode="distributed",
            gpus=((0, 1), (2, 3)),
            env=env,
        )
        launch = replace(base, job=replace(base.job, model_dir=model))
        jobs.backend.start(launch)
        return launch

    first = start()
    assert len(jobs.containers(first.instance_id)) == 2
    wait_for_checkpoint(jobs, first, model, timeout=240)
    jobs.backend.stop(first.instance_id, grace_seconds=0, notice=False)
    assert jobs.wait(first.instance_id, timeout=60).exit_code != 0
    second = start()
    ended = jobs.wait(second.instance_id, timeout=300)
    log = second.log_path.read_text()
    assert ended.exit_code == 0, log
    assert "[worker 1] [rank 3] rank 3 of 4 (local rank 1) on Horovod" in log

    finals = [json.loads((model / f"final-rank{r}.json").read_text()) for r in range(4)]
    assert [(f["rank"], f["local_rank"], f["size"], f["collective"]) for f in finals] == [
        (r, r % 2, 4, "horovod") for r in range(4)
    ]
    assert finals[0]["resumed_from"] and finals[0]["resumed_from"] > 0
    # The containers run the same torch and Horovod as this machine: the same weights as 4 ranks here.
    reference = run_reference(tmp_path, HOROVOD_ARGS, DETERMINISTIC)
    expected = json.loads((reference / "final-rank0.json").read_text())
    assert {f["weights_sha256"] for f in finals} == {expected["weights_sha256"]}
