"""The platform state the browser tests look at: two groups, a low job preempted by a high one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from hai_airflow.client import HaiClient
from hai_airflow.spec import JobView, StandaloneJobSpec
from tests.support.live_server import REPO, TOKENS, LiveServer, free_port

TRAIN = """
import os, pathlib, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
run = os.environ["HAI_INSTANCE_ID"]
resumed = os.environ.get("HAI_RESUME") == "1"
how = "resumed from " + os.environ.get("HAI_LATEST_CHECKPOINT", "nothing") if resumed else "fresh start"
print(f"instance {run}: {how} on GPUs {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
release = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
for step in range(1200):
    if step == 1:
        tmp = model / f"ckpt-{run}.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, model / f"ckpt-{run}.pt")
    if release is not None and release.exists():
        print("released: done", flush=True)
        break
    print(f"step {step}", flush=True)
    time.sleep(0.5)
"""

DASHBOARD = """
import sys, uvicorn
from fastapi import FastAPI
from hai_airflow.dashboard.standalone import create_standalone_dashboard
app = FastAPI()
app.mount("/ui", create_standalone_dashboard(sys.argv[1]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


@dataclass(frozen=True)
class Scenario:
    """`victim` (alice, vision, low) was preempted by `preemptor` (dave, nlp, high);
    `other` (bob, vision, low) keeps running; `pending` (alice, low) waits. `release` ends the preemptor."""

    server: LiveServer
    ui: str
    victim: int
    other: int
    preemptor: int
    pending: int
    release: Path


def wait_job(
    client: HaiClient, job_id: int, state: str, timeout: float = 60, checkpoint: bool = False
) -> JobView:
    deadline = time.monotonic() + timeout
    job: JobView = client.job(job_id)
    while job.state != state or (checkpoint and job.latest_checkpoint is None):
        left = deadline - time.monotonic()
        assert left > 0, f"job {job_id} is {job.state} ({job.reason}), not {state}"
        job = client.wait(job_id, since_state=job.state, timeout=min(left, 1.0))
    return job


def _spec(code: Path, name: str, pkg: int, max_schedule: int = 0, args: str = "") -> StandaloneJobSpec:
    return StandaloneJobSpec(
        task_name=name,
        code_path=str(code),
        cmd=f"python3 train.py {args}".strip(),
        resource_pkg=pkg,
        max_schedule=max_schedule,
    )


def preempt(server: LiveServer, ui: str, code: Path) -> Scenario:
    """Two 4-GPU low jobs fill the node; a 4-GPU high job suspends the older one; a 2-GPU low job waits."""
    code.mkdir(parents=True, exist_ok=True)
    (code / "train.py").write_text(TRAIN, encoding="utf-8")
    release = code / "release"
    alice, bob, dave = (server.client(TOKENS[u]) for u in ("alice", "bob", "dave"))
    with alice, bob, dave:
        victim = alice.submit(_spec(code, "resnet50-low", 456)).id
        wait_job(alice, victim, "RUNNING", checkpoint=True)
        other = bob.submit(_spec(code, "vit-sweep-low", 456)).id
        wait_job(bob, other, "RUNNING")
        preemptor = dave.submit(_spec(code, "bert-urgent", 456, max_schedule=4, args=str(release))).id
        wait_job(dave, preemptor, "RUNNING")
        wait_job(alice, victim, "SUSPENDED")
        pending = alice.submit(_spec(code, "resnet18-low", 455)).id
    return Scenario(server, ui, victim, other, preemptor, pending, release)


@contextlib.contextmanager
def dashboard_url(server: LiveServer, home: Path) -> Iterator[str]:
    """`hai serve`'s own /ui when it mounts the dashboard, else the same app in a process of its own."""
    if httpx.get(f"{server.url}/ui/queue", timeout=10).status_code != 404:
        yield f"{server.url}/ui"
        return
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HAI_HOME": str(home)}
    with open(home / "dashboard.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", DASHBOARD, server.url, str(port)],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (home / "dashboard.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{port}/ui/queue", timeout=2)
                break
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/ui"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
