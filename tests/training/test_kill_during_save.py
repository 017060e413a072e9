"""Proof 3: a job SIGKILLed mid-save 20 times in a row always resumes from an intact checkpoint."""

from __future__ import annotations

import random
import time
from pathlib import Path

from .conftest import Jobs
from .launch import JOBS

KILLS = 20
# The job's slow chunks make a save last ~0.05-0.1 s, long enough for kills at random moments to land in it.
MEGABYTES = 8


def saved(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("saved ")]


def test_sigkill_during_save_never_costs_the_last_good_checkpoint(tmp_path: Path, jobs: Jobs) -> None:
    calibration = jobs.start(JOBS / "saving_job.py", tmp_path / "calibration", MEGABYTES, 3, cwd=tmp_path)
    assert calibration.wait() == 0, calibration.describe()
    save_seconds = min(float(line.split()[2]) for line in calibration.lines if line.startswith("saved "))

    ckpt = tmp_path / "ckpt"
    moments = random.Random(20240607)
    completed = 0  # the newest step whose save() returned before a kill
    killed_mid_write = 0
    for attempt in range(KILLS):
        job = jobs.start(JOBS / "saving_job.py", ckpt, MEGABYTES, 1_000, cwd=tmp_path)
        _, step, verdict = job.expect("resumed").split()
        assert verdict == ("fresh" if attempt == 0 else "intact"), job.describe()
        # The save cut short may have got as far as its rename: then it counts, else the one before.
        assert int(step) in (completed, completed + 1), f"kill {attempt}: resumed {step}, saved {completed}"

        # Each run completes one save, then is killed at a random moment of the next.
        job.expect("saved")
        job.expect("saving")
        time.sleep(moments.uniform(0.0, save_seconds))
        job.kill()
        completed = max([completed, *saved(job.lines)])
        # A temp file left behind is the proof that this kill cut a checkpoint write short.
        if any(ckpt.glob(".checkpoint-*.tmp-*")):
            killed_mid_write += 1

    print(f"{killed_mid_write} of {KILLS} kills landed mid-write")
    assert killed_mid_write >= KILLS * 3 // 4, f"only {killed_mid_write} of {KILLS} kills landed mid-write"

    final = jobs.start(JOBS / "saving_job.py", ckpt, MEGABYTES, 1, cwd=tmp_path)
    _, step, verdict = final.expect("resumed").split()
    assert verdict == "intact" and int(step) in (completed, completed + 1)
    assert final.wait() == 0, final.describe()
    assert not any(ckpt.glob(".checkpoint-*.tmp-*")), "the next save clears what killed saves left"
    assert len(list(ckpt.glob("checkpoint-*"))) == 2
