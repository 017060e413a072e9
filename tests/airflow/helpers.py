"""Helpers of the Airflow tests: the server config, connections, example DAGs, task states, XComs."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hai_airflow.client import HaiClient
from hai_airflow.spec import JobView
from tests.support.live_server import TEST_CONFIG, LiveServer

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "include"
TEST_DAGS = Path(__file__).resolve().parent / "dag_files"
SERVICE_TOKEN = "airflow-token"
AIRFLOW_SERVICE = f"""
[[users]]
name = "airflow"
group = "default"
token = "{SERVICE_TOKEN}"
acts_for = ["group:vision"]
"""
"""Airflow's service identity: it acts for the members of vision (alice, bob, carol), not dave (nlp)."""
HAI_CONFIG = TEST_CONFIG + AIRFLOW_SERVICE + f'\n[backend]\nimages = {{ local = "{sys.prefix}" }}\n'
"""The shared test config, with image `local` running jobs in this interpreter's environment
(so `python3 train.py` finds torch)."""


STANDALONE_FORM = {
    "mode": "standalone",
    "image": "local",
    "resource_pkg": 454,
    "gpu_type": "V100",
    "code_src": "nas",
    "code_path": str(INCLUDE),
}
"""`hai_submit_training`'s form for a 1-GPU job of the include/ scripts (add task_name, cmd)."""
DAG_TEST_USER = "dag_test"
"""The triggering user Airflow gives every `dag.test()` run."""


def connection_json(
    server: LiveServer, token: str | None = None, user_map: dict[str, str] | None = None
) -> str:
    """`AIRFLOW_CONN_HAI_DEFAULT`'s value for the server as the token's user (default: the admin).

    `dag.test()` runs are triggered by "dag_test", so unless `user_map` says otherwise they act
    for the token's own user (`<name>-token` belongs to `<name>`).
    """
    token_user = (token or "admin-token").removesuffix("-token")
    mapping = {DAG_TEST_USER: token_user} if user_map is None else user_map
    return json.dumps(
        {
            "conn_type": "hai",
            "host": server.url,
            "password": token or server.token,
            "extra": json.dumps({"user_map": mapping}),
        }
    )


def load_dag(name: str, folder: Path = REPO / "dags") -> Any:
    """The DAG `name`, from `<folder>/<name>.py` (an example DAG) or from the test DAG files."""
    path = folder / f"{name}.py"
    if not path.exists():
        path = TEST_DAGS / "hai_test_dags.py"
    spec = importlib.util.spec_from_file_location(f"hai_dags_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dags = {value.dag_id: value for value in vars(module).values() if type(value).__name__ == "DAG"}
    return dags[name]


def task_states(dag_run: Any) -> dict[str, str | None]:
    """task id -> final state of a `dag.test()` run."""
    return {ti.task_id: (str(ti.state) if ti.state else None) for ti in dag_run.get_task_instances()}


def xcom(dag_run: Any, task_id: str, key: str = "return_value") -> Any:
    """A task's XCom, read back from Airflow's database."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key)
        ).first()
        assert row is not None, f"no XCom {key!r} of {task_id}"
        return XComModel.deserialize_value(row)


def wait_for(client: HaiClient, job_id: int, done: Callable[[JobView], bool], timeout: float = 60) -> JobView:
    """Long-poll the job until `done(job)`; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    job = client.job(job_id)
    while not done(job):
        assert time.monotonic() < deadline, f"job {job_id} stuck in {job.state}: {job.reason}"
        job = client.wait(job_id, since_state=job.state, timeout=5)
    return job
