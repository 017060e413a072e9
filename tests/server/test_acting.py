"""A service identity (Airflow) acting for users with X-Hai-On-Behalf-Of, on SQLite and PostgreSQL:
the job is the user's in every respect and records the service; every other use of the header is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.server.acting import ON_BEHALF_OF, covers
from hai_airflow.server.config import ConfigError, parse_config
from tests.server.conftest import Api
from tests.server.test_api import error_of
from tests.support.live_server import TEST_CONFIG

SERVICE = """
[[users]]
name = "airflow"
group = "default"
token = "airflow-token"
acts_for = ["group:vision"]
"""
"""Airflow acts for the members of vision (alice, bob, carol); dave (nlp) is not among them."""
SERVICE_TOKEN = "airflow-token"


@pytest.fixture
def api(api_factory: Callable[..., Api]) -> Api:
    return api_factory(SERVICE)


def as_airflow(api: Api, method: str, path: str, on_behalf_of: str | None = None, **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
    if on_behalf_of is not None:
        headers[ON_BEHALF_OF] = on_behalf_of
    return api.http.request(method, f"/api/v1{path}", headers=headers, **kw)


def ids(r: Any) -> list[int]:
    assert r.status_code == 200, r.text
    return sorted(j["id"] for j in r.json())


# ---- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acts_for", "user", "group", "allowed"),
    [
        pytest.param(("alice",), "alice", "vision", True, id="a named user"),
        pytest.param(("alice",), "bob", "vision", False, id="another user of the same group"),
        pytest.param(("group:vision",), "bob", "vision", True, id="a member of a named group"),
        pytest.param(("group:vision",), "dave", "nlp", False, id="a member of another group"),
        pytest.param(("group:vision", "dave"), "dave", "nlp", True, id="a group and a user"),
        pytest.param(("*",), "dave", "nlp", True, id="everyone"),
        pytest.param((), "alice", "vision", False, id="not a service"),
        pytest.param(("vision",), "alice", "vision", False, id="a bare group name names a user"),
    ],
)
def test_acts_for_covers_named_users_group_members_or_everyone(
    acts_for: tuple[str, ...], user: str, group: str, allowed: bool
) -> None:
    assert covers(acts_for, user, group) is allowed


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        pytest.param("ghost", "'ghost' is not a configured user", id="unknown user"),
        pytest.param("group:ghosts", "group 'ghosts' is not defined", id="unknown group"),
        pytest.param("group:", "group '' is not defined", id="group without a name"),
    ],
)
def test_an_acts_for_naming_nobody_is_refused_naming_the_field(entry: str, words: str) -> None:
    text = TEST_CONFIG + SERVICE.replace('"group:vision"', f'"{entry}"')
    with pytest.raises(ConfigError) as e:
        parse_config(text, Path("/etc/hai.toml"))
    assert e.value.field == "users[5].acts_for"
    assert words in e.value.problem


# ---- acting for a user ------------------------------------------------------------------------


def test_a_job_submitted_for_alice_is_hers_and_records_the_service(api: Api) -> None:
    r = as_airflow(api, "POST", "/jobs", "alice", json={"spec": api.spec(task_name="nightly")})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["user"], job["group"], job["submitted_via"]) == ("alice", "vision", "airflow")

    detail = api.job(job["id"], "alice")
    submitted = next(e for e in detail["events"] if e["kind"] == "submitted")
    assert submitted["actor"] == "alice"
    assert submitted["reason"].endswith("submitted by alice via airflow")

    assert job["id"] in ids(api.get("/jobs", "alice"))
    assert job["id"] not in ids(api.get("/jobs", "bob", params={"all": True}))
    assert api.get(f"/jobs/{job['id']}", "bob").status_code == 404
    assert job["id"] not in ids(as_airflow(api, "GET", "/jobs", params={"all": True}))
    assert api.submit("alice")["submitted_via"] is None


def test_a_service_sees_exactly_alices_view_when_acting_for_her(api: Api) -> None:
    own = as_airflow(api, "POST", "/jobs", json={"spec": api.spec(task_name="airflow's own")}).json()
    alices = api.submit("alice")["id"]
    bobs = api.submit("bob")["id"]

    assert ids(as_airflow(api, "GET", "/jobs", "alice")) == [alices]
    assert ids(as_airflow(api, "GET", "/jobs", "alice", params={"all": True})) == [alices]
    assert ids(as_airflow(api, "GET", "/jobs")) == [own["id"]]
    assert as_airflow(api, "GET", f"/jobs/{own['id']}", "alice").status_code == 404
    assert as_airflow(api, "GET", f"/jobs/{bobs}", "alice").status_code == 404
    error_of(as_airflow(api, "GET", "/jobs", "alice", params={"user": "bob"}), 403)

    me = as_airflow(api, "GET", "/whoami", "alice").json()
    assert me == {"user": "alice", "group": "vision", "role": "user", "admin_of": [], "via": "airflow"}
    assert as_airflow(api, "GET", "/whoami").json()["via"] is None
    assert as_airflow(api, "GET", "/quota", "alice").json()["group"] == "vision"


def test_alices_quota_limits_what_a_service_submits_for_her(api: Api) -> None:
    assert api.put("/quotas/users/alice", json={"gpus": 0}).status_code == 200
    high = {"spec": api.spec(max_schedule=4)}

    body = error_of(as_airflow(api, "POST", "/jobs", "alice", json=high), 409)
    assert body["field"] == "max_schedule"
    assert "1/0 GPUs in group vision" in body["error"], "alice's quota, not airflow's"
    assert as_airflow(api, "POST", "/jobs", json=high).status_code == 201, "airflow's own quota allows it"
    low = as_airflow(api, "POST", "/jobs", "alice", json={"spec": api.spec(max_schedule=0)})
    assert low.status_code == 201 and low.json()["priority"] == "low"


def test_client_keys_belong_to_the_user_acted_for(api: Api) -> None:
    body = {"spec": api.spec(), "client_key": "dag:run:task"}
    first = as_airflow(api, "POST", "/jobs", "alice", json=body)
    again = as_airflow(api, "POST", "/jobs", "alice", json=body)
    for_bob = as_airflow(api, "POST", "/jobs", "bob", json=body)
    own = as_airflow(api, "POST", "/jobs", json=body)
    assert (first.status_code, again.status_code, for_bob.status_code, own.status_code) == (
        201,
        200,
        201,
        201,
    )
    assert again.json()["id"] == first.json()["id"]
    assert len({first.json()["id"], for_bob.json()["id"], own.json()["id"]}) == 3
    assert api.submit("alice", client_key="dag:run:task", expect=200)["id"] == first.json()["id"]


def test_requests_acted_for_alice_are_recorded_with_the_service(api: Api) -> None:
    job = api.submit("alice", max_schedule=0)["id"]
    assert as_airflow(api, "POST", f"/jobs/{job}/cancel", "alice").status_code == 200
    events = api.job(job, "alice")["events"]
    cancel = next(e for e in events if e["kind"] == "cancel_requested")
    assert (cancel["actor"], cancel["reason"]) == ("alice", "cancel asked by alice (via airflow)")


def test_a_service_acting_for_a_group_admin_has_their_powers_and_no_more(api: Api) -> None:
    alices = api.submit("alice")["id"]
    daves = api.submit("dave")["id"]
    assert as_airflow(api, "POST", f"/jobs/{alices}/suspend", "alice").status_code == 403
    assert as_airflow(api, "POST", f"/jobs/{alices}/suspend", "carol").status_code == 200
    assert as_airflow(api, "POST", f"/jobs/{daves}/cancel", "carol").status_code == 404


# ---- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "named", "status", "words", "fix"),
    [
        pytest.param(
            "bob-token", "alice", 403, "bob is not a service identity", "acts_for", id="not a service"
        ),
        pytest.param(
            "admin-token",
            "alice",
            403,
            "admin is not a service identity",
            "acts_for",
            id="an admin is no service",
        ),
        pytest.param(
            SERVICE_TOKEN, "dave", 403, "may not act for dave (group nlp)", "group:nlp", id="outside acts_for"
        ),
        pytest.param(
            SERVICE_TOKEN, "zed", 403, "'zed', who is not a hai user", "[[users]]", id="unknown user"
        ),
        pytest.param(SERVICE_TOKEN, "", 400, f"{ON_BEHALF_OF} is empty", "leave the header out", id="empty"),
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [pytest.param("POST", "/jobs", id="submit"), pytest.param("GET", "/jobs", id="list")],
)
def test_the_header_is_refused_unless_a_service_may_act_for_that_user(
    api: Api, token: str, named: str, status: int, words: str, fix: str, method: str, path: str
) -> None:
    headers = {"Authorization": f"Bearer {token}", ON_BEHALF_OF: named}
    kw: dict[str, Any] = {"json": {"spec": api.spec()}} if method == "POST" else {}
    body = error_of(api.http.request(method, f"/api/v1{path}", headers=headers, **kw), status)
    assert body["field"] == ON_BEHALF_OF
    assert words in body["error"]
    assert fix in body["fix"]
    assert api.get("/jobs", params={"all": True}).json() == []
