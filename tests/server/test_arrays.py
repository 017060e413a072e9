"""Job arrays with the real local backend, on both stores: one request makes every task (or none),
each sees its index, `%K` keeps at most K released at once, and the array's id cancels them all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import Api

RECORDS = """
import json, os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
index = os.environ["HAI_ARRAY_INDEX"]
(out / f"start-{index}").write_text(json.dumps([time.time(), os.environ["HAI_ARRAY_ID"]]))
time.sleep(float(sys.argv[2]))
(out / f"end-{index}").write_text(json.dumps(time.time()))
"""


@pytest.fixture
def run(api: Api) -> Api:
    (api.code / "records.py").write_text(RECORDS)
    api.with_controller()
    return api


def submit_array(api: Api, array: str, user: str = "alice", expect: int = 201, **spec: Any) -> dict[str, Any]:
    r = api.post("/jobs", user, json={"spec": api.spec(**spec), "array": array})
    assert r.status_code == expect, r.text
    out: dict[str, Any] = r.json()
    return out


def tasks(api: Api, array_id: int, user: str = "alice") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = api.get("/jobs", user, params={"array": array_id}).json()
    return sorted(out, key=lambda j: j["array_index"])


def test_each_task_sees_its_index_and_at_most_k_run_at_once(run: Api, tmp_path: Path) -> None:
    first = submit_array(run, "0-5%2", cmd=f"python3 records.py {tmp_path} 0.6")
    made = tasks(run, first["id"])
    assert [t["array_index"] for t in made] == list(range(6))
    assert {t["array_id"] for t in made} == {first["id"]}
    assert [t["reason"].startswith("waiting for a slot") for t in made] == [False] * 2 + [True] * 4
    for t in made:
        run.until_state(t["id"], "SUCCEEDED", timeout=40)
    spans = {}
    for i in range(6):
        started, array_id = json.loads((tmp_path / f"start-{i}").read_text())
        spans[i] = (started, json.loads((tmp_path / f"end-{i}").read_text()))
        assert array_id == str(first["id"])
    for moment, _ in spans.values():  # at any task's start, at most 2 tasks were running
        assert sum(1 for s, e in spans.values() if s <= moment < e) <= 2


def test_the_array_id_cancels_every_task_not_ended(run: Api, tmp_path: Path) -> None:
    first = submit_array(run, "0-3%1", cmd=f"python3 records.py {tmp_path} 30")
    run.until_state(first["id"], "RUNNING")
    r = run.post(f"/jobs/{first['id']}/cancel", "alice")
    assert r.status_code == 200
    for t in tasks(run, first["id"]):
        assert run.until_state(t["id"], "CANCELLED")["state"] == "CANCELLED"
    assert [t["instances"] for t in tasks(run, first["id"])] == [1, 0, 0, 0]


def test_a_high_array_is_judged_whole_against_the_quota(api: Api) -> None:
    # alice's quota is 8 GPUs: 3 tasks of 4 GPUs (package 456) are 12.
    before = api.get("/jobs", "alice", params={"all": True}).json()
    r = api.post("/jobs", "alice", json={"spec": api.spec(resource_pkg=456, max_schedule=4), "array": "0-2"})
    assert r.status_code == 409 and "high priority refused" in r.text
    assert api.get("/jobs", "alice", params={"all": True}).json() == before, "none of it was made"
    assert submit_array(api, "0-1", resource_pkg=456, max_schedule=4)["array_index"] == 0


def test_a_retry_with_the_key_answers_the_array_made_before(api: Api) -> None:
    body = {"spec": api.spec(), "array": "0-2", "client_key": "sweep-1"}
    first = api.post("/jobs", "alice", json=body)
    again = api.post("/jobs", "alice", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and len(tasks(api, first.json()["id"])) == 3


@pytest.mark.parametrize(
    ("array", "says"), [("5-1", "not a range from low to high"), ("0-9%0", "%0 would run none")]
)
def test_a_bad_array_is_refused_naming_it(api: Api, array: str, says: str) -> None:
    r = api.post("/jobs", "alice", json={"spec": api.spec(), "array": array})
    assert r.status_code == 422 and says in r.text and r.json()["field"] == "array"


def test_anothers_array_is_neither_listed_nor_cancelled(api: Api) -> None:
    first = submit_array(api, "0-1")
    assert api.get("/jobs", "dave", params={"array": first["id"], "all": True}).json() == []
    assert api.post(f"/jobs/{first['id']}/cancel", "dave").status_code == 404
    assert {t["state"] for t in tasks(api, first["id"])} == {"PENDING"}
