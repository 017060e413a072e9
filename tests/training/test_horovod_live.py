"""Horovod for real, through `hai serve` on the local backend: the platform is the launcher.

The platform document's sample, `python3 train_distributed.py` (hvd.init, DistributedOptimizer,
broadcast_parameters, lr x hvd.size(), rank-0 checkpoints), submitted with 2 workers x 2 (virtual)
GPUs runs as 4 Horovod ranks over gloo with no horovodrun, ssh or MPI: the platform starts one process
per GPU with Horovod's variables and serves the rendezvous. Suspended and resumed, it ends with the
same weights as an uninterrupted 4-rank run. GPUs are virtual here (CUDA_VISIBLE_DEVICES only): the
ranks train on the CPU, which is all that differs from a GPU machine.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hai_airflow.spec import DistributedJobSpec
from hai_airflow.training import EXIT_SAVED_ON_NOTICE
from tests.support.horovod import DETERMINISTIC, run_reference
from tests.support.live_server import start_server

from .launch import INCLUDE, wait_for
from .test_suspend_resume_live import (
    EVERY,
    GRACE,
    IMAGE,
    STEP_SLEEP,
    STOPPED_AND_RESUMED,
    TIMEOUT,
    USERS,
    assert_same_weights,
    checkpoint_step,
    high_job,
    metrics,
    newest_step,
    running_instance,
    seconds,
    transitions,
    wait_state,
)

pytest.importorskip(
    "horovod.torch", reason="Horovod is not installed: make provision builds it (.ci/horovod.sh)"
)

STEPS = 60
WORKERS, GPUS = 2, 2
ARGS = f"--steps {STEPS} --ckpt-every {EVERY}"


def server_config() -> str:
    """Two virtual nodes of 2 V100s and a 2-GPU package (455): the low job's workers fill both nodes."""
    nodes = "".join(
        f'[[nodes]]\nname = "node{n}"\ngpu_type = "V100"\ngpus = {GPUS}\ncpus = 64\nmemory_gb = 512\n\n'
        for n in (1, 2)
    )
    return f"""
[server]
backend = "local"

[backend]
images = {{ local = "{IMAGE}" }}

{nodes}
[[resource_packages]]
id = 455
name = "2xV100"
gpu_type = "V100"
gpus = {GPUS}
cpus = 4
memory_gb = 32
{USERS}"""


def horovod_job(model: Path, elastic: bool) -> DistributedJobSpec:
    return DistributedJobSpec(
        task_name="hvd",
        code_path=str(INCLUDE),
        # A plain command: no horovodrun, no mpirun.
        cmd=f"python3 train_distributed.py {ARGS} --step-sleep {STEP_SLEEP}",
        workers=WORKERS,
        worker_resource_pkg=455,
        model_dir=str(model),
        env=DETERMINISTIC,
        elastic=elastic,
        grace_seconds=GRACE if elastic else None,
    )


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    """An uninterrupted 4-rank run through the same launcher, outside the server: the expected weights."""
    return run_reference(tmp_path, f"{ARGS}", DETERMINISTIC)


def check_ranks(model: Path) -> list[dict[str, object]]:
    """Every rank's final report: the platform document's definitions of rank, local rank and size."""
    finals = [metrics(model / f"final-rank{r}.json") for r in range(WORKERS * GPUS)]
    assert [(f["rank"], f["local_rank"], f["size"]) for f in finals] == [
        (0, 0, 4),
        (1, 1, 4),
        (2, 0, 4),
        (3, 1, 4),
    ]
    assert {f["collective"] for f in finals} == {"horovod"}
    assert len({f["weights_sha256"] for f in finals}) == 1, "the ranks ended with different weights"
    assert len({f["resumed_from"] for f in finals}) == 1
    return finals


@pytest.mark.parametrize("elastic", [False, True], ids=["killed", "elastic"])
def test_a_horovod_job_runs_a_rank_per_gpu_and_resumes_bit_identical(
    tmp_path: Path, elastic: bool, reference: Path
) -> None:
    model = tmp_path / "low"
    with (
        start_server(tmp_path / "hai", server_config()) as server,
        server.client("lena-token") as lena,
        server.client("hugo-token") as hugo,
    ):
        low = lena.submit(horovod_job(model, elastic))
        first = running_instance(lena, low.id)
        assert sorted((p.node, p.gpus) for p in first.placement) == [("node1", (0, 1)), ("node2", (0, 1))]
        wait_for(lambda: newest_step(model) >= EVERY, TIMEOUT, "rank 0's first checkpoint")
        high = hugo.submit(high_job(resource_pkg=455))

        assert wait_state(hugo, high.id, "SUCCEEDED", "FAILED").state == "SUCCEEDED"
        done = wait_state(lena, low.id, "SUCCEEDED", "FAILED", timeout=TIMEOUT * 2)
        assert done.state == "SUCCEEDED", done.reason
        stopped, resumed = lena.instances(low.id)
        assert (stopped.end_reason, stopped.preempted_by) == ("preempted", high.id)
        assert transitions(lena, low.id)[-6:] == STOPPED_AND_RESUMED
        before = lena.log(stopped.id)
        if elastic:
            # Every rank heard the notice (any_rank), rank 0 saved, all four left with 75 in the grace.
            asked = next(e for e in lena.job(low.id).events if e.kind == "suspending")
            assert stopped.exit_code == EXIT_SAVED_ON_NOTICE, before[-3000:]
            assert seconds(stopped.ended_at, asked.at) < GRACE
        else:
            assert stopped.exit_code == -signal.SIGKILL
        # Four ranks' lines, each under its worker and rank.
        for rank in range(4):
            assert f"[worker {rank // 2}] [rank {rank}] " in before + lena.log(resumed.id)

    finals = check_ranks(model)
    start = finals[0]["resumed_from"]
    assert isinstance(start, int) and EVERY <= start < STEPS
    assert checkpoint_step(resumed.checkpoint) <= start
    if elastic:
        assert checkpoint_step(resumed.checkpoint) == start, "the step saved on notice is where it resumed"
    assert finals[0]["weights_sha256"] == metrics(reference / "final-rank0.json")["weights_sha256"]
    assert_same_weights(model, reference)
