"""Chart geometry and formatting: bars, GPU grids, time lines, GPU ranges and durations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hai_airflow.dashboard.formatting import duration, gpu_ranges, job_colour, number
from hai_airflow.dashboard.svg import BAR_WIDTH, CELLS_PER_ROW, job_timeline, node_grid, quota_bar
from hai_airflow.spec import InstanceView, NodeView
from tests.dashboard.snapshot import at, job, place


@pytest.mark.parametrize(
    ("gpus", "text"),
    [
        pytest.param((), "", id="none"),
        pytest.param((0, 1, 2, 3, 6), "0–3, 6", id="one block and a single"),
        pytest.param((7, 5, 6, 1), "1, 5–7", id="unsorted"),
    ],
)
def test_gpu_ranges(gpus: tuple[int, ...], text: str) -> None:
    assert gpu_ranges(gpus) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59.9, "59s"),
        (185, "3m 05s"),
        (7800, "2h 10m"),
        (3 * 86400 + 4 * 3600, "3d 4h"),
        (-5, "0s"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_number_and_colours() -> None:
    assert number(1e9 - 28_000) == "999,972,000" and number(2.5) == "2.5" and number(-3) == "-3"
    assert len({job_colour(i) for i in range(1, 9)}) == 8


@pytest.mark.parametrize(
    ("used", "limit", "fill", "over", "text"),
    [
        pytest.param(4, 8, BAR_WIDTH / 2, False, "4 / 8 GPUs", id="half"),
        pytest.param(12, 8, BAR_WIDTH, True, "12 / 8 GPUs", id="over the limit is capped and flagged"),
        pytest.param(2, 0, BAR_WIDTH, True, "2 / 0 GPUs", id="zero quota"),
        pytest.param(3, None, 0, False, "3 GPUs · no limit", id="unlimited"),
    ],
)
def test_quota_bar(used: int, limit: int | None, fill: float, over: bool, text: str) -> None:
    bar = quota_bar(used, limit)
    assert (bar.fill, bar.over, bar.text) == (fill, over, text)


def test_node_grid_wraps_rows_and_lists_free_blocks() -> None:
    node = NodeView(
        name="n",
        gpu_type="A100",
        gpus=16,
        cpus=1,
        memory_gb=1,
        virtual=False,
        free_gpus=(8, 9, 10, 15),
        holders={i: 4 for i in range(8)} | {11: 5, 12: 5, 13: 5, 14: 5},
    )
    grid = node_grid(node)
    assert len(grid.cells) == 16 and grid.cells[CELLS_PER_ROW].y > 0 and grid.cells[CELLS_PER_ROW].x == 0
    assert grid.free_blocks == "8–10, 15" and grid.job_ids == [4, 5]
    assert grid.cells[8].job_id is None and grid.cells[0].colour == job_colour(4)


def test_timeline_of_a_job_still_suspended_ends_with_the_suspension() -> None:
    j = job(1, "a", "g", "SUSPENDED", 4)
    runs = [
        InstanceView(
            id=3,
            job_id=1,
            started_at=at(10),
            ended_at=at(50),
            placement=place("n", 0),
            end_reason="preempted",
            preempted_by=8,
        )
    ]
    t = job_timeline(j, runs, at(100))
    assert [(s.kind, s.preempted_by) for s in t.segments] == [("queued", None), ("run", 8), ("suspended", 8)]
    xs = [s.x for s in t.segments]
    assert xs == sorted(xs) and t.segments[-1].x + t.segments[-1].width == pytest.approx(
        t.width - 40, abs=0.2
    )
    assert [k.label for k in t.ticks][:3] == ["0", "+15s", "+30s"]


def test_timeline_of_a_failed_run_after_a_lost_one() -> None:
    j = job(2, "a", "g", "FAILED", 1, ended_at=at(40))
    runs = [
        InstanceView(id=1, job_id=2, started_at=at(0), ended_at=at(10), end_reason="lost"),
        InstanceView(id=2, job_id=2, started_at=at(20), ended_at=at(40), end_reason="failed", resume=True),
        InstanceView(id=3, job_id=2, started_at=None),
    ]
    t = job_timeline(j, runs, at(500))
    assert [(s.kind, s.end_reason) for s in t.segments] == [
        ("run", "lost"),
        ("suspended", None),
        ("run", "failed"),
    ]
    assert t.t1 == at(40)
    assert "lost (instance 1)" in t.segments[1].note


def test_usage_charts_stack_days_scale_to_a_round_top_and_plot_every_hour() -> None:
    from hai_airflow.dashboard.charts import BOTTOM, HEIGHT, TOP, gpu_hours_by_day, nice_top, waiting_by_hour
    from hai_airflow.spec import UsageHistoryView, UsageSeriesView

    assert [nice_top(v) for v in (0, 0.004, 3, 7, 10, 11)] == [1.0, 0.005, 5, 10, 10, 20]
    day = datetime(2026, 12, 1, tzinfo=UTC)
    history = UsageHistoryView(
        by="group", since=day, until=day + timedelta(days=2), days=(day, day + timedelta(days=1)),
        series=(
            UsageSeriesView(name="nlp", gpu_hours=(3.0, 0.0)),
            UsageSeriesView(name="vision", gpu_hours=(4.0, 1.0)),
        ),
        cluster_gpus=8, waiting=tuple(range(48)),
    )  # fmt: skip
    bars = gpu_hours_by_day(history)
    first_day = [b for b in bars.boxes if "2026-12-01" in b.title]
    assert [b.title for b in first_day] == [
        "nlp on 2026-12-01: 3.0 GPU-hours", "vision on 2026-12-01: 4.0 GPU-hours",
    ]  # fmt: skip
    plot = HEIGHT - BOTTOM - TOP
    assert sum(b.height for b in first_day) == pytest.approx(plot * 7 / 10), "stacked to 7 of a top of 10"
    assert len(bars.boxes) == 3, "no box for a day without use"
    assert bars.legend == (("nlp", "#2f5bd3"), ("vision", "#e08a2c"))
    assert len(waiting_by_hour(history).points.split()) == 48
