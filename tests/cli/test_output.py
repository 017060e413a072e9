"""The one output function and the formatters every listing uses."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from hai_airflow.cli.output import JSON, Column, Section, duration, emit, gpu_list, placement, when
from hai_airflow.spec import QuotaUsageView, QuotaView, WorkerPlacementView


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0, "0s", id="nothing run yet"),
        pytest.param(7.4, "7s", id="seconds round"),
        pytest.param(245, "4m05s", id="minutes pad seconds"),
        pytest.param(3723, "1h02m03s", id="hours pad minutes and seconds"),
        pytest.param(None, "0s", id="missing is zero"),
    ],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("gpus", "text"),
    [
        pytest.param((), "", id="none"),
        pytest.param((3,), "3", id="one"),
        pytest.param((0, 1, 2, 3, 4, 5, 6, 7), "0-7", id="whole machine"),
        pytest.param((6, 0, 2, 1), "0-2,6", id="unordered with a gap"),
    ],
)
def test_gpu_list_collapses_runs(gpus: tuple[int, ...], text: str) -> None:
    assert gpu_list(gpus) == text


def test_placement_names_node_and_gpus_of_every_worker() -> None:
    workers = (
        WorkerPlacementView(node="node-a", gpus=(0, 1, 2, 3, 4, 5, 6, 7)),
        WorkerPlacementView(node="node-b", gpus=(4, 5)),
        WorkerPlacementView(node="cpu-node", gpus=()),
    )
    assert placement(workers) == "node-a:gpu0-7 node-b:gpu4-5 cpu-node"
    assert placement(()) is None


def test_when_reads_naive_times_as_utc_and_prints_local_time() -> None:
    aware = datetime(2024, 5, 1, 12, 0, 3, tzinfo=UTC)
    naive = datetime(2024, 5, 1, 12, 0, 3)
    local = aware.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    assert when(aware) == when(naive) == local
    assert when(aware.astimezone(timezone(timedelta(hours=8)))) == local
    assert when(None) is None


QUOTA = QuotaView(
    group="视觉组",
    group_quota_gpus=16,
    group_used_gpus=8,
    user="alice",
    user_quota_gpus=8,
    user_used_gpus=8,
    users=(QuotaUsageView(user="alice", used_gpus=8),),
)
COLUMNS = (Column("GROUP HEADER", lambda q: q.group), Column("USED", lambda q: q.group_used_gpus))


def test_json_keys_are_api_field_names_not_headers(capsys: pytest.CaptureFixture[str]) -> None:
    emit([QUOTA], COLUMNS, out=JSON)
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert rows == [QUOTA.model_dump(mode="json")]
    assert "GROUP HEADER" not in out.out
    assert "视觉组" in out.out, "Chinese stays readable, not \\u-escaped"


def test_one_record_as_json_is_an_object_with_nested_sections(capsys: pytest.CaptureFixture[str]) -> None:
    users = Section("Who", QUOTA.users, (Column("USER", lambda u: u.user),))
    emit(QUOTA, COLUMNS, out=JSON, sections=(users,))
    data = json.loads(capsys.readouterr().out)
    assert data["group"] == "视觉组"
    assert data["users"] == [u.model_dump(mode="json") for u in QUOTA.users]
    assert data["users"][0]["user"] == "alice" and data["users"][0]["used_gpus"] == 8


def test_table_goes_to_stdout_one_row_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    emit([QUOTA, QUOTA.model_copy(update={"group": "[red]nlp[/red]"})], COLUMNS)
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert "GROUP HEADER" in lines[0]
    assert any("视觉组" in line and "8" in line for line in lines)
    assert any("[red]nlp[/red]" in line for line in lines), "names print as written, not as markup"
    assert all(line == line.rstrip() for line in lines), "no padding left at line ends for grep/awk"
    assert out.err == ""


def test_empty_listing_says_so_on_stderr_and_prints_no_data(capsys: pytest.CaptureFixture[str]) -> None:
    emit([], COLUMNS, empty="no tasks yet")
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip() == "no tasks yet"
    emit([], COLUMNS, out=JSON)
    assert json.loads(capsys.readouterr().out) == []
