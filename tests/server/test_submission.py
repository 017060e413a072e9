"""Accepting a job in one write: the quota check's one aggregate query counts exactly what the
scheduling rule `high_gpus` counts, and a known client_key is found by the insert itself."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from sqlalchemy import event, select

from hai_airflow.scheduling.quota import high_gpus, judge
from hai_airflow.server.config import parse_config
from hai_airflow.server.errors import ApiError
from hai_airflow.server.intake import submission
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.jobs.snapshot import planner_job, quota_of
from hai_airflow.server.provision import apply_config
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import ChangeRow, EventRow, JobRow
from hai_airflow.spec import TERMINAL_STATES, StandaloneJobSpec, SubmitRequest
from tests.server.conftest import Api
from tests.server.test_api import error_of, job_count
from tests.support.live_server import TEST_CONFIG

STATES = ("PENDING", "STARTING", "RUNNING", "SUSPENDING", "SUSPENDED", "SUCCEEDED", "FAILED", "CANCELLED")
OWNERS = (("alice", "vision"), ("bob", "vision"), ("dave", "nlp"), ("alice", "nlp"))
"""alice also has a job filed under another group (she moved): her personal usage counts it."""


def _row(state: str, high: bool, cancel: bool, owner: tuple[str, str], workers: int) -> JobRow:
    return JobRow(
        task_name="t", mode="distributed" if workers > 1 else "standalone", user_name=owner[0],
        group_name=owner[1], state=state, max_schedule=4 if high else 0, spec="{}", submitted_via=None,
        workers=workers, gpus_per_worker=2, cpus_per_worker=1.0, memory_gb_per_worker=1.0, gpu_type="V100",
        elastic=False, submitted_at=0.0, suspended_seconds=0.0, runtime_seconds=0.0, preemptions=0,
        instance_count=0, held=False, cancel_requested=cancel, reason="",
    )  # fmt: skip


def _expected(rows: list[JobRow], exclude: int | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """The rule as the planner states it: every unfinished job but a waiting one being cancelled."""
    counted = [
        planner_job(r, None)
        for r in rows
        if r.state not in TERMINAL_STATES
        and not (r.cancel_requested and r.state in ("PENDING", "SUSPENDED"))
        and r.id != exclude
    ]
    return high_gpus(counted)


@pytest.fixture
def store(db_url: str) -> Store:
    store = Store(db_url)
    store.migrate()
    config = parse_config(TEST_CONFIG)
    apply_config(store, config, list(config.nodes))
    return store


def test_usage_counts_unfinished_high_jobs_but_not_waiting_cancelled_ones(store: Store) -> None:
    combos = itertools.product(STATES, (False, True), (False, True), OWNERS, (1, 3))
    try:
        with store.write() as s:
            rows = [_row(*c) for c in combos]
            s.add_all(rows)
            s.flush()
            ids = [r.id for r in rows]
        with store.read() as s:
            rows = [r for r in (s.get(JobRow, i) for i in ids) if r is not None]
            expected = _expected(rows)
            assert submission.high_usage(s) == expected
            assert expected[0]["alice"] > 0 and expected[1]["nlp"] > 0  # the table is not trivially empty
            # A check for one user and group sums only theirs, and leaves out the job being promoted.
            promoted = next(r for r in rows if r.user_name == "alice" and r.max_schedule > 0
                            and r.state == "RUNNING" and not r.cancel_requested)  # fmt: skip
            user, group = submission.high_usage(s, "alice", "vision", exclude=(promoted.id,))
            all_user, all_group = _expected(rows, exclude=promoted.id)
            assert (user["alice"], group["vision"]) == (all_user["alice"], all_group["vision"])
            assert user["alice"] == expected[0]["alice"] - promoted.workers * promoted.gpus_per_worker
            # The verdict is the rule's `judge` on that usage and the stored limits.
            for gpus in (0, 1, 100):
                assert submission.quota_verdict(s, "alice", "vision", gpus) == judge(
                    "alice", "vision", gpus, expected[0]["alice"], expected[1]["vision"], quota_of(s)
                )
    finally:
        store.dispose()


def test_finished_and_low_jobs_use_no_quota(store: Store) -> None:
    try:
        with store.write() as s:
            s.add_all(
                [_row("SUCCEEDED", True, False, OWNERS[0], 1), _row("RUNNING", False, False, OWNERS[0], 3)]
            )
        with store.read() as s:
            assert submission.high_usage(s) == ({}, {})
            verdict = submission.quota_verdict(s, "alice", "vision", 8)
            assert verdict.allowed and (verdict.user_used, verdict.user_limit) == (8, 8)
            assert not submission.quota_verdict(s, "alice", "vision", 9).allowed
    finally:
        store.dispose()


def test_a_retried_high_priority_submit_gets_its_job_back_though_the_quota_is_now_full(api: Api) -> None:
    first = api.submit(client_key="k-1", resource_pkg=457, max_schedule=4)  # alice: 8/8
    again = api.submit(client_key="k-1", expect=200, resource_pkg=457, max_schedule=4)
    assert again["id"] == first["id"] and again["state"] == first["state"] == "PENDING"
    # A new job over the quota is refused, and the row inserted to check it is gone with the refusal.
    error_of(api.post("/jobs", "alice", json={"spec": api.spec(max_schedule=4), "client_key": "k-2"}), 409)
    assert job_count(api) == 1
    assert api.submit(client_key="k-2")["id"] != first["id"]  # the key is free: low priority is allowed


def test_the_answer_to_a_submit_is_the_stored_job(api: Api) -> None:
    submitted = api.submit(client_key="k-1", max_schedule=4)
    shown = api.get(f"/jobs/{submitted['id']}", "alice").json()
    assert {k: shown[k] for k in submitted} == submitted


ALICE = Caller(name="alice", group="vision", role="user", admin_of=frozenset())


def _submit(api: Api, key: str | None = None, **spec: Any) -> submission.Submit:
    fields = {"task_name": "t", "code_path": str(api.code), "cmd": "true", "resource_pkg": 454} | spec
    return submission.Submit(ALICE, SubmitRequest(spec=StandaloneJobSpec(**fields), client_key=key))


def _commits(store: Store) -> list[int]:
    counted = [0]

    def count(_conn: Any) -> None:
        counted[0] += 1

    event.listen(store.engine, "commit", count)
    return counted


def _statements(store: Store, start: str) -> list[int]:
    """How many statements beginning with `start` the store sends from now on."""
    counted = [0]

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        counted[0] += statement.startswith(start)

    event.listen(store.engine, "before_cursor_execute", count)
    return counted


def test_submits_stored_together_share_one_commit_and_each_gets_its_own_answer(api: Api) -> None:
    (first,) = submission.submit_all(api.ctx, [_submit(api, "old")])
    assert isinstance(first, tuple)
    old = first[0]
    commits = _commits(api.ctx.store)
    batch = [
        _submit(api, "old"),  # a key stored before: that job is the answer
        _submit(api, "a"),
        _submit(api, resource_pkg=999),  # no such package
        _submit(api, "b", resource_pkg=457, max_schedule=4),  # 8 GPUs at high priority: alice's quota
        _submit(api, "c", max_schedule=4),  # one more is over it
        _submit(api, "a"),  # the first one's key again, in the same batch
        _submit(api),
    ]
    inserts = _statements(api.ctx.store, "INSERT INTO jobs ")
    locks = _statements(api.ctx.store, "SELECT name FROM groups WHERE name = ")
    retried, a, unknown, b, over, again, plain = submission.submit_all(api.ctx, batch)
    assert commits == [1]
    assert inserts == [1]  # every row of the batch in one statement
    # Two high-priority jobs of one group are judged under one lock (SQLite's write lock is enough).
    assert locks == [0 if api.ctx.store.is_sqlite else 1]
    assert isinstance(retried, tuple) and retried[0].id == old.id and not retried[1]
    assert isinstance(a, tuple) and isinstance(b, tuple) and isinstance(plain, tuple)
    assert a[1] and b[1] and plain[1]
    assert isinstance(again, tuple) and again == (again[0], False) and again[0].id == a[0].id
    assert isinstance(unknown, ApiError) and (unknown.status, unknown.field) == (422, "spec.resource_pkg")
    assert isinstance(over, ApiError) and (over.status, over.field) == (409, "max_schedule")
    stored = {old.id, a[0].id, b[0].id, plain[0].id}
    with api.ctx.store.read() as s:
        # The refused submit's row is gone again; each stored job has its one event and change row.
        assert set(s.scalars(select(JobRow.id))) == stored
        assert sorted(s.scalars(select(EventRow.job_id).where(EventRow.kind == "submitted"))) == sorted(
            stored
        )
        assert set(s.scalars(select(ChangeRow.job_id).where(ChangeRow.kind == "job"))) == stored
        assert s.scalars(select(JobRow.client_key).where(JobRow.id == b[0].id)).one() == "b"


def test_a_submit_the_database_refuses_fails_alone_and_the_rest_of_its_batch_is_stored(api: Api) -> None:
    bad = _submit(api, "bad")
    # A value the checks would refuse (ids are bounded), so the database's own error is what is met.
    spec = bad.request.spec.model_copy(update={"model_id": 2**70})
    bad = submission.Submit(ALICE, SubmitRequest.model_construct(spec=spec, client_key="bad"))
    first, failed, last = submission.submit_all(api.ctx, [_submit(api, "x"), bad, _submit(api, "y")])
    assert isinstance(failed, Exception) and not isinstance(failed, ApiError)
    assert isinstance(first, tuple) and isinstance(last, tuple) and first[1] and last[1]
    with api.ctx.store.read() as s:
        assert sorted(s.scalars(select(JobRow.client_key))) == ["x", "y"]
        assert set(s.scalars(select(ChangeRow.job_id).where(ChangeRow.kind == "job"))) == {
            first[0].id,
            last[0].id,
        }


def test_an_error_in_checking_one_submit_is_its_own_and_the_rest_of_its_batch_is_stored(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking one submit may meet what no refusal foresaw (a path swapped as it is resolved): that
    submit gets the error, and the others of its batch are stored as if it had not been there."""
    checks = submission.check_references

    def swapped(ctx: Any, caller: Caller, spec: Any) -> None:
        if spec.task_name == "racing":
            raise OSError(22, "Invalid argument")
        checks(ctx, caller, spec)

    monkeypatch.setattr(submission, "check_references", swapped)
    first, racing, last = submission.submit_all(
        api.ctx, [_submit(api, "x"), _submit(api, "r", task_name="racing"), _submit(api, "y")]
    )
    assert isinstance(racing, OSError)
    assert isinstance(first, tuple) and isinstance(last, tuple) and first[1] and last[1]
    with api.ctx.store.read() as s:
        assert sorted(s.scalars(select(JobRow.client_key))) == ["x", "y"]


def test_a_key_refused_by_the_quota_is_free_for_a_submit_later_in_the_same_batch(api: Api) -> None:
    full = _submit(api, "full", resource_pkg=457, max_schedule=4)  # alice: 8/8
    high = _submit(api, "k", resource_pkg=457, max_schedule=4)
    _, over, low = submission.submit_all(api.ctx, [full, high, _submit(api, "k")])
    assert isinstance(over, ApiError) and over.status == 409
    assert isinstance(low, tuple) and low[1]
    with api.ctx.store.read() as s:
        assert s.scalars(select(JobRow.max_schedule).where(JobRow.client_key == "k")).one() == 0


def _race(api: Api, keys: list[str]) -> tuple[list[submission.Outcome], list[submission.Outcome]]:
    """The same keys stored by two threads at once, one in order and one backwards; both outcomes in
    the keys' order."""
    answers: dict[str, list[submission.Outcome]] = {}
    barrier = threading.Barrier(2)

    def store(name: str, order: list[str]) -> None:
        barrier.wait()
        answers[name] = submission.submit_all(api.ctx, [_submit(api, k) for k in order])

    threads = [
        threading.Thread(target=store, args=("forward", keys)),
        threading.Thread(target=store, args=("backward", keys[::-1])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers["forward"], answers["backward"][::-1]


def test_batches_racing_with_the_same_keys_store_each_job_once(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """Two intake threads may store a retry and its first try at once, in any order: neither batch
    fails (as one would in a deadlock on the unique key, before being stored again one by one)."""
    for round_ in range(3):
        keys = [f"r{round_}-{i}" for i in range(40)]
        forward, backward = _race(api, keys)
        assert all(isinstance(o, tuple) for o in forward + backward), [*forward, *backward]
        for one, other in zip(forward, backward, strict=True):
            assert isinstance(one, tuple) and isinstance(other, tuple)
            assert one[0].id == other[0].id and one[1] != other[1]  # one job, created once
        with api.ctx.store.read() as s:
            stored = s.scalars(select(JobRow.client_key).where(JobRow.client_key.in_(keys))).all()
        assert sorted(stored) == sorted(keys)
    assert not [r.getMessage() for r in caplog.records if r.name == "hai.server.submission"]


def test_a_batch_inserts_its_rows_in_key_order_whatever_order_its_submits_came_in(api: Api) -> None:
    """What keeps the racing batches above from deadlocking: each inserts by (user, client_key), so
    two inserting the same keys wait for each other on the unique key in one order."""
    inserted: list[list[str]] = []

    def seen(_conn: Any, clause: Any, multiparams: Any, *_rest: Any) -> None:
        if str(clause).startswith("INSERT INTO jobs "):
            inserted.append([row["client_key"] for row in multiparams])

    event.listen(api.ctx.store.engine, "before_execute", seen)
    keys = [f"k{i}" for i in range(6)]
    submission.submit_all(api.ctx, [_submit(api, k) for k in [keys[3], *keys[:3][::-1], *keys[4:][::-1]]])
    assert inserted == [keys]
