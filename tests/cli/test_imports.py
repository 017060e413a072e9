"""What `hai` imports before it runs a command: no planner, server, database layer or second HTTP stack.

Each check runs a fresh interpreter, since this test process has imported everything already."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.live_server import REPO, free_port

NEVER = ("hai_airflow.scheduling", "hai_airflow.server", "hai_airflow.sim", "sqlalchemy", "httpx")
"""Packages the client path of the CLI must not load: the planner, the server and the simulator (with
SQLAlchemy behind them), and httpx (the blocking client has its own HTTP/1.1)."""

NOT_TO_PARSE_FLAGS = (
    *NEVER, "hai_airflow.spec", "hai_airflow.client", "hai_airflow.jobfile", "yaml", "rich", "pydantic",
)  # fmt: skip
"""What printing the version or one command's help must not load either: the spec's models, the client,
the job-file reader, the terminal renderer and pydantic (typer validates a value with it) are for
commands that run."""

DUMP = "import json, sys; print(json.dumps(sorted(sys.modules)), file=sys.stderr)"


def imported(*argv: str, code: str | None = None, env: dict[str, str] | None = None) -> set[str]:
    """The modules loaded by `hai argv...` in a fresh interpreter (or by `code` instead), named by
    the packages they belong to too (`hai_airflow.scheduling.eta` also counts as `hai_airflow.scheduling`)."""
    program = code or (
        "import atexit, sys\n"
        f"atexit.register(lambda: exec({DUMP!r}))\n"
        "from hai_airflow.cli.main import app\n"
        f"app({list(argv)!r}, prog_name='hai')\n"
    )
    # A port nothing listens on: a command that connects fails at once, after importing all it needs.
    server = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "HAI_SERVER": server, "HAI_TOKEN": "t", "NO_COLOR": "1", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)
    modules: list[str] = json.loads(run.stderr.strip().splitlines()[-1])
    return {".".join(name.split(".")[:depth]) for name in modules for depth in range(1, name.count(".") + 2)}


def test_importing_the_cli_loads_no_command() -> None:
    found = imported(code=f"import hai_airflow.cli.main\n{DUMP}")
    assert not found & set(NOT_TO_PARSE_FLAGS)
    assert not {m for m in found if m.startswith("hai_airflow.cli.") and m.count(".") == 2} - {
        "hai_airflow.cli.main",
        "hai_airflow.cli.connection",
        "hai_airflow.cli.flags",
        "hai_airflow.cli.flagtable",
        "hai_airflow.cli.output",
        "hai_airflow.cli.listing",
    }


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("--version",), id="hai --version"),
        pytest.param(("--help",), id="hai --help"),
        pytest.param(("task", "--help"), id="hai task --help"),
        pytest.param(("create", "--help"), id="hai create --help"),
    ],
)
def test_printing_the_version_or_a_help_loads_nothing_heavy(argv: tuple[str, ...]) -> None:
    assert imported(*argv) & set(NOT_TO_PARSE_FLAGS) == set()


@pytest.mark.parametrize("words", ["hai ", "hai s", "hai task --"])
def test_shell_completion_loads_nothing_heavy(words: str) -> None:
    found = imported(env={"_HAI_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": words})
    # typer itself renders the completions' help through rich.
    assert found & set(NOT_TO_PARSE_FLAGS) - {"rich"} == set()


def test_a_summary_is_the_first_paragraph_of_its_commands_help() -> None:
    from hai_airflow.cli.main import COMMANDS, build

    summarized = {name: entry.summary for name, entry in COMMANDS.items() if entry.summary is not None}
    assert summarized == {name: (build(name).help or "").split("\n\n")[0] for name in summarized}


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("task",), id="hai task"),
        pytest.param(("task", "7", "-o", "yaml"), id="hai task 7 -o yaml"),
        pytest.param(("instance", "7"), id="hai instance"),
        pytest.param(("log", "7"), id="hai log"),
        pytest.param(
            ("create", "--task-name=t", "--code-path=/tmp", "--resource-pkg=454", "--cmd=true"),
            id="hai create",
        ),
        pytest.param(("cancel", "7"), id="hai cancel"),
        pytest.param(("wait", "7"), id="hai wait"),
    ],
)
def test_a_command_loads_no_planner_server_or_httpx(argv: tuple[str, ...]) -> None:
    found = imported(*argv)
    assert "hai_airflow.client" in found, "the command did not get as far as connecting"
    assert found & set(NEVER) == set()


def test_the_check_sees_a_forbidden_import() -> None:
    found = imported(code=f"import hai_airflow.cli.main, hai_airflow.scheduling.eta\n{DUMP}")
    assert found & set(NEVER) == {"hai_airflow.scheduling"}
