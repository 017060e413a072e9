"""`hai sim` through typer's runner: exit codes, JSON figures, and errors naming line and column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from sim_builders import JOB_HEADER, NODE_HEADER, write_csv
from typer.testing import CliRunner

from hai_airflow.cli.sim import sim
from hai_airflow.scheduling import POLICIES

app = typer.Typer()
app.command()(sim)
runner = CliRunner()

NODES = [["n1", "V100", 8, 96, 768]]
LOW_THEN_HIGH = [
    [1, 0, 10000, 1, 8, "", 0, "", "", "", ""],
    [2, 4000, 1000, 1, 8, "V100", 4, "g", "u", 80, 640],
]


def files(
    tmp_path: Path, jobs: list[list[object]] = LOW_THEN_HIGH, header: list[str] = JOB_HEADER
) -> list[str]:
    nodes = write_csv(tmp_path / "NODES.csv", NODE_HEADER, NODES)
    trace = write_csv(tmp_path / "JOBS.csv", header, jobs)
    return ["--nodes", str(nodes), "--jobs", str(trace)]


def test_json_reports_the_known_figures(tmp_path):
    result = runner.invoke(app, [*files(tmp_path), "--json", "--checkpoint-interval", "1800"])

    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["policy"] == "seed"
    assert figures["jobs_finished"] == 2
    assert figures["suspensions"] == 1
    assert figures["makespan_s"] == pytest.approx(11_400)
    assert figures["lost_gpu_hours"] == pytest.approx(400 * 8 / 3600)


def test_quota_file_downgrades_a_high_job(tmp_path):
    quotas = tmp_path / "quotas.toml"
    quotas.write_text(
        '[[groups]]\nname = "g"\nquota_gpus = 16\n[[users]]\nname = "u"\ngroup = "g"\nquota_gpus = 4\n'
    )

    result = runner.invoke(app, [*files(tmp_path), "--config", str(quotas), "--json"])

    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert (figures["downgraded_to_low"], figures["suspensions"]) == (1, 0)


def test_compare_runs_every_policy_on_the_same_trace(tmp_path):
    result = runner.invoke(app, [*files(tmp_path), "--compare", ",".join(POLICIES), "--json"])

    assert result.exit_code == 0, result.output
    by_policy = {f["policy"]: f for f in json.loads(result.stdout)}
    assert list(by_policy) == list(POLICIES)
    assert by_policy["fifo"]["suspensions"] == 0
    assert by_policy["seed"]["suspensions"] == 1


def test_tables_name_every_policy(tmp_path):
    single = runner.invoke(app, files(tmp_path))
    side_by_side = runner.invoke(app, [*files(tmp_path), "--compare", "seed,fifo"])

    assert single.exit_code == 0, single.output
    assert "lost GPU-hours" in single.stdout and "0.89" in single.stdout
    assert side_by_side.exit_code == 0, side_by_side.output
    assert "seed" in side_by_side.stdout and "fifo" in side_by_side.stdout


@pytest.mark.parametrize(
    ("row", "line", "column"),
    [
        pytest.param([3, 5, 10, 0, 1, "", 0, "", "", "", ""], 4, "workers", id="zero workers"),
        pytest.param([3, "soon", 10, 1, 1, "", 0, "", "", "", ""], 4, "submit_time",
                     id="a time that is not a number"),
        pytest.param([3, 5, -1, 1, 1, "", 0, "", "", "", ""], 4, "duration", id="a negative duration"),
        pytest.param([3, 5, "", 1, 1, "", 0, "", "", "", ""], 4, "duration", id="an empty duration"),
        pytest.param([3, 5, 10, 1, 1, "", 5, "", "", "", ""], 4, "max_schedule",
                     id="max_schedule not a choice"),
        pytest.param([1, 5, 10, 1, 1, "", 0, "", "", "", ""], 4, "job_id", id="a duplicate job id"),
        pytest.param([3, 5, 10, 1, 1.5, "", 0, "", "", "", ""], 4, "gpus_per_worker", id="fractional GPUs"),
        pytest.param([3, 5, 10, 1, 1, "", 0, "", "", "x", ""], 4, "cpus", id="cpus not a number"),
    ],
)
def test_a_malformed_job_row_exits_2_naming_line_and_column(tmp_path, row, line, column):
    result = runner.invoke(app, files(tmp_path, [*LOW_THEN_HIGH, row]))

    assert result.exit_code == 2
    assert f"JOBS.csv line {line}, column '{column}'" in result.stderr
    assert result.stderr.startswith("Error: ")


def test_a_missing_column_is_named_on_line_1(tmp_path):
    header = [c for c in JOB_HEADER if c != "duration"]
    result = runner.invoke(app, files(tmp_path, [row[:2] + row[3:] for row in LOW_THEN_HIGH], header))

    assert result.exit_code == 2
    assert "JOBS.csv line 1, column 'duration': missing column" in result.stderr


def test_a_file_that_is_not_utf8_exits_2(tmp_path):
    args = files(tmp_path)
    (tmp_path / "JOBS.csv").write_bytes(",".join(JOB_HEADER).encode() + b"\n1,0,10,1,1,\xff\xfe,0,,,,\n")

    result = runner.invoke(app, args)

    assert result.exit_code == 2
    assert "JOBS.csv line 2: not UTF-8 text" in result.stderr


def test_a_malformed_node_row_exits_2(tmp_path):
    args = files(tmp_path)
    write_csv(tmp_path / "NODES.csv", NODE_HEADER, [*NODES, ["n2", "A100", "many", 96, 768]])

    result = runner.invoke(app, args)

    assert result.exit_code == 2
    assert "NODES.csv line 3, column 'gpus'" in result.stderr


def test_a_malformed_quota_file_exits_2(tmp_path):
    quotas = tmp_path / "quotas.toml"
    quotas.write_text('[[groups]]\nname = "g"\nquota_gpus = -3\n')

    result = runner.invoke(app, [*files(tmp_path), "--config", str(quotas)])

    assert result.exit_code == 2
    assert "groups[0].quota_gpus" in result.stderr


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--policy", "random"], id="unknown policy"),
        pytest.param(["--compare", "seed,lottery"], id="unknown policy in --compare"),
        pytest.param(["--checkpoint-interval", "-5"], id="negative checkpoint interval"),
    ],
)
def test_bad_flags_exit_2(tmp_path, flags):
    result = runner.invoke(app, [*files(tmp_path), *flags])

    assert result.exit_code == 2


def test_a_missing_file_exits_2(tmp_path):
    result = runner.invoke(app, ["--nodes", str(tmp_path / "nope.csv"), "--jobs", str(tmp_path / "nope.csv")])

    assert result.exit_code == 2
    assert "nope.csv" in result.stderr
