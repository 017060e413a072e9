"""benchmarks/airflow_bench.py runs end to end on two runs (its figures are printed, never asserted on)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.airflow.helpers import REPO


@pytest.mark.timeout(360)
def test_airflow_bench_prints_the_latency_summary() -> None:
    # the script sets its own AIRFLOW_HOME before importing airflow: none of this session's settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_")}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "airflow_bench.py"), "--runs", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "job end -> task success: p50" in done.stdout
    assert "over 2 runs" in done.stdout
