"""`make demo` end to end: the pipeline's training is preempted by a CLI high-priority job and resumes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.airflow.helpers import REPO


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_tells_the_whole_story() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dev.demo", "--steps", "120"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert "was suspended: suspended so high-priority job" in out
    assert "resumed from" in out and "succeeded after 2 run(s) and 1 preemption(s)" in out
    assert "$ hai task --all" in out and "urgent-8gpu" in out
