"""The samples in include/: preprocessing, and training that resumes bit-identically, alone and on 2 ranks."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hai_airflow.training import EXIT_SAVED_ON_NOTICE, Checkpointer
from tests.support.horovod import run_reference

from .conftest import Jobs
from .launch import INCLUDE, Job, free_port, wait_for

torch = pytest.importorskip("torch")

STEPS = 60
DISTRIBUTED_STEPS = 40
EVERY = 10


def newest_step(directory: Path) -> int:
    found = Checkpointer(directory).checkpoints()
    return int(found[0].stem.split("-")[1]) if found else -1


def metrics(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "train.npz"
    jobs = Jobs()
    try:
        job = jobs.start(INCLUDE / "preprocess.py", out, "--samples", 512, "--seed", 3, cwd=out.parent)
        assert job.wait() == 0, job.describe()
    finally:
        for started in jobs.started:
            started.stop()
    return out


@pytest.fixture(scope="module")
def uninterrupted(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model directory of a train.py run that nobody stopped, run in this process to save a start-up."""
    model = tmp_path_factory.mktemp("uninterrupted")
    sys.path.insert(0, str(INCLUDE))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the subprocesses run, with OMP_NUM_THREADS=1
    try:
        import train

        assert (
            train.main(
                [
                    "--data",
                    str(data),
                    "--steps",
                    str(STEPS),
                    "--ckpt-every",
                    str(EVERY),
                    "--model-dir",
                    str(model),
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(threads)
        sys.path.remove(str(INCLUDE))
    return model


def test_preprocess_writes_a_seeded_data_set(data: Path, tmp_path: Path, jobs: Jobs) -> None:
    with np.load(data) as arrays:
        x, y = arrays["x"], arrays["y"]
    assert x.shape == (512, 16) and x.dtype == np.float32
    assert y.shape == (512,) and y.dtype == np.int64 and set(np.unique(y)) <= {0, 1, 2, 3}
    assert len(np.unique(y)) > 1

    again = tmp_path / "again.npz"
    from_csv = tmp_path / "csv.npz"
    (tmp_path / "rows.csv").write_text("# a, b, label\n0.5,1.0,1\n-2.0,3.5,0\n")
    assert (
        jobs.start(INCLUDE / "preprocess.py", again, "--samples", 512, "--seed", 3, cwd=tmp_path).wait() == 0
    )
    job = jobs.start(INCLUDE / "preprocess.py", from_csv, "--input", tmp_path / "rows.csv", cwd=tmp_path)
    assert job.wait() == 0, job.describe()
    with np.load(again) as same:
        assert np.array_equal(same["x"], x) and np.array_equal(same["y"], y)
    with np.load(from_csv) as rows:
        assert rows["x"].tolist() == [[0.5, 1.0], [-2.0, 3.5]] and rows["y"].tolist() == [1, 0]


def test_uninterrupted_run_learns_and_reports(uninterrupted: Path) -> None:
    result = metrics(uninterrupted / "metrics.json")
    assert result["steps"] == STEPS and result["resumed_from"] is None
    assert result["loss"] < 1.0  # four balanced classes start near ln 4 = 1.39
    assert sorted(p.name for p in Checkpointer(uninterrupted).checkpoints()) == [
        "checkpoint-00000040.pt",
        "checkpoint-00000050.pt",
        "checkpoint-00000060.pt",
    ]


def test_killed_and_resumed_run_ends_bit_identical(
    data: Path, uninterrupted: Path, tmp_path: Path, jobs: Jobs
) -> None:
    model = tmp_path / "model"
    args = (INCLUDE / "train.py", "--data", data, "--steps", STEPS, "--ckpt-every", EVERY)

    # A standalone job is suspended with SIGKILL: it loses the steps since its last checkpoint.
    first = jobs.start(*args, "--step-sleep", 0.03, cwd=tmp_path, HAI_MODEL_DIR=str(model))
    wait_for(lambda: newest_step(model) >= 2 * EVERY, 60, "a checkpoint at step 20")
    first.process.send_signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    killed_at = newest_step(model)
    assert 2 * EVERY <= killed_at < STEPS and not (model / "metrics.json").exists()

    second = jobs.start(*args, cwd=tmp_path, HAI_MODEL_DIR=str(model), HAI_RESUME="1")
    assert second.wait(timeout=120) == 0, second.describe()
    assert second.lines[0] == f"resumed from step {killed_at} (checkpoint-{killed_at:08d}.pt)"

    resumed = metrics(model / "metrics.json")
    reference = metrics(uninterrupted / "metrics.json")
    assert resumed["resumed_from"] == killed_at
    assert resumed["weights_sha256"] == reference["weights_sha256"]
    assert resumed["loss"] == reference["loss"]
    ours = torch.load(model / "final.pt", weights_only=True)
    theirs = torch.load(uninterrupted / "final.pt", weights_only=True)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def start_ranks(
    jobs: Jobs, model: Path, *extra: object, env: dict[int, dict[str, str]] | None = None
) -> list[Job]:
    """Two workers of a distributed job, with the rank variables the platform sets."""
    port = str(free_port())
    return [
        jobs.start(
            INCLUDE / "train_distributed.py",
            "--steps",
            DISTRIBUTED_STEPS,
            "--ckpt-every",
            EVERY,
            *extra,
            cwd=model.parent,
            HAI_MODEL_DIR=str(model),
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE="2",
            HOROVOD_RANK=str(r),
            HOROVOD_LOCAL_RANK=str(r),
            HOROVOD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            # Two workers on one machine share no GPU: on a GPU machine they would both bind cuda:0.
            CUDA_VISIBLE_DEVICES="",
            **(env or {}).get(r, {}),
        )
        for r in range(2)
    ]


def finals(model: Path) -> list[dict[str, Any]]:
    return [metrics(model / f"final-rank{r}.json") for r in range(2)]


def test_distributed_ranks_agree_stop_together_and_resume_bit_identically(tmp_path: Path, jobs: Jobs) -> None:
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    notices = {r: tmp_path / f"notice-{r}" for r in range(2)}
    # Both jobs at once: the machine is idle while workers rendezvous and sleep.
    reference_ranks = start_ranks(jobs, straight)
    stopped_ranks = start_ranks(
        jobs,
        stopped,
        "--step-sleep",
        0.05,
        env={r: {"HAI_PREEMPT_NOTICE": str(notices[r])} for r in range(2)},
    )

    # Only rank 1 is told; both stop after the same step and rank 0 saves it.
    wait_for(lambda: newest_step(stopped) >= EVERY, 60, "rank 0's first checkpoint")
    notices[1].touch()
    for rank in stopped_ranks:
        assert rank.wait(timeout=60) == EXIT_SAVED_ON_NOTICE, rank.describe()
    noticed_at = newest_step(stopped)
    assert EVERY <= noticed_at < DISTRIBUTED_STEPS
    for rank in stopped_ranks:
        assert f"step {noticed_at} saved;" in rank.stderr
    assert not list(stopped.glob("final-rank*.json"))

    for rank in reference_ranks:
        assert rank.wait(timeout=120) == 0, rank.describe()
    reference = finals(straight)
    assert reference[0]["weights_sha256"] == reference[1]["weights_sha256"]
    assert [r["rank"] for r in reference] == [0, 1] and reference[0]["size"] == 2
    # Only rank 0 wrote checkpoints and the final weights.
    assert newest_step(straight) == DISTRIBUTED_STEPS and (straight / "final.pt").exists()

    notices[1].unlink()
    for rank in start_ranks(jobs, stopped, env={r: {"HAI_RESUME": "1"} for r in range(2)}):
        assert rank.wait(timeout=120) == 0, rank.describe()
    resumed = finals(stopped)
    assert [r["resumed_from"] for r in resumed] == [noticed_at, noticed_at]
    assert {r["weights_sha256"] for r in resumed} == {reference[0]["weights_sha256"]}


def test_torch_distributed_runs_a_process_per_gpu_through_the_platforms_launcher(tmp_path: Path) -> None:
    """2 workers x 2 GPUs as the platform starts them: 4 torch.distributed ranks, local ranks 0-1."""
    args = f"--steps 20 --ckpt-every {EVERY} --backend torch"
    model = run_reference(tmp_path, args, {"OMP_NUM_THREADS": "1"})
    finals = [metrics(model / f"final-rank{r}.json") for r in range(4)]
    assert [(f["rank"], f["local_rank"], f["size"], f["collective"]) for f in finals] == [
        (r, r % 2, 4, "torch.distributed") for r in range(4)
    ]
    assert len({f["weights_sha256"] for f in finals}) == 1
