"""Every per-job, per-instance, quota and dashboard route against a live server: another user is refused
(or, on a page open to all, sees nothing of hers), the owner or her group admin is let in, and nobody
signed out gets anything. Each case fails if its route's own check is removed."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from hai_airflow.spec import StandaloneJobSpec
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

NOT_HERS = {"bob": 404, "dave": 404}
"""A job one may not see does not exist for them: bob shares alice's group, dave is in nlp."""
MAY_SEE = ("alice", "carol", "admin")
"""The owner, her group's admin and the platform admin."""


@dataclass(frozen=True)
class Case:
    """One route: what each other user gets, and who is let in.

    `path`, `hides`, `shows` and `public` may name `{job}`, `{instance}` (alice's) and `{secret}` (in
    her job's task name and log). A viewer in `others` with 200 is on a page open to all: it must not
    show `hides`, and it shows `public` (so `hides` is not missing only because the page is empty).
    """

    method: str
    path: str
    others: dict[str, int]
    allowed: tuple[str, ...]
    body: dict[str, Any] | None = None
    hides: str = "{secret}"
    shows: str | None = None
    public: str | None = None
    fresh: bool = field(default=False, kw_only=True)
    """The route changes the job: it gets a job of its own (low priority, 1 GPU)."""
    held: bool = field(default=False, kw_only=True)
    """carol suspends that job first."""
    ended: bool = field(default=False, kw_only=True)
    """The admin cancels that job first, and it has ended."""
    first: int = field(default=200, kw_only=True)
    """What the first viewer let in gets: 201 where the route makes a job (the others get it again, 200)."""


CASES = [
    pytest.param(
        Case("GET", "/api/v1/jobs/{job}/instances", NOT_HERS, MAY_SEE, shows='"job_id":{job}'),
        id="job instances",
    ),
    pytest.param(
        Case("GET", "/api/v1/jobs/{job}/wait?timeout=0", NOT_HERS, MAY_SEE, shows="{secret}"), id="job wait"
    ),
    pytest.param(
        Case("POST", "/api/v1/jobs/{job}/cancel", NOT_HERS, ("carol",), fresh=True), id="job cancel"
    ),
    pytest.param(
        Case("POST", "/api/v1/jobs/{job}/promote", NOT_HERS, ("alice",), {"max_schedule": 4}, fresh=True),
        id="job promote",
    ),
    pytest.param(
        Case("POST", "/api/v1/jobs/{job}/suspend", {**NOT_HERS, "alice": 403}, ("carol",), fresh=True),
        id="job suspend: her group's admin only",
    ),
    pytest.param(
        Case(
            "POST", "/api/v1/jobs/{job}/resume", {**NOT_HERS, "alice": 403}, ("carol",), fresh=True, held=True
        ),
        id="job resume: her group's admin only",
    ),
    pytest.param(
        Case("POST", "/api/v1/jobs/{job}/hold", NOT_HERS, MAY_SEE, fresh=True, held=True),
        id="job hold: hers, her group's admin's, the platform admin's",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/v1/jobs/{job}/release",
            {**NOT_HERS, "alice": 403},
            ("carol",),
            fresh=True,
            held=True,
        ),
        id="job release: an admin's hold by an admin only",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/v1/jobs/{job}/requeue",
            NOT_HERS,
            MAY_SEE,
            {"fresh": False},
            shows='"requeued_from":{job}',
            fresh=True,
            ended=True,
            first=201,
        ),
        id="job requeue: once, by her, her group's admin or the platform admin",
    ),
    pytest.param(
        Case("GET", "/api/v1/instances/{instance}", NOT_HERS, MAY_SEE, shows='"job_id":{job}'), id="instance"
    ),
    pytest.param(
        Case("GET", "/api/v1/instances/{instance}/log", NOT_HERS, MAY_SEE, shows="{secret}"),
        id="instance log",
    ),
    pytest.param(
        Case(
            "PUT",
            "/api/v1/quotas/users/alice",
            {"bob": 403, "dave": 403, "alice": 403},
            ("carol", "admin"),
            {"gpus": 8},
        ),
        id="user quota: her group's admin or the platform admin, never herself",
    ),
    pytest.param(
        Case(
            "PUT",
            "/api/v1/quotas/groups/vision",
            {"bob": 403, "carol": 403, "dave": 403},
            ("admin",),
            {"gpus": 8},
        ),
        id="group quota: the platform admin only",
    ),
    pytest.param(
        Case("GET", "/api/v1/quota/check?gpus=1", {"bob": 200, "dave": 200}, ("alice",), public='"allowed"'),
        id="quota check: open to all",
    ),
    pytest.param(
        Case("GET", "/api/v1/resource-packages", {"bob": 200, "dave": 200}, ("alice",), public='"id":454'),
        id="resource packages: open to all",
    ),
    pytest.param(Case("GET", "/ui/jobs?id={job}", NOT_HERS, MAY_SEE, shows="{secret}"), id="ui job finder"),
    pytest.param(Case("GET", "/ui/jobs/{job}", NOT_HERS, MAY_SEE, shows="{secret}"), id="ui job page"),
    pytest.param(
        Case("GET", "/ui/jobs", {"bob": 200, "dave": 200}, MAY_SEE, shows="{secret}", public='"jobs-filter"'),
        id="ui task list: her tasks for those who may see them",
    ),
    pytest.param(
        Case("GET", "/ui/jobs?user=alice", {"bob": 403, "dave": 403}, MAY_SEE, shows="{secret}"),
        id="ui task list of her tasks",
    ),
    pytest.param(
        Case("GET", "/ui/jobs/{job}/log?instance={instance}", NOT_HERS, MAY_SEE, shows="{secret}"),
        id="ui job log",
    ),
    pytest.param(
        # Which job holds a GPU is public, as in the queue; its name and owner are not.
        Case(
            "GET",
            "/ui/nodes",
            {"bob": 200, "dave": 200},
            MAY_SEE,
            shows="{secret}",
            public='data-job="{job}"',
        ),
        id="ui nodes: her job's number, not its name",
    ),
    pytest.param(
        Case(
            "GET",
            "/ui/quota",
            {"bob": 200},
            MAY_SEE,
            hides='data-job="{job}"',
            shows='data-job="{job}"',
            public='data-user="alice"',
        ),
        id="ui quota: her usage, not her jobs",
    ),
    pytest.param(
        Case(
            "GET",
            "/ui/quota",
            {"dave": 200},
            ("bob",),
            hides='data-group="vision"',
            shows='data-group="vision"',
            public='data-group="nlp"',
        ),
        id="ui quota: not another group",
    ),
]


@dataclass(frozen=True)
class Hers:
    job: int
    instance: int
    secret: str


def bearer(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, module_store_env: dict[str, str]
) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("cross-user")
    (root / "code").mkdir()
    with LiveServer(root / "hai", TEST_CONFIG, module_store_env).start() as live:
        yield live


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30, follow_redirects=True) as client:
        yield client


def submit(server: LiveServer, secret: str, cmd: str, max_schedule: int) -> int:
    spec = StandaloneJobSpec(
        task_name=secret,
        code_path=str(server.home.parent / "code"),
        cmd=cmd,
        resource_pkg=454,
        max_schedule=max_schedule,
    )
    with server.client(TOKENS["alice"]) as alice:
        return alice.submit(spec).id


@pytest.fixture(scope="module")
def hers(server: LiveServer) -> Hers:
    """Alice's running high-priority job, whose task name and log carry a string unique to it."""
    secret = f"secret-{uuid.uuid4().hex[:12]}"
    job = submit(server, secret, f"echo {secret}; sleep 600", max_schedule=4)
    deadline = time.monotonic() + 30
    with server.client(TOKENS["alice"]) as alice:
        while not (instances := alice.instances(job)) or secret not in alice.log(instances[0].id):
            assert time.monotonic() < deadline, f"job {job} did not log: {alice.job(job).reason}"
            time.sleep(0.1)
    return Hers(job, instances[0].id, secret)


def witness(http: httpx.Client, job: int) -> tuple[Any, ...]:
    """What a refused request could have changed: users' requests on the job, and every quota."""
    detail = http.get(f"/api/v1/jobs/{job}", headers=bearer("admin")).json()
    asked = [e for e in detail["events"] if e["actor"] in TOKENS]
    quotas = http.get("/api/v1/quotas", headers=bearer("admin")).json()
    limits = [
        (q["group"], q["group_quota_gpus"], [(u["user"], u["quota_gpus"]) for u in q["users"]])
        for q in quotas
    ]
    return asked, limits


@pytest.mark.parametrize("case", CASES)
def test_another_user_is_refused_and_the_owner_is_let_in(
    case: Case, server: LiveServer, http: httpx.Client, hers: Hers
) -> None:
    job = submit(server, hers.secret, "sleep 600", max_schedule=0) if case.fresh else hers.job
    values = {"job": job, "instance": hers.instance, "secret": hers.secret}
    url = case.path.format(**values)

    def send(viewer: str | None) -> httpx.Response:
        headers = bearer(viewer) if viewer else {}
        return http.request(case.method, url, json=case.body, headers=headers)

    made: list[int] = []
    try:
        if case.held:
            held = http.post(f"/api/v1/jobs/{job}/suspend", headers=bearer("carol"))
            assert held.status_code == 200, held.text
        if case.ended:
            http.post(f"/api/v1/jobs/{job}/cancel", headers=bearer("admin"))
            deadline = time.monotonic() + 30
            while http.get(f"/api/v1/jobs/{job}", headers=bearer("admin")).json()["state"] != "CANCELLED":
                assert time.monotonic() < deadline, f"job {job} was not cancelled"
                time.sleep(0.1)
        signed_out = send(None)
        assert signed_out.status_code == 401, signed_out.text
        assert case.hides.format(**values) not in signed_out.text

        before = witness(http, job)
        for viewer, status in case.others.items():
            answer = send(viewer)
            assert answer.status_code == status, (viewer, answer.text)
            assert case.hides.format(**values) not in answer.text, f"{viewer} sees it"
            if case.public is not None:
                assert case.public.format(**values) in answer.text, (viewer, answer.text)
        assert witness(http, job) == before, "a refused request changed something"

        for n, viewer in enumerate(case.allowed):
            answer = send(viewer)
            assert answer.status_code == (case.first if n == 0 else 200), (viewer, answer.text)
            if case.shows is not None:
                assert case.shows.format(**values) in answer.text, (viewer, answer.text)
            if answer.status_code == 201:
                made.append(answer.json()["id"])
    finally:
        for mine in ([job] if case.fresh else []) + made:
            with contextlib.suppress(httpx.HTTPError):
                http.post(f"/api/v1/jobs/{mine}/cancel", headers=bearer("admin"))


def test_the_quota_check_answers_for_the_caller_alone(http: httpx.Client, hers: Hers) -> None:
    # gpus=0: the answer's "used" is what is in use plus what is asked.
    def check(viewer: str, **params: str) -> dict[str, Any]:
        answer = http.get("/api/v1/quota/check", params={"gpus": 0, **params}, headers=bearer(viewer))
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    assert check("alice")["user_used"] >= 1 and check("alice")["user_limit"] == 8
    # Naming her is no way to read her numbers: a query parameter the route does not take.
    bobs = check("bob", user="alice")
    assert bobs["user_used"] == 0 and bobs["user_limit"] is None
    daves = check("dave", user="alice", group="vision")
    assert daves["user_used"] == 0 and daves["group_used"] == 0 and daves["group_limit"] == 16
