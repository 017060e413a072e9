"""The launch path: what it carries from the claim to the outcome's write is plain values (each session
reads its own rows), and what `hai res` says can start is what the planner's fit question says."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import pytest

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import Admit, Job, Node, Quota, Snapshot
from hai_airflow.server.control.admission import NewInstance
from hai_airflow.server.store.tables import Base, InstanceRow, JobRow
from hai_airflow.spec import JobState
from tests.server.conftest import Api

TENTH_OF_A_CPU = """
[[resource_packages]]
id = 600
name = "a tenth of a CPU"
gpu_type = "V100"
gpus = 0
cpus = 0.1
memory_gb = 0.5
"""


def test_a_launch_carries_no_store_row_from_the_claim_to_the_outcome(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = api.with_controller()
    launched: list[NewInstance] = []
    start: Callable[[list[NewInstance]], None] = controller.applier._start

    def recording(news: list[NewInstance]) -> None:
        launched.extend(news)
        start(news)

    monkeypatch.setattr(controller.applier, "_start", recording)
    job = api.submit(cmd="sleep 30")
    api.until_state(job["id"], "RUNNING")
    (instance,) = api.get(f"/jobs/{job['id']}/instances").json()

    (new,) = launched
    rows = [f.name for f in fields(new) if isinstance(getattr(new, f.name), Base | tuple)]
    assert rows == [], "ORM rows belong to the session that read them"
    assert (new.job_id, new.instance_id) == (job["id"], instance["id"])
    with api.ctx.store.read() as s:  # what the outcome's own session wrote
        inst, row = s.get(InstanceRow, new.instance_id), s.get(JobRow, new.job_id)
        assert inst is not None and row is not None
        assert inst.handle and inst.started_at is not None and inst.credential_hash
        assert row.state == JobState.RUNNING and row.started_at == inst.started_at


def test_what_can_start_is_what_the_planner_would_start(api_factory: Callable[..., Api]) -> None:
    api = api_factory(TENTH_OF_A_CPU)
    packages = {p["id"]: p["startable_now"] for p in api.get("/resource-packages").json()}
    # node1's 64 CPUs hold 640 workers of 0.1 CPU (memory holds 1024): 64 // 0.1 is 639.0 in floats.
    assert packages[600] == 640
    assert (packages[454], packages[455], packages[457]) == (8, 4, 1)

    node = Node("node1", "V100", 8, 64, 512)
    waiting = [
        Job(i, "alice", "vision", JobState.PENDING, 0, 0.0, cpus_per_worker=0.1, memory_gb_per_worker=0.5)
        for i in range(1, 642)
    ]
    snapshot = Snapshot(nodes=(node,), jobs=tuple(waiting), quota=Quota())
    admitted = [d for d in plan(snapshot, 0.0) if isinstance(d, Admit)]
    assert len(admitted) == packages[600]
