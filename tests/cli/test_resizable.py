"""Resizable distributed tasks (`--min-workers`): the flag, its refusals, and how a task's size shows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from hai_airflow.cli.task import gpus, processes
from hai_airflow.spec import JobView
from tests.cli.conftest import Hai, free_port, json_out
from tests.cli.test_usage import assert_one_error_line
from tests.support.live_server import LiveServer

DISTRIBUTED = (
    "--task-name=t",
    "--code-path=/tmp",
    "--cmd=x",
    "--mode=distributed",
    "--worker-resource-pkg=457",
)
SUBMIT = ("submit", "distributed", "--name=t", "--code-dir=/tmp", "--workers=2", "--gpus=4")


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        pytest.param(
            ("create", *DISTRIBUTED, "--workers=2", "--min-workers=3"),
            ("--min-workers (3) is more than --workers (2)", "Set --min-workers between 1 and", "hai create"),
            id="more than the workers",
        ),
        pytest.param(
            (*SUBMIT, "--min-workers=3", "x"),
            ("--min-workers (3) is more than --workers (2)", "hai submit distributed --help"),
            id="more than the workers, short form",
        ),
        pytest.param(
            ("create", *DISTRIBUTED, "--workers=2", "--min-workers=0"),
            ("--min-workers", "greater than or equal to 1"),
            id="zero",
        ),
        pytest.param(
            ("create", "--task-name=t", "--code-path=/tmp", "--cmd=x", "--resource-pkg=1", "--min-workers=1"),
            (
                "--min-workers is not valid for a standalone task",
                "Leave out --min-workers",
                "make the task distributed (--mode distributed)",
            ),
            id="a standalone task",
        ),
    ],
)
def test_min_workers_refusals_exit_2_naming_the_flag(
    hai: Hai, args: tuple[str, ...], parts: tuple[str]
) -> None:
    result = hai(*args, "--server", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2, result.output
    assert_one_error_line(result.stderr, *parts)
    assert result.stdout == ""


@pytest.mark.parametrize(
    "elastic", [pytest.param((), id="implied"), pytest.param(("--elastic",), id="given")]
)
def test_min_workers_passes_the_flag_check_with_or_without_elastic(
    hai: Hai, elastic: tuple[str, ...]
) -> None:
    port = free_port()
    result = hai(*SUBMIT, "--min-workers=1", *elastic, "x", "--server", f"http://127.0.0.1:{port}")
    # only asking the (absent) server for the package failed: the flags themselves were accepted
    assert result.exit_code == 1 and f"127.0.0.1:{port}" in result.stderr, result.output


def view(**fields: Any) -> JobView:
    shape = {
        "id": 3, "mode": "distributed", "state": "RUNNING", "priority": "low", "max_schedule": 0,
        "gpus": 32, "gpu_type": "V100", "workers": 4, "submitted_at": datetime(2026, 12, 1, tzinfo=UTC),
        "task_name": "t", "user": "alice", "group": "vision", "spec": {"processes": "per-gpu"},
    }  # fmt: skip
    return JobView.model_validate({**shape, **fields})


@pytest.mark.parametrize(
    ("fields", "shown", "started"),
    [
        pytest.param({}, "32 V100 (4x8)", "per-gpu (32 processes)", id="never resizes: as before"),
        pytest.param({"min_workers": 2}, "32 V100 (4x8, min 2)", "per-gpu (32 processes)", id="at full size"),
        pytest.param(
            {"min_workers": 2, "size": 2},
            "16/32 V100 (2/4 workers x 8, min 2)",
            "per-gpu (16 processes)",
            id="shrunk to 2 of 4",
        ),
        pytest.param(
            {"min_workers": 1, "size": 1, "spec": {"processes": "per-worker"}},
            "8/32 V100 (1/4 workers x 8, min 1)",
            "per-worker (1 process)",
            id="shrunk to 1, a process per worker",
        ),
    ],
)
def test_a_tasks_gpus_show_its_size_and_least_workers(
    fields: dict[str, Any], shown: str, started: str
) -> None:
    job = view(**fields)
    assert (gpus(job), processes(job)) == (shown, started)


def as_user(server: LiveServer, user: str) -> dict[str, str]:
    return {"HAI_SERVER": server.url, "HAI_TOKEN": f"{user}-token"}


def test_a_resizable_task_end_to_end(hai: Hai, clean: LiveServer) -> None:
    alice, bob = as_user(clean, "alice"), as_user(clean, "bob")
    # every GPU of the one node, so the resizable task waits in the queue
    hold = hai("submit", "standalone", "--name=holder", "--gpus=8", "--code-dir=/tmp", "sleep 120", env=alice)
    assert hold.exit_code == 0, hold.output
    made = hai(*SUBMIT, "--min-workers=1", "-o", "json", "sleep 1", env=alice)
    assert made.exit_code == 0, made.output
    job = json_out(made)
    assert (job["workers"], job["min_workers"], job["size"]) == (2, 1, 2)
    assert (job["spec"]["min_workers"], job["spec"]["elastic"]) == (1, True)

    mine = hai("queue", env=alice)
    assert "8 V100 (2x4, min 1)" in mine.stdout, mine.output
    (entry,) = [e for e in json_out(hai("queue", "-o", "json", env=bob)) if e["job"]["id"] == job["id"]]
    shape = entry["job"]
    assert (shape["visibility"], shape["size"], shape["min_workers"], shape["workers"]) == ("other", 2, 1, 2)
    assert not {"spec", "task_name", "user", "group"} & set(shape)

    detail = hai("task", str(job["id"]), env=alice)
    assert "8 V100 (2x4, min 1)" in detail.stdout, detail.output


def test_the_api_refuses_min_workers_over_workers_with_422_naming_it(clean: LiveServer) -> None:
    spec = {
        "mode": "distributed", "task_name": "t", "code_path": "/tmp", "cmd": "x", "workers": 2,
        "worker_resource_pkg": 457, "min_workers": 3,
    }  # fmt: skip
    refused = httpx.post(
        f"{clean.url}/api/v1/jobs",
        json={"spec": spec},
        headers={"Authorization": "Bearer alice-token"},
        timeout=10,
    )
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert "`min_workers` (3) is more than `workers` (2)" in body["error"], body
    assert "min_workers" in body["fix"] and str(body["field"]).startswith("spec"), body


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        pytest.param(
            "mode: distributed\nworkers: 2\nworker_resource_pkg: 457\nmin_workers: 3\n",
            "job.yaml: min_workers (3) is more than workers (2). Set min_workers between 1 and workers",
            id="more than the workers",
        ),
        pytest.param(
            "mode: standalone\nresource_pkg: 457\nmin_workers: 1\n",
            "job.yaml line 6: min_workers is not valid for a standalone task: only a distributed task takes "
            "it. Leave out min_workers, or make the task distributed (mode distributed)",
            id="a standalone task",
        ),
    ],
)
def test_a_job_file_with_min_workers_is_checked_as_the_flags_are(
    hai: Hai, tmp_path: Path, lines: str, message: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("task_name: t\ncode_path: /tmp\ncmd: x\n" + lines, encoding="utf-8")
    result = hai("create", "-f", str(path), "--server", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2, result.output
    assert message in result.stderr.replace(str(tmp_path) + "/", "")
