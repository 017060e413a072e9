"""The CLI turns the input limits into exit 2 and one `Error:` line, whether it or the server refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from hai_airflow.spec import MAX_CMD_BYTES, MAX_ENV_BYTES
from tests.cli.conftest import Hai
from tests.support.live_server import LiveServer


def one_error_line(stderr: str, *parts: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: ") and "Traceback" not in stderr, stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        pytest.param(
            ("task", "--task-id", "99999999999999999999"), ("job_id", "2147483647"), id="task id 2^66"
        ),
        pytest.param(
            ("cancel", "--task-id", "-44387061654387253248", "--yes"), ("job_id",), id="cancel far below"
        ),
        pytest.param(("instance", "--task-id", str(2**63)), ("job_id",), id="instances of 2^63"),
        pytest.param(("log", "--instance-id", str(2**64)), ("instance_id",), id="log of 2^64"),
    ],
)
def test_ids_out_of_range_exit_2_with_one_line(
    hai: Hai, live_server: LiveServer, args: tuple[str, ...], parts: tuple[str, ...]
) -> None:
    with live_server.client() as c:
        before = len(c.jobs(all=True))
    result = hai(*args, env=live_server.env)
    assert result.exit_code == 2, result.output
    one_error_line(result.stderr, *parts)
    with live_server.client() as c:
        assert len(c.jobs(all=True)) == before


@pytest.mark.parametrize(
    ("extra", "parts"),
    [
        pytest.param(
            ("--cmd", "x" * (MAX_CMD_BYTES + 1)), ("--cmd", "131,071 bytes"), id="cmd over MAX_ARG_STRLEN"
        ),
        pytest.param(
            (
                "--cmd",
                "true",
                "--env",
                "A=" + "x" * (MAX_ENV_BYTES // 2),
                "--env",
                "B=" + "x" * (MAX_ENV_BYTES // 2),
            ),
            ("--env", "at most 131,072"),
            id="env too big",
        ),
        pytest.param(("--cmd", "true", "--env", "1X=1"), ("env names",), id="bad env name"),
        pytest.param(("--cmd", "true", "--task-name", "x" * 201), ("--task-name", "200"), id="name too long"),
    ],
)
def test_oversized_input_exits_2_with_one_line_before_any_request(
    hai: Hai, tmp_path: Path, extra: tuple[str, ...], parts: tuple[str, ...]
) -> None:
    # No server runs: the spec is checked where it is typed.
    args = ["create", "--task-name", "t", "--code-path", str(tmp_path), "--resource-pkg", "454"]
    result = hai(*args, *extra, "--server", "http://127.0.0.1:9")
    assert result.exit_code == 2, result.output
    one_error_line(result.stderr, *parts)
    assert result.stdout == ""
