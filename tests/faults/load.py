"""A steady submit load: one job after another, each with a key of its own, sent again while no server
answers; it records which keys it submitted and which jobs answered them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hai_airflow.client import HaiClient, HaiUnreachable
from hai_airflow.spec import TERMINAL_STATES, CpuJobSpec, JobView
from tests.support.live_server import TOKENS, LiveServer


class Submitter:
    """Submits one job after another, each with a key of its own, sending it again while no server
    answers; records which keys it submitted and which jobs answered them."""

    def __init__(self, server: LiveServer, code: Path, prefix: str = "kill-loop") -> None:
        self.server, self.code, self.prefix = server, code, prefix
        self.answers: dict[str, set[int]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="submitter", daemon=True)

    def _run(self) -> None:
        n = 0
        with self.server.client(TOKENS["alice"]) as alice:
            alice.retry_for = 0
            while not self.stop.is_set():
                n += 1
                key = f"{self.prefix}-{n}"
                spec = CpuJobSpec(task_name=key, code_path=str(self.code), cmd="sleep 0.3", cpus=0.5)
                self.answers[key] = set()
                while not self.stop.is_set():
                    try:
                        self.answers[key].add(alice.submit(spec, client_key=key).id)
                        break
                    except HaiUnreachable:
                        time.sleep(0.05)
                time.sleep(0.05)


def all_ended(client: HaiClient, timeout: float = 120) -> list[JobView]:
    """The caller's jobs once all have ended (or as they are after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = client.jobs(limit=100_000)
        if all(j.state in TERMINAL_STATES for j in jobs) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)
