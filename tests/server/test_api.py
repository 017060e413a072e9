"""The REST API in-process on SQLite and PostgreSQL: auth, roles, validation, quota, listing, requests."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hai_airflow.server.store.tables import UserRow
from hai_airflow.server.store.tokens import token_hash
from tests.server.conftest import Api


def error_of(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "field", "fix"}
    assert "Traceback" not in r.text
    return body


def job_count(api: Api) -> int:
    return len(api.get("/jobs", params={"all": True}).json())


# ---- auth and roles ---------------------------------------------------------------------------


def test_health_needs_no_token_and_names_the_store(api: Api) -> None:
    body = api.get("/health", user=None).json()
    assert body["status"] == "ok"
    assert body["database"] in ("sqlite", "postgresql")
    assert body["lease_holder"] is None  # no controller in this app


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        pytest.param({}, "missing API token", id="no header"),
        pytest.param({"Authorization": "Bearer nope"}, "unknown API token", id="unknown token"),
        pytest.param({"Authorization": "Basic YWxpY2U6eA=="}, "missing API token", id="not bearer"),
    ],
)
def test_requests_without_a_valid_token_get_401_naming_the_header(
    api: Api, headers: dict[str, str], error: str
) -> None:
    body = error_of(api.http.get("/api/v1/jobs", headers=headers), 401)
    assert body["error"] == error
    assert body["field"] == "Authorization"
    assert "HAI_TOKEN" in body["fix"]


def test_a_verified_caller_is_reused_for_a_while_only(api: Api) -> None:
    """Another server's start may give alice's token to no one: this server follows within its window."""
    api.ctx.identities.seconds = 0.5
    assert api.get("/whoami", "alice").json()["user"] == "alice"
    with api.ctx.store.write() as s:
        alice = s.get(UserRow, "alice")
        assert alice is not None
        alice.token_hash = token_hash(api.ctx.store.token_key, "a token only the new file knows")
    assert api.get("/whoami", "alice").status_code == 200  # from memory
    time.sleep(0.6)
    assert error_of(api.get("/whoami", "alice"), 401)["error"] == "unknown API token"


def test_a_refused_token_is_looked_up_again_and_the_named_user_is_part_of_the_identity(api: Api) -> None:
    """Only verified callers are kept: a token refused once counts as soon as the store knows it; and
    alice remembered as herself is not alice acting for bob (she has no `acts_for`)."""
    fresh = {"Authorization": "Bearer a token only the new file knows"}
    assert error_of(api.http.get("/api/v1/whoami", headers=fresh), 401)["error"] == "unknown API token"
    with api.ctx.store.write() as s:
        dave = s.get(UserRow, "dave")
        assert dave is not None
        dave.token_hash = token_hash(api.ctx.store.token_key, "a token only the new file knows")
    assert api.http.get("/api/v1/whoami", headers=fresh).json()["user"] == "dave"
    assert api.get("/whoami", "alice").json()["user"] == "alice"
    acting = api.get("/whoami", "alice", headers={"X-Hai-On-Behalf-Of": "bob"})
    assert "not a service identity" in error_of(acting, 403)["error"]


@pytest.mark.parametrize(
    ("user", "role", "admin_of"),
    [
        ("admin", "platform_admin", ["default"]),
        ("carol", "group_admin", ["vision"]),
        ("alice", "user", []),
    ],
)
def test_whoami_reports_role_and_administered_groups(
    api: Api, user: str, role: str, admin_of: list[str]
) -> None:
    body = api.get("/whoami", user).json()
    assert (body["user"], body["role"], body["admin_of"]) == (user, role, admin_of)


# ---- submit: validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field", "in_error"),
    [
        pytest.param(
            {"max_schedule": 5}, "spec.max_schedule", "0|4|6|8|24|48", id="max_schedule not a choice"
        ),
        pytest.param({"cmd": None}, "spec.cmd", "", id="cmd null"),
        pytest.param({"resource_pkg": 999}, "spec.resource_pkg", "999", id="unknown package"),
        pytest.param({"gpu_type": "A100"}, "spec.gpu_type", "A100", id="gpu type differs from package"),
        pytest.param(
            {"project_storage": [10111, "abc"]},
            "spec.project_storage[1]",
            "valid integer",
            id="storage not numbers",
        ),
        pytest.param(
            # The CLI's comma-separated form is text for people; JSON sends the array the schema states.
            {"project_storage": "10111,10222"},
            "spec.project_storage",
            "valid array",
            id="storage as text",
        ),
        pytest.param({"code_path": "/no/such/dir"}, "spec.code_path", "/no/such/dir", id="code path missing"),
        pytest.param({"colour": "red"}, "spec.colour", "not a known field", id="unknown field"),
        pytest.param({"mode": "quantum"}, "spec", "", id="unknown mode"),
        pytest.param({"git_branch": "main"}, "spec", "git_branch", id="branch without git"),
        pytest.param(
            {"mode": "distributed", "worker_resource_pkg": 100},
            "spec.worker_resource_pkg",
            "no GPUs",
            id="distributed on a CPU package",
        ),
        pytest.param({"task_name": ""}, "spec.task_name", "", id="empty task name"),
    ],
)
def test_bad_submissions_get_422_naming_the_field_and_create_nothing(
    api: Api, spec: dict[str, Any], field: str, in_error: str
) -> None:
    body_spec = api.spec(**spec)
    if spec.get("cmd", "") is None:
        body_spec.pop("cmd")
    body = error_of(api.post("/jobs", "alice", json={"spec": body_spec}), 422)
    assert body["field"] == field
    assert in_error in body["error"]
    assert body["fix"]
    assert job_count(api) == 0


def test_missing_field_says_it_is_required(api: Api) -> None:
    spec = api.spec()
    spec.pop("cmd")
    body = error_of(api.post("/jobs", "alice", json={"spec": spec}), 422)
    assert body["error"] == "spec.cmd is required"


def test_invalid_json_body_is_a_422_not_a_traceback(api: Api) -> None:
    r = api.post("/jobs", "alice", content=b"{not json", headers={"content-type": "application/json"})
    body = error_of(r, 422)
    assert "JSON" in body["error"]


def test_submit_resolves_the_package_and_records_an_event(api: Api) -> None:
    job = api.submit(resource_pkg=456, project_storage=[10111])
    assert (job["state"], job["gpus"], job["gpu_type"], job["user"], job["group"]) == (
        "PENDING",
        4,
        "V100",
        "alice",
        "vision",
    )
    assert job["priority"] == "low"
    detail = api.job(job["id"])
    assert [e["kind"] for e in detail["events"]] == ["submitted"]
    assert detail["events"][0]["actor"] == "alice"
    assert detail["spec"]["project_storage"] == [10111]


def test_cpu_and_distributed_jobs_take_their_resources(api: Api) -> None:
    cpu = api.submit(mode="cpu", cpus=4, memory_gb=8)
    assert (cpu["gpus"], cpu["gpu_type"], cpu["workers"]) == (0, None, 1)
    dist = api.submit(mode="distributed", workers=2, worker_resource_pkg=457)
    assert (dist["gpus"], dist["workers"], dist["gpu_type"]) == (16, 2, "V100")


# ---- submit: idempotency and quota ------------------------------------------------------------


def test_same_client_key_returns_the_same_job_with_200(api: Api) -> None:
    first = api.submit(client_key="k-1")
    again = api.submit(client_key="k-1", expect=200)
    assert again["id"] == first["id"]
    assert job_count(api) == 1
    found = api.get("/jobs", "alice", params={"client_key": "k-1", "all": True}).json()
    assert [j["id"] for j in found] == [first["id"]]


def test_client_key_is_scoped_per_user(api: Api) -> None:
    alice = api.submit(client_key="shared")
    r = api.post("/jobs", "bob", json={"spec": api.spec(), "client_key": "shared"})
    assert r.status_code == 201, r.text
    assert r.json()["id"] != alice["id"] and r.json()["user"] == "bob"
    again = api.post("/jobs", "bob", json={"spec": api.spec(), "client_key": "shared"})
    assert again.status_code == 200 and again.json()["id"] == r.json()["id"]


def test_high_priority_over_personal_quota_is_refused_with_the_reason_and_fix(api: Api) -> None:
    api.submit(resource_pkg=457, max_schedule=4)  # alice: 8/8
    r = api.post("/jobs", "alice", json={"spec": api.spec(resource_pkg=454, max_schedule=24)})
    body = error_of(r, 409)
    assert "over your high-priority quota (9/8 GPUs in group vision)" in body["error"]
    assert body["field"] == "max_schedule"
    assert "Submit with --max-schedule 0 for low priority, or ask your group admin" in body["fix"]
    assert job_count(api) == 1
    # low priority is always allowed
    api.submit(resource_pkg=454, max_schedule=0)


def test_group_quota_binds_members_without_a_personal_limit(api: Api) -> None:
    api.submit(resource_pkg=456, max_schedule=4)  # alice 4 of vision's 8
    api.submit(user="bob", resource_pkg=456, max_schedule=4)  # bob 4: vision 8/8
    body = error_of(api.post("/jobs", "bob", json={"spec": api.spec(max_schedule=4)}), 409)
    assert "group vision" in body["error"] and "9/8" in body["error"]
    api.submit(user="dave", resource_pkg=457, max_schedule=4)  # another group is unaffected


def test_quota_check_endpoint_matches_the_submit_rule(api: Api) -> None:
    ok = api.get("/quota/check", "alice", params={"gpus": 8}).json()
    assert ok["allowed"] is True and ok["user_limit"] == 8
    refused = api.get("/quota/check", "alice", params={"gpus": 9}).json()
    assert refused["allowed"] is False
    assert "over your high-priority quota" in refused["reason"]
    error_of(api.get("/quota/check", "alice", params={"gpus": -1}), 422)


# ---- listing and visibility -------------------------------------------------------------------


@pytest.fixture
def three_users(api: Api) -> dict[str, int]:
    return {
        "alice": api.submit(user="alice")["id"],
        "bob": api.submit(user="bob")["id"],
        "dave": api.submit(user="dave")["id"],
    }


@pytest.mark.parametrize(
    ("user", "params", "expected"),
    [
        pytest.param("alice", {}, ["alice"], id="a user sees own jobs"),
        pytest.param("alice", {"all": True}, ["alice"], id="all is still own jobs for a user"),
        pytest.param("carol", {"all": True}, ["alice", "bob"], id="group admin: the group's jobs"),
        pytest.param("carol", {"user": "bob"}, ["bob"], id="group admin: one member"),
        pytest.param("admin", {"all": True}, ["alice", "bob", "dave"], id="platform admin: everything"),
        pytest.param("admin", {"group": "nlp"}, ["dave"], id="group filter"),
        pytest.param("admin", {"all": True, "limit": 1}, ["dave"], id="newest first with limit"),
    ],
)
def test_job_list_scopes_by_role(
    api: Api, three_users: dict[str, int], user: str, params: dict[str, Any], expected: list[str]
) -> None:
    jobs = api.get("/jobs", user, params=params).json()
    assert sorted(j["user"] for j in jobs) == sorted(expected)


def test_user_filter_for_someone_else_is_403(api: Api, three_users: dict[str, int]) -> None:
    body = error_of(api.get("/jobs", "alice", params={"user": "bob"}), 403)
    assert body["field"] == "user"
    error_of(api.get("/jobs", "carol", params={"user": "dave"}), 403)


def test_state_filter_validates_and_filters(api: Api, three_users: dict[str, int]) -> None:
    assert len(api.get("/jobs", params={"all": True, "state": "pending,running"}).json()) == 3
    assert api.get("/jobs", params={"all": True, "state": "RUNNING"}).json() == []
    body = error_of(api.get("/jobs", params={"state": "SLEEPING"}), 422)
    assert body["field"] == "state"


def test_other_users_jobs_are_404_and_group_admins_see_them(api: Api, three_users: dict[str, int]) -> None:
    bob_job = three_users["bob"]
    error_of(api.get(f"/jobs/{bob_job}", "alice"), 404)
    error_of(api.post(f"/jobs/{bob_job}/cancel", "alice"), 404)
    error_of(api.get(f"/jobs/{bob_job}", "dave"), 404)
    assert api.get(f"/jobs/{bob_job}", "carol").status_code == 200
    error_of(api.get("/jobs/99999"), 404)
    error_of(api.get("/instances/99999"), 404)


# ---- requests: cancel, promote, suspend, resume -----------------------------------------------


def test_cancel_records_a_request_for_the_controller(api: Api) -> None:
    job = api.submit()
    r = api.post(f"/jobs/{job['id']}/cancel", "alice")
    assert r.status_code == 200
    assert r.json()["state"] == "PENDING"  # only the controller changes state
    kinds = [e["kind"] for e in api.job(job["id"])["events"]]
    assert kinds == ["submitted", "cancel_requested"]
    api.post(f"/jobs/{job['id']}/cancel", "alice")  # idempotent
    assert [e["kind"] for e in api.job(job["id"])["events"]].count("cancel_requested") == 1


def test_promote_within_quota_and_refusal_over_it(api: Api) -> None:
    low = api.submit(resource_pkg=457)
    r = api.post(f"/jobs/{low['id']}/promote", "alice", json={"max_schedule": 24})
    assert r.status_code == 200, r.text
    assert (r.json()["priority"], r.json()["max_schedule"]) == ("high", 24)
    other = api.submit(resource_pkg=454)
    body = error_of(api.post(f"/jobs/{other['id']}/promote", "alice", json={"max_schedule": 4}), 409)
    assert "over your high-priority quota (9/8 GPUs in group vision)" in body["error"]
    assert api.job(other["id"])["priority"] == "low"
    body = error_of(api.post(f"/jobs/{other['id']}/promote", "alice", json={"max_schedule": 0}), 422)
    assert body["field"] == "max_schedule"
    error_of(api.post(f"/jobs/{other['id']}/promote", "alice", json={"max_schedule": 4, "x": 1}), 422)


def test_promoting_a_high_job_again_does_not_count_it_twice(api: Api) -> None:
    job = api.submit(resource_pkg=457, max_schedule=4)
    r = api.post(f"/jobs/{job['id']}/promote", "alice", json={"max_schedule": 48})
    assert r.status_code == 200, r.text


def test_suspend_and_resume_are_for_admins(api: Api) -> None:
    job = api.submit()
    body = error_of(api.post(f"/jobs/{job['id']}/suspend", "alice"), 403)
    assert "admin of group vision" in body["error"]
    error_of(api.post(f"/jobs/{job['id']}/resume", "carol"), 409)  # not held
    held = api.post(f"/jobs/{job['id']}/suspend", "carol")
    assert held.status_code == 200
    queue = api.get("/queue", "alice").json()
    assert "suspended by admin carol" in queue[0]["reason"]
    assert api.post(f"/jobs/{job['id']}/resume", "admin").status_code == 200
    kinds = [e["kind"] for e in api.job(job["id"])["events"]]
    assert kinds == ["submitted", "hold_requested", "hold_released"]


def test_a_requeue_is_admitted_like_a_submit_and_made_once(api: Api) -> None:
    api.with_controller()
    failed = api.submit(resource_pkg=457, max_schedule=4, cmd="exit 3")
    api.until_state(failed["id"], "FAILED")
    running = api.submit(resource_pkg=457, max_schedule=4, cmd="sleep 30")
    # Her quota is held by the running job: the requeue is refused as a submit would be, and nothing changes.
    body = error_of(api.post(f"/jobs/{failed['id']}/requeue", "carol", json={"fresh": True}), 409)
    assert body["field"] == "max_schedule" and "over your high-priority quota" in body["error"]
    assert api.job(failed["id"])["events"][-1]["kind"] == "failed"
    api.post(f"/jobs/{running['id']}/cancel", "alice")
    api.until_state(running["id"], "CANCELLED")
    made = api.post(f"/jobs/{failed['id']}/requeue", "carol", json={"fresh": True})
    assert made.status_code == 201, made.text
    new = made.json()
    assert (new["user"], new["group"], new["priority"]) == ("alice", "vision", "high")
    assert new["requeued_from"] == failed["id"]
    again = api.post(f"/jobs/{failed['id']}/requeue", "alice", json={})
    assert (again.status_code, again.json()["id"]) == (200, new["id"])
    event = api.job(new["id"])["events"][0]
    assert (event["kind"], event["actor"]) == ("requeued", "carol")
    assert event["reason"].endswith(f"requeued from task {failed['id']} by carol, starting afresh")


# ---- queue, quotas, nodes, packages -----------------------------------------------------------


def test_queue_orders_high_before_low_with_weight_terms(api: Api) -> None:
    low = api.submit(resource_pkg=457)
    high = api.submit(user="dave", resource_pkg=457, max_schedule=4)
    queue = api.get("/queue", "bob").json()
    assert [e["job"]["id"] for e in queue] == [high["id"], low["id"]]
    assert [e["position"] for e in queue] == [1, 2]
    assert queue[0]["weight"] > queue[1]["weight"]
    assert {t["name"] for t in queue[1]["terms"]} >= {"priority class", "waiting"}
    assert queue[0]["reason"].startswith("starting")
    assert "8" in queue[1]["reason"]  # why it waits: the GPUs the high job takes


def test_quota_views_and_setting_quotas(api: Api) -> None:
    api.submit(resource_pkg=456, max_schedule=4)
    mine = api.get("/quota", "alice").json()
    assert (mine["group"], mine["group_quota_gpus"], mine["group_used_gpus"]) == ("vision", 8, 4)
    assert (mine["user"], mine["user_quota_gpus"], mine["user_used_gpus"]) == ("alice", 8, 4)
    assert {u["user"]: u["used_gpus"] for u in mine["users"]} == {"alice": 4, "bob": 0, "carol": 0}
    assert [q["group"] for q in api.get("/quotas", "alice").json()] == ["vision"]
    assert [q["group"] for q in api.get("/quotas", "admin").json()] == ["default", "nlp", "vision"]

    error_of(api.put("/quotas/users/bob", "alice", json={"gpus": 2}), 403)
    error_of(api.put("/quotas/users/dave", "carol", json={"gpus": 2}), 403)
    set_ = api.put("/quotas/users/bob", "carol", json={"gpus": 2})
    assert set_.status_code == 200 and set_.json()["user_quota_gpus"] == 2
    body = error_of(api.post("/jobs", "bob", json={"spec": api.spec(resource_pkg=456, max_schedule=4)}), 409)
    assert "over your high-priority quota (4/2 GPUs in group vision)" in body["error"]

    error_of(api.put("/quotas/groups/vision", "carol", json={"gpus": 64}), 403)
    assert api.put("/quotas/groups/vision", "admin", json={"gpus": None}).json()["group_quota_gpus"] is None
    error_of(api.put("/quotas/users/nobody", "admin", json={"gpus": 1}), 404)
    error_of(api.put("/quotas/groups/nobody", "admin", json={"gpus": 1}), 404)
    body = error_of(api.put("/quotas/users/bob", "admin", json={"gpus": -3}), 422)
    assert body["field"] == "gpus"


def test_nodes_and_packages_show_free_capacity(api: Api) -> None:
    nodes = api.get("/nodes", "alice").json()
    assert [(n["name"], n["gpus"], n["free_gpus"], n["holders"]) for n in nodes] == [
        ("node1", 8, list(range(8)), {})
    ]
    packages = {p["id"]: p["startable_now"] for p in api.get("/resource-packages", "alice").json()}
    assert packages == {100: 8, 454: 8, 455: 4, 456: 2, 457: 1}


def test_unknown_path_is_a_json_404(api: Api) -> None:
    body = error_of(api.get("/no-such-thing"), 404)
    assert body["fix"]


def test_openapi_documents_the_client_paths(api: Api) -> None:
    paths = set(api.http.get("/openapi.json").json()["paths"])
    for p in (
        "/health",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}/wait",
        "/api/v1/instances/{instance_id}/log",
        "/api/v1/queue",
        "/api/v1/quota/check",
        "/api/v1/quotas/users/{user}",
        "/api/v1/nodes",
        "/api/v1/resource-packages",
        "/api/v1/whoami",
        "/api/v1/jobs/{job_id}/promote",
    ):
        assert p in paths
