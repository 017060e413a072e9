"""The preemption notice (file or SIGTERM) and the loop that saves on it and exits to be resumed."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hai_airflow.training import EXIT_SAVED_ON_NOTICE, Checkpointer, TrainingLoop, preemption_requested

from .conftest import Jobs
from .launch import JOBS


def saved_steps(directory: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in directory.glob("checkpoint-*"))


def test_notice_file_requests_preemption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notice = tmp_path / "notice"
    assert not preemption_requested()
    monkeypatch.setenv("HAI_PREEMPT_NOTICE", str(notice))
    assert not preemption_requested()
    notice.touch()
    assert preemption_requested()


def test_loop_saves_every_k_steps_and_at_the_end(tmp_path: Path) -> None:
    progress = {"done": 0}
    with TrainingLoop(Checkpointer(tmp_path, keep=10), lambda: dict(progress), every=3) as loop:
        ran = []
        for step in loop.steps(7):
            ran.append(step)
            progress["done"] = step + 1
    assert ran == list(range(7))
    assert saved_steps(tmp_path) == [3, 6, 7]
    loaded = Checkpointer(tmp_path).load_latest()
    assert loaded is not None and loaded.state == {"done": 7}


def test_loop_resumed_at_the_end_runs_and_saves_nothing(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path)
    with TrainingLoop(checkpointer, lambda: pytest.fail("nothing new to save"), every=1) as loop:
        assert list(loop.steps(5, start=5)) == []
    assert saved_steps(tmp_path) == []


def test_loop_saves_and_exits_on_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notice = tmp_path / "notice"
    monkeypatch.setenv("HAI_PREEMPT_NOTICE", str(notice))
    progress = {"done": 0}
    ran = []
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(SystemExit) as exited,
        TrainingLoop(Checkpointer(tmp_path / "ckpt"), lambda: dict(progress), every=100) as loop,
    ):
        for step in loop.steps(1000, start=0):
            ran.append(step)
            progress["done"] = step + 1
            if step == 4:
                notice.touch()
    assert exited.value.code == EXIT_SAVED_ON_NOTICE
    assert ran == [0, 1, 2, 3, 4]
    assert saved_steps(tmp_path / "ckpt") == [5]
    # Exiting on notice leaves SIGTERM a request until the process ends (see the next test).
    assert signal.getsignal(signal.SIGTERM) is not before
    signal.signal(signal.SIGTERM, before)


def test_sigterm_after_the_save_on_notice_keeps_the_saved_exit(tmp_path: Path, jobs: Jobs) -> None:
    # The platform writes the notice, then sends SIGTERM: the job may have saved and be on its way
    # out before the signal lands, even tearing down its modules, where Python has already put the
    # default SIGTERM action back. Its exit must stay "saved on notice", not a death by SIGTERM.
    notice = tmp_path / "notice"
    notice.touch()
    script = (
        "import os, signal, sys, time\n"
        "from hai_airflow.training import Checkpointer, TrainingLoop\n"
        "class SlowTeardown:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.5)\n"
        "sys.modules['__main__'].keep = SlowTeardown()\n"
        "try:\n"
        "    with TrainingLoop(Checkpointer('ckpt'), lambda: {}, every=100) as loop:\n"
        "        for step in loop.steps(10):\n"
        "            pass\n"
        "finally:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.5)\n"
    )
    job = jobs.start("-c", script, cwd=tmp_path, HAI_PREEMPT_NOTICE=str(notice))
    assert job.wait() == EXIT_SAVED_ON_NOTICE, job.describe()
    assert saved_steps(tmp_path / "ckpt") == [1]


def test_a_sigterm_landing_inside_the_handler_of_another_still_saves(tmp_path: Path, jobs: Jobs) -> None:
    # The platform signals a job's launcher and every process under it, so a rank gets SIGTERM two
    # or three times at once, and Python may run the handler again inside itself. Here each call the
    # handler makes (and its own start) sends one more SIGTERM, which lands inside that handler; a
    # handler that took a lock would wait for itself for ever and the job would miss its grace.
    script = (
        "import os, signal, sys\n"
        "from hai_airflow.training import Checkpointer, TrainingLoop\n"
        "sent = 0\n"
        "def again(frame, event, arg):\n"
        "    global sent\n"
        "    inside = frame\n"
        "    while inside is not None and inside.f_code is not handler.__code__:\n"
        "        inside = inside.f_back\n"
        "    if inside is not None and event in ('call', 'c_call') and sent < 50:\n"
        "        sent += 1\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "with TrainingLoop(Checkpointer('ckpt'), lambda: {}, every=100) as loop:\n"
        "    handler = signal.getsignal(signal.SIGTERM)\n"
        "    for step in loop.steps(1000):\n"
        "        if step == 3:\n"
        "            sys.setprofile(again)\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            sys.setprofile(None)\n"
        "            print('signalled', sent, flush=True)\n"
    )
    job = jobs.start("-c", script, cwd=tmp_path)
    assert job.wait(timeout=30) == EXIT_SAVED_ON_NOTICE, job.describe()
    signalled = [int(line.split()[1]) for line in job.lines if line.startswith("signalled ")]
    assert signalled and signalled[0] >= 1, job.describe()
    assert saved_steps(tmp_path / "ckpt") == [4]


def test_notice_after_the_last_step_is_a_normal_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notice = tmp_path / "notice"
    monkeypatch.setenv("HAI_PREEMPT_NOTICE", str(notice))
    with TrainingLoop(Checkpointer(tmp_path / "ckpt"), lambda: {}, every=100) as loop:
        for step in loop.steps(3):
            if step == 2:
                notice.touch()
    assert saved_steps(tmp_path / "ckpt") == [3]


def test_loop_restores_the_sigterm_handler(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with TrainingLoop(Checkpointer(tmp_path), lambda: {}) as loop:
        assert signal.getsignal(signal.SIGTERM) is not before
        list(loop.steps(1))
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("how", ["SIGTERM", "notice file"])
def test_a_running_job_saves_the_step_it_reached_and_resumes_there(
    tmp_path: Path, jobs: Jobs, how: str
) -> None:
    ckpt, notice = tmp_path / "ckpt", tmp_path / "notice"
    # Periodic saves are far apart, so only the save on notice can hold the steps reached.
    job = jobs.start(
        JOBS / "counting_job.py", ckpt, 100_000, 1000, 0.01, cwd=tmp_path, HAI_PREEMPT_NOTICE=str(notice)
    )
    job.expect("started at 0")
    job.expect("step 15")
    if how == "SIGTERM":
        job.process.send_signal(signal.SIGTERM)
    else:
        notice.touch()
    assert job.wait() == EXIT_SAVED_ON_NOTICE, job.describe()
    reached = max(int(line.split()[1]) for line in job.lines if line.startswith("step "))
    assert reached >= 15
    assert "finished" not in job.lines
    assert f"step {reached} saved; exiting with {EXIT_SAVED_ON_NOTICE}" in job.stderr
    assert saved_steps(ckpt) == [reached]

    notice.unlink(missing_ok=True)
    resumed = jobs.start(JOBS / "counting_job.py", ckpt, reached + 3, 1000, 0.0, cwd=tmp_path, HAI_RESUME="1")
    resumed.expect(f"started at {reached}")
    resumed.expect(f"step {reached + 1}")
    resumed.expect("finished")
    assert resumed.wait() == 0
    assert saved_steps(ckpt)[-1] == reached + 3


def test_sigterm_without_the_loop_still_kills(tmp_path: Path, jobs: Jobs) -> None:
    job = jobs.start("-c", "import time; print('up', flush=True); time.sleep(60)", cwd=tmp_path)
    job.expect("up")
    job.process.send_signal(signal.SIGTERM)
    assert job.wait() == -signal.SIGTERM
