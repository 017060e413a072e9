"""Identity through Airflow: whom a run acts for, the user map, and a service token acting for them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hai_airflow.client import HaiError
from hai_airflow.hooks.hai import HaiHook
from hai_airflow.hooks.identity import NobodyToActFor, Person, hai_user_name, person_behind, user_map
from hai_airflow.spec import ON_BEHALF_OF, CpuJobSpec
from tests.airflow.helpers import DAG_TEST_USER, SERVICE_TOKEN, connection_json, load_dag, task_states, xcom
from tests.support.live_server import LiveServer


@pytest.mark.parametrize(
    ("triggering_user", "hai_user", "owner", "expected"),
    [
        pytest.param(
            "alice",
            "bob",
            "carol",
            Person(airflow_user="alice", source="triggering user"),
            id="a manual trigger acts for who triggered it, whatever the DAG says",
        ),
        pytest.param(
            None,
            "bob",
            "carol",
            Person(airflow_user="bob", source="hai_user"),
            id="a scheduled run: hai_user first",
        ),
        pytest.param(
            None, None, "carol", Person(airflow_user="carol", source="owner"), id="then the declared owner"
        ),
        pytest.param(
            None,
            "",
            "airflow, carol",
            Person(airflow_user="carol", source="owner"),
            id="Airflow's default owner names nobody",
        ),
        pytest.param(" ", None, " dave ", Person(airflow_user="dave", source="owner"), id="blanks ignored"),
    ],
)
def test_person_behind_a_run(
    triggering_user: str | None, hai_user: str | None, owner: str | None, expected: Person
) -> None:
    assert person_behind(triggering_user=triggering_user, hai_user=hai_user, owner=owner) == expected


@pytest.mark.parametrize(
    ("owner", "message"),
    [
        pytest.param("airflow", "declares no owner", id="only Airflow's default owner"),
        pytest.param(None, "declares no owner", id="no owner at all"),
        pytest.param("alice,bob", "lists several people", id="several owners"),
    ],
)
def test_a_run_with_nobody_behind_it_is_refused(owner: str | None, message: str) -> None:
    with pytest.raises(NobodyToActFor, match=message) as e:
        person_behind(triggering_user=None, hai_user=None, owner=owner)
    assert "hai_user" in str(e.value) and "does not fall back" in str(e.value)


def test_user_map() -> None:
    mapping = user_map({"user_map": {"alice@corp.com": "alice"}})
    assert hai_user_name("alice@corp.com", mapping) == "alice"
    assert hai_user_name("bob", mapping) == "bob", "unmapped names are the same"
    assert user_map({}) == {}
    with pytest.raises(ValueError, match="`user_map` must be an object of names"):
        user_map({"user_map": ["alice"]})


def use_service(
    hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch, mapping: dict[str, str] | None = None
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_HAI_DEFAULT", connection_json(hai_server, SERVICE_TOKEN, user_map=mapping or {})
    )


def test_the_service_acts_for_a_person_it_covers(
    hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_service(hai_server, monkeypatch, {"alice@corp.com": "alice"})
    hook = HaiHook()
    acting = hook.act_for("alice@corp.com")
    assert (acting.user, acting.group, acting.on_behalf_of, acting.token_user) == (
        "alice",
        "vision",
        "alice",
        "airflow",
    )
    job = hook.get_conn().submit(CpuJobSpec(task_name="for alice", code_path="/tmp", cmd="true"))
    hook.close()
    with hai_server.client("alice-token") as alice:
        mine = alice.job(job.id)
    assert (mine.user, mine.submitted_via) == ("alice", "airflow")


def test_acting_as_the_tokens_own_user_sends_no_header(hai_conn: Callable[..., LiveServer]) -> None:
    hai_conn("bob-token")  # a personal token: bob's own runs work as before
    hook = HaiHook()
    acting = hook.act_for("bob")
    assert (acting.user, acting.on_behalf_of) == ("bob", None)
    hook.close()


def test_a_person_outside_acts_for_is_refused(
    hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_service(hai_server, monkeypatch)
    with pytest.raises(HaiError) as e:
        HaiHook().act_for("dave")
    assert (e.value.status, e.value.field) == (403, ON_BEHALF_OF)


@pytest.mark.parametrize("dag_id", ["hai_deferred", "hai_blocking"], ids=["deferred", "blocking"])
def test_a_dag_run_submits_for_its_person_and_the_wait_stays_theirs(
    hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch, dag_id: str
) -> None:
    use_service(hai_server, monkeypatch, {DAG_TEST_USER: "bob"})
    run = load_dag(dag_id).test(run_conf={"cmd": "sleep 1"})

    assert task_states(run) == {"stage": "success"}
    with hai_server.client("bob-token") as bob:
        job = bob.job(xcom(run, "stage")["job_id"])
    assert (job.user, job.submitted_via, job.state) == ("bob", "airflow", "SUCCEEDED")
    with hai_server.client("alice-token") as alice:
        assert job.id not in {j.id for j in alice.jobs(all=True)}


def test_a_run_the_service_may_not_act_for_fails_without_submitting(
    hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    use_service(hai_server, monkeypatch)  # dag_test is no hai user
    run = load_dag("hai_blocking").test(run_conf={"cmd": "true"})

    assert task_states(run) == {"stage": "failed"}
    out = capfd.readouterr().out
    assert "hai will not let connection 'hai_default' act for dag_test (the run's triggering user)" in out
    with hai_server.client() as admin:
        assert admin.jobs(all=True) == []
