"""A steady submit load and its tally: one job after another, each with a key of its own, sent again
while no server answers; which keys were submitted, which jobs or refusals answered them, and at the
end whether each was stored exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hai_airflow.client import HaiClient, HaiError, HaiUnreachable
from hai_airflow.spec import TERMINAL_STATES, CpuJobSpec, JobSpec, JobView
from tests.support.live_server import TOKENS, LiveServer


def short_cpu_job(key: str, code: Path, n: int) -> JobSpec:
    return CpuJobSpec(task_name=key, code_path=str(code), cmd="sleep 0.3", cpus=0.5)


class Submitter:
    """Submits one job after another as alice, each with a key of its own (`make(key, code, n)` says
    what), sending it again while no server answers (and, with `retry_for`, while its database does
    not); records the job or the refusal that answered each key."""

    def __init__(
        self,
        server: LiveServer,
        code: Path,
        prefix: str = "kill-loop",
        make: Callable[[str, Path, int], JobSpec] = short_cpu_job,
        retry_for: float = 0.0,
    ) -> None:
        self.server, self.code, self.prefix, self.make, self.retry_for = server, code, prefix, make, retry_for
        self.answers: dict[str, set[int]] = {}
        self.refused: dict[str, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="submitter", daemon=True)

    def _run(self) -> None:
        n = 0
        with self.server.client(TOKENS["alice"]) as alice:
            alice.retry_for = self.retry_for
            while not self.stop.is_set():
                n += 1
                key = f"{self.prefix}-{n}"
                spec = self.make(key, self.code, n)
                self.answers[key] = set()
                while not self.stop.is_set():
                    try:
                        self.answers[key].add(alice.submit(spec, client_key=key).id)
                        break
                    except HaiUnreachable:
                        time.sleep(0.05)
                    except HaiError as refusal:
                        if refusal.status >= 500:
                            raise  # a server error is a failure of the test, never an answer
                        self.refused[key] = refusal.message
                        break
                time.sleep(0.05)


@dataclass(frozen=True)
class Tally:
    """Every submission accounted for: stored once, or refused with a reason."""

    submitted: int
    stored: int
    refused: int
    lost: int
    """Answered with a job that the store does not hold, or never answered."""
    duplicated: int
    """Stored more than once, or answered with two jobs."""


def tally(submitter: Submitter, jobs: list[JobView]) -> Tally:
    stored: dict[str, list[int]] = {}
    for j in jobs:
        stored.setdefault(str(j.task_name), []).append(j.id)
    keys = [k for k, ids in submitter.answers.items() if ids or k in submitter.refused]
    answered = [k for k in keys if k not in submitter.refused]
    lost = sum(1 for k in answered if not set(submitter.answers[k]) & set(stored.get(k, [])))
    duplicated = sum(1 for k in answered if len(submitter.answers[k]) > 1 or len(stored.get(k, [])) > 1)
    duplicated += sum(1 for k in submitter.refused if k in stored)
    return Tally(len(keys), len(answered) - lost, len(submitter.refused), lost, duplicated)


def all_ended(client: HaiClient, timeout: float = 120) -> list[JobView]:
    """The caller's jobs once all have ended (or as they are after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = client.jobs(limit=100_000)
        if all(j.state in TERMINAL_STATES for j in jobs) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)
