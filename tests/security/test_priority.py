"""Quota covers every resource a job can take at high priority: a CPU job is always low priority.

The high-priority quota counts GPUs, so it could not bound a CPU job: bob, whose quota is 0, got a
60-core CPU job accepted as high priority, and it suspended dave's 8-GPU job. Refused at submission
and at promotion alike, through the CLI as a user would; the planner never lets a CPU job suspend
another (tests/scheduling/test_plan.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hai_airflow.spec import CpuJobSpec
from tests.security.cli import hai
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "hai", TEST_CONFIG, store_env).start() as live:
        with live.client() as admin:
            admin.set_user_quota("bob", 0)
        yield live


def test_a_high_priority_cpu_job_is_refused_naming_the_field(server: LiveServer, tmp_path: Path) -> None:
    submit = ("submit", "cpu", "--name", "sixty cores", "--code-dir", str(tmp_path), "--cpus", "60")
    refused = hai(server, "bob", *submit, "--max-schedule", "4", "sleep 600")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "max_schedule" in refused.stderr and "a CPU job is always low priority" in refused.stderr
    assert "Traceback" not in refused.stderr

    # not a matter of quota: a platform admin with no limit is refused the same way
    body = CpuJobSpec(task_name="x", code_path=str(tmp_path), cmd="true", max_schedule=24)
    answer = httpx.post(
        f"{server.url}/api/v1/jobs",
        json={"spec": body.model_dump(mode="json")},
        headers={"Authorization": f"Bearer {TOKENS['admin']}"},
        timeout=30,
    )
    assert answer.status_code == 422 and answer.json()["field"] == "spec.max_schedule", answer.text
    with server.client() as admin:
        assert admin.jobs(all=True) == []

    low = hai(server, "bob", *submit, "--max-schedule", "0", "sleep 600")
    assert low.returncode == 0, low.stderr


def test_a_cpu_job_cannot_be_promoted(server: LiveServer, tmp_path: Path) -> None:
    with server.client(TOKENS["dave"]) as dave:
        job = dave.submit(CpuJobSpec(task_name="prep", code_path=str(tmp_path), cmd="sleep 600"))
    promoted = hai(server, "dave", "promote", str(job.id), "--max-schedule", "4")
    assert promoted.returncode != 0
    assert "a CPU job is always low priority" in promoted.stderr and "Traceback" not in promoted.stderr
    with server.client(TOKENS["dave"]) as dave:
        assert dave.job(job.id).priority == "low"
        dave.cancel(job.id)
