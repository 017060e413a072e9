"""Every example DAG, run with `dag.test()` against a live `hai serve`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hai_airflow.spec import StandaloneJobSpec
from tests.airflow.helpers import INCLUDE, REPO, load_dag, task_states, wait_for, xcom
from tests.support.live_server import LiveServer

EXAMPLE_DAGS = {"cpu_gpu_pipeline", "distributed_training", "hai_submit_training", "checkpoint_evaluation"}


def test_dags_folder_imports_without_errors() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) >= EXAMPLE_DAGS


def test_cpu_gpu_pipeline(hai_conn: Callable[..., LiveServer], tmp_path: Path) -> None:
    server = hai_conn()
    dag = load_dag("cpu_gpu_pipeline")
    run = dag.test(run_conf={"steps": 30, "ckpt_every": 10, "data_dir": str(tmp_path)})

    assert task_states(run) == {"preprocess": "success", "train": "success", "evaluate": "success"}
    result = xcom(run, "train")
    metrics = xcom(run, "evaluate")
    assert result["state"] == "SUCCEEDED" and result["priority"] == "low"
    assert Path(result["metrics_path"]).parent.parent == tmp_path
    assert metrics["steps"] == 30 and metrics["job_id"] == result["job_id"]
    assert json.loads(Path(result["metrics_path"]).read_text())["loss"] == metrics["loss"]
    with server.client() as client:
        jobs = {j.task_name: j for j in client.jobs(all=True)}
    assert jobs["cpu_gpu_pipeline.preprocess"].mode == "cpu"
    assert jobs["cpu_gpu_pipeline.train"].gpus == 1
    assert jobs["cpu_gpu_pipeline.train"].latest_checkpoint is not None
    assert all(j.state == "SUCCEEDED" for j in jobs.values())


def test_distributed_training(hai_conn: Callable[..., LiveServer], tmp_path: Path) -> None:
    server = hai_conn()
    dag = load_dag("distributed_training")
    run = dag.test(run_conf={"steps": 20, "ckpt_every": 10, "data_dir": str(tmp_path)})

    assert task_states(run) == {"train": "success", "report": "success"}
    result = xcom(run, "train")
    with server.client() as client:
        job = client.job(result["job_id"])
    assert (job.mode, job.workers, job.gpus) == ("distributed", 2, 2)
    assert xcom(run, "report")["steps"] == 20


def test_hai_submit_training_form_submits_a_standalone_job(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    dag = load_dag("hai_submit_training")
    form = {
        "task_name": "网页提交 web-submit",
        "mode": "standalone",
        "image": "local",
        "resource_pkg": 455,
        "gpu_type": "V100",
        "code_src": "nas",
        "code_path": str(INCLUDE),
        "cmd": "python3 train.py --steps 10 --ckpt-every 5",
    }
    run = dag.test(run_conf=form)

    assert task_states(run) == {
        "check_form": "success",
        "submit_standalone": "success",
        "submit_distributed": "skipped",
        "submit_cpu": "skipped",
    }
    with server.client() as client:
        (job,) = client.jobs(all=True)
    assert (job.task_name, job.mode, job.gpus, job.state) == (
        "网页提交 web-submit",
        "standalone",
        2,
        "SUCCEEDED",
    )
    assert job.spec["resource_pkg"] == 455 and job.spec["code_path"] == str(INCLUDE)
    assert job.spec["processes"] == "per-worker"


def test_hai_submit_training_form_offers_the_processes_choice() -> None:
    param = load_dag("hai_submit_training").params.get_param("processes")
    assert param.value is None
    assert param.schema["enum"] == [None, "per-gpu", "per-worker"]
    assert set(param.schema["values_display"]) == {None, "per-gpu", "per-worker"}


def test_hai_submit_training_form_passes_the_processes_choice(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    form = {
        "task_name": "bring-your-own-launcher",
        "mode": "distributed",
        "workers": 2,
        "worker_resource_pkg": 455,
        "processes": "per-worker",
        "code_path": str(INCLUDE),
        "cmd": "true",
    }
    run = load_dag("hai_submit_training").test(run_conf=form)

    assert task_states(run)["submit_distributed"] == "success"
    with server.client() as client:
        (job,) = client.jobs(all=True)
    assert (job.mode, job.workers, job.gpus) == ("distributed", 2, 4)
    assert job.spec["processes"] == "per-worker"


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        pytest.param({"task_name": "x" * 201}, "task_name", id="task name too long"),
        pytest.param({"mode": "cluster"}, "mode", id="unknown mode"),
        pytest.param({"resource_pkg": 999}, "resource_pkg", id="package not in the dropdown"),
        pytest.param({"workers": 0}, "workers", id="no workers"),
        pytest.param({"processes": "per-node"}, "processes", id="unknown processes choice"),
        pytest.param({"gpu_type": "A100"}, "gpu_type", id="GPU type no package has"),
        pytest.param({"max_schedule": 5}, "max_schedule", id="queueing hours not offered"),
        pytest.param(
            {"project_storage": "10111;10222"}, "project_storage", id="storages not comma-separated"
        ),
        pytest.param({"shm": 0}, "shm", id="no shared memory"),
    ],
)
def test_hai_submit_training_form_is_validated(
    conf: dict[str, object], field: str, hai_conn: Callable[..., LiveServer]
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"param {field}"):
        load_dag("hai_submit_training").test(run_conf=conf)


def test_checkpoint_evaluation_is_scheduled_on_the_watched_model_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    from hai_airflow.triggers.checkpoint import HaiCheckpointWatchTrigger

    monkeypatch.setenv("HAI_EVAL_MODEL_DIR", "/nas/models/classifier")
    dag = load_dag("checkpoint_evaluation")

    asset = dag.timetable.asset_condition
    assert (asset.name, asset.uri) == ("hai-model:/nas/models/classifier", "file:///nas/models/classifier")
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, HaiCheckpointWatchTrigger)
    assert watcher.trigger.model_dir == "/nas/models/classifier" and watcher.trigger.job_id is None
    # one task scores every checkpoint of the run's asset events: no unrolled sensors
    assert set(dag.task_ids) == {"new_checkpoints", "evaluate"}


def test_checkpoint_evaluation_scores_what_the_watcher_reports(
    hai_conn: Callable[..., LiveServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    server = hai_conn()
    model_dir = tmp_path / "models"
    monkeypatch.setenv("HAI_EVAL_MODEL_DIR", str(model_dir))
    dag = load_dag("checkpoint_evaluation")
    with server.client() as client:
        job = client.submit(
            StandaloneJobSpec(
                task_name="long-training",
                code_path=str(INCLUDE),
                cmd="python3 train.py --steps 20 --ckpt-every 10 --keep 20",
                resource_pkg=454,
                model_dir=str(model_dir),
            )
        )
        wait_for(client, job.id, lambda j: j.state == "SUCCEEDED", timeout=120)

    async def first_event() -> dict[str, object]:
        async for event in dag.timetable.asset_condition.watchers[0].trigger.run():
            return dict(event.payload)
        raise AssertionError("the watcher ended")

    reported = asyncio.run(asyncio.wait_for(first_event(), 60))
    assert reported["job_id"] == job.id and str(reported["checkpoint"]).startswith(str(model_dir))

    checkpoint = str(model_dir / "checkpoint-00000010.pt")
    run = dag.test(run_conf={"checkpoint": checkpoint})
    assert task_states(run) == {"new_checkpoints": "success", "evaluate": "success"}
    scored = xcom(run, "evaluate")  # map index 0, the only one
    assert scored["checkpoint"] == checkpoint and scored["step"] == 10 and scored["loss"] > 0


def test_checkpoint_evaluation_without_a_checkpoint_skips() -> None:
    run = load_dag("checkpoint_evaluation").test()
    assert task_states(run)["new_checkpoints"] == "skipped"
