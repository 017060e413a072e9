"""Fixtures for the training-helper tests: no job variables leak in, no process outlives a test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .launch import JOB_VARS, Job, job_env


@pytest.fixture(autouse=True)
def clean_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in JOB_VARS:
        monkeypatch.delenv(name, raising=False)


class Jobs:
    """Starts test jobs and kills whatever is still running when the test ends."""

    def __init__(self) -> None:
        self.started: list[Job] = []

    def start(self, *args: object, cwd: Path, **env: str) -> Job:
        job = Job([str(arg) for arg in args], job_env(**env), cwd)
        self.started.append(job)
        return job


@pytest.fixture
def jobs() -> Iterator[Jobs]:
    started = Jobs()
    yield started
    for job in started.started:
        job.stop()
