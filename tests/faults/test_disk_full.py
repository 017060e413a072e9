"""The disk holding `$HAI_HOME` (every instance's dir, log and exit file) full, a small tmpfs of the
test's own, with the store on a PostgreSQL elsewhere: a running job is unharmed and its exit is
recorded once there is room (never taken for lost and run again); a new job does not start and
churn instances but waits, saying why; the API answers throughout; room made, it starts and ends."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hai_airflow.server.control.admission import MIN_FREE_BYTES
from hai_airflow.spec import CpuJobSpec
from tests.cli.test_live import wait_for
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer
from tests.support.own_postgres import OwnPostgres

pytestmark = [pytest.mark.faults, pytest.mark.slow]
DISK_MB = 64


@pytest.fixture
def small_disk() -> Iterator[Path]:
    if (
        shutil.which("mount") is None
        or subprocess.run(["id", "-u"], capture_output=True, text=True).stdout != "0\n"
    ):
        pytest.skip("faults tier: mounting a small tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="hai-faults-disk-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def fill(disk: Path) -> Path:
    """All but a little of the disk taken by one file (less than an instance needs to start)."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_holds_new_starts_and_keeps_running_jobs(
    database: OwnPostgres, small_disk: Path, tmp_path: Path, figures: Callable[[str, float], None]
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    runs_script = "for i in $(seq 1 40); do echo line $i; sleep 0.1; done; exit 0"
    server = LiveServer(small_disk / "hai", TEST_CONFIG, {"HAI_DATABASE_URL": database.url}).start()
    try:
        alice = server.client(TOKENS["alice"])
        runs = alice.submit(CpuJobSpec(task_name="runs", code_path=str(code), cmd=runs_script))
        wait_for(server, runs.id, {"RUNNING"})
        filler = fill(small_disk)
        waits = alice.submit(CpuJobSpec(task_name="waits", code_path=str(code), cmd="echo started"))
        time.sleep(6)  # `runs` ends meanwhile, with the disk still full
        held = alice.job(waits.id)
        assert held.state == "PENDING" and held.instances == 0, held
        assert f"MB free, {MIN_FREE_BYTES >> 20} MB needed" in (held.reason or "")
        assert alice.job(runs.id).state == "RUNNING"  # its exit file waits for room

        filler.unlink()
        room = time.monotonic()
        done = wait_for(server, runs.id, {"SUCCEEDED"}, timeout=60)
        assert done.instances == 1  # one run, not lost and run again
        figures("disk room made: the exit written while full recorded", time.monotonic() - room)
        wait_for(server, waits.id, {"RUNNING", "SUCCEEDED"}, timeout=60)
        figures("disk room made: the waiting job starts", time.monotonic() - room)
        assert wait_for(server, waits.id, {"SUCCEEDED"}, timeout=60).instances == 1
        assert server.client(TOKENS["admin"]).check_store().problems == []
    finally:
        server.close()
