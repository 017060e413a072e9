"""/metrics: scraped with an admin's token after a real preemption, parsed with Prometheus's own parser."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hai_airflow.server.store.tables import InstanceRow, JobRow
from tests.server.conftest import Api
from tests.server.scripts import TRAIN
from tests.support.live_server import TOKENS

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(api: Api) -> Samples:
    r = api.http.get("/metrics", headers={"Authorization": f"Bearer {TOKENS['admin']}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_metrics_after_a_preemption(api: Api) -> None:
    (api.code / "train.py").write_text(TRAIN)
    controller = api.with_controller()
    victim = api.submit(cmd="python3 train.py 60", resource_pkg=456)
    api.until_state(victim["id"], "RUNNING")
    time.sleep(0.3)
    other = api.submit(user="bob", cmd="python3 train.py 60", resource_pkg=456)
    api.until_state(other["id"], "RUNNING")
    api.until(lambda: api.job(victim["id"])["latest_checkpoint"] is not None, what="checkpoint seen")
    waiting = api.submit(user="admin", cmd="python3 train.py 60", resource_pkg=457)  # low: never preempts
    time.sleep(1)  # work after the checkpoint, lost when the victim is killed

    high = api.submit(user="dave", cmd="python3 train.py 60", resource_pkg=456, max_schedule=4)
    api.until_state(victim["id"], "SUSPENDED", timeout=5)
    api.until_state(high["id"], "RUNNING", timeout=5)
    for _ in range(3):
        api.step()
    assert api.job(victim["id"])["state"] == "SUSPENDED"
    assert api.job(waiting["id"])["state"] == "PENDING"

    m = scrape(api)
    assert value(m, "hai_queued_jobs", priority="low", group="vision") == 1
    assert value(m, "hai_queued_jobs", priority="low", group="default") == 1
    assert value(m, "hai_queued_jobs", priority="high", group="nlp") is None
    assert value(m, "hai_gpus_allocated", gpu_type="V100") == 8
    assert value(m, "hai_gpus_free", gpu_type="V100") == 0
    assert value(m, "hai_admissions_total") == 3
    assert value(m, "hai_resumes_total") == 0
    assert value(m, "hai_suspensions_total", reason="preempted") == 1
    first = api.get(f"/jobs/{victim['id']}/instances").json()[0]
    with api.ctx.store.read() as s:
        job, inst = s.get(JobRow, victim["id"]), s.get(InstanceRow, first["id"])
        assert job is not None and inst is not None
        assert inst.ended_at is not None and inst.started_at is not None
        assert job.latest_checkpoint_at is not None
        lost = (inst.ended_at - max(inst.started_at, job.latest_checkpoint_at)) * 4  # 4 GPUs
    assert lost > 4, "the victim ran over a second past its checkpoint"
    assert value(m, "hai_lost_gpu_seconds_total") == pytest.approx(lost)
    assert value(m, "hai_controller_lease_holder", holder=controller.me) == 1
    cycles = value(m, "hai_planner_cycle_seconds_count")
    assert cycles is not None and cycles >= 3
    assert value(m, "hai_api_request_duration_seconds_count", route="/api/v1/jobs", method="POST") == 4
    polls = value(m, "hai_api_request_duration_seconds_count", route="/api/v1/jobs/{job_id}", method="GET")
    assert polls is not None and polls >= 4

    # The high job ends: the victim resumes, and the counters say so.
    api.post(f"/jobs/{high['id']}/cancel", "dave")
    api.until_state(victim["id"], "RUNNING", timeout=10)
    m = scrape(api)
    assert value(m, "hai_admissions_total") == 4
    assert value(m, "hai_resumes_total") == 1
    assert value(m, "hai_suspensions_total", reason="preempted") == 1
    assert value(m, "hai_queued_jobs", priority="low", group="vision") is None


def test_metrics_label_routes_by_template(api: Api) -> None:
    api.get("/jobs/12345")
    api.http.get("/no/such/path")
    m = scrape(api)
    count = "hai_api_request_duration_seconds_count"
    assert value(m, count, route="/api/v1/jobs/{job_id}", method="GET") == 1
    assert value(m, count, route="unmatched", method="GET") == 1
    assert value(m, "hai_gpus_free", gpu_type="V100") == 8
    assert value(m, "hai_controller_lease_holder", holder=api.ctx.holder_id) == 0
    assert value(m, "hai_suspensions_total", reason="preempted") is None
