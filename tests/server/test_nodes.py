"""`GET /nodes` and an admin's drain: who may see and do what, the drain reaching the controller by the
change feed, the jobs on a drained node running to their end, and a restart keeping the drain."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from hai_airflow.server.provision import apply_config
from hai_airflow.server.store.tables import NodeRow, ReservationRow
from tests.server.conftest import Api
from tests.server.test_api import error_of
from tests.server.test_follow import check_kept
from tests.server.test_metrics import scrape, value

NODE2 = """
[[nodes]]
name = "node2"
gpu_type = "V100"
gpus = 8
cpus = 64
memory_gb = 512
"""

UNTIL_RELEASED = "while [ ! -e released ]; do sleep 0.05; done"
"""A job that runs until the test creates `released` in the code directory, then succeeds."""


@pytest.fixture
def two(api_factory: Callable[..., Api]) -> Api:
    """node1 and node2, 8 V100s each, and a controller the test steps."""
    api = api_factory(NODE2)
    api.with_controller()
    return api


def nodes(api: Api, user: str = "admin") -> dict[str, dict[str, Any]]:
    r = api.get("/nodes", user)
    assert r.status_code == 200, r.text
    return {n["name"]: n for n in r.json()}


def test_each_caller_sees_every_node_and_only_the_tasks_they_may_see(two: Api) -> None:
    job = two.submit("alice", cmd="sleep 30", resource_pkg=456, task_name="resnet")
    two.until_state(job["id"], "RUNNING")
    waiting = two.submit("bob", cmd="sleep 30", resource_pkg=457)
    with two.ctx.store.write() as s:  # as a preemption would hold them for bob's job
        s.add(ReservationRow(job_id=waiting["id"], node="node2", gpus=json.dumps([0, 1]), created_at=0))

    for user, shown in (("alice", True), ("carol", True), ("admin", True), ("dave", False)):
        seen = nodes(two, user)
        assert sorted(seen) == ["node1", "node2"], user
        (task,) = seen["node1"]["tasks"]
        use = {"id": job["id"], "state": "RUNNING", "gpus": [0, 1, 2, 3], "cpus": 16, "memory_gb": 128}
        if shown:
            assert task == {**use, "visibility": "full", "task_name": "resnet", "user": "alice"}, user
        else:
            assert task == {**use, "visibility": "other", "owner": "another user's job"}, user
    node1, node2 = nodes(two, "dave").values()
    assert (node1["state"], node1["cpus_used"], node1["memory_gb_used"]) == ("ready", 16, 128)
    assert node1["holders"] == {str(g): job["id"] for g in range(4)} and node1["free_gpus"] == [4, 5, 6, 7]
    assert node2["reserved_for"] == {"0": waiting["id"], "1": waiting["id"]} and node2["tasks"] == []
    assert "resnet" not in two.get("/nodes", "dave").text


def test_only_a_platform_admin_drains_and_an_unknown_node_is_named(two: Api) -> None:
    for user in ("alice", "carol"):  # a group admin is no platform admin
        body = error_of(two.post("/nodes/node2/drain", user, json={"reason": "mine"}), 403)
        assert body["error"] == "only a platform admin can drain nodes"
        error_of(two.post("/nodes/node2/undrain", user), 403)
    assert nodes(two)["node2"]["state"] == "ready"
    for action in ("drain", "undrain"):
        body = error_of(two.post(f"/nodes/nowhere/{action}", json={}), 404)
        assert body["error"] == "node nowhere not found" and "hai nodes" in body["fix"]
    error_of(two.post("/nodes/node2/drain", json={"why": "x"}), 422)
    assert error_of(two.post("/nodes/node2/drain", json={"reason": "x" * 501}), 422)["field"] == "reason"

    first = two.post("/nodes/node2/drain", json={"reason": "disk swap"}).json()
    assert (first["state"], first["drained_by"], first["reason"]) == ("drained", "admin", "disk swap")
    again = two.post("/nodes/node2/drain", json={"reason": "other"}).json()
    assert again == first, "draining a drained node changes nothing"
    assert value(scrape(two), "hai_nodes_drained") == 1
    ready = two.post("/nodes/node2/undrain").json()
    assert (ready["state"], ready["drained_by"], ready["drained_at"], ready["reason"]) == (
        "ready",
        None,
        None,
        None,
    )
    assert two.post("/nodes/node2/undrain").json() == ready
    assert value(scrape(two), "hai_nodes_drained") == 0


def test_a_drained_node_takes_no_new_job_and_its_running_job_ends_as_it_would(two: Api) -> None:
    controller = two.controller
    assert controller is not None
    two.step()
    resynced = controller.keeper.last_resync
    filler = two.submit("alice", cmd="sleep 30", resource_pkg=457)
    finisher = two.submit("bob", cmd=UNTIL_RELEASED, resource_pkg=457)
    two.until_state(filler["id"], "RUNNING")
    two.until_state(finisher["id"], "RUNNING")
    placed = {n["tasks"][0]["id"]: name for name, n in nodes(two).items()}
    drained = placed[finisher["id"]]

    two.post(f"/nodes/{drained}/drain", json={"reason": "maintenance"})
    two.step()
    assert nodes(two)[drained]["state"] == "draining"
    assert [n.drained for n in controller.follower.state.nodes] == [n == drained for n in ("node1", "node2")]
    check_kept(two)
    waiting = two.submit("dave", cmd="true", resource_pkg=457)
    full = "needs 8xV100 on one node; largest free block is 0"
    two.until(lambda: two.job(waiting["id"])["reason"] == full, what="a wait for a full cluster")

    (two.code / "released").touch()
    two.until_state(finisher["id"], "SUCCEEDED")
    room = f"{full}; node {drained} has room but is drained"
    two.until(lambda: two.job(waiting["id"])["reason"] == room, what="a reason naming the drain")
    for _ in range(3):
        two.step()
    assert two.job(waiting["id"])["state"] == "PENDING"
    assert nodes(two)[drained]["state"] == "drained"

    two.post(f"/nodes/{drained}/undrain")
    two.until_state(waiting["id"], "SUCCEEDED")
    (run,) = two.get(f"/jobs/{waiting['id']}/instances").json()
    assert run["placement"][0]["node"] == drained
    check_kept(two)
    assert controller.keeper.last_resync == resynced, "the drain came by the feed, not a full read"
    two.post(f"/jobs/{filler['id']}/cancel")


def test_a_restart_keeps_a_drain_and_a_node_the_file_drops_is_gone(api: Api) -> None:
    api.post("/nodes/node1/drain", json={"reason": "fans"})
    config = api.ctx.config
    apply_config(api.ctx.store, config, list(config.nodes))  # what a restart with the same file does
    node = nodes(api)["node1"]
    assert (node["state"], node["reason"]) == ("drained", "fans")
    resized = [n.model_copy(update={"gpus": 4}) for n in config.nodes]
    apply_config(api.ctx.store, config, resized)  # the operator changed its size: the drain stays
    node = nodes(api)["node1"]
    assert (node["gpus"], node["state"]) == (4, "drained")
    packages = {p["id"]: p["startable_now"] for p in api.get("/resource-packages").json()}
    assert packages[454] == 0, "a drained node offers no package"
    apply_config(api.ctx.store, config, [])
    with api.ctx.store.read() as s:
        assert s.get(NodeRow, "node1") is None
