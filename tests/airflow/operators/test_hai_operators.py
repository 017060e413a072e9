"""The job operators in real Airflow runs (`dag.test()`) against a live server."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from hai_airflow.operators.cpu import HaiCpuJobOperator
from hai_airflow.operators.distributed import HaiDistributedTrainingOperator
from hai_airflow.operators.job import default_deferrable
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from hai_airflow.operators.submission import client_key
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec
from tests.airflow.helpers import load_dag, task_states, wait_for, xcom
from tests.support.live_server import LiveServer


def manual_run_id(when: datetime) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    return DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=when, run_after=when)


def test_deferrable_defaults_to_operators_default_deferrable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_deferrable() is False, "Airflow's own default"
    assert HaiCpuJobOperator(task_id="t", code_path="/tmp", cmd="true").deferrable is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert HaiCpuJobOperator(task_id="t", code_path="/tmp", cmd="true").deferrable is True
    assert HaiCpuJobOperator(task_id="u", code_path="/tmp", cmd="true", deferrable=False).deferrable is False


RENAMED = {"time_limit_seconds": "time_limit"}
"""Spec fields whose argument takes more than the field: a time limit is a timedelta or `4h` too."""


def test_every_spec_field_is_an_argument() -> None:
    for operator, spec in (
        (HaiCpuJobOperator, CpuJobSpec),
        (HaiStandaloneTrainingOperator, StandaloneJobSpec),
        (HaiDistributedTrainingOperator, DistributedJobSpec),
    ):
        arguments = set()
        for cls in operator.__mro__:
            if "__init__" in vars(cls):
                arguments |= set(inspect.signature(cls.__init__).parameters)
        fields = {RENAMED.get(f, f) for f in spec.model_fields}
        assert fields - {"mode"} <= arguments, operator.__name__


def test_non_deferrable_run_waits_with_the_long_poll(
    hai_conn: Callable[..., LiveServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = hai_conn()
    run = load_dag("hai_blocking").test(run_conf={"cmd": "echo one; sleep 1; echo two"})

    assert task_states(run) == {"stage": "success"}
    result = xcom(run, "stage")
    assert result["state"] == "SUCCEEDED" and result["instances"] == 1
    assert xcom(run, "stage", key="hai_job_id") == result["job_id"]
    out = capfd.readouterr().out
    assert "-> RUNNING" in out and "-> SUCCEEDED" in out and "two" in out
    with server.client() as client:
        assert client.job(result["job_id"]).client_key == client_key("hai_blocking", "stage", run.run_id, -1)


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "blocking"])
def test_failed_job_fails_the_task_with_its_reason_and_log(
    hai_conn: Callable[..., LiveServer], capfd: pytest.CaptureFixture[str], deferrable: bool
) -> None:
    hai_conn()
    dag = load_dag("hai_deferred" if deferrable else "hai_blocking")
    run = dag.test(run_conf={"cmd": "echo 'CUDA went boom'; exit 3"})

    assert task_states(run) == {"stage": "failed"}
    out = capfd.readouterr().out
    assert "ended FAILED" in out and "CUDA went boom" in out


def test_a_retry_reattaches_to_the_job_of_the_earlier_try(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    dag = load_dag("hai_reattach")
    when = datetime(2026, 5, 1, 12, tzinfo=UTC)
    key = client_key("hai_reattach", "stage", manual_run_id(when), -1)
    with server.client() as client:
        # what an earlier try left behind: it submitted, then its worker died
        earlier = client.submit(
            CpuJobSpec(task_name="earlier try", code_path="/tmp", cmd="sleep 3; echo done"), key
        )

        first = dag.test(run_after=when, logical_date=when)
        assert task_states(first) == {"stage": "success"}
        assert xcom(first, "stage")["job_id"] == earlier.id

        # clearing the task runs a new try of the same task instance: the succeeded job is reused
        again = dag.test(run_after=when, logical_date=when)
        assert again.run_id == first.run_id
        assert xcom(again, "stage")["job_id"] == earlier.id
        assert [j.id for j in client.jobs(all=True)] == [earlier.id]


def test_a_retry_after_a_failed_job_submits_a_new_one(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    dag = load_dag("hai_resubmit")
    when = datetime(2026, 5, 2, 12, tzinfo=UTC)
    key = client_key("hai_resubmit", "stage", manual_run_id(when), -1)
    with server.client() as client:
        failed = client.submit(CpuJobSpec(task_name="earlier try", code_path="/tmp", cmd="exit 1"), key)
        wait_for(client, failed.id, lambda j: j.state == "FAILED")

        run = dag.test(run_after=when, logical_date=when)
        assert task_states(run) == {"stage": "success"}
        new = client.job(xcom(run, "stage")["job_id"])
    assert new.id != failed.id and new.client_key == f"{key}#2" and new.state == "SUCCEEDED"


def test_on_kill_cancels_the_job(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    op = HaiCpuJobOperator(task_id="stage", code_path="/tmp", cmd="sleep 60", deferrable=False)
    op.on_kill()  # nothing submitted yet: nothing to cancel
    with server.client() as client:
        job = client.submit(CpuJobSpec(task_name="killed", code_path="/tmp", cmd="sleep 60"))
        op._job_id = job.id  # what execute() records once it has submitted or re-attached
        op.on_kill()
        assert wait_for(client, job.id, lambda j: j.state == "CANCELLED").state == "CANCELLED"


def test_bad_spec_fails_without_submitting(
    hai_conn: Callable[..., LiveServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = hai_conn()
    run = load_dag("hai_bad_spec").test()

    assert task_states(run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "no resource package has 16 x any GPU" in out
    with server.client() as client:
        assert client.jobs(all=True) == []
