"""Stopping `hai serve` with followers attached: `hai log -f` and a long-poll end at once rather than
holding the stop up to uvicorn's grace, and the follower knows the stream broke (it reconnects and
goes on from where it was), not that the log ended."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.cli.conftest import Hai
from tests.cli.test_habits import TICKS, hai_process, process_env, submit
from tests.cli.test_live import as_user, wait_for
from tests.support.live_server import TEST_CONFIG, start_server


def test_a_stop_with_followers_attached_is_quick_and_the_follower_reconnects(
    tmp_path: Path, hai: Hai
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "ticks.py").write_text(TICKS.format(n=60, pause=0.25), encoding="utf-8")
    with start_server(tmp_path / "home", TEST_CONFIG) as server:
        alice = as_user(server, "alice")
        job = submit(hai, alice, code, "ticks.py")
        wait_for(server, job, {"RUNNING"})
        env = process_env(server, "alice", tmp_path)
        follower = subprocess.Popen(
            hai_process(["log", str(job), "-f"]),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        waiter = subprocess.Popen(
            hai_process(["wait", str(job), "--for", "SUCCEEDED", "--timeout", "120"]),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follower.stdout is not None
        first = follower.stdout.readline()  # the follower is attached (its CLI may start slowly)
        time.sleep(2)  # the waiter holds a request open too
        began = time.monotonic()
        server.stop()
        took = time.monotonic() - began
        time.sleep(1)
        assert follower.poll() is None and waiter.poll() is None, "both wait for the server to come back"
        server.start()
        # Read on from the same buffered stream: `communicate` would skip what readline buffered.
        out = first + follower.stdout.read()
        follower.wait(timeout=120)
        err = follower.stderr.read() if follower.stderr else ""
        waited, _ = waiter.communicate(timeout=120)
    # Waiting for the follower would take uvicorn's graceful timeout (5 s, `hai serve`) and log it.
    assert took < 5, f"the stop took {took:.1f} s with a follower attached"
    log = server.log_text()
    assert "timeout graceful shutdown exceeded" not in log and "Exception in ASGI" not in log, log[-2000:]
    assert follower.returncode == 0, err
    ticks = [int(line.split()[1]) for line in out.splitlines() if line.startswith("tick")]
    assert ticks == list(range(60)), "every line once, across the reconnect"
    assert waiter.returncode == 0 and f"task {job} SUCCEEDED" in waited
