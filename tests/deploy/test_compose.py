"""docker-compose.yaml: valid for Compose, and every command, setting and file it names is real."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
AIRFLOW_SERVICES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
LONG_RUNNING = ("postgres", "hai-server", *AIRFLOW_SERVICES)
ADMIN_TOKEN = "HAI_ADMIN_TOKEN"
"""The variable the hai admin's token comes from; compose refuses to start without it."""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def argv_of(command: Any) -> list[str]:
    # Compose's $$ is a literal $; the shell would expand ${HOSTNAME} at run time.
    text = command if isinstance(command, str) else shlex.join(command)
    return [a.replace("$${HOSTNAME}", "host").replace('"', "") for a in shlex.split(text)]


def commands(compose: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(where, argv) of every command the deployment runs: service commands and health checks."""
    out = []
    for name, svc in services(compose).items():
        if "command" in svc:
            out.append((f"{name}.command", argv_of(svc["command"])))
        test = (svc.get("healthcheck") or {}).get("test")
        if test:
            kind, rest = test[0], test[1:]
            out.append((f"{name}.healthcheck", argv_of(rest[0] if kind == "CMD-SHELL" else rest)))
    return out


def compose_config(admin_token: str | None) -> subprocess.CompletedProcess[str]:
    """`docker-compose config -q` (or the compose plugin's) with or without the admin token set."""
    plugin = shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True)
    if shutil.which("docker-compose"):
        argv = ["docker-compose", "-f", str(COMPOSE), "config", "-q"]
    elif plugin and plugin.returncode == 0:
        argv = ["docker", "compose", "-f", str(COMPOSE), "config", "-q"]
    else:
        pytest.skip("no docker-compose and no compose plugin (apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN}
    if admin_token is not None:
        env[ADMIN_TOKEN] = admin_token
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=60)


def test_compose_itself_accepts_the_file() -> None:
    done = compose_config("0123456789abcdef0123456789abcdef")
    assert done.returncode == 0, done.stderr


def test_compose_refuses_to_start_without_an_admin_token() -> None:
    """No default token is shipped: without HAI_ADMIN_TOKEN compose says what to set, and starts nothing."""
    done = compose_config(None)
    assert done.returncode != 0
    assert f"Set {ADMIN_TOKEN} in .env" in done.stderr + done.stdout


def test_no_secret_is_shipped_and_ports_stay_on_this_host(compose: dict[str, Any]) -> None:
    text_ = COMPOSE.read_text() + "".join(p.read_text() for p in (REPO / ".ci" / "compose").glob("*.toml"))
    assert "change-me-admin-token" not in text_ and not re.search(r"^token\s*=", text_, re.M)
    for name, svc in services(compose).items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond this host"
    hai = services(compose)["hai-server"]
    assert hai["environment"][ADMIN_TOKEN].startswith(f"${{{ADMIN_TOKEN}:?")
    # Only the server holds the Docker socket (it is root on the host); the compose file says so.
    holders = [n for n, svc in services(compose).items() if "docker.sock" in str(svc.get("volumes"))]
    assert holders == ["hai-server"]
    assert "Docker socket" in COMPOSE.read_text() and "root on this host" in COMPOSE.read_text()


def test_the_services_and_how_they_wait_for_each_other(compose: dict[str, Any]) -> None:
    svc = services(compose)
    assert set(svc) == {"postgres", "hai-server", "airflow-init", *AIRFLOW_SERVICES}
    for name in LONG_RUNNING:
        assert svc[name].get("healthcheck", {}).get("test"), f"{name} has no health check"
    assert svc["hai-server"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in AIRFLOW_SERVICES:
        deps = svc[name]["depends_on"]
        assert deps["postgres"] == {"condition": "service_healthy"}
        assert deps["airflow-init"] == {"condition": "service_completed_successfully"}
    # The components that call hai start once it answers.
    for name in ("airflow-scheduler", "airflow-triggerer"):
        assert svc[name]["depends_on"]["hai-server"] == {"condition": "service_healthy"}
    assert svc["airflow-init"]["command"] == ["airflow", "db", "migrate"]


def test_airflow_runs_the_local_executor_with_the_project_folders(compose: dict[str, Any]) -> None:
    for name in ("airflow-init", *AIRFLOW_SERVICES):
        svc = services(compose)[name]
        env = svc["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
        assert env["AIRFLOW_CONN_HAI_DEFAULT"].startswith(f"hai://:${{{ADMIN_TOKEN}:?")
        mounts = {v.split(":")[0]: v.split(":")[1] for v in svc["volumes"]}
        assert mounts == {"./dags": "/opt/airflow/dags", "./plugins": "/opt/airflow/plugins",
                          "./include": "/opt/airflow/include"}  # fmt: skip
        assert svc["build"] == {"context": ".", "dockerfile": ".ci/Dockerfile", "target": "airflow"}


def test_hai_uses_postgresql_and_its_database_is_created(compose: dict[str, Any]) -> None:
    hai = services(compose)["hai-server"]
    url = hai["environment"]["HAI_DATABASE_URL"]
    match = re.fullmatch(r"postgresql\+psycopg://(\w+):(\w+)@postgres:5432/(\w+)", url)
    assert match, url
    user, password, db = match.groups()
    sql = (REPO / ".ci" / "compose" / "postgres-init.sql").read_text()
    assert f"CREATE USER {user} WITH PASSWORD '{password}';" in sql
    assert f"CREATE DATABASE {db} OWNER {user};" in sql
    # The docker backend bind-mounts job directories by path: the home is mounted at its own path.
    home = hai["environment"]["HAI_HOME"]
    assert f"{home}:{home}" in hai["volumes"]


def test_every_file_the_deployment_mounts_or_builds_from_exists(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            source = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", source)  # the default of ${VAR:-default}
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts {source}, which does not exist"
        if "build" in svc:
            dockerfile = (REPO / svc["build"]["dockerfile"]).read_text()
            assert re.search(rf"^FROM \S+ AS {svc['build']['target']}$", dockerfile, re.M)
            for copied in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", dockerfile, re.M):
                for path in copied.split():
                    assert (REPO / path).exists(), f".ci/Dockerfile copies {path}, which does not exist"


def test_every_hai_command_is_a_real_command_with_real_options(compose: dict[str, Any]) -> None:
    typer = pytest.importorskip("typer")
    from hai_airflow.cli.main import app

    group = typer.main.get_command(app)
    hai = [(where, argv) for where, argv in commands(compose) if argv[0] == "hai"]
    assert hai, "the deployment runs no hai command"
    for where, argv in hai:
        command = group.commands.get(argv[1])  # type: ignore[attr-defined]
        assert command is not None, f"{where}: hai has no command {argv[1]!r}"
        known = {opt for p in command.params for opt in p.opts}
        for arg in argv[2:]:
            if arg.startswith("--"):
                assert arg in known, f"{where}: `hai {argv[1]}` has no option {arg}"


def test_every_airflow_command_parses_with_airflows_own_cli(compose: dict[str, Any]) -> None:
    pytest.importorskip("airflow")
    from airflow.cli.cli_parser import get_parser

    airflow = [(where, argv) for where, argv in commands(compose) if argv[0] == "airflow"]
    assert len(airflow) >= len(AIRFLOW_SERVICES) + 1
    for where, argv in airflow:
        parser = get_parser()
        try:
            parsed = parser.parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{shlex.join(argv)}` is not an Airflow command")
        assert isinstance(parsed, argparse.Namespace) and callable(parsed.func)


def test_every_airflow_setting_is_a_real_airflow_option(compose: dict[str, Any]) -> None:
    airflow = pytest.importorskip("airflow")
    templates = Path(airflow.__file__).parent / "config_templates" / "config.yml"
    options = {
        (section, key) for section, body in yaml.safe_load(templates.read_text()).items()
        for key in body.get("options", {})
    }  # fmt: skip
    env = services(compose)["airflow-api-server"]["environment"]
    settings = [k for k in env if k.startswith("AIRFLOW__")]
    assert settings
    for key in settings:
        _, section, option = key.split("__", 2)
        assert (section.lower(), option.lower()) in options, f"{key} is not an Airflow setting"


@pytest.mark.parametrize("name", ["hai-docker.toml", "hai-kubernetes.toml"])
def test_the_sample_server_configs_are_valid(name: str, compose: dict[str, Any]) -> None:
    pytest.importorskip("sqlalchemy")
    from hai_airflow.backends.docker.containers import DockerOptions
    from hai_airflow.backends.kubernetes.manifests import KubernetesOptions
    from hai_airflow.scheduling import POLICIES
    from hai_airflow.server.config import load_config

    config = load_config(REPO / ".ci" / "compose" / name, sorted(POLICIES))
    if config.server.backend == "docker":
        # Each job runs as its owner's host account, never as the server's root.
        assert DockerOptions.model_validate(config.backend).run_as == "{user}"
        assert {"/etc/passwd:/etc/passwd:ro", "/etc/group:/etc/group:ro"} <= set(
            services(compose)["hai-server"]["volumes"]
        )
    else:
        KubernetesOptions.model_validate(config.backend)
    assert config.server.host == "0.0.0.0"  # reachable from the Airflow containers
    # The admin's token comes from the variable compose requires and builds Airflow's connection from.
    assert all(u.token is None for u in config.users)
    assert [u.token_env for u in config.users if u.role == "platform_admin"] == [ADMIN_TOKEN]


def test_jobs_reach_the_api_at_job_url_and_nothing_else(compose: dict[str, Any]) -> None:
    """`hai` inside a job container submits the next job: HAI_SERVER (job_url) names the compose service
    on a network the job containers join, where the server is their only peer (not PostgreSQL)."""
    pytest.importorskip("sqlalchemy")
    from urllib.parse import urlsplit

    from hai_airflow.backends.docker.containers import DockerOptions
    from hai_airflow.scheduling import POLICIES
    from hai_airflow.server.config import load_config

    config = load_config(REPO / ".ci" / "compose" / "hai-docker.toml", sorted(POLICIES))
    assert config.server.job_url is not None, "[server] job_url is unset: jobs get no HAI_SERVER"
    url = urlsplit(config.server.job_url)
    assert (url.hostname, url.port) == ("hai-server", config.server.port)
    network = DockerOptions.model_validate(config.backend).network
    assert network is not None, "[backend] network is unset: job containers cannot resolve hai-server"
    named = {key: (value or {}).get("name", key) for key, value in compose.get("networks", {}).items()}
    joined = {
        name: {named.get(n, n) for n in service.get("networks", ["default"])}
        for name, service in services(compose).items()
    }
    assert network in joined["hai-server"], joined
    assert [name for name, networks in joined.items() if network in networks] == ["hai-server"], joined

