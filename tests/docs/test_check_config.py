"""`hai serve --check-config FILE`: the checks `hai serve` makes at start, and nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from hai_airflow.backends import BACKENDS
from hai_airflow.backends import OPTIONS as BACKEND_OPTIONS
from hai_airflow.cli.main import app
from hai_airflow.server.config import ConfigError, load_config
from hai_airflow.server.serve import build, check_config

VALID = """
[server]
backend = "local"

[backend]
failure_grace_seconds = 5

[[groups]]
name = "default"
admins = ["admin"]

[[users]]
name = "admin"
role = "platform_admin"
token = "admin-token-0123456789"
"""


def hai_check(path: Path, home: Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(
        app, ["serve", "--check-config", str(path)], env={"HAI_HOME": str(home), **(env or {})}
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_valid_file_passes_and_nothing_is_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = write(tmp_path, VALID)
    result = hai_check(path, home)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"config {path} is valid\n"
    assert not home.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param(
            VALID.replace('name = "default"', 'name = "vision"'), "users[0].group", id="undefined group"
        ),
        pytest.param(VALID.replace("[server]", "[server]\nbakend = 1"), "server.bakend", id="misspelled key"),
        pytest.param(
            VALID.replace("failure_grace", "failure_grase"), "backend.failure_grase_seconds", id="backend key"
        ),
        pytest.param(
            VALID.replace('backend = "local"', 'backend = "docker"'),
            "backend.failure_grace_seconds",
            id="an option of another backend",
        ),
        pytest.param(VALID.replace('"local"', '"slurm"'), "server.backend", id="unknown backend"),
        pytest.param(
            VALID.replace('backend = "local"', 'policy = "lifo"'), "server.policy", id="unknown policy"
        ),
        pytest.param(
            VALID.replace('token = "admin-token-0123456789"', 'token_env = "HAI_DOC_TEST_UNSET"'),
            "users[0].token_env",
            id="token variable unset",
        ),
        pytest.param("[server\n", None, id="not TOML"),
    ],
)
def test_a_bad_file_exits_2_naming_the_field(tmp_path: Path, text: str, field: str | None) -> None:
    result = hai_check(write(tmp_path, text), tmp_path / "home")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("Error: bad config ")
    if field is not None:
        assert f" at {field}: " in result.stderr


def test_a_token_variable_that_is_set_passes(tmp_path: Path) -> None:
    text = VALID.replace('token = "admin-token-0123456789"', 'token_env = "HAI_DOC_TEST_TOKEN"')
    result = hai_check(write(tmp_path, text), tmp_path / "home", {"HAI_DOC_TEST_TOKEN": "x" * 32})
    assert result.exit_code == 0, result.output


def test_a_missing_file_and_mixed_flags_are_usage_errors(tmp_path: Path) -> None:
    missing = CliRunner().invoke(app, ["serve", "--check-config", str(tmp_path / "none.toml")])
    assert missing.exit_code == 2
    assert "does not exist" in missing.stderr
    mixed = CliRunner().invoke(app, ["serve", "--check-config", str(write(tmp_path, VALID)), "--port", "1"])
    assert mixed.exit_code == 2
    assert mixed.stderr == "Error: --check-config runs alone. Drop --config, --host and --port.\n"


def test_every_backend_has_its_options_model() -> None:
    assert set(BACKEND_OPTIONS) == set(BACKENDS)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(VALID.replace("failure_grace", "failure_grase"), id="backend key"),
        pytest.param(
            VALID.replace("failure_grace_seconds = 5", "failure_grace_seconds = -1"), id="backend value"
        ),
        pytest.param(
            VALID.replace('token = "admin-token-0123456789"', 'token_env = "HAI_DOC_TEST_UNSET"'),
            id="token variable unset",
        ),
    ],
)
def test_the_check_refuses_what_hai_serve_refuses_with_the_same_words(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as checked:
        check_config(path)
    with pytest.raises(ConfigError) as served:
        build(load_config(path), tmp_path / "home", path)
    assert str(checked.value) == str(served.value)
