"""Bad flags exit 2 with one line naming the flag; an unreachable server exits 1 naming its URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import Hai, free_port

CREATE = (
    "create",
    "--task-name=t",
    "--code-path=/tmp",
    "--cmd=python3 train.py",
    "--resource-pkg=1",
)

COMMANDS = (
    "res", "create", "submit", "submit standalone", "submit distributed", "submit cpu", "task", "instance",
    "log", "promote", "cancel", "suspend", "resume", "queue", "quota", "quota set", "serve", "sim",
)  # fmt: skip


def assert_one_error_line(stderr: str, *parts: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: "), stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert "Traceback" not in stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(hai: Hai, command: str) -> None:
    result = hai(*command.split(), "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Usage: hai {command}")


def test_create_help_keeps_the_documents_flags_and_words(hai: Hai) -> None:
    text = hai("create", "--help").stdout
    for flag in (
        "--task-name TEXT", "--model-id INTEGER", "--project-id INTEGER",
        "--mode [standalone|distributed|cpu]",
        "--code-src [nas|git]", "--code-path TEXT", "--git-branch TEXT", "--model-dir TEXT",
        "--project-storage TEXT", "--max-schedule [0|4|6|8|24|48]", "--image TEXT", "--resource-pkg INTEGER",
        "--shm INTEGER", "--cmd TEXT", "--workers", "--worker-image", "--worker-resource-pkg", "--elastic",
        "--grace", "--gpu-type", "--json",
    ):  # fmt: skip
        assert flag in text, flag
    assert (
        text.index("--task-name") < text.index("--model-id") < text.index("--code-path") < text.index("--cmd")
    )
    assert "任务名称，支持中英文" in text
    assert "期望等待时长" in text


def test_log_accepts_the_documents_underscore_spelling(hai: Hai) -> None:
    assert "--instance-id, --instance_id" in hai("log", "--help").stdout
    assert "--task-id, --task_id" in hai("instance", "--help").stdout


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        pytest.param(
            (*CREATE, "--max-schedule=5"),
            ("--max-schedule must be one of 0|4|6|8|24|48", "hai create --help"),
            id="max-schedule outside the choices",
        ),
        pytest.param((*CREATE, "--code-src=svn"), ("--code-src", "'nas' or 'git'"), id="unknown code source"),
        pytest.param(
            (*CREATE, "--git-branch=dev"),
            ("--git-branch is only valid when --code-src is git",),
            id="branch on nas",
        ),
        pytest.param(
            (*CREATE, "--workers=2"),
            ("--workers is not valid for a standalone task",),
            id="workers on standalone",
        ),
        pytest.param(
            ("create", "--task-name=t", "--code-path=/tmp", "--cmd=x"),
            ("--resource-pkg is required for a standalone task",),
            id="standalone without a package",
        ),
        pytest.param(
            (
                "create",
                "--task-name=t",
                "--code-path=/tmp",
                "--cmd=x",
                "--mode=distributed",
                "--resource-pkg=1",
            ),
            ("--workers is required for a distributed task",),
            id="distributed without workers",
        ),
        pytest.param(
            (*CREATE, "--project-storage=10111,abc"),
            ("--project-storage must be comma-separated",),
            id="storage ids",
        ),
        pytest.param((*CREATE, "--task-name="), ("--task-name",), id="empty task name"),
        pytest.param((*CREATE, "--shm=0"), ("--shm", "greater than 0"), id="shm not positive"),
        pytest.param((*CREATE, "--grace=99999"), ("--grace",), id="grace too long"),
        pytest.param((*CREATE, "--env=NOEQUALS"), ("--env 'NOEQUALS' is not KEY=VALUE",), id="env without ="),
        pytest.param(
            ("submit", "standalone", "--name=n", "--code-dir=/tmp", "--max-schedule=3", "python3 x.py"),
            ("--max-schedule must be one of", "hai submit standalone --help"),
            id="submit checks flags before asking the server",
        ),
        pytest.param(
            ("submit", "cpu", "--name=n", "--code-dir=/tmp", "--cpus=0", "python3 x.py"),
            ("--cpus", "greater than 0"),
            id="cpu stage with no cores",
        ),
        pytest.param(
            ("submit", "standalone", "--name=", "--code-dir=/tmp", "x"),
            ("--task-name",),
            id="submit names the flag as its help lists it",
        ),
        pytest.param(
            ("promote", "--task-id=1", "--max-schedule=0"), ("--max-schedule must be one of 4|6|8|24|48",)
        ),
        pytest.param(("task", "--json", "-o", "yaml"), ("--json and -o yaml",), id="two formats"),
        pytest.param(("wait", "7", "-o", "name"), ("-o name",), id="wait has no names to print"),
        pytest.param(("log",), ("give either a task id", "--instance-id"), id="log without an id"),
        pytest.param(
            ("log", "1", "--task-id=2"), ("two different task ids", "--task-id 2"), id="log with two ids"
        ),
        pytest.param(("log", "1", "--instance-id=2"), ("give either a task id",), id="log task and instance"),
        pytest.param(("log", "--instance-id=1", "--tail=-1"), ("--tail must be 0",), id="negative tail"),
        pytest.param(
            ("quota", "set", "--gpus=1"), ("exactly one of --user and --group",), id="quota set for whom"
        ),
        pytest.param(
            ("quota", "set", "--user=u"), ("exactly one of --gpus N and --clear",), id="quota set to what"
        ),
        pytest.param(("quota", "set", "--group=g", "--gpus=-1"), ("--gpus must be 0 or more",)),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_flag(
    hai: Hai, args: tuple[str, ...], parts: tuple[str]
) -> None:
    # No server runs: each of these must be refused before any request is made.
    result = hai(*args, "--server", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2, result.output
    assert_one_error_line(result.stderr, *parts)
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        pytest.param(
            (*CREATE, "--mode=cluster"),
            ("--mode", "'cluster' is not one of standalone, distributed", "hai create --help"),
            id="bad choice",
        ),
        pytest.param(
            ("task", "--state=SLEEPING"),
            ("--state", "'SLEEPING' is not one of PENDING, STARTING,", "hai task --help"),
            id="bad state",
        ),
        pytest.param(("task", "-o", "table"), ("--output", "json, yaml, wide, name"), id="bad output format"),
        pytest.param(
            ("log", "--instance-id=abc"),
            ("--instance-id", "whole number", "hai log --help"),
            id="not a number",
        ),
        pytest.param(("log", "abc"), ("TASK_ID", "integer", "hai log --help"), id="id not a number"),
        pytest.param(
            ("quota", "set", "--user=u", "--gpus=many"),
            ("--gpus", "hai quota set --help"),
            id="not a number in a subcommand",
        ),
        pytest.param(
            ("create", "--code-path=/tmp", "--cmd=x"),
            ("--task-name", "hai create --help"),
            id="missing task name",
        ),
        pytest.param(
            ("instance",), ("give a task id", "--task-id", "hai instance --help"), id="missing task id"
        ),
        pytest.param(
            ("cancel", "--yes"), ("give a task id", "hai cancel 42", "hai cancel --help"), id="cancel what"
        ),
        pytest.param(
            ("task", "--task-i=1"),
            ("--task-i", "--task-id", "hai task --help"),
            id="unknown option",
        ),
        pytest.param(
            ("submit", "standalone", "--bogus"),
            ("--bogus", "hai submit standalone --help"),
            id="unknown option in a subcommand",
        ),
        pytest.param(("--bogus",), ("--bogus", "hai --help"), id="unknown root option"),
        pytest.param(
            ("submit", "standalone", "--name=n", "--code-dir=/tmp"),
            ("argument", "CMD", "hai submit standalone --help"),
            id="missing argument",
        ),
        pytest.param(
            ("quota", "set", "--user"),
            ("--user", "requires an argument", "hai quota set --help"),
            id="option without its value",
        ),
        pytest.param(("bogus",), ("bogus", "hai --help"), id="unknown command"),
        pytest.param(("tsk",), ("Did you mean 'task'? See `hai --help`",), id="a near miss"),
        pytest.param(
            ("task", "--stat"), ("Did you mean one of --state", "? See `hai task --help`"), id="near flags"
        ),
        pytest.param(("res", "extra"), ("extra", "hai res --help"), id="extra argument"),
    ],
)
def test_typer_usage_errors_are_one_line_naming_the_flag(
    hai: Hai, args: tuple[str, ...], parts: tuple[str, ...]
) -> None:
    result = hai(*args)
    assert result.exit_code == 2, result.output
    assert_one_error_line(result.stderr, *parts)
    assert result.stderr.strip().endswith("--help`."), result.stderr
    assert "Usage:" not in result.stderr and "Try '" not in result.stderr
    assert "?." not in result.stderr and "Possible options" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("res",), id="res"),
        pytest.param(("task",), id="task"),
        pytest.param(("task", "--task-id=1"), id="task detail"),
        pytest.param(("instance", "--task-id=1"), id="instance"),
        pytest.param(("log", "--instance-id=1", "--tail=10"), id="log"),
        pytest.param(("log", "--instance-id=1", "--follow"), id="log follow"),
        pytest.param((*CREATE, "--json"), id="create"),
        pytest.param(("submit", "standalone", "--name=n", "--code-dir=/tmp", "python3 x.py"), id="submit"),
        pytest.param(("promote", "--task-id=1", "--max-schedule=24"), id="promote"),
        pytest.param(("cancel", "--task-id=1", "--yes"), id="cancel"),
        pytest.param(("suspend", "--task-id=1"), id="suspend"),
        pytest.param(("resume", "--task-id=1"), id="resume"),
        pytest.param(("queue",), id="queue"),
        pytest.param(("quota",), id="quota"),
        pytest.param(("quota", "set", "--user=u", "--gpus=1"), id="quota set"),
    ],
)
def test_server_down_exits_1_naming_the_url_and_how_to_start_one(hai: Hai, args: tuple[str, ...]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = hai(*args, "--server", url)
    assert result.exit_code == 1, result.output
    assert_one_error_line(result.stderr, f"cannot reach the hai server at {url}", "hai serve")
    assert result.stdout == ""


def test_hai_server_variable_is_used_without_a_flag(hai: Hai) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = hai("task", env={"HAI_SERVER": url})
    assert result.exit_code == 1
    assert url in result.stderr


def test_hai_region_picks_the_server_from_client_toml(hai: Hai, isolated_home: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    (isolated_home / "client.toml").write_text(f'[regions]\ngz-huyanx = "{url}"\n', encoding="utf-8")
    result = hai("res", env={"HAI_REGION": "gz-huyanx"})
    assert result.exit_code == 1
    assert url in result.stderr


def test_unknown_region_is_bad_input(hai: Hai) -> None:
    result = hai("res", env={"HAI_REGION": "mars"})
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, "unknown region 'mars'", "[regions]")


def test_no_arguments_prints_help(hai: Hai) -> None:
    result = hai()
    assert "Usage: hai" in result.output
    assert "create" in result.output and "submit" in result.output
    assert "Error:" not in result.output


def test_a_group_without_its_subcommand_prints_its_help(hai: Hai) -> None:
    result = hai("submit")
    assert "Usage: hai submit" in result.output
    assert "Error:" not in result.output


def test_shell_completion_is_not_taken_for_a_usage_error(hai: Hai) -> None:
    env = {"_HAI_COMPLETE": "complete_bash", "COMP_WORDS": "hai create --bogus --mo", "COMP_CWORD": "3"}
    result = hai(env=env)
    assert result.exit_code == 0, result.output
    assert "--mode" in result.stdout.split()
    assert result.stderr == ""
