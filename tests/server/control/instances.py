"""What a controller test reads of a job's instances: their records, the environment one was given,
the handle its backend saved."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.server.conftest import Api


def env_of(api: Api, job_id: int, instance_id: int) -> dict[str, str]:
    model = Path(api.ctx.home) / "jobs" / str(job_id) / "model"
    path = model / f"env-{instance_id}.json"
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    data: dict[str, str] = json.loads(path.read_text())
    return data


def instances(api: Api, job_id: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = api.get(f"/jobs/{job_id}/instances").json()
    return out


def _handle(api: Api, instance_id: int) -> str:
    from hai_airflow.server.store.tables import InstanceRow

    with api.ctx.store.read() as s:
        inst = s.get(InstanceRow, instance_id)
        assert inst is not None and inst.handle
        return inst.handle
