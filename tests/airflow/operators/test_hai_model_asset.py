"""The operators declare the job's model dir as an outlet asset and, on success, emit its event
with the newest checkpoint and its step; cancel_on_kill off leaves the job alone."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from hai_airflow.assets import model_asset
from hai_airflow.operators.cpu import HaiCpuJobOperator
from hai_airflow.spec import CpuJobSpec
from tests.airflow.helpers import load_dag, task_states
from tests.support.live_server import LiveServer

MODEL_DIR = "/tmp/hai-airflow-test-model"


def test_a_literal_model_dir_is_an_outlet_and_a_templated_one_is_not() -> None:
    literal = HaiCpuJobOperator(task_id="a", code_path="/tmp", cmd="true", model_dir="/nas/m")
    templated = HaiCpuJobOperator(task_id="b", code_path="/tmp", cmd="true", model_dir="{{ params.dir }}")
    assert model_asset("/nas/m") in literal.outlets
    assert templated.outlets == []


def test_success_emits_the_newest_checkpoint_and_its_step(hai_conn: Callable[..., LiveServer]) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    hai_conn()
    shutil.rmtree(MODEL_DIR, ignore_errors=True)
    cmd = 'mkdir -p "$HAI_MODEL_DIR" && echo w > "$HAI_MODEL_DIR/checkpoint-00000120.pt"'
    run = load_dag("hai_model_asset").test(run_conf={"cmd": cmd})

    assert task_states(run) == {"stage": "success"}
    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.name == f"hai-model:{MODEL_DIR}", AssetEvent.source_run_id == run.run_id)
        ).all()
        extras = [e.extra for e in events]
    assert extras == [{"path": str(Path(MODEL_DIR) / "checkpoint-00000120.pt"), "step": 120}]


def test_cancel_on_kill_off_leaves_the_job_running(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    op = HaiCpuJobOperator(task_id="stage", code_path="/tmp", cmd="sleep 60", cancel_on_kill=False)
    with server.client() as client:
        job = client.submit(CpuJobSpec(task_name="kept", code_path="/tmp", cmd="sleep 60"))
        op._job_id = job.id
        op.on_kill()
        assert client.job(job.id).state not in ("CANCELLED", "CANCELLING")
        client.cancel(job.id)
