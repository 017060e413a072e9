"""hai serve with its own home and tokens, and the settings that point Airflow at it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import NamedTuple

import httpx

from dev.demo import DAGS
from dev.demo.processes import Stack
from hai_airflow.client import HaiClient
from hai_airflow.spec import TERMINAL_STATES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DEMO_USER = "demo"
"""The demo's one hai user, a platform admin."""
SERVICE_USER = "airflow"
"""The service identity Airflow's connection holds: it acts for the people who trigger runs."""


class Tokens(NamedTuple):
    """The secrets of one demo or `make up` home."""

    person: str
    """The demo user's own token (for `hai` commands)."""
    service: str
    """Airflow's: a service identity acting for the members of group default, never for itself."""
    jwt: str
    """Airflow's [api_auth] jwt_secret, shared by its services."""

    @classmethod
    def fresh(cls) -> Tokens:
        return cls(*(secrets.token_hex(16) for _ in cls._fields))

    @classmethod
    def kept_in(cls, home: Path) -> Tokens:
        """The home's tokens, each in a file private to this user, made on first use."""
        home.mkdir(parents=True, exist_ok=True)
        values = []
        for name in cls._fields:
            path = home / f"{name}-token"
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(secrets.token_hex(16))
            values.append(path.read_text(encoding="utf-8").strip())
        return cls(*values)


def platform_config(tokens: Tokens) -> str:
    """One node of 8 virtual V100s, the document's packages, one unlimited group, one admin and
    Airflow's service identity; image `local` runs jobs in this Python environment (so the sample
    code finds torch)."""
    packages = [(100, "CPU 8 cores", "CPU", 0), (454, "1xV100", "V100", 1), (455, "2xV100", "V100", 2)]
    packages += [(456, "4xV100", "V100", 4), (457, "8xV100", "V100", 8)]
    text = f"""[server]
backend = "local"

[backend]
images = {{ local = "{sys.prefix}" }}

[[nodes]]
name = "node1"
gpu_type = "V100"
gpus = 8
cpus = 64
memory_gb = 512
virtual = true

[[groups]]
name = "default"
admins = ["{DEMO_USER}"]

[[users]]
name = "{DEMO_USER}"
group = "default"
role = "platform_admin"
token = "{tokens.person}"

[[users]]
name = "{SERVICE_USER}"
group = "default"
token = "{tokens.service}"
acts_for = ["group:default"]
"""
    for pid, name, gpu_type, gpus in packages:
        text += (
            f'\n[[resource_packages]]\nid = {pid}\nname = "{name}"\ngpu_type = "{gpu_type}"\n'
            f"gpus = {gpus}\ncpus = {max(4 * gpus, 8)}\nmemory_gb = {max(32 * gpus, 32)}\n"
        )
    return text


class HaiService:
    """`hai serve` (``python -m hai_airflow.server``) with its own HAI_HOME on a free port."""

    def __init__(self, stack: Stack, home: Path, tokens: Tokens, port: int | None = None) -> None:
        self.home = home
        self.tokens = tokens
        self.token = tokens.person
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        config = home / "config.toml"
        # a home made before Airflow had its own identity gets the current config
        if not config.exists() or f'name = "{SERVICE_USER}"' not in config.read_text(encoding="utf-8"):
            config.write_text(platform_config(tokens), encoding="utf-8")
        env = {**os.environ, "HAI_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        for name in ("HAI_SERVER", "HAI_TOKEN", "HAI_REGION"):
            env.pop(name, None)
        args = [sys.executable, "-m", "hai_airflow.server", "--config", str(config), "--host", "127.0.0.1"]
        self.proc = stack.start("hai serve", [*args, "--port", str(self.port)], env, home / "server.log")
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"hai serve exited with {self.proc.returncode}; see {self.home / 'server.log'}"
                )
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{self.url}/health", timeout=2).json().get("lease_holder"):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"hai serve did not answer in {timeout:.0f} s; see {self.home / 'server.log'}")

    @property
    def env(self) -> dict[str, str]:
        """What a `hai` command needs to reach this server."""
        return {"HAI_SERVER": self.url, "HAI_TOKEN": self.token, "HAI_HOME": str(self.home)}

    def client(self) -> HaiClient:
        return HaiClient(server=self.url, token=self.token)

    def cancel_unfinished(self) -> None:
        with contextlib.suppress(Exception), self.client() as client:
            for job in client.jobs(all=True, limit=1000):
                if job.state not in TERMINAL_STATES:
                    client.cancel(job.id)


def airflow_env(airflow_home: Path, hai: HaiService, **extra: str) -> dict[str, str]:
    """Airflow on SQLite in `airflow_home`, this repo's DAGs, `hai_default` pointing at `hai` with
    the service identity, as a deployment has it."""
    # The demo's one hai user stands behind every Airflow user: `airflow dags test` runs are
    # triggered by "dag_test", the UI's by "admin" (how to map people: README, Airflow).
    people = {"user_map": {"dag_test": DEMO_USER, "admin": DEMO_USER}}
    connection = {
        "conn_type": "hai",
        "host": hai.url,
        "password": hai.tokens.service,
        "extra": json.dumps(people),
    }
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW_CONN_HAI_DEFAULT": json.dumps(connection),
        "PYTHONUNBUFFERED": "1",
        # `airflow standalone` starts its services as `airflow ...` from PATH
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    env.update(extra)
    return env


def airflow_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow", *args]


def hai_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from hai_airflow.cli.main import app; app(prog_name='hai')", *args]
