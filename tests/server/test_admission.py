"""Claiming a wave of admitted jobs in one transaction, on both stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from hai_airflow.scheduling.model import Admit, WorkerPlacement
from hai_airflow.server.config import parse_config
from hai_airflow.server.control import admission
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.provision import apply_config
from hai_airflow.server.store import changes
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import EventRow, InstanceRow, JobRow, ReservationRow
from hai_airflow.spec import StandaloneJobSpec
from tests.server.test_submission import _row
from tests.support.live_server import TEST_CONFIG


@pytest.fixture
def ctx(db_url: str, tmp_path: Path) -> Iterator[ServerContext]:
    store = Store(db_url)
    store.migrate()
    config = parse_config(TEST_CONFIG)
    apply_config(store, config, list(config.nodes))
    yield ServerContext(store=store, config=config, home=tmp_path)
    store.dispose()


def test_a_wave_is_claimed_together_and_a_job_that_stopped_waiting_is_left_alone(ctx: ServerContext) -> None:
    with ctx.store.write() as s:
        fresh, back, cancelled = (_row(state, False, cancel, ("alice", "vision"), 1) for state, cancel in
                                  (("PENDING", False), ("SUSPENDED", False), ("PENDING", True)))
        back.suspended_at, back.instance_count = 100.0, 1
        s.add_all([fresh, back, cancelled])
        s.flush()
        s.add(ReservationRow(job_id=back.id, node="node1", gpus="[0, 1]", created_at=0.0))
        ids = fresh.id, back.id, cancelled.id
    with ctx.store.read() as s:
        seen = changes.newest(s)
    spec = StandaloneJobSpec(task_name="t", code_path="/tmp", cmd="true", resource_pkg=454)
    on = (WorkerPlacement("node1", (0, 1)),)
    with ctx.store.write() as s:
        rows = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
        wave = [(rows[i], spec, Admit(i, on, False, "fits")) for i in ids]
        wave.append((None, spec, Admit(0, on, False, "a job deleted meanwhile")))
        news = admission.claim(s, ctx, wave, "me")
    assert [n.job_id for n in news] == [ids[0], ids[1]]
    assert [n.job.resume for n in news] == [False, True]  # the suspended job had run before
    with ctx.store.read() as s:
        jobs = {i: s.get(JobRow, i) for i in ids}
        insts = {i.job_id: i for i in s.scalars(select(InstanceRow))}
        admitted = s.scalars(select(EventRow.job_id).where(EventRow.kind == "admitted")).all()
        reserved = s.scalars(select(ReservationRow)).all()
        fed = {c.job_id for c in changes.since(s, seen)}
    for new in news:
        job, inst = jobs[new.job_id], insts[new.job_id]
        assert job is not None and job.state == "STARTING"
        assert job.current_instance_id == inst.id == new.instance_id
        assert inst.controller == "me" and json.loads(inst.placement)[0]["gpus"] == [0, 1]
        assert inst.work_dir == str(ctx.jobs_dir(job.id) / "instances" / str(inst.id))
        assert inst.model_dir == str(ctx.jobs_dir(job.id) / "model")
    resumed, left = jobs[ids[1]], jobs[ids[2]]
    assert resumed is not None and resumed.suspended_seconds > 0 and resumed.instance_count == 2
    assert left is not None and left.state == "PENDING" and ids[2] not in insts
    assert sorted(admitted) == sorted(ids[:2])
    assert reserved == []  # the reservation the suspended job held is used up
    assert fed == set(ids[:2])  # the controller's feed hears of both, and of nothing else
