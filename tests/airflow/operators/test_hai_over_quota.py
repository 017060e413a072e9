"""on_over_quota: wait (deferred and blocking), fail, downgrade, for a user whose quota is taken."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from hai_airflow.spec import JobView, StandaloneJobSpec
from tests.airflow.helpers import load_dag, task_states, wait_for, xcom
from tests.support.live_server import LiveServer


@pytest.fixture
def alice_over_quota(hai_conn: Callable[..., LiveServer]) -> Iterator[Callable[[str], JobView]]:
    """Alice (group vision) with a 2-GPU personal quota; `block(cmd)` fills it with a high-priority job."""
    server = hai_conn("alice-token")
    with server.client() as admin:
        admin.set_user_quota("alice", 2)

    def block(cmd: str) -> JobView:
        with server.client("alice-token") as alice:
            job = alice.submit(
                StandaloneJobSpec(
                    task_name="blocker", code_path="/tmp", cmd=cmd, resource_pkg=455, max_schedule=4
                )
            )
            assert alice.check_high_priority(1)["allowed"] is False
            return job

    yield block


def jobs_of(server: LiveServer, task_name: str) -> list[JobView]:
    with server.client() as client:
        return [j for j in client.jobs(all=True) if j.task_name == task_name]


def test_fail(
    alice_over_quota: Callable[[str], JobView], hai_server: LiveServer, capfd: pytest.CaptureFixture[str]
) -> None:
    alice_over_quota("sleep 60")
    run = load_dag("hai_over_quota_fail").test()

    assert task_states(run) == {"train": "failed"}
    assert "high-priority quota does not cover 1 GPUs" in capfd.readouterr().out
    assert jobs_of(hai_server, "hai_over_quota_fail.train") == []


def test_downgrade(
    alice_over_quota: Callable[[str], JobView], hai_server: LiveServer, capfd: pytest.CaptureFixture[str]
) -> None:
    alice_over_quota("sleep 60")
    run = load_dag("hai_over_quota_downgrade").test(run_conf={"cmd": "echo trained"})

    assert task_states(run) == {"train": "success"}
    assert xcom(run, "train")["priority"] == "low"
    (job,) = jobs_of(hai_server, "hai_over_quota_downgrade.train")
    assert (job.max_schedule, job.state) == (0, "SUCCEEDED")
    assert "submitting as low priority" in capfd.readouterr().out


@pytest.mark.parametrize(
    "dag_id", ["hai_over_quota_wait", "hai_over_quota_wait_blocking"], ids=["deferred", "blocking"]
)
def test_wait_then_submit_as_high(
    alice_over_quota: Callable[[str], JobView], hai_server: LiveServer, dag_id: str
) -> None:
    blocker = alice_over_quota("sleep 4")
    run = load_dag(dag_id).test(run_conf={"cmd": "echo trained"})

    assert task_states(run) == {"train": "success"}
    assert xcom(run, "train")["priority"] == "high"
    (job,) = jobs_of(hai_server, f"{dag_id}.train")
    with hai_server.client() as client:
        ended = wait_for(client, blocker.id, lambda j: j.ended_at is not None)
    assert job.max_schedule == 4 and job.priority == "high"
    assert ended.ended_at is not None and job.submitted_at >= ended.ended_at, (
        "submitted before the quota freed"
    )
