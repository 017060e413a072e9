"""Start-forecast accuracy: the error figures, the forecasts a replay makes, and `hai sim --forecast`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from sim_builders import JOB_HEADER, NODE_HEADER, job, node, trace, write_csv
from typer.testing import CliRunner

from hai_airflow.cli.sim import sim
from hai_airflow.sim import TraceError, load_jobs
from hai_airflow.sim.accuracy import (
    ForecastAccuracy,
    StartForecast,
    abs_error,
    accuracy,
    accuracy_table,
    is_close,
    is_close_in_minutes,
    median_abs_error,
)
from hai_airflow.sim.sampler import replay_with_forecasts

app = typer.Typer()
app.command()(sim)
runner = CliRunner()


def made(predicted: float | None, started_at: float, made_at: float = 0.0, high: bool = False
         ) -> StartForecast:
    return StartForecast(job_id=1, high=high, made_at=made_at, predicted=predicted, started_at=started_at)


@pytest.mark.parametrize(
    ("forecast", "error", "close", "close_in_minutes"),
    [
        pytest.param(made(3600, 3600), 0.0, True, True, id="exact"),
        pytest.param(made(4500, 3600), 900.0, True, False, id="late by a quarter of the wait"),
        pytest.param(made(2699, 3600), 901.0, False, False, id="early by more than a quarter"),
        pytest.param(made(1500, 1200, made_at=200), 300.0, False, True, id="short wait: within 10 minutes"),
        pytest.param(made(None, 3600), None, False, False, id="no prediction is a miss"),
    ],
)
def test_error_of_one_forecast(forecast, error, close, close_in_minutes) -> None:
    assert abs_error(forecast) == error
    assert is_close(forecast) is close
    assert is_close_in_minutes(forecast) is close_in_minutes


def test_median_error_leaves_out_missing_predictions() -> None:
    forecasts = [made(100, 0, made_at=-1000), made(None, 0, made_at=-1000), made(0, 300, made_at=-1000)]
    assert median_abs_error(forecasts) == 200.0
    assert median_abs_error([made(None, 10)]) is None


def test_figures_of_one_class() -> None:
    forecasts = [
        made(3600, 3600),  # wait 1 h, exact
        made(1600, 1800),  # short wait, started 200 s later than predicted: within 25% and 10 minutes
        made(2400, 1200),  # short wait, 20 minutes late: neither
        made(None, 7200),  # nothing predicted
    ]
    assert accuracy("low", "forecast", forecasts) == ForecastAccuracy(
        priority="low", method="forecast", forecasts=4, predicted=0.75, median_abs_error_s=200.0,
        within_25pct=0.5, short_waits=2, short_within_10min=0.5, started_later=1 / 3,
    )


def test_unknown_has_no_error_and_nothing_within() -> None:
    row = accuracy("high", "unknown", [made(None, 600), made(None, 7200)])
    assert (row.forecasts, row.predicted, row.median_abs_error_s) == (2, 0.0, None)
    assert (row.within_25pct, row.short_waits, row.short_within_10min) == (0.0, 1, 0.0)
    assert row.started_later is None


def test_table_splits_by_class_in_method_order() -> None:
    high, low = made(10, 10, high=True), made(10, 20)
    rows = accuracy_table({"unknown": [high, low], "forecast": [high, low, low]})
    assert [(r.priority, r.method, r.forecasts) for r in rows] == [
        ("high", "forecast", 1), ("high", "unknown", 1), ("low", "forecast", 2), ("low", "unknown", 1),
    ]
    assert rows[2].median_abs_error_s == 10.0


def test_replay_forecasts_exact_limits_exactly_every_ten_minutes() -> None:
    """One node; runtimes equal their limits: every forecast is right, made at the job's first queued
    moment and every 600 s while it waits."""
    cluster = trace([node("n1")], [
        job(1).gpus(8).lasting(3600).limit(3600),
        job(2).gpus(8).at(60).lasting(1800).limit(1800),
    ])
    measured = replay_with_forecasts(cluster, "seed", every=600)
    forecasts = measured.forecasts["forecast"]
    assert [f.made_at for f in forecasts] == [60 + 600 * k for k in range(6)]
    assert {(f.predicted, f.started_at) for f in forecasts} == {(3600.0, 3600.0)}
    assert measured.forecasts["slurm-style"] == forecasts
    assert {f.predicted for f in measured.forecasts["unknown"]} == {None}


def test_history_of_finished_jobs_beats_the_default_limit() -> None:
    """Job 2 has no limit: the forecast takes its user's finished runtime (1000 s) and is right; the
    slurm-style baseline runs it to the default limit and is late by the difference."""
    cluster = trace([node("n1")], [
        job(1).gpus(8).lasting(1000).of("u", "g"),
        job(2).gpus(8).at(1000).lasting(1000).of("u", "g"),
        job(3).gpus(8).at(1100).lasting(100).of("v", "h"),
    ])
    measured = replay_with_forecasts(cluster, "seed", every=600, default_limit=7200)
    first = measured.forecasts["forecast"][0]
    assert (first.job_id, first.made_at, first.predicted, first.started_at) == (3, 1100, 2000, 2000)
    slurm = measured.forecasts["slurm-style"][0]
    assert slurm.predicted == 1000 + 7200


def cli_files(tmp_path: Path, rows: list[list[object]]) -> list[str]:
    nodes = write_csv(tmp_path / "NODES.csv", NODE_HEADER, [["n1", "V100", 8, 96, 768]])
    jobs = write_csv(tmp_path / "JOBS.csv", [*JOB_HEADER, "time_limit", "task_name"], rows)
    return ["--nodes", str(nodes), "--jobs", str(jobs)]


EXACT = [
    [1, 0, 3600, 1, 8, "", 0, "g", "u", "", "", 3600, "train"],
    [2, 60, 1800, 1, 8, "", 0, "g", "u", "", "", 1800, "train"],
]


def test_cli_reports_zero_error_on_exact_limits(tmp_path: Path) -> None:
    result = runner.invoke(app, [*cli_files(tmp_path, EXACT), "--forecast", "--json"])

    assert result.exit_code == 0, result.output
    rows = {(r["priority"], r["method"]): r for r in json.loads(result.stdout)}
    assert rows[("low", "forecast")] == {
        "priority": "low", "method": "forecast", "forecasts": 6, "predicted": 1.0, "median_abs_error_s": 0.0,
        "within_25pct": 1.0, "short_waits": 6, "short_within_10min": 1.0, "started_later": 0.0,
    }
    assert rows[("low", "unknown")]["median_abs_error_s"] is None
    assert rows[("low", "unknown")]["within_25pct"] == 0.0
    assert rows[("high", "forecast")]["forecasts"] == 0


def test_cli_table_names_the_baselines(tmp_path: Path) -> None:
    result = runner.invoke(app, [*cli_files(tmp_path, EXACT), "--forecast", "--default-time-limit", "7200"])

    assert result.exit_code == 0, result.output
    assert "slurm-style" in result.stdout and "unknown" in result.stdout and "2h" in result.stdout


def test_cli_refuses_forecast_with_compare(tmp_path: Path) -> None:
    result = runner.invoke(app, [*cli_files(tmp_path, EXACT), "--forecast", "--compare", "seed,fifo"])

    assert result.exit_code == 2
    assert "--forecast measures one policy" in result.output


def test_a_limit_below_the_duration_is_refused_naming_the_column(tmp_path: Path) -> None:
    rows = [[1, 0, 3600, 1, 8, "", 0, "g", "u", "", "", 600, ""]]
    result = runner.invoke(app, [*cli_files(tmp_path, rows), "--forecast"])

    assert result.exit_code == 2
    assert "column 'time_limit'" in result.output
    with pytest.raises(TraceError, match="'time_limit': 'soon' is not a positive number"):
        load_jobs(write_csv(tmp_path / "bad.csv", [*JOB_HEADER, "time_limit"],
                            [[1, 0, 10, 1, 1, "", 0, "", "", "", "", "soon"]]))


def test_limit_and_task_name_are_read_and_optional(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "JOBS.csv", [*JOB_HEADER, "time_limit", "task_name"], [
        [1, 0, 10, 1, 1, "", 0, "", "", "", "", 60, "bert"],
        [2, 0, 10, 1, 1, "", 0, "", "", "", "", "", ""],
    ])
    first, second = load_jobs(path)
    assert (first.time_limit, first.task_name) == (60.0, "bert")
    assert (second.time_limit, second.task_name) == (None, "")
