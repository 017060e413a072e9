"""`make up`: hai serve and Airflow's four services in a kept home, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from dev.demo import log
from dev.demo.processes import Stack, kill_jobs_left_behind
from dev.demo.services import SERVICE_USER, HaiService, Tokens, airflow_command, airflow_env

AIRFLOW_SERVICES = ("scheduler", "dag-processor", "triggerer")
"""Started beside the api-server, as a deployment runs them."""


def run_up(home: Path, port: int, airflow_port: int, airflow_host: str) -> int:
    """`make up`: hai serve and Airflow's four services in `home`, until Ctrl-C or SIGTERM."""
    tokens = Tokens.kept_in(home)
    airflow_home = home / "airflow"
    stack = Stack(marker=f"AIRFLOW_HOME={airflow_home}")
    hai: HaiService | None = None
    try:
        hai = HaiService(stack, home / "hai", tokens, port)
        local = "127.0.0.1" if airflow_host in ("0.0.0.0", "::") else airflow_host
        url = f"http://{local}:{airflow_port}"
        env = airflow_env(
            airflow_home,
            hai,
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__API__BASE_URL=url,
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{url}/execution/",
            AIRFLOW__API_AUTH__JWT_SECRET=tokens.jwt,
            # the pools mirror every group's quota, which only a platform admin may read
            AIRFLOW_CONN_HAI_ADMIN=json.dumps(
                {"conn_type": "hai", "host": hai.url, "password": tokens.person}
            ),
            AIRFLOW__HAI__POOL_SYNC_CONN_ID="hai_admin",
        )
        migrate = subprocess.run(airflow_command("db", "migrate"), env=env, capture_output=True, text=True)
        if migrate.returncode != 0:
            log(f"airflow db migrate failed:\n{migrate.stdout[-2000:]}{migrate.stderr[-2000:]}")
            return 1
        api = ("api-server", "--host", airflow_host, "--port", str(airflow_port))
        for name, args in (("api-server", api), *((n, (n,)) for n in AIRFLOW_SERVICES)):
            stack.start(f"airflow {name}", airflow_command(*args), env, home / f"airflow-{name}.log")
        log(f"hai serve: {hai.url} (HAI_SERVER={hai.url} HAI_TOKEN={hai.token})")
        log(
            f"Airflow UI: {url} on {airflow_host} (user admin, password in "
            f"{airflow_home}/simple_auth_manager_passwords.json.generated once it has started); "
            f"its connection hai_default acts for the signed-in person as hai user {SERVICE_USER}"
        )
        log(f"logs: {home}/*.log; Ctrl-C stops everything")
        while all(proc.poll() is None for _name, proc in stack.procs):
            time.sleep(1)
        log(f"{next(n for n, p in stack.procs if p.poll() is not None)} exited; stopping")
        return 1
    finally:
        log("stopping every process it started")
        stack.stop_all()
        if hai is not None:
            kill_jobs_left_behind(hai.home)
