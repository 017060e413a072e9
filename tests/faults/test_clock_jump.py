"""The controller's wall clock stepped five minutes forward and back while jobs run and a client
submits without pause, with a second server whose clock is five minutes ahead from the start: the
controller keeps its own time (`server.clock`), so a job with a time limit is not timed out by a step,
the other server does not take the lease because its clock says it has run out, every job's events
stay in order, and the ledger finds nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hai_airflow.spec import TERMINAL_STATES, CpuJobSpec
from tests.cli.test_live import wait_for
from tests.faults.load import Submitter, Tally, all_ended, tally
from tests.faults.test_partition import controls, until
from tests.support.clock_shift import ClockShift, unavailable_reason
from tests.support.live_server import TEST_CONFIG, TOKENS, start_server
from tests.support.own_postgres import OwnPostgres

pytestmark = [pytest.mark.faults, pytest.mark.slow]
STEPS = (300.0, -300.0, -300.0)
"""The controller's clock, stepped in turn: 5 minutes ahead, back to the true time, 5 minutes behind."""


def test_a_five_minute_clock_step_either_way_changes_nothing(
    database: OwnPostgres,
    tmp_path: Path,
    figures: Callable[[str, float], None],
    accounts: Callable[[str, Tally, int], None],
) -> None:
    why = unavailable_reason()
    if why is not None:
        pytest.skip(f"faults tier: {why}")
    clock_a, clock_b = ClockShift(tmp_path / "clock-a"), ClockShift(tmp_path / "clock-b")
    clock_b.set(300.0)
    code = tmp_path / "code"
    code.mkdir()
    shared = {"HAI_TOKEN_KEY_FILE": str(tmp_path / "token.key"), "HAI_DATABASE_URL": database.url}
    with start_server(tmp_path / "a", TEST_CONFIG, {**shared, **clock_a.env}) as a:
        until("server a to hold the lease", lambda: controls(a))
        with start_server(tmp_path / "b", TEST_CONFIG, {**shared, **clock_b.env}, wait_controller=False) as b:
            alice = a.client(TOKENS["alice"])
            limited = alice.submit(
                CpuJobSpec(task_name="limited", code_path=str(code), cmd="sleep 20", time_limit_seconds=90)
            )
            wait_for(a, limited.id, {"RUNNING"})
            submitter = Submitter(b, code, prefix="clock")  # through b, whose clock is ahead
            submitter.thread.start()
            try:
                shift = 0.0
                for step in STEPS:
                    shift += step
                    clock_a.set(shift)
                    stepped = time.monotonic()
                    after = alice.submit(
                        CpuJobSpec(task_name=f"after {step:+.0f}", code_path=str(code), cmd="true")
                    )
                    wait_for(a, after.id, {"SUCCEEDED"}, timeout=60)
                    figures(
                        f"clock step {step:+.0f} s: a job submitted after it has run",
                        time.monotonic() - stepped,
                    )
                    time.sleep(3.0)
                    assert controls(a) and not controls(b), "the lease moved because of a clock step"
            finally:
                submitter.stop.set()
                submitter.thread.join(30)
            assert wait_for(a, limited.id, TERMINAL_STATES, timeout=60).state == "SUCCEEDED"
            jobs = all_ended(alice)
            assert {j.state for j in jobs} == {"SUCCEEDED"}, [(j.id, j.state, j.reason) for j in jobs]
            problems = a.client(TOKENS["admin"]).check_store().problems
            counted = tally(submitter, [j for j in jobs if str(j.task_name).startswith("clock-")])
            accounts("clock stepped 5 minutes either way", counted, len(problems))
            assert counted.submitted >= 5 and counted.lost == counted.duplicated == counted.refused == 0
            assert "the wall clock stepped by +300.0 s" in a.log_text()
            assert "holds the lease" not in b.log_text()
            assert problems == []
