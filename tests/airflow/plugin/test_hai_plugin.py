"""The plugin: the priority-weight strategy (registered, serialised, the platform's order) and the pools."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from hai_airflow.airflow_plugin.listener import PoolFollower, PoolSyncListener
from hai_airflow.airflow_plugin.pools import POOL_NOTE, apply_pools, sync_pools
from hai_airflow.airflow_plugin.priority import HaiPriorityWeightStrategy, declared_max_schedule, hai_weight
from hai_airflow.cli.airflow_cmd import app
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from tests.airflow.helpers import load_dag, task_states
from tests.support.live_server import LiveServer, free_port

STRATEGY = "hai_airflow.airflow_plugin.priority.HaiPriorityWeightStrategy"


@pytest.fixture
def clean_pools() -> Iterator[Callable[[], dict[str, Any]]]:
    """Reads the hai_* pools; removes them afterwards so tests do not see each other's."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    def read() -> dict[str, Any]:
        with create_session() as session:
            return {
                p.pool: (p.slots, p.include_deferred)
                for p in Pool.get_pools(session=session)
                if p.pool.startswith("hai_")
            }

    yield read
    with create_session() as session:
        for pool in Pool.get_pools(session=session):
            if pool.pool.startswith("hai_"):
                session.delete(pool)


# ---- the priority-weight strategy ------------------------------------------------------------


def test_strategy_is_registered_by_the_plugin_entry_point() -> None:
    from airflow import plugins_manager

    assert plugins_manager.get_priority_weight_strategy_plugins()[STRATEGY] is HaiPriorityWeightStrategy
    names = {p["name"]: p for p in plugins_manager.get_plugin_info()}
    assert "hai" in names and "PoolSyncListener" in str(names["hai"]["listeners"])


def test_strategy_survives_dag_serialisation() -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    dag = load_dag("hai_over_quota_wait")
    encoded = DagSerialization.serialize_dag(dag)
    json.dumps(encoded)
    (task,) = DagSerialization.deserialize_dag(encoded).tasks
    assert isinstance(task.weight_rule, HaiPriorityWeightStrategy)
    assert task.hai_max_schedule == 4
    assert (task.pool, task.pool_slots) == ("hai_vision", 1)


@pytest.mark.parametrize(
    ("value", "params", "expected"),
    [
        pytest.param(4, {}, 4, id="literal"),
        pytest.param("{{ params.max_schedule }}", {"max_schedule": 24}, 24, id="param default"),
        pytest.param("{{ params['prio'] }}", {"prio": 0}, 0, id="param by key"),
        pytest.param("{{ dag_run.conf['x'] }}", {}, None, id="anything else is unknown"),
        pytest.param(None, {}, None, id="not a hai task"),
    ],
)
def test_declared_max_schedule(value: object, params: dict[str, Any], expected: int | None) -> None:
    from airflow.sdk import BaseOperator

    task = BaseOperator(task_id="t", params=params)
    task.hai_max_schedule = value  # type: ignore[attr-defined]
    assert declared_max_schedule(task) == expected


def test_weight_orders_by_the_platform_deadline_rule() -> None:
    now = 1_800_000_000.0
    urgent, relaxed, low = hai_weight(4, now), hai_weight(24, now), hai_weight(0, now)
    assert urgent > relaxed > low == 0
    # the same max_schedule asked later has a later deadline, so a lower weight
    assert hai_weight(4, now) > hai_weight(4, now + 60)
    # and still fits the int32 Airflow stores
    assert all(-(2**31) <= w < 2**31 for w in (urgent, relaxed, low))


def test_weights_airflow_stores_put_high_priority_tasks_first() -> None:
    high = load_dag("hai_over_quota_wait").test(mark_success_pattern=".*")
    low = load_dag("hai_deferred").test(mark_success_pattern=".*")
    (high_ti,) = high.get_task_instances()
    (low_ti,) = low.get_task_instances()
    assert task_states(high) == {"train": "success"}
    assert low_ti.priority_weight == 1
    assert high_ti.priority_weight > 900_000_000


# ---- pools ------------------------------------------------------------------------------------


def test_operators_take_their_groups_pool_only_when_they_would_wait_for_quota() -> None:
    def op(**kw: Any) -> HaiStandaloneTrainingOperator:
        return HaiStandaloneTrainingOperator(
            task_id="t", code_path="/c", cmd="x", resource_group="vision", **kw
        )

    assert (op(max_schedule=4, gpus=2).pool, op(max_schedule=4, gpus=2).pool_slots) == ("hai_vision", 2)
    assert op(max_schedule=0, gpus=2).pool == "default_pool"
    assert op(max_schedule=4, gpus=2, on_over_quota="downgrade").pool == "default_pool"
    assert op(max_schedule="{{ params.p }}", gpus=2).pool == "default_pool"
    assert op(max_schedule=4, gpus=2, pool="mine").pool == "mine"


@pytest.mark.parametrize(
    ("kwargs", "slots"),
    [
        pytest.param({"gpus": 2}, 2, id="a package of exactly the GPUs asked"),
        pytest.param({"gpus": 3}, 4, id="the 4-GPU package hai submit picks for 3"),
        pytest.param({"resource_pkg": 457}, 8, id="a package named: its GPUs"),
        pytest.param({"workers": 2, "gpus_per_worker": 3}, 8, id="distributed: workers x the package's"),
        pytest.param({"workers": 2, "worker_resource_pkg": 455}, 4, id="distributed with a package"),
        pytest.param({"resource_pkg": "{{ params.p }}"}, None, id="templated: unknown, no pool"),
    ],
)
def test_pool_slots_are_the_gpus_of_the_package_the_job_will_take(
    kwargs: dict[str, Any], slots: int | None, hai_conn: Callable[..., LiveServer]
) -> None:
    from hai_airflow.operators import package_choice
    from hai_airflow.operators.distributed import HaiDistributedTrainingOperator

    hai_conn()
    package_choice._packages_seen.clear()
    kind = HaiDistributedTrainingOperator if "workers" in kwargs else HaiStandaloneTrainingOperator
    task = kind(task_id="t", code_path="/c", cmd="x", resource_group="vision", max_schedule=4, **kwargs)
    assert (task.pool, task.pool_slots) == (("hai_vision", slots) if slots else ("default_pool", 1))


def test_pool_slots_fall_back_to_the_gpus_asked_when_the_server_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hai_airflow.operators import package_choice

    down = json.dumps({"conn_type": "hai", "host": f"http://127.0.0.1:{free_port()}", "password": "x"})
    monkeypatch.setenv("AIRFLOW_CONN_HAI_DEFAULT", down)
    package_choice._packages_seen.clear()
    task = HaiStandaloneTrainingOperator(
        task_id="t", code_path="/c", cmd="x", resource_group="vision", max_schedule=4, gpus=3
    )
    assert (task.pool, task.pool_slots) == ("hai_vision", 3)
    named = HaiStandaloneTrainingOperator(
        task_id="u", code_path="/c", cmd="x", resource_group="vision", max_schedule=4, resource_pkg=457
    )
    assert named.pool == "default_pool"  # its GPUs are unknown: no pool rather than a wrong count


def test_sync_mirrors_every_group_quota(
    hai_conn: Callable[..., LiveServer], clean_pools: Callable[[], dict]
) -> None:
    server = hai_conn()
    first = {c.pool: c.action for c in sync_pools()}
    assert first == {"hai_default": "created", "hai_vision": "created", "hai_nlp": "created"}
    assert clean_pools() == {"hai_default": (-1, True), "hai_vision": (8, True), "hai_nlp": (16, True)}

    with server.client() as admin:
        admin.set_group_quota("vision", 4)
    again = {c.pool: c.action for c in sync_pools()}
    assert again == {"hai_default": "unchanged", "hai_vision": "updated", "hai_nlp": "unchanged"}
    assert clean_pools()["hai_vision"] == (4, True)


def test_sync_deletes_only_the_pools_it_made(hai_server: LiveServer, clean_pools: Callable[[], dict]) -> None:
    from airflow.models.pool import Pool

    Pool.create_or_update_pool("hai_gone", 3, POOL_NOTE.format(group="gone"), True)
    Pool.create_or_update_pool("hai_handmade", 3, "made by a person", False)
    with hai_server.client() as admin:
        changes = apply_pools(admin.quotas())
    assert {c.pool: c.action for c in changes}["hai_gone"] == "deleted"
    assert "hai_gone" not in clean_pools() and "hai_handmade" in clean_pools()


def test_cli_sync_pools(
    hai_server: LiveServer, clean_pools: Callable[[], dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAI_TOKEN", hai_server.token)
    result = CliRunner().invoke(app, ["sync-pools", "--server", hai_server.url, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["pool"]: r["slots"] for r in rows} == {"hai_default": -1, "hai_vision": 8, "hai_nlp": 16}
    assert set(clean_pools()) == {"hai_default", "hai_vision", "hai_nlp"}

    down = CliRunner().invoke(app, ["sync-pools", "--server", "http://127.0.0.1:9"])
    assert down.exit_code == 1 and "Error:" in down.output


def test_cli_sync_pools_through_an_airflow_connection(
    hai_conn: Callable[..., LiveServer], clean_pools: Callable[[], dict]
) -> None:
    hai_conn("carol-token")  # a vision group admin sees her group only
    result = CliRunner().invoke(app, ["sync-pools", "--conn-id", "hai_default", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["pool"] for r in json.loads(result.stdout)] == ["hai_vision"]


def _job(job_type: str | None) -> Any:
    """What a follower reads of the job it runs in. Not a real `Job`: making one calls the plugin's
    listener, whose follower would live on in this test process."""
    return SimpleNamespace(job_type=job_type)


def test_the_scheduler_keeps_the_pools_following_the_cluster(
    hai_conn: Callable[..., LiveServer], clean_pools: Callable[[], dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hai server that comes up after Airflow and a quota raised later reach the pools by themselves."""
    down = json.dumps({"conn_type": "hai", "host": f"http://127.0.0.1:{free_port()}", "password": "x"})
    server = hai_conn()
    monkeypatch.setenv("AIRFLOW_CONN_HAI_DEFAULT", down)
    listener = PoolSyncListener()
    before = dict(PoolSyncListener.followers)
    listener.on_starting(component=object())  # a task runner: not a service, nothing starts
    assert PoolSyncListener.followers == before
    follower = PoolFollower("hai_default", interval=0.2, owner=_job("SchedulerJob")).start()
    try:
        time.sleep(1)  # the server is down: logged, never raised
        assert follower.thread.is_alive() and clean_pools() == {}
        hai_conn()  # the hai server is up now
        wait_until(lambda: clean_pools().get("hai_vision") == (8, True), "the pool of vision")
        with server.client() as admin:
            admin.set_group_quota("vision", 12)
        wait_until(lambda: clean_pools().get("hai_vision") == (12, True), "the raised quota")
    finally:
        follower.stopped.set()
        follower.thread.join(5)
    # none outlives its test: one left running would sync (and log) in this process every 15 s
    assert [t for t in threading.enumerate() if t.name == "hai-pool-follower"] == []


def test_only_the_scheduler_syncs_the_pools(
    hai_conn: Callable[..., LiveServer], clean_pools: Callable[[], dict]
) -> None:
    hai_conn()
    follower = PoolFollower("hai_default", interval=0.2, owner=_job(None))
    follower.start()
    follower.owner.job_type = "TriggererJob"  # set by the job's runner, after the listener ran
    follower.thread.join(5)
    assert not follower.thread.is_alive() and clean_pools() == {}


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# ---- provider metadata ------------------------------------------------------------------------


def test_provider_info_is_valid_and_registers_the_connection_type() -> None:
    import importlib.resources

    import jsonschema
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from hai_airflow.provider_info import get_provider_info

    schema = json.loads((importlib.resources.files("airflow") / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    hook = ProvidersManagerTaskRuntime().hooks["hai"]
    assert hook is not None and hook.hook_class_name == "hai_airflow.hooks.hai.HaiHook"


def test_plugins_folder_copy_stays_quiet_when_the_entry_point_loads_the_plugin() -> None:
    import runpy

    from tests.airflow.helpers import REPO

    module = runpy.run_path(str(REPO / "plugins" / "hai_plugin.py"))
    assert "HaiPlugin" not in module  # Airflow would otherwise register "hai" twice


def test_connection_form_and_job_link_come_from_provider_metadata() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    behaviour = manager.field_behaviours["hai"]
    assert set(behaviour["hidden_fields"]) == {"schema", "login", "port"}
    assert behaviour["relabeling"] == {"host": "Server URL", "password": "API token"}
    widgets = manager.connection_form_widgets
    assert widgets["extra__hai__region"].field["schema"]["title"] == "Region"
    assert "extra__hai__user_map" in widgets
    assert "hai_airflow.dashboard.extra_link.HaiJobLink" in manager.extra_links_class_names


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        pytest.param(["providers", "behaviours"], "hai", id="behaviours"),
        pytest.param(["providers", "links"], "hai_airflow.dashboard.extra_link.HaiJobLink", id="links"),
    ],
)
def test_airflow_providers_cli_lists_hai(command: list[str], expected: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "airflow", *command, "--output", "plain"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout.split()
