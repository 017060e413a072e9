"""A real `python -m hai_airflow.server` subprocess for tests: start, stop, kill -9, restart, read its log."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from hai_airflow.client import HaiClient

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0

TEST_CONFIG = """
[server]
backend = "local"

[[nodes]]
name = "node1"
gpu_type = "V100"
gpus = 8
cpus = 64
memory_gb = 512

[[resource_packages]]
id = 100
name = "CPU 8 cores"
gpu_type = "CPU"
gpus = 0
cpus = 8
memory_gb = 32

[[resource_packages]]
id = 454
name = "1xV100"
gpu_type = "V100"
gpus = 1
cpus = 4
memory_gb = 32

[[resource_packages]]
id = 455
name = "2xV100"
gpu_type = "V100"
gpus = 2
cpus = 8
memory_gb = 64

[[resource_packages]]
id = 456
name = "4xV100"
gpu_type = "V100"
gpus = 4
cpus = 16
memory_gb = 128

[[resource_packages]]
id = 457
name = "8xV100"
gpu_type = "V100"
gpus = 8
cpus = 32
memory_gb = 256

[[groups]]
name = "default"
admins = ["admin"]

[[groups]]
name = "vision"
quota_gpus = 8
admins = ["carol"]

[[groups]]
name = "nlp"
quota_gpus = 16

[[users]]
name = "admin"
group = "default"
role = "platform_admin"
token = "admin-token"

[[users]]
name = "alice"
group = "vision"
quota_gpus = 8
token = "alice-token"

[[users]]
name = "bob"
group = "vision"
token = "bob-token"

[[users]]
name = "carol"
group = "vision"
role = "group_admin"
token = "carol-token"

[[users]]
name = "dave"
group = "nlp"
token = "dave-token"
"""
"""The small default config of the `live_server` fixture: one node of 8 virtual V100s, packages
100 (CPU), 454/455/456/457 (1/2/4/8 x V100), groups default/vision (quota 8)/nlp (quota 16), and
users admin (platform_admin), alice (quota 8), bob, carol (group_admin of vision), dave (nlp);
each user's token is `<name>-token`."""

TOKENS = {name: f"{name}-token" for name in ("admin", "alice", "bob", "carol", "dave")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LiveServer:
    """One `hai serve` process on a free port with HAI_HOME=home.

    :param home: the server's `$HAI_HOME` (its database, token, job dirs and `server.log`).
    :param config: TOML text written to `home/config.toml` and passed with --config; `{home}` in it
        is replaced by the home path. None = let the server write its own default config.
    :param env: extra environment for the server (e.g. HAI_DATABASE_URL).
    """

    def __init__(
        self,
        home: Path,
        config: str | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ):
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = dict(env or {})
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.home / "config.toml"
            self.config_path.write_text(config.replace("{home}", str(self.home)), encoding="utf-8")
        self.log_path = self.home / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # ---- what tests use -------------------------------------------------------------------------

    @property
    def token(self) -> str:
        """The token the server wrote to `$HAI_HOME/token` (an admin's for the test config)."""
        return (self.home / "token").read_text(encoding="utf-8").strip()

    @property
    def env(self) -> dict[str, str]:
        """HAI_SERVER / HAI_TOKEN / HAI_HOME for a subprocess (e.g. the `hai` CLI) to reach this server."""
        return {"HAI_SERVER": self.url, "HAI_TOKEN": self.token, "HAI_HOME": str(self.home)}

    def client(self, token: str | None = None) -> HaiClient:
        return HaiClient(server=self.url, token=token or self.token)

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/health", timeout=5).json()
        return body

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self, wait_controller: bool = True) -> LiveServer:
        """Start the process and wait until /health answers (and some controller holds the lease)."""
        if self.running():
            raise RuntimeError("the server is already running")
        env = {k: v for k, v in os.environ.items() if k not in ("HAI_SERVER", "HAI_TOKEN", "HAI_REGION")}
        env.update({"HAI_HOME": str(self.home), "PYTHONUNBUFFERED": "1"})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env.update(self.extra_env)
        args = [sys.executable, "-m", "hai_airflow.server", "--host", "127.0.0.1", "--port", str(self.port)]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._wait_ready(wait_controller)
        return self

    def _wait_ready(self, wait_controller: bool) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"hai server exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}"
                )
            with contextlib.suppress(httpx.HTTPError, ValueError):
                health = self.health()
                if not wait_controller or health.get("lease_holder"):
                    return
            time.sleep(0.05)
        self.kill9()
        raise RuntimeError(
            f"hai server did not become ready in {START_TIMEOUT:.0f} s:\n{self.log_text()[-4000:]}"
        )

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); running jobs keep running, as with `hai serve`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill9(self) -> None:
        """Kill the server process only (SIGKILL); its jobs keep running, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, wait_controller: bool = True) -> LiveServer:
        """Stop (if running) and start again on the same port, home, config and database."""
        self.stop()
        return self.start(wait_controller)

    def close(self) -> None:
        """Cancel every unfinished job, stop the server, and kill any process it left behind."""
        if self.running():
            with contextlib.suppress(Exception):
                self.cancel_all()
        self.stop()
        reap_strays(self.home)

    def cancel_all(self, timeout: float = 15.0) -> None:
        with self.client() as c:
            active = [j for j in c.jobs(all=True, limit=100_000) if j.state not in TERMINAL]
            for j in active:
                with contextlib.suppress(Exception):
                    c.cancel(j.id)
            deadline = time.monotonic() + timeout
            while active and time.monotonic() < deadline:
                active = [j for j in c.jobs(all=True, limit=100_000) if j.state not in TERMINAL]
                time.sleep(0.1)

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def start_server(
    home: Path,
    config: str | None = None,
    env: dict[str, str] | None = None,
    *,
    port: int | None = None,
    wait_controller: bool = True,
) -> LiveServer:
    """Start a real server subprocess with HAI_HOME=home on a free port and wait for /health.

    Use it as a context manager (or call `.close()`) so its jobs are cancelled and nothing is left running.
    """
    return LiveServer(home, config, env, port).start(wait_controller)


def reap_strays(home: Path) -> list[int]:
    """SIGKILL processes whose environment carries HAI_HOME=home (jobs a killed server left behind)."""
    # Jobs do not inherit HAI_HOME; their notice file lies under it.
    marker, notice = f"HAI_HOME={home}".encode(), f"HAI_PREEMPT_NOTICE={home}/".encode()
    me = os.getpid()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(v == marker or v.startswith(notice) for v in environ.split(b"\0")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed
