"""Issue 5's proofs against a real `hai serve`: a suspended job resumes from its checkpoint bit-identical.

Proof 3, that a kill during a save never costs the last good checkpoint, is test_kill_during_save.py.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.client import HaiClient
from hai_airflow.spec import DistributedJobSpec, InstanceView, JobView, StandaloneJobSpec
from hai_airflow.training import EXIT_SAVED_ON_NOTICE, Checkpointer
from tests.support.live_server import LiveServer, start_server

from .conftest import Jobs
from .launch import INCLUDE, Job, free_port, wait_for

torch = pytest.importorskip("torch")

STEPS = 80
DISTRIBUTED_STEPS = 60
EVERY = 10
# Slow enough that a high-priority job arrives mid-run, short enough to keep the file quick.
STEP_SLEEP = 0.08
PREEMPT_AFTER = 15
"""The low job is preempted once it logged this step: after its first checkpoint, between two."""
GRACE = 20
TIMEOUT = 90.0


# The image "local" is this interpreter's environment, so `python3` in a job is the one with torch.
IMAGE = Path(sys.executable).parent.parent

USERS = """
[[groups]]
name = "research"
quota_gpus = 8

[[users]]
name = "admin"
group = "research"
role = "platform_admin"
token = "admin-token"

[[users]]
name = "lena"
group = "research"
token = "lena-token"

[[users]]
name = "hugo"
group = "research"
quota_gpus = 8
token = "hugo-token"
"""
"""lena submits low-priority jobs only; hugo may run 8 high-priority GPUs."""


def server_config(nodes: int, gpus_per_node: int) -> str:
    """Virtual V100 nodes, the 1-GPU (454) and 8-GPU (457) V100 packages and the users above."""
    node_tables = "".join(
        f'[[nodes]]\nname = "node{n}"\ngpu_type = "V100"\ngpus = {gpus_per_node}\n'
        "cpus = 64\nmemory_gb = 512\n\n"
        for n in range(1, nodes + 1)
    )
    return f"""
[server]
backend = "local"

[backend]
images = {{ local = {json.dumps(str(IMAGE))} }}

{node_tables}
[[resource_packages]]
id = 454
name = "1xV100"
gpu_type = "V100"
gpus = 1
cpus = 4
memory_gb = 32

[[resource_packages]]
id = 457
name = "8xV100"
gpu_type = "V100"
gpus = 8
cpus = 32
memory_gb = 256
{USERS}"""


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("hai"), server_config(nodes=1, gpus_per_node=8)) as server:
        yield server


@pytest.fixture
def node8(one_node: LiveServer) -> Iterator[LiveServer]:
    """The one-node server (8 virtual V100s), emptied after each test so no failure leaks into the next."""
    yield one_node
    one_node.cancel_all()


# ---- jobs and waiting ---------------------------------------------------------------------------


def train_args(steps: int) -> list[str]:
    return ["--steps", str(steps), "--ckpt-every", str(EVERY)]


def low_train_job(model: Path, elastic: bool = False, exec_: bool = True) -> StandaloneJobSpec:
    """include/train.py on all 8 GPUs at low priority, logging every step and saying whether it resumes."""
    args = " ".join([*train_args(STEPS), "--step-sleep", str(STEP_SLEEP), "--log-every", "1"])
    launch = "exec python3" if exec_ else "python3"
    return StandaloneJobSpec(
        task_name="low train",
        code_path=str(INCLUDE),
        cmd=f"echo HAI_RESUME=$HAI_RESUME; {launch} train.py {args}",
        resource_pkg=457,
        model_dir=str(model),
        env={"OMP_NUM_THREADS": "1"},
        elastic=elastic,
        grace_seconds=GRACE if elastic else None,
    )


def high_job(resource_pkg: int) -> StandaloneJobSpec:
    return StandaloneJobSpec(
        task_name="urgent",
        code_path=str(INCLUDE),
        cmd="echo urgent job on GPUs $CUDA_VISIBLE_DEVICES",
        resource_pkg=resource_pkg,
        max_schedule=4,
    )


def wait_state(client: HaiClient, job_id: int, *states: str, timeout: float = TIMEOUT) -> JobView:
    """Long-poll until the job is in one of `states`."""
    deadline = time.monotonic() + timeout
    job: JobView = client.job(job_id)
    while job.state not in states:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"job {job_id} is {job.state} ({job.reason}), not {states}")
        job = client.wait(job_id, since_state=job.state, timeout=min(left, 10))
    return job


def running_instance(client: HaiClient, job_id: int) -> InstanceView:
    wait_state(client, job_id, "RUNNING")
    return client.instances(job_id)[-1]


def follow_until(client: HaiClient, instance_id: int, pattern: str) -> None:
    """Follow the instance's log until a line matches `pattern`; fails if the instance ends first."""
    wanted = re.compile(pattern)
    pending = ""
    # Returning drops the generator, which closes the stream.
    for chunk in client.follow_log(instance_id):
        *lines, pending = (pending + chunk).split("\n")
        for line in lines:
            if wanted.match(line):
                return
    raise AssertionError(f"instance {instance_id} ended before a line matching {pattern!r}")


def logged_steps(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"^step (\d+)/", log, re.MULTILINE)]


def resumed_from(log: str) -> int:
    found = re.search(r"^resumed from step (\d+) \(checkpoint-(\d+)\.pt\)$", log, re.MULTILINE)
    assert found is not None, log
    assert int(found[1]) == int(found[2])
    return int(found[1])


def checkpoint_step(path: str | None) -> int:
    assert path is not None
    found = re.fullmatch(r"checkpoint-(\d+)\.pt", Path(path).name)
    assert found is not None, path
    return int(found[1])


def newest_step(model: Path) -> int:
    found = Checkpointer(model).checkpoints()
    return checkpoint_step(str(found[0])) if found else -1


def metrics(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def assert_same_weights(model: Path, reference: Path) -> None:
    ours = torch.load(model / "final.pt", weights_only=True)
    theirs = torch.load(reference / "final.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "final weights differ"


def seconds(later: datetime | None, earlier: datetime | None) -> float:
    assert later is not None and earlier is not None
    return (later - earlier).total_seconds()


def transitions(client: HaiClient, job_id: int) -> list[str]:
    return [e.to_state for e in client.job(job_id).events if e.to_state and e.from_state != e.to_state]


STOPPED_AND_RESUMED = ["RUNNING", "SUSPENDING", "SUSPENDED", "STARTING", "RUNNING", "SUCCEEDED"]


def uninterrupted(jobs: Jobs, model: Path) -> Job:
    """The same training as a plain process nobody stops: the reference weights."""
    return jobs.start(INCLUDE / "train.py", *train_args(STEPS), "--model-dir", model, cwd=model.parent)


def preempted_then_resumed(
    lena: HaiClient, hugo: HaiClient, spec: StandaloneJobSpec
) -> tuple[InstanceView, InstanceView]:
    """Run the low job until it logged PREEMPT_AFTER, send the high job, and see both through.

    :return: the low job's preempted and resumed instances.
    """
    low = lena.submit(spec)
    first = running_instance(lena, low.id)
    follow_until(lena, first.id, rf"step {PREEMPT_AFTER}/")
    high = hugo.submit(high_job(resource_pkg=457))

    # SUSPENDED may last only as long as the high job runs: the events show it afterwards.
    done_high = wait_state(hugo, high.id, "SUCCEEDED", "FAILED")
    assert done_high.state == "SUCCEEDED", done_high.reason
    done = wait_state(lena, low.id, "SUCCEEDED", "FAILED")
    assert done.state == "SUCCEEDED", done.reason
    assert (done.instances, done.preemptions) == (2, 1)
    assert transitions(lena, low.id)[-6:] == STOPPED_AND_RESUMED

    killed, resumed = lena.instances(low.id)
    (ran_high,) = hugo.instances(high.id)
    assert (killed.end_reason, killed.preempted_by) == ("preempted", high.id)
    # The high job ran on the low job's GPUs, in the gap between its two instances.
    assert [p.gpus for p in ran_high.placement] == [p.gpus for p in killed.placement]
    assert seconds(ran_high.started_at, killed.ended_at) >= 0
    assert seconds(resumed.started_at, ran_high.ended_at) >= 0
    assert resumed.resume and resumed.end_reason == "completed"
    return killed, resumed


# ---- proof 1: a killed low-priority job resumes from its latest checkpoint ---------------------


def test_killed_low_job_resumes_from_its_latest_checkpoint_and_ends_bit_identical(
    node8: LiveServer, tmp_path: Path, jobs: Jobs
) -> None:
    reference = uninterrupted(jobs, tmp_path / "reference")
    model = tmp_path / "low"
    with node8.client("lena-token") as lena, node8.client("hugo-token") as hugo:
        killed, resumed = preempted_then_resumed(lena, hugo, low_train_job(model))
        assert killed.exit_code == -signal.SIGKILL  # not elastic: no notice, no grace
        before, after = lena.log(killed.id), lena.log(resumed.id)

    assert before.startswith("HAI_RESUME=0\n") and after.startswith("HAI_RESUME=1\n")
    reached = logged_steps(before)[-1]
    start = resumed_from(after)
    # What the kill cost is the steps since the newest checkpoint: the one at or below the step
    # reached, or the one before it when the kill cut short the save at the step reached.
    assert start in {reached // EVERY * EVERY, (reached - 1) // EVERY * EVERY}
    assert EVERY <= start <= reached < STEPS
    assert reached - start <= EVERY
    # The server passed the newest checkpoint written before its kill request; one finished in the
    # instant between that request and the kill is found by the job itself.
    assert checkpoint_step(resumed.checkpoint) <= start
    assert logged_steps(after) == list(range(start + 1, STEPS + 1))

    assert reference.wait(timeout=TIMEOUT) == 0, reference.describe()
    result, expected = metrics(model / "metrics.json"), metrics(tmp_path / "reference" / "metrics.json")
    assert result["resumed_from"] == start
    assert result["weights_sha256"] == expected["weights_sha256"]
    assert_same_weights(model, tmp_path / "reference")


# ---- proof 2: an elastic job saves on notice and loses nothing ---------------------------------


def elastic_job_loses_no_step(node8: LiveServer, tmp_path: Path, jobs: Jobs, exec_: bool) -> None:
    reference = uninterrupted(jobs, tmp_path / "reference")
    model = tmp_path / "low"
    with node8.client("lena-token") as lena, node8.client("hugo-token") as hugo:
        killed, resumed = preempted_then_resumed(lena, hugo, low_train_job(model, elastic=True, exec_=exec_))
        asked = next(e for e in lena.job(killed.job_id).events if e.kind == "suspending")
        before, after = lena.log(killed.id), lena.log(resumed.id)

    # Told to save, it saved and left on its own within the grace period instead of being killed.
    assert killed.exit_code == EXIT_SAVED_ON_NOTICE, before
    assert seconds(killed.ended_at, asked.at) < GRACE
    noticed = re.search(rf"preemption notice: step (\d+) saved; exiting with {EXIT_SAVED_ON_NOTICE}", before)
    assert noticed is not None, before
    saved = int(noticed[1])
    assert PREEMPT_AFTER <= saved < STEPS
    assert logged_steps(before)[-1] == saved

    # Zero steps lost: the resumed instance starts at the step saved on notice.
    assert after.startswith("HAI_RESUME=1\n")
    assert resumed_from(after) == saved == checkpoint_step(resumed.checkpoint)
    assert logged_steps(after) == list(range(saved + 1, STEPS + 1))

    assert reference.wait(timeout=TIMEOUT) == 0, reference.describe()
    result, expected = metrics(model / "metrics.json"), metrics(tmp_path / "reference" / "metrics.json")
    assert result["resumed_from"] == saved
    assert result["weights_sha256"] == expected["weights_sha256"]
    assert_same_weights(model, tmp_path / "reference")


def test_elastic_low_job_saves_on_notice_and_loses_no_step(
    node8: LiveServer, tmp_path: Path, jobs: Jobs
) -> None:
    elastic_job_loses_no_step(node8, tmp_path, jobs, exec_=True)


def test_elastic_low_job_started_through_a_shell_saves_on_notice(
    node8: LiveServer, tmp_path: Path, jobs: Jobs
) -> None:
    elastic_job_loses_no_step(node8, tmp_path, jobs, exec_=False)


# ---- proof 4: a distributed job is suspended and resumed as a whole ----------------------------


def uninterrupted_ranks(jobs: Jobs, model: Path) -> list[Job]:
    """The same 2-rank training as plain processes with the rank variables the platform sets."""
    port = str(free_port())
    return [
        jobs.start(
            INCLUDE / "train_distributed.py",
            *train_args(DISTRIBUTED_STEPS),
            "--model-dir",
            model,
            cwd=model.parent,
            RANK=str(r),
            LOCAL_RANK="0",
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            CUDA_VISIBLE_DEVICES="",
        )
        for r in range(2)
    ]


def test_distributed_job_is_suspended_and_resumed_with_identical_weights_on_both_ranks(
    tmp_path: Path, jobs: Jobs
) -> None:
    reference = uninterrupted_ranks(jobs, tmp_path / "reference")
    model = tmp_path / "low"
    # torch.distributed even where Horovod is installed: the reference ranks above use it.
    args = " ".join([*train_args(DISTRIBUTED_STEPS), "--step-sleep", str(STEP_SLEEP), "--backend", "torch"])
    spec = DistributedJobSpec(
        task_name="low distributed",
        code_path=str(INCLUDE),
        cmd=f"exec python3 train_distributed.py {args}",
        workers=2,
        worker_resource_pkg=454,
        model_dir=str(model),
        env={"OMP_NUM_THREADS": "1"},
    )
    with (
        start_server(tmp_path / "hai", server_config(nodes=2, gpus_per_node=1)) as server,
        server.client("lena-token") as lena,
        server.client("hugo-token") as hugo,
    ):
        low = lena.submit(spec)
        first = running_instance(lena, low.id)
        assert sorted((p.node, p.gpus) for p in first.placement) == [("node1", (0,)), ("node2", (0,))]
        # The job logs no steps; rank 0's first checkpoint says it is under way.
        wait_for(lambda: newest_step(model) >= EVERY, TIMEOUT, "rank 0's first checkpoint")
        high = hugo.submit(high_job(resource_pkg=454))

        assert wait_state(hugo, high.id, "SUCCEEDED", "FAILED").state == "SUCCEEDED"
        done = wait_state(lena, low.id, "SUCCEEDED", "FAILED")
        assert done.state == "SUCCEEDED", done.reason
        killed, resumed = lena.instances(low.id)
        assert (killed.end_reason, killed.preempted_by) == ("preempted", high.id)
        assert killed.exit_code == -signal.SIGKILL
        assert resumed.resume and len(resumed.placement) == 2
        assert transitions(lena, low.id)[-6:] == STOPPED_AND_RESUMED

    finals = [metrics(model / f"final-rank{r}.json") for r in range(2)]
    start = finals[0]["resumed_from"]
    assert [f["resumed_from"] for f in finals] == [start, start]
    assert EVERY <= start < DISTRIBUTED_STEPS and start % EVERY == 0
    assert checkpoint_step(resumed.checkpoint) <= start
    assert finals[0]["weights_sha256"] == finals[1]["weights_sha256"]
    assert {f["collective"] for f in finals} == {"torch.distributed"}

    for rank in reference:
        assert rank.wait(timeout=TIMEOUT) == 0, rank.describe()
    expected = metrics(tmp_path / "reference" / "final-rank0.json")
    assert finals[0]["weights_sha256"] == expected["weights_sha256"]
    assert_same_weights(model, tmp_path / "reference")
