"""`--processes`: one process per GPU or per worker, from the flag to the stored spec and `hai task`."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.cli.task import processes
from hai_airflow.spec import JobView
from tests.cli.conftest import Hai, free_port, json_out
from tests.cli.test_usage import assert_one_error_line
from tests.support.live_server import LiveServer

CREATE = ("create", "--task-name=t", "--cmd=true", "--resource-pkg=455")
CREATE_DISTRIBUTED = (*CREATE, "--mode=distributed", "--workers=2")
SUBMIT_STANDALONE = ("submit", "standalone", "--name=s", "--gpus=2")
SUBMIT_DISTRIBUTED = ("submit", "distributed", "--name=d", "--workers=2", "--gpus=2")


@pytest.fixture
def alice(server: LiveServer) -> Iterator[dict[str, str]]:
    yield {"HAI_SERVER": server.url, "HAI_TOKEN": "alice-token"}
    server.cancel_all()


@pytest.mark.parametrize(
    ("args", "dir_flag", "stored"),
    [
        pytest.param(CREATE, "--code-path", "per-worker", id="create standalone: per-worker by default"),
        pytest.param(
            (*CREATE, "--processes=per-gpu"), "--code-path", "per-gpu", id="create standalone per-gpu"
        ),
        pytest.param(
            CREATE_DISTRIBUTED, "--code-path", "per-gpu", id="create distributed: per-gpu by default"
        ),
        pytest.param(
            (*CREATE_DISTRIBUTED, "--processes", "per-worker"),
            "--code-path",
            "per-worker",
            id="create distributed per-worker",
        ),
        pytest.param((*CREATE, "--processes=PER-GPU"), "--code-path", "per-gpu", id="the choice in any case"),
        pytest.param(SUBMIT_STANDALONE, "--code-dir", "per-worker", id="submit standalone default"),
        pytest.param(
            (*SUBMIT_STANDALONE, "--processes=per-gpu"),
            "--code-dir",
            "per-gpu",
            id="submit standalone per-gpu",
        ),
        pytest.param(SUBMIT_DISTRIBUTED, "--code-dir", "per-gpu", id="submit distributed default"),
        pytest.param(
            (*SUBMIT_DISTRIBUTED, "--processes=per-worker"),
            "--code-dir",
            "per-worker",
            id="submit distributed per-worker",
        ),
    ],
)
def test_the_choice_reaches_the_stored_spec(
    hai: Hai,
    server: LiveServer,
    alice: dict[str, str],
    tmp_path: Path,
    args: tuple[str, ...],
    dir_flag: str,
    stored: str,
) -> None:
    command = ("true",) if args[0] == "submit" else ()
    result = hai(*args, f"{dir_flag}={tmp_path}", "--max-schedule=0", "--json", *command, env=alice)
    assert result.exit_code == 0, result.output
    assert json_out(result)["spec"]["processes"] == stored
    with server.client() as client:
        assert client.job(json_out(result)["id"]).spec["processes"] == stored


def test_task_detail_shows_the_choice_and_the_process_count(
    hai: Hai, alice: dict[str, str], tmp_path: Path
) -> None:
    created = hai(*CREATE_DISTRIBUTED, f"--code-path={tmp_path}", "--json", env=alice)
    assert created.exit_code == 0, created.output
    detail = hai("task", str(json_out(created)["id"]), env=alice)
    assert detail.exit_code == 0, detail.output
    lines = [line.split(None, 1) for line in detail.stdout.splitlines() if line.startswith("processes")]
    assert lines == [["processes", "per-gpu (4 processes)"]], detail.stdout


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        pytest.param(
            (*CREATE, "--code-path=/tmp", "--processes=per-node"),
            ("--processes", "'per-node' is not one of per-gpu, per-worker", "hai create --help"),
            id="unknown choice in create",
        ),
        pytest.param(
            (*SUBMIT_DISTRIBUTED, "--code-dir=/tmp", "--processes=all", "true"),
            ("--processes", "'all' is not one of per-gpu, per-worker", "hai submit distributed --help"),
            id="unknown choice in submit",
        ),
        pytest.param(
            ("submit", "cpu", "--name=c", "--code-dir=/tmp", "--processes=per-gpu", "true"),
            ("--processes", "hai submit cpu --help"),
            id="a CPU stage has no processes to choose",
        ),
    ],
)
def test_bad_processes_exit_2_naming_the_flag(
    hai: Hai, args: tuple[str, ...], parts: tuple[str, ...]
) -> None:
    # No server runs: each is refused before any request.
    result = hai(*args, "--server", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2, result.output
    assert_one_error_line(result.stderr, *parts)
    assert result.stdout == ""


def test_help_of_gpu_commands_explains_the_choice(hai: Hai) -> None:
    for command in (("create",), ("submit", "standalone"), ("submit", "distributed")):
        text = " ".join(hai(*command, "--help").stdout.split())
        assert "--processes [per-gpu|per-worker]" in text, command
        assert "bring their own launcher" in text, command
    assert "--processes" not in hai("submit", "cpu", "--help").stdout


def job(mode: str, spec: dict[str, Any], gpus: int, workers: int = 1) -> JobView:
    return JobView(
        id=1, mode=mode, state="PENDING", priority="low", max_schedule=0, gpus=gpus, gpu_type="V100",
        workers=workers, submitted_at=datetime(2026, 1, 1, tzinfo=UTC), task_name="t", user="alice",
        group="vision", spec=spec,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("view", "shown"),
    [
        pytest.param(job("standalone", {"processes": "per-gpu"}, 4), "per-gpu (4 processes)", id="per gpu"),
        pytest.param(job("standalone", {"processes": "per-worker"}, 4), "per-worker (1 process)", id="one"),
        pytest.param(
            job("distributed", {"processes": "per-worker"}, 16, workers=2),
            "per-worker (2 processes)",
            id="one per worker",
        ),
        pytest.param(
            job("distributed", {}, 16, workers=2), "per-gpu (16 processes)", id="stored before the field"
        ),
        pytest.param(job("standalone", {}, 2), "per-worker (1 process)", id="standalone stored before"),
        pytest.param(job("cpu", {}, 0), None, id="a CPU job has none"),
    ],
)
def test_processes_shown(view: JobView, shown: str | None) -> None:
    assert processes(view) == shown
