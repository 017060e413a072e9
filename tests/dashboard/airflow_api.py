"""A real `airflow api-server` (Airflow 3.3, SQLite, simple auth manager) in a temporary AIRFLOW_HOME."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.live_server import REPO, free_port

START_TIMEOUT = 240.0
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
PLUGIN = '''"""The dashboard mounted the way the hai plugin mounts it."""
from airflow.plugins_manager import AirflowPlugin

from hai_airflow.dashboard import airflow_mount


class HaiDashboardPlugin(AirflowPlugin):
    name = "hai_dashboard"
    fastapi_apps = airflow_mount.fastapi_apps()
    external_views = airflow_mount.external_views()
'''

LINK_DAG = '''"""Two tasks that submitted hai job 42: one leaves the link to Airflow, one pushes it now."""
from airflow.sdk import DAG, BaseOperator

from hai_airflow.dashboard.extra_link import JOB_ID_XCOM_KEY, HaiJobLink


class SubmitsJob(BaseOperator):
    operator_extra_links = (HaiJobLink(),)

    def __init__(self, persist: bool = False, **kw):
        super().__init__(**kw)
        self.persist = persist

    def execute(self, context):
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=42)
        if self.persist:
            HaiJobLink.persist(context, 42)


with DAG("hai_job_link", schedule=None):
    SubmitsJob(task_id="submit")
    SubmitsJob(task_id="submit_and_persist", persist=True)
'''


def plugin_carries_dashboard() -> bool:
    """Whether the packaged HaiPlugin already mounts the dashboard (then no test plugin is added)."""
    source = REPO / "hai_airflow" / "airflow_plugin" / "plugin.py"
    return "airflow_mount" in source.read_text(encoding="utf-8")


class AirflowApiServer:
    """`airflow db migrate`, then `airflow api-server` on a free port; users admin and viewer.

    :param home: AIRFLOW_HOME (its database, logs, plugins and the password file).
    :param env: extra environment, e.g. AIRFLOW_CONN_HAI_DEFAULT.
    """

    def __init__(self, home: Path, env: dict[str, str] | None = None):
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.passwords = {"admin": "admin-pw-0123", "viewer": "viewer-pw-0123"}
        self.log_path = home / "api-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        (home / "plugins").mkdir(parents=True, exist_ok=True)
        (home / "dags").mkdir(exist_ok=True)
        (home / "dags" / "hai_job_link.py").write_text(LINK_DAG, encoding="utf-8")
        password_file = home / "passwords.json"
        password_file.write_text(json.dumps(self.passwords), encoding="utf-8")
        if not plugin_carries_dashboard():
            (home / "plugins" / "hai_dashboard_plugin.py").write_text(PLUGIN, encoding="utf-8")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HAI_"))}
        self.env.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
                "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                "AIRFLOW__API_AUTH__JWT_SECRET": "hai-dashboard-test-secret-0123456789",
                "AIRFLOW__API__BASE_URL": self.url,
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
            }
        )
        self.env.update(env or {})

    def start(self) -> AirflowApiServer:
        migrate = self.airflow("db", "migrate")
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        args = [
            sys.executable,
            "-m",
            "airflow",
            "api-server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                env=self.env,
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"airflow api-server exited:\n{self.log_text()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"airflow api-server not up in {START_TIMEOUT:.0f} s:\n{self.log_text()[-4000:]}")

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run an `airflow` command against this home."""
        return subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def token(self, user: str = "admin") -> str:
        """A JWT from the simple auth manager's `POST /auth/token`."""
        resp = httpx.post(
            f"{self.url}/auth/token", json={"username": user, "password": self.passwords[user]}, timeout=30
        )
        assert resp.status_code == 201, resp.text
        token: str = resp.json()["access_token"]
        return token

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """SIGTERM the api-server's process group (uvicorn and its worker), SIGKILL after 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
