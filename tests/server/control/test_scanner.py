"""The checkpoint scanner (`server/control/scanner.py`), with real processes writing checkpoints: odd
file names, and a slow scan that waits longer for the next."""

from __future__ import annotations

import os
import time

import pytest

from hai_airflow.server.control.scanner import CHECKPOINT_SCAN_SECONDS
from tests.server.conftest import Api


def test_a_checkpoint_name_that_is_not_utf8_neither_blocks_others_checkpoints_nor_the_jobs_exit(
    run: Api,
) -> None:
    # A file name the store cannot hold (bytes that are not UTF-8) is never taken for a checkpoint.
    gate = f"while [ ! -e {run.code / 'go'} ]; do sleep 0.02; done; "
    odd = run.submit(
        cmd=f"echo w > \"$HAI_MODEL_DIR/$(printf 'step-\\377.pt')\"; {gate}exit 0", resource_pkg=454
    )
    good = run.submit(cmd=f'echo w > "$HAI_MODEL_DIR/good.pt"; {gate}exit 0', resource_pkg=454)
    for job in (odd, good):
        run.until_state(job["id"], "RUNNING")
    model = run.ctx.home / "jobs" / str(odd["id"]) / "model"
    run.until(lambda: any(n.startswith(b"step-") for n in os.listdir(bytes(model))), what="odd name")
    run.until(lambda: (model.parent.parent / str(good["id"]) / "model" / "good.pt").exists(), what="good")
    assert run.controller is not None
    run.controller.scanner.scan()
    assert run.job(good["id"])["latest_checkpoint"].endswith("good.pt")
    (run.code / "go").touch()
    for job in (odd, good):
        run.until_state(job["id"], "SUCCEEDED")
    assert run.job(odd["id"])["latest_checkpoint"] is None


def test_a_slow_checkpoint_scan_waits_longer_for_the_next_so_cycles_are_not_held_up(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = run.controller
    assert controller is not None
    scans: list[float] = []

    def slow() -> None:  # the model dirs of a thousand running jobs, stood in for by a pause
        scans.append(time.monotonic())
        time.sleep(0.3)

    monkeypatch.setattr(controller.scanner, "scan", slow)
    controller.scanner.last_scan = 0.0
    run.step()
    assert len(scans) == 1
    controller.scanner.last_scan -= CHECKPOINT_SCAN_SECONDS  # the usual interval has passed
    run.step()
    assert len(scans) == 1  # 0.3 s of scanning waits 3 s (SCAN_SHARE 0.1), not 2 s
    controller.scanner.last_scan -= 1.5
    run.step()
    assert len(scans) == 2
